"""run.py on Trainium, the parts a first hour on a trn2 node tests first, here on CPU:

* errors are classified from what the Neuron runtime writes to the console (file descriptor 2),
  not only from the Python exception: each documented message is written to the real fd 2
  while a stage runs, as the runtime would, and the stage's error must name its class, quote
  the line and say what to do (sources: docs/trainium.md, "Error classes");
* the runtime is started in setup (a tensor onto the device, one op, synchronize), so a runtime
  that cannot start is infrastructure, never the model's load error;
* "compiled" means the whole graph: on the neuron backend a graph break is an error, a CPU
  fallback inside a compiled graph is an error, and what was pinned, seen and passed to the
  compiler is recorded. TorchNeuron cannot be installed here: its device module, its logger
  and its compile backend are stood in for where run.py meets them (the backend's seams).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from model_support.config import RunConfig
from model_support.records import ResultDocument
from model_support.runner import run as runner
from model_support.vocabulary import CompileFailure

NRT = "2021-Aug-11 18:38:27.0917 13713:13713 ERROR   NRT:nrt_init      "
TDRV = "2025-Oct-01 23:48:34.002260 516278:516285 ERROR  TDRV:"

# stage, the exception TorchNeuron raises, what the runtime writes to the console, the class,
# and a word of the fix the error must name (None: no fix expected).
CONSOLE_CASES = [
    # nrt-troubleshoot.rst, "Application fails to start": the driver is not installed
    (
        "load",
        RuntimeError("Neuron runtime initialization failed"),
        NRT + "Unable to determine Neuron Driver version. Please check aws-neuron-dkms package "
        "is installed.",
        "infrastructure",
        "aws-neuronx-dkms",
    ),
    # same page: the driver is older than the runtime needs (not the model's load error)
    (
        "load",
        RuntimeError("nrt_init failed"),
        NRT + "This runtime requires Neuron Driver version 2.0 or greater. Please upgrade "
        "aws-neuron-dkms package.",
        "infrastructure",
        "upgrade the host's driver",
    ),
    # same page: runtime and driver compatibility ids differ
    (
        "setup",
        RuntimeError("runtime failed to start"),
        "This Neuron Runtime (compatibility id: 7) is not compatible with the installed "
        "aws-neuron-dkms package",
        "infrastructure",
        "upgrade the host's driver",
    ),
    # same page, "Unsupported NEFF Version": compiler and runtime of different releases
    (
        "generate",
        RuntimeError("failed to load the compiled graph"),
        "NEFF version mismatch supported: 1.1 received: 2.0",
        "infrastructure",
        "different Neuron SDK releases",
    ),
    # same page, "Unsupported Hardware Operator Code"
    (
        "compile",
        RuntimeError("failed to load NEFF"),
        "2023-Jul-28 22:23:13.0357 101413:101422 ERROR  TDRV:translate_one_pseudo_instr_v2"
        "           Unsupported hardware operator code 214 found in neff.",
        "infrastructure",
        "different Neuron SDK releases",
    ),
    # same page, DGE notification overflow: an execution timeout naming a .neff, not a compile
    (
        "generate",
        RuntimeError("execution failed with status 1204"),
        TDRV + "exec_request_process_errors             [ND 1][NC 0] execution timeout "
        "(30000 ms) on model /home/ubuntu/compiled-models/model.MODULE_7c055c4ac6e2851a63bb+"
        "7d89256e.neff, potentially caused by DGE notifications enabled.",
        "infrastructure",
        "NEURON_RT_EXEC_TIMEOUT",
    ),
    # same page, "Neuron Runtime timeout or GPSIMD exception"
    (
        "generate",
        RuntimeError("Inference completed with err: 5"),
        "2023-Jan-09 20:27:41.0593 15042:15042 ERROR  TDRV:exec_consume_infer_status_notifications"
        " (FATAL-RT-UNDEFINED-STATE) inference timeout (600000 ms) on Neuron Device 0 NC 0, "
        "waiting for execution completion notification",
        "infrastructure",
        "reboot",
    ),
    # same page, "Neuron Core is in use", written to the console only
    (
        "generate",
        RuntimeError("failed to execute"),
        "2021-Aug-27 23:22:12.0323 28078:28078 ERROR   NRT:nrt_allocate_neuron_cores"
        "               NeuronCore(s) not available - Requested:nc1-nc1 Available:0",
        "infrastructure",
        "another process",
    ),
    # neuron-runtime/explore/device-memory.rst: the OOM report, in the console only
    (
        "generate",
        RuntimeError("allocation failed"),
        "Failed to allocate 4.000GB (alignment: none, usage: tensors) on ND 0:NC 4",
        "out-of-memory",
        None,
    ),
    # compiler/error-codes: an error code the compiler printed; the exception says little
    (
        "compile",
        RuntimeError("Neuron backend NEFF execution setup failed with unexpected error"),
        "[NCC_EUOC002] An unsupported operator was used.",
        "compile",
        None,
    ),
    # the image has no compiler: subprocess's own error, and TorchNeuron's wording
    (
        "compile",
        FileNotFoundError(2, "No such file or directory", "neuronx-cc"),
        "",
        "infrastructure",
        "no neuronx-cc",
    ),
    (
        "compile",
        RuntimeError("neuronx-cc not found in PATH"),
        "",
        "infrastructure",
        "no neuronx-cc",
    ),
    # the compiler's progress lines name it in every compile: a runtime error stays runtime
    (
        "generate",
        RuntimeError("shape mismatch in the model's own code"),
        "2026-Oct-19 10:00:00 INFO neuronx-cc compile --target trn2 --lnc 2: Compiler status PASS",
        "runtime",
        None,
    ),
    # an unrelated console line does not turn a load error into anything else
    (
        "load",
        OSError("org/model does not appear to have a file named config.json"),
        "Some weights of the model checkpoint were not used",
        "load",
        None,
    ),
]


@pytest.mark.parametrize(("stage", "exc", "written", "expected", "fix"), CONSOLE_CASES)
def test_errors_are_classified_from_what_the_runtime_writes_to_the_console(
    stage: str, exc: BaseException, written: str, expected: str, fix: str | None
) -> None:
    ctx = runner.RunContext({"backend": "neuron"})
    console = runner.CONSOLE.capturing()
    with console, pytest.raises(runner.StageFailure) as failure, runner.stage(stage, ctx):
        if written:
            os.write(2, f"{written}\n".encode())  # fd 2 itself, as the runtime's C code does
        raise exc
    assert failure.value.error_class == expected, failure.value.message
    if runner.runtime_lines([written]):
        # the runtime's own line is in the error, where the viewer and Triage read it
        assert written.strip() in failure.value.message
    if fix is not None:
        assert "fix: " in failure.value.message and fix in failure.value.message
    reason = failure.value.reason
    assert (reason is not None) == (expected == "compile")
    if expected == "compile":
        assert reason == CompileFailure.COMPILER_ERROR


def test_the_exception_alone_is_classified_the_same_without_a_console() -> None:
    """Where the runtime puts its message into the exception, no console is needed."""
    ctx = runner.RunContext({"backend": "neuron"})
    with pytest.raises(runner.StageFailure) as failure, runner.stage("load", ctx):
        raise RuntimeError(NRT + "Unable to determine Neuron Driver version.")
    assert failure.value.error_class == "infrastructure"


def test_only_what_was_written_during_the_stage_counts() -> None:
    """A runtime line of an earlier stage (a warning that was survived) does not reclassify a
    later stage's own error."""
    ctx = runner.RunContext({"backend": "neuron"})
    with runner.CONSOLE.capturing():
        with runner.stage("setup", ctx):
            os.write(2, b"ERROR NRT:nrt_init Unable to determine Neuron Driver version.\n")
        with pytest.raises(runner.StageFailure) as failure, runner.stage("load", ctx):
            raise OSError("no file named config.json")
    assert failure.value.error_class == "load"
    assert "the Neuron runtime wrote" not in failure.value.message


