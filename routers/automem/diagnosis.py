"""Failure-guided module diagnosis (seed 003 §4.3): scope gate -> failure mode -> module, the per-module
histogram and the textual gradient ``(module, evidence ids, confidence, recommended edit)``.

Scope gate (rule): a rollout error (tool / agent / LLM) or a timeout is out of scope; so is a failure whose
evidence never appeared in any stored experience (memory could not have changed it), and one where the guards
(avoid_when, route, world, site, taken) withheld every retrieved unit (``stale_withheld``: the agent ran as without
memory; units withheld as ``unsought``, about other items, leave a failure in scope). Failure
modes, from the memory trace (``TaskResult.failure``):

==========================  ======  ==========================================================================
mode                        module  signal
==========================  ======  ==========================================================================
extraction_gap              E       the evidence was seen but no unit holds it and none was written from its source
low_quality_extraction      E       units were written from the evidence's source, but none kept the evidence
unusable_form               E       injected with no other task's unit beside it, yet the agent never acted on it
declarative_crowding        E       tip / insight units of the evidence's own episodes took the injected text from
                                    the unit holding it (not retrieved, or cut by the word limit after them)
unlinked_evidence           E       in the pool and not retrieved (or retrieved and withheld as ``unsought``), but
                                    no unit holding it names what the goal names (``diagnose_unlinked``): no
                                    retriever can rank it for this goal
retrieval_miss              R       the evidence is in the pool but was not retrieved
judge_rejected              S       retrieved, then dropped by the injection judge (the record's form fails it)
retrieval_noise             R       injected, but buried among other units (or truncated away)
stale_memory                M       an outdated version of the evidence was injected
memory_misled               R       memory was injected and the task failed, where the no-memory agent solved it
==========================  ======  ==========================================================================

``memory_misled`` needs the no-memory baseline's results on the same batch (``diagnose(..., baseline=...)``) and
comes before the scope gate's ``no_experience``: memory that holds nothing of the task's world (an unseen world's
first tasks, a moved object) can still change the outcome, for the worse, and that is memory's failure.

Without evidence annotations the trace alone decides (empty pool: extraction gap; nothing retrieved: miss;
all dropped: judge-rejected; else noise); the persistent-world suite's repeat visits are annotated
(``routers.automem.evidence``). A diagnosis LLM (optional) relabels failures that resist the rules.

When the evidence was injected, the paper's Encode mode "compressed into an unusable form" and the Retrieve mode
"poorly injected" both fit; records that say whether the agent acted where the evidence leads (``follow``) tell them
apart: it did (and still failed): unattributed, not memory's failure; it did not, and units of other tasks were
injected beside the evidence: retrieval noise; it did not with only the evidence's own units in context: the form is
what failed (``unusable_form``), so the edit is a procedural form closer to the agent's actions -- the numbered
``workflow`` first, then the ``shortcut`` macro and the grounded ``trajectory`` -- and fewer declarative units.
``prune_declarative=True`` (off by default) puts the fewer declarative units first when the leader already encodes a
procedural form beside ``tip`` / ``insight``: the agent had that form in context and did not act on it, so another
procedural unit beside the same declarative ones is the weaker edit (the budget's K slots rarely reach the fourth).
``drop_forms_ahead=True`` (off by default) reads the order the forms were kept in: when the agent read a lower-ranked
form (a ``shortcut`` macro, a ``trajectory``) ahead of the ``workflow`` and did not act, the edit removes the forms
ahead first (``forms_ahead``); adding a form the leader already holds is no edit at all. ``drop_noise_ahead=True``
(off by default) reads the same order in ``retrieval_noise`` failures: a trajectory of the evidence's own episodes kept
ahead of the workflow fills the word limit and cuts the unit holding the evidence, so removing the form ahead comes
before a Retrieve edit (the mode's list names every encoder but ``trajectory`` and never reads the order).
``diagnose_unlinked=True`` (off by default; needs record v4's ``evidence_linked``) splits the retrieval misses: when no
unit holding the evidence names the goal's object (a goal "find the golden teapot" with no container named, and units
that keep the route to the coffer but not that the coffer held a golden teapot), ranking is not what failed. The edit
is a form that keeps what the episode observed (the grounded ``trajectory``) or a store that indexes unit text.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Mapping, Sequence

from routers.automem.evaluate import TaskResult
from routers.automem.guards import WITHHELD
from routers.automem.space import Arch, MODULE_LETTER

FAILURE_MODULE = {"extraction_gap": "encode", "low_quality_extraction": "encode", "unusable_form": "encode",
                  "declarative_crowding": "encode", "unlinked_evidence": "encode",
                  "retrieval_miss": "retrieve",
                  "judge_rejected": "store", "retrieval_noise": "retrieve", "stale_memory": "manage",
                  "memory_misled": "retrieve"}
OUT_OF_SCOPE = ("tool_error", "timeout", "no_experience", "stale_withheld", "unattributed")
PROCEDURAL = ("workflow", "shortcut", "trajectory")  # unit forms that name the agent's actions
DECLARATIVE = ("tip", "insight")
_TIMEOUT = re.compile(r"timeout|timed out|budget", re.IGNORECASE)

# the edits a failure mode recommends, in order of preference (single-coordinate, filtered for validity later)
EDITS = {
    "extraction_gap": [("encode", "+trajectory"), ("encode", "+insight"), ("encode", "+tip"), ("encode", "+workflow")],
    "low_quality_extraction": [("encode", "+trajectory"), ("encode", "-workflow"), ("encode", "-shortcut"),
                               ("encode", "-tip")],
    "unusable_form": [("encode", "+workflow"), ("encode", "+shortcut"), ("encode", "+trajectory"),
                      ("encode", "-insight"), ("encode", "-tip")],
    # the short summaries of the right episodes outrank their route: fewer of them, or a store key that ranks an
    # episode's units alike (its goal) instead of by their own text
    "declarative_crowding": [("encode", "-tip"), ("encode", "-insight"), ("store", "json"), ("store", "llm_graph")],
    # a unit that keeps the observed facts (what the holder contained), keyed by its text
    "unlinked_evidence": [("encode", "+trajectory"), ("store", "hybrid"), ("store", "vector")],
    "retrieval_miss": [("retrieve", "hybrid"), ("retrieve", "cbr_rerank"), ("store", "hybrid"),
                       ("retrieve", "graph"), ("retrieve", "hyde")],
    "judge_rejected": [("store", "hybrid"), ("store", "json"), ("store", "llm_graph")],
    "retrieval_noise": [("retrieve", "mmr"), ("retrieve", "cbr_rerank"), ("encode", "-tip"), ("encode", "-workflow"),
                        ("encode", "-shortcut"), ("encode", "-insight")],
    "stale_memory": [("manage", "json_full"), ("manage", "graph_consolidate"), ("manage", "lightweight"),
                     ("store", "llm_graph"), ("store", "json")],
    # inject less, or less that the agent copies: a reranking judge, then fewer route-copying units
    "memory_misled": [("retrieve", "cbr_rerank"), ("encode", "-trajectory"), ("encode", "-shortcut"),
                      ("retrieve", "mmr"), ("encode", "-workflow")],
}

# the forms unusable_form ranks, most actionable first: the additions in order, then the removals reversed
FORM_ORDER = tuple([o[1:] for _, o in EDITS["unusable_form"] if o[0] == "+"]
                   + [o[1:] for _, o in reversed(EDITS["unusable_form"]) if o[0] == "-"])


def scope(result: TaskResult) -> str | None:
    """None when the failure is memory-attributable, else why it is out of scope."""
    f = result.failure or {}
    if result.error:
        return "timeout" if _TIMEOUT.search(result.error) else "tool_error"
    if f.get("timeout"):
        return "timeout"
    if f.get("evidence_seen") is False:
        return "no_experience"
    mem = f.get("memory") or {}
    # ``unsought`` is not a guard's verdict that memory is stale: the retrieved units were about other items, a
    # ranking failure the diagnosis must see when the goal's own evidence was in the pool
    withheld = any(mem.get(name) for name in WITHHELD if name != "unsought")
    if withheld and not mem.get("kept") and not mem.get("dropped"):
        return "stale_withheld"  # the guards withheld every retrieved unit: it ran as without memory
    if mem.get("guarded_out") and not mem.get("retrieved"):
        return "stale_withheld"  # guards_first: the guards withheld every unit of the pool before ranking
    return None


def classify(result: TaskResult, unlinked: bool = False) -> str:
    """The dominant failure mode of an in-scope failure (``unattributed`` when no rule fires); ``unlinked``: a miss
    whose record says no unit holding the evidence names the goal's object is ``unlinked_evidence``."""
    f = result.failure or {}
    mem = f.get("memory") or {}
    if "evidence_in_pool" in f:
        if not f["evidence_in_pool"]:
            return "low_quality_extraction" if f.get("source_units") else "extraction_gap"
        if f.get("crowded_by_declarative"):  # record v3: before the miss / noise / followed rules it refines
            return "declarative_crowding"
        if not f.get("evidence_retrieved"):
            return "unlinked_evidence" if unlinked and f.get("evidence_linked") is False else "retrieval_miss"
        if not f.get("evidence_injected"):
            if unlinked and f.get("evidence_linked") is False and mem.get("unsought"):
                return "unlinked_evidence"  # retrieved, then withheld: it names nothing the goal seeks
            kept = set(mem.get("kept", []))
            return "judge_rejected" if mem.get("dropped") and len(kept) < len(mem.get("retrieved", [])) \
                else "retrieval_noise"
        if f.get("stale_injected"):
            return "stale_memory"
        if "evidence_followed" in f:
            if f["evidence_followed"]:
                return "unattributed"
            return "retrieval_noise" if f.get("foreign_injected") else "unusable_form"
        return "retrieval_noise" if len(mem.get("kept", [])) > 1 else "unattributed"
    if not mem.get("pool"):
        return "extraction_gap"
    if not mem.get("retrieved"):
        return "retrieval_miss"
    if not mem.get("kept"):
        return "judge_rejected"
    return "retrieval_noise"


