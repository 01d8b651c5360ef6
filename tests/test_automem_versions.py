"""The trajectory unit keeps its whole route, and a changed unit rule does not replay results recorded with the old
one (evaluations are replayed by architecture: ``routers.automem.trace``)."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from test_automem_world import make_evaluator  # noqa: E402

from routers.automem import Arch, run_random  # noqa: E402
from routers.automem.encoders import UNIT_VERSIONS, rule_trajectory, versioned_key  # noqa: E402
from routers.automem.trace import EvaluationStore, _digest  # noqa: E402
from routers.memagent.protocol import Task, Trajectory, TrajectoryStep  # noqa: E402
from routers.memagent.providers.text_limits import count_words, render_trajectory  # noqa: E402

ACTIONS = ["go north", "go east", "open coffer", "take silver ladle from coffer", "go west", "go south"]


def _route(obs_words: int = 10) -> Trajectory:
    steps = [TrajectoryStep(i, " ".join(f"o{i}w{k}" for k in range(obs_words)), a) for i, a in enumerate(ACTIONS)]
    return Trajectory(Task("t0", "find the silver ladle"), steps, success=True)


def test_keep_actions_drops_observations_not_steps():
    traj = _route()
    # head 7 words, six action lines 33, 10-word observations: 60 words leave room for two observations
    text = render_trajectory(traj, 60, obs_words=10, keep_actions=True)
    obs = [s.observation for s in traj.steps]
    assert text == "\n".join(["Task: find the silver ladle", "Outcome: success",
                              f"Step 0: > go north\n{obs[0]}", "Step 1: > go east", "Step 2: > open coffer",
                              "Step 3: > take silver ladle from coffer", "Step 4: > go west",
                              f"Step 5: > go south\n{obs[5]}"])
    assert count_words(text) == 60
    # the default render keeps whole steps from both ends: the take in the middle is gone
    legacy = render_trajectory(traj, 60, obs_words=10)
    assert legacy == "\n".join(["Task: find the silver ladle", "Outcome: success", f"Step 0: > go north\n{obs[0]}",
                                f"Step 1: > go east\n{obs[1]}", "... (3 steps omitted) ...",
                                f"Step 5: > go south\n{obs[5]}"])
    # nothing is dropped when everything fits, in either mode
    assert render_trajectory(traj, 900, keep_actions=True) == render_trajectory(traj, 900)


def test_the_trajectory_unit_holds_every_action_of_a_long_route():
    (unit,) = rule_trajectory(_route(obs_words=40))
    assert unit.text.splitlines()[2] == "Actions: " + "; ".join(ACTIONS)
    assert count_words(unit.text) <= 160


def test_versioned_key_names_only_changed_unit_types():
    with_traj = Arch(("insight", "trajectory"), "graph", "cbr_rerank", "graph_consolidate")
    without = Arch(("workflow",), "json", "cbr_rerank", "json_full")
    assert UNIT_VERSIONS["trajectory"] == 3
    assert versioned_key(with_traj) == with_traj.key + "@trajectory.v3"
    assert versioned_key(without) == without.key


def test_results_recorded_with_an_older_rule_are_not_replayed(tmp_path, monkeypatch):
    """A store and a trace written before the trajectory rule changed: its trajectory architectures are played
    again, every other architecture still replays."""
    import routers.automem.encoders as encoders

    world, inner = make_evaluator(0)
    S, V = world.tasks("search"), world.tasks("validation")
    calls = []

    def counting(arch, tasks):
        calls.append(arch.key if arch is not None else None)
        return inner(arch, tasks)

    monkeypatch.setattr(encoders, "UNIT_VERSIONS", {})  # the code before versions
    old = run_random(counting, S, V, budget=8, seed=0, trace_path=tmp_path / "r.json")
    played = {p["arch"] for p in old["evaluations"]}
    assert any("trajectory" in a for a in played) and any("trajectory" not in a for a in played)
    monkeypatch.undo()
    calls.clear()
    run_random(counting, S, V, budget=8, seed=0, trace_path=tmp_path / "r.json")
    assert calls and all(a is not None and "trajectory" in a.split("|")[0] for a in calls)
    # the shared store: a record under the unversioned key (how it was written before) replays only without trajectory
    store = EvaluationStore(tmp_path / "evaluations.jsonl", {"env": "vault"})
    for arch in (Arch(("trajectory",), "json", "hybrid", "lightweight"), Arch(("tip",), "json", "hybrid", "lightweight")):
        store.records[_digest([store.settings, arch.key, [t.task_id for t in S]])] = {
            "arch": arch.key, "batch": "search", "results": [], "failed": False}
    assert store.get(Arch(("trajectory",), "json", "hybrid", "lightweight"), S) is None
    assert store.get(Arch(("tip",), "json", "hybrid", "lightweight"), S) is not None


def test_records_of_an_older_evaluator_replay_for_random_search_but_not_for_the_diagnosis(tmp_path):
    """A store written before failures recorded ``evidence_followed``: random search (accuracy only) replays it,
    AutoMem plays its search-batch memory evaluations again (its diagnosis reads the new fields) and both then
    replay the new record; the old record stays in the file."""
    from routers.automem import run_automem
    from routers.automem.evaluate import RECORD_VERSION

    world, inner = make_evaluator(0)
    S, V = world.tasks("search"), world.tasks("validation")
    path = tmp_path / "evaluations.jsonl"
    store = EvaluationStore(path, {"env": "vault"})
    run_random(inner, S, V, budget=4, seed=0, store=store)
    # rewrite every record as an old evaluator wrote it: under its bare key
    old = {k.split(":r")[0]: v for k, v in store.records.items()}
    path.write_text("".join(json.dumps({"id": k, "evaluation": v}) + "\n" for k, v in old.items()))
    assert RECORD_VERSION >= 2 and all(":r" not in k for k in old)
    calls = []

    def counting(arch, tasks):
        calls.append((arch.key if arch is not None else None, tuple(t.task_id for t in tasks) == tuple(
            t.task_id for t in S)))
        return inner(arch, tasks)

    again = run_random(counting, S, V, budget=4, seed=0, store=EvaluationStore(path, {"env": "vault"}))
    assert calls == [] and again["shared"] > 0
    store = EvaluationStore(path, {"env": "vault"})
    a = run_automem(counting, S, V, budget=4, k=2, seed=0, store=store)
    stored = {(v["arch"], v["batch"] == "search") for v in old.values()}
    # played again: the stored memory evaluations of the search batch; replayed: the baselines and validations
    overlap = {(p["arch"], True) for p in a["evaluations"]} & stored
    assert overlap and overlap <= set(calls)            # the seeded round 1 random search had played, for one
    assert a["shared"] > 0 and (None, True) not in calls
    arch = Arch.parse(next(arch for arch, on_search in calls if on_search))
    assert store.get(arch, S) is not None and store.get(arch, S, RECORD_VERSION) is not None
    reopened = EvaluationStore(path, {"env": "vault"})
    assert len(reopened.records) == len(old) + len(calls)
    calls.clear()
    run_automem(counting, S, V, budget=4, k=2, seed=0, store=reopened)
    assert calls == []


def test_each_stored_evaluation_says_where_it_was_played_and_older_records_say_nothing(tmp_path, monkeypatch):
    """Greedy rollouts repeat on one CPU only (a held-out result of one architecture differed by 3 of 42 tasks
    between two machines), so a replayed number must carry the machine it came from."""
    import routers.automem.trace as trace
    from routers.machine import machine_info, played_on

    world, inner = make_evaluator(0)
    S, V = world.tasks("search"), world.tasks("validation")
    path = tmp_path / "evaluations.jsonl"
    store = EvaluationStore(path, {"env": "vault"})
    run_random(inner, S, V, budget=2, seed=0, store=store)
    here = played_on()
    assert "torch" in here and machine_info()["cpu_model"] in here
    assert store.played_on(None, S) == here
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines and all(r["played_on"] == here for r in lines)
    # a record played elsewhere replays with that machine's name; one written before provenance with None
    monkeypatch.setattr(trace, "played_on", lambda: "Other CPU [avx2]; torch 2.0")
    other = EvaluationStore(tmp_path / "other.jsonl", {"env": "vault"})
    other.put(None, S, store.get(None, S))
    reopened = EvaluationStore(tmp_path / "other.jsonl", {"env": "vault"})
    assert reopened.played_on(None, S) == "Other CPU [avx2]; torch 2.0"
    bare = [{k: v for k, v in r.items() if k != "played_on"} for r in lines]
    path.write_text("".join(json.dumps(r) + "\n" for r in bare))
    old = EvaluationStore(path, {"env": "vault"})
    assert old.get(None, S) is not None and old.played_on(None, S) is None
    assert old.played_on(Arch.parse("workflow|json|hybrid|json_full"), S) is None  # never played: None too


def test_cpu_model_reads_the_model_name_and_the_flags_that_change_kernels(monkeypatch):
    import builtins
    import io

    import routers.machine as machine

    cpuinfo = "processor\t: 0\nmodel name\t: Some EPYC 9999\nflags\t\t: fpu sse avx2 fma avx512f amx_tile\n"
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: io.StringIO(cpuinfo) if p == "/proc/cpuinfo"
                        else real_open(p, *a, **k))
    machine.cpu_model.cache_clear()
    try:
        assert machine.cpu_model() == "Some EPYC 9999 [avx2 fma avx512f amx_tile]"
    finally:
        monkeypatch.undo()
        machine.cpu_model.cache_clear()


def test_a_tight_injection_limit_still_hands_the_agent_the_way_back():
    """v3 (session 43): at 60 injected words the v2 render reached the agent as the goal, ``Step 0: > go north`` and
    that room's description; the agent took the object and never found the way back. The whole action line now comes
    right after the goal, and the copy prior reads it as the route, in order."""
    from memagent_provider_fakes import HashEncoder

    from routers.automem import MemorySystem
    from routers.memagent.copy_prior import remembered_commands

    room = ("-= Pantry =- You find yourself in a pantry. A typical one. You bend down to tie your shoe. When you stand "
            "up, you notice a shelf. The shelf appears to be empty. There is an exit to the north and one to the west.")
    acts = ["go north", "go east", "go east", "go north", "take green wrench from basket", "go south", "go west",
            "go west", "go south", "put green wrench on table"]
    goal = "In Maple Cottage, find the green wrench and put it on the table in the kitchen."
    traj = Trajectory(Task("t-wrench", goal), [TrajectoryStep(i, room, a) for i, a in enumerate(acts)], success=True)
    for facts in (False, True):
        mem = MemorySystem(Arch(("trajectory",), "hybrid", "hybrid", "lightweight"), encoder=HashEncoder(), k=1,
                           max_words=60, trajectory_facts=facts)
        mem.store(traj)
        text = mem.retrieve("In Maple Cottage, find the white chisel and put it on the table in the kitchen.").text
        assert count_words(text) <= 60
        assert [" ".join(c) for c in remembered_commands(text) if c[0] in ("go", "take", "put")] == acts
