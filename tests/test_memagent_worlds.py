"""The persistent-world task families (routers.memagent.worlds*): determinism, budgets, splits, the changed-world
family, the manifest's validation, failed compiles recorded as failed rollouts, the env wiring and the probe.

Most tests never compile (a fake ``compile_fn`` writes a placeholder file); ``test_real_games_*`` compile a
tiny suite with TextWorld (~2 s a game) and play it.
"""

from __future__ import annotations

import json
import math

import pytest

from routers.memagent.agent import RandomCommandAgent, WalkthroughAgent, run_episode
from routers.memagent.protocol import Trajectory, TrajectoryStep, Task
from routers.memagent.rollout import (RolloutConfig, RolloutContext, RolloutJob, build_env, exploration_record,
                                      world_config)
from routers.memagent.worlds import (SPARE_NOUNS, CUPBOARD, TARGET, UNSEEN_SEED_OFFSET, WorldConfig, build_suite, make_world,
                                     step_budget, task_placement, walkthrough)
from routers.memagent.worlds_env import WorldManifestError, WorldSuite, load_manifest
from routers.memagent.worlds_probe import memory_text, select_tasks, summarize

TINY = dict(n_seen=2, n_unseen=1, n_rooms=6, n_sites=2, site_objects=2, n_moved=1)


def fake_compile(world, task, path):
    with open(path, "w") as f:
        f.write(task.task_id)
    return {}


def suite(tmp_path, compile_fn=fake_compile, **kw):
    return WorldSuite(tmp_path / "games", WorldConfig(**{**TINY, **kw}), compile_fn=compile_fn)


# -- worlds: determinism, shared maps, budgets -------------------------------------------------------------------
def test_same_seed_same_world_and_different_seeds_differ():
    cfg = WorldConfig(**TINY)
    assert make_world(cfg, 3).to_dict() == make_world(cfg, 3).to_dict()
    assert make_world(cfg, 3).to_dict() != make_world(cfg, 4).to_dict()
    a, b = build_suite(cfg), build_suite(cfg)
    assert [w.to_dict() for w in a[0]] == [w.to_dict() for w in b[0]]
    assert [t.to_dict() for t in a[1]] == [t.to_dict() for t in b[1]]


def test_tasks_of_a_world_share_its_map_and_sites():
    cfg = WorldConfig(**TINY)
    worlds, tasks = build_suite(cfg)
    byid = {w.world_id: w for w in worlds}
    for t in tasks:
        w = byid[t.world_id]
        assert t.walkthrough == walkthrough(w, t.object, t.holder)
        assert t.walkthrough[-1] == f"put {t.object} on {TARGET}" and t.optimal_steps == len(t.walkthrough)
        if t.family == "fetch":
            assert w.objects[t.object] == t.holder and w.depth(t.room) >= cfg.min_site_depth
    # new goals in a seen world: same route as the sibling, only the object differs
    by = {t.task_id: t for t in tasks}
    for t in tasks:
        if t.family == "fetch" and t.sibling:
            sib = by[t.sibling]
            assert [c.replace(t.object, "X") for c in t.walkthrough] == [c.replace(sib.object, "X") for c in sib.walkthrough]


def test_step_budget_formula():
    assert step_budget(6) == 8
    assert step_budget(6, 1.0, 0) == 6
    assert step_budget(7, 1.5, 1) == math.ceil(10.5) + 1
    assert step_budget(10, 1.1, 2) == 13        # 11.000000000000002 is not 12
    with pytest.raises(ValueError):
        step_budget(-1)
    cfg = WorldConfig(**TINY, budget_slack=3, train_budget_factor=2.0)
    for t in build_suite(cfg)[1]:
        factor = 2.0 if t.split == "train" else 1.0
        assert t.budget == step_budget(t.optimal_steps, factor, 3)


@pytest.mark.parametrize("bad, field", [(dict(n_sites=6), "n_sites"), (dict(n_moved=3), "n_moved"),
                                        (dict(budget_factor=0.5), "budget_factor"), (dict(n_rooms=1), "n_rooms")])
def test_world_config_errors_name_the_option(bad, field):
    with pytest.raises(ValueError, match=field):
        WorldConfig(**{**TINY, **bad})
    renamed = {"n_sites": "world_sites", "n_moved": "world_moved", "n_rooms": "world_rooms"}.get(field, field)
    opts = {"world_sites": 2, "world_rooms": 6, "world_moved": 1}
    opts.update({renamed: list(bad.values())[0]})
    with pytest.raises(ValueError, match=renamed):
        RolloutConfig(env="textworld_worlds", **opts)


