"""Retriever training records: their format and reader, and how one question becomes a record.

A record holds a query, its positives (evidence steps, then evidence-complete windows) and its hard
negatives (BM25 and dense hits that are not evidence, then windows around them); see
:mod:`data_synthesis.retriever` for the job that writes them and the full description.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from data_synthesis.sufficiency_samples import leaks_answer, question_rng
from data_synthesis.textworld_episodes import check_schema_version
from routers.io import read_records, unique_ids
from routers.memory.retrieval import render_context
from routers.memory.schema import QA, Episode, Step

if TYPE_CHECKING:
    from data_synthesis.retriever import RetrieverSynthConfig

SCHEMA_VERSION = 1
RECORD_FIELDS = ("id", "qa_id", "episode_id", "query", "positives", "negatives", "positive_ids", "negative_ids")


def window_around(episode: Episode, index: int, size: int) -> list[Step]:
    """``size`` adjacent steps centred on position ``index`` (shifted inward at the episode edges)."""
    n = len(episode.steps)
    size = max(1, min(size, n))
    start = min(max(0, index - (size - 1) // 2), n - size)
    return episode.steps[start:start + size]


def window_id(steps: list[Step]) -> str:
    return f"{steps[0].step_id}~{steps[-1].step_id}"


def evidence_problem(episode: Episode, qa: QA) -> tuple[str | None, list[str]]:
    """Why a question cannot be used ("no_evidence" / "unknown_evidence", with the offending ids)."""
    if not qa.evidence:
        return "no_evidence", []
    unknown = [e for e in qa.evidence if not episode.has_step(e)]
    if unknown:
        return "unknown_evidence", unknown
    return None, []

def _positives(episode: Episode, evidence: list[str], position: dict[str, int],
               cfg: RetrieverSynthConfig) -> tuple[list[str], list[str], list[str]]:
    """Texts, ids and kinds of the positives: evidence steps, then evidence-complete windows."""
    pos_texts, pos_ids, pos_kinds = [], [], []
    for e in evidence:
        pos_texts.append(episode.step(e).render())
        pos_ids.append(e)
        pos_kinds.append("step")
    if cfg.window_size > 1:
        for e in evidence:
            win = window_around(episode, position[e], cfg.window_size)
            wid = window_id(win)
            if wid not in pos_ids and len(win) > 1:
                pos_texts.append(render_context(win))
                pos_ids.append(wid)
                pos_kinds.append("window")
    keep = min(len(pos_texts), max(cfg.max_positives, len(evidence)))
    return pos_texts[:keep], pos_ids[:keep], pos_kinds[:keep]


def _hard_negatives(episode: Episode, qa: QA, cfg: RetrieverSynthConfig, rng: random.Random, evidence: list[str],
                    position: dict[str, int], lexical: np.ndarray, dense: np.ndarray | None,
                    counts: Counter) -> tuple[list[str], list[str], list[str]]:
    """Texts, ids and kinds of the hard negatives: sampled BM25 and dense hits that are not evidence (nor
    near it, nor leaking the answer), then windows around them that hold no evidence step."""
    steps = episode.steps
    ev_index = {position[e] for e in evidence}
    ev_set = set(evidence)

    def eligible(i: int) -> bool:
        s = steps[i]
        if s.step_id in ev_set:
            return False
        if cfg.neighbour_exclusion and any(abs(i - j) <= cfg.neighbour_exclusion for j in ev_index):
            return False
        return True

    leak_cache: dict[int, bool] = {}

    def leaks(i: int) -> bool:
        if i not in leak_cache:
            leak_cache[i] = cfg.drop_answer_leaks and leaks_answer(steps[i], qa.answer)
        return leak_cache[i]

    def pool(scores: np.ndarray) -> list[int]:
        order = np.lexsort((np.arange(len(scores)), -scores))
        out = []
        for i in order:
            if len(out) >= cfg.hard_pool:
                break
            if eligible(int(i)):
                if leaks(int(i)):
                    continue
                out.append(int(i))
        return out

    chosen: list[tuple[int, str]] = []
    bm25_pool = pool(lexical) if len(steps) else []
    picked = rng.sample(bm25_pool, min(cfg.bm25_negatives, len(bm25_pool)))
    chosen += [(i, "bm25") for i in sorted(picked, key=bm25_pool.index)]
    if dense is not None and cfg.dense_negatives > 0:
        taken = {i for i, _ in chosen}
        dense_pool = [i for i in pool(dense) if i not in taken]
        picked = rng.sample(dense_pool, min(cfg.dense_negatives, len(dense_pool)))
        chosen += [(i, "dense") for i in sorted(picked, key=dense_pool.index)]
    neg_texts = [steps[i].render() for i, _ in chosen]
    neg_ids = [steps[i].step_id for i, _ in chosen]
    neg_kinds = [k for _, k in chosen]
    if cfg.window_size > 1 and cfg.window_negatives > 0:
        n_win = 0
        for i, _ in chosen:
            if n_win >= cfg.window_negatives:
                break
            win = window_around(episode, i, cfg.window_size)
            wid = window_id(win)
            if len(win) < 2 or wid in neg_ids or any(s.step_id in ev_set for s in win):
                continue
            if cfg.drop_answer_leaks and any(leaks(position[s.step_id]) for s in win):
                continue
            neg_texts.append(render_context(win))
            neg_ids.append(wid)
            neg_kinds.append("window")
            n_win += 1
    counts["dropped_answer_leaks"] += sum(leak_cache.values())
    return neg_texts, neg_ids, neg_kinds


def build_record(episode: Episode, qa: QA, cfg: RetrieverSynthConfig, split: str, lexical: np.ndarray,
                 dense: np.ndarray | None, counts: Counter | None = None) -> dict:
    """One training record. ``lexical``/``dense`` are the query's BM25 / cosine scores over the steps."""
    counts = counts if counts is not None else Counter()
    rng = question_rng(cfg.seed, qa.qa_id)
    # list positions (``Step.index`` is a temporal rank: increasing, but not necessarily 0..n-1)
    position = {s.step_id: p for p, s in enumerate(episode.steps)}
    evidence = list(dict.fromkeys(qa.evidence))
    pos_texts, pos_ids, pos_kinds = _positives(episode, evidence, position, cfg)
    neg_texts, neg_ids, neg_kinds = _hard_negatives(episode, qa, cfg, rng, evidence, position, lexical, dense, counts)
    if not neg_texts:
        counts["no_hard_negatives"] += 1
    return {"schema_version": SCHEMA_VERSION, "id": qa.qa_id, "qa_id": qa.qa_id, "episode_id": episode.episode_id,
            "source": episode.source, "split": split, "category": qa.category, "query": qa.question,
            "answer": qa.answer, "positives": pos_texts, "negatives": neg_texts, "positive_ids": pos_ids,
            "negative_ids": neg_ids, "positive_kinds": pos_kinds, "negative_kinds": neg_kinds,
            "evidence_ids": evidence}


