"""``swap_inert``: a candidate that repeats its parent's outcome and step count on every task did not test its edit
(the seed-1 run on worlds_revisit3_cpu: ``+workflow`` of a trajectory + shortcut leader was cut by the word limit
and refuted), so its ledger entry stays untested and an inert Encode addition comes back as a swap."""

from __future__ import annotations

import json
import random

from routers.automem import Arch, TaskResult
from routers.automem.evaluate import Evaluation
from routers.automem.ledger import Ledger
from routers.automem.proposer import Proposal, RuleProposer, SearchContext
from routers.automem.search import inert, run_automem
from routers.memagent.protocol import Task

LEADER = Arch(("insight", "trajectory", "shortcut"), "graph", "cbr_rerank", "graph_consolidate")
ADDED = LEADER.edit("encode", "+workflow")
SWAP = Arch(("insight", "workflow", "shortcut"), "graph", "cbr_rerank", "graph_consolidate")
KINDS = ["trajectory", "trajectory", "shortcut", "insight"]  # what each task kept: trajectory units first


def test_inert_compares_outcome_and_steps_task_by_task():
    def ev(*rows, failed=False):
        return Evaluation("a", "search", [TaskResult(f"t{i}", ok, steps=n) for i, (ok, n) in enumerate(rows)],
                          failed=failed)

    parent = ev((True, 4), (False, 9))
    assert inert(ev((True, 4), (False, 9)), parent)
    assert not inert(ev((True, 4), (False, 8)), parent)  # same outcomes, the agent acted otherwise
    assert not inert(ev((False, 4), (True, 9)), parent)  # same accuracy, other tasks
    assert not inert(ev((True, 4), (False, 9), failed=True), parent)
    assert not inert(ev((True, 4), (False, 9)), None)


def test_an_inert_comparison_leaves_the_ledger_entry_untested():
    ledger = Ledger()
    e = ledger.propose("unusable_form", ["encode", "+workflow"], {"round": 1})
    ledger.validate(e.entry_id, False, {"round": 2}, inert=True)
    assert e.status == "pending" and e.evidence[-1] == {"round": 2, "improved": False, "inert": True}
    ledger.validate(e.entry_id, False, {"round": 3})
    assert e.status == "refuted"


def _ctx(ledger=None, evaluated=()):
    return SearchContext(round=3, rng=random.Random(0), leader=LEADER, ledger=ledger or Ledger(),
                         evaluated={LEADER.key, ADDED.key, *evaluated},
                         inert={ADDED.key: {"parent": LEADER.key, "edit": ["encode", "+workflow"], "entry_id": "L1",
                                            "kinds": {"trajectory": 39, "workflow": 17, "shortcut": 18,
                                                      "insight": 13}}})


def test_an_inert_addition_is_retried_without_the_form_its_candidate_kept_most():
    props = RuleProposer().propose(_ctx(), 2)
    first = props[0]
    assert (first.arch.key, first.origin, first.edit, first.repair, first.entry_id, first.parent) == (
        SWAP.key, "swap", ["encode", "+workflow"], ["encode", "-trajectory"], "L1", LEADER.key)
    # one swap per inert addition, then its focus: workflow with every form ranked below it removed, tied to no entry
    focus = props[1]
    assert (focus.arch.key, focus.origin, focus.edit, focus.repair, focus.entry_id) == (
        Arch(("workflow",), "graph", "cbr_rerank", "graph_consolidate").key, "focus", ["encode", "+workflow"],
        ["encode", "-insight", "-shortcut", "-trajectory"], None)
    # that swap evaluated: the next form in line (shortcut, 18 kept)
    again = RuleProposer().propose(_ctx(evaluated=[SWAP.key]), 1)[0]
    assert (again.arch.key, again.repair) == (LEADER.edit("encode", "-shortcut").edit("encode", "+workflow").key,
                                              ["encode", "-shortcut"])
    # a refuted addition (its swap lost) is not retried
    ledger = Ledger()
    e = ledger.propose("unusable_form", ["encode", "+workflow"], {})
    ledger.validate(e.entry_id, False, {})
    assert all(p.origin != "swap" for p in RuleProposer().propose(_ctx(ledger), 2))


def test_an_inert_addition_replaces_only_forms_the_diagnosis_ranks_below_it():
    # seed 2 of worlds_revisit3_cpu: +trajectory of a workflow leader was inert; trajectory ranks below workflow
    lead = Arch(("workflow",), "json", "cbr_rerank", "json_full")
    added = lead.edit("encode", "+trajectory")

    def ctx(leader, added, edit, kinds):
        return SearchContext(round=3, rng=random.Random(0), leader=leader, evaluated={leader.key, added.key},
                             inert={added.key: {"parent": leader.key, "edit": edit, "entry_id": "L1", "kinds": kinds}})

    props = RuleProposer().propose(ctx(lead, added, ["encode", "+trajectory"], {"workflow": 30, "trajectory": 3}), 2)
    assert all(p.origin not in ("swap", "focus") for p in props)
    # +shortcut beside tip + workflow: only tip ranks below shortcut, so one swap and no focus (it would be the swap)
    lead = Arch(("tip", "workflow"), "json", "cbr_rerank", "json_full")
    added = lead.edit("encode", "+shortcut")
    props = RuleProposer().propose(ctx(lead, added, ["encode", "+shortcut"], {"workflow": 30, "tip": 9}), 2)
    assert [(p.origin, p.arch.key, p.repair) for p in props if p.origin in ("swap", "focus")] == [
        ("swap", Arch(("workflow", "shortcut"), "json", "cbr_rerank", "json_full").key, ["encode", "-tip"])]


