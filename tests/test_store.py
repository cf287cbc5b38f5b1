"""The results store: immutable records, concurrent writers, and the materialized matrix."""

from __future__ import annotations

import multiprocessing
import os
import uuid
from datetime import timedelta
from pathlib import Path

import fsspec
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from factories import NEURON_STACK, T0, make_record
from huggingface_hub import DatasetCard

from model_support.dataset import MATRIX_COLUMNS, MATRIX_SCHEMA
from model_support.records import (
    new_run_id,
)
from model_support.store import (
    CorruptRecord,
    CorruptRecordWarning,
    NotAResultsStore,
    RecordExists,
    RecordNotFound,
    ResultsStore,
    StoreLocationError,
    StoreNotWritable,
)
from model_support.vocabulary import ExclusionReason, Result

NEURON_FILE = "neuronx-cc-2.28.7631.0__transformers-5.24.0.parquet"
INDUCTOR_FILE = "inductor-2.13.0__transformers-5.24.0.parquet"


@pytest.fixture
def store(tmp_path: Path) -> ResultsStore:
    return ResultsStore(tmp_path / "results")


def test_round_trip(store: ResultsStore) -> None:
    record = make_record()
    path = store.add(record)
    assert path == str(Path(store.root) / "records" / f"{record.run_id}.json")
    assert store.get(record.run_id) == record
    assert list(store.records()) == [record]


def test_a_record_is_never_overwritten(store: ResultsStore) -> None:
    record = make_record()
    store.add(record)
    changed = make_record(result=Result.FAIL, run_id=record.run_id)
    with pytest.raises(RecordExists, match=record.run_id):
        store.add(changed)
    assert store.get(record.run_id).document.result == Result.PASS
    assert [p.name for p in (Path(store.root) / "records").iterdir()] == [f"{record.run_id}.json"]


def test_unknown_run_id_and_unsafe_run_id(store: ResultsStore) -> None:
    with pytest.raises(RecordNotFound, match="nope"):
        store.get("nope")
    with pytest.raises(ValueError, match="cannot name a record file"):
        store.add(make_record(run_id="../escape"))


def _write_one(root: str, index: int, barrier: multiprocessing.synchronize.Barrier) -> None:
    record = make_record(model=f"org/model-{index:02d}", finished=T0 + timedelta(minutes=index))
    barrier.wait()  # all 16 processes write at the same moment
    ResultsStore(root).add(record)


def _add_same_id(
    root: str,
    run_id: str,
    model: str,
    barrier: multiprocessing.synchronize.Barrier,
    outcome: multiprocessing.Queue,
) -> None:
    barrier.wait()
    try:
        ResultsStore(root).add(make_record(model=model, run_id=run_id))
        outcome.put("added")
    except RecordExists:
        outcome.put("exists")