def validate_record(rec: dict) -> None:
    """Raise ValueError on a malformed record (``read_jsonl`` turns it into file:line)."""
    if not isinstance(rec["query"], str) or not rec["query"].strip():
        raise ValueError("query must be a non-empty string")
    for key in ("positives", "negatives", "positive_ids", "negative_ids"):
        if not isinstance(rec[key], list) or not all(isinstance(x, str) for x in rec[key]):
            raise ValueError(f"{key} must be a list of strings")
    if not rec["positives"]:
        raise ValueError("positives must not be empty")
    if len(rec["positives"]) != len(rec["positive_ids"]) or len(rec["negatives"]) != len(rec["negative_ids"]):
        raise ValueError("positives/negatives and their ids must have the same length")
    check_schema_version(rec, SCHEMA_VERSION)


def read_retriever_records(path: str | Path, max_records: int | None = None) -> list[dict]:
    """Validated records (a malformed one raises ``RecordError`` naming file and line; a repeated id is one,
    since it would be trained on twice)."""
    if max_records is not None and (isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1):
        raise ValueError(f"max_records must be a positive integer or None, got {max_records!r}")
    return read_records(path, RECORD_FIELDS, unique_ids(validate_record), "retriever record", max_records)


def load_retriever_dataset(path: str | Path, max_records: int | None = None, columns=RECORD_FIELDS):
    """A ``datasets.Dataset`` of validated records (only ``columns`` kept)."""
    from datasets import Dataset

    recs = read_retriever_records(path, max_records)
    return Dataset.from_list([{k: r[k] for k in columns} for r in recs])
