"""Router-Mem progressive execution (seed 001 Algorithm 1) and ``memroute eval progressive`` (DESIGN §5)."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import subprocess
import sys
import urllib.request
import zlib
from pathlib import Path

import pytest
import torch

from eval import progressive as ev
from eval.judge import judge_messages, parse_verdict
from openai_server import reply_for
from routers import cli
from routers.memory.retrieval import HybridRetriever
from routers.memory.schema import QA, Episode, Step
from routers.memory.views import AlignedViews
from routers.backends import OpenAICompatibleBackend
from routers.progressive import (EMPTY_CONTEXT, FAST, SLOW, ProgressiveConfig, ProgressiveExecutor, TokenCounter,
                                 agent_messages, answer_messages, is_empty_note, select_blocks)

REPO = Path(__file__).resolve().parents[1]
QUESTION = "What colour is the KEY lighthouse, red?"


class FakeBackend:
    """``generate`` with the fake server's deterministic replies; records every call's user messages."""

    name = "fake"

    def __init__(self, fail_on: str | None = None):
        self.calls: list[list[str]] = []
        self.fail_on = fail_on

    def generate(self, conversations, max_new_tokens=64):
        users = [c[-1]["content"] for c in conversations]
        self.calls.append(users)
        if self.fail_on and any(self.fail_on in u for u in users):
            raise RuntimeError("injected backend failure")
        return [reply_for(u) for u in users]


class FakeRouter:
    """A fixed score, or a deterministic pseudo-random one per question."""

    def __init__(self, fixed: float | None = None):
        self.fixed = fixed
        self.calls = 0
        self.contexts = []

    def score(self, questions, contexts):
        self.calls += 1
        self.contexts += list(contexts)
        return torch.tensor([self.fixed if self.fixed is not None else zlib.crc32(q.encode()) % 1000 / 1000
                             for q in questions])


def lighthouse_episode(n: int = 24) -> Episode:
    texts = {3: "a KEY lighthouse visit", 20: "the KEY lighthouse is red"}
    steps = [Step(f"s{i}", i, texts.get(i, f"filler talk number {i}"), speaker="A") for i in range(n)]
    return Episode("ep", steps, [QA("ep/q0", QUESTION, "red", ["s20"])])


def executor(backend, router=None, **kw) -> ProgressiveExecutor:
    return ProgressiveExecutor(HybridRetriever(encoder="none"), backend, router,
                               ProgressiveConfig(**{"max_retries": 0, "retry_backoff": 0.0, **kw}), TokenCounter(None))


def memory_lines(user_message: str) -> list[str]:
    return user_message.split("Memory:\n", 1)[1].split("\n\nQuestion:", 1)[0].splitlines()


# -- tau rows, derived exactly from cached records -----------------------------------------------------------
def _rec(prefix, routers, fast, slow, rag, long):
    return {"prefix": {"seconds": prefix}, "routers": {k: {"score": s, "seconds": t} for k, (s, t) in routers.items()},
            "fast": {"f1": fast[0], "seconds": fast[1]},
            "slow": {"f1": slow[0], "blocks_s": slow[1], "aggregate_s": slow[2], "seconds": slow[3]},
            "rag": {"f1": rag[0], "retrieve_s": rag[1], "seconds": rag[2]},
            "long_context": {"f1": long[0], "build_s": long[1], "seconds": long[2]}}


RECORDS = [
    _rec(0.1, {"base": (0.7, 0.05), "trained": (0.2, 0.04)}, (1.0, 1.0), (0.5, 2.0, 0.5, 1.5), (0.0, 0.2, 1.1),
         (1.0, 0.3, 3.0)),
    _rec(0.2, {"base": (None, 0.06), "trained": (0.6, 0.02)}, (0.0, 1.2), (1.0, 4.0, 1.0, 2.0), (0.5, 0.1, 0.9),
         (0.0, 0.1, 2.0)),
]
BUILDS = [{"prefix_build_s": 3.0, "rag_build_s": 1.0}, {"prefix_build_s": 5.0, "rag_build_s": 2.0}]


def test_tau_rows_derived_exactly_from_records():
    rows = ev.derive_rows(RECORDS, BUILDS, [0.5, 0.7], "dev", n_failed=1)
    got = {(r["system"], r["router"], r["tau"]): r for r in rows}
    assert len(rows) == 2 + 2 * 2 + 2 and all(r["n"] == 2 and r["n_failed"] == 1 for r in rows)
    # (score, early termination %, T_mem, T_e2e, T_build), computed by hand:
    expected = {
        ("fast_only", None, None): (50.0, 100.0, 0.15, 1.25, 4.0),
        ("slow_only", None, None): (75.0, 0.0, 3.9, 5.65, 4.0),
        # base: q1 s=0.7 >= tau at 0.5 and 0.7 (fast: 0.1+0.05, +1.0); q2 over budget -> slow (5.2+0.06, +2.0)
        ("router", "base", 0.5): (100.0, 50.0, 2.705, 4.205, 4.0),
        ("router", "base", 0.7): (100.0, 50.0, 2.705, 4.205, 4.0),
        # trained: tau 0.5 -> q1 slow (2.6+0.04, +1.5), q2 fast (0.2+0.02, +1.2); tau 0.7 -> both slow
        ("router", "trained", 0.5): (25.0, 50.0, 1.43, 2.78, 4.0),
        ("router", "trained", 0.7): (75.0, 0.0, 3.93, 5.68, 4.0),
        ("rag", None, None): (25.0, None, 0.15, 1.15, 1.5),
        ("long_context", None, None): (50.0, None, 0.2, 2.7, 0.0),
    }
    for key, (score, et, t_mem, t_e2e, t_build) in expected.items():
        r = got[key]
        assert r["score"] == pytest.approx(score) and r["f1"] == pytest.approx(score), key
        assert (r["early_termination"] is None) == (et is None) and (et is None or r["early_termination"] == et), key
        assert r["t_mem"] == pytest.approx(t_mem) and r["t_e2e"] == pytest.approx(t_e2e), key
        assert r["t_build"] == pytest.approx(t_build) and r["judge"] is None, key

    choice = ev.choose_tau(rows, "trained", max_score_drop=2.0)
    assert (choice["tau"], choice["within_drop"]) == (0.7, True)  # tau 0.5 loses 50 points
    base_choice = ev.choose_tau(rows, "base", max_score_drop=2.0)
    assert base_choice["tau"] == 0.5  # equal T_mem and score: the smaller tau
    report = ev.test_report(rows, choice)
    assert report["t_mem_reduction"] == pytest.approx(1 - 3.93 / 3.9) and report["score_delta"] == pytest.approx(0)
    assert report["targets"] == {"t_mem_reduction_>=_25%": False, "score_within_2_of_slow": True}
    ranges = ev.et_ranges(rows)
    assert ranges["base"]["range"] == 0.0 and ranges["trained"]["range"] == 50.0
    assert ranges["trained"]["monotone_non_increasing"] and ranges["trained_wider_than_base"] is True
    # base: 50 % at both taus (one level: tau changes nothing); trained: 50 % then 0 % (one graded level)
    assert (ranges["base"]["graded_levels"], ranges["trained"]["graded_levels"]) == (1, 1)
    assert ranges["trained_more_graded_than_base"] is False
    graded = ev.et_ranges([{"system": "router", "router": n, "tau": t, "early_termination": e}
                           for n, ets in (("base", [100.0, 36.7, 0.0]), ("trained", [96.7, 86.7, 36.7]))
                           for t, e in zip([0.3, 0.5, 0.7], ets)])
    assert (graded["base"]["graded_levels"], graded["trained"]["graded_levels"]) == (1, 3)
    assert graded["trained_more_graded_than_base"] and not graded["trained_wider_than_base"]
    assert graded["base"]["range_paper_taus"] == 100.0 and graded["trained"]["range_paper_taus"] == pytest.approx(60.0)
    assert graded["trained_wider_than_base_paper_taus"] is False
    # Over the full sweep the base's jump at the low end dominates; over 0.3-0.7 the trained curve is wider.
    sweep = ev.et_ranges([{"system": "router", "router": n, "tau": t, "early_termination": e}
                          for n, ets in (("base", [100.0, 36.7, 0.0, 0.0, 0.0]), ("trained", [100.0, 90.0, 73.3, 40.0, 6.7]))
                          for t, e in zip([0.1, 0.3, 0.5, 0.7, 0.9], ets)])
    assert sweep["base"]["range"] == 100.0 and sweep["trained"]["range"] == pytest.approx(93.3)
    assert sweep["base"]["range_paper_taus"] == pytest.approx(36.7) and sweep["trained"]["range_paper_taus"] == pytest.approx(50.0)
    assert not sweep["trained_wider_than_base"] and sweep["trained_wider_than_base_paper_taus"]
    assert ev.pareto_front([(1.0, 10.0), (2.0, 5.0), (3.0, 20.0), (0.5, 1.0)]) == [3, 0, 2]


def test_prefix_sufficiency_against_evidence():
    """Exact AUROC and stop precision on hand-made prefixes; questions without evidence are left out."""
    def rec(qa_id, hits, trained, base):
        return {"qa_id": qa_id, "prefix": {"hits": hits},
                "routers": {"trained": {"score": trained}, "base": {"score": base}}}

    records = [rec("q1", ["a", "b"], 0.9, 0.2),   # complete
               rec("q2", ["a"], 0.8, 0.3),        # b missing
               rec("q3", ["c", "d"], 0.6, 0.1),   # complete
               rec("q4", ["x"], 0.2, None),       # none; base over budget
               rec("q5", ["a"], 0.99, 0.99)]      # no evidence annotation: left out
    evidence = {"q1": ["a", "b"], "q2": ["a", "b"], "q3": ["c"], "q4": ["d"], "q5": []}
    out = ev.prefix_sufficiency(records, evidence, [0.5, 0.7, 0.95])
    assert out["n_labelled"] == 4 and out["evidence_complete_rate"] == 50.0
    trained = out["routers"]["trained"]
    # positives {0.9, 0.6} vs negatives {0.8, 0.2}: pairs won 0.9>0.8, 0.9>0.2, 0.6>0.2, lost 0.6<0.8 -> 3/4
    assert trained["n_scored"] == 4 and trained["auroc"] == pytest.approx(0.75)
    assert trained["stop_precision"] == {"0.5": pytest.approx(200 / 3), "0.7": 50.0, "0.95": None}
    base = out["routers"]["base"]
    # positives {0.2, 0.1} vs the one scored negative {0.3}
    assert base["n_scored"] == 3 and base["auroc"] == 0.0
    one_class = ev.prefix_sufficiency(records[:1], evidence, [0.5])
    assert one_class["routers"]["trained"]["auroc"] is None


def test_judge_metric_and_csv(tmp_path):
    recs = json.loads(json.dumps(RECORDS))
    for r, verdicts in zip(recs, ([1, 0, None, 1], [0, 1, 1, 0])):
        for p, v in zip(ev.PATHS, verdicts):
            r[p]["judge"] = v
    rows = ev.derive_rows(recs, BUILDS, [0.5], "test", score_metric="judge")
    got = {(r["system"], r["router"]): r for r in rows}
    assert got[("fast_only", None)]["score"] == 50.0 and got[("slow_only", None)]["score"] == 50.0
    assert got[("rag", None)]["judge"] == 50.0 and got[("router", "trained")]["score"] == 0.0  # slow q1, fast q2
    assert got[("fast_only", None)]["f1"] == 50.0  # F1 is still reported beside the judge score
    table = list(csv.DictReader(ev.rows_csv(rows).splitlines()))
    assert [t["system"] for t in table] == [r["system"] for r in rows] and table[2]["tau"] == "0.5"
    assert table[0]["early_termination"] == "100.000000" and table[-1]["early_termination"] == ""


# -- block selection ------------------------------------------------------------------------------------------
def test_select_blocks_anchors_neighbours_and_bound():
    views = AlignedViews(lighthouse_episode(30), block_size=4, overlap=0)  # blocks 0..7, 28-29 the last
    assert select_blocks(views, ["s12", "s1"], neighbours=1, max_blocks=None) == ([0, 3], [0, 1, 2, 3, 4])
    assert select_blocks(views, ["s12", "s1"], neighbours=2, max_blocks=None) == ([0, 3], [0, 1, 2, 3, 4, 5])
    # bound: anchors by hit rank, then distance-1 neighbours of the first anchor (2 before 4)
    assert select_blocks(views, ["s12", "s1"], neighbours=1, max_blocks=3) == ([0, 3], [0, 2, 3])
    assert select_blocks(views, ["s12", "s1"], neighbours=3, max_blocks=1) == ([0, 3], [3])
    assert select_blocks(views, ["s29"], neighbours=1, max_blocks=8) == ([7], [6, 7])  # clipped at the end
    # overlapping blocks of 5, stride 3: s3 and s4 sit in blocks 0 (steps 0-4, centre 2) and 1 (3-7, centre 5);
    # each hit anchors only the block it is nearest the centre of (s6: block 1, centre 5, not 2, centre 8)
    overlapping = AlignedViews(lighthouse_episode(30), block_size=5, overlap=2)
    assert overlapping.step_to_blocks["s3"] == overlapping.step_to_blocks["s4"] == [0, 1]
    assert select_blocks(overlapping, ["s3"], neighbours=0, max_blocks=8) == ([0], [0])
    assert select_blocks(overlapping, ["s4"], neighbours=0, max_blocks=8) == ([1], [1])
    assert select_blocks(overlapping, ["s6"], neighbours=0, max_blocks=8) == ([1], [1])
    assert select_blocks(overlapping, ["s4", "s3", "s5"], neighbours=1, max_blocks=8) == ([0, 1], [0, 1, 2])
    tie = AlignedViews(lighthouse_episode(30), block_size=4, overlap=1)  # s3: 1.5 from both centres
    assert tie.step_to_blocks["s3"] == [0, 1] and select_blocks(tie, ["s3"], neighbours=0) == ([0], [0])
    assert select_blocks(views, [], neighbours=1) == ([], [])


def test_is_empty_note():
    for note in ("NONE", "None.", " none ", "", "NONE - nothing here", "**None**"):
        assert is_empty_note(note), note
    for note in ("Nonetheless she went", "facts s0..s3: red", "no"):
        assert not is_empty_note(note), note


# -- Algorithm 1 -----------------------------------------------------------------------------------------------
def test_fast_path_restores_temporal_order():
    ep, backend = lighthouse_episode(), FakeBackend()
    res = executor(backend, FakeRouter(0.9), top_k=2).run(QUESTION, ep, tau=0.5)
    assert res.path == FAST and res.score == pytest.approx(0.9)
    assert res.hits == ["s20", "s3"]  # rank order: s20 matches more query words
    (call,) = backend.calls  # one answer call, nothing else
    assert memory_lines(call[0]) == ["[s3] A: a KEY lighthouse visit", "[s20] A: the KEY lighthouse is red"]
    assert res.answer == "[s3] A: a KEY lighthouse visit" and res.context == "\n".join(memory_lines(call[0]))
    assert res.blocks_s == res.aggregate_s == 0.0 and res.slow is None
    assert res.t_mem == pytest.approx(res.prefix_s + res.router_s)
    assert res.t_e2e == pytest.approx(res.t_mem + res.answer_s)


def test_slow_path_blocks_agents_aggregate():
    ep, backend = lighthouse_episode(), FakeBackend()
    ex = executor(backend, FakeRouter(0.1), top_k=2, block_size=4, block_overlap=0, neighbours=1, max_blocks=3)
    res = ex.run(QUESTION, ep, tau=0.5)
    assert res.path == SLOW
    slow = res.slow
    assert (slow.anchor_blocks, slow.blocks) == ([0, 5], [0, 4, 5])  # priority 5, 0, 4, 1 -> bound 3
    assert len(backend.calls) == 2 and len(backend.calls[0]) == 3  # all blocks in one batched call, then A
    assert [n["note"] for n in slow.notes] == ["facts s0..s3: [s3] A: a KEY lighthouse visit", "NONE",
                                                "facts s20..s23: [s20] A: the KEY lighthouse is red"]
    assert memory_lines(backend.calls[1][0]) == [
        "[s0 .. s3] facts s0..s3: [s3] A: a KEY lighthouse visit",
        "[s20 .. s23] facts s20..s23: [s20] A: the KEY lighthouse is red"]  # NONE dropped, temporal order
    assert (slow.n_pieces, slow.window_splits, slow.truncated_steps) == (3, 0, 0)
    assert res.t_mem == pytest.approx(res.prefix_s + res.router_s + res.blocks_s + res.aggregate_s)
    # over the router budget (NaN) -> conservative continuation
    over = executor(FakeBackend(), FakeRouter(float("nan")), top_k=2).run(QUESTION, ep, tau=0.0)
    assert over.path == SLOW and over.score is None


def test_llm_aggregation_is_one_more_call():
    ep, backend = lighthouse_episode(), FakeBackend()
    res = executor(backend, FakeRouter(0.0), top_k=2, block_size=4, block_overlap=0, max_blocks=3,
                   aggregate="llm").run(QUESTION, ep)
    assert len(backend.calls) == 3 and backend.calls[1][0].startswith("Question: " + QUESTION)
    assert res.slow.aggregate_s > 0 and len(memory_lines(backend.calls[2][0])) == 1


def test_window_splits_and_shortening_are_counted():
    ep = Episode("u", [Step(f"s{i}", i, f"filler talk number {i}", speaker="A") for i in range(8)])  # equal lengths
    counter = TokenCounter(None)
    steps = ep.steps[:4]
    two = counter.messages(agent_messages(QUESTION, steps[:2]))
    ex = executor(FakeBackend(), top_k=2, block_size=4, block_overlap=0, model_window=two + 64,
                  note_max_new_tokens=64)
    pieces, cut = ex._pieces(QUESTION, steps)
    assert [[s.step_id for s in p] for p in pieces] == [["s0", "s1"], ["s2", "s3"]] and cut == 0
    long_step = Step("big", 2, "word " * 2000, speaker="A")
    pieces, cut = ex._pieces(QUESTION, [steps[0], long_step, steps[3]])
    assert cut == 1 and [[s.step_id for s in p] for p in pieces] == [["s0"], ["big"], ["s3"]]
    assert pieces[1][0].text.endswith(" [...]") and len(pieces[1][0].text) < len(long_step.text)
    assert all(counter.messages(agent_messages(QUESTION, p)) <= two for p in pieces)
    # through the slow path: both selected 4-step blocks are split, every piece analysed in one call
    backend = FakeBackend()
    ex.backend = backend
    slow = ex.slow(QUESTION, ep, ex.prefix(QUESTION, ep))
    assert (slow.blocks, slow.window_splits, slow.n_pieces, slow.truncated_steps) == ([0, 1], 2, 4, 0)
    assert len(backend.calls[0]) == 4
    # an answer context over the window drops the lowest-ranked hits, and says how many
    small = executor(FakeBackend(), FakeRouter(1.0), top_k=8,
                     model_window=counter.messages(answer_messages(QUESTION, "\n".join(s.render() for s in steps[:2])))
                     + 16)
    pre = small.prefix(QUESTION, ep)
    fast = small.fast(QUESTION, pre)
    assert fast.units_dropped == 6 and fast.context.count("\n") == 1
    assert {line.split("]")[0][1:] for line in fast.context.splitlines()} == set(pre.hit_ids[:2])


def test_empty_memory_question():
    ep = Episode("empty", [], [QA("empty/q0", "Where did she go?", "Paris", [])])
    backend = FakeBackend()
    ex = executor(backend, top_k=3)
    cfg = ev.ProgressiveEvalConfig(rag_k=3)
    rec = ev.question_record(ex, {"base": FakeRouter(0.3)}, HybridRetriever(encoder="none"), ep, ep.qa[0], cfg)
    assert rec["prefix"]["hits"] == [] and rec["slow"]["blocks"] == [] and rec["slow"]["n_pieces"] == 0
    assert rec["long_context"]["steps_kept"] == 0 and rec["long_context"]["steps_dropped"] == 0
    assert rec["routers"]["base"]["score"] == pytest.approx(0.3)
    assert len(backend.calls) == 4  # fast, slow answer, RAG, long context; no memory-agent call
    assert all(memory_lines(c[0]) == [EMPTY_CONTEXT] for c in backend.calls)
    assert rec["fast"]["answer"] == EMPTY_CONTEXT and rec["fast"]["f1"] == 0.0


# -- the evaluation: failures, resume -----------------------------------------------------------------------------
def _cfg(tmp_path, **kw) -> ev.ProgressiveEvalConfig:
    base = dict(encoder="none", rag_encoder="none", max_questions_per_episode=2, max_retries=1, retry_backoff=0.0,
                output_dir=str(tmp_path / "out"), top_k=4, max_blocks=3)
    return ev.ProgressiveEvalConfig(**{**base, **kw})


def test_backend_failure_is_counted_run_continues_and_resumes(tmp_path, locomo_episodes):
    cfg = _cfg(tmp_path)
    selection = ev.select_questions(cfg, locomo_episodes)
    assert [len(v) for v in selection.values()] == [2, 2]
    bad = selection["dev"][0][1]
    backend = FakeBackend(fail_on=f"Question: {bad.question}\n")
    m = ev.run(cfg, backend=backend, routers={"base": FakeRouter()})
    assert [f["qa_id"] for f in m["failures"]] == [bad.qa_id]
    assert "injected backend failure" in m["failures"][0]["error"]
    assert sum(any(f"Question: {bad.question}\n" in u for u in c) for c in backend.calls) == 2  # 1 try + 1 retry
    assert m["stats"]["dev"]["n_failed"] == 1 and m["stats"]["dev"]["n_ok"] == 1 and m["stats"]["test"]["n_ok"] == 2
    dev_rows = [r for r in m["rows"] if r["split"] == "dev"]
    assert dev_rows and all(r["n"] == 1 and r["n_failed"] == 1 for r in dev_rows)
    out = Path(cfg.output_dir)
    assert [json.loads(x)["qa_id"] for x in (out / "failures.jsonl").read_text().splitlines()] == [bad.qa_id]
    cached = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert bad.qa_id not in {r.get("qa_id") for r in cached}  # failures are not cached: a rerun retries them
    assert sum(r["kind"] == "build" for r in cached) == 2 and m["questions_computed_this_run"] == 3

    retry = FakeBackend()
    m2 = ev.run(cfg, backend=retry, routers={"base": FakeRouter()})
    assert m2["questions_computed_this_run"] == 1 and m2["failures"] == []
    assert len(retry.calls) == 5  # fast, memory agents (one batch), slow answer, RAG, long context
    assert all(r["n"] == 2 and r["n_failed"] == 0 for r in m2["rows"])

    again, router = FakeBackend(), FakeRouter()
    m3 = ev.run(cfg, backend=again, routers={"base": router})
    assert (m3["questions_computed_this_run"], len(again.calls), router.calls) == (0, 0, 0)
    assert m3["rows"] == m2["rows"]  # rows re-derived from the cache, identical

    # a run killed mid-record: the partial line is dropped and only that question is recomputed
    path = out / "records.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[:-40])
    last = json.loads(data.splitlines()[-1])
    killed = FakeBackend()
    m4 = ev.run(cfg, backend=killed, routers={"base": FakeRouter()})
    assert m4["questions_computed_this_run"] == 1 and len(killed.calls) == 5
    assert any(f"Question: {last['question']}\n" in c[0] for c in killed.calls)
    assert [r["score"] for r in m4["rows"]] == [r["score"] for r in m2["rows"]]  # same answers, new timings
    assert {"rows.csv", "metrics.json", "pareto.png", "failures.jsonl"} <= {p.name for p in out.iterdir()}


def test_a_new_router_reuses_cached_paths_and_only_scores_the_prefix(tmp_path, locomo_episodes):
    cfg = _cfg(tmp_path, max_questions_per_episode=1)
    first = ev.run(cfg, backend=FakeBackend(), routers={"base": FakeRouter(0.3)})
    assert first["questions_computed_this_run"] == 2 and first["router_scores_added_this_run"] == 0
    recs = [json.loads(x) for x in (Path(cfg.output_dir) / "records.jsonl").read_text().splitlines()]
    contexts = {r["qa_id"]: r for r in recs if r["kind"] == "question"}
    # a second router: no answer-model call at all, one router call per question, on the same C_f
    backend, trained = FakeBackend(), FakeRouter(0.8)
    second = ev.run(cfg, backend=backend, routers={"base": FakeRouter(0.3), "trained": trained})
    assert (second["questions_computed_this_run"], second["router_scores_added_this_run"]) == (0, 2)
    assert backend.calls == [] and trained.calls == 2
    steps = {(ep.episode_id, st.step_id): st for ep in locomo_episodes for st in ep.steps}
    assert trained.contexts == [  # C_f rebuilt from the cached hit ids, in temporal order
        "\n".join(s.render() for s in sorted((steps[r["episode_id"], i] for i in r["prefix"]["hits"]),
                                              key=lambda st: st.index)) for r in contexts.values()]
    rows = {(r["split"], r["system"], r["router"], r["tau"]): r for r in second["rows"]}
    assert rows[("test", "router", "trained", 0.7)]["early_termination"] == 100.0
    assert rows[("test", "router", "trained", 0.9)]["early_termination"] == 0.0
    same = ("score", "t_mem", "early_termination")
    for key, row in rows.items():  # every row the first run had is unchanged
        old = next((r for r in first["rows"] if (r["split"], r["system"], r["router"], r["tau"]) == key), None)
        assert old is None or all(old[k] == row[k] for k in same)
    # a third run finds everything, and a run with only the new router drops the old one from the rows
    third = ev.run(cfg, backend=FakeBackend(), routers={"trained": FakeRouter(0.8)})
    assert (third["questions_computed_this_run"], third["router_scores_added_this_run"]) == (0, 0)
    assert {r["router"] for r in third["rows"] if r["system"] == "router"} == {"trained"}


def test_rag_reuses_the_prefix_index_when_encoders_match(tmp_path):
    from retriever_helpers import BagOfLetters

    class Counting(BagOfLetters):
        texts = 0

        def encode(self, texts, **kw):
            Counting.texts += len(texts)
            return super().encode(texts, **kw)

    cfg = _cfg(tmp_path, encoder="minilm", rag_encoder="minilm", max_questions_per_episode=1, test_episodes=["none"])
    m = ev.run(cfg, backend=FakeBackend(), routers={}, retriever=HybridRetriever(encoder=Counting(), dense_weight=0.5))
    (build,) = [json.loads(x) for x in (Path(cfg.output_dir) / "records.jsonl").read_text().splitlines()
                if json.loads(x)["kind"] == "build"]
    assert build["rag_shares_prefix_index"] is True and build["rag_build_s"] == build["prefix_build_s"]
    assert Counting.texts == build["n_steps"] + 2  # steps encoded once; the query once by each retriever
    rows = {r["system"]: r for r in m["rows"]}
    assert rows["rag"]["t_build"] == rows["fast_only"]["t_build"] and set(rows) == {
        "fast_only", "slow_only", "rag", "long_context"}  # no router given: endpoints and baselines only


def test_config_errors(tmp_path):
    from routers.config import ConfigError

    with pytest.raises(ConfigError, match="overlap"):
        _cfg(tmp_path, dev_episodes=["conv-26"], test_episodes=["conv-26"])
    with pytest.raises(ConfigError, match="needs --judge"):
        _cfg(tmp_path, score_metric="judge")
    assert _cfg(tmp_path, test_episodes=["none"]).test_episodes == []  # a dev-only run
    with pytest.raises(ConfigError, match="at least one dev episode"):
        _cfg(tmp_path, dev_episodes=[])
    with pytest.raises(ValueError, match=r"\['conv-999'\] not in corpus 'locomo'"):
        ev.run(_cfg(tmp_path, test_episodes=["conv-999"]), backend=FakeBackend(), routers={})


def test_config_hash_tracks_settings_and_retrained_weights(tmp_path):
    router = tmp_path / "router"
    router.mkdir()
    (router / "model.safetensors").write_bytes(b"v1")
    (router / "router_config.json").write_text(json.dumps({"schema_version": 1, "router_type": "sufficiency",
                                                          "base_model": "base-id"}))
    cfg = _cfg(tmp_path, router=str(router))
    h, ids = ev.config_hash(cfg), ev.router_ids(cfg)
    assert set(ids) == {"base", "trained"}
    assert ev.config_hash(_cfg(tmp_path, router=str(router), taus=[0.5], output_dir="elsewhere")) == h
    assert ev.config_hash(_cfg(tmp_path, router=str(router), top_k=5)) != h
    assert ev.config_hash(_cfg(tmp_path, router=str(router), fusion="peak")) != h
    from eval.progressive.cache import HASHED, PROMPT_VERSION, RECORD_VERSION, _sha

    # the default fusion is not in the payload: caches written before the option existed are still found
    assert h == _sha({**{k: getattr(cfg, k) for k in HASHED}, "prompt_version": PROMPT_VERSION,
                      "record_version": RECORD_VERSION, "files": {"encoder": None, "answer_model": None}})
    assert ev.config_hash(_cfg(tmp_path)) == h  # the router is not part of the paths' hash...
    (router / "model.safetensors").write_bytes(b"v2 retrained")
    assert ev.config_hash(cfg) == h
    again = ev.router_ids(cfg)  # ...but of the router's identity: retrained weights are scored again
    assert again["trained"] != ids["trained"] and again["base"] == ids["base"]
    encoder = tmp_path / "encoder"
    encoder.mkdir()
    (encoder / "model.safetensors").write_bytes(b"e1")
    h_enc = ev.config_hash(_cfg(tmp_path, encoder=str(encoder)))
    (encoder / "model.safetensors").write_bytes(b"e2 retrained")
    assert ev.config_hash(_cfg(tmp_path, encoder=str(encoder))) != h_enc


def test_fusion_reaches_the_executors_prefix(tmp_path):
    """--fusion peak is the prefix retriever's mixing (not only a hash key): the loaded executor retrieves with it."""
    for fusion in ("minmax", "peak"):
        models = ev.LazyModels(_cfg(tmp_path, fusion=fusion), backend=FakeBackend(), routers={},
                               counter=TokenCounter()).load()
        assert models.executor.retriever.fusion == fusion


