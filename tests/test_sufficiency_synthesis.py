"""Evidence-intervention synthesis on the real bundled LoCoMo (DESIGN §5, §9), offline and fast.

No MiniLM (``encoder="none"``: entity-overlap miner) and no answer model unless a fake is injected.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data_synthesis.corpora import sample_qa
from routers.io import RecordError, read_jsonl
from data_synthesis.sufficiency import SufficiencySynthConfig, SufficiencySynthesizer
from data_synthesis.sufficiency_samples import (RECORD_FIELDS, SCHEMA_VERSION, DistractorMiner, build_candidates,
                                                leaks_answer, length_matched)
from routers.memory.schema import Episode, Step
from routers.text import answers_correctly
from routers.memory.retrieval import HybridRetriever

REPO = Path(__file__).resolve().parents[1]
CAPS = dict(max_qa_per_episode=3, max_eval_qa_per_episode=2)


def _cfg(out, **kw) -> SufficiencySynthConfig:
    return SufficiencySynthConfig(output_dir=str(out), encoder="none", answer_models=["none"], **{**CAPS, **kw})


def _lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


def _records(path: Path) -> list[dict]:
    return list(read_jsonl(path, required=RECORD_FIELDS))


def _expected_ids(episodes, episode_ids, cap) -> list[str]:
    """What an uninterrupted run without answer models must produce: one positive + one negative per QA."""
    out = []
    for ep in episodes:
        if ep.episode_id not in episode_ids:
            continue
        for qa in sample_qa(ep, cap, seed=0):
            out += [f"{qa.qa_id}/positive", f"{qa.qa_id}/{'partial' if len(qa.evidence) > 1 else 'none'}"]
    return out


@pytest.fixture(scope="module")
def episodes_by_id(locomo_episodes):
    return {e.episode_id: e for e in locomo_episodes}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "data"
    stats = SufficiencySynthesizer(_cfg(out)).run(progress=False)
    return out, stats


# -- record invariants -------------------------------------------------------------------------------
def test_expected_ids_and_split(small_run, locomo_episodes):
    out, _ = small_run
    manifest = json.loads((out / "manifest.json").read_text())
    train_eps, eval_eps = set(manifest["train_episodes"]), set(manifest["eval_episodes"])
    assert train_eps and eval_eps and not train_eps & eval_eps
    assert train_eps | eval_eps == {e.episode_id for e in locomo_episodes}
    train, evals = _records(out / "train.jsonl"), _records(out / "eval.jsonl")
    assert sorted(r["id"] for r in train) == sorted(_expected_ids(locomo_episodes, train_eps, 3))
    assert sorted(r["id"] for r in evals) == sorted(_expected_ids(locomo_episodes, eval_eps, 2))
    assert {r["episode_id"] for r in train} == train_eps
    assert {r["episode_id"] for r in evals} == eval_eps
    assert not {r["qa_id"] for r in train} & {r["qa_id"] for r in evals}


def test_positive_and_negative_evidence(small_run, episodes_by_id):
    out, _ = small_run
    recs = _records(out / "train.jsonl") + _records(out / "eval.jsonl")
    n_partial = n_none = 0
    for r in recs:
        assert r["schema_version"] == SCHEMA_VERSION
        ep = episodes_by_id[r["episode_id"]]
        qa = next(q for q in ep.qa if q.qa_id == r["qa_id"])
        evidence, ctx = qa.evidence, set(r["context_step_ids"])
        assert r["evidence_ids"] == evidence and r["question"] == qa.question and r["answer"] == qa.answer
        assert len(ctx) == len(r["context_step_ids"])  # no step twice
        assert set(r["present_evidence"]) == ctx & set(evidence)
        assert set(r["missing_evidence"]) == set(evidence) - ctx
        # Distractors never contain the whole gold answer.
        for sid in ctx - set(evidence):
            assert not leaks_answer(ep.step(sid), qa.answer), (r["id"], sid)
        if r["label"] == 1:
            assert r["variant"] == "positive" and r["id"].endswith("/positive")
            assert set(evidence) <= ctx and r["missing_evidence"] == []
            assert len(ctx) > len(evidence)  # plus at least one distractor
            assert "sufficient" in r["rationale"]
        else:
            assert r["label"] == 0 and r["id"] == f"{r['qa_id']}/{r['variant']}"
            assert not set(evidence) <= ctx, r["id"]  # at least one evidence step dropped
            if r["variant"] == "partial":
                n_partial += 1
                assert len(evidence) > 1 and 0 < len(ctx & set(evidence)) < len(evidence)
            else:
                n_none += 1
                assert r["variant"] == "none" and len(evidence) == 1 and not ctx & set(evidence)
            assert "insufficient" in r["rationale"]
        assert r["rationale_source"] == "template" and r["answer_check"] == []
    assert n_partial and n_none


def test_contexts_in_temporal_order(small_run, episodes_by_id):
    out, _ = small_run
    for r in _records(out / "train.jsonl") + _records(out / "eval.jsonl"):
        ep = episodes_by_id[r["episode_id"]]
        idx = [ep.step(s).index for s in r["context_step_ids"]]
        assert idx == sorted(idx), r["id"]
        pos = [r["context"].index(f"[{s}]") for s in r["context_step_ids"]]
        assert pos == sorted(pos)
        for s in r["context_step_ids"]:
            assert ep.step(s).text in r["context"]


def test_stats_match_files(small_run):
    out, stats = small_run
    on_disk = json.loads((out / "stats.json").read_text())
    assert on_disk == json.loads(json.dumps(stats))
    for split in ("train", "eval"):
        recs = _records(out / f"{split}.jsonl")
        assert on_disk[split]["samples"] == len(_lines(out / f"{split}.jsonl")) == len(recs)
        assert on_disk[split]["positives"] == sum(r["label"] == 1 for r in recs)
        assert on_disk[split]["negatives"] == sum(r["label"] == 0 for r in recs)
        assert sum(on_disk[split]["by_variant"].values()) == len(recs)
        assert on_disk[split]["episodes"] == sorted({r["episode_id"] for r in recs})
    assert on_disk["train"]["samples"] == 48 and on_disk["eval"]["samples"] == 8
    assert on_disk["discarded_by_answer_models"] == {"train": 0, "eval": 0}
    assert _lines(out / "discarded.jsonl") == []


def test_records_load_with_datasets(small_run, tmp_path):
    from datasets import load_dataset

    out, _ = small_run
    ds = load_dataset("json", data_files={"train": str(out / "train.jsonl"), "eval": str(out / "eval.jsonl")},
                      cache_dir=str(tmp_path / "hf"))
    assert ds["train"].num_rows == len(_lines(out / "train.jsonl"))
    assert ds["eval"].num_rows == len(_lines(out / "eval.jsonl"))
    assert set(RECORD_FIELDS) <= set(ds["train"].column_names)
    assert sorted(ds["train"]["id"]) == sorted(r["id"] for r in _records(out / "train.jsonl"))


# -- answer-model filter and teacher -----------------------------------------------------------------
class GoldAnswerer:
    """Answers every question correctly (looked up from the question text), whatever the memory says."""

    name = "fake-oracle"

    def __init__(self, episodes):
        self.answers: dict[str, list[str]] = {}
        for ep in episodes:
            for qa in ep.qa:
                self.answers.setdefault(qa.question, []).append(qa.answer)
        self.seen: list[str] = []

    def generate(self, conversations, max_new_tokens=64):
        out = []
        for conv in conversations:
            user = conv[-1]["content"]
            question = user.rsplit("\n\nQuestion: ", 1)[1].rsplit("\nAnswer:", 1)[0]
            self.seen.append(question)
            out.append(" | ".join(self.answers[question]))
        return out


class FakeTeacher:
    name = "fake-teacher"

    def __init__(self):
        self.calls = 0

    def generate(self, conversations, max_new_tokens=64):
        out = []
        for conv in conversations:
            self.calls += 1
            user = conv[-1]["content"]
            assert "Gold answer:" in user and "Retrieved memory:" in user
            question = user.split("\n", 1)[0][len("Question: "):]
            out.append("" if len(question) % 4 == 0 else f"Rationale about: {question}")
        return out


def test_answer_model_discards_every_negative(tmp_path, locomo_episodes):
    out = tmp_path / "filtered"
    backend = GoldAnswerer(locomo_episodes)
    stats = SufficiencySynthesizer(_cfg(out), answer_backends=[backend]).run(progress=False)
    train, evals = _records(out / "train.jsonl"), _records(out / "eval.jsonl")
    assert train and evals and all(r["label"] == 1 for r in train + evals)
    discarded = _records(out / "discarded.jsonl")
    assert len(discarded) == 24 + 4 == len(backend.seen)  # one negative per QA, positives never asked
    assert all(r["label"] == 0 for r in discarded)
    assert {r["split"] for r in discarded} == {"train", "eval"}
    for r in discarded:
        assert r["reason"] and r["answer_check"][-1]["model"] == "fake-oracle" and r["answer_check"][-1]["correct"]
        assert answers_correctly(r["answer_check"][-1]["prediction"], r["answer"])
    assert stats["discarded_by_answer_models"] == {"train": 24, "eval": 4}
    assert stats["train"]["negatives"] == 0 and stats["train"]["positives"] == 24
    # A rerun finds every id done (kept or discarded) and asks the answer model nothing.
    again = GoldAnswerer(locomo_episodes)
    SufficiencySynthesizer(_cfg(out), answer_backends=[again]).run(progress=False)
    assert again.seen == []
    assert len(_lines(out / "discarded.jsonl")) == 28 and len(_lines(out / "train.jsonl")) == 24


def test_wrong_answer_model_keeps_negatives(tmp_path):
    class Wrong:
        name = "wrong"

        def generate(self, conversations, max_new_tokens=64):
            return ["purple elephant"] * len(conversations)

    out = tmp_path / "kept"
    stats = SufficiencySynthesizer(_cfg(out), answer_backends=[Wrong()]).run(progress=False)
    assert stats["train"]["negatives"] == 24 and stats["discarded_by_answer_models"] == {"train": 0, "eval": 0}
    for r in _records(out / "train.jsonl"):
        if r["label"] == 0:
            assert r["answer_check"] == [{"model": "wrong", "prediction": "purple elephant", "correct": False}]
        else:
            assert r["answer_check"] == []


def test_teacher_rationales(tmp_path):
    out = tmp_path / "teacher"
    teacher = FakeTeacher()
    SufficiencySynthesizer(_cfg(out), answer_backends=[], teacher=teacher).run(progress=False)
    recs = _records(out / "train.jsonl") + _records(out / "eval.jsonl")
    assert teacher.calls == len(recs)
    by_source = {"teacher": 0, "template": 0}
    for r in recs:
        if len(r["question"]) % 4 == 0:  # the teacher returned nothing: the template stays
            assert r["rationale_source"] == "template" and "The memory is" in r["rationale"]
            by_source["template"] += 1
        else:
            assert r["rationale_source"] == "teacher:fake-teacher"
            assert r["rationale"] == f"Rationale about: {r['question']}"
            by_source["teacher"] += 1
    assert by_source["teacher"] and by_source["template"]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["train"]["rationale_source"].get("teacher", 0) > 0


# -- retrieval-prefix samples -----------------------------------------------------------------------
def test_prefix_samples_are_the_shared_prefix_labelled_by_evidence(tmp_path, episodes_by_id):
    """Each prefix sample is exactly the executor's C_f (top-k, temporal order); label = all evidence retrieved."""
    out = tmp_path / "prefix"
    cfg = _cfg(out, intervention_samples=False, prefix_top_k=[2, 6], prefix_encoder="none",
               max_qa_per_episode=8, max_eval_qa_per_episode=4)
    SufficiencySynthesizer(cfg, answer_backends=[]).run(progress=False)
    recs = _records(out / "train.jsonl") + _records(out / "eval.jsonl")
    bm25 = HybridRetriever(encoder="none")
    labels, ks = set(), set()
    for r in recs:
        ep = episodes_by_id[r["episode_id"]]
        qa = next(q for q in ep.qa if q.qa_id == r["qa_id"])
        k = r["prefix_top_k"]
        hits = [h.step.step_id for h in bm25.retrieve(qa.question, ep, k)]
        assert sorted(r["context_step_ids"]) == sorted(hits) and len(hits) == k
        idx = [ep.step(s).index for s in r["context_step_ids"]]
        assert idx == sorted(idx)
        evidence = set(qa.evidence)
        assert r["label"] == int(evidence <= set(hits))
        assert set(r["present_evidence"]) == evidence & set(hits)
        assert set(r["missing_evidence"]) == evidence - set(hits)
        want = ("prefix_positive" if r["label"] else
                "prefix_partial" if r["present_evidence"] else "prefix_none")
        assert r["variant"] == want and r["id"] == f"{r['qa_id']}/{want}"
        labels.add(r["label"])
        ks.add(k)
    assert len(recs) == 8 * len(json.loads((out / "manifest.json").read_text())["train_episodes"]) + 4 * 2
    assert labels == {0, 1} and ks == {2, 6}


