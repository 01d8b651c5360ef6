"""The rule proposer's exploration edit: an edit the cross-module constraints forbid on its own is repaired by one
other module's change instead of being skipped, so coupled choices (graph store + graph_consolidate) do not trap
the search in one region of the space."""

from __future__ import annotations

import random

from routers.automem import Arch, valid
from routers.automem.ledger import Ledger, ObservationGraph
from routers.automem.proposer import RuleProposer, SearchContext

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
    return RuleProposer()._explore(ctx, {leader.key})


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
        p = RuleProposer()._explore(ctx, seen)
        assert valid(p.arch) and p.arch.key not in {GRAPH_LEADER.key}
        seen.add(p.arch.key)
        stores.add(p.arch.store)
    assert stores - {"graph", "llm_graph"}, stores                      # json / vector / hybrid reached
