"""avoid_when, route and world guards: the facts a unit carries, the conflicts the injection judge withholds, and the
options that switch them through the exported config and the jobs' settings."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from memagent_provider_fakes import HashEncoder, acted as _traj  # noqa: E402

from routers.automem import Arch, MemorySystem, load_system, save_system_config  # noqa: E402
from routers.automem.guards import conflicts, location_facts, off_route  # noqa: E402

OLD = "In Elm, find the brass key in the oak chest and put it on the table in the hall."
MOVED = "In Elm, find the brass key in the cupboard and put it on the table in the hall."
SIBLING = "In Elm, find the red cup in the oak chest and put it on the table in the hall."
CRATE = "In Elm, find the green lamp in the crate and put it on the table in the hall."
ARCH = Arch(("trajectory",), "hybrid", "hybrid", "lightweight")


def test_location_facts_read_sought_items_not_fixtures():
    assert location_facts(OLD) == {"brass key": "oak chest"}      # "the table in the hall" is no sought item
    assert location_facts(MOVED) == {"brass key": "cupboard"}
    assert location_facts("take brass key from oak chest") == {"brass key": "oak chest"}
    assert location_facts("Get the map from a drawer, then go north.") == {"map": "drawer"}
    assert location_facts("find the key in the box in the attic") == {"key": "box"}
    assert location_facts(OLD, "take brass key from cupboard") == {"brass key": "cupboard"}   # later wins
    assert location_facts("go north", "") == {}


def test_conflicts_name_the_item_and_both_places():
    assert conflicts([["brass key", "oak chest"]], {"brass key": "cupboard"}) == [("brass key", "oak chest",
                                                                                   "cupboard")]
    assert conflicts([["brass key", "oak chest"]], {"brass key": "Oak  Chest"}) == []
    assert conflicts([["brass key", "oak chest"]], {"red cup": "oak chest"}) == []
    assert conflicts(None, {"brass key": "cupboard"}) == [] and conflicts([["a", "b"]], {}) == []


def test_units_carry_avoid_when_from_goal_and_successful_actions():
    mem = MemorySystem(ARCH, encoder=HashEncoder(32))
    mem.store(_traj(OLD, ["go east", "take brass key from oak chest"]))
    mem.store(_traj("find the lamp in the crate", ["take lamp from shelf"], ok=False))   # a failed take: no fact
    units = list(mem.items_by_id().values())
    assert [u.meta["avoid_when"] for u in units] == [[["brass key", "oak chest"]], [["lamp", "crate"]]]


@pytest.mark.parametrize("guards", [True, False])
def test_the_judge_withholds_a_unit_the_goal_contradicts(guards):
    mem = MemorySystem(ARCH, encoder=HashEncoder(32), guards=guards, route_guards=False)
    mem.store(_traj(OLD, ["go east", "take brass key from oak chest", "go west", "put brass key on table"]))
    (uid,) = mem.items_by_id()
    moved = mem.retrieve(MOVED)
    assert mem.last_trace["stale"] == ([uid] if guards else [])
    assert (moved.text == "") is guards and moved.item_ids == ([] if guards else [uid])
    sibling = mem.retrieve(SIBLING)                  # same chest, another item: the route is what it needs
    assert sibling.item_ids == [uid] and "take brass key from oak chest" in sibling.text
    assert mem.last_trace["stale"] == []


def test_guards_travel_with_the_exported_config(tmp_path):
    save_system_config(tmp_path / "memory_system.json", ARCH, guards=False)
    assert load_system(tmp_path / "memory_system.json", encoder=HashEncoder(32)).guards is False
    assert load_system(tmp_path / "memory_system.json", encoder=HashEncoder(32), guards=True).guards is True
    save_system_config(tmp_path / "default.json", ARCH)
    assert load_system(tmp_path / "default.json", encoder=HashEncoder(32)).guards is True


def test_guards_are_part_of_the_evaluation_key_and_differ_from_an_older_search(tmp_path):
    from eval.automem import AutomemEvalConfig, differing_rollout_options
    import yaml

    from train.automem import AutomemTrainConfig, evaluation_settings

    on = AutomemTrainConfig(output_dir=str(tmp_path / "s"))
    off = AutomemTrainConfig(output_dir=str(tmp_path / "s"), memory_guards=False)
    assert evaluation_settings(on) != evaluation_settings(off)
    (tmp_path / "resolved_config.yaml").write_text(yaml.safe_dump({"env": "textworld", "memory_k": 3}))  # before guards
    ev = AutomemEvalConfig(search_dir=str(tmp_path), output_dir=str(tmp_path / "e"), env="textworld")
    assert differing_rollout_options(ev, tmp_path) == {"memory_guards": (False, True),
                                                       "memory_route_guards": (False, True),
                                                       "memory_world_guards": (False, True),
                                                       "memory_site_guards": (False, True)}
    ev_off = AutomemEvalConfig(search_dir=str(tmp_path), output_dir=str(tmp_path / "e"), env="textworld",
                               memory_guards=False, memory_route_guards=False, memory_world_guards=False,
                               memory_site_guards=False)
    assert differing_rollout_options(ev_off, tmp_path) == {}


def test_a_failure_where_the_guards_withheld_everything_is_out_of_scope():
    from routers.automem import TaskResult, classify, scope

    withheld = TaskResult("t", False, failure={"memory": {"pool": 2, "retrieved": ["a"], "kept": [], "dropped": [],
                                                          "stale": ["a"]}})
    assert scope(withheld) == "stale_withheld"
    judged = TaskResult("t", False, failure={"memory": {"pool": 2, "retrieved": ["a", "b"], "kept": [],
                                                        "dropped": ["b"], "stale": ["a"]}})
    assert scope(judged) is None and classify(judged) == "judge_rejected"   # the judge's own drop still counts


def test_off_route_names_the_goals_place_and_the_routes_places():
    assert off_route(["oak chest"], {"brass key": "cupboard"}) == [("brass key", "cupboard", ("oak chest",))]
    assert off_route(["oak chest", "Crate"], {"brass key": "the crate"}) == []
    assert off_route(["oak chest"], {"brass key": "oak chest"}) == []                    # a sibling's route: on it
    assert off_route([], {"brass key": "cupboard"}) == [] and off_route(None, {"a": "b"}) == []   # no route known
    assert off_route(["oak chest"], {}) == []                                            # the goal names no place


def test_only_a_successful_trajectory_has_a_route():
    mem = MemorySystem(ARCH, encoder=HashEncoder(32))
    mem.store(_traj(SIBLING, ["go east", "take red cup from oak chest"]))
    mem.store(_traj(CRATE, ["go north", "take green lamp from crate"], ok=False))        # explored, got nowhere
    ok, failed = mem.items_by_id().values()
    assert ok.meta["route_to"] == ["oak chest"] and failed.meta["route_to"] == []
    assert failed.meta["avoid_when"] == [["green lamp", "crate"]]                        # its goal's fact stays


@pytest.mark.parametrize("route_guards", [True, False])
def test_the_route_guard_withholds_units_whose_route_leads_elsewhere(route_guards):
    mem = MemorySystem(ARCH, encoder=HashEncoder(32), route_guards=route_guards, site_guards=False)
    mem.store(_traj(SIBLING, ["go east", "take red cup from oak chest", "go west", "put red cup on table"]))
    mem.store(_traj(CRATE, ["go north", "take green lamp from crate", "go south", "put green lamp on table"]))
    mem.store(_traj("In Elm, find the silver coin in the drawer and put it on the table in the hall.",
                    ["go east", "go north"], ok=False))   # failed: no route, never off it (the site guard's)
    cup, lamp, explored = mem.items_by_id()
    moved = mem.retrieve(MOVED)                  # the brass key now in the cupboard: neither route goes there
    assert mem.last_trace["stale"] == []          # no unit placed the brass key: the item guard has nothing to say
    assert sorted(mem.last_trace["off_route"]) == (sorted([cup, lamp]) if route_guards else [])
    assert (cup in moved.item_ids, lamp in moved.item_ids) == (not route_guards, not route_guards)
    assert explored in moved.item_ids
    mem.retrieve(OLD)                            # the brass key in the oak chest: the red cup's route is the way
    assert sorted(mem.last_trace["off_route"]) == ([lamp] if route_guards else [])
    assert cup in mem.last_trace["kept"]


@pytest.mark.parametrize("option", ["route_guards", "world_guards", "site_guards"])
def test_later_guards_travel_and_key_only_when_on(tmp_path, option):
    import yaml

    from eval.automem import AutomemEvalConfig, differing_rollout_options
    from train.automem import AutomemTrainConfig, evaluation_settings

    name = f"memory_{option}"
    save_system_config(tmp_path / "memory_system.json", ARCH, **{option: False})
    assert getattr(load_system(tmp_path / "memory_system.json", encoder=HashEncoder(32)), option) is False
    save_system_config(tmp_path / "default.json", ARCH)
    assert getattr(load_system(tmp_path / "default.json", encoder=HashEncoder(32)), option) is True
    on = evaluation_settings(AutomemTrainConfig(output_dir=str(tmp_path / "s")))
    off = evaluation_settings(AutomemTrainConfig(output_dir=str(tmp_path / "s"), **{name: False}))
    assert name not in off and on == {**off, name: True}   # the keys of runs before the guard stay valid
    (tmp_path / "resolved_config.yaml").write_text(yaml.safe_dump({"env": "textworld", "memory_guards": True}))
    ev = AutomemEvalConfig(search_dir=str(tmp_path), output_dir=str(tmp_path / "e"), env="textworld")
    assert differing_rollout_options(ev, tmp_path) == {"memory_route_guards": (False, True),
                                                       "memory_world_guards": (False, True),
                                                       "memory_site_guards": (False, True)}
    ev_off = AutomemEvalConfig(search_dir=str(tmp_path), output_dir=str(tmp_path / "e"), env="textworld",
                               memory_route_guards=False, memory_world_guards=False, memory_site_guards=False)
    assert differing_rollout_options(ev_off, tmp_path) == {}


def test_a_failure_where_the_route_guard_withheld_everything_is_out_of_scope():
    from routers.automem import TaskResult, scope

    withheld = TaskResult("t", False, failure={"memory": {"pool": 2, "retrieved": ["a", "b"], "kept": [],
                                                          "dropped": [], "stale": ["a"], "off_route": ["b"]}})
    assert scope(withheld) == "stale_withheld"
    only = TaskResult("t", False, failure={"memory": {"retrieved": ["b"], "kept": [], "dropped": [],
                                                      "stale": [], "off_route": ["b"]}})
    assert scope(only) == "stale_withheld"
