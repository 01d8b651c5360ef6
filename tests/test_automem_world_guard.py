"""The world guard: a unit written in another world than the goal names is withheld (an unseen world's map is
not any seen world's); its option travels with the others (tests/test_automem_guards.py)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from memagent_provider_fakes import HashEncoder, acted as _traj  # noqa: E402

from routers.automem import Arch, MemorySystem, TaskResult, scope  # noqa: E402
from routers.automem.guards import goal_world, other_world  # noqa: E402

ELM = "In Elm, find the red cup in the oak chest and put it on the table in the hall."
ELM_NEXT = "In Elm, find the blue pen in the oak chest and put it on the table in the hall."
OAK = "In Oak Hollow, find the blue pen in the oak chest and put it on the table in the hall."
ARCH = Arch(("trajectory",), "hybrid", "hybrid", "lightweight")


def test_goal_world_reads_the_leading_place_name_only():
    assert goal_world(ELM) == "elm" and goal_world(OAK) == "oak hollow"
    assert goal_world("find the key in the box") is None
    assert goal_world("In the hall, find the key.") is None          # a room, not a named world
    assert goal_world("Go north. In Elm, find the key.") is None     # only the goal's setting counts
    assert other_world("elm", OAK) and not other_world("Elm", ELM)
    assert not other_world(None, OAK) and not other_world("elm", "find the key in the box")


@pytest.mark.parametrize("world_guards", [True, False])
def test_the_world_guard_withholds_units_of_another_world(world_guards):
    mem = MemorySystem(ARCH, encoder=HashEncoder(32), world_guards=world_guards, route_guards=False)
    mem.store(_traj(ELM, ["go east", "take red cup from oak chest", "go west", "put red cup on table"]))
    (uid,) = mem.items_by_id()
    assert mem.items_by_id()[uid].meta["world"] == "elm"
    got = mem.retrieve(OAK)                       # same container, same goal shape, another map
    assert mem.last_trace["other_world"] == ([uid] if world_guards else [])
    assert (uid in got.item_ids) == (not world_guards)
    assert uid in mem.retrieve(ELM_NEXT).item_ids and mem.last_trace["other_world"] == []   # its own world: kept
    mem.retrieve("find the blue pen in the oak chest")                  # a goal naming no world: nothing fires
    assert mem.last_trace["other_world"] == []


def test_a_failure_where_only_the_world_guard_withheld_is_out_of_scope():
    withheld = TaskResult("t", False, failure={"memory": {"pool": 2, "retrieved": ["a"], "kept": [], "dropped": [],
                                                          "stale": [], "off_route": [], "other_world": ["a"]}})
    assert scope(withheld) == "stale_withheld"