def misled(result: TaskResult, baseline: Mapping[str, bool] | None) -> bool:
    """Injected memory, a failure, and the no-memory agent solved the task (``baseline``: task id -> success)."""
    f = result.failure or {}
    return bool(baseline and baseline.get(result.task_id) and not result.success and not result.error
                and not f.get("timeout") and f.get("injected_words"))


def recommended_edits(mode: str, arch: Arch | None = None, prune_declarative: bool = False) -> list[list[str]]:
    """A failure mode's edits in order of preference; with ``prune_declarative``, an ``unusable_form`` of a leader
    that holds a procedural and a declarative encoder tries the declarative removals first (order kept within)."""
    edits = [list(e) for e in EDITS[mode]]
    if prune_declarative and mode == "unusable_form" and arch is not None \
            and set(arch.encode) & set(PROCEDURAL) and set(arch.encode) & set(DECLARATIVE):
        edits.sort(key=lambda e: not (e[1][:1] == "-" and e[1][1:] in DECLARATIVE))
    return edits


def forms_ahead(results: Sequence[TaskResult]) -> Counter:
    """Forms kept ahead of a form ``FORM_ORDER`` ranks higher, counted over failures of one mode (``unusable_form``,
    ``retrieval_noise``): the agent read a shortcut macro or a trajectory first and the workflow after it (or not at
    all, under the word limit)."""
    ahead: Counter = Counter()
    for r in results:
        kinds = [k for k in (r.failure or {}).get("kept_kinds") or [] if k in FORM_ORDER]
        if kinds:
            best = min(kinds, key=FORM_ORDER.index)
            ahead.update(set(kinds[:kinds.index(best)]))
    return ahead


