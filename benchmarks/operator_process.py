"""The operator as its own process (`model-support operator`), for the scale benchmarks.

The benchmarks' emulated API server (kmock) and stand-in Hub run in the benchmark's process;
the operator runs as it does in its pod, in a process of its own, so that its pace is not
bounded by sharing one interpreter with them, and its memory is measured apart from theirs.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.process
import os
import signal
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO

from model_support.operator.settings import OperatorSettings


def rss_bytes(pid: int | str = "self") -> int:
    """Resident memory of a process (VmRSS), 0 when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


CHART_VALUES = Path(__file__).resolve().parents[1] / "charts" / "model-support" / "values.yaml"


def chart_memory(kind: str) -> int:
    """The operator's memory ``kind`` (requests / limits) in the chart's values, in bytes."""
    import yaml
    from kubernetes.utils import parse_quantity

    values = yaml.safe_load(CHART_VALUES.read_text())
    return int(parse_quantity(values["resources"][kind]["memory"]))


class CpuNeighbour:
    """One CPU-heavy process beside the measurement (``while True: pass``), as the targets
    are stated: the machine is never the benchmark's alone."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> CpuNeighbour:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def load_average() -> str:
    """The host's 1, 5 and 15 minute load averages and its CPU count, in words."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} CPUs"


class PeakRss:
    """The highest resident memory of a process, sampled every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval = pid, interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-rss", daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            self._stop.wait(self.interval)


class OperatorProcess:
    """`model-support operator` with ``settings`` (as the chart passes them), logging to a file.

    Its caches start empty, as in its pod (the chart points HF_HOME and XDG_CACHE_HOME at the
    pod's own /tmp): a Hub cache left by an earlier run would spare this one the requests a
    new sweep makes.
    """

    def __init__(self, settings: OperatorSettings, log_path: Path) -> None:
        self.settings = settings
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._caches: tempfile.TemporaryDirectory[str] | None = None

    def start(self) -> None:
        script = Path(sys.executable).parent / "model-support"
        command = [str(script)] if script.exists() else [sys.executable, "-m", "model_support"]
        # Cluster-wide: kmock serves no namespace listing for kopf's namespace observer.
        clusterwide = self.settings.model_copy(update={"namespaces": [], "all_namespaces": True})
        settings = clusterwide.model_dump(mode="json", by_alias=True, exclude_none=True)
        self._log = self.log_path.open("wb")
        self._caches = tempfile.TemporaryDirectory(prefix="operator-caches-")
        env = {
            **os.environ,
            "MODEL_SUPPORT_SETTINGS": json.dumps(settings),
            "HF_HOME": f"{self._caches.name}/hf-home",
            "XDG_CACHE_HOME": f"{self._caches.name}/cache",
        }
        self.proc = subprocess.Popen(
            [*command, "operator", "--no-metrics"],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
        if self._caches is not None:
            self._caches.cleanup()


class HubProcess:
    """The stand-in Hub (tests/hubserver.py) in a process of its own, serving ``names`` as
    copies of the checkpoint at ``checkpoint`` (``downloads[i]`` each, for rankings), so that
    it competes with neither the emulated API server nor the operator for an interpreter."""

    def __init__(
        self, checkpoint: Path, names: list[str], downloads: list[int] | None = None
    ) -> None:
        self.args = (str(checkpoint), names, downloads)
        self.url = ""
        self.proc: multiprocessing.process.BaseProcess | None = None

    def __enter__(self) -> HubProcess:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self.proc = context.Process(target=_serve_hub, args=(child, *self.args), daemon=True)
        self.proc.start()
        self.url = str(parent.recv())
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.join(timeout=30)

    @property
    def pid(self) -> int:
        assert self.proc is not None and self.proc.pid is not None
        return self.proc.pid


def _serve_hub(
    conn: Connection, checkpoint: str, names: list[str], downloads: list[int] | None
) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from hubserver import HubServer, Repo

    repos = [
        Repo.from_dir(name, Path(checkpoint), **({"downloads": downloads[i]} if downloads else {}))
        for i, name in enumerate(names)
    ]
    with HubServer(repos) as hub:
        conn.send(hub.url)
        threading.Event().wait()
