"""Corpus loaders on the real bundled LoCoMo file and the shared HotpotQA sample (DESIGN §4)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from data_synthesis.corpora import (bundled_locomo_path, load_corpus, load_hotpotqa, load_locomo, sample_qa,
                                    normalize_locomo_evidence, split_episodes)
from routers.memory.schema import Episode, LoadStats

HOTPOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa" / "hotpotqa_train100.json"
LOCOMO_IDS = ["conv-26", "conv-30", "conv-41", "conv-42", "conv-43", "conv-44", "conv-47", "conv-48",
              "conv-49", "conv-50"]


@pytest.fixture(scope="module")
def locomo_with_stats():
    stats = LoadStats()
    return load_locomo(stats=stats), stats


@pytest.fixture(scope="module")
def locomo_raw():
    return json.loads(bundled_locomo_path().read_text(encoding="utf-8"))


# -- LoCoMo ------------------------------------------------------------------------------------------
def test_locomo_counts(locomo_with_stats):
    episodes, stats = locomo_with_stats
    assert len(episodes) == 10
    assert [e.episode_id for e in episodes] == LOCOMO_IDS
    assert all(e.source == "locomo" for e in episodes)
    assert sum(len(e.steps) for e in episodes) == 5882
    assert len({(e.episode_id, s.session) for e in episodes for s in e.steps}) == 272
    assert stats.episodes == 10
    assert stats.steps == 5882
    assert stats.qa_kept == 1536 == sum(len(e.qa) for e in episodes)
    assert stats.skipped_category == 446
    assert stats.skipped_no_evidence == 4
    assert stats.skipped_unknown_evidence == 0
    assert stats.normalized_evidence_ids == 7
    assert stats.unknown_evidence_ids == ["conv-42/D10:19", "conv-47/D4:36"]


def test_locomo_qa_content(locomo_with_stats):
    episodes, _ = locomo_with_stats
    cats = Counter(q.category for e in episodes for q in e.qa)
    assert "adversarial" not in cats
    assert cats == {"single-hop": 841, "temporal": 321, "multi-hop": 282, "open-domain": 92}
    for ep in episodes:
        ids = [q.qa_id for q in ep.qa]
        assert len(set(ids)) == len(ids)
        for q in ep.qa:
            assert q.qa_id.startswith(ep.episode_id + "/q")
            assert q.evidence, q.qa_id
            assert all(ep.has_step(e) for e in q.evidence), q.qa_id  # unknown ids were dropped
    # The two unknown evidence ids are not steps of their conversation.
    by_id = {e.episode_id: e for e in episodes}
    assert not by_id["conv-42"].has_step("D10:19")
    assert not by_id["conv-47"].has_step("D4:36")


def test_locomo_steps_ordered_and_unique(locomo_with_stats):
    episodes, _ = locomo_with_stats
    for ep in episodes:
        assert [s.index for s in ep.steps] == list(range(len(ep.steps)))
        assert len({s.step_id for s in ep.steps}) == len(ep.steps)
        sessions = [int(s.session) for s in ep.steps]
        assert sessions == sorted(sessions)  # sessions in numeric order (session_10 after session_9)


def test_locomo_include_adversarial():
    stats = LoadStats()
    episodes = load_locomo(include_adversarial=True, stats=stats)
    assert stats.qa_kept == 1982 == sum(len(e.qa) for e in episodes)
    assert stats.skipped_category == 0
    assert stats.skipped_no_evidence == 4
    adversarial = [q for e in episodes for q in e.qa if q.category == "adversarial"]
    assert len(adversarial) == 1982 - 1536
    assert all(q.answer for q in adversarial)  # taken from adversarial_answer


def test_locomo_stats_accumulate_across_calls():
    stats = LoadStats()
    load_locomo(stats=stats)
    load_locomo(stats=stats)
    assert stats.episodes == 20 and stats.qa_kept == 2 * 1536


@pytest.mark.parametrize("raw, expected, fixed", [
    (["D8:6; D9:17"], ["D8:6", "D9:17"], 1),
    (["D:11:26"], ["D11:26"], 1),
    (["D30:05"], ["D30:5"], 1),
    (["D9:1 D4:4 D4:6"], ["D9:1", "D4:4", "D4:6"], 1),
    (["D1:3", "D2:4"], ["D1:3", "D2:4"], 0),
    (["D1:3", "D1:3", "D1:03"], ["D1:3"], 1),
    (["D1:18", "D", "D1:20"], ["D1:18", "D1:20"], 1),
    ([], [], 0),
])
def test_normalize_locomo_evidence(raw, expected, fixed):
    assert normalize_locomo_evidence(raw) == (expected, fixed)


def test_locomo_step_rendering(locomo_with_stats):
    episodes, _ = locomo_with_stats
    first = episodes[0].steps[0]
    assert first.step_id == "D1:1"
    assert first.speaker == "Caroline"
    assert first.timestamp == "1:56 pm on 8 May, 2023"
    assert first.session == "1"
    assert first.render() == "[D1:1] (1:56 pm on 8 May, 2023) Caroline: Hey Mel! Good to see you! How have you been?"


def test_locomo_blip_captions(locomo_with_stats, locomo_raw):
    episodes, _ = locomo_with_stats
    step = episodes[0].step("D1:5")
    assert step.text.endswith("[shares a photo: a photo of a dog walking past a wall with a painting of a woman]")
    assert "[shares a photo:" in step.render()
    n_captions = sum(1 for conv in locomo_raw for k, v in conv["conversation"].items()
                     if k.startswith("session_") and isinstance(v, list) for t in v if t.get("blip_caption"))
    assert n_captions == 1226
    assert sum("[shares a photo: " in s.text for e in episodes for s in e.steps) == n_captions


def test_locomo_episode_roundtrip(locomo_with_stats):
    ep = locomo_with_stats[0][0]
    back = Episode.from_dict(json.loads(json.dumps(ep.to_dict())))
    assert back.to_dict() == ep.to_dict()
    assert back.step("D1:5").text == ep.step("D1:5").text


def test_split_episodes_by_episode(locomo_with_stats):
    episodes, _ = locomo_with_stats
    train, ev = split_episodes(episodes, eval_fraction=0.2, seed=0)
    train_ids, eval_ids = {e.episode_id for e in train}, {e.episode_id for e in ev}
    assert len(ev) == 2 and len(train) == 8
    assert train_ids.isdisjoint(eval_ids)
    assert train_ids | eval_ids == set(LOCOMO_IDS)
    # whole episodes move together: every question stays with its conversation
    assert all(q.qa_id.startswith(e.episode_id + "/") for e in ev for q in e.qa)
    assert sum(len(e.qa) for e in train) + sum(len(e.qa) for e in ev) == 1536
    # deterministic for a seed, independent of input order
    again = split_episodes(list(reversed(episodes)), eval_fraction=0.2, seed=0)
    assert {e.episode_id for e in again[1]} == eval_ids
    others = {frozenset(e.episode_id for e in split_episodes(episodes, 0.2, seed=s)[1]) for s in range(10)}
    assert len(others) > 1  # the seed matters
    # explicit ids win
    tr, evx = split_episodes(episodes, eval_ids=["conv-30", "conv-50"])
    assert [e.episode_id for e in evx] == ["conv-30", "conv-50"] and len(tr) == 8


def test_split_single_episode_goes_to_train(locomo_with_stats):
    one = locomo_with_stats[0][:1]
    assert split_episodes(one) == (one, [])


# -- HotpotQA ----------------------------------------------------------------------------------------
@pytest.mark.skipif(not HOTPOT.exists(), reason=f"{HOTPOT} missing")
def test_hotpotqa_loader():
    stats = LoadStats()
    episodes = load_hotpotqa(HOTPOT, stats=stats)
    raw = json.loads(HOTPOT.read_text(encoding="utf-8"))
    assert len(episodes) == 100 == stats.episodes
    assert stats.qa_kept == 100 and stats.unknown_evidence_ids == []
    assert len({e.episode_id for e in episodes}) == 100
    assert stats.steps == sum(len(e.steps) for e in episodes)
    for ep, item in zip(episodes, raw):
        assert ep.episode_id == item["_id"] and ep.source == "hotpotqa"
        assert len(ep.steps) == sum(len(sents) for _, sents in item["context"])
        (qa,) = ep.qa
        assert qa.question == item["question"] and qa.answer == str(item["answer"])
        context = {title: sents for title, sents in item["context"]}
        assert len(qa.evidence) == len(item["supporting_facts"])
        for sid, (title, si) in zip(qa.evidence, item["supporting_facts"]):
            assert sid == f"{title}#{si}"
            step = ep.step(sid)
            assert step.text == context[title][si].strip()
            assert step.speaker == title
    first = episodes[0]
    assert first.qa[0].evidence == ["Alû#3", "Lilu (mythology)#0"]
    assert first.step("Lilu (mythology)#0").text == (
        "A lilu or lilû is a masculine Akkadian word for a spirit, related to Alû, demon.")
    assert load_corpus("hotpotqa", str(HOTPOT))[0].episode_id == first.episode_id


def test_hotpotqa_missing_supporting_fact(tmp_path):
    item = {"_id": "x1", "question": "q?", "answer": "a", "type": "bridge",
            "context": [["T", ["s0.", " s1."]]], "supporting_facts": [["T", 1], ["T", 5], ["U", 0]]}
    path = tmp_path / "h.json"
    path.write_text(json.dumps([item]))
    stats = LoadStats()
    (ep,) = load_hotpotqa(path, stats=stats)
    assert ep.qa[0].evidence == ["T#1"] and ep.step("T#1").text == "s1."
    assert stats.unknown_evidence_ids == ["x1/T#5", "x1/U#0"]


# -- errors ------------------------------------------------------------------------------------------
def test_malformed_json_names_file(tmp_path):
    bad = tmp_path / "broken_locomo.json"
    bad.write_text('[{"sample_id": "c1",\n "conversation": {')
    with pytest.raises(ValueError, match="broken_locomo.json"):
        load_locomo(bad)
    with pytest.raises(ValueError, match="broken_locomo.json"):
        load_hotpotqa(bad)


def test_locomo_structure_errors(tmp_path):
    not_list = tmp_path / "obj.json"
    not_list.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="obj.json"):
        load_locomo(not_list)
    no_conv = tmp_path / "noconv.json"
    no_conv.write_text('[{"sample_id": "c1"}]')
    with pytest.raises(ValueError, match=r"noconv.json.*#0"):
        load_locomo(no_conv)
    with pytest.raises(ValueError, match="unknown corpus"):
        load_corpus("nope")
    with pytest.raises(ValueError, match="needs a path"):
        load_corpus("hotpotqa")


def test_sample_qa_is_seeded_random_and_keeps_file_order(locomo_episodes):
    ep = locomo_episodes[0]
    a, b = sample_qa(ep, 20, seed=0), sample_qa(ep, 20, seed=0)
    assert [q.qa_id for q in a] == [q.qa_id for q in b]
    assert len(a) == 20 and len({q.qa_id for q in a}) == 20
    order = [q.qa_id for q in ep.qa]
    assert [order.index(q.qa_id) for q in a] == sorted(order.index(q.qa_id) for q in a)
    assert [q.qa_id for q in a] != order[:20]          # not the biased head of the list
    assert [q.qa_id for q in sample_qa(ep, 20, seed=1)] != [q.qa_id for q in a]
    assert sample_qa(ep, None) == ep.qa and sample_qa(ep, 10_000) == ep.qa
