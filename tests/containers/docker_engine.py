"""The machine's Docker engine for the container tests: used if one answers, else started here.

A daemon that answers (``DOCKER_HOST`` or /var/run/docker.sock) is used as it is and never
stopped. When none answers, the first test process that needs one starts ``dockerd`` (as root:
Debian's ``docker.io``) and every test process using it registers under a lock; the last one to
leave stops it. So xdist workers and concurrent test sessions share one daemon, and a daemon this
suite started does not outlive it. ``dockerd`` picks its storage driver itself (overlay2 where
the kernel and the backing filesystem allow it, else vfs); ``--storage-driver=vfs`` is retried if
the default does not start.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import docker
import docker.errors
import requests
from filelock import FileLock

STATE_DIR = Path(os.environ.get("MODEL_SUPPORT_DOCKERD_STATE", "/tmp/model-support-dockerd"))
START_TIMEOUT_S = 90.0

HOW_TO_START = (
    "The container tests need a Docker engine. Install Debian's `docker.io` and `debootstrap` "
    "(`apt-get install -y docker.io debootstrap`, as root) and the tests start `dockerd "
    "--iptables=false --bridge=none` themselves; or start a daemon yourself (as root: "
    "`dockerd --iptables=false --bridge=none &`) or point DOCKER_HOST at one."
)


class DockerUnavailable(RuntimeError):
    """No Docker engine answers and none can be started here; the message says how to get one."""


def _client() -> docker.DockerClient | None:
    """A client of the daemon that answers now, or None."""
    try:
        client = docker.from_env(timeout=600)
        client.ping()
        return client
    except (docker.errors.DockerException, requests.RequestException, OSError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DockerEngine:
    """A handle on the engine for one test process: ``acquire`` on first use, ``release`` at the end."""

    def __init__(self, state_dir: Path = STATE_DIR) -> None:
        self.state_dir = state_dir
        self.started_file = state_dir / "started.json"
        self.users_dir = state_dir / "users"
        self.log_path = state_dir / "dockerd.log"
        self.registered = False

    def _lock(self) -> FileLock:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.state_dir / "lock"))

    def acquire(self) -> docker.DockerClient:
        """A client of a running engine, starting ``dockerd`` if none answers."""
        with self._lock():
            self.users_dir.mkdir(parents=True, exist_ok=True)
            started = self._started_pid()
            client = _client()
            if client is None:
                if started is not None:  # ours, but not answering: replace it
                    self._stop(started)
                client = self._start()
                started = self._started_pid()
            if started is not None:
                (self.users_dir / str(os.getpid())).touch()
                self.registered = True
            return client

    def release(self) -> None:
        """Leave the engine; the last user of a daemon the tests started stops it."""
        if not self.registered:
            return
        with self._lock():
            (self.users_dir / str(os.getpid())).unlink(missing_ok=True)
            self.registered = False
            users = [p for p in self.users_dir.iterdir() if p.name.isdigit()]
            for user in users:
                if not _alive(int(user.name)):
                    user.unlink(missing_ok=True)
            started = self._started_pid()
            if started is not None and not any(self.users_dir.iterdir()):
                self._stop(started)

    def _started_pid(self) -> int | None:
        try:
            pid = int(json.loads(self.started_file.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None
        if _alive(pid):
            return pid
        self.started_file.unlink(missing_ok=True)
        return None

    def _start(self) -> docker.DockerClient:
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            raise DockerUnavailable(
                f"no Docker engine answers and `dockerd` is not installed. {HOW_TO_START}"
            )
        if os.geteuid() != 0:
            raise DockerUnavailable(
                f"no Docker engine answers and starting `dockerd` needs root (this is uid {os.geteuid()}). {HOW_TO_START}"
            )
        errors = []
        for extra in ([], ["--storage-driver=vfs"]):
            command = [dockerd, "--iptables=false", "--bridge=none", *extra]
            with self.log_path.open("ab") as log:
                proc = subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # not killed with the test process group by Ctrl-C
                )
            self.started_file.write_text(json.dumps({"pid": proc.pid, "command": command}))
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline and proc.poll() is None:
                client = _client()
                if client is not None:
                    return client
                time.sleep(0.5)
            self._stop(proc.pid)
            errors.append(f"`{' '.join(command)}` did not answer within {START_TIMEOUT_S:g} s")
        tail = self.log_path.read_text(errors="replace")[-3000:]
        raise DockerUnavailable(
            f"{'; '.join(errors)}. Its log ({self.log_path}) ends:\n{tail}\n{HOW_TO_START}"
        )

    def _stop(self, pid: int) -> None:
        """Stop the daemon this suite started (SIGTERM; it stops its containerd and containers)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while _alive(pid) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):  # reap it if it is our child
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        self.started_file.unlink(missing_ok=True)
