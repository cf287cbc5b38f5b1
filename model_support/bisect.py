"""Bisecting a regression to the first bad version of the package that caused it.

Two rows of one model, a good one and a bad one, each recorded every installed distribution.
The packages whose versions differ are the suspects. Each is tried alone at its bad version with
every other suspect held at the good side; each one that breaks the model alone is then
bisected over the versions its package index lists between the good and the bad one, the
others still held at the good side, until the first bad version is found.

The search is a pure function of what is known (:func:`next_step`): given the outcome of every
environment tried so far it names the next environment to try, or concludes. The command line
runs each step here, in a virtual environment of its own (:class:`LocalSteps`); the operator
runs each as a ModelSupportTest whose ``extraPackages`` pin the step's versions. Either way a
step whose environment already ran (a run of the same run.py with the same versions of the
suspects, in the steps' store or the results) is reused, never run again.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import venv
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field

from model_support.records import RunRecord

if TYPE_CHECKING:
    from model_support.store import ResultsStore

BISECT_SOURCE = "bisect"
"""The ``source`` of a step's record."""
STEPS_FOLDER = "bisect"
"""The steps' own results store, under the results store's root by default: a step is a real
run, but of an environment no stack is, so it never becomes a stack's row in the matrix."""


def steps_location(results: str) -> str:
    """Where a bisect's steps are recorded by default: :data:`STEPS_FOLDER` under the results
    store (the command line's and the operator's default)."""
    if "://" in results:
        return results.rstrip("/") + "/" + STEPS_FOLDER
    return os.path.join(results, STEPS_FOLDER)


class BisectError(ValueError):
    """A bisect that cannot start or go on, and why (what to do)."""


class NoRuns(BisectError):
    """The store holds no run of the model (and task)."""


# ---------------------------------------------------------------------------------------------
# What changed between the two rows


class Side(BaseModel):
    """One of the two rows: its run, stack, result and recorded packages."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    stack: str
    result: str
    packages: dict[str, str] = Field(
        ..., description="Every recorded distribution by canonical name -> version."
    )


class Suspect(BaseModel):
    """A package whose version differs between the two rows, and the versions in between."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    good: str
    bad: str
    versions: list[str] = Field(
        ..., description="good, every version the index lists between them, bad: oldest first."
    )


