"""The AutoMem search loop (seed 003 Algorithm 1) and its random-search baseline at the same budget.

    from routers.automem.search import run_automem, run_random
    trace = run_automem(evaluate, search_tasks, val_tasks, budget=12, k=3, seed=0, trace_path="trace.json")
    trace["best"]        # the validated leader: arch key, search / validation accuracy, gain, cost
    rand = run_random(evaluate, search_tasks, val_tasks, budget=12, seed=0, trace_path="random.json")

``evaluate(arch, tasks) -> list[TaskResult]`` (``routers.automem.evaluate``). The budget counts candidate
evaluations on the search batch (the no-memory baseline and leader validations are reported separately).
Per round: K proposals (an invalid one is rejected, counted and resampled; duplicates are resampled silently; slots the
proposer leaves empty, its leader's neighbourhood exhausted, get random restarts so the budget is always spent),
each evaluated on the search batch (a crash is a failed candidate, kept in the trace); the observation graph
takes each candidate's per-pattern gain; differential validation settles the ledger entries the candidates
tested; the Pareto front (accuracy, gain, cost) names the leader, validated every ``val_every`` rounds; the
round's failures are diagnosed into the next textual gradient. ``stagnation=N`` (0: off, the default): once the best
search accuracy has not improved for N rounds, one slot per round goes to a random restart (iterated local search:
one-module edits of a plateau's leader tend to tie it). ``structure_after=N`` (0: off, the default): once the leader
has kept one Store | Retrieve | Manage for N rounds, one slot per round goes to the proposer's exploration edit of
those three modules (``origin: structure``): the gradient's edits can fill every slot with Encode edits of the
round-1 winner's structure. ``prune_declarative`` (off by default): the diagnosis's ``unusable_form`` edits remove a
declarative encoder first when the leader also encodes a procedural one (``routers.automem.diagnosis``).
``swap_inert`` (off by default): a candidate that repeats its parent's outcome and step count on every search task is
inert -- its edit never changed what the agent did (an added form's units cut by the word limit behind the others) --
so its ledger entry stays untested, and an inert Encode addition of the leader is retried in place of the forms the
diagnosis ranks below it, as a swap and a focus (the proposer's ``swaps``): one-module edits of a leader that holds two
forms cannot replace one by the other. ``diagnose_scope="leader"`` (default ``round``, the paper's: every failure of
the round) diagnoses only the leader's failures: the gradient's edits are applied to the leader, and a losing
candidate's failures come from its own choices. ``drop_forms_ahead`` (off by default): an ``unusable_form`` gradient
first removes the forms the agent read ahead of a higher-ranked one (``routers.automem.diagnosis.forms_ahead``);
``drop_noise_ahead`` (off by default): a ``retrieval_noise`` gradient too (a trajectory ahead of the workflow).
``diagnose_unlinked`` (off by default): a retrieval miss no unit could be found for (``unlinked_evidence``) asks Encode
for the observed facts; its search evaluations need record v4, so older stored ones are played again.
``validate_saturated`` (off by default): a batch a candidate solves entirely cannot rank it against another that does,
nor name what to fix, so every candidate that solves the whole search batch is validated at once; among those the
leader is the best on validation, a child's ledger entry is settled by validation against its parent's, and the
diagnosis reads the leader's validation failures (extra validation evaluations, reported; off the search budget).
At the end both methods validate their ``final_validate`` best candidates by search accuracy (then cost) and report the
best on validation (``final_select``: or by pooled or search accuracy): a search-batch leader that does not carry over
loses to a runner-up that does.
Everything is in the trace JSON, written after every evaluation; rerunning resumes from it without re-evaluating
(``store``: evaluations shared with other traces, ``routers.automem.trace.EvaluationStore``).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Sequence

from routers.automem.diagnosis import diagnose
from routers.automem.evaluate import DIAGNOSED_VERSION, RECORD_VERSION, EvaluateFn, Evaluation
from routers.automem.ledger import Ledger, ObservationGraph, leader, pareto_front
from routers.automem.proposer import Proposal, RuleProposer, SearchContext
from routers.automem.space import Arch, MODULES, feasible_space, valid, violations
from routers.automem.trace import Runtime, best_so_far
from routers.logs import get_logger

log = get_logger(__name__)
STRUCTURE = ("store", "retrieve", "manage")  # the modules a held structure's reserved slot edits
DIAGNOSE_SCOPES = ("round", "leader")  # whose failures the diagnosis reads: the round's candidates', the leader's


def _point(ev: Evaluation, base: Evaluation, index: int, round_: int, slot: int, prop: Proposal | None) -> dict:
    acc = ev.accuracy
    n = max(1, len(ev.results))
    p = {"index": index, "round": round_, "slot": slot, "arch": ev.arch, "accuracy": acc,
         "gain": None if acc is None else acc - (base.accuracy or 0.0), "cost": ev.tokens / n, "tokens": ev.tokens,
         "failed": ev.failed, "error": ev.error, "seconds": round(ev.seconds, 4)}
    if prop is not None:
        p.update({k: v for k, v in prop.to_dict().items() if k != "arch"})
    return p


def inert(ev: Evaluation, parent: Evaluation | None) -> bool:
    """Did the candidate repeat its parent's outcome and step count on every task (the agent acted alike)?"""
    if parent is None or ev.failed or parent.failed or not ev.results:
        return False
    return {r.task_id: (r.success, r.steps) for r in ev.results} == \
        {r.task_id: (r.success, r.steps) for r in parent.results}