# -- splits and families --------------------------------------------------------------------------------------------
def test_splits_disjoint_and_unseen_worlds_never_in_train():
    cfg = WorldConfig(**TINY)
    worlds, tasks = build_suite(cfg)
    unseen = {w.world_id for w in worlds if w.seed >= cfg.seed + UNSEEN_SEED_OFFSET}
    assert len(unseen) == cfg.n_unseen
    train = [t for t in tasks if t.split == "train"]
    held = [t for t in tasks if t.split == "heldout"]
    assert not {t.task_id for t in train} & {t.task_id for t in held}
    assert len({t.task_id for t in tasks}) == len(tasks)
    assert not {t.world_id for t in train} & unseen
    assert {t.world_id for t in held} >= unseen
    by = {t.task_id: t for t in tasks}
    for t in held:
        if t.world_id in unseen:
            assert t.sibling is None and not t.delivered
        else:
            assert by[t.sibling].split == "train" and by[t.sibling].world_id == t.world_id
            assert by[t.sibling].holder == (t.moved["from"] if t.moved else t.holder)
    assert len(train) == cfg.n_seen * cfg.n_sites
    assert len(held) == (cfg.n_seen * (cfg.n_sites * (cfg.site_objects - 1) + cfg.n_moved)
                         + cfg.n_unseen * cfg.n_sites * cfg.site_objects)


@pytest.mark.parametrize("names_holder", [False, True])
def test_changed_world_family_moves_the_object_under_the_same_goal(names_holder):
    cfg = WorldConfig(**TINY, goal_names_holder=names_holder)
    worlds, tasks = build_suite(cfg)
    byw, by = {w.world_id: w for w in worlds}, {t.task_id: t for t in tasks}
    moved = [t for t in tasks if t.family == "moved"]
    assert len(moved) == cfg.n_seen * cfg.n_moved
    for t in moved:
        w, stale = byw[t.world_id], by[t.sibling]
        assert t.object == stale.object                                # looks the same ...
        if names_holder:  # ... except that the goal names the new container
            assert t.goal == stale.goal.replace(f" in the {stale.holder} ", f" in the {CUPBOARD} ") != stale.goal
        else:
            assert t.goal == stale.goal
        assert task_placement(w, stale)[t.object] == stale.holder != CUPBOARD
        assert task_placement(w, t, t.delivered)[t.object] == CUPBOARD  # but the object is elsewhere
        assert w.holders[CUPBOARD]["room"] == w.hub and t.walkthrough == [f"take {t.object} from {CUPBOARD}",
                                                                         f"put {t.object} on {TARGET}"]
        assert stale.walkthrough[0].startswith("go ")                  # the remembered route leads away


def test_heldout_games_lack_objects_training_episodes_delivered():
    worlds, tasks = build_suite(WorldConfig(**TINY))
    byw = {w.world_id: w for w in worlds}
    train_objs = {t.object for t in tasks if t.split == "train"}
    earlier: dict[str, set] = {}
    for t in tasks:
        placed = task_placement(byw[t.world_id], t, t.delivered)
        if t.split == "train":  # a later training episode no longer finds what earlier ones took away
            gone = earlier.setdefault(t.world_id, set())
            assert set(byw[t.world_id].objects) - set(placed) == gone and t.object in placed
            gone.add(t.object)
        elif t.sibling and t.family == "fetch":
            assert not set(placed) & train_objs and t.object in placed


def test_train_repeats_are_tight_budget_training_visits_with_a_sibling():
    cfg = WorldConfig(**{**TINY, "site_objects": 3, "train_repeats": 1})
    _, tasks = build_suite(cfg)
    _, plain = build_suite(WorldConfig(**{**TINY, "site_objects": 3}))
    train = [t for t in tasks if t.split == "train"]
    repeats = [t for t in train if t.sibling]
    first = {t.task_id: t for t in train if not t.sibling}
    assert len(repeats) == len(first) == len([t for t in plain if t.split == "train"])
    for t in repeats:  # same site as its first visit, played after it, with the held-out budget
        sib = first[t.sibling]
        assert t.holder == sib.holder and sib.object in t.delivered
        assert t.budget == step_budget(t.optimal_steps, cfg.budget_factor, cfg.budget_slack) < sib.budget
    held = [t for t in tasks if t.split == "heldout"]
    assert len(held) == len([t for t in plain if t.split == "heldout"]) - len(repeats)
    assert all(r.object in h.delivered for h in held if h.family == "fetch" and h.sibling for r in repeats
               if r.world_id == h.world_id)
    with pytest.raises(ValueError, match="train_repeats"):
        WorldConfig(**{**TINY, "site_objects": 2, "train_repeats": 2})