def test_prefix_samples_next_to_intervention_pairs(tmp_path, small_run):
    """Turning prefix samples on adds exactly one record per question and leaves the pairs unchanged."""
    fresh, _ = small_run
    out = tmp_path / "both"
    SufficiencySynthesizer(_cfg(out, prefix_top_k=[5], prefix_encoder="none"), answer_backends=[]).run(progress=False)
    for split in ("train", "eval"):
        recs = {r["id"]: r for r in _records(out / f"{split}.jsonl")}
        pairs = {r["id"]: r for r in _records(fresh / f"{split}.jsonl")}
        prefix = {i for i in recs if "/prefix_" in i}
        assert set(recs) - prefix == set(pairs)
        assert all(recs[i] == pairs[i] for i in pairs)
        assert len(prefix) == len({r["qa_id"] for r in pairs.values()})


# -- resume ------------------------------------------------------------------------------------------
def test_resume_after_truncated_tail_matches_fresh_run(tmp_path, small_run):
    fresh, _ = small_run
    out = tmp_path / "resumed"
    SufficiencySynthesizer(_cfg(out)).run(progress=False)
    train = out / "train.jsonl"
    lines = train.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = "".join(lines[:-3])
    train.write_text(kept + lines[-3][: len(lines[-3]) // 2], encoding="utf-8")  # killed mid-record
    SufficiencySynthesizer(_cfg(out)).run(progress=False)
    text = train.read_text(encoding="utf-8")
    assert text.startswith(kept)  # earlier records were not rewritten: the run continued
    ids = [r["id"] for r in _records(train)]
    assert len(ids) == len(set(ids))
    expect = {r["id"]: r for r in _records(fresh / "train.jsonl")}
    assert set(ids) == set(expect)
    assert {r["id"]: r for r in _records(train)} == expect  # deterministic per-question RNG
    assert _records(out / "eval.jsonl") == _records(fresh / "eval.jsonl")
    stats = json.loads((out / "stats.json").read_text())
    assert stats["train"]["samples"] == len(ids) == 48


@pytest.mark.parametrize("per_episode", [12, pytest.param(40, marks=pytest.mark.slow)])
def test_killed_subprocess_resumes_without_loss_or_duplicates(per_episode, tmp_path, locomo_episodes, episodes_by_id):
    """SIGKILL a real synthesis run mid-way, rerun it: nothing lost, nothing twice, same records."""
    out = tmp_path / "killed"
    n_train = 2 * 8 * per_episode  # 8 train conversations, 2 records per question
    cmd = [sys.executable, "-m", "data_synthesis.sufficiency", "--output_dir", str(out), "--encoder", "none",
           "--answer_models", "none", "--max_qa_per_episode", str(per_episode), "--max_eval_qa_per_episode", "2",
           "--qa_chunk", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    train = out / "train.jsonl"
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if train.exists() and train.read_bytes().count(b"\n") >= 20:
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    n_at_kill = train.read_bytes().count(b"\n")
    assert 20 <= n_at_kill < n_train
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]

    manifest = json.loads((out / "manifest.json").read_text())
    recs = _records(train)
    ids = [r["id"] for r in recs]
    assert len(ids) == len(set(ids)), "duplicates after resume"
    expected = _expected_ids(locomo_episodes, set(manifest["train_episodes"]), per_episode)
    assert len(expected) == n_train and set(ids) == set(expected), "records lost after resume"
    eval_ids = [r["id"] for r in _records(out / "eval.jsonl")]
    assert sorted(eval_ids) == sorted(_expected_ids(locomo_episodes, set(manifest["eval_episodes"]), 2))
    # The records equal what an uninterrupted run generates (checked on a sample of questions).
    cfg = _cfg(out, max_qa_per_episode=per_episode)
    miner = DistractorMiner(HybridRetriever(encoder=None, dense_weight=0.0), cfg.entity_bonus)
    by_id = {r["id"]: r for r in recs}
    for rec in recs[:: 8] + recs[n_at_kill - 2: n_at_kill + 2]:
        ep = episodes_by_id[rec["episode_id"]]
        qa = next(q for q in ep.qa if q.qa_id == rec["qa_id"])
        for cand in build_candidates(ep, qa, cfg, miner):
            assert by_id[cand["id"]] == cand
    stats = json.loads((out / "stats.json").read_text())
    assert stats["train"]["samples"] == n_train == len(_lines(train))


# -- trainer-side loading ----------------------------------------------------------------------------
def test_trainer_dataset_names_file_and_line(tmp_path, smollm2_tokenizer):
    from train.sufficiency import SufficiencyDataset

    good = {"id": "a", "question": "Where?", "context": "[D1:1] Paris.", "label": 1, "rationale": "ok"}
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "b"}) + "\n" + '{"id": "c", "question": \n')
    with pytest.raises(RecordError) as err:
        SufficiencyDataset(str(path), smollm2_tokenizer, max_length=768)
    assert err.value.line == 3 and err.value.path == str(path)
    assert f"{path}:3:" in str(err.value)

    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "label": 2}) + "\n")
    with pytest.raises(RecordError, match=r":2: .*label"):
        SufficiencyDataset(str(path), smollm2_tokenizer, max_length=768)
    path.write_text("\n" + json.dumps({k: v for k, v in good.items() if k != "context"}) + "\n")
    with pytest.raises(RecordError, match=r":2: missing field.*context"):
        SufficiencyDataset(str(path), smollm2_tokenizer, max_length=768)
    path.write_text(json.dumps(good) + "\n")
    assert len(SufficiencyDataset(str(path), smollm2_tokenizer, max_length=768)) == 1