class FixedInit(RuleProposer):
    def _init(self, ctx, k):
        return [Proposal(LEADER, "init"), Proposal(Arch(("trajectory",), "json", "hybrid", "lightweight"), "init")]


def _not_acted_on(task_id: str, steps: int) -> TaskResult:
    """Evidence injected with only its own task's units, not acted on (``unusable_form``)."""
    return TaskResult(task_id, False, tokens=10, steps=steps, failure={
        "timeout": False, "evidence_seen": True, "evidence_in_pool": True, "evidence_retrieved": True,
        "evidence_injected": True, "stale_injected": False, "source_units": 3, "evidence_followed": False,
        "foreign_injected": 0, "kept_kinds": KINDS, "memory": {"pool": 4, "retrieved": ["a"], "kept": ["a"]}})


def test_the_search_swaps_in_a_form_the_word_limit_hid_only_when_swap_inert_is_on(tmp_path):
    S, V = [Task(f"s-{i}", "fetch") for i in range(4)], [Task(f"v-{i}", "fetch") for i in range(4)]

    def evaluate(arch, tasks):  # the leader 2 of 4; adding workflow changes nothing; swapping it in solves all
        key = arch.key if arch is not None else None
        solved = {None: 0, LEADER.key: 2, ADDED.key: 2, SWAP.key: 4}.get(key, 1)
        return [TaskResult(t.task_id, True, tokens=10, steps=3, failure={"kept_kinds": KINDS}) if i < solved
                else _not_acted_on(t.task_id, 9) for i, t in enumerate(tasks)]

    out = {}
    for name, on in (("off", False), ("on", True)):
        out[name] = run_automem(evaluate, S, V, budget=6, k=2, seed=0, proposer=FixedInit(), swap_inert=on,
                                trace_path=tmp_path / f"{name}.json")
        assert json.loads((tmp_path / f"{name}.json").read_text())["fingerprint"].get("swap_inert") is (on or None)
    off, on = out["off"], out["on"]
    added = {n: next(p for p in t["evaluations"] if p["arch"] == ADDED.key) for n, t in out.items()}
    assert added["off"]["round"] == added["on"]["round"] == 2 and added["on"]["inert"] and "inert" not in added["off"]
    entry = {n: next(e for e in t["ledger"] if e["edit"] == ["encode", "+workflow"]) for n, t in out.items()}
    assert entry["off"]["status"] == "refuted"
    assert SWAP.key not in {p["arch"] for p in off["evaluations"]} and off["best"]["validation_accuracy"] == 0.5
    swap = next(p for p in on["evaluations"] if p["arch"] == SWAP.key)
    assert (swap["round"], swap["origin"], swap["repair"]) == (3, "swap", ["encode", "-trajectory"])
    assert entry["on"]["status"] == "active" and on["best"]["arch"] == SWAP.key
    assert on["best"]["validation_accuracy"] == 1.0


def test_the_focus_is_picked_when_the_added_form_works_best_alone(tmp_path):
    S, V = [Task(f"s-{i}", "fetch") for i in range(4)], [Task(f"v-{i}", "fetch") for i in range(4)]
    focus = Arch(("workflow",), "graph", "cbr_rerank", "graph_consolidate")

    def evaluate(arch, tasks):  # the swap helps (3 of 4), workflow alone solves all
        key = arch.key if arch is not None else None
        solved = {None: 0, LEADER.key: 2, ADDED.key: 2, SWAP.key: 3, focus.key: 4}.get(key, 1)
        return [TaskResult(t.task_id, True, tokens=10, steps=3, failure={"kept_kinds": KINDS}) if i < solved
                else _not_acted_on(t.task_id, 9) for i, t in enumerate(tasks)]

    out = run_automem(evaluate, S, V, budget=6, k=2, seed=0, proposer=FixedInit(), swap_inert=True, trace_path=None)
    third = [(p["origin"], p["arch"], p["accuracy"]) for p in out["evaluations"] if p["round"] == 3]
    assert third == [("swap", SWAP.key, 0.75), ("focus", focus.key, 1.0)]
    assert out["best"]["arch"] == focus.key and out["best"]["validation_accuracy"] == 1.0
    assert next(e for e in out["ledger"] if e["edit"] == ["encode", "+workflow"])["status"] == "active"