def test_demonstrations_flag_first_visits_and_training_moved_tasks_follow_them():
    cfg = WorldConfig(**{**TINY, "site_objects": 3, "train_repeats": 1, "demonstrations": True, "train_moved": 1})
    _, tasks = build_suite(cfg)
    train = [t for t in tasks if t.split == "train"]
    demos = [t for t in train if t.demonstration]
    assert demos == [t for t in train if t.family == "fetch" and t.sibling is None]       # first visits only
    assert len(demos) == cfg.n_seen * cfg.n_sites and not any(t.demonstration for t in tasks if t.split == "heldout")
    moved = [t for t in train if t.family == "moved"]
    assert len(moved) == cfg.n_seen * cfg.train_moved
    by_id = {t.task_id: t for t in tasks}
    for t in moved:  # the next site's first-visit object, now in the cupboard; after that visit; tight budget
        sib = by_id[t.sibling]
        assert sib.demonstration and sib.holder == by_world_sites(cfg, t.world_id)[cfg.n_moved]
        assert t.holder == CUPBOARD and t.object == sib.object and t.object not in t.delivered
        assert train.index(t) > train.index(sib) and not t.demonstration
        assert t.budget == step_budget(t.optimal_steps, cfg.budget_factor, cfg.budget_slack)
    held_moved = [t for t in tasks if t.family == "moved" and t.split == "heldout"]
    assert {by_id[t.sibling].holder for t in held_moved}.isdisjoint({by_id[t.sibling].holder for t in moved})
    plain = build_suite(WorldConfig(**{**TINY, "site_objects": 3, "train_repeats": 1}))[1]
    assert [t.task_id for t in plain] == [t.task_id for t in tasks if t not in moved]  # the rest unchanged
    assert not any(t.demonstration for t in plain)
    with pytest.raises(ValueError, match="train_moved"):
        WorldConfig(**{**TINY, "n_moved": 1, "train_moved": 2})
    with pytest.raises(ValueError, match="world_train_moved"):
        RolloutConfig(env="textworld_worlds", world_sites=2, world_rooms=6, world_moved=1, world_train_moved=2)


def test_moved_objects_rotate_over_the_hub_containers_of_moved_to():
    """With several ``moved_to`` names, no single word in the goal marks the moved family: each moved task's
    object lies in one of them (all in the hub, empty otherwise), the goal names it, and every name is used."""
    to = ["cupboard", "drawer", "hamper"]
    cfg = WorldConfig(**{**TINY, "n_seen": 3, "n_sites": 3, "site_objects": 2, "n_moved": 1, "train_moved": 2,
                         "moved_to": to})
    worlds, tasks = build_suite(cfg)
    by_world = {w.world_id: w for w in worlds}
    moved = [t for t in tasks if t.family == "moved"]
    assert len(moved) == 9 and {t.holder for t in moved} == set(to)
    for w in worlds:
        assert all(w.holders[box] == {"room": w.hub, "kind": "container"} for box in to)
        assert not set(w.objects.values()) & set(to)                            # empty until an object is moved
        mine = [t for t in moved if t.world_id == w.world_id]
        assert len({t.holder for t in mine}) == len(mine) == (3 if w.seed < UNSEEN_SEED_OFFSET else 0)
    for t in moved:
        w = by_world[t.world_id]
        assert t.moved["to"] == t.holder and f"find the {t.object} in the {t.holder} " in t.goal
        assert task_placement(w, t, t.delivered)[t.object] == t.holder
        assert t.walkthrough == [f"take {t.object} from {t.holder}", f"put {t.object} on {TARGET}"]
    assert {t.holder for t in moved if t.split == "heldout"} == set(to)         # held out: every name too
    default = build_suite(WorldConfig(**{**TINY, "n_seen": 3, "n_sites": 3, "site_objects": 2, "train_moved": 2}))
    assert {t.holder for t in default[1] if t.family == "moved"} == {CUPBOARD}
    for bad in ([], ["drawer", "drawer"], ["chest"], [TARGET]):
        with pytest.raises(ValueError, match="moved_to"):
            WorldConfig(**{**TINY, "moved_to": bad})
    with pytest.raises(ValueError, match="world_moved_to"):
        RolloutConfig(env="textworld_worlds", world_moved_to=["shelf"])


