"""Counterfactual Begin probes (eval.memagent_cues): which cue a router reads on the persistent-world suite."""

import json

import pytest

from eval.memagent_cues import counterfactual_begin, counterfactual_goals, parse_goal, validate_task_meta
from routers.io import read_jsonl
from routers.memagent.worlds import WorldConfig, build_suite, goal_text


def test_parse_goal_reads_every_goal_the_suite_writes():
    worlds, tasks = build_suite(WorldConfig(n_seen=3, n_unseen=1, train_moved=1))
    names = {w.world_id: w.name for w in worlds}
    for t in tasks:
        assert parse_goal(t.goal) == {"world": names[t.world_id], "object": t.object, "holder": t.holder}
        assert parse_goal(f"Procedure for: {t.goal} You've just finished") == parse_goal(t.goal)
    assert parse_goal(goal_text(worlds[0], "red cup"))["holder"] is None
    assert parse_goal("Procedure for: In Harbor House, find the red c") is None  # a preview cut mid-goal


def _record(tid, family, obj, holder, memory, moved_to=None):
    goal = f"In Oak Hall, find the {obj} in the {holder} and put it on the table in the foyer."
    meta = {"family": family, "object": obj, "holder": holder,
            "moved": {"object": obj, "from": "chest", "to": moved_to} if moved_to else None}
    previews = [{"provider": "memp", "score": 0.7, "snippet": f"Procedure for: {memory}"},
                {"provider": "voyager", "score": 0.2, "snippet": "Similar task: nothing quoted"}]
    return tid, {"task_id": tid, "goal": goal, "previews": previews, "task": {"meta": meta}}


HELDOUT = dict([
    # a new goal at the remembered site: the memory's route is right
    _record("f1", "fetch", "blue cup", "chest",
            "In Oak Hall, find the red cup in the chest and put it on the table in the foyer."),
    # the remembered object now lies in a hub container: the memory is stale
    _record("m1", "moved", "red cup", "cupboard",
            "In Oak Hall, find the red cup in the chest and put it on the table in the foyer.", moved_to="cupboard"),
    # an unseen world: the preview quotes another world, nothing to compare with
    _record("u1", "fetch", "gold key", "coffer",
            "In Elm Lodge, find the iron key in the locker and put it on the table in the foyer."),
])


def test_counterfactual_goals_edit_the_container_or_the_object():
    probes = {p["probe"]: p for p in counterfactual_goals(HELDOUT)}
    assert sorted(probes) == [
        "fetch (remembered container): as is", "fetch (remembered container): container -> hub",
        "fetch (remembered container): object -> remembered",
        "moved (other container): as is", "moved (other container): container -> remembered",
        "moved (other container): container -> unseen name"]
    assert probes["fetch (remembered container): container -> hub"]["goal"].startswith(
        "In Oak Hall, find the blue cup in the cupboard and put")
    assert "find the red cup in the chest" in probes["fetch (remembered container): object -> remembered"]["goal"]
    assert "find the red cup in the chest" in probes["moved (other container): container -> remembered"]["goal"]
    assert "find the red cup in the sack" in probes["moved (other container): container -> unseen name"]["goal"]
    assert [p["expect_memory"] for p in probes.values()] == [True, False, True, False, True, False]
    assert all(p["task_id"] != "u1" for p in probes.values())


class ComparesContainers:
    """memp when the goal names the container the top preview remembers, else no memory."""

    def begin(self, goal, previews, providers):
        return "memp" if parse_goal(goal)["holder"] == parse_goal(previews[0]["snippet"])["holder"] else None


class ReadsTheObject:
    """The shortcut: no memory when the goal names the remembered object, else memp (right on the unedited suite)."""

    def begin(self, goal, previews, providers):
        return None if parse_goal(goal)["object"] == parse_goal(previews[0]["snippet"])["object"] else "memp"


def test_agreement_tells_a_container_comparing_router_from_an_object_shortcut():
    providers = {"memp": object(), "voyager": object()}
    good = counterfactual_begin(ComparesContainers(), HELDOUT, providers)
    assert good["decisions"] == 6 and good["agreement"] == 1.0
    assert good["probes"]["fetch (remembered container): container -> hub"] == {
        "n": 1, "expect_memory": False, "choices": {"None": 1}, "uses_memory": 0.0, "changed": 1.0}
    assert good["probes"]["fetch (remembered container): object -> remembered"]["changed"] == 0.0

    bad = counterfactual_begin(ReadsTheObject(), HELDOUT, providers)
    # right on both unedited goals, wrong on every edit but "moved: container -> unseen name"
    assert bad["agreement"] == round(3 / 6, 4)
    assert bad["probes"]["fetch (remembered container): as is"]["uses_memory"] == 1.0
    assert bad["probes"]["moved (other container): as is"]["uses_memory"] == 0.0
    assert bad["probes"]["fetch (remembered container): container -> hub"]["changed"] == 0.0
    assert bad["probes"]["fetch (remembered container): object -> remembered"]["changed"] == 1.0


def test_a_task_record_without_meta_names_file_and_line(tmp_path):
    path = tmp_path / "tasks.jsonl"
    good = HELDOUT["f1"]
    broken = {**good, "task_id": "f2", "task": {"meta": {"family": "fetch", "object": "blue cup"}}}
    path.write_text(json.dumps(good) + "\n" + json.dumps(broken) + "\n")
    with pytest.raises(ValueError, match=r"tasks\.jsonl:2.*task\.meta\.holder"):
        list(read_jsonl(path, validate=validate_task_meta))


def test_eval_runs_the_probes_on_a_worlds_exploration_only(tmp_path):
    from types import SimpleNamespace

    from eval.memagent import MemAgentEvalConfig, _counterfactual

    (tmp_path / "heldout").mkdir()
    lines = [json.dumps(r) for r in HELDOUT.values()]
    (tmp_path / "heldout" / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    ctx = SimpleNamespace(providers={"memp": object(), "voyager": object()})
    cfg = MemAgentEvalConfig(exploration_dir=str(tmp_path))
    (tmp_path / "resolved_config.yaml").write_text("env: textworld\n")
    assert _counterfactual(cfg, ComparesContainers(), ctx) is None  # other environments: no goals to edit
    (tmp_path / "resolved_config.yaml").write_text("env: textworld_worlds\n")
    assert _counterfactual(cfg, ComparesContainers(), ctx)["agreement"] == 1.0
    (tmp_path / "heldout" / "tasks.jsonl").write_text(lines[0] + "\n" + json.dumps({**HELDOUT["m1"], "task": {}}) + "\n")
    with pytest.raises(ValueError, match=r"heldout/tasks\.jsonl:2.*task\.meta"):
        _counterfactual(cfg, ComparesContainers(), ctx)