def diagnose(failures: Sequence[tuple[str, TaskResult]], arch: Arch | None = None, llm=None,
             max_llm_traces: int = 4, baseline: Mapping[str, bool] | None = None,
             prune_declarative: bool = False, drop_forms_ahead: bool = False, drop_noise_ahead: bool = False,
             diagnose_unlinked: bool = False) -> dict:
    """The round's textual gradient from ``(arch_key, result)`` pairs of failed tasks (``baseline``: the no-memory
    agent's success per task id, for ``memory_misled``; ``prune_declarative``: ``recommended_edits``;
    ``drop_forms_ahead``: an ``unusable_form`` gradient first removes the forms ``forms_ahead`` counts, most often
    ahead first; ``drop_noise_ahead``: a ``retrieval_noise`` gradient likewise; ``diagnose_unlinked``: ``classify``'s
    ``unlinked``). Returns ``{module, letter,
    failure_mode, evidence_ids, confidence, recommended_edit, histogram, modes, out_of_scope, n_failures,
    cross_source_agreement}`` (module None when nothing is in scope)."""
    oos: Counter = Counter()
    by_mode: dict[str, list[TaskResult]] = {}  # in-scope failures by mode
    for arch_key, r in failures:
        if r.success:
            continue
        hurt = misled(r, baseline)
        why = None if hurt else scope(r)
        if why is None:
            mode = "memory_misled" if hurt else classify(r, diagnose_unlinked)
            if mode == "unattributed":
                why = mode
            else:
                by_mode.setdefault(mode, []).append(r)
                continue
        oos[why] += 1
    modes = Counter({mode: len(rs) for mode, rs in by_mode.items()})
    hist = Counter()
    for mode, n in modes.items():
        hist[MODULE_LETTER[FAILURE_MODULE[mode]]] += n
    total = sum(modes.values())
    grad = {"module": None, "letter": None, "failure_mode": None, "evidence_ids": [], "confidence": "low",
            "recommended_edit": None, "histogram": {k: hist.get(k, 0) for k in "ESRM"}, "modes": dict(modes),
            "out_of_scope": dict(oos), "n_failures": total + sum(oos.values()),
            "out_of_scope_for_memory": total == 0, "cross_source_agreement": None}
    if not total:
        return grad
    # the histogram names the module (seed 003 §4.3), its most frequent mode the edit: two modes splitting one
    # module's failures must not lose to a single larger mode of another module
    order = list(FAILURE_MODULE)
    module = FAILURE_MODULE[max(modes, key=lambda m: (hist[MODULE_LETTER[FAILURE_MODULE[m]]], -order.index(m)))]
    mode = max((m for m in modes if FAILURE_MODULE[m] == module), key=lambda m: (modes[m], -order.index(m)))
    share = hist[MODULE_LETTER[module]] / total
    edits = recommended_edits(mode, arch, prune_declarative)
    if drop_forms_ahead and mode == "unusable_form" or drop_noise_ahead and mode == "retrieval_noise":
        ahead = [["encode", f"-{k}"] for k, _ in forms_ahead(by_mode[mode]).most_common()]
        edits = ahead + [e for e in edits if e not in ahead]
    grad.update(module=module, letter=MODULE_LETTER[module], failure_mode=mode,
                evidence_ids=sorted({r.task_id for r in by_mode[mode]})[:5],
                confidence="high" if share >= 0.6 and total >= 3 else "medium" if share >= 0.4 else "low",
                recommended_edit={"module": module, "edits": edits, "from": _current(arch, module)})
    if llm is not None:
        grad = _llm_review(grad, failures, llm, max_llm_traces)
    return grad