def test_unique_objects_one_kind_per_site_and_no_noun_in_two_sites():
    from routers.memagent.worlds import OBJECT_CATEGORIES

    cfg = WorldConfig(train_repeats=1)  # the default suite: 8 worlds x 3 sites x 3 objects
    worlds, _ = build_suite(cfg)
    kind = {noun: cat for cat, nouns in OBJECT_CATEGORIES.items() for noun in nouns}
    site_nouns = [[o.split()[-1] for o, h in w.objects.items() if h == box] for w in worlds for box in w.sites]
    flat = [n for site in site_nouns for n in site]
    assert len(flat) == len(set(flat)) == 8 * 3 * 3                        # no noun in two sites of the suite
    assert all(len({kind[n] for n in site}) == 1 for site in site_nouns)   # a site holds one kind of object
    assert all(len({kind[site[0]] for site in site_nouns[3 * i:3 * i + 3]}) == 3 for i in range(8))
    shared = build_suite(WorldConfig(train_repeats=1, unique_objects=False))[0]  # version 3: one shared noun list
    assert any(o.split()[-1] not in kind for w in shared for o, h in w.objects.items() if h in w.sites)
    with pytest.raises(ValueError, match="unique_objects"):
        WorldConfig(n_seen=21, n_unseen=2)   # 69 sites; the twenty-two kinds hold 66


def test_moved_object_other_moves_an_object_memory_never_saw():
    """``moved_object: other``: a moved task's object is the site's last one (no training task fetched it), so its
    goal names an object the memory does not remember, as a fetch goal does; only the container differs."""
    cfg = WorldConfig(**{**TINY, "site_objects": 3, "train_repeats": 1, "train_moved": 1, "moved_object": "other"})
    worlds, tasks = build_suite(cfg)
    by_id, by_world = {t.task_id: t for t in tasks}, {w.world_id: w for w in worlds}
    moved = [t for t in tasks if t.family == "moved"]
    trained = {t.object for t in tasks if t.split == "train" and t.family == "fetch"}
    assert len(moved) == cfg.n_seen * (cfg.n_moved + cfg.train_moved)
    for t in moved:
        sib, w = by_id[t.sibling], by_world[t.world_id]
        site = [o for o, h in w.objects.items() if h == sib.holder]
        assert t.object == site[-1] != sib.object and t.object not in trained and t.object not in t.delivered
        assert t.moved == {"object": t.object, "from": sib.holder, "to": CUPBOARD}
        assert task_placement(w, t, t.delivered)[t.object] == CUPBOARD and f"the {t.object} in the {CUPBOARD}" in t.goal
    first = build_suite(WorldConfig(**{**TINY, "site_objects": 3, "train_repeats": 1, "train_moved": 1}))[1]
    assert all(t.object == by_id[t.sibling].object for t in first if t.family == "moved")   # the default
    with pytest.raises(ValueError, match="moved_object"):
        WorldConfig(**{**TINY, "moved_object": "last"})
    with pytest.raises(ValueError, match="moved_object 'other'"):
        WorldConfig(**{**TINY, "site_objects": 2, "train_repeats": 1, "moved_object": "other"})


def test_moved_object_spare_names_an_object_no_other_task_names():
    """``moved_object: spare`` (the fix for ``other``, whose moved object was also a held-out fetch task's, so that
    task retrieved the stored moved memory, measured: 18 of 30 held-out fetch tasks misled): each seen site holds
    one extra object, only its moved task names it; the other modes generate the same worlds as before."""
    import json

    base = {**TINY, "site_objects": 3, "train_repeats": 1, "n_sites": 3, "n_moved": 1, "train_moved": 2}
    cfg = WorldConfig(**{**base, "moved_object": "spare"})
    worlds, tasks = build_suite(cfg)
    moved = [t for t in tasks if t.family == "moved"]
    fetched = {t.object for t in tasks if t.family == "fetch"}
    assert len(moved) == cfg.n_seen * cfg.n_sites and len({t.object for t in moved}) == len(moved)
    assert not {t.object for t in moved} & fetched
    assert all(t.object.split()[-1] in SPARE_NOUNS and f"the {t.moved['to']} and" in t.goal for t in moved)
    for w in worlds:  # seen worlds: the site objects + the spare one; the unseen world as in the other modes
        spare = [o for o in w.objects if o.split()[-1] in SPARE_NOUNS]
        assert len(spare) == (cfg.n_sites if w.seed < UNSEEN_SEED_OFFSET else 0)
    plain = [WorldConfig(**{**base, "moved_object": m}) for m in ("first", "other")]
    spare_free = [{o: h for o, h in w.objects.items() if o.split()[-1] not in SPARE_NOUNS} for w in worlds]
    for other in plain:
        assert json.dumps([w.objects for w in build_suite(other)[0]]) == json.dumps(spare_free)
    assert sum(t.family == "fetch" for t in tasks) == sum(t.family == "fetch" for t in build_suite(plain[0])[1])
    with pytest.raises(ValueError, match="spare nouns"):
        WorldConfig(n_seen=23, n_unseen=0, n_sites=3, unique_objects=False, moved_object="spare")  # 69 > 66


