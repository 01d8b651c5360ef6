"""``diagnose_scope="leader"``, ``drop_forms_ahead``, ``validate_saturated`` and ``drop_noise_ahead``
(worlds_tight_cpu seed 0): the leader read a shortcut macro ahead of its workflow under the 60-word limit and did not
act, while a losing round-1 candidate's declarative crowding filled the round's histogram; the round's diagnosis sent
the search to ``-insight`` and the Store. Once the leader solved the whole search batch, nothing was left there to
rank or diagnose, and its validation failures cut the workflow behind a trajectory unit."""

from __future__ import annotations

from collections import Counter

from routers.automem import Arch, TaskResult
from routers.automem.diagnosis import EDITS, diagnose, forms_ahead
from routers.automem.proposer import Proposal, RuleProposer
from routers.automem.search import run_automem
from routers.memagent.protocol import Task

LEADER = Arch(("insight", "trajectory", "workflow", "shortcut"), "hybrid", "hybrid", "json_full")
LOSER = Arch(("tip", "insight", "workflow"), "vector", "hybrid", "tool_manager")
FOCUSED = LEADER.edit("encode", "-shortcut")
SATURATED = Arch(("insight", "trajectory", "workflow"), "hybrid", "hybrid", "json_full")
CARRIES = SATURATED.edit("encode", "-trajectory")


def _unusable(task_id: str, kinds) -> TaskResult:
    """The evidence injected with only its own task's units, read after ``kinds[0]`` and not acted on."""
    return TaskResult(task_id, False, tokens=10, steps=9, failure={
        "timeout": False, "evidence_seen": True, "evidence_in_pool": True, "evidence_retrieved": True,
        "evidence_injected": True, "stale_injected": False, "source_units": 3, "evidence_followed": False,
        "foreign_injected": 0, "kept_kinds": list(kinds), "memory": {"pool": 4, "retrieved": ["a"], "kept": ["a"]}})


def _crowded(task_id: str) -> TaskResult:
    """Tip / insight units of the evidence's own episodes took the injected text (``declarative_crowding``)."""
    return TaskResult(task_id, False, tokens=10, steps=9, failure={
        "timeout": False, "evidence_seen": True, "evidence_in_pool": True, "evidence_retrieved": True,
        "crowded_by_declarative": True, "kept_kinds": ["tip", "insight"],
        "memory": {"pool": 4, "retrieved": ["a"], "kept": ["a"]}})


def _truncated(task_id: str, kinds) -> TaskResult:
    """The evidence retrieved but cut by the word limit behind ``kinds`` (``retrieval_noise``, worlds_tight seed 0's
    validation: the trajectory of the evidence's own episode kept ahead of the workflow that holds it)."""
    return TaskResult(task_id, False, tokens=10, steps=9, failure={
        "timeout": False, "evidence_seen": True, "evidence_in_pool": True, "evidence_retrieved": True,
        "evidence_injected": False, "stale_injected": False, "source_units": 3, "evidence_followed": False,
        "foreign_injected": 0, "kept_kinds": list(kinds), "memory": {"pool": 4, "retrieved": ["a", "b"],
                                                                     "kept": ["a"]}})


def test_forms_ahead_counts_lower_ranked_forms_read_before_the_best_one():
    results = [_unusable("a", ["shortcut", "workflow", "trajectory"]), _unusable("b", ["shortcut", "workflow",
                                                                                         "shortcut"]),
               _unusable("c", ["trajectory", "shortcut", "workflow"]), _unusable("d", ["workflow", "shortcut"]),
               _unusable("e", ["tip", "insight"]), _unusable("f", [])]
    assert forms_ahead(results) == Counter({"shortcut": 3, "trajectory": 1})


def test_drop_forms_ahead_puts_the_removals_first_in_the_unusable_form_edits():
    fails = [(LEADER.key, _unusable("a", ["shortcut", "workflow"])),
             (LEADER.key, _unusable("b", ["trajectory", "shortcut", "workflow"]))]
    static = [list(e) for e in EDITS["unusable_form"]]
    assert diagnose(fails, LEADER)["recommended_edit"]["edits"] == static
    grad = diagnose(fails, LEADER, drop_forms_ahead=True)
    assert grad["failure_mode"] == "unusable_form"
    assert grad["recommended_edit"]["edits"] == [["encode", "-shortcut"], ["encode", "-trajectory"]] + static
    # another mode's edits are untouched
    crowd = [(LOSER.key, _crowded("c"))] * 2
    assert diagnose(crowd, LOSER, drop_forms_ahead=True)["recommended_edit"]["edits"] == [
        list(e) for e in EDITS["declarative_crowding"]]


