"""The sought-item guards (session 43, no-container suite): a goal that names its item but not its place ("find the
green wrench") gave the guards no fact to read, so memory of the route of an episode that had already taken that
item away -- and other objects' routes in the same world -- sent the agent to an empty basket on every moved task
no memory solves."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from memagent_provider_fakes import HashEncoder  # noqa: E402

from routers.automem import Arch, MemorySystem, TaskResult  # noqa: E402
from routers.automem.diagnosis import scope  # noqa: E402
from routers.automem.guards import sought_items, taken, unsought  # noqa: E402
from routers.memagent.protocol import Task, Trajectory, TrajectoryStep  # noqa: E402

GOAL = "In Maple Cottage, find the {} and put it on the table in the kitchen."
BASKET = ("-= Office =- You are in an office. You can see a basket. The basket contains {}. There is an exit to the "
          "south.")
ARCH = Arch(("trajectory",), "hybrid", "hybrid", "lightweight")


def _delivery(obj: str, contents: str) -> Trajectory:
    acts = ["go north", f"take {obj} from basket", "go south", f"put {obj} on table"]
    obs = ["-= Vestibule =- A vestibule.", BASKET.format(contents), f"You take the {obj} from the basket.",
           "-= Kitchen =- A kitchen. You see a table."]
    return Trajectory(Task(f"t-{obj}", GOAL.format(obj)), [TrajectoryStep(i, o, a) for i, (o, a) in
                                                          enumerate(zip(obs, acts))], success=True)


def _memory(on: bool) -> MemorySystem:
    mem = MemorySystem(ARCH, encoder=HashEncoder(), k=3, max_words=200, trajectory_facts=True, sought_guards=on)
    mem.store(_delivery("green wrench", "a green wrench, a white chisel and a yellow pliers"))
    mem.store(_delivery("white chisel", "a white chisel and a yellow pliers"))   # the wrench is gone by then
    return mem


def test_sought_items_read_goals_with_and_without_a_place():
    assert sought_items(GOAL.format("green wrench")) == ["green wrench"]
    assert sought_items("In Elm, find the brass key in the oak chest and put it on the table in the hall.") == [
        "brass key"]
    assert sought_items("Put the cup on the table.") == []
    assert taken(["green wrench"], GOAL.format("green wrench")) == ["green wrench"]
    assert taken(["green wrench"], GOAL.format("white chisel")) == [] and taken(None, GOAL.format("x")) == []
    assert unsought("The basket contains a white chisel.", GOAL.format("green wrench"), {})
    assert not unsought("The basket contains a green wrench.", GOAL.format("green wrench"), {})
    chest = {"brass key": "oak chest"}
    assert not unsought("take red cup from oak chest", "find the brass key in the oak chest", chest)
    assert not unsought("anything", "Put the cup on the table.", {})   # a goal seeking nothing: no guard


def test_a_goal_seeking_a_taken_item_again_gets_no_route_to_where_it_was():
    goal = GOAL.format("green wrench")   # the moved task: the wrench is in the kitchen cupboard now
    off = _memory(False)
    assert "take green wrench from basket" in off.retrieve(goal).text   # the stale route, as before
    on = _memory(True)
    assert on.retrieve(goal).text == ""
    trace = on.last_trace
    wrench, chisel = (i.item_id for i in on._state.items)
    assert trace["taken"] == [wrench] and trace["unsought"] == [chisel] and trace["kept"] == []
    assert scope(TaskResult("t", False, failure={"memory": trace})) == "stale_withheld"
    assert on.params()["sought_guards"] is True and off.params()["sought_guards"] is False


def test_a_fetch_still_gets_every_unit_that_saw_its_item():
    mem = _memory(True)
    got = mem.retrieve(GOAL.format("yellow pliers"))
    assert len(got.item_ids) == 2 and "take white chisel from basket" in got.text
    assert mem.last_trace["taken"] == [] and mem.last_trace["unsought"] == []
    # the items' meta says what each episode took
    assert [i.meta["took"] for i in mem._state.items] == [["green wrench"], ["white chisel"]]


def test_units_withheld_as_unsought_leave_a_fetch_failure_in_scope():
    """Every retrieved unit about another item, the goal's evidence left in the pool: a ranking miss the diagnosis
    must read (before this, any withheld-and-nothing-kept failure was out of scope as ``stale_withheld``)."""
    from routers.automem.diagnosis import classify

    mem = {"pool": 5, "retrieved": ["a", "b"], "kept": [], "dropped": [], "unsought": ["a", "b"], "taken": []}
    miss = TaskResult("t", False, failure={"memory": mem, "evidence_seen": True, "evidence_in_pool": True,
                                           "evidence_retrieved": False, "evidence_injected": False})
    assert scope(miss) is None and classify(miss) == "retrieval_miss"
    # the evidence's own unit retrieved and withheld: it names nothing the goal seeks (a workflow's <OBJECT>)
    held = TaskResult("t", False, failure={**miss.failure, "evidence_retrieved": True, "evidence_linked": False})
    assert classify(held, unlinked=True) == "unlinked_evidence" and classify(held) == "retrieval_noise"
    stale = TaskResult("t", False, failure={"memory": {**mem, "taken": ["c"]}})
    assert scope(stale) == "stale_withheld"