class Plan(BaseModel):
    """What a bisect works from: the model, the run.py every step runs (the bad row's), the
    two sides and the suspects."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_id: str
    task: str
    run_py: str
    good: Side
    bad: Side
    suspects: list[Suspect]
    added: list[str] = Field(default_factory=list, description="Only the bad row has them.")
    removed: list[str] = Field(default_factory=list, description="Only the good row has them.")

    def environment(self, **moved: str) -> dict[str, str]:
        """Every suspect at its good version, but those in ``moved`` (name -> version)."""
        pins = {s.name: s.good for s in self.suspects}
        pins.update(moved)
        return pins


def pins_of(packages: Iterable[str]) -> dict[str, str]:
    """``name==version`` entries by canonical name."""
    found: dict[str, str] = {}
    for entry in packages:
        name, sep, version = str(entry).partition("==")
        if sep and name and version:
            found[canonicalize_name(name)] = version
    return found


def differences(good: Mapping[str, str], bad: Mapping[str, str]) -> tuple[
    list[tuple[str, str, str]], list[str], list[str]
]:  # fmt: skip
    """(name, good version, bad version) of each package both rows have at other versions,
    then the names only the bad row has, and those only the good row has."""
    changed = sorted((n, good[n], bad[n]) for n in good.keys() & bad.keys() if good[n] != bad[n])
    return changed, sorted(bad.keys() - good.keys()), sorted(good.keys() - bad.keys())


def find_run(store: ResultsStore, model: str, task: str | None, what: str, field: str) -> str:
    """The run id of the row of ``model`` that ``what`` names: that run, or the model's latest
    run on the stack it names (a label, 'compiler version', a compiler version, a compiler).
    ``field`` names the input in errors (``--good``, ``spec.bad``). Raises :class:`NoRuns`
    when the store has no run of the model, :class:`BisectError` when ``what`` names nothing."""
    from model_support.history import StackNotFound, find_stack, latest_per_slot, read_history
    from model_support.history import stacks as order_stacks

    runs = read_history(store, model_id=model)
    if task is not None:
        runs = runs[runs["task"] == task]
    if runs.empty:
        raise NoRuns(f"no runs of {model!r}{f' ({task})' if task else ''} in {store.uri!r}")
    if what in set(runs["run_id"]):
        return what
    try:
        stack = find_stack(what, order_stacks(runs))
    except StackNotFound as exc:
        raise BisectError(f"{field}: {exc}") from exc
    latest = latest_per_slot(runs[stack.matches(runs)])
    if len(latest) > 1:
        tasks = ", ".join(sorted(latest["task"]))
        raise BisectError(
            f"{model!r} has runs of several tasks on {stack.label} ({tasks}): give the task "
            "(--task; spec.task of a ModelSupportBisect)"
        )
    return str(latest["run_id"].iloc[0])


def plan_from_rows(
    good: Mapping[str, Any],
    bad: Mapping[str, Any],
    index: PackageIndex,
    say: Callable[[str], None] | None = None,
    consider: Iterable[str] = (),
) -> Plan:
    """The plan from the two rows (matrix rows: ``run_id``, ``result``, ``task``, ``model_id``,
    ``packages``, ``run_py``, ``compiler``, ``compiler_version``): their packages'
    differences, each one's versions between (``say`` is told before each index request).
    ``consider``: only these packages are suspects (default every package that changed)."""
    for row, which in ((good, "good"), (bad, "bad")):
        if not row.get("packages"):
            raise BisectError(
                f"the {which} row ({row['run_id']}, {row.get('result')}) recorded no packages "
                "(nothing ran, or it was recorded before packages were kept): give rows that ran"
            )
        if not row.get("run_py"):
            raise BisectError(f"the {which} row ({row['run_id']}) stores no run.py")
    if good["task"] != bad["task"]:
        raise BisectError(f"the rows test different tasks ({good['task']}, {bad['task']})")
    good_pins, bad_pins = pins_of(good["packages"]), pins_of(bad["packages"])
    changed, added, removed = differences(good_pins, bad_pins)
    wanted = {canonicalize_name(name) for name in consider}
    if wanted:
        unchanged = sorted(wanted - {name for name, _, _ in changed})
        if unchanged:
            raise BisectError(
                f"{', '.join(unchanged)}: not at two versions in the good and the bad row (the "
                f"packages that changed: {', '.join(n for n, _, _ in changed) or 'none'})"
            )
        changed = [entry for entry in changed if entry[0] in wanted]
    suspects = []
    for name, low, high in changed:
        if say is not None:
            say(f"listing the versions of {name} between {low} and {high} ({index.describe()})")
        suspects.append(
            Suspect(
                name=name, good=low, bad=high, versions=versions_between(name, low, high, index)
            )
        )

    def side(row: Mapping[str, Any], pins: dict[str, str]) -> Side:
        stack = (
            " ".join(str(row.get(k)) for k in ("compiler", "compiler_version") if row.get(k))
            or "(unknown stack)"
        )
        return Side(
            run_id=str(row["run_id"]), stack=stack, result=str(row["result"]), packages=pins
        )

    return Plan(
        model_id=str(bad["model_id"]),
        task=str(bad["task"]),
        run_py=str(bad["run_py"]),
        good=side(good, good_pins),
        bad=side(bad, bad_pins),
        suspects=suspects,
        added=added,
        removed=removed,
    )


# ---------------------------------------------------------------------------------------------
# The package index (pip's)


@dataclass(frozen=True)
class PackageIndex:
    """Where pip looks for packages: its own configuration unless given here."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()

    def pip_args(self) -> list[str]:
        """pip's options naming this index."""
        args = []
        if self.index_url:
            args += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", link]
        return args

    def describe(self) -> str:
        """The index in words (pip's configuration when nothing is given)."""
        given = [*filter(None, [self.index_url]), *self.extra_index_urls, *self.find_links]
        return ", ".join(given) if given else "pip's configured index"


