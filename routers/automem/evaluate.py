"""The evaluation function the search calls: ``evaluate(arch, tasks) -> list[TaskResult]`` (``arch`` None = the
no-memory agent). Any callable with that signature works (a test's synthetic scorer, a remote runner); the
default, :class:`RolloutEvaluator`, plays real rollouts through ``routers.memagent.rollout.rollout`` on any
``TaskEnvironment``: a fresh memory system per evaluation, tasks played in order, each one's Begin memory
retrieved from what the earlier tasks stored (``warmup`` tasks, except those in the batch, are played and stored
first, unscored; so are demonstrations, ``task.meta["demonstration"]``: the expert plays them, memory plays no part
in them).

Per task it records success, tokens (injected memory tokens + memory-side LLM calls' prompt words) and the
failure info the diagnosis reads: the rollout error / timeout, the memory trace (pool size, retrieved, judge
kept / dropped ids) and, when the environment names them in ``task.meta`` (``evidence``: strings the task
needs; ``stale``: outdated versions), whether the evidence was ever seen in a stored trajectory, is in the
pool, was retrieved, injected, and whether a stale version was injected; with ``follow`` (strings an action names
when the agent goes where the evidence leads) also whether the agent acted on it and how many injected units came
from other tasks than the evidence's sources (``RECORD_VERSION`` 2: what the diagnosis needs to tell noise from a
unit in a form the agent could not act on). ``RECORD_VERSION`` 3 adds the kept units' kinds and whether declarative
units (tip / insight) of the evidence's own sources crowded the unit that holds it out of the injected text: it was
not retrieved while only such units were, or the word limit cut it after them (``crowded_by_declarative``).
``RECORD_VERSION`` 4 adds ``evidence_linked`` where the task names its ``object``: whether a unit holding the evidence
names, in what retrieval indexes (its key), what the goal names of the task (its object, or the holder when the goal
says it). Without that link no retriever can rank the evidence for this goal; ``DIAGNOSED_VERSION`` is what the default
diagnosis reads (3), so the stores written before v4 keep replaying.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Protocol, Sequence

from routers.automem.encoders import task_pattern
from routers.automem.space import Arch
from routers.logs import get_logger

log = get_logger(__name__)
RECORD_VERSION = 4  # 2: failures with ``follow`` evidence record evidence_followed / foreign_injected; 3: kept_kinds,
#                     crowded_by_declarative; 4: evidence_linked
DIAGNOSED_VERSION = 3  # the fields the default diagnosis reads (``diagnose_unlinked`` reads v4's)
DECLARATIVE_KINDS = ("tip", "insight")


@dataclass
class TaskResult:
    task_id: str
    success: bool
    tokens: int = 0
    pattern: str = "task"
    steps: int = 0
    error: str | None = None
    failure: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TaskResult":
        return cls(**d)


class EvaluateFn(Protocol):
    def __call__(self, arch: Arch | None, tasks: Sequence) -> list[TaskResult]: ...


def _has(text: str, needles: Sequence[str]) -> bool:
    low = (text or "").lower()
    return any(n.lower() in low for n in needles)


def _whole(unit_text: str, memory: str) -> bool:
    """Whether all of a unit made it into the injected text (the word limit cuts the last one it reaches)."""
    return " ".join((unit_text or "").split()) in " ".join(memory.split())


def crowded_by_declarative(kept: Sequence, memory: str, evidence: Sequence[str], sources: Sequence[str]) -> bool:
    """Whether declarative units (tip / insight) of the evidence's own sources took the injected text from the unit
    that holds the evidence: none of the ``kept`` units (in injection order) holds it and all are declarative, at
    least one from the sources; or the first that holds it was cut by the word limit after declarative units only.
    A short summary of the right episode outranking its route is an Encode / Store failure, not a retrieval miss."""
    holder = next((n for n, it in enumerate(kept) if _has(it.text, evidence)), None)
    before = kept if holder is None else kept[:holder]
    if not before or any(it.meta.get("kind") not in DECLARATIVE_KINDS for it in before):
        return False
    if holder is None:
        return any(_has(it.meta.get("goal", ""), sources) for it in before)
    return not _whole(kept[holder].text, memory)


def _shown(unit_text: str, memory: str) -> bool:
    """Whether a kept unit made it into the injected text (the word limit may cut the last ones)."""
    head = " ".join((unit_text or "").split()[:12])  # units of one world share their first words
    return bool(head) and head in " ".join(memory.split())


class RolloutEvaluator:
    """Real rollouts on ``env`` with ``agent``; ``system_factory(arch) -> MemoryProvider`` (default:
    ``MemorySystem(arch, encoder, llm, **system_options)``)."""

    def __init__(self, env, agent, *, encoder=None, llm=None, max_steps: int = 30, warmup: Sequence = (),
                 count_tokens: Callable[[str], int] | None = None, system_factory: Callable | None = None,
                 short_term_factory: Callable | None = None, **system_options):
        self.env, self.agent, self.encoder, self.llm = env, agent, encoder, llm
        self.max_steps = max_steps
        self.warmup = list(warmup)
        self.count_tokens = count_tokens
        self.system_factory = system_factory
        self.short_term_factory = short_term_factory
        self.system_options = system_options
        self.calls = 0

    def make_system(self, arch: Arch):
        if self.system_factory is not None:
            return self.system_factory(arch)
        from routers.automem.system import MemorySystem

        return MemorySystem(arch, encoder=self.encoder, llm=self.llm, **self.system_options)

    def __call__(self, arch: Arch | None, tasks: Sequence) -> list[TaskResult]:
        from routers.memagent.rollout import RolloutContext, count_words, is_demonstration, rollout

        self.calls += 1
        count = self.count_tokens or count_words
        system = self.make_system(arch) if arch is not None else None
        providers = {system.name: system} if system is not None else {}
        ctx = RolloutContext(env=self.env, tasks=list(tasks), agent=self.agent, providers=providers,
                             short_term_factory=self.short_term_factory, count_tokens=count, max_steps=self.max_steps)
        seen: list[str] = []  # raw text of the stored trajectories (is the evidence in experience at all?)
        out = []
        batch = {t.task_id for t in tasks}  # a warm-up task the batch plays itself is played once, scored
        warmup = [t for t in self.warmup if t.task_id not in batch] if system is not None else []  # no memory: none
        for scored, task in [(False, t) for t in warmup] + [(not is_demonstration(t), t) for t in tasks]:
            memory, trace = "", {}
            calls0 = system.stats.get("llm_calls", 0) if system is not None else 0
            if system is not None:
                memory = system.retrieve(task.goal).text
                trace = dict(getattr(system, "last_trace", {}) or {})
            r = rollout(ctx, task, system.name if system is not None and memory else None, memory=memory)
            traj = r.trajectory
            if system is not None:
                try:
                    system.store(traj)
                except Exception as err:  # noqa: BLE001 - a failed write is recorded on the task, not raised
                    trace["store_error"] = f"{type(err).__name__}: {err}"
            llm_calls = (system.stats.get("llm_calls", 0) - calls0) if system is not None else 0
            if scored:
                out.append(self._result(task, r, memory, trace, seen, system, llm_calls))
            seen.append(traj.render())
        return out

    def _result(self, task, r, memory, trace, seen, system, llm_calls) -> TaskResult:
        traj = r.trajectory
        meta = task.meta or {}
        timeout = (not traj.success and traj.error is None and len(traj.steps) >= self.max_steps)
        failure: dict[str, Any] = {"timeout": timeout, "memory": trace, "injected_words": len(memory.split())}
        evidence, stale = list(meta.get("evidence") or []), list(meta.get("stale") or [])
        if evidence and system is not None:
            items = system.items_by_id() if hasattr(system, "items_by_id") else {}
            live = [it for it in items.values() if "valid_to" not in it.meta]
            pool_text = "\n".join(it.text for it in live)
            retrieved = "\n".join(items[i].text for i in trace.get("retrieved", []) if i in items)
            kept = [items[i] for i in trace.get("kept", []) if i in items]
            sources = list(meta.get("sources") or [])
            failure.update(evidence_seen=_has("\n".join(seen), evidence), evidence_in_pool=_has(pool_text, evidence),
                           evidence_retrieved=_has(retrieved, evidence), evidence_injected=_has(memory, evidence),
                           stale_injected=bool(stale) and _has(memory, stale),
                           source_units=sum(1 for it in items.values() if _has(it.meta.get("goal", ""), sources)),
                           kept_kinds=[it.meta.get("kind") for it in kept],
                           crowded_by_declarative=crowded_by_declarative(kept, memory, evidence, sources))
            follow = list(meta.get("follow") or [])
            obj = meta.get("object")
            names = [n for n in [obj, *follow] if n and n.lower() in task.goal.lower()] if obj else []
            if names:  # record v4: can the goal's words find a unit that holds the evidence at all?
                failure["evidence_linked"] = any(_has(it.text, evidence) and _has(it.key, names) for it in live)
            if follow:  # record v2: did the agent act where the evidence leads, and what else was injected?
                shown = [it for it in kept if _shown(it.text, memory)]
                failure.update(evidence_followed=any(_has(s.action, follow) for s in traj.steps),
                               foreign_injected=sum(1 for it in shown if not _has(it.meta.get("goal", ""),
                                                                                    meta.get("sources") or [])))
        tokens = r.injected_tokens + llm_calls * 200
        return TaskResult(task_id=task.task_id, success=bool(traj.success), tokens=int(tokens),
                          pattern=task_pattern(task), steps=len(traj.steps), error=traj.error, failure=failure)


@dataclass
class Evaluation:
    """One evaluated architecture on one batch (the trace's record)."""

    arch: str | None
    batch: str
    results: list[TaskResult]
    failed: bool = False
    error: str | None = None
    seconds: float = 0.0

    @property
    def accuracy(self) -> float | None:
        return None if self.failed or not self.results else sum(r.success for r in self.results) / len(self.results)

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.results)

    def by_pattern(self) -> dict[str, float]:
        acc: dict[str, list] = {}
        for r in self.results:
            acc.setdefault(r.pattern, []).append(float(r.success))
        return {p: sum(v) / len(v) for p, v in acc.items()}

    def to_dict(self) -> dict:
        return {"arch": self.arch, "batch": self.batch, "failed": self.failed, "error": self.error,
                "seconds": round(self.seconds, 4), "accuracy": self.accuracy, "tokens": self.tokens,
                "results": [r.to_dict() for r in self.results]}

    @classmethod
    def from_dict(cls, d: dict) -> "Evaluation":
        return cls(arch=d["arch"], batch=d["batch"], results=[TaskResult.from_dict(r) for r in d["results"]],
                   failed=bool(d.get("failed")), error=d.get("error"), seconds=float(d.get("seconds", 0.0)))


def run_evaluation(evaluate: EvaluateFn, arch: Arch | None, tasks: Sequence, batch: str) -> Evaluation:
    """Call ``evaluate``; a crash (or a batch where every rollout errored) is a failed Evaluation, not an
    exception."""
    t = time.perf_counter()
    try:
        results = list(evaluate(arch, list(tasks)))
        for r in results:
            if not isinstance(r, TaskResult):
                raise TypeError(f"evaluate returned {type(r).__name__}, not TaskResult")
    except Exception as err:  # noqa: BLE001 - a crashing candidate is recorded as failed
        log.warning("evaluation of %s on %s failed: %s: %s", arch, batch, type(err).__name__, err)
        return Evaluation(arch.key if arch else None, batch, [], failed=True, error=f"{type(err).__name__}: {err}",
                          seconds=time.perf_counter() - t)
    failed = bool(results) and all(r.error for r in results)
    return Evaluation(arch.key if arch else None, batch, results, failed=failed,
                      error="every rollout errored" if failed else None, seconds=time.perf_counter() - t)