# -- length-matched refill -----------------------------------------------------------------------------
def test_length_matched_picks_the_closest_unused_step():
    steps = [Step(f"s{i}", i, "x" * n) for i, n in enumerate([100, 40, 95, 10, 60, 101])]
    ep = Episode("e", steps)
    # s0 (len 100 + id) takes s5 (101), then s2 (95) is the closest left; ties go to pool order.
    assert length_matched(ep, ["s0", "s4"], ["s1", "s2", "s3", "s5"]) == ["s5", "s1"]
    assert length_matched(ep, ["s0", "s4", "s3"], ["s2"]) == ["s2"]  # pool runs out: fewer refills, no error
    tie = [Step("a", 0, "x" * 50), Step("b", 1, "x" * 40), Step("c", 2, "x" * 60)]
    assert length_matched(Episode("t", tie), ["a"], ["c", "b"]) == ["c"]


def test_refill_match_length_removes_the_length_gap(tmp_path, episodes_by_id):
    """Negatives replace removed evidence with hard steps; matched on length, the negatives' contexts are about as
    long as the positives' (drawn at random they are shorter: evidence runs long). Same distractor count either way."""
    gaps = {}
    for match in (False, True):
        out = tmp_path / str(match)
        SufficiencySynthesizer(_cfg(out, positive_hard_fraction=1.0, refill_match_length=match,
                                    max_qa_per_episode=20)).run(progress=False)
        recs = _records(out / "train.jsonl")
        by_qa = {}
        for r in recs:
            by_qa.setdefault(r["qa_id"], {})[r["label"]] = r
        pairs = [p for p in by_qa.values() if len(p) == 2]
        gaps[match] = sum(len(p[1]["context"]) - len(p[0]["context"]) for p in pairs) / len(pairs)
        for p in pairs:
            ep = episodes_by_id[p[0]["episode_id"]]
            n_missing = len(p[0]["missing_evidence"])
            assert len(p[0]["context_step_ids"]) - len(p[0]["present_evidence"]) >= n_missing
            if match:
                qa = next(q for q in ep.qa if q.qa_id == p[0]["qa_id"])
                cands = build_candidates(ep, qa, _cfg(out, positive_hard_fraction=1.0, refill_match_length=True,
                                                      max_qa_per_episode=20),
                                         DistractorMiner(HybridRetriever(encoder=None, dense_weight=0.0), 0.1))
                assert cands[1] == p[0]
    assert gaps[False] > 20, gaps  # positives longer by tens of characters on average
    assert abs(gaps[True]) < gaps[False] / 2, gaps
