"""The world guard: a unit written in another world than the goal names is withheld (an unseen world's map is
not any seen world's); its option travels with the others (tests/test_automem_guards.py). ``world_scope``: another
world's units are not retrieval candidates at all."""

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


def test_world_scope_keeps_another_worlds_units_out_of_the_k_slots():
    """Guarding after retrieval, a pool of other worlds' look-alike units can fill every slot and leave the agent
    without memory; scoped retrieval ranks only the goal's world's units, so its own unit is retrieved."""
    def fill(mem):
        for world in ("Oak Hollow", "Pine", "Birch"):   # the same goal shape in three other worlds
            g = f"In {world}, find the blue pen in the oak chest and put it on the table in the hall."
            mem.store(_traj(g, ["go east", "take blue pen from oak chest", "go west", "put blue pen on table"]))
        mem.store(_traj(ELM, ["go north", "take red cup from oak chest", "go south", "put red cup on table"]))
        return next(u for u, it in mem.items_by_id().items() if it.meta["world"] == "elm")

    guarded = MemorySystem(ARCH, encoder=HashEncoder(32), route_guards=False, k=2)
    own = fill(guarded)
    assert own not in guarded.retrieve(ELM_NEXT).item_ids
    assert len(guarded.last_trace["other_world"]) == 2 and guarded.last_trace["kept"] == []   # ran as no memory
    scoped = MemorySystem(ARCH, encoder=HashEncoder(32), route_guards=False, k=2, world_scope=True)
    own = fill(scoped)
    assert scoped.retrieve(ELM_NEXT).item_ids == [own]
    assert scoped.last_trace["out_of_scope"] == 3 and scoped.last_trace["other_world"] == []
    assert scoped.retrieve("find the blue pen in the oak chest").item_ids   # a goal naming no world: all in scope
    assert scoped.last_trace["out_of_scope"] == 0


def test_world_scope_travels_with_an_export_and_keys_the_store_only_when_on(tmp_path):
    from routers.automem import load_system, save_system_config
    from train.automem import AutomemTrainConfig, evaluation_settings, system_guards

    save_system_config(tmp_path / "memory_system.json", ARCH, world_scope=True)
    assert load_system(tmp_path / "memory_system.json", encoder=HashEncoder(32)).world_scope is True
    off = AutomemTrainConfig(output_dir=str(tmp_path / "s"))
    on = AutomemTrainConfig(output_dir=str(tmp_path / "s"), memory_world_scope=True)
    assert system_guards(on)["world_scope"] is True and system_guards(off)["world_scope"] is False
    assert "memory_world_scope" not in evaluation_settings(off)   # the runs before it keep their store keys
    assert evaluation_settings(on) == {**evaluation_settings(off), "memory_world_scope": True}
