"""MemAgent router: prompts and parsers, completion-only SFT, export/reload, evaluation metrics (DESIGN §6)."""

from __future__ import annotations

import pytest

from routers.memagent import prompts as P
from routers.memagent.protocol import Preview, Task, Trajectory, TrajectoryStep


class FakeProvider:
    def __init__(self, name: str, gate: str = "all"):
        self.name, self.gate = name, gate

    def describe_storage(self) -> str:
        return f"{self.name} keeps trajectory summaries"

    def describe_retrieval(self) -> str:
        return f"{self.name} finds similar tasks"


NAMES = [("Voyager", "all"), ("ExpeL", "all"), ("Agent-KB", "success"), ("Mobile-E", "success"), ("AWM", "all")]
PROVIDERS = {n: FakeProvider(n, g) for n, g in NAMES}


def make_trajectory(n_steps: int = 4, success: bool = True, task_id: str = "t1") -> Trajectory:
    steps = [TrajectoryStep(i, f"You are in room {i}. There is a door.", f"go east {i}") for i in range(n_steps)]
    return Trajectory(Task(task_id, "Put the apple in the fridge."), steps, success, begin_provider="Voyager")


# -- prompts -----------------------------------------------------------------------------------------
def test_begin_prompt_carries_descriptions_previews_and_goal_last():
    pv = [Preview("Voyager", 0.8123, "take apple from table", 5), Preview("ExpeL", 0.0, "", 0)]
    msgs = P.begin_messages("Put the apple in the fridge.", pv, PROVIDERS)
    assert [m["role"] for m in msgs] == ["system", "user"]
    user = msgs[1]["content"]
    assert "Storage: Voyager keeps trajectory summaries" in user
    assert "Retrieval: AWM finds similar tasks" in user
    assert 'Preview: score 0.812, 5 items: "take apple from table"' in user
    assert "2. ExpeL" in user and user.count("(empty store)") == 1 and user.count("(no preview)") == 3
    assert "Options: None, Voyager, ExpeL, Agent-KB, Mobile-E, AWM" in user
    assert user.endswith("Task: Put the apple in the fridge.\n\n" + P.BEGIN_QUESTION)
    with pytest.raises(ValueError, match="Unknown"):
        P.begin_messages("g", [Preview("Unknown", 0.1, "x", 1)], PROVIDERS)


def test_end_prompt_has_gate_and_caps_steps():
    traj = make_trajectory(n_steps=30, success=False)
    msgs = P.end_messages(traj, PROVIDERS)
    user = msgs[1]["content"]
    assert "Outcome: failure (30 steps)" in user
    assert "3. Agent-KB: Agent-KB keeps trajectory summaries [gate: stores successful trajectories only]" in user
    assert "1. Voyager: Voyager keeps trajectory summaries [gate: stores all outcomes]" in user
    assert user.count("\nStep ") == P.END_MAX_STEPS and "(18 steps omitted)" in user
    assert "Step 0: " in user and "Step 29: " in user and "Step 6: " not in user
    per = P.end_provider_messages(msgs, "ExpeL")
    assert per[1]["content"].endswith("Should ExpeL store this trajectory? Answer yes or no.")
    assert per[1]["content"][: -len("Should ExpeL store this trajectory? Answer yes or no.")] == \
        user[: -len(P.END_QUESTION)]
    assert msgs[1]["content"] == user  # not mutated
    with pytest.raises(ValueError, match="not an End prompt"):
        P.end_provider_messages(P.in_messages("g", 1, "x"), "ExpeL")


def test_in_prompt():
    user = P.in_messages("Find the key.", 3, "Collected Data:\n- key is in the drawer\n- door locked")[1]["content"]
    assert user == ("Short-term memory summary:\nCollected Data:\n- key is in the drawer\n- door locked\n\n"
                    "Task: Find the key.\nStep: 3\n\n" + P.IN_QUESTION)
    assert "(empty)" in P.in_messages("g", 0, "  ")[1]["content"]


