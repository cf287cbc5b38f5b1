"""Recording runs: the results stores tests record into, the record of each run (its document,
the run.py that ran, and labels saying which test, Job and attempt it was, what ran and where the
document came from), and keeping each store's matrix current while runs arrive."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterable

from model_support.delivery import DeliveryArea, DeliveryError
from model_support.operator import metrics, notifications
from model_support.operator.kube import Kube
from model_support.operator.manifests import TestRef, runner_env
from model_support.operator.outcome import DocumentSource, reported_stack_fields
from model_support.operator.planning import store_uri
from model_support.operator.resource import run_id_for
from model_support.operator.settings import OperatorSettings, RunnerStack
from model_support.operator.spec import TestSpec
from model_support.operator.status import TestStatus
from model_support.records import (
    ResultDocument,
    RunRecord,
    failure_document,
    record_from_document,
)
from model_support.runpath import excluded_record
from model_support.script import PROGRAM_KEYS, RUN_CONFIG_ENV, render_script
from model_support.sizing import Exclusion
from model_support.store import RecordExists, RecordNotFound, ResultsStore
from model_support.vocabulary import ErrorClass, Parallelism, Result

log = logging.getLogger(__name__)


REST_PER_BUSY = 2.0
"""After a materialize of d seconds, the next (when one is pending) starts no sooner than this
many times d later. A materialize rewrites each changed matrix file whole (at a thousand rows,
seconds of CPU), so back to back through a sweep it would take a core from the tests'
launches; paced, it takes at most a third of the time, and each pass folds more records. A
small store's pass takes milliseconds: its matrix is as prompt as ever."""


class Materializer:
    """Keeps one store's matrix current: at most one materialize running and one pending.

    Records are the truth and the matrix is derived, so a burst of completions (a sweep) costs
    a few materializations, not one each, paced by ``REST_PER_BUSY``; a failed one is logged
    and redone on the next request.
    With ``publish``, each materialize also sets the stacks' and releases' metrics and tells
    the release findings: only the operator's own store does (the series carry no store, so a
    second store, such as a bisect's steps, whose stacks are no release, would overwrite them).
    """

    def __init__(self, store: ResultsStore, *, publish: bool = True) -> None:
        self.store = store
        self.publish = publish
        self._lock = threading.Lock()
        self._running = False
        self._pending = False
        self.idle = threading.Event()
        self.idle.set()

    def request(self) -> None:
        """Materialize soon (in a background thread)."""
        with self._lock:
            if self._running:
                self._pending = True
                return
            self._running = True
            self.idle.clear()
        threading.Thread(target=self._loop, name="materialize", daemon=True).start()

    def _loop(self) -> None:
        while True:
            started = time.monotonic()
            try:
                self.store.materialize()
                if self.publish:
                    self._publish()
            except Exception:
                log.exception(
                    "materializing %s failed; records are intact, the next run redoes it",
                    self.store.uri,
                )
            busy = time.monotonic() - started
            metrics.MATERIALIZE_SECONDS.observe(busy)
            with self._lock:
                more = self._pending
                self._pending = False
                if not more:
                    self._running = False
                    self.idle.set()
            rest = busy * REST_PER_BUSY if more else 0.0
            log.debug(
                "materialized %s in %.3f s; the next pass in %.3f s", self.store.uri, busy, rest
            )
            if not more:
                return
            time.sleep(rest)  # what is recorded meanwhile joins the next pass

    def _publish(self) -> None:
        """The stacks' and releases' metrics, and each release's confirmed regressions told."""
        metrics.observe_stacks(self.store)
        for release in metrics.observe_releases(self.store):
            if release.regressions:
                notifications.notifier().tell(
                    notifications.release_regressions(release, self.store)
                )


