"""Where no Docker engine can be had, the container tests fail saying how to get one."""

from __future__ import annotations

from pathlib import Path

import pytest
from docker_engine import DockerEngine, DockerUnavailable


def test_without_an_engine_or_dockerd_the_error_says_how_to_start_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No daemon answers at DOCKER_HOST and no `dockerd` is on PATH (a machine without docker.io).
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-daemon.sock'}")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    engine = DockerEngine(state_dir=tmp_path / "state")
    with pytest.raises(DockerUnavailable) as raised:
        engine.acquire()
    message = str(raised.value)
    assert "`dockerd` is not installed" in message
    assert "apt-get install -y docker.io debootstrap" in message
    assert "DOCKER_HOST" in message
    engine.release()  # nothing was started: nothing to stop
    assert not (tmp_path / "state" / "started.json").exists()