def test_the_console_is_passed_through_unchanged(capfd: pytest.CaptureFixture[str]) -> None:
    with runner.CONSOLE.capturing():
        os.write(2, b"partial line without newline, ")
        os.write(2, b"then the rest\n")
        mark = runner.CONSOLE.mark()
        os.write(2, b"after the mark\n")
        assert runner.CONSOLE.lines_since(mark) == ["after the mark"]
    assert capfd.readouterr().err == "partial line without newline, then the rest\nafter the mark\n"


# --------------------------------------------------------------------------- runtime start


class FailingRuntime:
    """torch.neuron whose runtime cannot start: the driver's message goes to the console."""

    def synchronize(self, device: Any = None) -> None:
        os.write(
            2, (NRT + "This runtime requires Neuron Driver version 2.31 or greater.\n").encode()
        )
        raise RuntimeError("nrt_init failed with status 1")


def test_a_runtime_that_cannot_start_fails_setup_as_infrastructure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch, "neuron", FailingRuntime(), raising=False)
    ctx = runner.RunContext({"backend": "neuron"})
    console = runner.CONSOLE.capturing()
    with console, pytest.raises(runner.StageFailure) as failure, runner.stage("setup", ctx):
        runner.BACKENDS["neuron"].start_runtime(torch.device("cpu"))
    assert (failure.value.error_class, failure.value.stage) == ("infrastructure", "setup")
    message = failure.value.message
    assert "did not run a first operation" in message and "before any model was loaded" in message
    assert "This runtime requires Neuron Driver version 2.31 or greater." in message
    assert "fix: upgrade the host's driver (aws-neuronx-dkms)" in message