def test_added_object_kinds_leave_the_suites_the_first_nine_held_unchanged():
    """Kinds added after generator version 4 only serve suites larger than the first nine kinds hold (27 sites
    of 3): a 9-world suite is generated exactly as before them (digest recorded from version 4's code), and a
    12-world suite still has one kind per site and no noun in two sites."""
    import hashlib

    from routers.memagent.worlds import OBJECT_CATEGORIES

    nine = build_suite(WorldConfig(train_repeats=1, n_seen=7, n_unseen=2))[0]
    digest = hashlib.sha256(json.dumps([sorted(w.objects.items()) for w in nine]).encode()).hexdigest()[:16]
    assert digest == "012b9e18a3183098"
    twelve = build_suite(WorldConfig(train_repeats=1, n_seen=10, n_unseen=2))[0]
    assert [sorted(w.objects.items()) for w in twelve[:7]] == [sorted(w.objects.items()) for w in nine[:7]]
    kind = {noun: cat for cat, nouns in OBJECT_CATEGORIES.items() for noun in nouns}
    site_nouns = [[o.split()[-1] for o, h in w.objects.items() if h == box] for w in twelve for box in w.sites]
    flat = [n for site in site_nouns for n in site]
    assert len(flat) == len(set(flat)) == 12 * 3 * 3 and all(len({kind[n] for n in site}) == 1 for site in site_nouns)
    assert {kind[site[0]] for site in site_nouns} == set(list(OBJECT_CATEGORIES)[:12])   # the first two groups


def by_world_sites(cfg: WorldConfig, world_id: str) -> list[str]:
    return {w.world_id: w.sites for w in build_suite(cfg)[0]}[world_id]


# -- manifest ------------------------------------------------------------------------------------------------------
def test_manifest_written_reused_and_validated(tmp_path):
    s = suite(tmp_path)
    held = s.tasks("heldout")
    path = s.dir / "manifest.json"
    data = json.loads(path.read_text())
    assert data["format"] == "memroute.memagent.worlds" and len(data["tasks"]) == len(held) + len(s.tasks("train"))
    calls = []
    again = suite(tmp_path, compile_fn=lambda *a: calls.append(a))
    assert [t.task_id for t in again.tasks("heldout")] == [t.task_id for t in held] and not calls  # cached
    loaded = WorldSuite(tmp_path / "x", manifest=path, compile_fn=fake_compile)
    assert loaded.config == s.config and len(loaded.tasks("train")) == len(s.tasks("train"))


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["tasks"][1].update(budget=1), "tasks[1].budget"),
    (lambda d: d["tasks"][0].pop("goal"), "tasks[0].goal"),
    (lambda d: d["tasks"][2].update(family="teleport"), "tasks[2].family"),
    (lambda d: d["tasks"][0].update(split="test"), "tasks[0].split"),
    (lambda d: d["tasks"][3].update(world_id="nowhere"), "tasks[3].world_id"),
    (lambda d: d["tasks"][0].update(optimal_steps="6"), "tasks[0].optimal_steps"),
    (lambda d: d["tasks"][4].update(sibling="ghost"), "tasks[4].sibling"),
    (lambda d: d["tasks"][0].update(demonstration="yes"), "tasks[0].demonstration"),
    (lambda d: d["worlds"][0]["objects"].update(thing="nowhere"), "worlds[0].objects"),
    (lambda d: d["config"].update(n_sites=99), "config"),
    (lambda d: d.update(schema_version=7), "schema_version"),
])
def test_manifest_errors_name_file_and_field(tmp_path, edit, field):
    s = suite(tmp_path)
    s.tasks("train")
    path = s.dir / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(WorldManifestError) as err:
        load_manifest(path)
    assert str(path) in str(err.value) and field in str(err.value)
    with pytest.raises(WorldManifestError, match="manifest.json"):
        suite(tmp_path).tasks("train")


def test_manifest_bad_json_names_file(tmp_path):
    p = tmp_path / "manifest.json"
    p.write_text("{not json")
    with pytest.raises(WorldManifestError, match=r"manifest\.json: not valid JSON"):
        load_manifest(p)


