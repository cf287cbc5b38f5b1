"""The suite's own distribution over workers: the container tests stay on one worker.

They share one Docker engine and the images it builds (minutes); spread over two workers, the
second one waits on the build lock with nothing to do, and both stop the engine at the end.
The grouping is pytest-xdist's ``--dist loadgroup`` with marks added at collection, as
tests/containers/conftest.py adds them; this runs that arrangement on a small suite.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

CONFTEST = """
from pathlib import Path
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    here = Path(__file__).parent / "grouped"
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.xdist_group("containers"))
"""


def test_tests_marked_at_collection_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    grouped = tmp_path / "grouped"
    grouped.mkdir()
    for module in ("a", "b"):
        cases = "\n".join(f"def test_{module}{i}():\n    pass\n" for i in range(4))
        (grouped / f"test_{module}.py").write_text(cases)
    free = "\n".join(f"def test_free{i}():\n    pass\n" for i in range(8))
    (tmp_path / "test_free.py").write_text(free)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    workers = {
        name: worker
        for worker, name in re.findall(
            r"\[(gw\d)\] \[ *\d+%\] PASSED \S*?(test_[ab]\d)", done.stdout
        )
    }
    assert len(workers) == 8, done.stdout[-3000:]
    assert len(set(workers.values())) == 1, workers
