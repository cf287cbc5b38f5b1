"""Can this node run tests? The checks of `model-support doctor`, which take under a minute.

The node's own checks (device files, versions with torch against torch-neuronx's requirement,
cores and LNC, the NEFF cache folder, the fallback setting, TorchNeuron's import) and the device
smoke test are run.py's, the same the runner runs first (docs/trainium.md): run.py runs them
itself, as a process of its own (``python3 run.py --preflight``), and prints them as one marked
JSON line; this package never imports it. Beside them: the runtime library against the host's
driver and the devices as neuron-ls (or sysfs) reports them (:mod:`model_support.neuron_node`),
the compile cache target's prefix, the results store and the Hub. Every failure names its fix; a
check with nothing to check on this machine (no Neuron device) is "n/a".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from model_support.neuron_node import (
    DeviceFacts,
    PreflightCheck,
    device_facts_check,
    installed_runtime_version,
    read_device_facts,
    runtime_driver_check,
)

if TYPE_CHECKING:
    from model_support.compile_cache.compilers import CompilerCache

SMOKE_TIMEOUT_S = 30.0
"""How long the device smoke test may take: starting the runtime takes seconds; a runtime that
hangs must not keep the doctor past its minute."""
PREFLIGHT_TIMEOUT_S = 120.0
"""How long run.py's preflight may take beyond its smoke test's own limit: it imports torch and
torch_neuronx (seconds each on a node's first start)."""


class Preflight(BaseModel):
    """What run.py's ``--preflight`` printed: its checks, and the node facts the doctor's own
    checks read (every field declared: run.py's output is checked, never trusted loosely)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: list[PreflightCheck]
    torchneuron: PreflightCheck
    smoke: PreflightCheck
    driver_version: str | None
    instance: str | None
    visible_cores: list[int] | None


def run_preflight(
    smoke: str,
    smoke_timeout_s: float = SMOKE_TIMEOUT_S,
    env: dict[str, str] | None = None,
    python: str = sys.executable,
) -> Preflight:
    """run.py's preflight in a process of its own (``smoke``: ``always`` runs the smoke test,
    ``auto`` only where the node has Neuron device files). A preflight that hangs or ends
    without its report is one failed check that quotes what it wrote."""
    from model_support.script import runner_constant, template_file

    marker = str(runner_constant("PREFLIGHT_MARKER"))
    command = ["--preflight", "--smoke", smoke, "--smoke-timeout", f"{smoke_timeout_s:g}"]
    with resources.as_file(template_file()) as path:
        try:
            done = subprocess.run(
                [python, str(path), *command],
                capture_output=True,
                text=True,
                timeout=smoke_timeout_s + PREFLIGHT_TIMEOUT_S,
                env=env,
            )
        except subprocess.TimeoutExpired as exc:
            written = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
            return _failed(
                f"run.py's preflight did not finish within "
                f"{smoke_timeout_s + PREFLIGHT_TIMEOUT_S:.0f} s",
                written,
            )
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(marker):
            try:
                return Preflight.model_validate(json.loads(line[len(marker) :]))
            except (ValueError, ValidationError) as exc:
                return _failed(f"run.py's preflight report does not read: {exc}", done.stderr)
    return _failed(
        f"run.py's preflight ended (exit {done.returncode}) without a report", done.stderr
    )


def _failed(problem: str, stderr: str) -> Preflight:
    tail = " | ".join(stderr.strip().splitlines()[-5:])
    check = PreflightCheck(
        "node preflight",
        False,
        problem + (f"; it wrote: {tail}" if tail else ""),
        fix="run `python3 run.py --preflight --smoke auto --smoke-timeout 30` from the "
        "package's images/runner folder to see it whole; check that torch imports",
    )
    skipped = PreflightCheck("smoke test", True, "not run: the preflight failed", applicable=False)
    return Preflight(
        node=[check],
        torchneuron=PreflightCheck("TorchNeuron", False, "not checked: the preflight failed"),
        smoke=skipped,
        driver_version=None,
        instance=None,
        visible_cores=None,
    )


def compile_cache_check(
    uri: str | None, compiler: CompilerCache | None, why: str | None
) -> PreflightCheck:
    """The compile cache target resolves for the installed compiler (its prefix matches).

    ``compiler`` is the installed compiler's cache (None with ``why`` when none can be derived).
    """
    from model_support.compile_cache.errors import CompileCacheError
    from model_support.compile_cache.target import open_target

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

    # neuron-ls first: a node whose devices it lists gets the smoke test even where this
    # container was given no device files (the smoke test then says what is missing).
    facts = read_device_facts()
    node = run_preflight("always" if facts.devices else "auto", smoke_timeout_s)
    checks = list(node.node)
    checks.append(runtime_driver_check(installed_runtime_version(), node.driver_version))
    if facts.devices and node.instance:  # the EC2 type (DMI) over sysfs's family ("Trn2")
        facts.instance_type = node.instance
    checks.append(device_facts_check(facts, node.visible_cores, os.getpid()))
    checks.append(node.torchneuron)
    checks.append(node.smoke)
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