def _kinds(ev: Evaluation) -> Counter:
    """How often each unit form was kept for injection over the batch (record v3's ``kept_kinds``)."""
    return Counter(kind for r in ev.results for kind in (r.failure or {}).get("kept_kinds") or [])


def _gains(ev: Evaluation, base: Evaluation) -> tuple[dict, dict]:
    accs, b = ev.by_pattern(), base.by_pattern()
    return {p: a - b.get(p, 0.0) for p, a in accs.items()}, accs


def _validate(rt: Runtime, arch_key: str, val_tasks, base_val: Evaluation, round_: int, point: dict,
              seen: dict | None = None) -> dict:
    """The validation record of ``arch_key`` (``seen``: where to keep its evaluation for the diagnosis)."""
    ev = rt.run(Arch.parse(arch_key), val_tasks, "validation")
    if seen is not None:
        seen[arch_key] = ev
    acc = ev.accuracy
    return {"round": round_, "arch": arch_key, "accuracy": acc, "search_accuracy": point["accuracy"],
            "gain": None if acc is None else acc - (base_val.accuracy or 0.0), "tokens": ev.tokens,
            "failed": ev.failed}


def _solved_all(ev: Evaluation | None) -> bool:
    """Did the candidate solve every task of its batch (nothing left for the batch to rank or diagnose)?"""
    return ev is not None and not ev.failed and bool(ev.results) and all(r.success for r in ev.results)


def _val_accuracy(validations: list[dict]) -> dict:
    """Validation accuracy by architecture key (those that were scored)."""
    return {v["arch"]: v["accuracy"] for v in validations if v["accuracy"] is not None}


def _saturated_leader(ok: list[dict], evs: dict, validations: list[dict]) -> dict | None:
    """Among the candidates that solved the whole search batch, the best on validation (then ``leader``'s order)."""
    val = _val_accuracy(validations)
    tied = [p for p in ok if _solved_all(evs.get(p["arch"])) and p["arch"] in val]
    return max(tied, key=lambda p: (val[p["arch"]], p["gain"], -p["cost"], -p["index"]), default=None)


def _validate_top(rt: Runtime, points: list[dict], m: int, validations: list[dict], val_tasks, base_val: Evaluation,
                  round_: int) -> None:
    """Validate the ``m`` best candidates by search accuracy (then lower cost, then earlier) not validated yet."""
    done = {v["arch"] for v in validations}
    ranked = sorted((p for p in points if not p["failed"]), key=lambda p: (-p["accuracy"], p["cost"], p["index"]))
    for p in ranked[:m]:
        if p["arch"] not in done:
            validations.append(_validate(rt, p["arch"], val_tasks, base_val, round_, p))
            done.add(p["arch"])


