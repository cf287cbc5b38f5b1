"""The viewer's server: ``streamlit run`` of viewer/app.py, with the page's data read first.

Run as ``python -m model_support.viewer.serve run APP [streamlit options] -- --results URI``
(what ``model-support viewer`` starts: the same arguments as ``python -m streamlit``).

A fresh server's first visitor would otherwise wait for what only the first run of the page
does: importing the viewer's modules (pandas, pyarrow, the store) and reading the newest stack's
results (a second or two on 100,000 rows) and each stack's models (for the note on how many this
stack tested), and what the Regressions view's first visit compares (0.3 s on 100,000 runs).
Here all of it happens once, before the server listens, into the process-wide caches the page
reads (``st.cache_resource``), with what Streamlit itself does at the first use of what the page
uses (its emoji catalog, for the page's icon) and what the page's other parts load at their
first use (the details' dependency graph for Reproduce, the libraries of the details, rankings
and charts: ``warm_first_uses``), so the first visitor finds them warm like
every later one; and the first element of the process is spared Streamlit's check that the page
is served by ``streamlit run`` (it is). Its connections send each response as soon as it is
written (``send_without_delay``).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from collections.abc import Callable

RESULTS_ENV = "MODEL_SUPPORT_RESULTS"


def results_uri(argv: list[str]) -> str:
    """``--results`` of the page's arguments (after ``--``), else the environment's."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--results", default=None)
    page_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    known, _ = parser.parse_known_args(page_args)
    return known.results or os.environ.get(RESULTS_ENV) or "results"


def warm(uri: str) -> None:
    """Import the page's modules and read what its first run reads (the newest stack's All
    results table and backends, every stack's model ids) and the Regressions view's default
    comparison, into the page's caches."""
    # Each st.cache_data decorator checks its parameters against the server's cache storage,
    # and warns, at import, that there is no server yet: true, and nothing to act on (the
    # caches themselves are made at their first call, in the server).
    from streamlit.runtime.caching import cache_data_api

    decorators = logging.getLogger(cache_data_api.__name__)
    level = decorators.level
    decorators.setLevel(logging.ERROR)
    try:
        from model_support.viewer import compare, details, history_views, links, views  # noqa: F401
    finally:
        decorators.setLevel(level)
    # The page's icon is an emoji, which Streamlit checks against its catalog of emoji: a
    # module whose first import in a process compiles a large regular expression (0.2 s).
    from streamlit.string_util import is_emoji

    is_emoji(details.PAGE_ICON)
    from model_support.viewer.data import list_stack_files
    from model_support.viewer.queries import newest_first

    files = list_stack_files(uri)
    compilers = newest_first((f.compiler_label, f.compiler_version) for f in files)
    if not compilers:
        return
    libraries = newest_first(
        (f.library_label, f.library_version) for f in files if f.compiler_label == compilers[0]
    )
    newest = next(
        f for f in files if (f.compiler_label, f.library_label) == (compilers[0], libraries[0])
    )
    key = views.cache_key([newest])
    table, _, _, _ = views._all_results(uri, key, None, "")
    views._read(uri, key, ("backend", "result"), None)  # the device note
    if len(files) > 1:  # the coverage note counts every stack's models
        for other in files:
            views._read(uri, views.cache_key([other]), ("model_id",), None)
    history_views.read_ahead(uri)
    # The details picker's options: the first unique() of an Arrow column in a process pays
    # for Arrow's kernel (0.2 s), every later one only for its rows.
    views.detail_options(table)


def warm_first_uses() -> None:
    """Load what the page's parts load at their first use in a process, which would otherwise
    be the server's first visitor's wait at that part (measured on 2 cores, busy): the
    details' Reproduce reads every installed distribution's dependencies (0.5-0.7 s of the first
    row clicked), their compile cache pull command imports the compile cache package (0.26 s),
    a classifier's labels table pandas' Styler (jinja2, 0.26 s), a Trainium row's the runner's
    base image from run.py's template (0.08 s); Trending and Downloads the Hub client, Charts
    and History altair."""
    import altair  # noqa: F401
    import pandas.io.formats.style  # noqa: F401

    import model_support.compile_cache
    import model_support.rankings  # noqa: F401
    from model_support.reproduce import installed_dependency_graph
    from model_support.script import runner_constant

    installed_dependency_graph()
    # A Trainium row's Reproduce names the runner's base image, a constant of run.py's
    # template, read by parsing it (0.08 s, once per process).
    runner_constant("TORCHNEURON_BASE_IMAGE")


def send_without_delay() -> None:
    """Have the server's connections send what it writes at once (TCP_NODELAY).

    Streamlit binds its listening socket itself, as ``socket.socket(family)``, whose protocol
    number is 0; asyncio turns Nagle's algorithm off only on sockets whose protocol is
    IPPROTO_TCP, so the server's connections kept it on. Uvicorn writes a response's headers and
    its body apart, and Nagle then holds the body until the browser acknowledges the headers,
    which on a kept-alive connection it delays (at least 40 ms on Linux): every small file of
    the page's JavaScript waited 40 ms, some 120 of them over the browser's six connections.
    On Linux a connection inherits TCP_NODELAY from its listening socket, so it is set there.
    """
    try:
        from streamlit.web.server.starlette import starlette_server
    except ImportError:  # Streamlit's Tornado server writes a small response's headers and
        return  # body at once: nothing for Nagle to hold
    bind: Callable[[str, int, int], socket.socket] | None = getattr(
        starlette_server, "_bind_socket", None
    )
    if bind is None:
        print(
            "Streamlit no longer binds through starlette_server._bind_socket: its connections "
            "may hold each response's body up to 40 ms (Nagle's algorithm)",
            file=sys.stderr,
        )
        return

    def bind_without_delay(address: str, port: int, backlog: int) -> socket.socket:
        listener = bind(address, port, backlog)
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return listener

    starlette_server._bind_socket = bind_without_delay


def skip_served_check() -> None:
    """Spare the first page Streamlit's check, at the first element drawn in a process, that
    the page runs in ``streamlit run`` and not in a REPL or as a plain script (whose only effect
    is a hint to use ``streamlit run``): it walks the page's thread with inspect.stack(), which
    resolves the file of every loaded module and reads the source of each frame, 0.07-0.17 s of
    the first visitor's page. This server is ``streamlit run``: the check is marked done."""
    from streamlit import delta_generator

    if not hasattr(delta_generator, "_use_warning_has_been_displayed"):
        print(
            "Streamlit no longer marks its check for `streamlit run` in delta_generator."
            "_use_warning_has_been_displayed: the first visitor's page may wait for it",
            file=sys.stderr,
        )
        return
    delta_generator._use_warning_has_been_displayed = True


def main() -> None:
    """Warm the caches, then become ``streamlit`` with this process's arguments."""
    uri = results_uri(sys.argv)
    start = time.perf_counter()
    try:
        warm(uri)
        warm_first_uses()
        print(f"Read {uri} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    except Exception as exc:  # only a head start: the page itself reports what is wrong
        print(f"Not read ahead ({type(exc).__name__}: {exc}); serving anyway", file=sys.stderr)
    skip_served_check()
    send_without_delay()
    from streamlit.web.cli import main as streamlit_main

    streamlit_main(prog_name="streamlit")


if __name__ == "__main__":
    main()
