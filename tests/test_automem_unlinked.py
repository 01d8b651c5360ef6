"""``trajectory_facts`` and ``diagnose_unlinked`` (worlds_tight_noholder_cpu seed 0): goals that name the object but
not its container ("find the golden teapot") leave retrieval nothing to match but the object. The rule trajectory kept
each observation's first words (a room's description) and dropped the step that saw "The coffer contains ... a golden
teapot", so no unit linked the object to the coffer's route, and the diagnosis read every such failure as a ranking
miss (retrieval_miss, Retrieve edits) on all four rounds."""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(__file__))
from memagent_provider_fakes import HashEncoder  # noqa: E402

from routers.automem import Arch, MemorySystem, TaskResult, classify, diagnose  # noqa: E402
from routers.automem.encoders import observed_facts, rule_trajectory  # noqa: E402
from routers.automem.evaluate import DIAGNOSED_VERSION, RECORD_VERSION, RolloutEvaluator  # noqa: E402
from routers.automem.evidence import world_evidence  # noqa: E402
from routers.automem.proposer import Proposal, RuleProposer  # noqa: E402
from routers.automem.search import run_automem  # noqa: E402
from routers.automem.trace import EvaluationStore  # noqa: E402
from routers.memagent.protocol import Task, Trajectory, TrajectoryStep  # noqa: E402

OBJECTS = {"blue skillet": "coffer", "yellow whisk": "coffer", "golden teapot": "coffer", "old scroll": "locker"}
GOAL = "In Harbor House, find the {} and put it on the table in the foyer."
HOLDER_GOAL = "In Harbor House, find the {} in the {} and put it on the table in the foyer."
FOYER = ("-= Foyer =- You are in a foyer. An usual one. You begin looking for stuff. You make out an opened cupboard "
         "here. The cupboard is empty! What a waste of a day! You smell an interesting smell, and follow it to a "
         "table. The table is usual. Why not try going south, that entranceway is unblocked.")
LIBRARY = ("-= Library =- Ah, the library. This is some kind of library, really great typical vibes in this place, "
           "a wonderful typical atmosphere. You make out a desk. There is an exit to the west.")
SCULLERY = ("-= Scullery =- You are in a scullery. An ordinary kind of place. You can see an opened {h}. The {h} "
            "contains a {o}, {rest}. You should try going east.")
CONTENTS = {"coffer": "a yellow whisk, a golden teapot and a wooden ladle", "locker": "a red cup and a black hat"}


def _fetch(obj="blue skillet", holder="coffer") -> Trajectory:
    """A TextWorld fetch as the suite plays it: each step's observation is what the agent saw before acting."""
    there = SCULLERY.format(h=holder, o=obj, rest=CONTENTS[holder])
    obs = [FOYER, LIBRARY, there, f"You take the {obj} from the {holder}.", LIBRARY, FOYER]
    acts = ["go south", "go west", f"take {obj} from {holder}", "go east", "go north", f"put {obj} on table"]
    steps = [TrajectoryStep(i, o, a) for i, (o, a) in enumerate(zip(obs, acts))]
    return Trajectory(Task(f"t-{obj}", GOAL.format(obj)), steps, success=True)


def test_observed_facts_keep_the_sentences_naming_what_was_acted_on():
    names = {"coffer"}
    assert observed_facts(SCULLERY.format(h="coffer", o="blue skillet", rest=CONTENTS["coffer"]), names) == (
        "You can see an opened coffer. The coffer contains a blue skillet, a yellow whisk, a golden teapot and a "
        "wooden ladle.")
    assert observed_facts(FOYER, {"table"}) == (
        "You smell an interesting smell, and follow it to a table. The table is usual.")
    assert observed_facts("In X, find the blue skillet. It is here.", names, goal="In X, find the blue skillet.") == ""


