"""Evidence annotations on the persistent-world suite: which repeat visits carry the route of an earlier delivery,
and how the evaluator's failure record then lets the diagnosis tell a retrieval miss from noise."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(__file__))
from memagent_provider_fakes import HashEncoder  # noqa: E402

from routers.automem import Arch, MemorySystem, TaskResult, classify, diagnose  # noqa: E402
from routers.automem.evaluate import RolloutEvaluator  # noqa: E402
from routers.automem.evidence import annotate_world_tasks, world_evidence  # noqa: E402
from routers.memagent.protocol import Task, Trajectory, TrajectoryStep  # noqa: E402

OBJECTS = {"silver ladle": "coffer", "black whisk": "coffer", "blue teapot": "coffer", "golden trumpet": "locker"}
GOAL = "In Harbor House, find the {} in the {} and put it on the table in the foyer."


def _meta(obj, delivered, **kw):
    return {"world_id": "w0", "family": "fetch", "object": obj, "holder": OBJECTS[obj], "delivered": delivered,
            "demonstration": False, "moved": None, **kw}


def test_a_repeat_visit_carries_the_earlier_deliveries_from_its_holder():
    meta = _meta("blue teapot", ["silver ladle", "golden trumpet", "black whisk"])
    assert world_evidence(meta, OBJECTS) == {
        "evidence": ["take silver ladle from coffer", "take black whisk from coffer"],
        "sources": ["silver ladle", "black whisk"], "follow": ["coffer"]}
    assert world_evidence(_meta("silver ladle", [], demonstration=True), OBJECTS) == {}
    assert world_evidence(_meta("golden trumpet", ["silver ladle"]), OBJECTS) == {}       # first at its holder
    moved = _meta("silver ladle", ["black whisk"], moved={"object": "silver ladle", "from": "coffer", "to": "cupboard"})
    assert world_evidence(moved, OBJECTS) == {}                                           # the guards decide these


def test_annotate_reads_the_env_manifest_and_keeps_given_evidence():
    env = SimpleNamespace(worlds=lambda: {"w0": SimpleNamespace(objects=OBJECTS)})
    t1 = Task("w0-fetch-black_whisk", GOAL.format("black whisk", "coffer"), meta=_meta("black whisk", ["silver ladle"]))
    t2 = Task("w0-fetch-blue_teapot", "x", meta=_meta("blue teapot", ["silver ladle"], evidence=["given"]))
    t3 = Task("plain", "x", meta={})
    assert annotate_world_tasks(env, [t1, t2, t3]) == 1
    assert t1.meta["evidence"] == ["take silver ladle from coffer"] and t1.meta["sources"] == ["silver ladle"]
    assert t2.meta["evidence"] == ["given"] and t3.meta == {}
    assert annotate_world_tasks(SimpleNamespace(), [t3]) == 0                             # no manifest: no-op


def _traj(obj, holder, ok=True):
    acts = ["go south", f"take {obj} from {holder}", "go north", f"put {obj} on table"]
    steps = [TrajectoryStep(i, f"You did {a}.", a) for i, a in enumerate(acts)]
    return Trajectory(task=Task(f"t-{obj}", GOAL.format(obj, holder)), steps=steps, success=ok)


def _failure(task, retrieved_ids, mem, actions=("look",), memory=None):
    ev = RolloutEvaluator(env=None, agent=None)
    steps = [TrajectoryStep(i, "Nothing.", a) for i, a in enumerate(actions)]
    r = SimpleNamespace(trajectory=Trajectory(task=task, steps=steps, success=False), injected_tokens=0)
    trace = {"pool": len(mem.items_by_id()), "retrieved": retrieved_ids, "kept": retrieved_ids, "dropped": []}
    if memory is None:
        memory = "\n".join(mem.items_by_id()[i].text for i in retrieved_ids)
    return ev._result(task, r, memory, trace, ["take silver ladle from coffer"], mem, 0)


def test_an_annotated_failure_separates_a_retrieval_miss_from_noise():
    mem = MemorySystem(Arch(("trajectory",), "json", "hybrid", "lightweight"), encoder=HashEncoder())
    for obj, holder in [("silver ladle", "coffer"), ("golden trumpet", "locker"), ("red cup", "chest")]:
        mem.store(_traj(obj, holder))
    ids = {it.meta["goal"]: i for i, it in mem.items_by_id().items()}
    ladle, trumpet, cup = (ids[GOAL.format(o, h)] for o, h in
                           [("silver ladle", "coffer"), ("golden trumpet", "locker"), ("red cup", "chest")])
    meta = _meta("black whisk", ["silver ladle", "golden trumpet"])
    task = Task("w0-fetch-black_whisk", GOAL.format("black whisk", "coffer"), meta={**meta, **world_evidence(
        meta, OBJECTS)})
    miss = _failure(task, [trumpet, cup], mem)
    assert miss.failure["evidence_in_pool"] and not miss.failure["evidence_retrieved"]
    assert classify(miss) == "retrieval_miss"
    buried = _failure(task, [trumpet, ladle], mem)
    assert buried.failure["evidence_injected"] and classify(buried) == "retrieval_noise"
    bare = _failure(Task(task.task_id, task.goal, meta=meta), [trumpet, cup], mem)      # no annotation
    assert "evidence_in_pool" not in bare.failure and classify(bare) == "retrieval_noise"
    g = diagnose([("a", miss)] * 3 + [("a", buried)], mem.arch)
    assert (g["failure_mode"], g["histogram"]["R"]) == ("retrieval_miss", 4)
    assert g["recommended_edit"]["edits"][0] == ["retrieve", "hybrid"]


def _annotated(task_id, **flags):
    ev = dict(evidence_seen=True, evidence_in_pool=True, evidence_retrieved=True, evidence_injected=True,
              stale_injected=False, source_units=1)
    return TaskResult(task_id, False, failure={"timeout": False, **ev, **flags,
                                               "memory": {"pool": 4, "retrieved": ["a", "b"], "kept": ["a", "b"]}})


def test_the_histogram_names_the_module_and_its_most_frequent_mode_the_edit():
    # seed 1's round 2 with evidence: 5 low-quality extractions (E) against 5 misses + 1 noise (R)
    fails = [("x", _annotated(f"e{i}", evidence_in_pool=False)) for i in range(5)]
    fails += [("x", _annotated(f"m{i}", evidence_retrieved=False)) for i in range(5)] + [("x", _annotated("n0"))]
    g = diagnose(fails, Arch(("insight", "shortcut"), "graph", "cbr_rerank", "graph_consolidate"))
    assert g["histogram"] == {"E": 5, "S": 0, "R": 6, "M": 0}
    assert (g["module"], g["failure_mode"]) == ("retrieve", "retrieval_miss")
    assert g["evidence_ids"] == [f"m{i}" for i in range(5)] and g["confidence"] == "medium"
    assert g["recommended_edit"] == {"module": "retrieve", "edits": [["retrieve", "hybrid"], ["retrieve", "cbr_rerank"],
                                     ["store", "hybrid"], ["retrieve", "graph"], ["retrieve", "hyde"]],
                                     "from": "cbr_rerank"}
    one = diagnose(fails[:5] + fails[5:7])                            # E 5 vs R 2: the larger module wins
    assert (one["module"], one["failure_mode"]) == ("encode", "low_quality_extraction")


def test_injected_evidence_the_agent_never_acted_on_is_an_unusable_form_unless_other_tasks_units_sat_beside_it():
    mem = MemorySystem(Arch(("trajectory",), "json", "hybrid", "lightweight"), encoder=HashEncoder())
    for obj, holder in [("silver ladle", "coffer"), ("golden trumpet", "locker")]:
        mem.store(_traj(obj, holder))
    ids = {it.meta["goal"]: i for i, it in mem.items_by_id().items()}
    ladle, trumpet = ids[GOAL.format("silver ladle", "coffer")], ids[GOAL.format("golden trumpet", "locker")]
    meta = _meta("black whisk", ["silver ladle", "golden trumpet"])
    task = Task("w0-fetch-black_whisk", GOAL.format("black whisk", "coffer"), meta={**meta, **world_evidence(
        meta, OBJECTS)})
    alone = _failure(task, [ladle], mem)
    assert (alone.failure["evidence_followed"], alone.failure["foreign_injected"]) == (False, 0)
    assert classify(alone) == "unusable_form"
    reached = _failure(task, [ladle], mem, actions=("go south", "open coffer", "go north"))
    assert reached.failure["evidence_followed"] and classify(reached) == "unattributed"   # memory did its part
    beside = _failure(task, [ladle, trumpet], mem)
    assert beside.failure["foreign_injected"] == 1 and classify(beside) == "retrieval_noise"
    # a kept unit the word limit cut from the injected text is not beside the evidence
    cut = _failure(task, [ladle, trumpet], mem, memory=mem.items_by_id()[ladle].text)
    assert cut.failure["foreign_injected"] == 0 and classify(cut) == "unusable_form"
    g = diagnose([("a", alone)] * 3 + [("a", beside)], mem.arch)
    assert (g["module"], g["failure_mode"], g["histogram"]["E"], g["histogram"]["R"]) == (
        "encode", "unusable_form", 3, 1)
    assert g["recommended_edit"]["edits"][:3] == [["encode", "+workflow"], ["encode", "+shortcut"],
                                                  ["encode", "+trajectory"]]
    # records made before the follow fields existed keep the old rule: one kept unit, no rule fires
    old = TaskResult(alone.task_id, False, failure={k: v for k, v in alone.failure.items()
                                                    if k not in ("evidence_followed", "foreign_injected")})
    assert classify(old) == "unattributed"


def test_tips_of_the_evidences_own_episodes_that_take_the_injected_text_from_its_route_are_declarative_crowding():
    """A site's third visit: two earlier deliveries from the coffer wrote a tip and a workflow each. Only their tips
    retrieved, or the word limit cutting the workflow behind them, is crowding (fewer tips / a goal-keyed store is
    the edit); the whole workflow behind them, or another task's tips, is not."""
    mem = MemorySystem(Arch(("tip", "workflow"), "json", "hybrid", "lightweight"), encoder=HashEncoder())
    for obj, holder in [("silver ladle", "coffer"), ("black whisk", "coffer"), ("golden trumpet", "locker")]:
        mem.store(_traj(obj, holder))
    items = mem.items_by_id()
    unit = {(it.meta["goal"].split("find the ")[1].split(" in ")[0], it.meta["kind"]): i for i, it in items.items()}
    meta = _meta("blue teapot", ["silver ladle", "black whisk", "golden trumpet"])
    task = Task("w0-fetch-blue_teapot", GOAL.format("blue teapot", "coffer"), meta={**meta, **world_evidence(
        meta, OBJECTS)})
    tips = [unit["silver ladle", "tip"], unit["black whisk", "tip"]]
    flow = unit["black whisk", "workflow"]
    only_tips = _failure(task, tips, mem)
    assert not only_tips.failure["evidence_retrieved"] and only_tips.failure["kept_kinds"] == ["tip", "tip"]
    assert only_tips.failure["crowded_by_declarative"] and classify(only_tips) == "declarative_crowding"
    full = "\n".join(items[i].text for i in [*tips, flow])
    cut = " ".join(full.split()[:-4])  # the word limit cut the workflow's last step
    behind = _failure(task, [*tips, flow], mem, actions=("go south", "take blue teapot from coffer"), memory=cut)
    assert behind.failure["evidence_injected"] and behind.failure["evidence_followed"]
    assert behind.failure["crowded_by_declarative"] and classify(behind) == "declarative_crowding"
    whole = _failure(task, [*tips, flow], mem, actions=("go south", "take blue teapot from coffer"), memory=full)
    assert not whole.failure["crowded_by_declarative"] and classify(whole) == "unattributed"
    first = _failure(task, [flow, *tips], mem, memory=" ".join(full.split()[:20]))  # the route first: not crowded
    assert not first.failure["crowded_by_declarative"]
    foreign = _failure(task, [unit["golden trumpet", "tip"]], mem)  # another holder's tip: a plain miss
    assert not foreign.failure["crowded_by_declarative"] and classify(foreign) == "retrieval_miss"
    g = diagnose([("a", only_tips), ("a", behind), ("a", foreign)], mem.arch)
    assert (g["module"], g["failure_mode"], g["histogram"]["E"]) == ("encode", "declarative_crowding", 2)
    assert g["recommended_edit"]["edits"] == [["encode", "-tip"], ["encode", "-insight"], ["store", "json"],
                                              ["store", "llm_graph"]]


def test_an_unseen_worlds_later_task_carries_the_sites_earlier_tasks():
    """In an unseen world nothing is delivered and no task has a sibling: the evidence of a site's later task is
    what the agent's own earlier episodes there took (out of scope when none of them did)."""
    meta = _meta("blue teapot", [], sibling=None)
    assert world_evidence(meta, OBJECTS) == {
        "evidence": ["take silver ladle from coffer", "take black whisk from coffer"],
        "sources": ["silver ladle", "black whisk"], "follow": ["coffer"]}
    assert world_evidence(_meta("silver ladle", [], sibling=None), OBJECTS) == {}      # the site's first task
    assert world_evidence(_meta("black whisk", [], sibling="w0-fetch-silver_ladle"), OBJECTS) == {}  # seen world