# -- failures are recorded, never dropped ----------------------------------------------------------------------------
def test_failed_compile_is_a_failed_rollout_and_is_retried(tmp_path):
    def flaky(world, task, path):
        if task.family == "moved":
            raise RuntimeError("inform7 exploded")
        return fake_compile(world, task, path)

    s = suite(tmp_path, compile_fn=flaky)
    held = s.tasks("heldout")
    broken = [t for t in held if t.meta["compile_error"]]
    assert broken and all(t.meta["family"] == "moved" for t in broken) and len(held) == len(suite(tmp_path).tasks("heldout"))
    traj = run_episode(s, WalkthroughAgent(), broken[0], max_steps=5)
    assert not traj.success and "inform7 exploded" in traj.error
    ctx = RolloutContext(env=s, tasks=[], agent=WalkthroughAgent(), providers={})
    rec = exploration_record(RolloutJob(broken[0], None, "never", "", []), ctx)
    assert rec["success"] is False and "compile" in rec["error"] and rec["steps"] == 0
    fixed = suite(tmp_path)  # the next run compiles what failed
    assert not any(t.meta["compile_error"] for t in fixed.tasks("heldout"))


# -- wiring ---------------------------------------------------------------------------------------------------------
def test_build_env_textworld_worlds(tmp_path):
    cfg = RolloutConfig(env="textworld_worlds", games_dir=str(tmp_path), env_seed=7, worlds_seen=1, worlds_unseen=0,
                        world_rooms=5, world_sites=2, world_site_objects=2, budget_slack=1)
    env = build_env(cfg)
    assert isinstance(env, WorldSuite) and env.config == world_config(cfg) and env.config.seed == 7
    with pytest.raises(ValueError, match="env must be one of"):
        RolloutConfig(env="worlds")


# -- probe helpers ----------------------------------------------------------------------------------------------------
def test_probe_summary_and_selection():
    rows = [{"kind": "fetch", "no_memory": {"success": False, "error": None}, "memory": {"success": True, "error": None}},
            {"kind": "moved", "no_memory": {"success": True, "error": None}, "memory": {"success": False, "error": None}},
            {"kind": "unseen", "no_memory": {"success": False, "error": None}, "memory": {"success": False, "error": None}},
            {"kind": "fetch", "no_memory": {"success": True, "error": None}, "memory": {"success": True, "error": None}}]
    s = summarize(rows)["all"]
    assert (s["no_memory"], s["memory"], s["oracle"], s["gap_points"], s["routing_critical"]) == (0.5, 0.5, 0.75, 25.0, 0.5)
    tasks = [Task(f"t{i}", "g", "heldout", {"family": f, "sibling": sib, "world_id": w}) for i, (f, sib, w) in
             enumerate([("fetch", "a", "w0"), ("fetch", "a", "w0"), ("moved", "a", "w0"), ("fetch", None, "w9"),
                        ("fetch", "b", "w1")])]
    assert [t.task_id for t in select_tasks(tasks)] == ["t0", "t2", "t3", "t4", "t1"]
    assert [t.task_id for t in select_tasks(tasks, ["moved"], 5)] == ["t2"]
    traj = Trajectory(Task("s", "Find it."), [TrajectoryStep(0, "You go.", "go east")], success=True)
    assert memory_text(traj) == "Task: Find it.\nOutcome: success\n> go east"
    assert "You go." in memory_text(traj, "render")


# -- real TextWorld games ---------------------------------------------------------------------------------------------
def test_real_games_share_the_map_and_are_solvable_within_budget(tmp_path):
    pytest.importorskip("textworld")
    from routers.memagent.worlds import compile_task

    cfg = WorldConfig(n_seen=1, n_unseen=0, n_rooms=5, n_sites=1, site_objects=2, n_moved=1)
    worlds, tasks = build_suite(cfg)
    w = worlds[0]
    train, held, moved = tasks
    facts = [compile_task(w, t, str(tmp_path / f"{t.task_id}.z8"))["facts"] for t in (train, held)]
    again = compile_task(w, train, str(tmp_path / "again.z8"))["facts"]
    assert again == facts[0]                                        # same seed -> same game
    rooms_and_exits = [sorted(f for f in fs if f.split("(")[0] in ("north_of", "south_of", "east_of", "west_of", "at"))
                       for fs in facts]
    map_facts = [[f for f in fs if "P" not in f and ": o" not in f] for fs in rooms_and_exits]
    assert map_facts[0] == map_facts[1]                             # different goals, one map
    s = WorldSuite(tmp_path / "games", cfg)
    for task in s.tasks("train") + s.tasks("heldout"):
        ok = run_episode(s, WalkthroughAgent(), task, max_steps=60)
        assert ok.success and len(ok.steps) == task.meta["optimal_steps"] <= task.meta["budget"], task.task_id
        blind = run_episode(s, RandomCommandAgent(0), task, max_steps=60)
        assert len(blind.steps) <= task.meta["budget"]             # the budget ends the episode
    m = [t for t in s.tasks("heldout") if t.meta["family"] == "moved"][0]
    first = s.reset(m)
    assert f"take {m.meta['object']} from {CUPBOARD}" in first.admissible_commands


