"""The rule proposer's exploration edit: an edit the cross-module constraints forbid on its own is repaired by one
other module's change instead of being skipped, so coupled choices (graph store + graph_consolidate) do not trap
the search in one region of the space. Also the search's structure slot and ``prune_declarative``'s order of the
diagnosis's ``unusable_form`` edits."""

from __future__ import annotations

import json
import random

import pytest

from routers.automem import Arch, TaskResult, diagnose, valid
from routers.automem.diagnosis import recommended_edits
from routers.automem.ledger import Ledger, ObservationGraph
from routers.automem.proposer import Proposal, RuleProposer, SearchContext, _apply
from routers.automem.search import _structure, run_automem
from routers.memagent.protocol import Task

GRAPH_LEADER = Arch(("insight", "shortcut"), "graph", "cbr_rerank", "graph_consolidate")


def _graph(observed: dict[tuple[str, str], float]) -> ObservationGraph:
    """An observation graph where each (module, option) was seen once with the given gain."""
    g = ObservationGraph()
    for choice, gain in observed.items():
        g.update([choice], {"any": gain}, {"any": 0.5})
    return g


def _explore(graph, leader=GRAPH_LEADER, ledger=None, seed=0):
    ctx = SearchContext(round=2, rng=random.Random(seed), leader=leader, graph=graph, ledger=ledger or Ledger(),
                        evaluated={leader.key})
    return RuleProposer().explore(ctx, {leader.key})


def test_a_forbidden_edit_is_proposed_with_its_best_repair():
    # a json store paid off elsewhere, and so did json_full; the leader's graph_consolidate forbids a json store
    g = _graph({("store", "json"): 0.6, ("manage", "json_full"): 0.4, ("manage", "lightweight"): -0.2,
                ("manage", "tool_manager"): -0.3, ("store", "graph"): -0.1, ("retrieve", "cbr_rerank"): -0.1,
                ("manage", "graph_consolidate"): -0.1, ("encode", "insight"): 0.0, ("encode", "shortcut"): 0.0})
    assert not valid(GRAPH_LEADER.edit("store", "json"))
    p = _explore(g)
    assert p.arch == Arch(("insight", "shortcut"), "json", "cbr_rerank", "json_full")
    assert (p.origin, p.edit, p.repair, p.parent) == ("explore", ["store", "json"], ["manage", "json_full"],
                                                        GRAPH_LEADER.key)
    assert valid(p.arch) and p.to_dict()["repair"] == ["manage", "json_full"]


def test_a_blocked_repair_is_not_used():
    g = _graph({("store", "json"): 0.6, ("manage", "json_full"): 0.4, ("manage", "lightweight"): -0.2})
    ledger = Ledger()
    ledger.propose("any task pattern", ["manage", "json_full"], {}, kind="dead_end")
    p = _explore(g, ledger=ledger)
    assert p.edit == ["store", "json"] and p.repair != ["manage", "json_full"] and valid(p.arch)


def test_a_valid_single_edit_carries_no_repair_and_keeps_the_trace_format():
    g = _graph({("retrieve", "hybrid"): 0.8})                            # valid on the graph store as it is
    p = _explore(g)
    assert p.arch == GRAPH_LEADER.edit("retrieve", "hybrid") and p.edit == ["retrieve", "hybrid"]
    assert p.repair is None and "repair" not in p.to_dict()


def test_repeated_exploration_leaves_the_graph_family():
    seen, stores = {GRAPH_LEADER.key}, set()
    for _ in range(20):
        ctx = SearchContext(round=2, rng=random.Random(1), leader=GRAPH_LEADER, evaluated=set(seen))
        p = RuleProposer().explore(ctx, seen)
        assert valid(p.arch) and p.arch.key not in {GRAPH_LEADER.key}
        seen.add(p.arch.key)
        stores.add(p.arch.store)
    assert stores - {"graph", "llm_graph"}, stores                      # json / vector / hybrid reached


