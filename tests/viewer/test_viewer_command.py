"""`model-support viewer` as a process: it becomes the Streamlit server, listens on 127.0.0.1
unless told otherwise, and leaves nothing running once stopped."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from ports import unused_port
from processes import listening_addresses, processes_with
from viewer_support import APP
from waiting import wait_until

CLI = str(Path(sys.executable).with_name("model-support"))


def start_viewer(results: Path, port: int, marker: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [CLI, "viewer", "--results", str(results), "--port", str(port), "--headless", *extra],
        env={
            **os.environ,
            "MODEL_SUPPORT_VIEWER_MARKER": marker,
            "MODEL_SUPPORT_HUB_ENDPOINT": "http://127.0.0.1:9",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def wait_listening(process: subprocess.Popen[bytes], port: int) -> list[str]:
    """Poll until the started process itself serves the health check; its listening addresses."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = process.stdout.read().decode() if process.stdout else ""
            raise AssertionError(f"the viewer exited with {process.returncode}: {output}")
        addresses = listening_addresses(process.pid, port)
        if addresses:
            host = "127.0.0.1" if "0.0.0.0" in addresses else addresses[0]
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/_stcore/health", timeout=2):
                    return addresses
            except OSError:
                pass
        time.sleep(0.3)
    process.kill()
    raise AssertionError("the viewer did not start serving within 90 s")


def start_serving_viewer(
    results: Path, marker: str, *extra: str
) -> tuple[subprocess.Popen[bytes], int, list[str]]:
    """The viewer started on a port no other program takes first (tests/ports.py) and serving:
    its process, port and listening addresses."""
    port = unused_port()
    process = start_viewer(results, port, marker, *extra)
    return process, port, wait_listening(process, port)


def wait_gone(process: subprocess.Popen[bytes], marker: str) -> None:
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError("the viewer did not stop within 30 s of the signal") from None
    wait_until(lambda: processes_with(marker) == [], "no process of the viewer to outlive it", 10)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_viewer_is_the_server_listens_locally_and_stops_whole(
    dataset: Path, stop: signal.Signals
) -> None:
    marker = f"viewer-{uuid.uuid4().hex}"
    process, _, addresses = start_serving_viewer(dataset, marker)
    try:
        # The CLI process itself listens (it became Streamlit), on the loopback address only.
        assert addresses == ["127.0.0.1"]
        assert processes_with(marker) == [process.pid]
        process.send_signal(stop)
        wait_gone(process, marker)
    finally:
        if process.poll() is None:
            process.kill()
    output = process.stdout.read().decode() if process.stdout else ""
    assert f"viewer on {dataset}" in output


def test_address_opens_the_viewer_to_other_interfaces(dataset: Path) -> None:
    marker = f"viewer-{uuid.uuid4().hex}"
    process, _, addresses = start_serving_viewer(dataset, marker, "--address", "0.0.0.0")
    try:
        assert addresses == ["0.0.0.0"]
        process.terminate()
        wait_gone(process, marker)
    finally:
        if process.poll() is None:
            process.kill()