def test_worlds_recipes_parse():
    from data_synthesis.memagent import ForcedExplorationConfig, make_parser
    from routers.config import parse_config

    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "configs" / "memagent"
    (cfg,) = parse_config(make_parser(), [ForcedExplorationConfig], [str(root / "synth" / "worlds.yaml")])
    assert cfg.env == "textworld_worlds" and world_config(cfg).n_seen == 6
    from eval.memagent import MemAgentEvalConfig, make_parser as eval_parser

    (ecfg,) = parse_config(eval_parser(), [MemAgentEvalConfig], [str(root / "eval" / "worlds.yaml")])
    assert ecfg.exploration_dir == cfg.output_dir


def test_goal_action_space_keeps_moves_and_the_goal_object(tmp_path):
    pytest.importorskip("textworld")
    cfg = WorldConfig(n_seen=1, n_unseen=0, n_rooms=4, n_sites=1, site_objects=2, n_moved=0, min_site_depth=1)
    s = WorldSuite(tmp_path / "games", cfg)
    task = s.tasks("heldout")[0]
    obs = s.reset(task)
    for cmd in task.meta["walkthrough"]:
        assert all(c.startswith("go ") or task.meta["object"] in c for c in obs.admissible_commands)
        assert cmd in obs.admissible_commands
        obs = s.step(cmd)
    assert obs.won
    with pytest.raises(ValueError, match="actions"):
        WorldSuite(tmp_path / "games", cfg, actions="some")


def test_memory_copy_agent_replays_the_route_with_this_tasks_object():
    from routers.memagent.protocol import Observation
    from routers.memagent.worlds_probe import MemoryCopyAgent

    mem = "Task: In X, find the old key and put it on the table in the den.\nOutcome: success\n> go east\n> take old key from box"
    task = Task("t", "g", meta={"object": "red cup"})
    agent = MemoryCopyAgent()
    assert agent.act(task, [], Observation("", ["go west", "go east"]), mem) == "go east"
    step = TrajectoryStep(0, "", "go east")
    assert agent.act(task, [step], Observation("", ["go west", "take red cup from box"]), mem) == "take red cup from box"


def test_forced_exploration_fingerprint_covers_the_world_options():
    """A resume into a worlds exploration with another budget / world setting must be refused: the world options
    are part of the run's fingerprint (and absent for the cooking suite, so its earlier runs still resume)."""
    from data_synthesis.memagent import FINGERPRINT_FIELDS, ForcedExplorationConfig, fingerprint

    worlds = fingerprint(ForcedExplorationConfig(env="textworld_worlds"))
    assert worlds["env"] == "textworld_worlds" and worlds["budget_slack"] == 2
    assert fingerprint(ForcedExplorationConfig(env="textworld_worlds", budget_slack=5)) != worlds
    assert fingerprint(ForcedExplorationConfig(env="textworld_worlds", world_rooms=6)) != worlds
    assert fingerprint(ForcedExplorationConfig(env="textworld_worlds", world_demonstrations=True)) != worlds
    assert set(fingerprint(ForcedExplorationConfig())) == set(FINGERPRINT_FIELDS)
    # world_moved_to: in the fingerprint when set; left out at its default, so runs made before it existed resume
    assert "world_moved_to" not in worlds and "world_moved_object" not in worlds
    assert fingerprint(ForcedExplorationConfig(env="textworld_worlds", world_moved_object="other")) != worlds
    moved = fingerprint(ForcedExplorationConfig(env="textworld_worlds", world_moved_to=["cupboard", "drawer"]))
    assert moved["world_moved_to"] == ["cupboard", "drawer"]


def test_a_worlds_exploration_made_before_world_moved_to_resumes(tmp_path):
    """Its manifest's fingerprint has no world_moved_to: resuming with the default must not be refused."""
    from data_synthesis.memagent import ForcedExplorationConfig, ForcedExplorer, fingerprint
    from routers.memagent.rollout import FORMAT, SCHEMA_VERSION

    cfg = ForcedExplorationConfig(env="textworld_worlds", output_dir=str(tmp_path / "x"))
    old = {k: v for k, v in fingerprint(cfg).items() if k != "world_moved_to"}
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "manifest.json").write_text(json.dumps({"format": FORMAT, "schema_version": SCHEMA_VERSION,
                                                              "fingerprint": old}))
    ForcedExplorer(cfg, env=object(), providers={}, progress=False).check_manifest()          # resumes
    cfg.world_moved_to = ["drawer"]
    with pytest.raises(ValueError, match="world_moved_to"):
        ForcedExplorer(cfg, env=object(), providers={}, progress=False).check_manifest()