class EncodeOnlyProposer(RuleProposer):
    """Proposes only Encode edits of the leader, as the diagnosis's gradient does when every failure reads as
    ``unusable_form``: without a reserved slot the search never leaves its round-1 winner's structure."""

    def propose(self, ctx, k):
        out, seen = [], set(ctx.evaluated)
        for opt in ["+tip", "+insight", "+trajectory", "+workflow", "+shortcut", "-tip", "-insight", "-trajectory",
                    "-workflow", "-shortcut"]:
            arch = _apply(ctx.leader, "encode", opt) if ctx.leader else None
            if arch is not None and valid(arch) and arch.key not in seen and len(out) < k:
                out.append(Proposal(arch, "gradient", ctx.leader.key, ["encode", opt]))
                seen.add(arch.key)
        return out if ctx.leader else super().propose(ctx, k)


def test_a_held_structure_gives_one_slot_per_round_to_a_store_retrieve_or_manage_edit(tmp_path):
    """``structure_after=2``: once the leader has kept its Store | Retrieve | Manage for 2 rounds, one slot per round
    edits one of them (the leader's Encode kept); a better structure found that way resets the count. Off (0, the
    default), encode-only proposals keep the round-1 winner's structure until they run out."""
    S, V = [Task(f"s-{i}", "fetch") for i in range(4)], [Task(f"v-{i}", "fetch") for i in range(4)]
    special: set[str] = set()

    def evaluate(arch, tasks):  # every architecture 2 of 4, except any in ``special`` (4 of 4)
        lv = 0 if arch is None else 4 if arch.key in special else 2
        return [TaskResult(t.task_id, i < lv, tokens=10) for i, t in enumerate(tasks)]

    off = run_automem(evaluate, S, V, budget=10, k=2, seed=0, proposer=EncodeOnlyProposer(),
                      trace_path=tmp_path / "off.json")
    edits = [p for p in off["evaluations"] if p["origin"] == "gradient"]
    assert len(edits) >= 4 and all(_structure(p["arch"]) == _structure(p["parent"]) for p in edits)
    assert all(p["origin"] != "structure" for p in off["evaluations"])  # only restarts leave, once edits run out

    on = run_automem(evaluate, S, V, budget=10, k=2, seed=0, proposer=EncodeOnlyProposer(), structure_after=2,
                     trace_path=tmp_path / "on.json")
    by_round = {}
    for p in on["evaluations"]:
        by_round.setdefault(p["round"], []).append(p["origin"])
    assert [rnd.count("structure") for _, rnd in sorted(by_round.items())] == [0, 0, 1, 1, 1], by_round
    fingerprints = [json.loads((tmp_path / f"{n}.json").read_text())["fingerprint"] for n in ("on", "off")]
    assert fingerprints[0]["structure_after"] == 2 and "structure_after" not in fingerprints[1]
    for p in on["evaluations"]:
        if p["origin"] == "structure":
            parent = Arch.parse(p["parent"])
            arch = Arch.parse(p["arch"])
            assert valid(arch) and arch.encode == parent.encode and p["edit"][0] in ("store", "retrieve", "manage")
            assert _structure(p["arch"]) != _structure(p["parent"])
    # round 3's structure edit is better: round 4 has a new leader (held 1 round, no slot), round 5 a slot again
    special.add(next(p["arch"] for p in on["evaluations"] if p["round"] == 3 and p["origin"] == "structure"))
    found = run_automem(evaluate, S, V, budget=10, k=2, seed=0, proposer=EncodeOnlyProposer(), structure_after=2)
    assert [sum(p["origin"] == "structure" for p in found["evaluations"] if p["round"] == r)
            for r in (3, 4, 5)] == [1, 0, 1]
    with pytest.raises(ValueError, match="structure_after"):
        run_automem(evaluate, S, V, budget=2, structure_after=-1)


MIXED = Arch(("tip", "insight", "workflow"), "vector", "hybrid", "tool_manager")


def _not_acted_on(task_id: str) -> TaskResult:
    """A failure whose evidence was injected with only its own task's units and never acted on: ``unusable_form``."""
    return TaskResult(task_id, False, tokens=10, failure={
        "timeout": False, "evidence_seen": True, "evidence_in_pool": True, "evidence_retrieved": True,
        "evidence_injected": True, "stale_injected": False, "source_units": 3, "evidence_followed": False,
        "foreign_injected": 0, "memory": {"pool": 4, "retrieved": ["a"], "kept": ["a"]}})


