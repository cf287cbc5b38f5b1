"""`model-support viewer`: start the Streamlit viewer on a results location."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

import model_support
from model_support.cli.common import DEFAULT_RESULTS, fail, reading_store

DEFAULT_ADDRESS = "127.0.0.1"
"""Where the viewer listens unless --address says otherwise: this machine only."""
RESULTS_ENV = "MODEL_SUPPORT_RESULTS"
HUB_ENDPOINT_ENV = "MODEL_SUPPORT_HUB_ENDPOINT"


SERVER_OPTIONS = [
    *("--server.fileWatcherType", "none"),
    *("--runner.postScriptGC", "false"),
    *("--runner.magicEnabled", "false"),
    *("--client.toolbarMode", "viewer"),
]
"""Streamlit's options for a served viewer, which Streamlit's defaults spend on the runs of the
page (its first page, each click, each switch of view): watching sources, an installed package's
that never change, is a scan of every loaded module's path after each run (0.15 s, with pandas,
pyarrow and the store loaded); the forced full garbage collection after each run walks every
object those hold (0.08 s; Python's own collector still runs as it always does); "magic", which
the page does not use, parses and rewrites the page's script before its first run (0.1-0.2 s for
the first visitor after a start) and would draw any bare string in it. Its toolbar shows a
visitor of the page what a viewer needs, not Streamlit's own tools for whoever develops a page
(its "Deploy" button, rerun and settings)."""


def app_path() -> Path:
    """The Streamlit script of the viewer (viewer/app.py, installed as model_support.viewer)."""
    import model_support.viewer

    return Path(model_support.viewer.__file__).with_name("app.py")


def viewer_command(
    results: str,
    port: int | None,
    headless: bool,
    address: str = DEFAULT_ADDRESS,
    script: Path | None = None,
) -> list[str]:
    """The `streamlit run` command line for ``results`` (passed as a script argument), through
    model_support.viewer.serve: it reads the page's data before the server listens. ``script``
    is the page served, the viewer's app.py unless given (a benchmark serves a bare page so)."""
    page = script if script is not None else app_path()
    command = [sys.executable, "-m", "model_support.viewer.serve", "run", str(page)]
    command += ["--server.address", address]
    if port is not None:
        command += ["--server.port", str(port)]
    if headless:
        command += ["--server.headless", "true"]
    command += SERVER_OPTIONS
    command += ["--browser.gatherUsageStats", "false", "--", "--results", results]
    return command


def address_problem(address: str) -> str | None:
    """Why the viewer could not listen on ``address``, or None when it can: the name must
    resolve and be an address of this machine (a probe binds a free port there and lets go)."""
    try:
        family, kind, _, _, where = socket.getaddrinfo(
            address, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        return f"{address} is not an IP address or a name this machine resolves ({reason})"
    with socket.socket(family, kind) as probe:
        try:
            probe.bind((where[0], 0, *where[2:]))
        except OSError as exc:
            return f"{address} is not an address of this machine ({exc.strerror or exc})"
    return None


def register(app: typer.Typer) -> None:
    """Add the `viewer` command to the CLI."""

    @app.command("viewer")
    def viewer(
        results: Annotated[
            str,
            typer.Option(
                "--results",
                envvar=RESULTS_ENV,
                help="Results location: a local directory or an fsspec URL such as hf://datasets/org/name.",
            ),
        ] = DEFAULT_RESULTS,
        port: Annotated[
            int | None,
            typer.Option(
                "--port", min=1, max=65535, help="Port to serve on (Streamlit's default: 8501)."
            ),
        ] = None,
        address: Annotated[
            str,
            typer.Option(
                "--address",
                help="Address to listen on: 127.0.0.1 (this machine only) unless you want "
                "others to reach it, e.g. 0.0.0.0 for every interface.",
            ),
        ] = DEFAULT_ADDRESS,
        hub_endpoint: Annotated[
            str | None,
            typer.Option(
                "--hub-endpoint",
                envvar=HUB_ENDPOINT_ENV,
                help="Hub endpoint for the rankings (default: the Hub).",
            ),
        ] = None,
        headless: Annotated[bool, typer.Option(help="Do not open a browser.")] = False,
        cache_target: Annotated[
            list[str] | None,
            typer.Option(
                "--cache-target",
                help="A compile cache root the viewer may name in pull commands (repeatable; "
                "{namespace} stands for any namespace): the targets your operator configured. "
                "A record's own target is shown as a command only when it lies under a shared "
                "one (without {namespace}) and --cache-trusted-key names the keys to check.",
            ),
        ] = None,
        cache_trusted_key: Annotated[
            list[str] | None,
            typer.Option(
                "--cache-trusted-key",
                help="A public key (ed25519:<base64>) the pull commands shown check signatures "
                "with (repeatable): your operator's compileCacheTrustedKeys.",
            ),
        ] = None,
    ) -> None:
        """Browse results in the Streamlit viewer (selected, trending, downloads, triage, compare, charts)."""
        from model_support.store import ResultsStore, StoreLocationError

        try:
            ResultsStore(results)  # the protocol is known and its filesystem installed
        except StoreLocationError as exc:
            raise fail(f"--results {results}: {exc}") from exc
        if "://" in results:
            with reading_store(results):  # credentials and endpoint, before anything starts
                ResultsStore(results).matrix_files()
        elif not Path(results).is_dir():
            raise fail(
                f"--results {results} is not a directory; give a results directory (or an "
                "fsspec URL such as hf://datasets/org/name)"
            )
        where = address.strip()
        problem = address_problem(where) if where else "the address is empty"
        if problem is not None:
            raise fail(
                f"--address {address}: {problem}; give 127.0.0.1 (this machine only) or "
                "0.0.0.0 (every interface)"
            )
        env = dict(os.environ)
        env[RESULTS_ENV] = results
        if hub_endpoint:
            env[HUB_ENDPOINT_ENV] = hub_endpoint
        if cache_target:
            from model_support.viewer.queries import CACHE_TARGETS_ENV

            env[CACHE_TARGETS_ENV] = ",".join(t.strip() for t in cache_target)
        if cache_trusted_key:
            from model_support.compile_cache import TrustPolicy, UntrustedCache
            from model_support.viewer.queries import CACHE_KEYS_ENV

            try:
                TrustPolicy(tuple(k.strip() for k in cache_trusted_key))  # each one a key
            except UntrustedCache as exc:
                raise fail(f"--cache-trusted-key: {exc}") from exc
            env[CACHE_KEYS_ENV] = ",".join(k.strip() for k in cache_trusted_key)
        command = viewer_command(results, port, headless, where)
        typer.echo(f"model-support {model_support.__version__}: viewer on {results}")
        sys.stdout.flush()
        sys.stderr.flush()
        # Become Streamlit rather than wait for it: a signal to this process (Ctrl-C, SIGTERM
        # from a supervisor) then reaches the server itself, and nothing is left running.
        os.execve(command[0], command, env)