def test_sixteen_concurrent_writer_processes_lose_nothing(store: ResultsStore) -> None:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(16)
    workers = [context.Process(target=_write_one, args=(store.uri, i, barrier)) for i in range(16)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [w.exitcode for w in workers] == [0] * 16
    store.materialize()
    matrix = store.matrix()
    assert sorted(matrix.model_id) == [f"org/model-{i:02d}" for i in range(16)]


def test_racing_writers_of_one_run_id_exactly_one_wins(store: ResultsStore) -> None:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(4)
    outcome: multiprocessing.Queue = context.Queue()
    run_id = new_run_id()
    workers = [
        context.Process(
            target=_add_same_id, args=(store.uri, run_id, f"org/m{i}", barrier, outcome)
        )
        for i in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert sorted(outcome.get(timeout=5) for _ in workers) == [
        "added",
        "exists",
        "exists",
        "exists",
    ]
    assert store.get(run_id).document.model.startswith("org/m")
    assert len(list(store.records())) == 1


def test_latest_record_per_model_wins(store: ResultsStore) -> None:
    old_pass = make_record("org/a", Result.PASS, finished=T0)
    new_fail = make_record("org/a", Result.FAIL, finished=T0 + timedelta(hours=1))
    other = make_record("org/b", Result.ERROR, finished=T0 - timedelta(days=1))
    # the same finish time: the larger run id is the later one
    tie_low = make_record("org/c", Result.PASS, finished=T0, run_id="20261102T090000000000Z-aaaa")
    tie_high = make_record("org/c", Result.FAIL, finished=T0, run_id="20261102T090000000000Z-bbbb")
    for record in (new_fail, tie_high, old_pass, other, tie_low):
        store.add(record)
    store.materialize()
    matrix = store.matrix().set_index("model_id")
    assert matrix.loc["org/a", "result"] == "FAIL"
    assert matrix.loc["org/a", "run_id"] == new_fail.run_id
    assert matrix.loc["org/b", "result"] == "ERROR"
    assert matrix.loc["org/c", "run_id"] == "20261102T090000000000Z-bbbb"
    assert len(matrix) == 3


def test_one_file_per_compiler_and_library_version(store: ResultsStore) -> None:
    store.add(make_record("org/a", neuron=True))
    store.add(
        make_record("org/a", neuron=True, transformers="5.25.0", finished=T0 + timedelta(hours=1))
    )
    store.add(make_record("org/a", neuron=False))
    store.add(make_record("org/b", neuron=False))
    written = store.materialize()
    names = sorted(p.name for p in (Path(store.root) / "data").iterdir())
    assert names == sorted(
        [INDUCTOR_FILE, NEURON_FILE, "neuronx-cc-2.28.7631.0__transformers-5.25.0.parquet"]
    )
    assert sorted(Path(p).name for p in written) == sorted([*names, "README.md"])
    by_name = {Path(f.path).name: f for f in store.matrix_files()}
    assert (by_name[NEURON_FILE].compiler, by_name[NEURON_FILE].compiler_version) == (
        "neuronx-cc",
        "2.28.7631.0",
    )
    assert (by_name[INDUCTOR_FILE].compiler, by_name[INDUCTOR_FILE].compiler_version) == (
        "inductor",
        "2.13.0",
    )
    assert {f.library_version for f in by_name.values()} == {"5.24.0", "5.25.0"}
    # org/a appears once per pair: the 5.24 neuron result is not hidden by the later 5.25 one
    assert sorted(pd.read_parquet(by_name[NEURON_FILE].path).model_id) == ["org/a"]
    assert sorted(pd.read_parquet(by_name[INDUCTOR_FILE].path).model_id) == ["org/a", "org/b"]
    for path in by_name:
        assert pq.read_schema(Path(store.root) / "data" / path).equals(MATRIX_SCHEMA)


def test_the_documented_pandas_query_works_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = ResultsStore("results")
    X = "Qwen/Qwen3-0.6B"
    store.add(make_record(X, cores=2))
    store.add(make_record(X, neuron=False))
    store.add(make_record("org/other", neuron=False, result=Result.ERROR))
    store.materialize()
    answer = pd.read_parquet("results/data")[lambda d: d.model_id == X][
        ["neuronx_cc", "library", "library_version", "neuron_cores", "result"]
    ]
    # pandas 3 shows a null string as NaN: compare with None in its place
    plain = answer.astype(object).where(answer.notna(), None)
    rows = sorted(plain.itertuples(index=False), key=lambda r: str(r.neuronx_cc))
    assert [tuple(r) for r in rows] == [
        ("2.28.7631.0", "transformers", "5.24.0", 2, "PASS"),
        (None, "transformers", "5.24.0", 1, "PASS"),
    ]
    # no hive partition columns sneak in, and every column keeps its type across files
    full = pd.read_parquet("results/data")
    assert list(full.columns) == list(MATRIX_COLUMNS)
    assert str(full.neuron_cores.dtype) == "int64"


def test_excluded_records_land_in_a_matrix_file(store: ResultsStore) -> None:
    excluded = make_record("org/huge", Result.EXCLUDED, exclusion=ExclusionReason.TOO_LARGE)
    store.add(excluded)
    stored = store.get(excluded.run_id)
    assert stored.document.stack.transformers is not None  # the writer's versions
    assert stored.document.stack.origin == "writer"
    store.materialize()
    row = store.matrix().iloc[0]
    assert (row.result, row.exclusion_reason) == ("EXCLUDED", "too-large")
    assert row.library_version == stored.document.stack.transformers
    # with a stack given (planned against known versions), that stack is kept as is
    planned = make_record(
        "org/huge2",
        Result.EXCLUDED,
        stack=NEURON_STACK,
        exclusion=ExclusionReason.REMOTE_CODE_REQUIRED,
    )
    store.add(planned)
    assert store.get(planned.run_id) == planned


def test_excluded_records_use_the_writers_declared_stack(tmp_path: Path) -> None:
    # the operator plans for the runner image, not for its own environment
    store = ResultsStore(tmp_path / "results", fallback_stack=NEURON_STACK)
    store.add(make_record("org/huge", Result.EXCLUDED, exclusion=ExclusionReason.TOO_LARGE))
    store.add(make_record("org/small", Result.PASS))
    store.materialize()
    assert [Path(f.path).name for f in store.matrix_files()] == [NEURON_FILE]
    assert sorted(store.matrix().result) == ["EXCLUDED", "PASS"]


def test_materialize_is_idempotent_and_rebuilds_from_records(store: ResultsStore) -> None:
    for i in range(5):
        store.add(make_record(f"org/m{i}", neuron=i % 2 == 0, result=list(Result)[i]))
    store.materialize()
    data = Path(store.root) / "data"
    first = {p.name: p.read_bytes() for p in data.iterdir()}
    card = (Path(store.root) / "README.md").read_bytes()
    store.materialize()
    assert {p.name: p.read_bytes() for p in data.iterdir()} == first
    for path in data.iterdir():
        path.unlink()
    data.rmdir()
    (Path(store.root) / "README.md").unlink()
    store.materialize()
    assert {p.name: p.read_bytes() for p in data.iterdir()} == first
    assert (Path(store.root) / "README.md").read_bytes() == card


def test_stale_matrix_files_are_removed(store: ResultsStore) -> None:
    record = make_record("org/a", neuron=False)
    store.add(record)
    store.materialize()
    assert [f.compiler for f in store.matrix_files()] == ["inductor"]
    (Path(store.root) / "records" / f"{record.run_id}.json").unlink()  # e.g. a record moved out
    store.add(make_record("org/a", neuron=True))
    store.materialize()
    assert [Path(f.path).name for f in store.matrix_files()] == [NEURON_FILE]


def test_a_failed_materialize_leaves_the_previous_matrix(store: ResultsStore) -> None:
    store.add(make_record("org/a", neuron=True))
    store.materialize()
    data = Path(store.root) / "data"
    before = (data / NEURON_FILE).read_bytes()
    card_before = (Path(store.root) / "README.md").read_bytes()
    # New results for both files; the first file to be written ("aot_eager..." sorts first) has a
    # directory in its place, so replacing it fails for real (os.replace onto a directory).
    store.add(
        make_record("org/a", neuron=True, result=Result.FAIL, finished=T0 + timedelta(hours=1))
    )
    aot = make_record("org/b", neuron=False).document.model_copy(
        update={"compile_backend": "aot_eager"}
    )
    store.add(make_record("org/b", neuron=False).model_copy(update={"document": aot}))
    blocker = data / "aot_eager-2.13.0__transformers-5.24.0.parquet"
    blocker.mkdir()
    (blocker / "keep").write_text("x")
    with pytest.raises(OSError):
        store.materialize()
    assert (data / NEURON_FILE).read_bytes() == before
    assert pd.read_parquet(data / NEURON_FILE).result.tolist() == ["PASS"]
    assert (Path(store.root) / "README.md").read_bytes() == card_before
    assert not [p for p in data.iterdir() if p.name.startswith(".")], "temporary files left behind"
    (blocker / "keep").unlink()
    blocker.rmdir()
    store.materialize()
    assert pd.read_parquet(data / NEURON_FILE).result.tolist() == ["FAIL"]
    assert sorted(store.matrix().model_id) == ["org/a", "org/b"]


def test_card_lists_every_data_file(store: ResultsStore) -> None:
    store.add(make_record("org/a", neuron=True))
    store.add(make_record("org/b", neuron=False, result=Result.ERROR))
    store.materialize()
    text = (Path(store.root) / "README.md").read_text()
    front = yaml.safe_load(text.split("---\n")[1])
    configs = {c["config_name"]: c["data_files"] for c in front["configs"]}
    assert configs["default"] == [{"split": "train", "path": "data/*.parquet"}]
    listed = sorted(files[0]["path"] for name, files in configs.items() if name != "default")
    assert listed == sorted(f"data/{p.name}" for p in (Path(store.root) / "data").iterdir())
    # the Hub's own parser reads the same configs
    assert len(DatasetCard(text).data.to_dict()["configs"]) == 3
    for state in Result:
        assert f"**{state.value}**" in text
    assert "`compile`" in text and "`too-large`" in text
    for column in MATRIX_COLUMNS:
        assert f"| `{column}` |" in text


def test_memory_filesystem(tmp_path: Path) -> None:
    uri = f"memory://results-{uuid.uuid4().hex}"
    store = ResultsStore(uri)
    record = make_record("org/a")
    path = store.add(record)
    assert path.startswith("memory://")
    with pytest.raises(RecordExists):
        store.add(record)
    assert store.get(record.run_id) == record
    store.add(make_record("org/b", neuron=False))
    written = store.materialize()
    assert all(p.startswith("memory://") for p in written)
    assert sorted(store.matrix(columns=["model_id", "result"]).model_id) == ["org/a", "org/b"]
    passing = store.matrix(filters=[("compiler", "==", "neuronx-cc")])
    assert passing.model_id.tolist() == ["org/a"]
    with fsspec.open(f"{uri}/README.md", "rt") as handle:
        assert "configs:" in handle.read()
    fsspec.filesystem("memory").rm(store.root, recursive=True)


def test_corrupt_record_is_named(store: ResultsStore) -> None:
    good = make_record("org/a")
    store.add(good)
    bad = Path(store.root) / "records" / "20261102T000000000000Z-broken.json"
    bad.write_text('{"run_id": "20261102T000000000000Z-broken", "document": {"model": "x"')
    with pytest.raises(CorruptRecord, match=r"20261102T000000000000Z-broken\.json"):
        list(store.records())
    with pytest.raises(CorruptRecord):
        store.materialize()
    with pytest.warns(CorruptRecordWarning, match=r"broken\.json"):
        assert list(store.records(strict=False)) == [good]
    # a valid record under someone else's name is corrupt too
    bad.write_text(good.model_copy(update={"run_id": "other"}).to_json())
    with pytest.raises(CorruptRecord, match="named for"):
        store.get("20261102T000000000000Z-broken")


def test_empty_store_and_unknown_columns(store: ResultsStore) -> None:
    assert list(store.records()) == []
    empty = store.matrix(columns=["model_id", "neuron_cores"])
    assert list(empty.columns) == ["model_id", "neuron_cores"] and empty.empty
    with pytest.raises(ValueError, match="unknown matrix column"):
        store.matrix(columns=["modelid"])
    assert store.materialize() == [os.path.join(store.root, "README.md")]


# --- concurrent materializers, incremental updates, odd paths, foreign files ------------------


def _add_and_materialize_six(
    root: str, writer: int, barrier: multiprocessing.synchronize.Barrier
) -> None:
    store = ResultsStore(root)
    barrier.wait()
    for i in range(6):
        model = f"org/w{writer}-{i}"
        store.add_and_materialize(make_record(model, neuron=(writer + i) % 2 == 0))


def test_the_last_materialize_reflects_every_record_of_eight_concurrent_writers(
    store: ResultsStore,
) -> None:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(8)
    workers = [
        context.Process(target=_add_and_materialize_six, args=(store.uri, w, barrier))
        for w in range(8)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [w.exitcode for w in workers] == [0] * 8
    # No materialize after the writers': the last of theirs already holds all 48 records.
    assert len(store.matrix(columns=["model_id"])) == 48
    assert len(list(store.records())) == 48


def _data_files(store: ResultsStore) -> dict[str, bytes]:
    data = Path(store.root) / "data"
    return {p.name: p.read_bytes() for p in sorted(data.iterdir())}


def test_incremental_materialize_gives_exactly_what_a_rebuild_gives(store: ResultsStore) -> None:
    """Records arrive out of order (older ones late, ties, several stacks); after each step the
    incrementally updated matrix and card equal a rebuild from the records, byte for byte."""
    steps = [
        [make_record("org/a", finished=T0), make_record("org/b", neuron=False)],
        [make_record("org/a", Result.FAIL, finished=T0 + timedelta(hours=1))],
        [make_record("org/a", Result.ERROR, finished=T0 - timedelta(hours=1))],  # older: loses
        [make_record("org/c", transformers="5.25.0"), make_record("org/b", neuron=False)],
        [make_record("org/d", Result.EXCLUDED, exclusion=ExclusionReason.TOO_LARGE)],
        [
            make_record("org/e", finished=T0, run_id="20261102T090000000000Z-bbbb"),
            make_record("org/e", Result.FAIL, finished=T0, run_id="20261102T090000000000Z-aaaa"),
        ],
    ]
    for records in steps:
        for record in records:
            store.add(record)
        store.materialize()
        incremental = _data_files(store)
        card = (Path(store.root) / "README.md").read_bytes()
        store.materialize(rebuild=True)
        assert _data_files(store) == incremental
        assert (Path(store.root) / "README.md").read_bytes() == card
    matrix = store.matrix().set_index("model_id")
    assert matrix.loc["org/a", "result"] == "FAIL"
    assert matrix.loc["org/e", "run_id"] == "20261102T090000000000Z-bbbb"


def test_adding_a_record_rewrites_only_its_matrix_file(store: ResultsStore) -> None:
    for i in range(20):
        store.add(make_record(f"org/n{i}", neuron=True))
        store.add(make_record(f"org/c{i}", neuron=False))
    store.materialize()
    data = Path(store.root) / "data"
    before = {p.name: p.stat().st_ino for p in data.iterdir()}
    # Records already in the matrix are not read again (that is what keeps it fast): one of
    # them damaged now goes unnoticed until a rebuild, which reads them all.
    damaged = next((Path(store.root) / "records").iterdir())
    original = damaged.read_bytes()
    damaged.write_text("{")
    store.add(make_record("org/new", neuron=False))
    store.materialize()
    after = {p.name: p.stat().st_ino for p in data.iterdir()}
    assert after[NEURON_FILE] == before[NEURON_FILE]  # not rewritten (same file on disk)
    assert after[INDUCTOR_FILE] != before[INDUCTOR_FILE]
    assert "org/new" in set(store.matrix().model_id)
    with pytest.raises(CorruptRecord):
        store.materialize(rebuild=True)
    damaged.write_bytes(original)


def test_a_lost_or_outdated_index_rebuilds_from_the_records(store: ResultsStore) -> None:
    store.add(make_record("org/a"))
    store.materialize()
    files = _data_files(store)
    index = Path(store.root) / "index" / "materialized.txt"
    index.write_bytes(b"\xff not an index")
    store.add(make_record("org/b", neuron=False))
    with pytest.warns(UserWarning, match="unreadable"):
        store.materialize()
    assert sorted(store.matrix().model_id) == ["org/a", "org/b"]
    index.unlink()
    (Path(store.root) / "data" / INDUCTOR_FILE).unlink()
    store.materialize()
    assert _data_files(store)[NEURON_FILE] == files[NEURON_FILE]
    assert sorted(store.matrix().model_id) == ["org/a", "org/b"]


@pytest.mark.parametrize("name", ["res[1]", "res*", "r?s{a,b}"])
def test_paths_with_pattern_characters_are_plain_names(tmp_path: Path, name: str) -> None:
    decoy = ResultsStore(tmp_path / "res1")  # what "res[1]" or "res*" would match as a pattern
    decoy.add(make_record("org/decoy"))
    store = ResultsStore(tmp_path / name)
    record = make_record("org/real")
    store.add(record)
    assert list(store.records()) == [record]
    store.materialize()
    assert store.matrix().model_id.tolist() == ["org/real"]
    assert [Path(f.path).name for f in store.matrix_files()] == [NEURON_FILE]


def test_materialize_deletes_only_the_matrix_files_it_wrote(store: ResultsStore) -> None:
    data = Path(store.root) / "data"
    data.mkdir(parents=True)
    pd.DataFrame({"mine": [1, 2]}).to_parquet(data / "someone-elses.parquet")
    (data / "notes.parquet").write_text("not even parquet")
    record = make_record("org/a", neuron=False)
    store.add(record)
    store.materialize()
    (Path(store.root) / "records" / f"{record.run_id}.json").unlink()
    store.add(make_record("org/a", neuron=True))
    store.materialize()  # the inductor file is stale now: it goes, the others stay
    assert sorted(p.name for p in data.iterdir()) == [
        NEURON_FILE,
        "notes.parquet",
        "someone-elses.parquet",
    ]
    assert [Path(f.path).name for f in store.matrix_files()] == [NEURON_FILE]
    assert store.matrix().model_id.tolist() == ["org/a"]


def test_a_folder_of_other_files_is_not_taken_for_a_results_store(tmp_path: Path) -> None:
    ResultsStore(tmp_path / "new").check_location()  # nothing there yet
    (tmp_path / "empty").mkdir()
    ResultsStore(tmp_path / "empty").check_location()
    other = tmp_path / "other"
    other.mkdir()
    (other / "README.md").write_text("my project")
    (other / "table.parquet").write_bytes(b"PAR1")
    with pytest.raises(NotAResultsStore, match=r"already holds other files \(README\.md"):
        ResultsStore(other).check_location()
    ResultsStore(other).check_location(allow_other_files=True)
    existing = ResultsStore(tmp_path / "existing")
    existing.add(make_record())
    existing.check_location()
    with pytest.raises(NotAResultsStore, match="is a file"):
        ResultsStore(other / "README.md").check_location()


def test_an_unwritable_location_is_found_before_anything_is_written(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(StoreNotWritable, match="cannot write to the results store"):
        ResultsStore(blocker / "results").check_writable()
    ResultsStore(tmp_path / "new" / "results").check_writable()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # the probe left nothing


def test_unknown_protocols_are_a_clear_error() -> None:
    with pytest.raises(StoreLocationError, match="Protocol not known: nosuch"):
        ResultsStore("nosuch://x")


def test_object_store_materializers_take_turns(tmp_path: Path) -> None:
    """Without flock (object stores), a lease file created exclusively serializes materializers."""
    import threading

    uri = f"memory://results-{uuid.uuid4().hex}"
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            store = ResultsStore(uri)
            for i in range(5):
                store.add_and_materialize(make_record(f"org/t{w}-{i}", neuron=i % 2 == 0))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    store = ResultsStore(uri)
    assert len(store.matrix(columns=["model_id"])) == 20
    assert not store.fs.exists(f"{store.root}/index/lock.json")  # released
    fsspec.filesystem("memory").rm(store.root, recursive=True)


def test_a_large_materialize_spread_over_processes_gives_the_same_files(
    store: ResultsStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parallel fold (used from PARALLEL_FROM records on) chooses exactly what one process
    chooses, also when versions of one model land in different processes' shares."""
    import model_support.store as store_module

    for i in range(40):
        store.add(
            make_record(
                f"org/m{i % 7}",
                list(Result)[i % 4],
                neuron=i % 3 != 0,
                finished=T0 + timedelta(minutes=(i * 37) % 11),
            )
        )
    store.materialize(rebuild=True)
    sequential = _data_files(store)
    card = (Path(store.root) / "README.md").read_bytes()
    monkeypatch.setattr(store_module, "PARALLEL_FROM", 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    for path in (Path(store.root) / "data").iterdir():
        path.unlink()
    store.materialize(rebuild=True)
    assert _data_files(store) == sequential
    assert (Path(store.root) / "README.md").read_bytes() == card
    # A corrupt record in a worker's share is named in this process, as without workers.
    last = sorted((Path(store.root) / "records").iterdir())[-1]
    last.write_text("{")
    with pytest.raises(CorruptRecord, match=last.name):
        store.materialize(rebuild=True)
    with pytest.warns(CorruptRecordWarning, match=last.name):
        store.materialize(rebuild=True, strict=False)


def test_a_stack_without_a_library_version_sits_beside_the_same_compiler_s_others(
    store: ResultsStore,
) -> None:
    """A record whose stack names no transformers version (an EXCLUDED row sized before
    anything was installed, a document from an old runner) and one with it, on the same
    compiler version: both matrix files are written, in a stable order."""
    with_version = make_record()
    without_version = make_record(
        "org/other", stack=NEURON_STACK.model_copy(update={"transformers": None})
    )
    store.add(with_version)
    store.add(without_version)
    written = [Path(p).name for p in store.materialize()]
    assert written[-1] == "README.md"
    assert len(written) == 3, written
    frame = pd.read_parquet(Path(store.root) / "data")
    assert sorted(frame.model_id) == ["Qwen/Qwen3-0.6B", "org/other"]
    assert store.materialize(rebuild=True) == store.materialize()