FINAL_SELECT = ("validation", "pooled", "search")


def check_final_select(select: str) -> None:
    if select not in FINAL_SELECT:
        raise ValueError(f"final_select must be one of {FINAL_SELECT}, got {select!r}")


def final_pick(validations: list[dict], points: list[dict], select: str = "validation") -> dict | None:
    """The reported architecture among the validated ones. ``validation``: best validation accuracy (then search);
    ``pooled``: best mean of search and validation accuracy (two estimates, equal weight; then validation);
    ``search``: best search accuracy (then validation). Ties go to the earlier validation. On the persistent-world
    suite the choice alone moved a method's held-out mean by 5-8 points (configs/automem/README.md)."""
    check_final_select(select)
    ok = [v for v in validations if v["accuracy"] is not None]
    if not ok:
        return None

    def key(v):
        s_acc = v["search_accuracy"] or 0.0
        first = {"validation": v["accuracy"], "pooled": (v["accuracy"] + s_acc) / 2, "search": s_acc}[select]
        second = s_acc if select == "validation" else v["accuracy"]
        return first, second, -validations.index(v)

    v = max(ok, key=key)
    p = next(p for p in points if p["arch"] == v["arch"])
    return {"arch": v["arch"], "search_accuracy": p["accuracy"], "validation_accuracy": v["accuracy"],
            "search_gain": p["gain"], "validation_gain": v["gain"], "cost": p["cost"], "found_at": p["index"] + 1}


def _summary(rt: Runtime, points, base_s, base_v, extra: dict) -> dict:
    curve = best_so_far(points)
    return {"baseline": {"search_accuracy": base_s.accuracy, "validation_accuracy": base_v.accuracy,
                         "search_tokens": base_s.tokens, "validation_tokens": base_v.tokens},
            "evaluations": points, "best_so_far": curve, "evaluate_calls": rt.total_calls,
            "replayed": rt.replayed, "shared": rt.total_shared, "candidate_tokens": sum(p["tokens"] for p in points),
            "candidate_s": round(sum(p["seconds"] for p in points), 3),
            "wall_s": rt.wall_s(),
            **extra}


def _restarts(ctx: SearchContext, n: int, rng: random.Random, origin: str = "restart") -> list[Proposal]:
    """Random unevaluated architectures for the slots the proposer left empty (every edit of the leader evaluated
    or ledger-blocked): the search jumps elsewhere instead of ending short of its budget, so the comparison with
    random search stays at equal evaluations. ``origin="stagnation"``: a slot given up because the best search
    accuracy has not improved for ``stagnation`` rounds (one-module edits of a plateau's leader tie it)."""
    out = []
    for _ in range(max(n, 0)):
        pool = [a for a in feasible_space() if a.key not in ctx.evaluated]
        if not pool:
            break
        prop = Proposal(rng.choice(pool), origin)
        log.info("automem round %d: %s; restart at %s", ctx.round, "no better search accuracy for a while"
                 if origin == "stagnation" else "the proposer's neighbourhood is exhausted", prop.arch.key)
        ctx.evaluated.add(prop.arch.key)
        out.append(prop)
    return out


def _structure(arch_key: str) -> str:
    """``tip+insight|graph|cbr_rerank|graph_consolidate`` -> ``graph|cbr_rerank|graph_consolidate``."""
    return arch_key.split("|", 1)[1]


def _structure_edit(proposer, ctx: SearchContext) -> Proposal | None:
    """The slot a held structure gives up: the leader's most promising Store / Retrieve / Manage edit, reserved
    before the proposer fills the round (so its edits cannot take the same architecture)."""
    explore = getattr(proposer, "explore", None) or RuleProposer().explore
    prop = explore(ctx, set(ctx.evaluated), modules=STRUCTURE, origin="structure")
    if prop is not None:
        log.info("automem round %d: the leader kept %s; structure edit %s -> %s", ctx.round,
                 _structure(ctx.leader.key), prop.edit, prop.arch.key)
        ctx.evaluated.add(prop.arch.key)
    return prop


