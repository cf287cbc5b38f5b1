"""`model-support doctor`: can this node run tests? A preflight that takes under a minute.

The node's own checks (device files, versions with torch against torch-neuronx's requirement,
cores and LNC, the NEFF cache folder) are run.py's, the same the runner runs first
(docs/trainium.md); this command adds what proves the device and what only the command line
reaches: the fallback setting, the runtime library against the host's driver, the devices as
neuron-ls (or sysfs) reports them and who uses them, TorchNeuron's import, a smoke test on the
device (a tensor, one op, synchronize, in a process of its own with a timeout), the compile cache
target's prefix, the results store and the Hub. Every failure names its fix; a check with
nothing to check on this machine (no Neuron device) is "n/a".

Exit codes: 0 every check passed, 1 at least one failed (the node cannot run tests), 2 bad input.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from model_support.neuron_node import (
    SMOKE_TIMEOUT_S,
    DeviceFacts,
    device_facts_check,
    installed_runtime_version,
    read_device_facts,
    runtime_driver_check,
    smoke_check,
)
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
        return PreflightCheck(
            name,
            False,
            f"no compile cache can be used here: {why}",
            fix="run where neuronx-cc is installed (the runner image), or pass no --compile-cache",
        )
    if uri is None:
        return PreflightCheck(
            name,
            True,
            f"no target given (--compile-cache); this compiler's prefix: {compiler.prefix}",
        )
    try:
        resolved = open_target(uri, compiler)
    except CompileCacheError as exc:
        return PreflightCheck(
            name, False, str(exc), fix="give the cache's root URI (its prefix is derived)"
        )
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
        return PreflightCheck(
            name, False, str(exc), fix="give a --results location this user and node can write"
        )
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
            f"{model} is gated and this token cannot read it ({has_token})",
            fix="set HF_TOKEN to a token whose account accepted the model's conditions",
        )
    except RepositoryNotFoundError:
        return PreflightCheck(
            name,
            False,
            f"{model} is not on {where} (or is private: {has_token})",
            fix="check the model id, or set HF_TOKEN for a private model",
        )
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        return PreflightCheck(
            name,
            False,
            unreachable_message(model or "the model list", exc, where),
            fix="let this node reach the Hub (HF_ENDPOINT, proxy, network policy)",
        )
    if info.gated and not token:
        return PreflightCheck(
            name,
            False,
            f"{model} is gated",
            fix="set HF_TOKEN to a token whose account accepted the model's conditions",
        )
    return PreflightCheck(name, True, f"{model} readable at {where} ({has_token})")


@dataclass
class DoctorReport:
    """Every check, and the node's device facts (neuron-ls or sysfs)."""

    checks: list[PreflightCheck]
    facts: DeviceFacts

    @property
    def ok(self) -> bool:
        """No applicable check failed."""
        return all(check.ok or not check.applicable for check in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checks": [
                {
                    "name": c.name,
                    "status": c.status,
                    "ok": c.ok,
                    "applicable": c.applicable,
                    "detail": c.detail,
                    "fix": c.fix,
                }
                for c in self.checks
            ],
            "device_facts": self.facts.as_dict(),
        }


def all_checks(
    results: str | None,
    compile_cache: str | None,
    model: str | None,
    smoke_timeout_s: float = SMOKE_TIMEOUT_S,
    hub: bool = True,
) -> DoctorReport:
    """Every check, the node's first (run.py's), then the device's, then what only the command
    line reaches (the Hub only with ``hub``: a run of a local checkpoint needs none)."""
    from model_support.compile_cache import installed_compiler_cache
    from model_support.compile_cache.errors import CacheDisabled
    from model_support.runner import run as runner

    node = runner.node_facts()
    checks = runner.node_checks(node, os.getuid())
    checks.append(runner.check_fallback_setting(node.environ))
    checks.append(runtime_driver_check(installed_runtime_version(), node.driver_version))
    facts = read_device_facts()
    if facts.devices and node.instance:  # the EC2 type (DMI) over sysfs's family ("Trn2")
        facts.instance_type = node.instance
    spec = (node.environ.get("NEURON_RT_VISIBLE_CORES") or "").strip()
    try:
        visible = runner.parse_visible_cores(spec) if spec else None
    except runner.InfrastructureError:
        visible = None  # the cores check says why
    checks.append(device_facts_check(facts, visible, os.getpid()))
    checks.append(runner.torchneuron_check())
    if node.device_files or facts.devices:
        checks.append(smoke_check("neuron", smoke_timeout_s))
    else:
        checks.append(
            runner.PreflightCheck(
                "smoke test",
                True,
                "no Neuron device on this machine: nothing to run a first operation on",
                applicable=False,
            )
        )
    try:
        compiler, why = installed_compiler_cache("neuron"), None
    except CacheDisabled as exc:
        compiler, why = None, str(exc)
    checks.append(compile_cache_check(compile_cache, compiler, why))
    checks.append(results_store_check(results))
    if hub:
        checks.append(
            hub_check(model, os.environ.get("HF_ENDPOINT"), os.environ.get("HF_TOKEN") or None)
        )
    return DoctorReport(checks, facts)


_STYLES = {"ok": "green", "FAILED": "bold red", "n/a": "dim"}


def _table(checks: list[PreflightCheck]) -> Table:
    table = Table(title="model-support doctor", show_header=True)
    table.add_column("check")
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    table.add_column("fix", overflow="fold")
    for check in checks:
        status = Text(check.status, style=_STYLES[check.status])
        fix = Text(check.fix or "" if not check.ok and check.applicable else "")
        table.add_row(Text(check.name), status, Text(check.detail), fix)  # data, never markup
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
        smoke_timeout: Annotated[
            float,
            typer.Option(
                "--smoke-timeout", min=1.0, help="Seconds the device smoke test may take."
            ),
        ] = SMOKE_TIMEOUT_S,
    ) -> None:
        """Check that this node can run Trainium tests: devices (a smoke test on them),
        versions and their pairing, cores and LNC, caches, the results store and the Hub.
        Exit 1 when any check fails; each failure names its fix."""
        report = all_checks(results, compile_cache, model, smoke_timeout)
        if json_output:
            print(json.dumps(report.as_dict()))
        else:
            DataConsole().print(_table(report.checks))
        if not report.ok:
            raise typer.Exit(EXIT_FAILED)