class Recorder:
    """The results stores tests record into, and what a run record says besides its document:
    which test, attempt and Job it was, what ran (the run.py, the image, whose stack) and
    where its document came from."""

    def __init__(self, settings: OperatorSettings, kube: Kube) -> None:
        self.settings = settings
        self.kube = kube
        self._lock = threading.Lock()
        self._stores: dict[str, ResultsStore] = {}
        self.materializers: dict[str, Materializer] = {}
        """One per store (by its URI), keeping its matrix current as records arrive."""

    # ---------------------------------------------------------------- stores

    def store_uri(self, spec: TestSpec | None) -> str:
        """The results store URI of a test (its spec's `results`, else the operator's)."""
        return store_uri(spec, self.settings)

    def store_for(self, spec: TestSpec | None) -> ResultsStore:
        """The results store of a test (its spec's `results`, else the operator's)."""
        uri = self.store_uri(spec)
        with self._lock:
            if uri not in self._stores:
                self._stores[uri] = ResultsStore(uri)
                self.materializers[self._stores[uri].uri] = Materializer(
                    self._stores[uri], publish=uri == self.settings.results_uri
                )
            return self._stores[uri]

    def record(self, spec: TestSpec | None, record: RunRecord) -> bool:
        """Add a record; False if this run id is already stored (a replay: nothing to do)."""
        store = self.store_for(spec)
        try:
            store.add(record)
        except RecordExists:
            log.info("run %s was already recorded; not recording it again", record.run_id)
            return False
        self.materializers[store.uri].request()
        result = record.document.result
        detail = (
            record.exclusion_reason.value
            if record.exclusion_reason
            else (record.document.error_class.value if record.document.error_class else "")
        )
        metrics.TESTS.labels(result.value, detail).inc()
        if record.document.timings.wall_time_s is not None:
            metrics.WALL_SECONDS.observe(record.document.timings.wall_time_s)
        return True

    def stores(self) -> list[ResultsStore]:
        """Every store this operator records into (its own, and those tests named)."""
        self.store_for(None)  # the operator's own store, whether or not it recorded yet
        with self._lock:
            return list(self._stores.values())

    @staticmethod
    def stored(store: ResultsStore, run_id: str) -> RunRecord | None:
        """The record of ``run_id`` in ``store``, if it is there and the store answers."""
        try:
            return store.get(run_id)
        except RecordNotFound:
            return None
        except Exception:  # the store cannot answer now: as if unread, the retry asks again
            log.warning("could not look up run %s in %s", run_id, store.uri, exc_info=True)
            return None

    # ---------------------------------------------------------------- what a record says

    def before_run(self, ref: TestRef, spec: TestSpec, record: RunRecord) -> str:
        """Record a generation that ends at sizing (no Job) as the run of attempt 0; returns
        its run id."""
        run_id = run_id_for(ref.uid, ref.generation, 0)
        self.record(spec, record.model_copy(update={"run_id": run_id}))
        return run_id

    def failed_before_run(
        self, ref: TestRef, spec: TestSpec, result: Result, error_class: ErrorClass, message: str
    ) -> RunRecord:
        """The record of a generation sizing ended with an error (no Job ran)."""
        config = spec.run_config(spec.cores or 1, spec.parallelism or Parallelism.NONE)
        document = failure_document(config, result, error_class=error_class, error=message)
        return record_from_document(
            document,
            render_script(config),
            source="operator",
            labels={**self.labels(ref, None, 0), "document_source": DocumentSource.OPERATOR.value},
        )

    def excluded(self, ref: TestRef, spec: TestSpec, exclusion: Exclusion) -> RunRecord:
        """The record of a generation sizing excluded (no Job ran)."""
        return excluded_record(
            spec.run_config(1, Parallelism.NONE),
            exclusion.reason,
            exclusion.message,
            source="operator",
            labels=self.labels(ref, None, 0),
            needed=exclusion.needed_split,
        )

    def of_run(
        self,
        ref: TestRef,
        spec: TestSpec | None,
        job_name: str,
        attempt: int,
        document: ResultDocument,
        source: DocumentSource,
        run_py: str,
        *,
        pod_cores: int | None,
        node_instance_types: frozenset[str] | None,
    ) -> RunRecord:
        """The record of an attempt's run: its document (as trusted), the run.py that ran, and
        labels saying which test, Job and attempt, what ran, where the document came from, and
        which of its stack's fields are only the pod's word."""
        labels = {
            **self.labels(ref, job_name, attempt),
            **self.provenance(spec),
            "document_source": source.value,
            "stack_reported": ",".join(
                reported_stack_fields(document, self.declared_stack(spec), node_instance_types)
            ),
        }
        if pod_cores:
            labels["pod_cores"] = str(pod_cores)  # the cores the pod held
        return record_from_document(
            document,
            run_py,
            source="operator",
            labels=labels,
            run_id=run_id_for(ref.uid, ref.generation, attempt),
        )

    @staticmethod
    def labels(ref: TestRef, job_name: str | None, attempt: int) -> dict[str, str]:
        """Which test (and Job, attempt) a record is of."""
        labels = {
            "namespace": ref.namespace,
            "test": ref.name,
            "test_uid": ref.uid,
            "generation": str(ref.generation),
        }
        if job_name:
            labels |= {"job": job_name, "attempt": str(attempt)}
        return labels

    def declared_stack(self, spec: TestSpec | None) -> RunnerStack | None:
        """The stack a test's record names: the configured runner image's, for a test on it
        that installs nothing over it; None (the pod's report, labelled by
        :meth:`provenance` as what untrusted code said) for its own image or extraPackages,
        which may rightly change the versions."""
        if spec is None or spec.extraPackages:
            return None
        if (spec.image or self.settings.runner_image) != self.settings.runner_image:
            return None
        return self.settings.declared_runner_stack()

    def provenance(self, spec: TestSpec | None) -> dict[str, str]:
        """What ran, as the operator knows it: the runner image, what in the test runs code the
        project does not control (the document's packages are what that code reported), and
        whether the row's stack is the image's declared one or its pod's report."""
        if spec is None:
            return {}
        labels = {"image": spec.image or self.settings.runner_image}
        untrusted = spec.untrusted_code(self.settings.runner_image)
        if untrusted:
            labels["untrusted_code"] = ",".join(untrusted)
        # Whose word the row's compiler and library versions are: the settings' declaration for
        # the runner image, or (no declaration: another image, or a runnerImage set without
        # runnerStack) only what its pod reported.
        declared = self.declared_stack(spec)
        labels["stack"] = (
            "declared"
            if declared is not None and declared.model_dump(exclude_none=True)
            else "reported"
        )
        return labels

    def run_py(self, ref: TestRef, status: TestStatus, spec: TestSpec | None) -> str:
        """The run.py that ran, byte for byte: rendered again from the spec at the commit the
        status says it was pinned to, when that gives the sha256 the status recorded; else
        made as the runner made it (the program ConfigMap around the config block the Job
        carries), else rendered again as the spec says (logged)."""
        parallelism = status.parallelism or Parallelism.NONE
        if spec is not None and status.revision:
            spec = spec.model_copy(update={"revision": status.revision})
        if spec is not None and status.cores and status.runScriptSha256:
            # Rendering is deterministic: when this operator renders the same bytes (their hash
            # is in the status), nothing need be read.
            rendered = render_script(spec.run_config(status.cores, parallelism))
            if hashlib.sha256(rendered.encode()).hexdigest() == status.runScriptSha256:
                return rendered
        ran = self._run_py_of_job(ref, status)
        if ran is not None:
            return ran
        if spec is None or not status.cores:
            raise RuntimeError(
                f"the run.py of test {ref.namespace}/{ref.name} cannot be made again: its Job or "
                "its program ConfigMap is gone and the test no longer says how it ran"
            )
        log.warning(
            "the run.py of test %s/%s cannot be made as its runner made it; recording run.py "
            "rendered again",
            ref.namespace,
            ref.name,
        )
        return render_script(spec.run_config(status.cores, parallelism))

    def _run_py_of_job(self, ref: TestRef, status: TestStatus) -> str | None:
        """run.py as the runner of ``status.jobName`` made it (its program ConfigMap's head and
        tail around the config block in its env; an earlier release's Job: its own ConfigMap's
        run.py), when it hashes to what the status recorded."""
        if not status.jobName or not status.runScriptSha256:
            return None
        job = self.kube.read_job(ref.namespace, status.jobName)
        if job is None:
            return None
        pod = job["spec"]["template"]["spec"]
        env = runner_env(job)
        program = next(
            (v["configMap"]["name"] for v in pod.get("volumes") or [] if "configMap" in v), None
        )
        if program is None:
            return None
        configmap = self.kube.read_configmap(ref.namespace, program)
        data = (configmap or {}).get("data") or {}
        head, tail = (data.get(key) for key in PROGRAM_KEYS)
        block = env.get(RUN_CONFIG_ENV)
        if head is not None and tail is not None and block is not None:
            text = head + block + tail
        elif isinstance(data.get("run.py"), str):
            text = data["run.py"]  # a Job of an earlier release: its own ConfigMap held run.py
        else:
            return None
        if hashlib.sha256(text.encode()).hexdigest() != status.runScriptSha256:
            return None
        return text


def sweep_deliveries(stores: Iterable[ResultsStore]) -> int:
    """Remove the delivery slots of runs these stores hold a record of, and empty the slots
    set aside for removal a bounded amount: a slot written after its run was recorded (an
    upload URL used again before it expired) or one a removal missed. A store that cannot be
    swept now is said in the log and swept next time. Returns how many slots went."""
    removed = 0
    for store in stores:
        try:
            removed += DeliveryArea(store.uri).remove_recorded(store.has)
        except (DeliveryError, ValueError) as exc:
            log.warning("could not sweep the delivery slots of %s: %s", store.uri, exc)
    return removed


__all__ = ["Materializer", "Recorder", "sweep_deliveries"]