@pytest.mark.parametrize("name", [None, "Voyager", "Agent-KB", "Mobile-E", "AWM"])
def test_begin_round_trip(name):
    assert P.parse_begin(P.begin_completion(name), PROVIDERS) == name


@pytest.mark.parametrize("query", [True, False])
def test_in_round_trip(query):
    assert P.parse_in(P.in_completion(query)) is query


@pytest.mark.parametrize("names", [[], ["ExpeL"], ["Voyager", "Agent-KB", "AWM"], ["Mobile-E", "Voyager"]])
def test_end_round_trip(names):
    assert P.parse_end(P.end_completion(names), PROVIDERS) == names


def test_parsers_are_robust_and_fail_clearly():
    assert P.parse_begin("Provider: agent kb.", PROVIDERS) == "Agent-KB"
    assert P.parse_begin("  `Mobile-E` because tips help", PROVIDERS) == "Mobile-E"
    assert P.parse_begin("No memory", PROVIDERS) is None
    assert P.parse_begin("none.", PROVIDERS) is None
    assert P.parse_in("noop.") is False and P.parse_in("Answer: QUERY") is True
    assert P.parse_end("expel and mobile-e; Voyager, expel", PROVIDERS) == ["ExpeL", "Mobile-E", "Voyager"]
    assert P.parse_end("none", PROVIDERS) == [] and P.parse_end("", PROVIDERS) == []
    assert P.end_completion(["AWM", "AWM"]) == "AWM"
    with pytest.raises(ValueError, match="cannot parse a Begin"):
        P.parse_begin("the kitchen", PROVIDERS)
    with pytest.raises(ValueError, match="cannot parse an In"):
        P.parse_in("maybe later")
    with pytest.raises(ValueError, match="unknown provider 'Zep'"):
        P.parse_end("Voyager, Zep", PROVIDERS)
    with pytest.raises(ValueError, match="gate"):
        P.end_messages(make_trajectory(), {"X": FakeProvider("X", gate="sometimes")})


# -- fake supervision records ------------------------------------------------------------------------
GOALS = ["Put the apple in the fridge.", "Find the key and open the chest.", "Cook the egg on the stove.",
         "Take the book to the bedroom."]


def write_jsonl(path, records) -> str:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def fake_phase_files(tmp_path, n_tasks: int = 4) -> dict[str, str]:
    """Begin/In/End records as the exploration helper writes them (TRL conversational prompt-completion)."""
    begin, inn, end = [], [], []
    names = list(PROVIDERS)
    for i in range(n_tasks):
        goal, tid = GOALS[i % len(GOALS)], f"task{i}"
        previews = [Preview(n, 0.1 * (j + 1), f"memory {j} about {goal}", j) for j, n in enumerate(names)]
        choice = [None, "Voyager", "AWM", "ExpeL"][i % 4]
        begin.append({"prompt": P.begin_messages(goal, previews, PROVIDERS),
                      "completion": [{"role": "assistant", "content": P.begin_completion(choice)}],
                      "phase": "begin", "task_id": tid, "reward": 1.0})
        for step in range(2):
            query = (i + step) % 2 == 0
            inn.append({"prompt": P.in_messages(goal, step, "Collected Data:\n- fact a\n- fact b" if query else ""),
                        "completion": [{"role": "assistant", "content": P.in_completion(query)}],
                        "phase": "in", "task_id": tid, "reward": 0.8})
        traj = make_trajectory(n_steps=3, success=i % 2 == 0, task_id=tid)
        end.append({"prompt": P.end_messages(traj, PROVIDERS),
                    "completion": [{"role": "assistant", "content": P.end_completion(names[: i % 3])}],
                    "phase": "end", "task_id": tid, "reward": 1.0})
    return {ph: write_jsonl(tmp_path / f"{ph}.jsonl", recs) for ph, recs in (("begin", begin), ("in", inn), ("end", end))}
