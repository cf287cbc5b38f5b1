"""The repository stands alone: nothing in it cites files outside it, and what it cites exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Spelled in pieces so that this file does not match itself.
OUTSIDE = ("REFERENCE" + ".md", "DESIGN" + ".md", ".." + "/shared", "/work" + "/shared")
DOCS_CITATION = re.compile(r"docs/[A-Za-z0-9_.-]+\.md")


def _tracked_text_files() -> dict[str, str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    texts = {}
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if not path.is_file():
            continue  # deleted in the working tree, not yet committed
        try:
            texts[name] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary
    return texts


def test_no_tracked_file_cites_anything_outside_the_repository() -> None:
    offenders = [
        f"{name}: {needle}"
        for name, text in _tracked_text_files().items()
        for needle in OUTSIDE
        if needle in text
    ]
    assert offenders == [], "cite docs/ in the repository instead:\n" + "\n".join(offenders)


def test_every_cited_doc_exists_and_gives_sources() -> None:
    texts = _tracked_text_files()
    cited = {m for text in texts.values() for m in DOCS_CITATION.findall(text)}
    assert {"docs/hardware.md", "docs/memory-model.md", "docs/verification.md"} <= cited
    for doc in sorted(cited):
        assert doc in texts, f"{doc} is cited but not in the repository"
        assert "## Sources" in texts[doc] and "https://" in texts[doc], f"{doc} names no source"


GUIDE_NAME = re.compile(r"`([^`\n]+)`")
FILE_NAME = re.compile(r"[\w./-]+\.(?:py|yaml|md|toml|json)")
CODE_NAME = re.compile(r"[A-Za-z_][\w.]*")


def test_the_extension_guide_names_only_what_exists() -> None:
    """docs/extending.md lists touch points by name: every file, test and code name it gives
    must be in the repository, or a newcomer follows it into nothing."""
    texts = _tracked_text_files()
    code = "\n".join(text for name, text in texts.items() if not name.endswith(".md"))
    stale = []
    for name in sorted(set(GUIDE_NAME.findall(texts["docs/extending.md"]))):
        if "::" in name:  # a test, as pytest names it
            path, _, test = name.partition("::")
            test = test.split("[")[0]
            where = texts.get(path, "") if path else code
            if f"def {test}(" not in where:
                stale.append(name)
        elif FILE_NAME.fullmatch(name):
            if not any(tracked == name or tracked.endswith("/" + name) for tracked in texts):
                stale.append(name)
        elif CODE_NAME.fullmatch(name) and ("_" in name or "." in name or name[0].isupper()):
            leaf = name.rsplit(".", 1)[-1]
            if not re.search(rf"\b{re.escape(leaf)}\b", code):
                stale.append(name)
    assert stale == [], "docs/extending.md names what the repository does not hold: " + ", ".join(
        stale
    )


def test_the_readme_is_a_guide_that_starts_with_what_it_answers() -> None:
    """A user reads the README first: what it answers, then the two commands (CI runs the
    second), under 250 lines, and no dated measurements (those are docs/benchmarks.md's)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines; move detail into docs/"
    commands = [i for i, line in enumerate(lines) if line.startswith("    $ ")]
    assert len(commands) == 2, "the README gives exactly two commands: install+demo, install+tests"
    assert commands[1] - commands[0] == 1 and commands[0] < 10, "the commands come first"
    before = " ".join(lines[: commands[0]])
    assert "run unmodified on AWS Trainium" in before and "NeuronCores" in before
    assert "pytest" in lines[commands[1]] and "model-support demo" in lines[commands[0]]
    dated = re.findall(r"\b20\d\d-\d\d-\d\d\b", text)
    assert dated == [], f"dated measurements belong in docs/benchmarks.md, not the README: {dated}"