def test_a_device_that_runs_the_first_operation_passes() -> None:
    assert runner.BACKENDS["cpu"].start_runtime(torch.device("cpu")) >= 0


# --------------------------------------------------------------------------- compile policy


def _neuron_compiler(on_call: Callable[[], None] | None = None) -> Callable[..., Any]:
    """A stand-in for TorchNeuron's compile backend: returns the graph to run (on CPU),
    calling ``on_call`` each time the compiled graph runs."""

    def compile_graph(graph_module: torch.fx.GraphModule, example_inputs: Any) -> Any:
        def call(*args: Any) -> Any:
            if on_call is not None:
                on_call()
            return graph_module(*args)

        return call

    return compile_graph


def _run_compiled(
    backend: runner.DeviceBackend,
    fn: Callable[[torch.Tensor], torch.Tensor],
    compiler: Callable[..., Any],
    between: Callable[[], None] | None = None,
) -> tuple[runner.GraphLedger, runner.FallbackWatch]:
    torch._dynamo.reset()
    ledger, watch = runner.GraphLedger(backend.cache_probe), runner.FallbackWatch()
    compiled = torch.compile(fn, backend=ledger.wrap(compiler), dynamic=False)
    ctx = runner.RunContext({"backend": backend.name})
    with runner.stage("compile", ctx), runner.compiled_as_required(backend, ledger, watch):
        compiled(torch.ones(4))
        if between is not None:
            between()
        compiled(torch.ones(4))
    return ledger, watch


def _with_break(x: torch.Tensor) -> torch.Tensor:
    y = torch.sin(x)
    print("a Python side effect: Dynamo breaks the graph here")
    return torch.cos(y)


def test_on_neuron_a_graph_break_is_a_compile_error_naming_dynamos_reason() -> None:
    with pytest.raises(runner.StageFailure) as failure:
        _run_compiled(runner.BACKENDS["neuron"], _with_break, _neuron_compiler())
    assert failure.value.error_class == "compile"
    assert failure.value.reason == CompileFailure.GRAPH_BREAK
    assert "print" in failure.value.message  # Dynamo's own reason


def test_off_neuron_a_graph_break_runs_and_its_reason_is_recorded() -> None:
    backend = runner.BACKENDS["cpu"]
    before = runner.read_compile_counts(backend)
    ledger, _ = _run_compiled(backend, _with_break, "aot_eager")
    summary = runner.compilation_summary(before, runner.read_compile_counts(backend), ledger.graphs)
    assert summary["graph_breaks"] >= 1 and summary["whole_graph"] is None
    assert any("print" in reason for reason in summary["graph_break_reasons"])


def _falls_back() -> None:
    # What TorchNeuron's logger says when an operator runs on the CPU (wording not documented:
    # any report of a fallback to the CPU or to eager execution is taken).
    logging.getLogger("torch_neuronx.neuron_dynamo_backend").warning(
        "aten::_unique2 is not supported on the Neuron device, falling back to CPU"
    )


