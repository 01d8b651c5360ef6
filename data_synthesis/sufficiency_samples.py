"""Sufficiency samples: their format and reader, and how one question becomes samples.

* the sample format (``SCHEMA_VERSION``, ``RECORD_FIELDS``) and :func:`read_samples`, the one validating
  reader used by the trainer, ``synth mix`` and the evaluator;
* evidence-intervention candidates (:func:`build_candidates`): a positive with all evidence plus hard distractors
  (:class:`DistractorMiner`; a share random when ``positive_hard_fraction`` < 1), a negative with a decisive part of
  the evidence dropped and refilled by hard distractors (of matching length: :func:`length_matched`);
* retrieval-prefix candidates (:func:`build_prefix_candidate`): the top-k of the shared retrieval prefix;
* template rationales and the answer-model / teacher conversations.

The job that runs these over a corpus is :mod:`data_synthesis.sufficiency`.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from typing import TYPE_CHECKING

import numpy as np

from routers.io import read_records, unique_ids
from routers.memory.retrieval import HybridRetriever, render_context, retrieval_prefix, tokenize
from routers.memory.schema import QA, Episode, Step
from routers.text import normalize_answer

if TYPE_CHECKING:
    from data_synthesis.sufficiency import SufficiencySynthConfig

SCHEMA_VERSION = 1
RECORD_FIELDS = ("id", "qa_id", "episode_id", "question", "answer", "context", "label", "variant")
SAMPLE_FIELDS = ("id", "question", "context", "label")  # what training reads (any source, e.g. a mix)
ANSWER_SYSTEM = "Answer the question using only the memory. Reply with a short answer (a few words)."
TEACHER_SYSTEM = ("You audit retrieved memory. In two or three sentences, say which evidence for the question is "
                  "present and which decisive piece, if any, is missing.")
_ENTITY = re.compile(r"\b([A-Z][a-zA-Z]+|\d{4})\b")


def validate_sample(rec: dict) -> None:
    """The check every reader of sufficiency samples applies (``read_jsonl`` adds file and line): a non-empty
    string id, label exactly 0 or 1 (not ``true`` / ``1.0``), and non-empty string question and context."""
    if isinstance(rec["id"], bool) or not isinstance(rec["id"], (str, int)) or rec["id"] == "":
        raise ValueError(f"id must be a non-empty string, got {rec['id']!r:.60}")
    if isinstance(rec["label"], bool) or type(rec["label"]) is not int or rec["label"] not in (0, 1):
        raise ValueError(f"label must be 0 or 1, got {rec['label']!r:.60}")
    if not isinstance(rec["question"], str) or not isinstance(rec["context"], str):
        raise ValueError("question and context must be strings")
    if not rec["question"].strip():
        raise ValueError("question is empty")
    if not rec["context"].strip():
        raise ValueError("context is empty")


def sample_validator(required: tuple = SAMPLE_FIELDS):
    """``validate_sample`` plus: an id seen earlier in the same file is an error (a duplicate would count
    twice in training and in every metric). One validator for the trainer, ``synth mix`` and eval."""
    return unique_ids(validate_sample)


def read_samples(path: str | os.PathLike, max_samples: int | None = None, required: tuple = SAMPLE_FIELDS) -> list[dict]:
    """Validated sufficiency samples of one file, in file order; errors name file and line, and an empty
    file is an error. Call it before loading any model: bad data must fail in seconds."""
    return read_records(path, required, sample_validator(required), "sample", max_samples)


def question_rng(seed: int, key: str) -> random.Random:
    """Per-question RNG: a resumed run regenerates exactly the same samples."""
    return random.Random(int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()[:16], 16))


def entities(text: str) -> set[str]:
    return {m.lower() for m in _ENTITY.findall(text)}


def leaks_answer(step: Step, answer: str) -> bool:
    """A distractor that contains every content word of the gold answer might answer the question."""
    ans = set(tokenize(normalize_answer(answer)))
    return bool(ans) and ans <= set(tokenize(step.render()))


class DistractorMiner:
    """Hard distractors: embedding similarity to the question plus a shared-entity bonus."""

    def __init__(self, retriever: HybridRetriever | None, entity_bonus: float = 0.1):
        self.retriever = retriever
        self.entity_bonus = entity_bonus

    def ranked(self, episode: Episode, qa: QA, exclude: set[str]) -> list[Step]:
        steps = episode.steps
        sim = np.zeros(len(steps))
        if self.retriever is not None and self.retriever.dense_weight > 0:
            emb = self.retriever.step_embeddings(episode)
            sim = emb @ self.retriever.encode_queries([qa.question])[0]
        q_ents = entities(qa.question)
        bonus = np.array([len(q_ents & entities(s.render())) for s in steps], dtype=float) * self.entity_bonus
        order = np.argsort(-(sim + bonus), kind="stable")
        return [steps[i] for i in order if steps[i].step_id not in exclude and not leaks_answer(steps[i], qa.answer)]


def template_rationale(episode: Episode, present: list[str], missing: list[str], label: int) -> str:
    def show(ids):
        return "; ".join(f"[{i}] {episode.step(i).text[:160].rstrip('.')}" for i in ids)

    if label == 1:
        return (f"All decisive evidence is present: {show(present)}. The remaining steps are distractors. "
                "The memory is sufficient.")
    have = f"Present evidence: {show(present)}." if present else "None of the needed evidence is present."
    return (f"{have} Missing decisive evidence: {show(missing)}. The other steps are related but do not "
            "answer the question. The memory is insufficient.")


def build_candidates(episode: Episode, qa: QA, cfg: SufficiencySynthConfig, miner: DistractorMiner) -> list[dict]:
    """One positive and one negative for a question (before the answer-model filter)."""
    rng = question_rng(cfg.seed, qa.qa_id)
    evidence = [e for e in qa.evidence if episode.has_step(e)]
    ev_set = set(evidence)
    hard = [s.step_id for s in miner.ranked(episode, qa, ev_set)[: cfg.hard_pool]]
    easy_pool = [s.step_id for s in episode.steps if s.step_id not in ev_set and not leaks_answer(s, qa.answer)]
    out = []

    n_pos = rng.randint(cfg.distractors_min, cfg.distractors_max)
    n_hard = min(len(hard), round(n_pos * cfg.positive_hard_fraction))
    picked = rng.sample(hard, n_hard)
    rest = [s for s in easy_pool if s not in picked]
    picked += rng.sample(rest, min(len(rest), n_pos - n_hard))
    out.append(_record(episode, qa, evidence, picked, evidence, [], 1, "positive"))

    if len(evidence) > 1:
        keep = rng.sample(evidence, rng.randint(1, len(evidence) - 1))
        variant = "partial"
    else:
        keep, variant = [], "none"
    missing = [e for e in evidence if e not in keep]
    n_neg = rng.randint(cfg.distractors_min, cfg.distractors_max) + len(missing)
    if cfg.refill_match_length:
        distract = rng.sample(hard, min(len(hard), n_neg - len(missing)))
        distract += length_matched(episode, missing, [h for h in hard if h not in distract])
    else:
        distract = rng.sample(hard, min(len(hard), n_neg))
    out.append(_record(episode, qa, keep, distract, keep, missing, 0, variant))
    return out


def length_matched(episode: Episode, removed: list[str], pool: list[str]) -> list[str]:
    """For each removed evidence step, the unused pool step closest to it in rendered length (ties: pool order,
    i.e. the more related). Why: evidence steps run longer than the distractors that replace them, so without
    this a negative's context is shorter than a positive's and length alone predicts the label."""
    pool, out = list(pool), []
    for step_id in removed:
        if not pool:
            break
        n = len(episode.step(step_id).render())
        best = min(pool, key=lambda p: abs(len(episode.step(p).render()) - n))
        pool.remove(best)
        out.append(best)
    return out


def build_prefix_candidate(episode: Episode, qa: QA, cfg: SufficiencySynthConfig,
                           prefix_retriever: HybridRetriever) -> dict | None:
    """(q, C_f) with C_f the top-k of the shared retrieval prefix; sufficient iff all evidence was retrieved."""
    evidence = [e for e in qa.evidence if episode.has_step(e)]
    if not evidence or not cfg.prefix_top_k:
        return None
    k = question_rng(cfg.seed, f"prefix:{qa.qa_id}").choice(list(cfg.prefix_top_k))
    _, hits = retrieval_prefix(prefix_retriever, qa.question, episode, k)
    got = {h.step.step_id for h in hits}
    present = [e for e in evidence if e in got]
    missing = [e for e in evidence if e not in got]
    variant = "prefix_positive" if not missing else ("prefix_partial" if present else "prefix_none")
    rec = _record(episode, qa, [], [h.step.step_id for h in hits], present, missing, int(not missing), variant)
    rec["prefix_top_k"] = k
    return rec


def _record(episode, qa, evidence_kept, distractors, present, missing, label, variant) -> dict:
    ids = dict.fromkeys(list(evidence_kept) + list(distractors))
    steps = sorted((episode.step(i) for i in ids), key=lambda s: s.index)
    return {"schema_version": SCHEMA_VERSION, "id": f"{qa.qa_id}/{variant}", "qa_id": qa.qa_id,
            "episode_id": episode.episode_id, "source": episode.source, "category": qa.category,
            "question": qa.question, "answer": qa.answer, "label": label, "variant": variant,
            "context": render_context(steps), "context_step_ids": [s.step_id for s in steps],
            "evidence_ids": list(qa.evidence), "present_evidence": list(present), "missing_evidence": list(missing),
            "rationale": template_rationale(episode, present, missing, label), "rationale_source": "template",
            "answer_check": []}


def answer_conversation(question: str, context: str) -> list[dict]:
    return [{"role": "system", "content": ANSWER_SYSTEM},
            {"role": "user", "content": f"Memory:\n{context}\n\nQuestion: {question}\nAnswer:"}]


def teacher_conversation(rec: dict) -> list[dict]:
    return [{"role": "system", "content": TEACHER_SYSTEM},
            {"role": "user", "content": (f"Question: {rec['question']}\nGold answer: {rec['answer']}\n"
                                         f"Gold evidence ids: {', '.join(rec['evidence_ids'])}\n\n"
                                         f"Retrieved memory:\n{rec['context']}\n\nRationale:")}]