def test_prune_declarative_orders_the_unusable_form_edits_by_what_the_leader_already_encodes():
    fails = [("x", _not_acted_on(f"t{i}")) for i in range(3)]
    on = diagnose(fails, MIXED, prune_declarative=True)
    assert on["failure_mode"] == "unusable_form"
    assert on["recommended_edit"]["edits"] == [["encode", "-insight"], ["encode", "-tip"], ["encode", "+workflow"],
                                               ["encode", "+shortcut"], ["encode", "+trajectory"]]
    assert diagnose(fails, MIXED)["recommended_edit"]["edits"][:2] == [["encode", "+workflow"], ["encode", "+shortcut"]]
    # no procedural form yet (add one first), or no declarative one to remove: the order stays
    for arch in (Arch(("tip", "insight"), "vector", "hybrid", "lightweight"), Arch(("workflow",), "json", "hybrid",
                                                                                   "tool_manager")):
        assert recommended_edits("unusable_form", arch, True) == recommended_edits("unusable_form", arch)
    assert recommended_edits("retrieval_noise", MIXED, True) == recommended_edits("retrieval_noise", MIXED)


class FixedInit(RuleProposer):
    """Round 1 evaluates the mixed-encoder system (the leader) and one weaker system."""

    def _init(self, ctx, k):
        return [Proposal(MIXED, "init"), Proposal(Arch(("trajectory",), "json", "hybrid", "lightweight"), "init")]


def test_the_search_removes_a_declarative_encoder_first_when_prune_declarative_is_on(tmp_path):
    S, V = [Task(f"s-{i}", "fetch") for i in range(4)], [Task(f"v-{i}", "fetch") for i in range(4)]

    def evaluate(arch, tasks):  # the mixed system solves 2 of 4, the others 1; every failure reads unusable_form
        lv = 0 if arch is None else 2 if arch.key == MIXED.key else 1
        return [TaskResult(t.task_id, True, tokens=10) if i < lv else _not_acted_on(t.task_id)
                for i, t in enumerate(tasks)]

    edits = {}
    for name, on in (("off", False), ("on", True)):
        trace = run_automem(evaluate, S, V, budget=4, k=2, seed=0, proposer=FixedInit(), prune_declarative=on,
                            trace_path=tmp_path / f"{name}.json")
        assert trace["gradients"][0]["failure_mode"] == "unusable_form"
        edits[name] = [p["edit"] for p in trace["evaluations"] if p["round"] == 2]
        fingerprint = json.loads((tmp_path / f"{name}.json").read_text())["fingerprint"]
        assert fingerprint.get("prune_declarative") is (True if on else None)
    assert edits == {"off": [["encode", "+shortcut"], ["encode", "+trajectory"]],
                     "on": [["encode", "-insight"], ["encode", "-tip"]]}


def _crowded(task_id: str) -> TaskResult:
    """The site's route never reached the agent: only the tips of the evidence's own episodes were retrieved."""
    return TaskResult(task_id, False, tokens=10, failure={
        "timeout": False, "evidence_seen": True, "evidence_in_pool": True, "evidence_retrieved": False,
        "evidence_injected": False, "stale_injected": False, "source_units": 6, "kept_kinds": ["tip", "tip", "tip"],
        "crowded_by_declarative": True, "memory": {"pool": 9, "retrieved": ["a", "b", "c"], "kept": ["a", "b", "c"]}})


def test_a_route_crowded_out_by_its_own_tips_makes_the_search_drop_a_declarative_encoder(tmp_path):
    S, V = [Task(f"s-{i}", "fetch") for i in range(4)], [Task(f"v-{i}", "fetch") for i in range(4)]

    def evaluate(arch, tasks):
        lv = 0 if arch is None else 2 if arch.key == MIXED.key else 1
        return [TaskResult(t.task_id, True, tokens=10) if i < lv else _crowded(t.task_id) for i, t in enumerate(tasks)]

    trace = run_automem(evaluate, S, V, budget=4, k=2, seed=0, proposer=FixedInit(), trace_path=tmp_path / "t.json")
    g = trace["gradients"][0]
    assert (g["module"], g["failure_mode"], g["histogram"]["E"]) == ("encode", "declarative_crowding", 5)
    assert [p["edit"] for p in trace["evaluations"] if p["round"] == 2] == [["encode", "-tip"], ["encode", "-insight"]]