def test_facts_keep_what_the_holder_contained_where_the_first_words_keep_the_rooms():
    traj = _fetch()
    plain = rule_trajectory(traj)[0].text
    assert "golden teapot" not in plain and "An usual one" in plain   # the scullery's step was dropped
    assert rule_trajectory(traj, facts=True)[0].text == "\n".join([
        "Task: In Harbor House, find the blue skillet and put it on the table in the foyer.", "Outcome: success",
        "Actions: go south; go west; take blue skillet from coffer; go east; go north; put blue skillet on table",
        "Seen: You can see an opened coffer. The coffer contains a blue skillet, a yellow whisk, a golden teapot and a "
        "wooden ladle. You take the blue skillet from the coffer."])  # the table the goal names is no news


def _memory(facts: bool) -> MemorySystem:
    mem = MemorySystem(Arch(("trajectory",), "hybrid", "hybrid", "lightweight"), encoder=HashEncoder(), k=1,
                       trajectory_facts=facts)
    mem.store(_fetch("blue skillet", "coffer"))
    mem.store(_fetch("old scroll", "locker"))  # the same rooms, another holder: only the facts tell them apart
    return mem


def test_a_goal_naming_only_its_object_retrieves_the_episode_that_saw_it():
    mem = _memory(True)
    got = mem.retrieve(GOAL.format("golden teapot")).text
    assert "take blue skillet from coffer" in got and "locker" not in got
    assert mem.params()["trajectory_facts"] is True and _memory(False).params()["trajectory_facts"] is False


def _failure(task, mem):
    ev = RolloutEvaluator(env=None, agent=None)
    r = SimpleNamespace(trajectory=Trajectory(task=task, steps=[TrajectoryStep(0, "Nothing.", "look")],
                                              success=False), injected_tokens=0)
    other = next(i for i, it in mem.items_by_id().items() if "locker" in it.text)
    trace = {"pool": len(mem.items_by_id()), "retrieved": [other], "kept": [other], "dropped": []}
    return ev._result(task, r, mem.items_by_id()[other].text, trace, ["take blue skillet from coffer"], mem, 0)


def _task(goal):
    meta = {"world_id": "w0", "family": "fetch", "object": "golden teapot", "holder": "coffer",
            "delivered": ["blue skillet"], "demonstration": False, "moved": None}
    return Task("w0-fetch-golden_teapot", goal, meta={**meta, **world_evidence(meta, OBJECTS)})


def test_a_miss_no_unit_could_be_ranked_for_is_unlinked_evidence():
    task = _task(GOAL.format("golden teapot"))
    unlinked = _failure(task, _memory(False))
    assert unlinked.failure["evidence_in_pool"] and not unlinked.failure["evidence_retrieved"]
    assert unlinked.failure["evidence_linked"] is False
    assert classify(unlinked) == "retrieval_miss"                     # off: as before
    assert classify(unlinked, unlinked=True) == "unlinked_evidence"
    linked = _failure(task, _memory(True))                            # the facts name the teapot beside the route
    assert linked.failure["evidence_linked"] is True and classify(linked, unlinked=True) == "retrieval_miss"
    # a goal that names the holder links through it; a record without the field keeps the old rule
    named = _failure(_task(HOLDER_GOAL.format("golden teapot", "coffer")), _memory(False))
    assert named.failure["evidence_linked"] is True and classify(named, unlinked=True) == "retrieval_miss"
    old = TaskResult(task.task_id, False, failure={k: v for k, v in unlinked.failure.items() if k != "evidence_linked"})
    assert classify(old, unlinked=True) == "retrieval_miss"
    arch = Arch(("workflow",), "json", "hybrid", "lightweight")
    off, on = diagnose([("a", unlinked)] * 3, arch), diagnose([("a", unlinked)] * 3, arch, diagnose_unlinked=True)
    assert (off["module"], off["failure_mode"]) == ("retrieve", "retrieval_miss")
    assert (on["module"], on["failure_mode"], on["histogram"]["E"]) == ("encode", "unlinked_evidence", 3)
    assert on["recommended_edit"]["edits"] == [["encode", "+trajectory"], ["store", "hybrid"], ["store", "vector"]]


LEADER = Arch(("workflow",), "json", "hybrid", "lightweight")
OTHER = Arch(("tip",), "vector", "mmr", "lightweight")
FIX = LEADER.edit("encode", "+trajectory")