def test_probe_refuses_unknown_families():
    """`--families '[fetch]'` (YAML-list syntax on a shell) used to select no task at all, silently."""
    import pytest

    from routers.memagent.worlds_probe import WorldsProbeConfig as ProbeConfig

    with pytest.raises(ValueError, match=r"families: unknown \['\[fetch\]'\]"):
        ProbeConfig(env="textworld_worlds", families=["[fetch]"])
    assert ProbeConfig(env="textworld_worlds", families=["fetch", "moved"]).families == ["fetch", "moved"]


def _suite_digest(cfg) -> str:
    import dataclasses
    import hashlib
    import json

    worlds, tasks = build_suite(cfg)
    blob = json.dumps([[dataclasses.asdict(w) for w in worlds], [dataclasses.asdict(t) for t in tasks]],
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@pytest.mark.parametrize("mode, digest", [
    ("first", "50d785ed81e88172b5bd0d253e3133c35e7d9b671c3567bb98cd26c9df2b53c7"),
    ("spare", "79b75b901b0a16e4be659d18b915b3293b897780092f2d121a156b321f26f7ce")])
def test_measured_suites_are_generated_exactly_as_when_measured(mode, digest):
    """The 10 + 2 world suites of configs/memagent/README.md (vocabulary appended since must not move a noun)."""
    cfg = WorldConfig(n_seen=10, n_unseen=2, moved_object=mode, demonstrations=True, train_moved=2,
                      moved_to=["cupboard", "drawer", "hamper"])
    assert _suite_digest(cfg) == digest


def test_train_unseen_worlds_are_training_tasks_of_the_unseen_kind_and_move_nothing_else():
    """Training tasks with nothing of their own world in memory at the first visit: no sibling, no demonstration,
    the held-out budget, nothing delivered; appended after the other worlds, which stay exactly as they were (same
    tasks, same cache key)."""
    from routers.memagent.worlds_env import suite_key

    base = dict(n_seen=3, n_unseen=1, demonstrations=True, train_moved=1, train_repeats=1)
    old_worlds, old_tasks = build_suite(WorldConfig(**base))
    worlds, tasks = build_suite(WorldConfig(**base, train_unseen=2))
    assert [t.to_dict() for t in tasks[:len(old_tasks)]] == [t.to_dict() for t in old_tasks]
    assert [w.to_dict() for w in worlds[:len(old_worlds)]] == [w.to_dict() for w in old_worlds]
    new = tasks[len(old_tasks):]
    cfg = WorldConfig(**base)
    assert len(new) == 2 * cfg.n_sites * cfg.site_objects and {t.split for t in new} == {"train"}
    assert all(t.sibling is None and not t.demonstration and not t.delivered and t.family == "fetch" for t in new)
    assert all(t.budget == step_budget(t.optimal_steps, cfg.budget_factor, cfg.budget_slack) for t in new)
    assert {w.seed for w in worlds[len(old_worlds):]} == {2 * UNSEEN_SEED_OFFSET, 2 * UNSEEN_SEED_OFFSET + 1}
    assert suite_key(WorldConfig(**base, train_unseen=0)) == suite_key(WorldConfig(**base))
    assert suite_key(WorldConfig(**base, train_unseen=2)) != suite_key(WorldConfig(**base))
    assert RolloutConfig(env="textworld_worlds", worlds_train_unseen=2).worlds_train_unseen == 2
    with pytest.raises(ValueError, match="worlds_train_unseen"):
        RolloutConfig(env="textworld_worlds", worlds_train_unseen=-1)


def test_a_manifest_written_before_train_unseen_existed_still_loads(tmp_path):
    cfg = WorldConfig(**TINY)
    suite = WorldSuite(cache_dir=tmp_path, config=cfg, compile_fn=fake_compile)
    path = suite.dir / "manifest.json"
    suite.manifest()
    data = json.loads(path.read_text())
    del data["config"]["train_unseen"]
    path.write_text(json.dumps(data))
    assert len(WorldSuite(cache_dir=tmp_path, config=cfg, compile_fn=fake_compile).manifest()["tasks"]) == len(
        data["tasks"])


def test_twenty_seen_worlds_keep_every_site_noun_unique():
    cfg = WorldConfig(n_seen=20, n_unseen=2, moved_object="spare", demonstrations=True, train_moved=2,
                      moved_to=["cupboard", "drawer", "hamper"])
    worlds, tasks = build_suite(cfg)
    nouns = [o.split()[-1] for w in worlds for o, h in w.objects.items() if h in w.sites]
    assert len(worlds) == 22 and len(nouns) == len(set(nouns))
    assert len({w.name for w in worlds}) == 22
