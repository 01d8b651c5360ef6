"""The site guard: a unit written from a failed episode (its ``insight``, its ``trajectory``) is withheld when the goal
seeks nothing where the failed task did (another site's dead end is no advice); its option travels with the others
(tests/test_automem_guards.py)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from memagent_provider_fakes import HashEncoder, acted as _traj  # noqa: E402

from routers.automem import Arch, MemorySystem, TaskResult, scope  # noqa: E402
from routers.automem.guards import other_site  # noqa: E402

CHEST = "In Elm, find the red cup in the oak chest and put it on the table in the hall."
CHEST_NEXT = "In Elm, find the blue pen in the oak chest and put it on the table in the hall."
SHELF = "In Elm, find the green mug in the pine shelf and put it on the table in the hall."
ARCH = Arch(("insight", "trajectory"), "hybrid", "hybrid", "lightweight")


def test_other_site_compares_the_sought_places_only():
    assert other_site([["red cup", "oak chest"]], {"green mug": "pine shelf"})
    assert not other_site([["red cup", "the Oak  chest"]], {"blue pen": "oak chest"})   # same site, other item
    assert not other_site([], {"green mug": "pine shelf"}) and not other_site([["red cup", "oak chest"]], {})
    assert not other_site([["red cup", "oak chest"], ["pen", "pine shelf"]], {"green mug": "pine shelf"})


@pytest.mark.parametrize("site_guards", [True, False])
def test_the_site_guard_withholds_a_failure_record_about_another_site(site_guards):
    mem = MemorySystem(ARCH, encoder=HashEncoder(32), site_guards=site_guards, route_guards=False)
    mem.store(_traj(CHEST, ["go east", "go north"], ok=False))
    units = {it.meta["kind"]: uid for uid, it in mem.items_by_id().items()}
    assert set(units) == {"insight", "trajectory"}
    both = sorted(units.values())
    got = mem.retrieve(SHELF)
    assert sorted(mem.last_trace["other_site"]) == (both if site_guards else [])
    assert sorted(set(got.item_ids) & set(both)) == ([] if site_guards else both)
    assert sorted(mem.retrieve(CHEST_NEXT).item_ids) == both and mem.last_trace["other_site"] == []   # same site
    mem.retrieve("In Elm, tidy up.")                    # a goal seeking nothing: nothing fires
    assert mem.last_trace["other_site"] == []


def test_a_success_unit_is_never_held_to_its_site():
    mem = MemorySystem(Arch(("workflow",), "hybrid", "hybrid", "lightweight"), encoder=HashEncoder(32),
                       route_guards=False)
    mem.store(_traj(CHEST, ["go east", "take red cup from oak chest", "go west", "put red cup on table"]))
    (uid,) = mem.items_by_id()
    assert uid in mem.retrieve(SHELF).item_ids and mem.last_trace["other_site"] == []


def test_a_failure_where_only_the_site_guard_withheld_is_out_of_scope():
    withheld = TaskResult("t", False, failure={"memory": {"pool": 2, "retrieved": ["a"], "kept": [], "dropped": [],
                                                          "stale": [], "off_route": [], "other_world": [],
                                                          "other_site": ["a"]}})
    assert scope(withheld) == "stale_withheld"


def test_every_guard_option_of_a_config_reaches_the_memory_system(tmp_path):
    from eval.automem import AutomemEvalConfig
    from train.automem import AutomemTrainConfig, system_guards

    for cfg in (AutomemTrainConfig(output_dir=str(tmp_path / "s"), memory_site_guards=False, memory_guards=False),
                AutomemEvalConfig(output_dir=str(tmp_path / "e"), memory_site_guards=False, memory_guards=False)):
        opts = system_guards(cfg)
        assert opts == {"guards": False, "route_guards": True, "world_guards": True, "site_guards": False,
                        "world_scope": False, "guards_first": False, "trajectory_facts": False,
                        "sought_guards": False}
        mem = MemorySystem(ARCH, encoder=HashEncoder(32), **opts)
        assert {k: mem.params()[k] for k in opts} == opts
