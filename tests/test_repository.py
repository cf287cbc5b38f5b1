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