_AVAILABLE = re.compile(r"^Available versions:\s*(?P<versions>.*)$", re.MULTILINE)


def _pip(args: Sequence[str], timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def versions_between(name: str, good: str, bad: str, index: PackageIndex) -> list[str]:
    """``good``, the versions ``pip index versions`` lists between it and ``bad``, and ``bad``,
    oldest first (pre-releases only when an endpoint is one). Raises :class:`BisectError`
    when the index cannot be read or the versions do not order."""
    low, high = _version(good), _version(bad)
    if low is None or high is None:
        raise BisectError(
            f"{name}: {good!r} -> {bad!r} are not versions pip can order; bisect it by hand"
        )
    if low > high:
        raise BisectError(
            f"{name} went back from {good} to {bad} between the good and the bad row: a bisect "
            "walks forward; give the rows the other way round or bisect it by hand"
        )
    pre = ["--pre"] if low.is_prerelease or high.is_prerelease else []
    listed = _pip(["index", "versions", name, *pre, *index.pip_args()])
    match = _AVAILABLE.search(listed.stdout)
    if listed.returncode != 0 or match is None:
        said = (listed.stderr or listed.stdout).strip().splitlines()
        raise BisectError(
            f"the package index ({index.describe()}) lists no versions of {name}: "
            + (said[-1] if said else f"pip exited {listed.returncode}")
        )
    between = sorted(
        {
            v
            for text in match.group("versions").split(",")
            if (v := _version(text.strip())) is not None and low < v < high
        }
    )
    return [good, *(str(v) for v in between), bad]


# ---------------------------------------------------------------------------------------------
# The search


Verdict = Literal["good", "bad"]


def environment_key(pins: Mapping[str, str]) -> str:
    """One environment's name: its suspects' versions, sorted (``a==1 b==2``)."""
    return " ".join(f"{name}=={pins[name]}" for name in sorted(pins))


class Step(BaseModel):
    """One environment tried: which package and version it moved, its result and verdict."""

    model_config = ConfigDict(extra="forbid")

    package: str
    version: str
    pins: dict[str, str]
    purpose: str = Field(..., description="alone at its bad version, or a bisection step.")
    result: str | None = None
    verdict: Verdict | None = None
    run_id: str | None = None
    reused: bool = False


class Request(BaseModel):
    """The next environment to try."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    package: str
    version: str
    pins: dict[str, str]
    purpose: str


class Culprit(BaseModel):
    """A package that breaks the model alone, and its first bad version."""

    model_config = ConfigDict(extra="forbid")

    package: str
    last_good: str
    first_bad: str
    result: str = Field(..., description="The first bad version's result.")
    run_id: str | None = Field(None, description="Its run (a step, or the bad row).")


class Conclusion(BaseModel):
    """Where the bisect ended."""

    model_config = ConfigDict(extra="forbid")

    culprits: list[Culprit] = Field(default_factory=list)
    innocent: list[str] = Field(
        default_factory=list, description="Suspects that do not break the model alone."
    )
    message: str


Known = Mapping[str, tuple[str, str | None]]
"""What is known: environment key -> (its result, its run id)."""


def verdict_of(plan: Plan, result: str) -> Verdict:
    """A step is good when its result is the good row's, bad otherwise."""
    return "good" if result == plan.good.result else "bad"


def next_step(plan: Plan, known: Known, taken: set[str] | None = None) -> Request | Conclusion:
    """The next environment to try given ``known`` outcomes, or the conclusion.

    First each suspect alone at its bad version (the others at the good side); then, for each
    that breaks the model alone (in name order), a binary search over its versions. Both
    endpoints of a search are known without a step: the good side is the good row, the bad one
    the suspect-alone step. ``taken``: the environments already listed as steps; one not in it
    is requested even when its outcome is known (the caller reuses that run), so the steps are
    the same whatever was run before (None: every known environment counts as taken).
    """
    done = set(known) if taken is None else taken
    if not plan.suspects:
        return Conclusion(message="the two rows recorded the same versions: nothing to bisect")
    breaking: list[Suspect] = []
    innocent: list[Suspect] = []
    for suspect in plan.suspects:
        pins = plan.environment(**{suspect.name: suspect.bad})
        seen = known.get(environment_key(pins))
        if seen is None or environment_key(pins) not in done:
            return Request(
                package=suspect.name, version=suspect.bad, pins=pins,
                purpose=f"{suspect.name} alone at its bad version, the others at the good side",
            )  # fmt: skip
        (breaking if verdict_of(plan, seen[0]) == "bad" else innocent).append(suspect)
    culprits = []
    for suspect in breaking:
        low, high = 0, len(suspect.versions) - 1
        while high - low > 1:
            middle = (low + high) // 2
            version = suspect.versions[middle]
            pins = plan.environment(**{suspect.name: version})
            seen = known.get(environment_key(pins))
            if seen is None or environment_key(pins) not in done:
                return Request(
                    package=suspect.name, version=version, pins=pins,
                    purpose=f"bisecting {suspect.name} between {suspect.versions[low]} (good) "
                    f"and {suspect.versions[high]} (bad)",
                )  # fmt: skip
            if verdict_of(plan, seen[0]) == "good":
                low = middle
            else:
                high = middle
        first = suspect.versions[high]
        result, run_id = known[environment_key(plan.environment(**{suspect.name: first}))]
        culprits.append(
            Culprit(
                package=suspect.name,
                last_good=suspect.versions[low],
                first_bad=first,
                result=result,
                run_id=run_id,
            )
        )
    names = [s.name for s in innocent]
    if not culprits:
        message = (
            "no suspect breaks the model alone: it takes several of "
            + ", ".join(s.name for s in plan.suspects)
            + " together (bisect them together by hand)"
        )
    else:
        message = "; ".join(
            f"first bad version: {c.package} {c.first_bad} ({c.result}; {c.last_good} is good)"
            for c in culprits
        )
        if names:
            message += f"; {', '.join(names)} alone do(es) not break it"
    return Conclusion(culprits=culprits, innocent=names, message=message)


def walk(
    plan: Plan, known: Known, fresh: Set[str] = frozenset()
) -> tuple[list[Step], Request | Conclusion]:
    """The bisect as far as ``known`` takes it: every step :func:`next_step` asks for whose
    outcome is known, in order, then the first whose outcome is not (to run next) or the
    conclusion. ``fresh``: the environments run for this bisect (any other known one is a
    reused run). Whoever runs the steps (here, or the operator's step tests) calls it again
    with each new outcome, so a bisect resumed from what is stored takes the same steps."""
    steps: list[Step] = []
    taken: set[str] = set()
    while True:
        decision = next_step(plan, known, taken)
        if isinstance(decision, Conclusion):
            return steps, decision
        key = environment_key(decision.pins)
        if key not in known:
            return steps, decision
        taken.add(key)
        result, run_id = known[key]
        steps.append(
            Step(
                package=decision.package,
                version=decision.version,
                pins=decision.pins,
                purpose=decision.purpose,
                result=result,
                verdict=verdict_of(plan, result),
                run_id=run_id,
                reused=key not in fresh,
            )
        )


def known_at_start(plan: Plan, found: Mapping[str, tuple[str, str | None, float]]) -> dict[
    str, tuple[str, str | None]
]:  # fmt: skip
    """The outcomes a bisect starts from: the matching runs ``found`` (:func:`matching_runs`),
    and the good side's environment, which is the good row (even where it ran another run.py)."""
    known: dict[str, tuple[str, str | None]] = {k: (v[0], v[1]) for k, v in found.items()}
    known.setdefault(environment_key(plan.environment()), (plan.good.result, plan.good.run_id))
    return known


# ---------------------------------------------------------------------------------------------
# Steps already run


def matching_runs(
    records: Iterable[RunRecord], plan: Plan
) -> dict[str, tuple[str, str | None, float]]:
    """Runs that are steps of ``plan``: its model and task, its exact run.py, and every
    suspect installed; by environment key -> (result, run id, when)."""
    found: dict[str, tuple[str, str | None, float]] = {}
    names = [s.name for s in plan.suspects]
    for record in records:
        doc = record.document
        if record.model_id != plan.model_id or doc.task != plan.task:
            continue
        if record.run_py != plan.run_py:
            continue
        installed = pins_of(doc.packages)
        if not all(name in installed for name in names):
            continue
        key = environment_key({name: installed[name] for name in names})
        when = (doc.finished_at or record.recorded_at).timestamp()
        if key not in found or when > found[key][2]:
            found[key] = (doc.result.value, record.run_id, when)
    return found


def stored_runs(store: ResultsStore, model_id: str, task: str) -> list[RunRecord]:
    """Every record of ``model_id`` and ``task`` in ``store`` (none when it has no history)."""
    from model_support.store import RecordNotFound

    if not store.fs.exists(store.history_path()):
        return [r for r in store.records(strict=False) if r.model_id == model_id]
    runs = store.history(columns=["run_id", "task"], filters=[("model_id", "==", model_id)])
    records = []
    for run_id in runs.loc[runs["task"] == task, "run_id"]:
        try:
            records.append(store.get(str(run_id)))
        except RecordNotFound:
            continue  # moved out since the last materialize
    return records


# ---------------------------------------------------------------------------------------------
# Running steps here


@dataclass
class LocalSteps:
    """Runs each step here in a virtual environment of its own: a venv whose own
    site-packages hold the step's pinned versions (``pip install --no-deps``, so nothing else
    moves), layered over this environment's, which provides every package the step does not
    pin. Each environment is made once under ``workdir`` and reused."""

    workdir: Path
    index: PackageIndex
    timeout_s: float = 3600.0
    held: dict[str, str] = field(default_factory=dict)
    """Packages the good row had at other versions than this environment (or that this one
    lacks): installed at the good row's versions in every step."""

    def environment(self, pins: Mapping[str, str]) -> Path:
        """The venv of one step's pins (made, or found made), with its python's path."""
        wanted = {**self.held, **pins}
        here = {name: _installed(name) for name in wanted}
        install = sorted(f"{n}=={v}" for n, v in wanted.items() if here[n] != v)
        digest = hashlib.sha256(json.dumps(install).encode()).hexdigest()[:16]
        folder = self.workdir / f"env-{digest}"
        python = folder / "bin" / "python"
        if (folder / "ready").is_file():
            return python
        venv.EnvBuilder(with_pip=False, clear=True, symlinks=True).create(folder)
        site = Path(
            sysconfig.get_path("purelib", vars={"base": str(folder), "platbase": str(folder)})
        )
        # This environment's packages come after the step's own (site.addsitedir also runs
        # their .pth files, e.g. an editable install's finder).
        layered = "".join(f"import site; site.addsitedir({path!r})\n" for path in _site_dirs())
        site.mkdir(parents=True, exist_ok=True)
        (site / "zz-model-support-layered.pth").write_text(layered, encoding="utf-8")
        if install:
            done = _pip(
                ["install", "--no-deps", "--no-input", "--target", str(site),
                 *self.index.pip_args(), *install],
            )  # fmt: skip
            if done.returncode != 0:
                said = (done.stderr or done.stdout).strip().splitlines()
                raise BisectError(
                    f"pip could not install {' '.join(install)} from {self.index.describe()}: "
                    + (said[-1] if said else f"exit {done.returncode}")
                )
        (folder / "ready").write_text("\n".join(install) + "\n", encoding="utf-8")
        return python

    def run(self, plan: Plan, request: Request, labels: dict[str, str]) -> RunRecord:
        """Run the plan's run.py in the request's environment; its record (not yet stored)."""
        from model_support.execution import run_script
        from model_support.records import record_from_document
        from model_support.script import read_config

        python = self.environment(request.pins)
        document = run_script(
            plan.run_py, read_config(plan.run_py), timeout_s=self.timeout_s, python=str(python)
        )
        record = record_from_document(document, plan.run_py, source=BISECT_SOURCE, labels=labels)
        return record.model_copy(update={"model_id": plan.model_id})


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _site_dirs() -> list[str]:
    """This interpreter's site-packages folders, in order."""
    import site

    found = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    for path in site.getsitepackages():
        if path not in found:
            found.append(path)
    return [p for p in found if os.path.isdir(p)]


def held_packages(good: Mapping[str, str], suspects: Iterable[str]) -> dict[str, str]:
    """The good row's packages that this environment lacks or has at another version (the
    suspects aside): a local step installs them at the good row's versions too."""
    skip = set(suspects)
    return {n: v for n, v in good.items() if n not in skip and _installed(n) != v}


# ---------------------------------------------------------------------------------------------
# The whole bisect


class BisectReport(BaseModel):
    """A finished bisect: the plan, every step in order, and the conclusion."""

    model_config = ConfigDict(extra="forbid")

    plan: Plan
    steps: list[Step]
    conclusion: Conclusion
    steps_store: str
    reproduce: list[str] = Field(
        default_factory=list, description="A command per culprit that reruns its first bad run."
    )


StepRunner = Callable[[Request, int], RunRecord]
"""Runs one requested step (its number from 1) and returns its record (stored by the caller)."""


def run_bisect(
    plan: Plan,
    runner: StepRunner,
    known_runs: Callable[[], Iterable[RunRecord]],
    record: Callable[[RunRecord], None],
    *,
    steps_store: str,
    on_step: Callable[[Step], None] | None = None,
    max_steps: int = 64,
) -> BisectReport:
    """Bisect ``plan``: reuse the steps ``known_runs`` already holds, run the others with
    ``runner`` (each one given to ``record``), until :func:`next_step` concludes."""
    known = known_at_start(plan, matching_runs(known_runs(), plan))
    fresh: set[str] = set()
    shown = 0
    while True:
        steps, decision = walk(plan, known, fresh)
        for step in steps[shown:]:
            if on_step is not None:
                on_step(step)
        shown = len(steps)
        if isinstance(decision, Conclusion):
            return report_for(plan, steps, decision, steps_store)
        if len(fresh) >= max_steps:
            raise BisectError(f"stopped after {max_steps} steps without a conclusion")
        made = runner(decision, len(steps) + 1)
        record(made)
        key = environment_key(decision.pins)
        fresh.add(key)
        known[key] = (made.document.result.value, made.run_id)


def report_for(
    plan: Plan,
    steps: list[Step],
    conclusion: Conclusion,
    steps_store: str,
    stored_in: Mapping[str, str] | None = None,
) -> BisectReport:
    """The finished bisect, with a command per culprit that reproduces its first bad run from
    the store that holds it (``stored_in``: run id -> store URI; default ``steps_store``)."""
    where = stored_in or {}
    commands = [
        f"model-support reproduce {shlex.quote(c.run_id)} --results "
        + shlex.quote(where.get(c.run_id, steps_store))
        for c in conclusion.culprits
        if c.run_id is not None
    ]
    return BisectReport(
        plan=plan, steps=steps, conclusion=conclusion, steps_store=steps_store, reproduce=commands
    )


def render_bisect(report: BisectReport) -> str:
    """The bisect as Markdown: the suspects, each step, and the conclusion."""
    plan = report.plan
    lines = [
        f"# Bisect: {plan.model_id} ({plan.task})",
        "",
        f"- good: {plan.good.result} on {plan.good.stack} (run {plan.good.run_id})",
        f"- bad: {plan.bad.result} on {plan.bad.stack} (run {plan.bad.run_id})",
        "- suspects: "
        + (
            "; ".join(
                f"{s.name} {s.good} -> {s.bad} ({len(s.versions) - 2} version(s) between)"
                for s in plan.suspects
            )
            or "none"
        ),
    ]
    if plan.added or plan.removed:
        lines.append(
            f"- not bisected: only the bad row has {', '.join(plan.added) or 'nothing'}; only "
            f"the good row has {', '.join(plan.removed) or 'nothing'}"
        )
    lines += [
        "",
        "| step | environment | result | verdict | run |",
        "| --- | --- | --- | --- | --- |",
    ]
    for number, step in enumerate(report.steps, 1):
        run = (step.run_id or "") + (" (reused)" if step.reused else "")
        lines.append(
            f"| {number} | {environment_key(step.pins)} | {step.result} | {step.verdict} | {run} |"
        )
    lines += ["", report.conclusion.message]
    lines += [f"- reproduce: {command}" for command in report.reproduce]
    return "\n".join(lines) + "\n"
