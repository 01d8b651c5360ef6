"""tau-bench trajectories as a corpus: evidence-exact questions from tool results, split by task."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from data_synthesis.corpora import load_corpus, split_episodes
from data_synthesis.taubench import DEFAULT_TAUBENCH
from data_synthesis.taubench_qa import occurs

REAL = Path(DEFAULT_TAUBENCH)


def _traj(task: int, trial: int, restate: bool) -> dict:
    user = {"membership": "gold", "email": "ann@example.com", "dob": "1990-01-01",
            "address": {"city": "Austin"}, "payment_methods": {}}
    call = {"id": "c1", "function": {"name": "get_user_details", "arguments": json.dumps({"user_id": "ann_1"})}}
    traj = [{"role": "system", "content": "policy"}, {"role": "user", "content": "Hi, I am ann_1."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "name": "get_user_details", "content": json.dumps(user)},
            {"role": "assistant", "content": "You are a gold member." if restate else "Found you."}]
    return {"task_id": task, "trial": trial, "reward": 1.0, "traj": traj}


def test_questions_come_from_tool_results_and_restated_answers_are_dropped(tmp_path):
    path = tmp_path / "tb.json"
    path.write_text(json.dumps([_traj(0, 0, False), _traj(0, 1, True)]))
    a, b = load_corpus("taubench", str(path))
    assert [s.speaker for s in a.steps] == ["user", "agent", "tool", "agent"]
    assert a.steps[2].text.startswith('get_user_details({"user_id": "ann_1"}) returned: {')
    qa = {q.meta["template"]: q for q in a.qa}
    assert qa["user_membership"].answer == "gold" and qa["user_membership"].evidence == ["s2"]
    assert "user_membership" not in {q.meta["template"] for q in b.qa}  # "gold" restated by the agent
    assert b.meta["dropped_questions"]["answer_outside_evidence"] == 1
    assert a.meta["split_group"] == b.meta["split_group"] == "task0"


@pytest.fixture(scope="module")
def episodes():
    if not REAL.exists():
        pytest.skip(f"{REAL} not present")
    return load_corpus("taubench", str(REAL))


def test_real_corpus_is_evidence_exact(episodes):
    assert len(episodes) == 200
    n = 0
    for ep in episodes:
        for q in ep.qa:
            ev = set(q.evidence)
            terms = q.meta["answer_terms"]
            assert terms and all(any(occurs(t, ep.step(e).text) for e in ev) for t in terms), q
            assert all(occurs(k, "\n".join(ep.step(e).text for e in ev)) for k in q.meta["keys"]), q
            assert not any(occurs(t, s.text) for s in ep.steps if s.step_id not in ev for t in terms), q
            if len(terms) == 1:
                assert terms[0] == q.answer or terms[0].replace("_", " ") == q.answer or \
                    float(terms[0]) == float(q.answer), q
            n += 1
    cats = Counter(q.category for ep in episodes for q in ep.qa)
    assert n > 1000 and cats["single-hop"] > 500 and cats["multi-hop"] > 100
    assert all(len(q.evidence) == 2 for ep in episodes for q in ep.qa if q.category == "multi-hop")


def test_deterministic_and_split_by_task(episodes):
    again = load_corpus("taubench", str(REAL))
    assert [[(q.question, q.answer, q.evidence) for q in e.qa] for e in again] == \
        [[(q.question, q.answer, q.evidence) for q in e.qa] for e in episodes]
    train, held = split_episodes(episodes, 0.2, 0)
    tasks = lambda eps: {e.meta["task_id"] for e in eps}  # noqa: E731
    assert not tasks(train) & tasks(held) and len(tasks(held)) == 10 and len(held) == 40


def test_synth_configs_take_taubench():
    from data_synthesis.retriever import RetrieverSynthConfig
    from data_synthesis.sufficiency import SufficiencySynthConfig

    assert SufficiencySynthConfig(corpus="taubench").corpus == "taubench"
    assert "taubench" in RetrieverSynthConfig(corpora=["taubench"]).corpora