def test_drop_noise_ahead_puts_the_removals_first_in_the_retrieval_noise_edits():
    fails = [(SATURATED.key, _truncated("a", ["trajectory", "workflow"])),
             (SATURATED.key, _truncated("b", ["trajectory", "workflow", "insight"]))]
    static = [list(e) for e in EDITS["retrieval_noise"]]
    assert ["encode", "-trajectory"] not in static   # the static list never removes the trajectory
    for kw in ({}, {"drop_forms_ahead": True}):      # nor does the unusable_form option
        grad = diagnose(fails, SATURATED, **kw)
        assert grad["failure_mode"] == "retrieval_noise" and grad["recommended_edit"]["edits"] == static
    grad = diagnose(fails, SATURATED, drop_noise_ahead=True)
    assert grad["recommended_edit"]["edits"] == [["encode", "-trajectory"]] + static
    # an unusable_form gradient is untouched by it
    assert diagnose([(LEADER.key, _unusable("c", ["shortcut", "workflow"]))], LEADER, drop_noise_ahead=True)[
        "recommended_edit"]["edits"] == [list(e) for e in EDITS["unusable_form"]]


class FixedInit(RuleProposer):
    def _init(self, ctx, k):
        return [Proposal(LOSER, "init"), Proposal(LEADER, "init")]


def _evaluate(arch, tasks):
    """The leader solves 3 of 4 (its failure: shortcut read first), the loser 1 (three crowded), the leader without
    the shortcut all 4, anything else 2."""
    key = arch.key if arch is not None else None
    solved = {None: 0, LEADER.key: 3, LOSER.key: 1, FOCUSED.key: 4}.get(key, 2)
    fail = _crowded if key == LOSER.key else (lambda t: _unusable(t, ["shortcut", "workflow", "trajectory"]))
    return [TaskResult(t.task_id, True, tokens=10, steps=3) if i < solved else fail(t.task_id)
            for i, t in enumerate(tasks)]


def test_the_leaders_diagnosis_drops_the_form_read_ahead_of_the_workflow():
    S, V = [Task(f"s-{i}", "fetch") for i in range(4)], [Task(f"v-{i}", "fetch") for i in range(4)]
    runs = {(scope, drop): run_automem(_evaluate, S, V, budget=4, k=2, seed=0, proposer=FixedInit(),
                                       trace_path=None, diagnose_scope=scope, drop_forms_ahead=drop)
            for scope in ("round", "leader") for drop in (False, True)}

    def round2(t):
        return [(p["origin"], p["edit"], p["arch"]) for p in t["evaluations"] if p["round"] == 2]

    # the round's diagnosis: the loser's three crowded failures outvote the leader's one -> declarative_crowding
    for drop in (False, True):
        t = runs[("round", drop)]
        assert t["gradients"][0]["failure_mode"] == "declarative_crowding"
        assert round2(t) == [("gradient", ["encode", "-insight"], LEADER.edit("encode", "-insight").key),
                             ("gradient", ["store", "json"], LEADER.edit("store", "json").key)]
        assert t["best"]["arch"] == LEADER.key
    # the leader's own failure is unusable_form; the static edits add forms it holds, so -insight comes first
    assert round2(runs[("leader", False)])[0][1] == ["encode", "-insight"]
    t = runs[("leader", True)]
    assert t["gradients"][0]["failure_mode"] == "unusable_form" and t["gradients"][0]["n_failures"] == 1
    assert round2(t)[0] == ("gradient", ["encode", "-shortcut"], FOCUSED.key)
    assert t["best"]["arch"] == FOCUSED.key and t["best"]["validation_accuracy"] == 1.0


def test_the_options_enter_the_fingerprint_only_when_on_and_a_bad_scope_is_refused(tmp_path):
    import json

    import pytest

    from train.automem import AutomemTrainConfig

    S, V = [Task(f"s-{i}", "fetch") for i in range(4)], [Task(f"v-{i}", "fetch") for i in range(4)]
    on = {"diagnose_scope": "leader", "drop_forms_ahead": True, "validate_saturated": True, "drop_noise_ahead": True}
    for name, kw in (("off", {}), ("on", on)):
        run_automem(_evaluate, S, V, budget=2, k=2, seed=0, proposer=FixedInit(), trace_path=tmp_path / name, **kw)
        fp = json.loads((tmp_path / name).read_text())["fingerprint"]
        assert {k: fp.get(k) for k in on} == (on if kw else dict.fromkeys(on))
    with pytest.raises(ValueError, match="diagnose_scope"):
        run_automem(_evaluate, S, V, budget=2, k=2, trace_path=None, diagnose_scope="everyone")
    with pytest.raises(ValueError, match="diagnose_scope"):
        AutomemTrainConfig(output_dir="x", diagnose_scope="everyone")




