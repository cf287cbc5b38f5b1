"""The NEFF cache TorchNeuron writes: both of its writers' layouts travel, a target is kept per
compile target and LNC as well as compiler version, and a target in a layout TorchNeuron does
not use is refused with a message saying so (docs/compile-cache.md, "What a complete entry is")."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from cache_support import NEURONX_CC, write

from model_support.compile_cache import (
    CacheDisabled,
    CompilerMismatch,
    UnreadableLayout,
    installed_compiler_cache,
    pull,
    push,
)
from model_support.compile_cache.compilers import CompilerCache, describe_prefix, neff_key
from model_support.compile_cache.layouts import is_entry_path, layout_problem, neff_layout, scan

SHARDED = "3f/a2/3fa2" + "0" * 28 + ".neff"  # the C++ writer's
SHA = hashlib.sha256(b"graph, neuronx-cc 2.28.7631.0, lnc 2").hexdigest()
SHA256_ENTRY = f"{SHA}/{SHA}.neff"  # the Python writer's


def _keyed(root: Path, lnc: int = 2, target: str = "trn2") -> CompilerCache:
    return CompilerCache("neff", "neuronx-cc", NEURONX_CC, root, target, lnc)


def test_both_writers_layouts_are_entries_and_nothing_else_is() -> None:
    assert (neff_layout(SHARDED), neff_layout(SHA256_ENTRY)) == ("sharded", "sha256")
    for path in (
        "3f/a3/3fa2" + "0" * 28 + ".neff",  # shard folders that are not its key's
        f"{SHA}/{'0' * 64}.neff",  # a file named after another key than its folder
        f"{SHA}.neff",
        "MODULE_7c055c4ac6e2851a63bb+7d89256e/model.neff",  # the PyTorch/XLA cache's
    ):
        assert not is_entry_path("neff", path), path


def test_a_compiled_run_leaves_entries_of_either_layout_and_both_travel(tmp_path: Path) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    write(here, SHARDED, b"from the C++ writer")
    write(here, SHA256_ENTRY, b"from the Python writer")
    write(here, f"{SHA}/.tmp.x1y2z3", b"half written")
    entries, _ = scan("neff", here)
    assert sorted(e.path for e in entries) == sorted([SHARDED, SHA256_ENTRY])
    assert push(str(tmp_path / "target"), compiler=_keyed(here)).entries == 2
    assert pull(str(tmp_path / "target"), compiler=_keyed(there)).entries == 2
    assert (there / SHA256_ENTRY).read_bytes() == b"from the Python writer"


def test_a_target_is_kept_per_compile_target_and_lnc(tmp_path: Path) -> None:
    lnc2, lnc1 = _keyed(tmp_path / "a", lnc=2), _keyed(tmp_path / "b", lnc=1)
    assert lnc2.prefix == f"neuronxcc-{NEURONX_CC}-trn2-lnc2"
    assert describe_prefix(lnc1.prefix) == f"neuronx-cc {NEURONX_CC} for trn2 at LNC 1"
    write(tmp_path / "a", SHA256_ENTRY, b"compiled at LNC 2")
    push(str(tmp_path / "target"), compiler=lnc2)
    assert pull(str(tmp_path / "target"), compiler=lnc1).entries == 0  # never across LNCs
    with pytest.raises(CompilerMismatch, match=r"for trn2 at LNC 2.*installed"):
        pull(str(tmp_path / "target" / lnc2.prefix), compiler=lnc1)
    trn3 = _keyed(tmp_path / "c", target="trn3")
    assert pull(str(tmp_path / "target"), compiler=trn3).entries == 0


def test_a_seed_in_the_unkeyed_layout_is_still_read(tmp_path: Path) -> None:
    """The seed buckets, and targets written before the key, keep neuronxcc-<version>/."""
    write(tmp_path / "seed" / f"neuronxcc-{NEURONX_CC}", SHARDED, b"a seed")
    report = pull(str(tmp_path / "seed"), compiler=_keyed(tmp_path / "local"))
    assert (report.entries, report.prefix) == (1, f"neuronxcc-{NEURONX_CC}")


def test_a_target_in_another_layout_is_refused_saying_which(tmp_path: Path) -> None:
    """optimum-neuron's public cache keeps PyTorch/XLA NEFFs in MODULE_<hash>+<hash>/ folders:
    pulled as if it were TorchNeuron's, it would silently seed nothing."""
    seed = tmp_path / "optimum" / f"neuronxcc-{NEURONX_CC}"
    write(seed, "MODULE_7c055c4ac6e2851a63bb+7d89256e/model.neff", b"an XLA graph")
    write(seed, "MODULE_7c055c4ac6e2851a63bb+7d89256e/compile_flags.json", b"[]")
    with pytest.raises(UnreadableLayout) as refused:
        pull(str(tmp_path / "optimum"), compiler=_keyed(tmp_path / "local"))
    message = str(refused.value)
    assert "in no layout TorchNeuron's NEFF cache uses" in message
    assert "PyTorch/XLA compile cache's layout" in message
    assert "<sha256>/<sha256>.neff" in message and "<k[0:2]>/<k[2:4]>/<k>.neff" in message
    assert layout_problem("neff", [], "empty") is None  # nothing there: a plain miss


def test_the_installed_compilers_target_and_lnc_come_from_the_machine() -> None:
    assert neff_key({"MODEL_SUPPORT_INSTANCE_TYPE": "trn2u.48xlarge"}) == ("trn2", 2)
    assert neff_key(
        {"MODEL_SUPPORT_INSTANCE_TYPE": "trn2.3xlarge", "NEURON_LOGICAL_NC_CONFIG": "1"}
    ) == ("trn2", 1)
    assert neff_key({"MODEL_SUPPORT_NEURON_TARGET": "trn3", "NEURON_LOGICAL_NC_CONFIG": "2"}) == (
        "trn3",
        2,
    )
    with pytest.raises(CacheDisabled, match="set MODEL_SUPPORT_INSTANCE_TYPE"):
        neff_key({"MODEL_SUPPORT_INSTANCE_TYPE": "m5.large"})
    # off Neuron the inductor cache has no such key
    assert installed_compiler_cache("cpu").prefix.startswith("inductor-torch-")
