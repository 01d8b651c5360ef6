"""``guards_first``: every guard applied to the pool before ranking, so the k retrieval slots go to units that pass
(after ranking, each withheld unit is a lost slot); and the held-out replay of named architectures
(``memroute eval automem --archs``) that measures such an option on a search's picks without the search."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from memagent_provider_fakes import HashEncoder, acted as _traj  # noqa: E402
from test_automem_world import VaultWorld, fake_builder, scripted_evaluator  # noqa: E402

from routers.automem import Arch, MemorySystem, TaskResult, scope  # noqa: E402

ARCH = Arch(("trajectory",), "hybrid", "hybrid", "lightweight")
GOAL = "In Elm, find the blue pen in the oak chest and put it on the table in the hall."


def _fill(mem) -> str:
    """Three look-alikes the guards withhold (two place the blue pen elsewhere: stale; one's route leads to the
    wardrobe: off_route) and the one unit whose route goes where the goal sends the agent; returns its id."""
    for item, where in (("blue pen", "cupboard"), ("blue pen", "drawer"), ("blue pencil", "wardrobe")):
        g = f"In Elm, find the {item} in the {where} and put it on the table in the hall."
        mem.store(_traj(g, ["go east", f"take {item} from {where}", "go west", f"put {item} on table"]))
    mem.store(_traj("In Elm, find the red cup in the oak chest and put it on the shelf.",
                    ["go north", "take red cup from oak chest", "go south", "put red cup on shelf"]))
    return next(u for u, it in mem.items_by_id().items() if "oak chest" in it.meta.get("route_to", ()))


def test_guards_first_gives_the_k_slots_to_units_that_pass():
    after = MemorySystem(ARCH, encoder=HashEncoder(32), k=2)
    own = _fill(after)
    assert after.retrieve(GOAL).item_ids == []   # the look-alikes take both slots, the guards empty them
    withheld = sum(len(after.last_trace[g]) for g in ("stale", "off_route", "other_world", "other_site"))
    assert withheld == 2 and after.last_trace["kept"] == [] and "guarded_out" not in after.last_trace

    first = MemorySystem(ARCH, encoder=HashEncoder(32), k=2, guards_first=True)
    own = _fill(first)
    assert first.retrieve(GOAL).item_ids == [own]
    assert first.last_trace["guarded_out"] == {"stale": 2, "off_route": 1}
    assert first.last_trace["retrieved"] == [own] and first.last_trace["stale"] == []
    first.retrieve("find the blue pen")   # a goal that places nothing: no guard fires, every unit competes
    assert first.last_trace["guarded_out"] == {} and len(first.last_trace["retrieved"]) == 2


def test_guards_first_with_the_guards_off_changes_nothing():
    plain = MemorySystem(ARCH, encoder=HashEncoder(32), k=2, guards=False, route_guards=False)
    first = MemorySystem(ARCH, encoder=HashEncoder(32), k=2, guards=False, route_guards=False, guards_first=True)
    _fill(plain), _fill(first)
    assert plain.retrieve(GOAL).item_ids == first.retrieve(GOAL).item_ids and first.last_trace["guarded_out"] == {}


def test_a_failure_where_guards_first_withheld_the_whole_pool_is_out_of_scope():
    emptied = {"pool": 3, "retrieved": [], "kept": [], "dropped": [], "guarded_out": {"off_route": 3}}
    assert scope(TaskResult("t", False, failure={"memory": emptied})) == "stale_withheld"
    missed = {**emptied, "guarded_out": {}}   # nothing withheld, nothing retrieved: a retrieval miss, in scope
    assert scope(TaskResult("t", False, failure={"memory": missed})) is None


def test_guards_first_travels_with_an_export_and_keys_the_store_only_when_on(tmp_path):
    from eval.automem import AutomemEvalConfig
    from routers.automem import load_system, save_system_config
    from train.automem import AutomemTrainConfig, evaluation_settings, system_guards

    save_system_config(tmp_path / "memory_system.json", ARCH, guards_first=True)
    assert load_system(tmp_path / "memory_system.json", encoder=HashEncoder(32)).guards_first is True
    for make in (AutomemTrainConfig, AutomemEvalConfig):
        off, on = make(output_dir=str(tmp_path / "o")), make(output_dir=str(tmp_path / "o"), memory_guards_first=True)
        assert system_guards(on)["guards_first"] is True and system_guards(off)["guards_first"] is False
        assert "memory_guards_first" not in evaluation_settings(off)   # the runs before it keep their store keys
        assert evaluation_settings(on) == {**evaluation_settings(off), "memory_guards_first": True}


@pytest.fixture
def vault_jobs(monkeypatch):
    import train.automem as tr_job

    world = VaultWorld(0)
    world.tasks_by_split["heldout"] = world.tasks("test")
    built: list = []
    monkeypatch.setattr(tr_job, "build_evaluator", fake_builder(world, built))
    return world, built


def test_named_architectures_are_played_held_out_without_a_search(tmp_path, vault_jobs):
    import eval.automem as ev_job
    from routers.automem.evaluate import run_evaluation

    world, built = vault_jobs
    keys = ["trajectory|vector|mmr|lightweight", "workflow|json|hybrid|json_full"]
    out = tmp_path / "archs"
    argv = ["--search_dir", str(tmp_path / "no_search_here"), "--output_dir", str(out), "--agent", "random",
            "--archs", *keys]
    res = ev_job.main(argv)
    fresh = scripted_evaluator(world)
    for key in keys:   # each key's number is an independent play of that architecture on the held-out tasks
        expected = run_evaluation(fresh, Arch.parse(key), world.tasks("test"), "test").accuracy
        assert res["archs"][key]["accuracy"] == expected
        assert res["archs"][key]["gain"] == pytest.approx(expected - res["no_memory"]["accuracy"])
    none = res["no_memory"]["accuracy"]   # the scouts (9 of 15) need no memory; no unlock opens without it
    assert res["archs"][keys[0]]["accuracy"] > none == pytest.approx(9 / 15)   # trajectories keep the codes
    assert res["archs"][keys[1]]["accuracy"] == none                          # workflows generalize them away
    assert res["memory_options"]["memory_guards_first"] is False and res["n_test"] == len(world.tasks("test"))
    assert json.loads((out / "results.json").read_text())["archs"] == res["archs"]
    assert (out / "heldout_by_arch.png").stat().st_size > 0
    again = ev_job.main(argv)
    assert built[-1].calls == 0 and again["archs"] == res["archs"]   # a rerun replays every evaluation


def test_a_bad_architecture_key_is_named_before_anything_is_built(tmp_path, vault_jobs):
    import eval.automem as ev_job

    _, built = vault_jobs
    for bad, why in (("trajectory|vector|mmr", "not an architecture key"), ("trajectory|nosuch|mmr|lightweight",
                                                                          "nosuch")):
        with pytest.raises(ValueError, match=why):
            ev_job.main(["--output_dir", str(tmp_path / "x"), "--agent", "random", "--archs", bad])
    assert built == []