class FixedInit(RuleProposer):
    def _init(self, ctx, k):
        return [Proposal(OTHER, "init"), Proposal(LEADER, "init")]


def _unlinked(task_id):
    return TaskResult(task_id, False, tokens=10, steps=9, failure={
        "timeout": False, "evidence_seen": True, "evidence_in_pool": True, "evidence_retrieved": False,
        "evidence_injected": False, "stale_injected": False, "source_units": 3, "evidence_linked": False,
        "kept_kinds": ["workflow"], "memory": {"pool": 4, "retrieved": ["a"], "kept": ["a"]}})


def _evaluate(arch, tasks):
    """The leader solves 2 of 4 (its misses unlinked), the leader with the trajectory all 4, anything else 1."""
    key = arch.key if arch is not None else None
    solved = {None: 0, LEADER.key: 2, FIX.key: 4}.get(key, 1)
    return [TaskResult(t.task_id, True, tokens=10, steps=3) if i < solved else _unlinked(t.task_id)
            for i, t in enumerate(tasks)]


def test_the_search_adds_the_trajectory_for_unlinked_evidence_and_keys_the_option(tmp_path):
    S, V = [Task(f"s-{i}", "fetch") for i in range(4)], [Task(f"v-{i}", "fetch") for i in range(4)]
    kw = dict(budget=4, k=2, seed=0, proposer=FixedInit(), diagnose_scope="leader", final_validate=1)
    off = run_automem(_evaluate, S, V, trace_path=tmp_path / "off.json", **kw)
    on = run_automem(_evaluate, S, V, trace_path=tmp_path / "on.json", diagnose_unlinked=True, **kw)
    assert off["gradients"][0]["failure_mode"] == "retrieval_miss" and FIX.key not in [
        p["arch"] for p in off["evaluations"]]
    assert on["gradients"][0]["failure_mode"] == "unlinked_evidence"
    assert [(p["round"], p["edit"], p["arch"]) for p in on["evaluations"]][2] == (2, ["encode", "+trajectory"],
                                                                                  FIX.key)
    assert on["best"]["arch"] == FIX.key and on["best"]["validation_accuracy"] == 1.0
    fps = [json.loads((tmp_path / f"{n}.json").read_text())["fingerprint"] for n in ("off", "on")]
    assert "diagnose_unlinked" not in fps[0] and fps[1]["diagnose_unlinked"] is True


def test_with_the_option_search_records_without_evidence_linked_are_played_again(tmp_path):
    """The default diagnosis reads record v3, so the stores written before v4 keep replaying; ``diagnose_unlinked``
    reads v4's field, so it plays their search-batch memory evaluations again."""
    assert (DIAGNOSED_VERSION, RECORD_VERSION) == (3, 4)
    S, V = [Task(f"s-{i}", "fetch") for i in range(4)], [Task(f"v-{i}", "fetch") for i in range(4)]
    path = tmp_path / "evaluations.jsonl"
    run_automem(_evaluate, S, V, budget=4, k=2, seed=0, proposer=FixedInit(), trace_path=None,
                store=EvaluationStore(path, {"env": "x"}))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, "id": r["id"].replace(":r4", ":r3")}) + "\n" for r in lines))
    calls = []

    def counting(arch, tasks):
        calls.append((arch.key if arch is not None else None, tasks[0].task_id[0]))
        return _evaluate(arch, tasks)

    kw = dict(budget=4, k=2, seed=0, proposer=FixedInit(), trace_path=None)
    run_automem(counting, S, V, store=EvaluationStore(path, {"env": "x"}), **kw)
    assert calls == []
    run_automem(counting, S, V, store=EvaluationStore(path, {"env": "x"}), diagnose_unlinked=True, **kw)
    # the stored round 1 on the search batch is played again (the baselines and the validation replay); the search
    # then goes where its new diagnosis sends it
    assert calls[:2] == [(OTHER.key, "s"), (LEADER.key, "s")] and (None, "s") not in calls
    assert (LEADER.key, "v") not in calls
