"""The search trace and its evaluation cache: every evaluation is appended to the trace JSON (written
atomically) as soon as it finishes, so a killed search rerun with the same settings replays the recorded
evaluations and calls ``evaluate`` only for what is missing (the search itself is deterministic given its
seed and the evaluation results). A trace written with other settings is refused unless ``resume='never'``.

:class:`EvaluationStore` shares evaluations between traces: a rollout evaluation depends on the architecture, the
task batch and the rollout options, not on which method or seed asked for it, so AutoMem, random search and every
seed of one search directory replay one another's identical evaluations (the no-memory baselines, the seeded
random round 1, architectures both methods reach) instead of playing them again. Each trace still records every
evaluation it used, and the budget still counts them all. A record made by an older evaluator (``RECORD_VERSION``:
fewer failure fields) still replays for random search, which reads only accuracy; AutoMem plays it again when its
diagnosis reads fields the record lacks (``DIAGNOSED_VERSION``; record v4 with ``diagnose_unlinked``)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Sequence

from routers.automem.encoders import versioned_key
from routers.automem.evaluate import DIAGNOSED_VERSION, RECORD_VERSION, EvaluateFn, Evaluation, run_evaluation
from routers.automem.space import Arch
from routers.io import ResumableJsonlWriter, read_jsonl
from routers.logs import get_logger
from routers.machine import played_on

log = get_logger(__name__)
TRACE_FORMAT = "memroute.automem.trace"
TRACE_SCHEMA_VERSION = 1


class TraceMismatch(ValueError):
    pass


def _key(arch: Arch | None, batch: str) -> str:
    return f"{batch}::{versioned_key(arch) if arch is not None else 'none'}"


def _versioned(key: str, version: int) -> str:
    """A store id: records of the first version keep their bare key, so stores written before versions replay."""
    return key if version <= 1 else f"{key}:r{version}"


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode("utf-8")).hexdigest()


class EvaluationStore:
    """Successful evaluations keyed by (evaluation settings, architecture, task ids), in an append-only JSONL file
    (one fsynced record per evaluation; a line cut by a kill is dropped on reopen, a malformed one names file and
    line). Failed evaluations are not shared: a crash may be transient, so another trace plays the candidate again.
    ``settings``: everything the rollouts depend on (environment, agent, memory options)."""

    def __init__(self, path, settings: dict):
        self.path = Path(path)
        self.settings = _digest(settings)
        self.writer = ResumableJsonlWriter(self.path, key="id", on_duplicate="skip")  # repairs a cut tail first
        lines = list(read_jsonl(self.path, required=("id", "evaluation")))
        self.records = {r["id"]: r["evaluation"] for r in lines}
        self.origin = {r["id"]: r.get("played_on") for r in lines}  # None: a record from before provenance

    def key(self, arch: Arch | None, tasks: Sequence) -> str:
        return _digest([self.settings, versioned_key(arch) if arch is not None else None, [t.task_id for t in tasks]])

    def get(self, arch: Arch | None, tasks: Sequence, min_version: int = 1) -> Evaluation | None:
        """The newest stored record at or above ``min_version`` (``RECORD_VERSION``: what the evaluator records per
        failure); a caller that reads only accuracy takes any, the diagnosis needs the current fields."""
        found = self._newest(arch, tasks, min_version)
        return None if found is None else Evaluation.from_dict(self.records[found])

    def played_on(self, arch: Arch | None, tasks: Sequence, min_version: int = 1) -> str | None:
        """Where the record :meth:`get` returns was played (``routers.machine.played_on``): greedy rollouts repeat
        exactly on one machine, not across CPUs, so a replayed number says whose it is."""
        found = self._newest(arch, tasks, min_version)
        return None if found is None else self.origin.get(found)

    def _newest(self, arch, tasks, min_version: int) -> str | None:
        key = self.key(arch, tasks)
        return next((k for v in range(RECORD_VERSION, min_version - 1, -1)
                     if (k := _versioned(key, v)) in self.records), None)

    def put(self, arch: Arch | None, tasks: Sequence, ev: Evaluation) -> None:
        if ev.failed:
            return
        key = _versioned(self.key(arch, tasks), RECORD_VERSION)
        self.records[key], self.origin[key] = ev.to_dict(), played_on()
        self.writer.write({"id": key, "arch": arch.key if arch is not None else None, "batch": ev.batch,
                           "played_on": self.origin[key], "evaluation": self.records[key]})


class Runtime:
    """Evaluations through a cache backed by the trace file (then ``store``, shared with other traces);
    ``replayed`` counts this process's replays from the trace. What the trace records are the totals over every
    process that built it (``total_calls``, ``total_shared``, ``wall_s``): each record says whether it was played or
    taken from the store, so a resume or a replay neither resets them to ~0 nor loses the evaluations a killed
    process played after its last round was saved."""

    def __init__(self, evaluate: EvaluateFn, trace_path=None, fingerprint: dict | None = None, method: str = "automem",
                 resume: str = "auto", store: EvaluationStore | None = None, diagnosed_batches: Sequence[str] = (),
                 diagnosed_version: int = DIAGNOSED_VERSION):
        self.evaluate = evaluate
        self.store = store
        self.diagnosed_batches = tuple(diagnosed_batches)  # their memory evaluations need the diagnosis's fields
        self.diagnosed_version = diagnosed_version  # the record version carrying them
        self.path = Path(trace_path) if trace_path else None
        self.fingerprint = fingerprint or {}
        self.method = method
        self.log: list[dict] = []
        self.cache: dict[str, dict] = {}
        self.replayed = 0
        self.state: dict = {}
        self.prior_wall_s = 0.0  # wall time the trace recorded before this process resumed it
        self.prior_calls = self.prior_shared = 0  # a pre-"source" trace's counts for its records that lack one
        self.t0 = time.perf_counter()
        if self.path is not None and self.path.exists():
            if resume == "never":
                self.path.unlink()
            else:
                self._load()

    def _load(self) -> None:
        try:
            old = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise TraceMismatch(f"{self.path}: unreadable trace ({err}); remove it or pass resume=never") from None
        if old.get("format") != TRACE_FORMAT or old.get("method") != self.method:
            raise TraceMismatch(f"{self.path}: not a {self.method} trace")
        if old.get("fingerprint") != self.fingerprint:
            diff = sorted(k for k in set(old.get("fingerprint", {})) | set(self.fingerprint)
                          if old.get("fingerprint", {}).get(k) != self.fingerprint.get(k))
            raise TraceMismatch(f"{self.path}: written with other settings ({diff}); use resume=never to start over")
        for rec in old.get("log", []):
            self.cache[rec["key"]] = rec
        self.prior_wall_s = float(old.get("wall_s") or 0.0)
        if any("source" not in rec for rec in self.cache.values()):
            self.prior_calls = max(0, int(old.get("evaluate_calls") or 0) - self._sourced("played"))
            self.prior_shared = max(0, int(old.get("shared") or 0) - self._sourced("store"))
        log.info("%s: resuming, %d evaluations recorded", self.path, len(self.cache))

    def run(self, arch: Arch | None, tasks: Sequence, batch: str) -> Evaluation:
        key = _key(arch, batch)
        rec = self.cache.get(key)
        fresh = rec is None
        if fresh:
            need = self.diagnosed_version if arch is not None and batch in self.diagnosed_batches else 1
            ev = self.store.get(arch, tasks, need) if self.store is not None else None
            source = "played" if ev is None else "store"
            if ev is None:
                ev = run_evaluation(self.evaluate, arch, tasks, batch)
                if self.store is not None:
                    self.store.put(arch, tasks, ev)
            else:
                ev.batch = batch
            rec = {"key": key, "source": source, "evaluation": ev.to_dict()}
            self.cache[key] = rec
        else:
            self.replayed += 1
            ev = Evaluation.from_dict(rec["evaluation"])
        if all(r["key"] != key for r in self.log):
            self.log.append(rec)
        if fresh:
            self.save()
        return ev

    def _sourced(self, source: str) -> int:
        return sum(rec.get("source") == source for rec in self.cache.values())

    @property
    def total_calls(self) -> int:
        """Evaluations played for this trace, over every process that built it."""
        return self.prior_calls + self._sourced("played")

    @property
    def total_shared(self) -> int:
        """Evaluations this trace took from the store, over every process that built it."""
        return self.prior_shared + self._sourced("store")

    def wall_s(self) -> float:
        return round(self.prior_wall_s + time.perf_counter() - self.t0, 3)

    def save(self, extra: dict | None = None) -> None:
        """Write the trace; ``extra`` is the search's state. A save after an evaluation refreshes the state's counts
        and wall time, so a process killed before its next state save resumes from the true totals."""
        if extra is not None:
            self.state = extra
        elif self.state:
            self.state = {**self.state, "evaluate_calls": self.total_calls, "shared": self.total_shared,
                          "wall_s": self.wall_s()}
        if self.path is None:
            return
        from routers.io import atomic_write_json

        self.path.parent.mkdir(parents=True, exist_ok=True)
        pending = [r for k, r in self.cache.items() if all(x["key"] != k for x in self.log)]
        atomic_write_json(self.path, {"format": TRACE_FORMAT, "schema_version": TRACE_SCHEMA_VERSION,
                                      "method": self.method, "fingerprint": self.fingerprint, **self.state,
                                      "log": self.log + pending})


def best_so_far(points: Sequence[dict]) -> list[float | None]:
    """Best search accuracy after each candidate evaluation (failed ones carry the previous best)."""
    out, best = [], None
    for p in points:
        if p.get("accuracy") is not None and (best is None or p["accuracy"] > best):
            best = p["accuracy"]
        out.append(best)
    return out


def first_reach(curve: Sequence[float | None], target: float) -> int | None:
    """1-based number of evaluations after which ``curve`` first reaches ``target`` (None: never)."""
    return next((i + 1 for i, v in enumerate(curve) if v is not None and v >= target - 1e-12), None)
