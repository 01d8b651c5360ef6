"""AutoMem: the search space, the composable memory systems, diagnosis, ledger, resumable search, and the
planted problem where guided search must beat random search at equal budget."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from memagent_provider_fakes import HashEncoder  # noqa: E402
from test_automem_world import ScriptedAgent, VaultWorld, make_evaluator  # noqa: E402

from routers.automem import (Arch, FAILURE_MODULE, Ledger, MemorySystem, TaskResult, classify, diagnose,  # noqa: E402
                             feasible_space, first_reach, load_system, run_automem, run_random, save_system_config,
                             scope, valid, violations)
from routers.automem.proposer import RuleProposer  # noqa: E402
from routers.automem.trace import TraceMismatch  # noqa: E402
from routers.memagent.protocol import MemoryProvider, Task, Trajectory, TrajectoryStep  # noqa: E402


def _traj(goal, obs, ok=True, action="look"):
    return Trajectory(task=Task(f"t-{goal}", goal), steps=[TrajectoryStep(0, obs, action)], success=ok)


def test_valid_accepts_and_rejects_per_constraints():
    assert valid(Arch(("trajectory", "insight"), "hybrid", "mmr", "json_full"))
    assert valid(Arch(("trajectory",), "llm_graph", "graph", "graph_consolidate"))
    assert valid({"encode": ["workflow"], "store": "vector", "retrieve": "hybrid", "manage": "tool_manager"})
    bad = {Arch(("tip",), "json", "graph", "lightweight"): "graph-family store",
           Arch(("tip",), "vector", "hybrid", "graph_consolidate"): "graph-family store",
           Arch(("tip",), "json", "mmr", "lightweight"): "dense index",
           Arch(("tip",), "graph", "hyde", "lightweight"): "dense index",
           Arch(("tip",), "vector", "hybrid", "json_full"): "keyed records",
           Arch(("tip", "insight"), "json", "hybrid", "tool_manager"): "procedural",
           Arch((), "json", "hybrid", "lightweight"): "at least one",
           Arch(("tips",), "json", "hybrid", "lightweight"): "unknown encode"}
    for arch, why in bad.items():
        assert not valid(arch)
        assert any(why in v for v in violations(arch)), (arch, violations(arch))
    assert not valid("not|an|arch") and not valid(42)
    space = feasible_space()
    assert len(space) == len({a.key for a in space}) > 1000
    assert Arch(("trajectory", "tip"), "json", "hybrid", "lightweight").key == "tip+trajectory|json|hybrid|lightweight"


def _round_trip(arch, enc) -> None:
    mem = MemorySystem(arch, encoder=enc)
    assert isinstance(mem, MemoryProvider)
    mem.store(_traj("scout the vault in room r3", "The display reads: vault r3 code is 4821.", action="look"))
    mem.store(_traj("scout the vault in room r3", "The display reads: vault r3 code is 4821.", action="enter 4821"))
    mem.store(_traj("unlock the strongbox in chamber r3", "Wrong code.", ok=False, action="enter 0000"))
    got = mem.retrieve("scout the vault in room r3")
    assert got.text and got.item_ids, arch
    assert mem.last_trace["pool"] >= 1 and set(got.item_ids) <= set(mem.last_trace["retrieved"])
    mem.retrieve("unlock the strongbox in room r3")       # the judge may drop units; retrieval still ranks
    assert mem.last_trace["retrieved"] and len(mem.last_trace["retrieved"]) <= mem.k, arch
    if "trajectory" in arch.encode:
        assert "4821" in "\n".join(it.text for it in mem.items), arch


def covering_archs() -> list:
    """Every valid (store, retrieve, manage) triple and every valid encode set, each at least once."""
    picked = {}
    for a in feasible_space():
        picked.setdefault(("srm", a.store, a.retrieve, a.manage), a)
        picked.setdefault(("encode", a.encode), a)
    return list(dict.fromkeys(picked.values()))


def test_covering_valid_archs_round_trip_store_retrieve():
    """The default run: a covering subset (88 of the >1,000; the whole space is the slow test below)."""
    enc = HashEncoder(32)
    archs = covering_archs()
    assert len({a.encode for a in archs}) == len({a.encode for a in feasible_space()})
    assert len({(a.store, a.retrieve, a.manage) for a in archs}) == len(
        {(a.store, a.retrieve, a.manage) for a in feasible_space()})
    for arch in archs:
        _round_trip(arch, enc)
    with pytest.raises(ValueError, match="invalid architecture"):
        MemorySystem(Arch(("tip",), "json", "graph", "lightweight"), encoder=enc)


@pytest.mark.slow
def test_every_valid_arch_round_trips_store_retrieve():
    enc = HashEncoder(32)
    for arch in feasible_space():
        _round_trip(arch, enc)


def test_stale_memory_managers_and_exported_config(tmp_path):
    enc = HashEncoder(32)
    stale = Arch(("trajectory",), "vector", "hybrid", "lightweight")     # unit text differs: old code survives
    fresh = Arch(("trajectory",), "json", "hybrid", "json_full")          # one record per source task
    for arch, n in ((stale, 2), (fresh, 1)):
        mem = MemorySystem(arch, encoder=enc)
        mem.store(_traj("scout the vault in room r3", "vault r3 code is 1111."))
        mem.store(_traj("scout the vault in room r3", "vault r3 code is 2222."))
        assert len(mem) == n, arch
    save_system_config(tmp_path / "memory_system.json", fresh, k=2, max_words=50)
    mem = load_system(tmp_path / "memory_system.json", encoder=enc)
    assert mem.arch == fresh and mem.k == 2 and mem.output_limit == 50
    cfg = json.loads((tmp_path / "memory_system.json").read_text())
    cfg["arch"]["retrieve"] = "graph"
    (tmp_path / "bad.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="graph-family"):
        load_system(tmp_path / "bad.json", encoder=enc)


def _fail(**f):
    mem = f.pop("memory", {"pool": 3, "retrieved": ["a"], "kept": ["a"], "dropped": []})
    return TaskResult("t", False, failure={"timeout": False, "memory": mem, **f})


def test_diagnosis_maps_failure_modes_to_modules():
    ev = dict(evidence_seen=True, evidence_in_pool=True, evidence_retrieved=True, evidence_injected=True,
              stale_injected=False, source_units=1)
    cases = {"extraction_gap": _fail(**{**ev, "evidence_in_pool": False, "source_units": 0}),
             "low_quality_extraction": _fail(**{**ev, "evidence_in_pool": False}),
             "retrieval_miss": _fail(**{**ev, "evidence_retrieved": False}),
             "judge_rejected": _fail(**{**ev, "evidence_injected": False},
                                     memory={"pool": 3, "retrieved": ["a", "b"], "kept": ["b"], "dropped": ["a"]}),
             "stale_memory": _fail(**{**ev, "stale_injected": True}),
             "unusable_form": _fail(**{**ev, "evidence_followed": False, "foreign_injected": 0}),
             "declarative_crowding": _fail(**{**ev, "evidence_followed": True, "crowded_by_declarative": True})}
    for mode, r in cases.items():
        assert scope(r) is None and classify(r) == mode
    assert FAILURE_MODULE == {"extraction_gap": "encode", "low_quality_extraction": "encode", "unusable_form": "encode",
                              "declarative_crowding": "encode", "unlinked_evidence": "encode",
                              "retrieval_miss": "retrieve", "judge_rejected": "store",
                              "retrieval_noise": "retrieve",
                              "stale_memory": "manage", "memory_misled": "retrieve"}
    assert scope(TaskResult("t", False, error="TimeoutError: tool timed out")) == "timeout"
    assert scope(TaskResult("t", False, error="RuntimeError: browser tool crashed")) == "tool_error"
    assert scope(_fail(**{**ev, "evidence_seen": False})) == "no_experience"
    fails = [("a", cases["stale_memory"])] * 3 + [("a", cases["retrieval_miss"])] + \
        [("a", TaskResult("x", False, error="TimeoutError"))] * 5
    g = diagnose(fails, Arch(("trajectory",), "json", "hybrid", "lightweight"))
    assert (g["module"], g["letter"], g["failure_mode"]) == ("manage", "M", "stale_memory")
    assert g["histogram"] == {"E": 0, "S": 0, "R": 1, "M": 3} and g["out_of_scope"] == {"timeout": 5}
    assert g["confidence"] == "high" and g["evidence_ids"] == ["t"]
    assert g["recommended_edit"]["from"] == "lightweight" and ["manage", "json_full"] in g["recommended_edit"]["edits"]
    assert diagnose([("a", TaskResult("x", False, error="TimeoutError"))])["module"] is None


def test_memory_that_broke_a_task_the_no_memory_agent_solved_is_memory_misled():
    """Without the baseline, a failure whose evidence was never stored is out of scope; with it, injected memory on a
    task the no-memory agent solved is memory's failure (an unseen world's first task, a moved object)."""
    unseen = _fail(evidence_seen=False, evidence_in_pool=False, injected_words=40)
    plain = _fail(injected_words=40)                     # no evidence annotations: the trace alone decides
    nothing_shown = _fail(injected_words=0)
    assert scope(unseen) == "no_experience" and classify(plain) == "retrieval_noise"
    base = {"t": True}
    g = diagnose([("a", unseen), ("a", plain), ("a", nothing_shown)], Arch(("workflow",), "json", "hybrid",
                                                                        "lightweight"), baseline=base)
    assert g["modes"] == {"memory_misled": 2, "retrieval_noise": 1} and g["failure_mode"] == "memory_misled"
    assert g["module"] == "retrieve" and g["recommended_edit"]["edits"][0] == ["retrieve", "cbr_rerank"]
    g0 = diagnose([("a", unseen), ("a", plain)], baseline={"t": False})   # the baseline failed too: as before
    assert g0["modes"] == {"retrieval_noise": 1} and g0["out_of_scope"] == {"no_experience": 1}
    assert diagnose([("a", unseen), ("a", plain)]) == g0


def test_ledger_status_transitions_under_differential_validation():
    led = Ledger()
    e = led.propose("retrieval_miss", ["retrieve", "hybrid"], {"round": 1})
    assert e.status == "pending" and not led.blocked(["retrieve", "hybrid"])
    assert led.validate(e.entry_id, True, {}).status == "active"
    assert led.validate(e.entry_id, True, {}).status == "active"
    assert led.validate(e.entry_id, False, {}).status == "pending"     # downgraded
    assert led.validate(e.entry_id, False, {}).status == "refuted"
    assert led.validate(e.entry_id, True, {}).status == "refuted"      # refuted stays refuted
    assert led.blocked(["retrieve", "hybrid"]) and len(e.evidence) == 6
    f = led.propose("stale_memory", ["manage", "json_full"], {})
    assert led.validate(f.entry_id, False, {}).status == "refuted"
    d = led.propose("any", ["store", "json"], {}, kind="dead_end")
    assert d.status == "active" and led.blocked(["store", "json"])
    assert Ledger(led.to_list()).to_list() == led.to_list()


class CountingEval:
    """Counts calls; ``crash_on`` makes those architectures raise; ``die_after`` simulates a killed process."""

    def __init__(self, inner, crash_on=(), die_after=None):
        self.inner, self.crash_on, self.die_after, self.calls = inner, set(crash_on), die_after, 0

    def __call__(self, arch, tasks):
        self.calls += 1
        if self.die_after is not None and self.calls > self.die_after:
            raise KeyboardInterrupt("killed")
        if arch is not None and arch.key in self.crash_on:
            raise RuntimeError("rollout crashed")
        return self.inner(arch, tasks)


def test_resume_recomputes_nothing_and_crash_is_recorded(tmp_path):
    world, inner = make_evaluator(0)
    S, V = world.tasks("search"), world.tasks("validation")
    path = tmp_path / "trace.json"
    full = CountingEval(inner)
    ref = run_automem(full, S, V, budget=9, k=3, seed=0, trace_path=tmp_path / "ref.json")
    killed = CountingEval(inner, die_after=6)
    with pytest.raises(KeyboardInterrupt):
        run_automem(killed, S, V, budget=9, k=3, seed=0, trace_path=path)
    assert len(json.loads(path.read_text())["log"]) == 6
    again = CountingEval(inner)
    out = run_automem(again, S, V, budget=9, k=3, seed=0, trace_path=path)
    assert again.calls == full.calls - 6 and out["replayed"] == 6
    assert [p["arch"] for p in out["evaluations"]] == [p["arch"] for p in ref["evaluations"]]
    assert out["ledger"] == ref["ledger"] and out["best"] == ref["best"]
    once_more = CountingEval(inner)
    run_automem(once_more, S, V, budget=9, k=3, seed=0, trace_path=path)
    assert once_more.calls == 0                                         # everything replayed
    with pytest.raises(TraceMismatch):
        run_automem(CountingEval(inner), S, V, budget=10, k=3, seed=0, trace_path=path)
    crash = ref["evaluations"][1]["arch"]
    out = run_automem(CountingEval(inner, crash_on={crash}), S, V, budget=9, k=3, seed=0,
                      trace_path=tmp_path / "crash.json")
    rec = next(p for p in out["evaluations"] if p["arch"] == crash)
    assert rec["failed"] and "rollout crashed" in rec["error"] and rec["accuracy"] is None
    assert len(out["evaluations"]) == 9 and crash not in out["front"]


class InvalidFirst:
    """A proposer whose first proposals are invalid (graph retrieval on a json store)."""

    name = "invalid-first"

    def __init__(self):
        from routers.automem.proposer import RuleProposer

        self.rule, self.n = RuleProposer(), 0

    def propose(self, ctx, k):
        from routers.automem.proposer import Proposal

        self.n += 1
        if self.n == 1:
            return [Proposal(Arch(("tip",), "json", "graph", "lightweight"), "llm"),
                    Proposal(Arch(("tip",), "vector", "hybrid", "json_full"), "llm")]
        return self.rule.propose(ctx, k)

    def resample(self, ctx, rejected, rng):
        return self.rule.resample(ctx, rejected, rng)


def test_invalid_proposals_are_rejected_counted_and_resampled():
    world, inner = make_evaluator(0)
    out = run_automem(inner, world.tasks("search"), world.tasks("validation"), budget=4, k=2, seed=0,
                      proposer=InvalidFirst())
    assert out["rejected_invalid"] >= 2
    assert {r["arch"] for r in out["rejected"]} >= {"tip|json|graph|lightweight", "tip|vector|hybrid|json_full"}
    assert all(valid(Arch.parse(p["arch"])) for p in out["evaluations"]) and len(out["evaluations"]) == 4


def test_a_store_edit_out_of_the_graph_family_keeps_its_edit_with_a_two_module_repair():
    """Session 43, seed 4: the gradient said ``store hybrid`` to a ``llm_graph | graph | graph_consolidate`` leader.
    Graph retrieval and graph_consolidate both need a graph store, so no single other change makes it valid, and the
    resample fell back to random neighbours of the leader: six evaluations, all in the graph family."""
    import random

    from routers.automem.proposer import Proposal, SearchContext

    leader = Arch(("trajectory", "workflow"), "llm_graph", "graph", "graph_consolidate")
    rejected = Proposal(leader.edit("store", "hybrid"), "gradient", leader.key, ["store", "hybrid"])
    ctx = SearchContext(round=2, rng=random.Random(0), leader=leader, evaluated={leader.key})
    for seed in range(5):
        got = RuleProposer().resample(ctx, rejected, random.Random(seed)).arch
        assert valid(got) and got.store == "hybrid" and got.encode == leader.encode, got.key
        assert got.retrieve != "graph" and got.manage != "graph_consolidate"


class InitOnly(RuleProposer):
    """Proposes nothing once there is a leader: a neighbourhood that every edit has exhausted."""

    def propose(self, ctx, k):
        return self._init(ctx, k) if ctx.leader is None else []


def test_an_exhausted_proposer_restarts_instead_of_ending_short_of_the_budget():
    world, inner = make_evaluator(0)
    out = run_automem(inner, world.tasks("search"), world.tasks("validation"), budget=6, k=2, seed=0,
                      proposer=InitOnly())
    origins = [p["origin"] for p in out["evaluations"]]
    assert origins == ["init", "init", "restart", "restart", "restart", "restart"], origins
    assert len({p["arch"] for p in out["evaluations"]}) == 6
    assert all(valid(Arch.parse(p["arch"])) for p in out["evaluations"])


def test_automem_beats_random_on_planted_problem():
    reach_a, reach_r = [], []
    for seed in (0, 1, 2):
        world, ev = make_evaluator(0)
        S, V = world.tasks("search"), world.tasks("validation")
        a = run_automem(ev, S, V, budget=12, k=3, seed=seed)
        r = run_random(ev, S, V, budget=12, seed=seed)
        best_a, best_r = max(x for x in a["best_so_far"] if x), max(x for x in r["best_so_far"] if x)
        assert best_a >= best_r, seed
        assert best_a > a["baseline"]["search_accuracy"]
        reach_a.append(first_reach(a["best_so_far"], best_r))
        reach_r.append(first_reach(r["best_so_far"], best_r))
        assert a["best"] and a["validations"] and a["gradients"] and a["graph"]
    assert sum(reach_a) / 3 < sum(reach_r) / 3, (reach_a, reach_r)


def test_train_and_eval_jobs_on_the_planted_world(tmp_path, monkeypatch):
    import eval.automem as ev_job
    import train.automem as tr_job

    world = VaultWorld(0)
    world.tasks_by_split["train"] = world.tasks("search") + world.tasks("validation")
    world.tasks_by_split["heldout"] = world.tasks("test")

    built = []

    def fake_build(cfg, env=None):
        from routers.automem.evaluate import RolloutEvaluator

        built.append(RolloutEvaluator(world, ScriptedAgent(), encoder=HashEncoder(64), max_steps=3, max_words=60))
        return world, built[-1]

    monkeypatch.setattr(tr_job, "build_evaluator", fake_build)
    out = tmp_path / "search"
    s = tr_job.main(["--output_dir", str(out), "--n_search", "15", "--n_val", "15", "--budget", "6",
                     "--seeds", "0", "--agent", "random"])
    assert s["seeds"]["0"]["automem"]["evaluations"] == 6 and (out / "memory_system.json").exists()
    assert load_system(out / "memory_system.json", encoder=HashEncoder(8)).arch
    res = ev_job.main(["--search_dir", str(out), "--output_dir", str(tmp_path / "eval"), "--agent", "random"])
    row = res["seeds"]["0"]
    assert row["no_memory"]["accuracy"] is not None and row["automem"]["accuracy"] is not None
    assert row["random"]["accuracy"] is not None
    from routers.machine import played_on  # where each number came from: held-out rollouts repeat on one CPU only
    assert res["machine"]["cpu_model"] and "torch" in res["versions"]
    assert all(system["played_on"] == played_on() for system in row.values())
    for system in row.values():  # per-family accuracy: the vault's scout / unlock tasks, weighted back to the whole
        fam = system["by_family"]
        assert set(fam) == {"scout", "unlock"} and sum(f["n"] for f in fam.values()) == system["n"]
        assert sum(f["accuracy"] * f["n"] for f in fam.values()) / system["n"] == pytest.approx(system["accuracy"])
    assert res["aggregate"]["by_family"]["automem"]["unlock"]["mean"] == row["automem"]["by_family"]["unlock"][
        "accuracy"]
    for f in ("results.json", "search_trace.json", "best_so_far.png", "memory_system.json", "heldout_by_family.png"):
        assert (tmp_path / "eval" / f).stat().st_size > 0
    assert "ledger" in json.loads((tmp_path / "eval" / "search_trace.json").read_text())["0"]["automem"]
    again = ev_job.main(["--search_dir", str(out), "--output_dir", str(tmp_path / "eval"), "--agent", "random"])
    assert built[-1].calls == 0 and again["seeds"] == res["seeds"]  # a rerun replays every held-out evaluation
    every = ev_job.main(["--search_dir", str(out), "--output_dir", str(tmp_path / "eval"), "--agent", "random",
                         "--score_candidates", "-1"])["candidates"]
    trace = json.loads((out / "seed0" / "automem_trace.json").read_text())
    distinct = {p["arch"] for tr in ("automem", "random")
                for p in json.loads((out / "seed0" / f"{tr}_trace.json").read_text())["evaluations"] if not p["failed"]}
    assert {r["arch"] for r in every["candidates"]} == distinct and every["n_candidates"] == len(distinct)
    by_arch = {r["arch"]: r for r in every["candidates"]}
    assert by_arch[row["automem"]["arch"]]["heldout_accuracy"] == row["automem"]["accuracy"]  # the same play
    assert by_arch[row["automem"]["arch"]]["search_accuracy"] == trace["best"]["search_accuracy"]
    assert (tmp_path / "eval" / "candidates.json").exists() and (tmp_path / "eval" / "search_vs_heldout.png").exists()
    rules = ev_job.main(["--search_dir", str(out), "--output_dir", str(tmp_path / "eval"), "--agent", "random",
                         "--compare_final_select", "true"])["final_select"]
    assert set(rules) == {"validation", "pooled", "search"} and (tmp_path / "eval" / "final_select.png").exists()
    for m in ("automem", "random"):  # the search ran with the default rule: its row is the main result's play
        pick = rules["validation"]["seeds"]["0"][m]
        assert pick["arch"] == row[m]["arch"] and pick["heldout_accuracy"] == row[m]["accuracy"]
        best_search = max(v["search_accuracy"] for v in json.loads(
            (out / "seed0" / f"{m}_trace.json").read_text())["validations"])
        assert rules["search"]["seeds"]["0"][m]["search_accuracy"] == best_search
        assert pick["heldout_by_family"] == row[m]["by_family"]
    # held-out tasks whose evidence only earlier (training) episodes carry: warmup_split plays those first
    test = world.tasks("test")
    world.tasks_by_split["heldout"] = [t for t in test if t.meta["kind"] == "unlock"]
    world.tasks_by_split["scouts"] = [t for t in test if t.meta["kind"] == "scout"]
    cold = ev_job.main(["--search_dir", str(out), "--output_dir", str(tmp_path / "cold"), "--agent", "random"])
    warm = ev_job.main(["--search_dir", str(out), "--output_dir", str(tmp_path / "warm"), "--agent", "random",
                        "--warmup_split", "scouts"])
    c, w = cold["seeds"]["0"], warm["seeds"]["0"]
    assert c["random"]["accuracy"] == 0.0 and w["no_memory"]["accuracy"] == 0.0 and w["random"]["n"] == 6
    assert w["random"]["accuracy"] > 0.0 and warm["warmup_split"] == "scouts"  # trajectory|vector|mmr kept a code
    assert warm["options_differing_from_search"] == {} and ev_job.differing_rollout_options(
        ev_job.AutomemEvalConfig(search_dir=str(out), agent="walkthrough"), out) == {"agent": ("random", "walkthrough")}


def test_split_keeps_a_world_together_and_plain_tasks_shuffled():
    from types import SimpleNamespace

    from train.automem import split_tasks

    tasks = [SimpleNamespace(task_id=f"w{w}-{j}", meta={"world_id": f"w{w}"}) for w in range(4) for j in range(3)]
    search, val = split_tasks(tasks, 6, 3)
    worlds = lambda ts: {t.meta["world_id"] for t in ts}  # noqa: E731
    assert len(search) == 6 and len(val) == 3 and len(worlds(search)) == 2 and len(worlds(val)) == 1
    assert not worlds(search) & worlds(val)
    assert search == sorted(search, key=tasks.index)  # play order kept: a first visit precedes its repeat
    plain = [SimpleNamespace(task_id=str(i), meta={}) for i in range(10)]
    s2, v2 = split_tasks(plain, 4, 3)
    assert len(s2) == 4 and len(v2) == 3 and not set(map(id, s2)) & set(map(id, v2))


def test_split_deals_worlds_without_own_memory_to_both_batches():
    """Training-only unseen worlds (no sibling, no demonstration) go one to search, one to validation, whatever the
    shuffle; the seen worlds fill the rest as before."""
    from types import SimpleNamespace

    from train.automem import split_tasks

    def world(w, fresh, n):
        return [SimpleNamespace(task_id=f"{w}-{j}", meta={"world_id": w, "sibling": None if fresh or j == 0 else
                                                          f"{w}-0", "demonstration": not fresh and j == 0})
                for j in range(n)]

    tasks = world("s0", False, 4) + world("s1", False, 4) + world("s2", False, 4) + world("s3", False, 4) \
        + world("u0", True, 3) + world("u1", True, 3)
    for seed in range(8):
        search, val = split_tasks(tasks, 7, 7, seed=seed)
        worlds = lambda ts: [t.meta["world_id"] for t in ts]  # noqa: E731
        assert len(search) == len(val) == 7 and not set(map(id, search)) & set(map(id, val))
        assert sum(w.startswith("u") for w in set(worlds(search))) == 1
        assert sum(w.startswith("u") for w in set(worlds(val))) == 1
        assert search == sorted(search, key=tasks.index)


def _demo_and_unlock(world):
    """A scout task made a demonstration, the unlock task whose code only that scout finds, and an architecture
    that keeps the code."""
    from dataclasses import replace

    tasks = world.tasks("search")
    scouts = [t for t in tasks if t.meta["kind"] == "scout"]
    scout = next(t for t in scouts if sum(u.meta["room"] == t.meta["room"] for u in scouts) == 1)  # one code
    unlock = next(t for t in tasks if t.meta["kind"] == "unlock" and t.meta["room"] == scout.meta["room"])
    demo = replace(scout, meta={**scout.meta, "demonstration": True, "walkthrough": ["look"]})
    return demo, unlock, Arch(("trajectory",), "vector", "hybrid", "lightweight")


def test_demonstrations_are_stored_but_not_scored():
    """A demonstration (expert-played) task feeds memory; only the agent's tasks count towards accuracy."""
    world, ev = make_evaluator()
    demo, unlock, arch = _demo_and_unlock(world)
    results = ev(arch, [demo, unlock])
    assert [r.task_id for r in results] == [unlock.task_id] and results[0].success  # the demo's memory unlocked it
    assert [r.task_id for r in ev(None, [demo, unlock])] == [unlock.task_id] and not ev(None, [unlock])[0].success