def keep_alive_fetch_seconds(port: int, path: str, times: int) -> list[float]:
    """Seconds from each request for ``path`` to its last byte, on one kept-alive connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    seconds = []
    try:
        for _ in range(times):
            start = time.perf_counter()
            connection.request("GET", path)
            answer = connection.getresponse()
            body = answer.read()
            seconds.append(time.perf_counter() - start)
            assert answer.status == 200 and body, f"GET {path}: {answer.status}"
    finally:
        connection.close()
    return seconds


def test_a_kept_alive_connection_gets_each_response_at_once(dataset: Path) -> None:
    """A browser fetches the page's 120 files over six kept-alive connections. With Nagle's
    algorithm on, each response's body waited for the browser's delayed acknowledgement of its
    headers, at least 40 ms on Linux, every request after a connection's first few; the
    server's connections send at once, so none of them waits that long (the fastest of the
    later requests is far under 40 ms, even on busy cores)."""
    marker = f"viewer-{uuid.uuid4().hex}"
    process, port, _ = start_serving_viewer(dataset, marker)
    try:
        seconds = keep_alive_fetch_seconds(port, "/favicon.png", 12)
    finally:
        process.terminate()
        wait_gone(process, marker)
    later = seconds[4:]  # a new connection acknowledges at once, at first
    assert min(later) < 0.02, f"each response held back: {[round(s, 3) for s in seconds]}"


def test_the_viewers_streamlit_options_are_streamlits(tmp_path: Path) -> None:
    """The options the viewer's command gives Streamlit are read by Streamlit as meant: no
    watching of the installed sources, no full garbage collection after each run of the page
    (together a quarter of a second of every run, a click or a switch of view), no magic (the
    first run's rewrite of the script)."""
    from model_support.cli.commands_viewer import viewer_command

    command = viewer_command(str(tmp_path), 8501, headless=True)
    probe = (
        "import sys\n"
        "from streamlit import config\n"
        "from streamlit.web import bootstrap, cli\n"
        "context = cli.main_run.make_context('run', sys.argv[1:])\n"
        "bootstrap.load_config_options(flag_options=context.params)\n"
        "print(config.get_option('server.fileWatcherType'), "
        "config.get_option('runner.postScriptGC'), config.get_option('runner.magicEnabled'))\n"
    )
    answer = subprocess.run(
        [sys.executable, "-c", probe, *command[command.index("run") + 1 :]],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert answer.stdout.split() == ["none", "False", "False"], answer.stderr


def test_the_server_reads_the_page_before_its_first_visitor(
    long_dataset: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    """What the server reads before it listens is what the first page needs: that page builds
    no table of its own (the caches are the process's, shared with every session)."""
    from viewer_support import viewer_page

    from model_support.viewer import queries, serve

    argv = ["serve", "run", "app.py", "--server.port", "1", "--", "--results", str(long_dataset)]
    assert serve.results_uri(argv) == str(long_dataset)
    serve.warm(serve.results_uri(argv))

    def unexpected(frame: object) -> None:
        raise AssertionError("the first page built the table again")

    monkeypatch.setattr(queries, "results_table", unexpected)
    page = viewer_page(long_dataset, monkeypatch, dead_hub, view="all").run()
    assert not page.exception
    assert len(page.dataframe[0].value) == 500


def run_probe(probe: str) -> subprocess.CompletedProcess[str]:
    """Run the Python source ``probe`` in a new process (nothing of this one loaded or done)."""
    return subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )


def test_the_server_loads_what_streamlit_loads_at_the_pages_first_run(long_dataset: Path) -> None:
    """Streamlit's emoji catalog, which the page's icon is checked against (0.2 s to import at
    its first use in a process), is loaded before the server listens (a new process: this one
    may have loaded it already); so is what the page's other parts load at their first use: the
    installed packages' dependency graph (every details' Reproduce: 0.5-0.7 s of the first
    click), run.py's template parsed (the runner's base image), the compile cache package,
    pandas' Styler, the Hub client, altair."""
    probe = (
        "import sys\n"
        "from model_support.viewer import serve\n"
        f"serve.warm({str(long_dataset)!r})\n"
        "serve.warm_first_uses()\n"
        "from model_support.reproduce import installed_dependency_graph as graph\n"
        "from model_support.script import _statements as template\n"
        "print('streamlit.emojis' in sys.modules, graph.cache_info().currsize, "
        "template.cache_info().currsize)\n"
        "print(*(m in sys.modules for m in ('model_support.compile_cache', "
        "'pandas.io.formats.style', 'model_support.rankings', 'altair')))\n"
    )
    answer = run_probe(probe)
    assert answer.stdout.split() == ["True", "1", "1", "True", "True", "True", "True"], (
        answer.stderr
    )


@pytest.mark.parametrize("served", [True, False], ids=["served", "not-served"])
def test_the_first_page_of_the_server_does_not_walk_its_stack(
    long_dataset: Path, dead_hub: str, served: bool
) -> None:
    """Streamlit checks at a process's first element that it is not run from a REPL, walking
    the page's stack with inspect (0.07-0.17 s of the first visitor's page); the server, which
    is `streamlit run`, spares its first page that. In a new process (this one has drawn
    elements already), with inspect.stack failing: the served page draws, the other fails."""
    probe = (
        "import inspect, os\n"
        "from streamlit.testing.v1 import AppTest\n"
        "from model_support.viewer import serve\n"
        f"os.environ.update(MODEL_SUPPORT_RESULTS={str(long_dataset)!r}, "
        f"MODEL_SUPPORT_HUB_ENDPOINT={dead_hub!r})\n"
        f"{'serve.skip_served_check()' if served else ''}\n"
        "def walked(*args, **kwargs):\n"
        "    raise RuntimeError('the page walked its stack')\n"
        "inspect.stack = walked\n"
        f"page = AppTest.from_file({str(APP)!r}, default_timeout=60).run()\n"
        "print('page:', [str(e.value).splitlines()[0] for e in page.exception] or 'drawn')\n"
    )
    answer = run_probe(probe)
    [outcome] = [line for line in answer.stdout.splitlines() if line.startswith("page: ")]
    assert outcome == ("page: drawn" if served else "page: ['the page walked its stack']")


def test_the_first_page_reads_no_file_the_server_read_ahead(
    dataset: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    """Every file the first page reads (the newest stack's results and backends, each stack's
    models for the note on how many this stack tested) is read before the server listens."""
    from viewer_support import viewer_page

    from model_support.viewer import serve, views

    serve.warm(str(dataset))

    def unexpected(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the first page read {args[1] if len(args) > 1 else args}")

    monkeypatch.setattr(views, "read_columns_reporting", unexpected)
    page = viewer_page(dataset, monkeypatch, dead_hub, view="all").run()
    assert not page.exception, page.exception[0].value if page.exception else None
    assert len(page.dataframe[0].value) > 0


def test_the_first_visit_to_regressions_compares_nothing_the_server_read_ahead(
    dataset: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    """The Regressions view's default comparison (the two newest stacks, the default
    thresholds, every task) is made before the server listens: its first visitor reads no run
    and compares nothing (0.3 s on 100,000 runs), and sees what a later visitor sees."""
    from viewer_support import viewer_page

    from model_support.viewer import history_views, serve

    serve.warm(str(dataset))

    def unexpected(*args: object, **kwargs: object) -> None:
        raise AssertionError("the first visit to Regressions read the stacks' runs again")

    monkeypatch.setattr(history_views, "read_stack_runs", unexpected)
    monkeypatch.setattr(history_views, "regressions", unexpected)
    page = viewer_page(dataset, monkeypatch, dead_hub, view="regressions").run()
    assert not page.exception, page.exception[0].value if page.exception else None
    assert {m.label: m.value for m in page.metric}["regressions"] == "2"