def _current(arch: Arch | None, module: str):
    if arch is None:
        return None
    v = getattr(arch, module)
    return list(v) if isinstance(v, tuple) else v


def _llm_review(grad: dict, failures, llm, max_traces: int) -> dict:
    """The LLM diagnostician reads the histogram and a few failures and names the primary module; on
    disagreement its module is adopted and the disagreement recorded."""
    sample = [r for _, r in failures if not r.success][:max_traces]
    listing = "\n".join(f"- {r.task_id}: error={r.error} failure={json.dumps(r.failure)[:300]}" for r in sample)
    prompt = (f"Per-module failure histogram (E=encode, S=store, R=retrieve, M=manage): {grad['histogram']}\n"
              f"Failures:\n{listing}\nWhich module is the primary bottleneck? Answer with one letter E, S, R or M.")
    try:
        out = llm.generate([[{"role": "system", "content": "You diagnose agent-memory failures."},
                             {"role": "user", "content": prompt}]], 8)[0] or ""
    except Exception as err:  # noqa: BLE001 - the rule diagnosis stands
        grad["llm_error"] = f"{type(err).__name__}: {err}"
        return grad
    m = re.search(r"\b([ESRM])\b", out.upper())
    if not m:
        return grad
    letter = m.group(1)
    grad["cross_source_agreement"] = letter == grad["letter"]
    if letter != grad["letter"]:
        from routers.automem.space import LETTER_MODULE

        module = LETTER_MODULE[letter]
        mode = next(k for k, v in FAILURE_MODULE.items() if v == module)
        grad.update(module=module, letter=letter, llm_module=module, confidence="low",
                    recommended_edit={"module": module, "edits": [list(e) for e in EDITS[mode]],
                                      "from": grad["recommended_edit"]["from"]})
    return grad