def test_on_neuron_a_cpu_fallback_inside_a_compiled_graph_is_a_compile_error() -> None:
    with pytest.raises(runner.StageFailure) as failure:
        _run_compiled(runner.BACKENDS["neuron"], torch.sin, _neuron_compiler(_falls_back))
    assert (failure.value.error_class, failure.value.reason) == ("compile", "cpu-fallback")
    assert "compiled graph 0: aten::_unique2" in failure.value.message


def test_a_fallback_between_compiled_graphs_is_recorded_not_judged() -> None:
    """The eager work of generate() around the compiled forward is not the compiled graph:
    a fallback there is reported, and the run goes on."""
    _, watch = _run_compiled(
        runner.BACKENDS["neuron"], torch.sin, _neuron_compiler(), between=_falls_back
    )
    assert watch.reports() == [
        "between compiled graphs: aten::_unique2 is not supported on the Neuron device, "
        "falling back to CPU"
    ]
    assert not watch.in_graphs()


def test_a_graph_that_falls_back_to_eager_execution_is_caught_too() -> None:
    def eager_fallback() -> None:  # TorchNeuron, when fallback execution is enabled
        logging.getLogger("torch_neuronx").warning("Falling back to original GraphModule execution")

    with pytest.raises(runner.StageFailure) as failure:
        _run_compiled(runner.BACKENDS["neuron"], torch.sin, _neuron_compiler(eager_fallback))
    assert failure.value.reason == "cpu-fallback"


def test_the_neuron_path_pins_fallback_execution_and_records_the_compilers_arguments(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(runner.FALLBACK_EXECUTION_ENV, "0")  # asks for eager runs of failed graphs
    monkeypatch.delenv(runner.DEBUG_DIR_ENV, raising=False)
    monkeypatch.delenv(runner.PRESERVE_ARTIFACTS_ENV, raising=False)
    neuron = runner.BACKENDS["neuron"]
    pinned = neuron.pin_compile_settings()
    assert os.environ[runner.FALLBACK_EXECUTION_ENV] == "1"
    assert pinned["fallback_execution"] == (
        "disabled: TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1, set by run.py "
        "(the environment had '0')"
    )
    debug_dir = Path(os.environ[runner.DEBUG_DIR_ENV])
    assert debug_dir.is_dir() and pinned["debug_dir_owned"] == str(debug_dir)

    def writes_its_command(graph_module: torch.fx.GraphModule, example_inputs: Any) -> Any:
        # Where TorchNeuron's compile leaves its artifacts: the debug folder it was given.
        work = Path(os.environ[runner.DEBUG_DIR_ENV]) / "LlamaForCausalLM_0_inference_0"
        work.mkdir(parents=True, exist_ok=True)
        (work / "model.neff").write_bytes(b"\x00NEFF")
        (work / "command.txt").write_text(
            f"neuronx-cc compile --framework=XLA {work}/model.hlo --target=trn2 "
            f"--logical-nc-config=2 --auto-cast=none --output {work}/model.neff\n"
        )
        return graph_module

    ledger, _ = _run_compiled(neuron, torch.cos, writes_its_command)
    policy = runner.compile_policy(neuron, pinned)
    assert policy["whole_graph"] is True and "=1" in policy["fallback_execution"]
    assert neuron.compiler_arguments(pinned) == [
        "neuronx-cc compile --framework=XLA --target=trn2 --logical-nc-config=2 "
        "--auto-cast=none --output"
    ]
    summary = runner.compilation_summary(
        runner.read_compile_counts(runner.BACKENDS["cpu"]),
        runner.read_compile_counts(runner.BACKENDS["cpu"]),
        ledger.graphs,
        policy={**policy, "compiler_args": neuron.compiler_arguments(pinned)},
    )
    assert (
        ResultDocument.model_validate({**runner.new_document(_config()), "compilation": summary})
        .compilation.compiler_args[0]
        .startswith("neuronx-cc compile")
    )


def _config() -> dict:
    return RunConfig(model="org/model", backend="neuron").model_dump(mode="json")


def test_a_decode_that_recompiles_every_step_has_its_own_reason() -> None:
    exc = runner.EagerFallback("recompiled 8 times; Dynamo's guard: 0/7: L['self'].length == 23")
    assert runner.classify("generate", exc) == "compile"
    assert runner.compile_failure_reason(exc) == CompileFailure.RECOMPILES_PER_STEP
    assert runner.compile_failure_reason(RuntimeError("NCC_EXXX")) == "compiler-error"