def run_automem(evaluate: EvaluateFn, search_tasks: Sequence, val_tasks: Sequence, *, budget: int = 15, k: int = 3,
                val_every: int = 2, seed: int = 0, trace_path=None, fingerprint: dict | None = None, proposer=None,
                diagnosis_llm=None, init: str = "random", resume: str = "auto", max_resample: int = 50,
                final_validate: int = 3, store=None, final_select: str = "validation", stagnation: int = 0,
                structure_after: int = 0, prune_declarative: bool = False, swap_inert: bool = False,
                diagnose_scope: str = "round", drop_forms_ahead: bool = False,
                validate_saturated: bool = False, drop_noise_ahead: bool = False,
                diagnose_unlinked: bool = False) -> dict:
    if budget < 1 or k < 1 or val_every < 1 or final_validate < 1:
        raise ValueError("budget, k, val_every and final_validate must be >= 1")
    for name, value in (("stagnation", stagnation), ("structure_after", structure_after)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0 (0: off), got {value}")
    check_final_select(final_select)  # an unknown rule fails before any evaluation
    if diagnose_scope not in DIAGNOSE_SCOPES:
        raise ValueError(f"diagnose_scope must be one of {DIAGNOSE_SCOPES}, got {diagnose_scope!r}")
    fp = {"method": "automem", "budget": budget, "k": k, "val_every": val_every, "seed": seed, "init": init,
          "search_tasks": [t.task_id for t in search_tasks], "val_tasks": [t.task_id for t in val_tasks],
          "proposer": getattr(proposer, "name", "rule"), "final_validate": final_validate,
          **({"stagnation": stagnation} if stagnation else {}),
          **({"structure_after": structure_after} if structure_after else {}),
          **({"prune_declarative": True} if prune_declarative else {}),
          **({"swap_inert": True} if swap_inert else {}),
          **({"diagnose_scope": diagnose_scope} if diagnose_scope != "round" else {}),
          **({"drop_forms_ahead": True} if drop_forms_ahead else {}),
          **({"validate_saturated": True} if validate_saturated else {}),
          **({"drop_noise_ahead": True} if drop_noise_ahead else {}),
          **({"diagnose_unlinked": True} if diagnose_unlinked else {}), **(fingerprint or {})}
    diagnosed = ("search", "validation") if validate_saturated else ("search",)
    rt = Runtime(evaluate, trace_path, fp, "automem", resume, store, diagnosed_batches=diagnosed,
                 diagnosed_version=RECORD_VERSION if diagnose_unlinked else DIAGNOSED_VERSION)
    proposer = proposer or RuleProposer()
    rng = random.Random(seed)
    base_s = rt.run(None, search_tasks, "search")
    base_v = rt.run(None, val_tasks, "validation")
    base_ok = {r.task_id: r.success for r in base_s.results}  # memory_misled: what the no-memory agent solved
    base_v_ok = {r.task_id: r.success for r in base_v.results}
    ledger, graph = Ledger(), ObservationGraph()
    points: list[dict] = []
    validations, gradients, rejected = [], [], []
    gradient, lead_key, round_ = None, None, 0
    best_acc, stale = None, 0  # best search accuracy so far; rounds since it last improved
    held = 0  # rounds the leader's Store | Retrieve | Manage has stayed the same
    evs: dict[str, Evaluation] = {}  # search-batch evaluations by architecture key (a child's parent)
    inert_edits: dict[str, dict] = {}  # swap_inert: candidates that changed nothing the agent did
    val_evs: dict[str, Evaluation] = {}  # validate_saturated: validation evaluations by key, for the diagnosis

    def state() -> dict:
        return _summary(rt, points, base_s, base_v, {
            "ledger": ledger.to_list(), "graph": graph.to_dict(), "validations": validations,
            "gradients": gradients, "rejected_invalid": len(rejected), "rejected": rejected,
            "front": [p["arch"] for p in pareto_front([p for p in points if not p["failed"]])],
            "leader": lead_key, "best": final_pick(validations, points, final_select), "rounds": round_})

    while len(points) < budget:
        round_ += 1
        ok = [p for p in points if not p["failed"]]
        front = pareto_front(ok)
        lead = (validate_saturated and _saturated_leader(ok, evs, validations)) or leader(front)
        ctx = SearchContext(round=round_, rng=rng, leader=Arch.parse(lead["arch"]) if lead else None,
                            front=[{k2: p[k2] for k2 in ("arch", "accuracy", "gain", "cost")} for p in front],
                            ledger=ledger, graph=graph, gradient=gradient,
                            evaluated={p["arch"] for p in points}, init=init, inert=inert_edits)
        want = min(k, budget - len(points))
        n_stag = 1 if stagnation and stale >= stagnation else 0
        struct = _structure_edit(proposer, ctx) if structure_after and held >= structure_after \
            and want - n_stag > 0 else None
        n_edits = want - n_stag - (struct is not None)
        props = list(proposer.propose(ctx, n_edits))[:n_edits]
        final: list[Proposal] = []
        for prop in props:
            tries = 0
            while not valid(prop.arch) or prop.arch.key in ctx.evaluated:
                if not valid(prop.arch):
                    rejected.append({"round": round_, "arch": prop.arch.key, "origin": prop.origin,
                                     "violations": violations(prop.arch)})
                tries += 1
                if tries > max_resample:
                    prop = Proposal(rng.choice([a for a in feasible_space() if a.key not in ctx.evaluated]), "resample")
                    break
                prop = proposer.resample(ctx, prop, rng)
            ctx.evaluated.add(prop.arch.key)
            final.append(prop)
        final += [struct] if struct is not None else []
        final += _restarts(ctx, n_stag, rng, "stagnation")
        final += _restarts(ctx, want - len(final), rng)
        if not final:
            break
        failures = []
        for slot, prop in enumerate(final):
            ev = rt.run(prop.arch, search_tasks, "search")
            p = _point(ev, base_s, len(points), round_, slot, prop)
            no_change = swap_inert and inert(ev, evs.get(prop.parent or ""))
            if no_change:
                p["inert"] = True
                inert_edits[p["arch"]] = {"parent": prop.parent, "edit": prop.edit, "entry_id": prop.entry_id,
                                          "kinds": _kinds(ev)}
            evs[p["arch"]] = ev
            points.append(p)
            if validate_saturated and _solved_all(ev) and all(v["arch"] != p["arch"] for v in validations):
                validations.append(_validate(rt, p["arch"], val_tasks, base_v, round_, p, val_evs))
            if not ev.failed:
                gains, accs = _gains(ev, base_s)
                graph.update(prop.arch.choices(), gains, accs)
                failures += [(ev.arch, r) for r in ev.results if not r.success]
            parent = next((q for q in points if q["arch"] == prop.parent), None)
            if prop.entry_id and parent is not None:
                acc = {"child": p["accuracy"], "parent": parent["accuracy"]}
                on_val = validate_saturated and _solved_all(ev) and _solved_all(evs.get(parent["arch"]))
                if on_val:  # both solve the search batch: only validation tells them apart
                    val = _val_accuracy(validations)
                    acc = {"child": val.get(p["arch"]), "parent": val.get(parent["arch"])}
                improved = acc["child"] is not None and acc["parent"] is not None and (
                    acc["child"] > acc["parent"] or (acc["child"] == acc["parent"] and p["cost"] < parent["cost"]))
                ledger.validate(prop.entry_id, improved,
                                {"round": round_, "arch": p["arch"], "parent": parent["arch"],
                                 "accuracy": p["accuracy"], "parent_accuracy": parent["accuracy"],
                                 **({"validation_accuracy": acc["child"], "parent_validation_accuracy": acc["parent"]}
                                    if on_val else {})},
                                inert=no_change and not improved)
            rt.save(state())
        for module in MODULES:  # dead ends: choices that keep losing to no memory
            for opt in {o for a in final for m, o in a.arch.choices() if m == module}:
                mean, n = graph.mean(module, opt)
                if n >= 3 and mean <= 0 and module != "encode":
                    ledger.propose("any task pattern", [module, opt], {"round": round_, "mean_gain": mean,
                                                                        "n": n}, kind="dead_end")
        ok = [p for p in points if not p["failed"]]
        round_best = max((p["accuracy"] for p in ok), default=None)
        better = round_best is not None and (best_acc is None or round_best > best_acc + 1e-9)
        best_acc, stale = (round_best, 0) if better else (best_acc, stale + 1)
        lead = (validate_saturated and _saturated_leader(ok, evs, validations)) or leader(pareto_front(ok))
        held = held + 1 if lead and lead_key and _structure(lead["arch"]) == _structure(lead_key) else int(bool(lead))
        lead_key = lead["arch"] if lead else None
        if lead and (round_ % val_every == 0 or len(points) >= budget) \
                and all(v["arch"] != lead_key for v in validations):
            validations.append(_validate(rt, lead_key, val_tasks, base_v, round_, lead, val_evs))
        if diagnose_scope == "leader" and lead_key in evs:  # the edits go to the leader: diagnose its failures
            failures = [(lead_key, r) for r in evs[lead_key].results if not r.success]
        baseline = base_ok
        if validate_saturated and lead_key and _solved_all(evs.get(lead_key)):  # nothing left on the search batch
            failures = [(lead_key, r) for r in val_evs[lead_key].results if not r.success]  # validated on arrival
            baseline = base_v_ok
        gradient = diagnose(failures, Arch.parse(lead_key) if lead_key else None, diagnosis_llm, baseline=baseline,
                            prune_declarative=prune_declarative, drop_forms_ahead=drop_forms_ahead,
                            drop_noise_ahead=drop_noise_ahead, diagnose_unlinked=diagnose_unlinked)
        gradient["round"] = round_
        gradients.append(gradient)
        rt.save(state())
        log.info("automem round %d: %d evaluated, leader %s (%.3f), gradient %s/%s", round_, len(points), lead_key,
                 lead["accuracy"] if lead else float("nan"), gradient["letter"], gradient["failure_mode"])
    _validate_top(rt, points, final_validate, validations, val_tasks, base_v, round_)
    out = state()
    rt.save(out)
    return out


def run_random(evaluate: EvaluateFn, search_tasks: Sequence, val_tasks: Sequence, *, budget: int = 15, seed: int = 0,
               trace_path=None, fingerprint: dict | None = None, resume: str = "auto", final_validate: int = 3,
               store=None, final_select: str = "validation") -> dict:
    """Uniform samples of the valid space (without replacement); the ``final_validate`` best by search accuracy
    (then cost) validated at the end, as AutoMem's."""
    if budget < 1 or final_validate < 1:
        raise ValueError("budget and final_validate must be >= 1")
    check_final_select(final_select)
    fp = {"method": "random", "budget": budget, "seed": seed, "search_tasks": [t.task_id for t in search_tasks],
          "val_tasks": [t.task_id for t in val_tasks], "final_validate": final_validate, **(fingerprint or {})}
    rt = Runtime(evaluate, trace_path, fp, "random", resume, store)
    rng = random.Random(seed)
    base_s = rt.run(None, search_tasks, "search")
    base_v = rt.run(None, val_tasks, "validation")
    archs = rng.sample(feasible_space(), budget)
    points, validations = [], []

    def state() -> dict:
        return _summary(rt, points, base_s, base_v, {"validations": validations,
                                                          "best": final_pick(validations, points, final_select)})

    for i, arch in enumerate(archs):
        ev = rt.run(arch, search_tasks, "search")
        points.append(_point(ev, base_s, i, i + 1, 0, Proposal(arch, "random")))
        rt.save(state())
    _validate_top(rt, points, final_validate, validations, val_tasks, base_v, len(points))
    out = state()
    rt.save(out)
    return out