def test_warmup_tasks_are_stored_first_and_a_batch_plays_its_own_once():
    """``warmup`` (the search warm-up, held-out's warm-up split) is played and stored before the batch, unscored; a
    warm-up task the batch itself holds is played once, in the batch (no second copy of its episode in memory)."""
    from routers.automem.system import MemorySystem

    stored = []

    def factory(arch):
        system = MemorySystem(arch, encoder=HashEncoder(64), max_words=60)
        store = system.store
        system.store = lambda traj: (stored.append(traj.task.task_id), store(traj))[1]
        return system

    world, ev = make_evaluator(system_factory=factory)
    demo, unlock, arch = _demo_and_unlock(world)
    assert not ev(arch, [unlock])[0].success                                   # nothing stored: no code
    ev.warmup = [demo]
    results = ev(arch, [unlock])
    assert [r.task_id for r in results] == [unlock.task_id] and results[0].success  # the warm-up's code
    assert stored[-2:] == [demo.task_id, unlock.task_id]
    stored.clear()
    assert ev(arch, [demo, unlock])[0].success and stored == [demo.task_id, unlock.task_id]  # the demo once
    assert not ev(None, [unlock])[0].success                                   # no memory: no warm-up either


def test_search_warmup_option_is_checked_and_keyed_only_when_on(tmp_path, monkeypatch):
    import train.automem as tr_job
    from routers.automem.evaluate import RolloutEvaluator

    world = VaultWorld(0)
    world.tasks_by_split["train"] = world.tasks("search") + world.tasks("validation")
    built = []

    def fake_build(cfg, env=None):
        built.append(RolloutEvaluator(world, ScriptedAgent(), encoder=HashEncoder(64), max_steps=3, max_words=60))
        return world, built[-1]

    monkeypatch.setattr(tr_job, "build_evaluator", fake_build)
    argv = ["--n_search", "15", "--n_val", "15", "--budget", "1", "--k", "1", "--seeds", "0", "--agent", "random",
            "--final_validate", "1", "--random_baseline", "false"]
    tr_job.main(["--output_dir", str(tmp_path / "on"), "--search_warmup", "train", *argv])
    assert [t.task_id for t in built[-1].warmup] == [t.task_id for t in world.tasks("train")]  # batches skip theirs
    trace = json.loads((tmp_path / "on" / "seed0" / "automem_trace.json").read_text())
    assert trace["fingerprint"]["search_warmup"] == "train"
    tr_job.main(["--output_dir", str(tmp_path / "off"), *argv])
    assert built[-1].warmup == [] and "search_warmup" not in json.loads(
        (tmp_path / "off" / "seed0" / "automem_trace.json").read_text())["fingerprint"]
    off = tr_job.AutomemTrainConfig(output_dir="x")
    on = tr_job.AutomemTrainConfig(output_dir="x", search_warmup="demonstrations")
    assert tr_job.warmup_settings(off) == {} and tr_job.warmup_settings(on) == {"search_warmup": "demonstrations"}
    with pytest.raises(ValueError, match="search_warmup"):
        tr_job.AutomemTrainConfig(output_dir="x", search_warmup="everything")