class SaturatedInit(RuleProposer):
    def _init(self, ctx, k):
        return [Proposal(LOSER, "init"), Proposal(SATURATED, "init")]


def _evaluate_saturated(arch, tasks, fail=_unusable):
    """worlds_tight seed 0: the leader solves every search task but half the validation tasks, where it read a
    trajectory unit ahead of the workflow; without the trajectory it solves them all; anything else 1 of 4."""
    key = arch.key if arch is not None else None
    val = tasks[0].task_id.startswith("v-")
    solved = {None: 0, SATURATED.key: 2 if val else 4, CARRIES.key: 4}.get(key, 1)
    return [TaskResult(t.task_id, True, tokens=10, steps=3) if i < solved
            else fail(t.task_id, ["trajectory", "workflow"]) for i, t in enumerate(tasks)]


def _evaluate_truncated(arch, tasks):
    """As ``_evaluate_saturated``, the evidence cut by the word limit behind the trajectory (``retrieval_noise``)."""
    return _evaluate_saturated(arch, tasks, fail=_truncated)


def test_a_saturated_leader_is_diagnosed_and_ranked_on_validation():
    S, V = [Task(f"s-{i}", "fetch") for i in range(4)], [Task(f"v-{i}", "fetch") for i in range(4)]
    kw = dict(budget=4, k=2, seed=0, proposer=SaturatedInit(), trace_path=None, diagnose_scope="leader",
              drop_forms_ahead=True, final_validate=1)
    off = run_automem(_evaluate_saturated, S, V, **kw)
    on = run_automem(_evaluate_saturated, S, V, validate_saturated=True, **kw)
    # off: the leader has no search failure, so nothing is diagnosed and round 2 explores; the pick is the leader
    assert off["gradients"][0]["n_failures"] == 0 and off["gradients"][0]["module"] is None
    assert CARRIES.key not in [p["arch"] for p in off["evaluations"]]
    assert off["best"]["arch"] == SATURATED.key and off["best"]["validation_accuracy"] == 0.5
    # on: the saturated leader is validated in round 1, its two validation failures give -trajectory first
    assert [(v["round"], v["arch"], v["accuracy"]) for v in on["validations"]] == [
        (1, SATURATED.key, 0.5), (2, CARRIES.key, 1.0)]
    g = on["gradients"][0]
    assert (g["failure_mode"], g["n_failures"], sorted(g["evidence_ids"])) == ("unusable_form", 2, ["v-2", "v-3"])
    assert [(p["round"], p["edit"], p["arch"]) for p in on["evaluations"]][2] == (
        2, ["encode", "-trajectory"], CARRIES.key)
    # both solve the search batch: validation settles the ledger entry and names the leader and the pick
    entry = next(e for e in on["ledger"] if e["edit"] == ["encode", "-trajectory"])
    assert entry["status"] == "active"
    assert [(e["validation_accuracy"], e["parent_validation_accuracy"]) for e in entry["evidence"]
            if "validation_accuracy" in e] == [(1.0, 0.5)]
    assert on["leader"] == CARRIES.key
    assert on["best"]["arch"] == CARRIES.key and on["best"]["validation_accuracy"] == 1.0


def test_a_saturated_leaders_truncated_evidence_drops_the_trajectory_ahead():
    """worlds_tight seed 0 as measured: the validation failures are retrieval_noise (the workflow cut behind the
    trajectory), whose static edits (mmr, cbr_rerank, encoder removals but the trajectory's) never reach the fix."""
    S, V = [Task(f"s-{i}", "fetch") for i in range(4)], [Task(f"v-{i}", "fetch") for i in range(4)]
    kw = dict(budget=4, k=2, seed=0, proposer=SaturatedInit(), trace_path=None, diagnose_scope="leader",
              drop_forms_ahead=True, validate_saturated=True, final_validate=1)
    off = run_automem(_evaluate_truncated, S, V, **kw)
    on = run_automem(_evaluate_truncated, S, V, drop_noise_ahead=True, **kw)
    for t in (off, on):
        assert (t["gradients"][0]["failure_mode"], t["gradients"][0]["n_failures"]) == ("retrieval_noise", 2)
    assert CARRIES.key not in [p["arch"] for p in off["evaluations"]]
    assert [p["edit"] for p in off["evaluations"] if p["round"] == 2] == [["retrieve", "mmr"],
                                                                        ["retrieve", "cbr_rerank"]]
    assert off["best"]["arch"] == SATURATED.key and off["best"]["validation_accuracy"] == 0.5
    assert [(p["round"], p["edit"], p["arch"]) for p in on["evaluations"]][2] == (
        2, ["encode", "-trajectory"], CARRIES.key)
    assert on["leader"] == CARRIES.key
    assert on["best"]["arch"] == CARRIES.key and on["best"]["validation_accuracy"] == 1.0
