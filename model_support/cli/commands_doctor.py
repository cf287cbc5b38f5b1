"""`model-support doctor`: can this node run tests? A preflight that takes seconds.

The node's own checks (device files, versions, cores and LNC, the NEFF cache folder) are run.py's,
the same the runner runs first (docs/trainium.md); this command adds TorchNeuron's import, the
compile cache target's prefix, the results store and the Hub, which only the command line reaches.

Exit codes: 0 every check passed, 1 at least one failed (the node cannot run tests), 2 bad input.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from model_support.printable import DataConsole

if TYPE_CHECKING:
    from model_support.compile_cache.compilers import CompilerCache
    from model_support.runner.run import PreflightCheck

EXIT_FAILED = 1


def compile_cache_check(
    uri: str | None, compiler: CompilerCache | None, why: str | None
) -> PreflightCheck:
    """The compile cache target resolves for the installed compiler (its prefix matches).

    ``compiler`` is the installed compiler's cache (None with ``why`` when none can be derived).
    """
    from model_support.compile_cache.errors import CompileCacheError
    from model_support.compile_cache.target import open_target
    from model_support.runner.run import PreflightCheck

    name = "compile cache target"
    if compiler is None:
        return PreflightCheck(name, False, f"no compile cache can be used here: {why}")
    if uri is None:
        return PreflightCheck(
            name,
            True,
            f"no target given (--compile-cache); this compiler's prefix: {compiler.prefix}",
        )
    try:
        resolved = open_target(uri, compiler)
    except CompileCacheError as exc:
        return PreflightCheck(name, False, str(exc))
    return PreflightCheck(name, True, resolved.prefix_uri)


def results_store_check(location: str | None) -> PreflightCheck:
    """The results store can be written (a probe file is written and removed)."""
    from model_support.runner.run import PreflightCheck

    name = "results store"
    if location is None:
        return PreflightCheck(name, True, "no store given (--results): not checked")
    # Only here: the runner image has no pandas/pyarrow, and needs no store to check its node.
    from model_support.store import ResultsStore, StoreError

    try:
        store = ResultsStore(location)
        store.check_writable()
    except StoreError as exc:
        return PreflightCheck(name, False, str(exc))
    return PreflightCheck(name, True, f"{store.uri} is writable")


def hub_check(model: str | None, endpoint: str | None, token: str | None) -> PreflightCheck:
    """The Hub answers (for ``model`` when given: it exists and, if gated, a token is set)."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    from model_support.hub import hub_api, is_unreachable, unreachable_message
    from model_support.runner.run import PreflightCheck

    name = "Hub"
    where = endpoint or "https://huggingface.co"
    has_token = "HF_TOKEN set" if token else "no HF_TOKEN"
    api = hub_api(endpoint, token)
    try:
        if model is None:
            next(iter(api.list_models(limit=1)), None)
            return PreflightCheck(name, True, f"{where} answers ({has_token})")
        info = api.model_info(model, token=token)
    except GatedRepoError:
        return PreflightCheck(
            name,
            False,
            f"{model} is gated and this token cannot read it ({has_token}): set HF_TOKEN",
        )
    except RepositoryNotFoundError:
        return PreflightCheck(
            name, False, f"{model} is not on {where} (or is private: {has_token})"
        )
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        return PreflightCheck(
            name, False, unreachable_message(model or "the model list", exc, where)
        )
    if info.gated and not token:
        return PreflightCheck(name, False, f"{model} is gated: set HF_TOKEN to a token with access")
    return PreflightCheck(name, True, f"{model} readable at {where} ({has_token})")


def all_checks(
    results: str | None, compile_cache: str | None, model: str | None
) -> list[PreflightCheck]:
    """Every check, the node's first (run.py's), then what only the command line reaches."""
    from model_support.compile_cache import installed_compiler_cache
    from model_support.compile_cache.errors import CacheDisabled
    from model_support.runner import run as runner

    checks = runner.node_checks(runner.node_facts(), os.getuid())
    checks.append(runner.torchneuron_check())
    try:
        compiler, why = installed_compiler_cache("neuron"), None
    except CacheDisabled as exc:
        compiler, why = None, str(exc)
    checks.append(compile_cache_check(compile_cache, compiler, why))
    checks.append(results_store_check(results))
    checks.append(
        hub_check(model, os.environ.get("HF_ENDPOINT"), os.environ.get("HF_TOKEN") or None)
    )
    return checks


def _table(checks: list[PreflightCheck]) -> Table:
    table = Table(title="model-support doctor", show_header=True)
    table.add_column("check")
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    for check in checks:
        status = Text("ok", style="green") if check.ok else Text("FAILED", style="bold red")
        table.add_row(Text(check.name), status, Text(check.detail))  # data, never markup
    return table


def register(app: typer.Typer) -> None:
    """Add the ``doctor`` command to ``app``."""

    @app.command("doctor")
    def doctor(
        results: Annotated[
            str | None, typer.Option("--results", help="Results store to check for writing.")
        ] = None,
        compile_cache: Annotated[
            str | None,
            typer.Option("--compile-cache", help="Compile cache target whose prefix to check."),
        ] = None,
        model: Annotated[
            str | None,
            typer.Option("--model", help="A Hub model to check access to (gated needs HF_TOKEN)."),
        ] = None,
        json_output: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
    ) -> None:
        """Check that this node can run Trainium tests: devices, versions, cores and LNC, caches,
        the results store and the Hub. Exit 1 when any check fails."""
        checks = all_checks(results, compile_cache, model)
        ok = all(check.ok for check in checks)
        if json_output:
            print(
                json.dumps(
                    {
                        "ok": ok,
                        "checks": [
                            {"name": c.name, "ok": c.ok, "detail": c.detail} for c in checks
                        ],
                    }
                )
            )
        else:
            DataConsole().print(_table(checks))
        if not ok:
            raise typer.Exit(EXIT_FAILED)