def _rank_world(n_tasks: int = 4):
    """Search and validation batches where an architecture's search accuracy and its validation accuracy are
    opposite functions of its key: the search leader is the worst on validation."""
    import hashlib

    S = [Task(f"s-{i}", "fetch") for i in range(n_tasks)]
    V = [Task(f"v-{i}", "fetch") for i in range(n_tasks)]

    def level(arch) -> int:
        return int(hashlib.sha256(arch.key.encode()).hexdigest(), 16) % (n_tasks + 1)

    def evaluate(arch, tasks):
        if arch is None:
            return [TaskResult(t.task_id, False) for t in tasks]
        lv = level(arch) if tasks[0].task_id.startswith("s-") else n_tasks - level(arch)
        return [TaskResult(t.task_id, i < lv, tokens=10) for i, t in enumerate(tasks)]

    return S, V, evaluate


@pytest.mark.parametrize("method", ["automem", "random"])
def test_final_validation_reports_the_best_on_validation_not_the_search_leader(method):
    S, V, evaluate = _rank_world()
    run = (lambda **kw: run_automem(evaluate, S, V, budget=6, k=2, seed=3, **kw)) if method == "automem" else \
        (lambda **kw: run_random(evaluate, S, V, budget=6, seed=3, **kw))
    one, three = run(final_validate=1), run(final_validate=3)
    ranked = sorted(three["evaluations"], key=lambda p: (-p["accuracy"], p["cost"], p["index"]))
    top3 = {p["arch"] for p in ranked[:3]}
    assert top3 <= {v["arch"] for v in three["validations"]}
    best_val = max(v["accuracy"] for v in three["validations"])
    assert three["best"]["validation_accuracy"] == best_val
    assert three["best"]["validation_accuracy"] > one["best"]["validation_accuracy"]  # the leader does not carry
    with pytest.raises(ValueError):
        run(final_validate=0)


