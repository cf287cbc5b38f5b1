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


NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
           "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}  # fmt: skip


def _figure(text: str, pattern: str) -> int:
    """The number a doc states where ``pattern``'s group is (a word or digits)."""
    found = re.search(pattern, text)
    assert found, f"the doc no longer says {pattern!r}: update this test with it"
    word = found.group(1).lower()
    return int(word) if word.isdigit() else NUMBERS[word]


def _family_touches(guide: str) -> list[str]:
    """The files the guide's numbered list says a new task family touches (its first three
    items: the declaration, run.py's section, the builder)."""
    section = guide.split("### What a new family touches", 1)[1].split("\n### ", 1)[0]
    items = re.findall(r"^\d\. `([^`]+)`", section, flags=re.MULTILINE)
    assert items, "the guide lists no files a family touches"
    return items


def test_a_task_family_is_named_only_where_the_guide_says() -> None:
    """docs/extending.md says a new task family touches its declaration, its section of
    run.py, its checkpoint's builder, the generated CRDs and the docs. Outside the tests and
    the docs, each family that needs nothing more (no library of its own, no view of its own;
    text generation, the default everywhere, aside) is named only in those three files: its
    tags, its Task names, its checkpoints. Its builders are in the third."""
    from model_support import task_fixtures
    from model_support.tasks import FAMILIES, Loader, Shows

    guide = (ROOT / "docs/extending.md").read_text(encoding="utf-8")
    files = _family_touches(guide)
    assert _figure(guide, r"\n(\w+) files, the generated CRDs, and the docs") == len(files)
    assert (
        files[2]
        == "model_support/task_fixtures.py"
        == Path(task_fixtures.__file__).relative_to(ROOT).as_posix()
    )
    code = {
        name: text
        for name, text in _tracked_text_files().items()
        if not name.startswith(("tests/", "docs/", "crds/", "charts/", "benchmarks/"))
        and not name.endswith(".md")
    }
    plain = [
        f
        for f in FAMILIES
        if f.tasks[0].loader is not Loader.CAUSAL_LM
        and all(spec.loader.library == "transformers" for spec in f.tasks)
        and f.shows is not Shows.PICTURES
    ]
    assert any(spec.task.value == "token-classification" for f in plain for spec in f.tasks)
    named_in: set[str] = set()
    for family in plain:
        needles = [spec.task.value for spec in family.tasks]
        needles += [spec.task.name for spec in family.tasks]
        needles += [checkpoint.name for checkpoint in family.checkpoints]
        pattern = re.compile("|".join(rf"(?<![\w-]){re.escape(n)}(?![\w-])" for n in needles))
        where = {name for name, text in code.items() if pattern.search(text)}
        assert where <= set(files), (family.name, sorted(where - set(files)))
        named_in |= where
        for checkpoint in family.checkpoints:
            assert checkpoint.builder in task_fixtures.BUILDERS, checkpoint.name
    assert named_in == set(files[:2]), named_in


def test_the_figures_the_docs_state_are_the_code_s() -> None:
    """Counts written in prose drift: each one a doc states is the count of what it counts."""
    from model_support.checkpoints import demo_model
    from model_support.cli.commands_demo import DEMO_NAMES, plan_runs
    from model_support.operator.crd import files as crd_files
    from model_support.vocabulary import VERDICT_CHECK_MEANINGS, VerdictCheck

    guide = (ROOT / "docs/extending.md").read_text(encoding="utf-8")
    assert _figure(guide, r"commit the (\w+)\s+generated files") == len(crd_files(ROOT))

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    models = {name: demo_model(name) for name in DEMO_NAMES}
    runs = plan_runs(models, "aot_eager", "inductor")
    assert _figure(readme, r"tests them on (\w+) compiler\s+stacks") == len(
        {run.compile_backend for run in runs}
    )
    # The text verdict's checks, each named: the checks whose meaning is not another task's.
    stated = _figure(readme, r"(\w+) checks,\s+each relative to the baseline's error")
    sentence = readme.split("each relative to the baseline's error", 1)[1].split(". ", 1)[0]
    named = re.findall(r"`(\w+)`", sentence)
    text_checks = [
        check.value
        for check in VerdictCheck
        if not re.match(r"[A-Z][\w-]*: ", VERDICT_CHECK_MEANINGS[check])
    ]
    assert stated == len(named) and sorted(named) == sorted(text_checks)


def test_the_docs_name_every_task() -> None:
    """A task is in docs/verification.md's table of how each task is verified, and in the
    README's list of tasks `--task` takes."""
    from model_support.vocabulary import Task

    verification = (ROOT / "docs/verification.md").read_text(encoding="utf-8")
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    listed = readme.split("`--task` takes a Hub pipeline tag:", 1)[1].split(". ", 1)[0]
    # The first cell of each row of the table of tasks beyond text generation.
    table = verification.split("| task (pipeline tag) |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    for task in Task:
        assert f"`{task.value}`" in listed, task
        if task.value not in ("text-generation", "image-text-to-text"):  # the text verdict
            assert any(f"`{task.value}`" in row for row in rows), task