# -- judge ---------------------------------------------------------------------------------------------------------
def test_ama_bench_judge_prompt_and_verdicts():
    (msg,) = judge_messages("Where?", "Paris", "in Paris")
    assert msg["role"] == "user" and msg["content"].startswith("You are an expert evaluator.")
    assert "Question: Where?\nReference Answer: Paris\nPredicted Answer: in Paris\n" in msg["content"]
    assert msg["content"].endswith("Respond with ONLY 'yes' or 'no'. Do not include any thinking process, "
                                   "explanation, or additional text.\nAnswer:")
    assert [parse_verdict(x) for x in ("yes", " Yes.", "NO!", "no, because", "maybe", "", "1")] == \
        [1, 1, 0, 0, None, None, None]


# -- the OpenAI-compatible backend against a real server process ----------------------------------------------------
@contextlib.contextmanager
def serve(*args):
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "openai_server.py"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT "), (line, proc.stderr.read() if proc.poll() is not None else "")
        yield f"http://127.0.0.1:{int(line.split()[1])}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture()
def _no_proxy(monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def _stats(url: str) -> dict:
    with urllib.request.urlopen(url + "/stats", timeout=5) as resp:
        return json.loads(resp.read())


def test_http_backend_concurrent_requests_keep_order(_no_proxy):
    with serve("--delay", "0.2") as url:
        backend = OpenAICompatibleBackend(model="m", base_url=url, concurrency=4, max_retries=0, timeout=10)
        convs = [answer_messages(f"q{i}", f"[s{i}] line {i}") for i in range(6)]
        assert backend.generate(convs, max_new_tokens=8) == [f"[s{i}] line {i}" for i in range(6)]
        stats = _stats(url)
    assert stats["requests"] == 6 and stats["max_in_flight"] >= 2


def test_eval_through_http_server_with_judge_and_failure(tmp_path, locomo_episodes, _no_proxy):
    probe = _cfg(tmp_path, max_questions_per_episode=1)
    test_q = ev.select_questions(probe, locomo_episodes)["test"][0][1]
    with serve("--fail-substring", f"Question: {test_q.question}\n") as url:
        cfg = _cfg(tmp_path, max_questions_per_episode=1, answer_model=f"openai:m@{url}", judge="answer",
                   score_metric="judge", http_concurrency=4, http_timeout=10)
        m = ev.run(cfg, routers={"base": FakeRouter(0.5)})
        stats = _stats(url)
    assert m["token_counter"] == "approximate"
    assert [f["qa_id"] for f in m["failures"]] == [test_q.qa_id] and "HTTP Error 500" in m["failures"][0]["error"]
    assert m["stats"]["test"]["n_failed"] == 1 and [r for r in m["rows"] if r["split"] == "test"] == []
    (rec,) = [json.loads(x) for x in (Path(cfg.output_dir) / "records.jsonl").read_text().splitlines()
              if json.loads(x)["kind"] == "question"]
    assert {rec[p]["judge_reply"] for p in ev.PATHS} <= {"yes", "no"}
    assert all(rec[p]["judge"] == (rec[p]["judge_reply"] == "yes") for p in ev.PATHS)
    dev = {r["system"]: r for r in m["rows"] if r["split"] == "dev" and r["system"] != "router"}
    assert dev["fast_only"]["score"] == 100.0 * rec["fast"]["judge"]
    # dev: fast, memory agents, slow answer, RAG, long context, 4 judge prompts; test: fast tried 1 + 1 retry
    assert stats["requests"] == 4 + rec["slow"]["n_pieces"] + 4 + 2
    assert m["test_at_dev_tau"] is None and m["tau_choice_dev"]["router"] == "base"


# -- the CLI, end to end with the tiny model ---------------------------------------------------------------------
def test_cli_end_to_end_tiny_model(tmp_path, tiny_llama_dir, one_torch_thread):
    out = tmp_path / "prog"
    argv = ["eval", "progressive", str(REPO / "configs/progressive/eval/locomo.yaml"), "--answer_model", tiny_llama_dir,
            "--encoder", "none", "--rag_encoder", "none", "--max_questions_per_episode", "1",
            "--output_dir", str(out), "--note_max_new_tokens", "8", "--answer_max_new_tokens", "4"]
    assert cli.main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["questions_computed_this_run"] == 2 and metrics["failures"] == []
    assert metrics["token_counter"] == "tokenizer"
    rows = list(csv.DictReader((out / "rows.csv").read_text().splitlines()))
    assert len(rows) == 2 * (2 + 5 + 2)
    assert [r["tau"] for r in rows if r["split"] == "test" and r["system"] == "router"] == \
        ["0.1", "0.3", "0.5", "0.7", "0.9"]
    assert {r["router"] for r in rows if r["system"] == "router"} == {"base"}
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    qs = [r for r in recs if r["kind"] == "question"]
    assert [r["split"] for r in qs] == ["dev", "test"]
    for r in qs:
        s = r["routers"]["base"]["score"]
        assert s is None or 0.0 <= s <= 1.0
        assert len(r["prefix"]["hits"]) == 10 and 1 <= len(r["slow"]["blocks"]) <= 8
        assert r["long_context"]["steps_dropped"] > 0  # a LoCoMo conversation exceeds a 2048-token window
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "resolved_config.yaml").exists()
    assert math.isfinite(metrics["tau_choice_dev"]["tau"])
    # resumed: nothing recomputed, same rows
    assert cli.main(argv) == 0
    again = json.loads((out / "metrics.json").read_text())
    assert again["questions_computed_this_run"] == 0 and again["rows"] == metrics["rows"]