def test_final_pick_rules_on_hand_built_validations():
    from routers.automem.search import final_pick

    points = [{"arch": a, "accuracy": s, "gain": 0.0, "cost": 1.0, "index": i}
              for i, (a, s) in enumerate([("a", 0.9), ("b", 0.6), ("c", 0.7), ("d", 0.7)])]
    vals = [{"arch": a, "accuracy": v, "search_accuracy": s, "gain": 0.0}
            for a, v, s in [("a", 0.2, 0.9), ("b", 0.8, 0.6), ("c", 0.6, 0.7), ("d", 0.6, 0.7)]]
    assert final_pick(vals, points, "validation")["arch"] == "b"  # 0.8
    assert final_pick(vals, points, "search")["arch"] == "a"  # 0.9
    assert final_pick(vals, points, "pooled")["arch"] == "b"  # means 0.55 / 0.70 / 0.65 / 0.65
    vals[1]["accuracy"] = 0.6  # b's mean 0.60: c and d tie at 0.65 and 0.6 validation -> the earlier, c
    assert final_pick(vals, points, "pooled")["arch"] == "c"
    assert final_pick([], points, "search") is None
    with pytest.raises(ValueError, match="final_select"):
        final_pick(vals, points, "held-out")


@pytest.mark.parametrize("method", ["automem", "random"])
def test_final_select_picks_among_the_validated_by_its_rule(method):
    S, V, evaluate = _rank_world()  # validation ranks architectures opposite to search
    run = (lambda **kw: run_automem(evaluate, S, V, budget=6, k=2, seed=3, final_validate=3, **kw)) \
        if method == "automem" else (lambda **kw: run_random(evaluate, S, V, budget=6, seed=3, final_validate=3, **kw))
    by = {rule: run(final_select=rule) for rule in ("validation", "pooled", "search")}
    vals = by["search"]["validations"]
    assert by["search"]["best"]["search_accuracy"] == max(v["search_accuracy"] for v in vals)
    assert by["validation"]["best"]["validation_accuracy"] == max(v["accuracy"] for v in vals)
    assert by["search"]["best"]["arch"] != by["validation"]["best"]["arch"]
    pooled = by["pooled"]["best"]
    assert (pooled["search_accuracy"] + pooled["validation_accuracy"]) / 2 == max(
        (v["search_accuracy"] + v["accuracy"]) / 2 for v in vals)
    calls = []
    with pytest.raises(ValueError, match="final_select"):
        (run_automem if method == "automem" else run_random)(lambda a, t: calls.append(a), S, V, budget=2,
                                                              final_select="held-out")
    assert calls == []  # refused before any evaluation


def test_evaluation_store_shares_identical_evaluations_across_methods_and_seeds(tmp_path):
    from routers.automem.trace import EvaluationStore

    world, inner = make_evaluator(0)
    S, V = world.tasks("search"), world.tasks("validation")
    ref_a = run_automem(CountingEval(inner), S, V, budget=6, k=2, seed=0)
    ref_r = run_random(CountingEval(inner), S, V, budget=6, seed=0)
    store = EvaluationStore(tmp_path / "evaluations.jsonl", {"env": "vault"})
    a_eval, r_eval = CountingEval(inner), CountingEval(inner)
    a = run_automem(a_eval, S, V, budget=6, k=2, seed=0, store=store)
    r = run_random(r_eval, S, V, budget=6, seed=0, store=store)
    # the baselines and the seeded random round 1 are played once, and replaying them changes no result
    assert a["shared"] == 0 and r["shared"] >= 2
    assert r_eval.calls == r["evaluate_calls"] == ref_r["evaluate_calls"] - r["shared"]
    assert [p["accuracy"] for p in r["evaluations"]] == [p["accuracy"] for p in ref_r["evaluations"]]
    assert r["best"] == ref_r["best"] and a["best"] == ref_a["best"]
    n = len(store.records)
    # reopened after a kill cut the last record: that record is dropped, the rest replayed; other settings share nothing
    with open(tmp_path / "evaluations.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"id": "cut", "evaluation": {"arch"')
    again = EvaluationStore(tmp_path / "evaluations.jsonl", {"env": "vault"})
    assert len(again.records) == n
    s2 = CountingEval(inner)
    run_automem(s2, S, V, budget=6, k=2, seed=0, store=again)
    assert s2.calls == 0
    other = EvaluationStore(tmp_path / "evaluations.jsonl", {"env": "vault", "memory_k": 5})
    assert other.get(None, S) is None and again.get(None, S) is not None
    # a crashed evaluation is not shared (it may be transient)
    crash = ref_r["evaluations"][0]["arch"]
    fresh = EvaluationStore(tmp_path / "fresh.jsonl", {"env": "vault"})
    run_random(CountingEval(inner, crash_on={crash}), S, V, budget=6, seed=0, store=fresh)
    assert fresh.get(Arch.parse(crash), S) is None


def test_a_replayed_trace_keeps_its_recorded_wall_time(tmp_path):
    import time

    world, inner = make_evaluator(0)
    S, V = world.tasks("search"), world.tasks("validation")

    def slow(arch, tasks):
        time.sleep(0.02)
        return inner(arch, tasks)

    played = run_random(slow, S, V, budget=4, seed=0, trace_path=tmp_path / "r.json")
    again = CountingEval(inner)
    replayed = run_random(again, S, V, budget=4, seed=0, trace_path=tmp_path / "r.json")
    assert played["wall_s"] >= 0.02 * played["evaluate_calls"] and again.calls == 0
    assert replayed["wall_s"] >= played["wall_s"]
    assert json.loads((tmp_path / "r.json").read_text())["wall_s"] == replayed["wall_s"]
    # the counts are the trace's, not this process's: a replay used to report 0 evaluate calls
    assert replayed["evaluate_calls"] == played["evaluate_calls"] > 0 and replayed["replayed"] > 0


def test_a_killed_search_resumes_with_the_evaluations_it_played(tmp_path):
    """Evaluations played after the last state save of a killed process count on resume, as do store hits.
    Before, the trace's counts were the last process's (a resume after a kill reported only its own calls)."""
    from routers.automem.trace import EvaluationStore

    world, inner = make_evaluator(0)
    S, V = world.tasks("search"), world.tasks("validation")
    store = EvaluationStore(tmp_path / "evaluations.jsonl", {"env": "vault"})
    run_random(inner, S, V, budget=2, seed=0, trace_path=tmp_path / "small.json", store=store)  # into the store
    stored = {r["key"] for r in json.loads((tmp_path / "small.json").read_text())["log"]}
    first = CountingEval(inner, die_after=3)
    with pytest.raises(KeyboardInterrupt):
        run_random(first, S, V, budget=6, seed=0, trace_path=tmp_path / "r.json", store=store)
    second = CountingEval(inner)
    out = run_random(second, S, V, budget=6, seed=0, trace_path=tmp_path / "r.json", store=store)
    records = json.loads((tmp_path / "r.json").read_text())["log"]
    shared = sum(r["key"] in stored for r in records)
    assert shared >= 4 and out["shared"] == shared  # the baselines and the 2 draws both runs made, at least
    assert out["evaluate_calls"] == first.die_after + second.calls == len(records) - shared
    assert {r["source"] for r in records if r["key"] in stored} == {"store"}


def test_held_out_replay_reports_the_same_wall_time(tmp_path, monkeypatch):
    """A replayed held-out evaluation reports the wall time the first run reported. Before, the first run rounded
    the raw seconds (0.00049 -> 0.0) and the replay the stored 4-decimal value (0.0005 -> 0.001)."""
    import routers.automem.evaluate as evaluate_mod
    from eval.automem import _held_out
    from routers.automem.evaluate import Evaluation
    from routers.automem.trace import EvaluationStore

    world, _ = make_evaluator(0)
    tasks = world.tasks("search")
    played = Evaluation(arch=None, batch="test", results=[], seconds=0.00049)
    monkeypatch.setattr(evaluate_mod, "run_evaluation", lambda *a: played)
    store = EvaluationStore(tmp_path / "evaluations.jsonl", {"env": "vault"})
    first = _held_out(None, None, tasks, store)
    monkeypatch.setattr(evaluate_mod, "run_evaluation", lambda *a: pytest.fail("replayed evaluations are not rerun"))
    again = _held_out(None, None, tasks, EvaluationStore(tmp_path / "evaluations.jsonl", {"env": "vault"}))
    assert again == first and first["wall_s"] == 0.0005


def test_candidate_pool_selection_and_rank_correlations():
    from eval.automem_candidates import pooled_candidates, rank_correlations, select_candidates

    def ev(arch, acc, failed=False):
        return {"arch": arch, "accuracy": acc, "failed": failed}

    traces = {"0": {"automem": {"evaluations": [ev("a", 0.5), ev("b", 0.7), ev("x", None, True)],
                                "validations": [{"arch": "b", "accuracy": 0.4}]},
                    "random": {"evaluations": [ev("a", 0.5), ev("c", 0.7)], "validations": []}},
              "1": {"automem": {"evaluations": [ev("d", 0.2)], "validations": [{"arch": "c", "accuracy": 0.6}]}}}
    rows = pooled_candidates(traces)
    assert [(r["arch"], r["search_accuracy"], r["validation_accuracy"]) for r in rows] == [
        ("a", 0.5, None), ("b", 0.7, 0.4), ("c", 0.7, 0.6), ("d", 0.2, None)]  # the failed one is not a candidate
    assert rows[0]["evaluated_by"] == ["automem/seed0", "random/seed0"]
    assert [r["arch"] for r in select_candidates(rows, 3)] == ["c", "b", "a"]  # ties: validation accuracy decides
    assert [r["arch"] for r in select_candidates(rows, -1)] == ["c", "b", "a", "d"]
    assert [r["arch"] for r in select_candidates(rows, 2, "spread")] == ["c", "d"]  # best and worst
    assert [r["arch"] for r in select_candidates(rows, 1, "top", keep={"d"})] == ["c", "d"]  # a pick always
    with pytest.raises(ValueError, match="top' or 'spread"):
        select_candidates(rows, 2, "best")
    for r, h in zip(rows, (0.3, 0.5, 0.4, 0.1)):
        r["heldout_accuracy"] = h
    c = rank_correlations(rows, "search_accuracy")  # search ranks 2, 3.5, 3.5, 1; held-out 2, 4, 3, 1
    assert c["n"] == 4 and c["spearman"] == pytest.approx(0.9486832980505138)
    assert rank_correlations(rows, "validation_accuracy") is None  # two pairs: too few to rank
    rows[3]["validation_accuracy"] = 0.9
    # validation 0.4 / 0.6 / 0.9 against held-out 0.5 / 0.4 / 0.1
    assert rank_correlations(rows, "validation_accuracy")["spearman"] == pytest.approx(-1.0)


def test_pick_rule_comparison_on_hand_built_traces(tmp_path):
    from eval.automem_picks import compare_final_select, picks_by_rule

    def trace(vals):  # (arch, search, validation) per validated candidate
        return {"evaluations": [{"arch": a, "accuracy": s, "gain": 0.0, "cost": 1.0, "index": i}
                                for i, (a, s, _) in enumerate(vals)],
                "validations": [{"arch": a, "accuracy": v, "search_accuracy": s, "gain": 0.0} for a, s, v in vals]}

    traces = {"0": {"automem": trace([("a", 0.9, 0.2), ("b", 0.6, 0.8)]), "random": trace([("c", 0.7, 0.6)])},
              "1": {"automem": trace([("d", 0.5, 0.5)]), "random": trace([("a", 0.8, 0.4), ("e", 0.4, 0.7)])}}
    by_rule = picks_by_rule(traces)
    assert {r: [by_rule[r][s][m]["arch"] for s in ("0", "1") for m in ("automem", "random")] for r in by_rule} == {
        "validation": ["b", "c", "d", "e"], "pooled": ["b", "c", "d", "a"], "search": ["a", "c", "d", "a"]}
    held = {"a": 0.5, "b": 0.3, "c": 0.4, "d": 0.2, "e": 0.1}
    played = []
    rep = compare_final_select(traces, lambda a: played.append(a) or {"accuracy": held[a], "failed": False},
                               {"accuracy": 0.25}, tmp_path)
    assert sorted(played) == ["a", "b", "c", "d", "e"]  # each distinct pick played once, whatever the rules
    v, s = rep["rules"]["validation"]["summary"], rep["rules"]["search"]["summary"]
    # validation: automem 0.3 / 0.2 vs random 0.4 / 0.1; search: automem 0.5 / 0.2 vs random 0.4 / 0.5
    assert v["heldout"]["automem"]["mean"] == pytest.approx(0.25) == v["heldout"]["random"]["mean"]
    assert (v["n_seeds"], v["automem_ge_random"], v["automem_gt_random"], v["automem_gain_ge_10"]) == (2, 1, 1, 0)
    assert (s["automem_ge_random"], s["automem_gt_random"], s["automem_gain_ge_10"]) == (1, 1, 1)
    assert s["heldout"]["random"] == {"mean": pytest.approx(0.45), "std": pytest.approx(0.05), "n": 2}
    assert v["wins_ties_losses"] == [1, 0, 1] and v["sign_test_p"] == pytest.approx(1.0)
    assert s["automem_minus_random"]["mean"] == pytest.approx(-0.1)  # (0.5 - 0.4 + 0.2 - 0.5) / 2
    assert json.loads((tmp_path / "final_select.json").read_text())["distinct_picks"] == 5
    assert (tmp_path / "final_select.png").stat().st_size > 0


def test_candidate_report_judges_search_on_the_validated_rows_too(tmp_path):
    from eval.automem_candidates import score_candidates

    def tr(evals, vals):
        return {"evaluations": [{"arch": a, "accuracy": s, "failed": False} for a, s in evals],
                "validations": [{"arch": a, "accuracy": v} for a, v in vals], "best": None}

    traces = {"0": {"automem": tr([("a", 0.9), ("b", 0.7), ("c", 0.6), ("d", 0.3)], [("b", 0.4), ("c", 0.6)]),
                    "random": tr([("e", 0.5), ("f", 0.2)], [("e", 0.9)])}}
    held = {"a": 0.2, "b": 0.5, "c": 0.4, "d": 0.3, "e": 0.1, "f": 0.6}
    rep = score_candidates(traces, -1, lambda a: {"accuracy": held[a], "tokens": 1, "failed": False},
                           {"accuracy": 0.25}, tmp_path)
    assert rep["search_vs_heldout"]["n"] == 6
    assert rep["search_vs_heldout"]["spearman"] == pytest.approx(-0.3142857142857143)
    on_validated = rep["search_vs_heldout_validated"]  # b, c, e: search 0.7 / 0.6 / 0.5 vs held-out 0.5 / 0.4 / 0.1
    assert on_validated["n"] == 3 and on_validated["spearman"] == pytest.approx(1.0)
    assert rep["validation_vs_heldout"]["spearman"] == pytest.approx(-1.0)  # 0.4 / 0.6 / 0.9 on the same rows


def test_task_family_reads_the_world_suites_kinds_and_falls_back_to_kind():
    from eval.automem import accuracy_by_family, task_family

    tasks = [Task("w0-fetch-a", "g", "heldout", {"world_id": "w0", "family": "fetch", "sibling": "w0-fetch-z"}),
             Task("w0-moved-b", "g", "heldout", {"world_id": "w0", "family": "moved", "sibling": None}),
             Task("w9-fetch-c", "g", "heldout", {"world_id": "w9", "family": "fetch", "sibling": None}),
             Task("w9-fetch-d", "g", "heldout", {"world_id": "w9", "family": "fetch", "sibling": None}),
             Task("v-unlock-r1", "g", "test", {"kind": "unlock"}), Task("plain", "g", "test", {})]
    assert [task_family(t) for t in tasks] == ["fetch", "moved", "unseen", "unseen", "unlock", "all"]
    results = [TaskResult(t.task_id, ok) for t, ok in zip(tasks, (True, False, True, False, True, True))]
    assert accuracy_by_family(results, tasks) == {
        "all": {"accuracy": 1.0, "n": 1}, "fetch": {"accuracy": 1.0, "n": 1}, "moved": {"accuracy": 0.0, "n": 1},
        "unlock": {"accuracy": 1.0, "n": 1}, "unseen": {"accuracy": 0.5, "n": 2}}


def test_evaluations_to_reach_random_searchs_best():
    from eval.automem import evaluations_to_reach, reach_random_best

    assert evaluations_to_reach([None, 0.4, 0.6, 0.6], 0.6) == 3 and evaluations_to_reach([0.4], 0.6) is None
    assert evaluations_to_reach([0.6000000001, 0.7], 0.6) == 1 and evaluations_to_reach([0.5], None) is None
    traces = {"0": {"automem": {"best_so_far": [0.5, 0.7, 0.7]}, "random": {"best_so_far": [0.4, 0.4, 0.6]}},
              "1": {"automem": {"best_so_far": [0.5, 0.5, 0.5]}, "random": {"best_so_far": [0.5, 0.6, 0.6]}},
              "2": {"automem": {"best_so_far": [0.3, 0.6, 0.6]}, "random": {"best_so_far": [0.2, 0.6, 0.6]}},
              "3": {"automem": {"best_so_far": [0.5]}}}  # one method only: not compared
    r = reach_random_best(traces)
    assert r["seeds"]["0"] == {"random_final_best": 0.6, "automem": 2, "random": 3}
    assert r["seeds"]["1"]["automem"] is None and set(r["seeds"]) == {"0", "1", "2"}
    assert (r["fewer"], r["same"], r["more_or_never"]) == (1, 1, 1)
    both = r["best_of_both"]  # seed 0: random never reaches AutoMem's 0.7; seed 1: AutoMem never reaches 0.6
    assert both["seeds"]["0"] == {"best": 0.7, "automem": 2, "random": None}
    assert both["seeds"]["1"] == {"best": 0.6, "automem": None, "random": 2}
    assert both["seeds"]["2"] == {"best": 0.6, "automem": 2, "random": 2}
    assert (both["fewer"], both["same"], both["more_or_never"]) == (1, 1, 1)


def test_held_out_results_compare_the_methods_over_seeds(tmp_path, monkeypatch):
    """results.json pairs AutoMem with random search per seed (wins / ties / losses, sign test) and counts the
    evaluations each needed to reach random search's final best."""
    import eval.automem as ev_job
    import train.automem as tr_job

    world = VaultWorld(0)
    world.tasks_by_split["train"] = world.tasks("search") + world.tasks("validation")
    world.tasks_by_split["heldout"] = world.tasks("test")

    def fake_build(cfg, env=None):
        from routers.automem.evaluate import RolloutEvaluator

        return world, RolloutEvaluator(world, ScriptedAgent(), encoder=HashEncoder(64), max_steps=3, max_words=60)

    monkeypatch.setattr(tr_job, "build_evaluator", fake_build)
    out = tmp_path / "search"
    tr_job.main(["--output_dir", str(out), "--n_search", "15", "--n_val", "15", "--budget", "4", "--seeds", "0", "1",
                 "--agent", "random"])
    res = ev_job.main(["--search_dir", str(out), "--output_dir", str(tmp_path / "eval"), "--agent", "random"])
    acc = {s: (row["automem"]["accuracy"], row["random"]["accuracy"]) for s, row in res["seeds"].items()}
    c = res["comparison"]
    assert c["n_seeds"] == 2 and sum(c["wins_ties_losses"]) == 2
    assert c["wins_ties_losses"][0] == sum(a > r for a, r in acc.values())
    assert c["automem_minus_random"]["mean"] == pytest.approx(sum(a - r for a, r in acc.values()) / 2)
    reach = res["reach_random_best"]
    assert set(reach["seeds"]) == {"0", "1"} and reach["fewer"] + reach["same"] + reach["more_or_never"] == 2
    for seed, r in reach["seeds"].items():
        trace = json.loads((out / f"seed{seed}" / "random_trace.json").read_text())
        assert r["random_final_best"] == max(y for y in trace["best_so_far"] if y is not None)


def test_stagnation_gives_one_slot_per_round_to_a_restart_until_the_best_improves(tmp_path):
    """On a plateau (one-module edits tie the leader) ``stagnation=1`` spends one slot of every round after a round
    without a better search accuracy on a random restart; ``0`` (the default) never does. A better candidate
    resets the count."""
    S, V = [Task(f"s-{i}", "fetch") for i in range(4)], [Task(f"v-{i}", "fetch") for i in range(4)]
    special: set[str] = set()

    def evaluate(arch, tasks):  # every architecture 2 of 4, except any in ``special`` (4 of 4)
        lv = 0 if arch is None else 4 if arch.key in special else 2
        return [TaskResult(t.task_id, i < lv, tokens=10) for i, t in enumerate(tasks)]

    off = run_automem(evaluate, S, V, budget=10, k=2, seed=0)
    assert all(p["origin"] != "stagnation" for p in off["evaluations"]) and len(off["evaluations"]) == 10
    on = run_automem(evaluate, S, V, budget=10, k=2, seed=0, stagnation=1)
    by_round = {}
    for p in on["evaluations"]:
        by_round.setdefault(p["round"], []).append(p["origin"])
    assert [rnd.count("stagnation") for _, rnd in sorted(by_round.items())] == [0, 0, 1, 1, 1], by_round
    assert len(on["evaluations"]) == 10 and all(valid(Arch.parse(p["arch"])) for p in on["evaluations"])
    # round 3's restart finds a better architecture: round 4 goes back to edits only, round 5 restarts again
    special.add(next(p["arch"] for p in on["evaluations"] if p["round"] == 3 and p["origin"] == "stagnation"))
    found = run_automem(evaluate, S, V, budget=10, k=2, seed=0, stagnation=1)
    assert [sum(p["origin"] == "stagnation" for p in found["evaluations"] if p["round"] == r)
            for r in (3, 4, 5)] == [1, 0, 1]
    assert max(p["accuracy"] for p in found["evaluations"]) == 1.0
    with pytest.raises(ValueError, match="stagnation"):
        run_automem(evaluate, S, V, budget=2, stagnation=-1)
