"""Evidence-intervention synthesis for the Router-Mem sufficiency router (seed 001, DESIGN §5).

For each question q with answer a and evidence steps E (split by episode, never by question):

* positive (label 1): all of E plus distractors from the same episode (half random, half hard by
  default, so "how related are the distractors" is not a shortcut for the label);
* negative (label 0): E with a decisive part dropped ("partial", when |E| > 1) or no evidence at all
  ("none"), plus *hard* distractors: steps similar to q by MiniLM embedding, boosted by shared entities;
* a negative that any configured answer model still answers correctly is discarded (recorded in
  ``discarded.jsonl`` with the answer, so a resumed run does not redo it);
* a rationale per sample from a teacher LLM when configured, else an evidence-aware template
  (which evidence is present, what decisive piece is missing); ``rationale_source`` says which;
* optionally (``prefix_top_k``) one *retrieval-prefix* sample per question: C_f = the top-k hits of the
  shared retrieval prefix, exactly as the progressive executor builds it, labelled sufficient iff every
  evidence step was retrieved (variants ``prefix_positive`` / ``prefix_partial`` / ``prefix_none``).
  The router is applied to (q, C_f) at inference (seed 001 eq. 1-3), and retrieved contexts are harder
  than intervention samples: every step is similar to q. Without them a router that ranks intervention
  samples well (AUROC 0.86) ranks real prefixes much worse (0.58-0.71 on held-out LoCoMo).

Output (``output_dir``): ``train.jsonl``, ``eval.jsonl`` (records with ``schema_version``),
``discarded.jsonl``, ``stats.json``, ``manifest.json``. Loadable with
``datasets.load_dataset("json", data_files=...)``. Rerunning continues where a killed run stopped.

This module holds the config and the job (splits, resume, answer-model filter, stats); how one question
becomes samples, and the sample format and reader, are in :mod:`data_synthesis.sufficiency_samples`.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from data_synthesis.corpora import DEFAULT_EVAL_FRACTION, load_corpus, sample_qa, split_episodes
from data_synthesis.sufficiency_samples import (RECORD_FIELDS, SCHEMA_VERSION, DistractorMiner, answer_conversation,
                                                build_candidates, build_prefix_candidate, teacher_conversation)
from data_synthesis.sufficiency_samples import (  # noqa: F401 (the sample reader's home before the split)
    read_samples, sample_validator, validate_sample)
from routers.config import prepare_output
from routers.io import OutputLock, ResumableJsonlWriter, atomic_write_json, read_jsonl
from routers.memory.retrieval import HybridRetriever
from routers.memory.schema import Episode, LoadStats
from routers.text import answers_correctly
from routers.validation import check_non_negative, check_positive, check_unit_interval

FORMAT = "memroute.sufficiency"


@dataclass
class SufficiencySynthConfig:
    """Options of ``memroute synth sufficiency`` (YAML recipe + CLI overrides)."""

    output_dir: str = "outputs/sufficiency_data"
    corpus: str = field(default="locomo", metadata={"help": "locomo, hotpotqa, textworld, taubench or episodes (your own data)"})
    corpus_path: str | None = field(default=None, metadata={
        "help": "defaults to the LoCoMo file shipped in the package; episodes: a JSONL / JSON / parquet file or Hub id"})
    eval_fraction: float | None = field(default=None, metadata={
        "help": f"share of whole episodes held out (seeded by split_seed); {DEFAULT_EVAL_FRACTION} when eval_episodes "
                "is unset too"})
    eval_episodes: list[str] | None = field(default=None, metadata={
        "help": "explicit held-out episode ids (instead of eval_fraction)"})
    split_seed: int = 0
    seed: int = 0
    max_qa_per_episode: int | None = field(default=None, metadata={"help": "cap per episode (train split)"})
    max_eval_qa_per_episode: int | None = field(default=None, metadata={"help": "cap per episode (eval split)"})
    distractors_min: int = 2
    distractors_max: int = 6
    positive_hard_fraction: float = field(default=1.0, metadata={
        "help": "share of hard distractors in positives (negatives: all hard). Below 1 the label is readable off how "
                "related the context is (the paper draws positives' at random; 0.5 was our default until the surface "
                "baseline showed the shortcut: configs/sufficiency/README.md)"})
    refill_match_length: bool = field(default=True, metadata={
        "help": "the hard distractors that replace a negative's removed evidence are the ones closest to it in length "
                "(false: drawn at random; evidence runs longer, so length alone would predict the label)"})
    hard_pool: int = field(default=20, metadata={"help": "mine hard distractors among this many top candidates"})
    entity_bonus: float = 0.1
    encoder: str = "sentence-transformers/all-MiniLM-L6-v2"
    answer_models: list[str] = field(default_factory=lambda: ["HuggingFaceTB/SmolLM2-135M-Instruct"],
                                     metadata={"help": "backends that try to answer negatives; 'none' disables"})
    answer_f1_threshold: float = 0.5
    answer_batch_size: int = 8
    teacher: str | None = field(default=None, metadata={"help": "teacher LLM backend for rationales; None = template"})
    qa_chunk: int = field(default=16, metadata={"help": "questions processed (and flushed) together"})
    intervention_samples: bool = field(default=True, metadata={
        "help": "emit the evidence-intervention positive/negative pair per question (off = prefix samples only)"})
    prefix_top_k: list[int] = field(default_factory=list, metadata={
        "help": "also emit one retrieval-prefix sample per question, k drawn from this list; [] = off"})
    prefix_encoder: str | None = field(default=None, metadata={
        "help": "encoder of the shared retrieval prefix (e.g. a trained retriever export); None = `encoder`"})
    prefix_dense_weight: float = field(default=0.5, metadata={"help": "dense share of the prefix's hybrid score"})
    resume: str = field(default="auto", metadata={
        "help": "auto: continue the files in output_dir (same data settings only) | never: start over"})

    def __post_init__(self):
        from routers.config import check_resume_value

        check_resume_value(self.resume)
        if self.corpus not in CORPORA:
            raise ValueError(f"unknown corpus {self.corpus!r}; choose {', '.join(map(repr, CORPORA))}")
        if self.eval_fraction is not None and not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in (0, 1), got {self.eval_fraction}")
        if self.eval_episodes is not None and not self.eval_episodes:
            raise ValueError("eval_episodes is an empty list: name the held-out episodes, or leave it unset "
                             "to hold out eval_fraction of them")
        if self.eval_fraction is not None and self.eval_episodes is not None:
            raise ValueError("give eval_episodes or eval_fraction, not both")
        check_positive(self, "max_qa_per_episode", "max_eval_qa_per_episode", "qa_chunk", "answer_batch_size",
                       "hard_pool")
        check_non_negative(self, "distractors_min", "distractors_max", "entity_bonus")
        if self.distractors_min > self.distractors_max:
            raise ValueError(f"distractors_min ({self.distractors_min}) > distractors_max ({self.distractors_max})")
        check_unit_interval(self, "positive_hard_fraction", "answer_f1_threshold", "prefix_dense_weight")
        bad = [k for k in self.prefix_top_k if isinstance(k, bool) or not isinstance(k, int) or k < 1]
        if bad:
            raise ValueError(f"prefix_top_k values must be integers >= 1, got {bad}")
        if not self.intervention_samples and not self.prefix_top_k:
            raise ValueError("intervention_samples is false and prefix_top_k is empty: no sample would be made; "
                             "set prefix_top_k (e.g. [3, 5]) or intervention_samples: true")


CORPORA = ("locomo", "hotpotqa", "textworld", "taubench", "episodes")
# options that only change batching / where the files go, not which records are made
NOT_FINGERPRINTED = ("output_dir", "qa_chunk", "answer_batch_size", "resume")
# options added after synthesis runs existed, with the behaviour those runs had (so they resume when it is kept)
ADDED_LATER = {"refill_match_length": False}


class SufficiencySynthesizer:
    def __init__(self, cfg: SufficiencySynthConfig, retriever: HybridRetriever | None = None,
                 answer_backends: list | None = None, teacher=None):
        from routers.backends import make_backend
        from routers.models import load_encoder

        self.cfg = cfg
        if retriever is None:
            encoder = load_encoder(cfg.encoder) if cfg.encoder and cfg.encoder.lower() != "none" else None
            retriever = HybridRetriever(encoder=encoder, dense_weight=1.0 if encoder is not None else 0.0)
        self.miner = DistractorMiner(retriever, cfg.entity_bonus)
        self.prefix_retriever = None
        if cfg.prefix_top_k:
            name = cfg.prefix_encoder or cfg.encoder
            reuse = name == cfg.encoder and retriever.encoder is not None
            self.prefix_retriever = HybridRetriever(encoder=retriever.encoder if reuse else (name or "none"),
                                                    dense_weight=cfg.prefix_dense_weight)
        if answer_backends is None:
            answer_backends = [b for b in (make_backend(s, batch_size=cfg.answer_batch_size) for s in cfg.answer_models) if b]
        self.answer_backends = answer_backends
        self.teacher = teacher if teacher is not None else make_backend(cfg.teacher)

    def _filter_negatives(self, negatives: list[dict]) -> tuple[list[dict], list[dict]]:
        kept, dropped = list(negatives), []
        for backend in self.answer_backends:
            if not kept:
                break
            preds = backend.generate([answer_conversation(r["question"], r["context"]) for r in kept], max_new_tokens=16)
            still = []
            for rec, pred in zip(kept, preds):
                ok = answers_correctly(pred, rec["answer"], self.cfg.answer_f1_threshold)
                rec["answer_check"].append({"model": backend.name, "prediction": pred, "correct": ok})
                (dropped if ok else still).append(rec)
            kept = still
        return kept, dropped

    def _add_teacher_rationales(self, records: list[dict]) -> None:
        if self.teacher is None or not records:
            return
        texts = self.teacher.generate([teacher_conversation(r) for r in records], max_new_tokens=96)
        for rec, text in zip(records, texts):
            if text:
                rec["rationale"], rec["rationale_source"] = text, f"teacher:{self.teacher.name}"

    def run_split(self, episodes: list[Episode], split: str, cap: int | None, progress: bool = True) -> Counter:
        from tqdm.auto import tqdm

        out = Path(self.cfg.output_dir)
        counts: Counter = Counter()
        work = [(ep, qa) for ep in episodes for qa in sample_qa(ep, cap, self.cfg.seed)]
        with ResumableJsonlWriter(out / f"{split}.jsonl") as writer, \
                ResumableJsonlWriter(out / "discarded.jsonl") as discarded:
            done = writer.done | discarded.done
            bar = tqdm(total=len(work), desc=f"synth {split}", unit="qa", disable=not progress, file=sys.stderr)
            for start in range(0, len(work), self.cfg.qa_chunk):
                chunk = work[start:start + self.cfg.qa_chunk]
                candidates = []
                for ep, qa in chunk:
                    built = build_candidates(ep, qa, self.cfg, self.miner) if self.cfg.intervention_samples else []
                    if self.prefix_retriever is not None:
                        built += [c for c in [build_prefix_candidate(ep, qa, self.cfg, self.prefix_retriever)] if c]
                    # a sample the trainer would refuse (validate_sample): an empty question, or an empty
                    # context (a "none" negative in an episode with no step besides the evidence)
                    for why, bad in (("empty_question", [c for c in built if not c["question"].strip()]),
                                     ("empty_context", [c for c in built if not c["context"].strip()])):
                        counts[f"skipped_{why}"] += len(bad)
                    built = [c for c in built if c["question"].strip() and c["context"].strip()]
                    cands = [c for c in built if c["id"] not in done]
                    candidates.extend(cands)
                    counts["resumed_skip"] += len(built) - len(cands)
                positives = [c for c in candidates if c["label"] == 1]
                negatives, dropped = self._filter_negatives([c for c in candidates if c["label"] == 0])
                keep = sorted(positives + negatives, key=lambda r: r["id"])
                self._add_teacher_rationales(keep)
                for rec in keep:
                    writer.write(rec)
                for rec in dropped:
                    discarded.write({**rec, "split": split, "reason": "answer model answered correctly"})
                bar.update(len(chunk))
            bar.close()
        return counts

    def run(self, progress: bool = True, lock: bool = True, plan: "Plan | None" = None) -> dict:
        """Synthesize both splits. ``lock``: hold the output directory's lock for the run (False when the
        caller already holds it, e.g. :func:`main`); ``plan``: the result of :func:`prepare` (made here
        when None)."""
        cfg = self.cfg
        if lock:
            with OutputLock(cfg.output_dir):
                return self.run(progress, lock=False, plan=plan)
        if plan is None:
            plan = prepare(cfg)
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        train_eps, eval_eps = plan.train, plan.eval
        atomic_write_json(out / "manifest.json", {
            "format": FORMAT, "schema_version": SCHEMA_VERSION, "config": asdict(cfg),
            "train_episodes": [e.episode_id for e in train_eps], "eval_episodes": [e.episode_id for e in eval_eps]})
        counts = self.run_split(train_eps, "train", cfg.max_qa_per_episode, progress)
        counts += self.run_split(eval_eps, "eval", cfg.max_eval_qa_per_episode, progress)
        stats = summarize(out, plan.load_stats)
        stats["this_run"] = dict(counts)
        atomic_write_json(out / "stats.json", stats)
        for split in ("train", "eval"):
            if not stats[split]["samples"]:
                raise ValueError(f"{out / (split + '.jsonl')}: the {split} split ended with 0 samples "
                                 f"(this run: {dict(counts)}); see {out / 'stats.json'}")
        return stats


@dataclass
class Plan:
    """What a run will synthesize: the split episodes (checked non-empty) and the loader's counts."""

    train: list[Episode]
    eval: list[Episode]
    load_stats: LoadStats


def _corpus_name(cfg: SufficiencySynthConfig) -> str:
    return f"corpus {cfg.corpus!r}" + (f" ({cfg.corpus_path})" if cfg.corpus_path else "")


def prepare(cfg: SufficiencySynthConfig) -> Plan:
    """Load and split the corpus and refuse input that would give an empty split, then (output lock held)
    check or reset the earlier run in ``output_dir`` (:func:`prepare_output`). Writes nothing but the
    fingerprint, so a bad corpus or option fails before any record is written."""
    load_stats = LoadStats()
    episodes = load_corpus(cfg.corpus, cfg.corpus_path, stats=load_stats)
    name = _corpus_name(cfg)
    if not episodes:
        raise ValueError(f"{name}: no episodes (empty corpus)")
    if not any(ep.qa for ep in episodes):
        st = load_stats
        raise ValueError(f"{name}: no usable question in {len(episodes)} episode(s): {st.skipped_no_evidence} "
                         f"without evidence, {st.skipped_unknown_evidence} whose evidence ids are all unknown "
                         f"(e.g. {st.unknown_evidence_ids[:3]})")
    if cfg.eval_episodes is not None:
        known = {e.episode_id for e in episodes}
        unknown = sorted(set(cfg.eval_episodes) - known)
        if unknown:
            raise ValueError(f"eval_episodes {unknown} are not episodes of {name} (it has "
                             f"{sorted(known)[:8]}{' ...' if len(known) > 8 else ''})")
    fraction = DEFAULT_EVAL_FRACTION if cfg.eval_fraction is None else cfg.eval_fraction
    train_eps, eval_eps = split_episodes(episodes, fraction, cfg.split_seed, cfg.eval_episodes)
    for split, eps, cap in (("train", train_eps, cfg.max_qa_per_episode), ("eval", eval_eps, cfg.max_eval_qa_per_episode)):
        if not eps:
            why = (f"{name} has only {len(episodes)} episode(s), and an episode is never split between train and eval"
                   if len(episodes) < 2 else "eval_episodes names every episode of the corpus"
                   if cfg.eval_episodes is not None else f"eval_fraction {fraction} of {len(episodes)} episodes")
            raise ValueError(f"the {split} split would have no episodes: {why}")
        if not sum(len(sample_qa(ep, cap, cfg.seed)) for ep in eps):
            raise ValueError(f"the {split} split would have 0 samples: its {len(eps)} episode(s) "
                             f"{[e.episode_id for e in eps][:5]} have no usable question")
    fp = {k: v for k, v in asdict(cfg).items() if k not in NOT_FINGERPRINTED}
    fp["eval_fraction"] = fraction  # as stored before it could be unset: earlier runs stay resumable
    prepare_output(cfg.output_dir, fp, cfg.resume, resumable=["train.jsonl", "eval.jsonl", "discarded.jsonl"],
                   derived=["stats.json", "manifest.json"], what="sufficiency synthesis", added_later=ADDED_LATER)
    return Plan(train_eps, eval_eps, load_stats)


def summarize(out: Path, load_stats: LoadStats | None = None) -> dict:
    """Counts recomputed from the files on disk, so they are right after any number of resumes."""
    stats: dict = {"format": FORMAT, "schema_version": SCHEMA_VERSION}
    if load_stats is not None:
        stats["corpus"] = load_stats.to_dict()
    for split in ("train", "eval"):
        path = out / f"{split}.jsonl"
        recs = list(read_jsonl(path, required=RECORD_FIELDS)) if path.exists() else []
        stats[split] = {
            "samples": len(recs), "positives": sum(r["label"] == 1 for r in recs),
            "negatives": sum(r["label"] == 0 for r in recs),
            "by_variant": dict(Counter(r["variant"] for r in recs)),
            "by_category": dict(Counter(r["category"] for r in recs)),
            "rationale_source": dict(Counter(r["rationale_source"].split(":")[0] for r in recs)),
            "mean_context_steps": float(np.mean([len(r["context_step_ids"]) for r in recs])) if recs else 0.0,
            "episodes": sorted({r["episode_id"] for r in recs}),
        }
    disc = out / "discarded.jsonl"
    drecs = list(read_jsonl(disc, required=("id",))) if disc.exists() else []
    stats["discarded_by_answer_models"] = {s: sum(r.get("split") == s for r in drecs) for s in ("train", "eval")}
    return stats


def make_parser():
    from routers.config import make_arg_parser

    return make_arg_parser([SufficiencySynthConfig], prog="memroute synth sufficiency",
                           description="Evidence-intervention samples for the sufficiency router.")


def main(argv=None) -> dict:
    from routers.config import parse_config, save_resolved_config
    from routers.logs import setup_cli_logging

    setup_cli_logging()  # a CLI entry point (memroute synth sufficiency, python -m data_synthesis.sufficiency)
    (cfg,) = parse_config(make_parser(), [SufficiencySynthConfig], argv)
    with OutputLock(cfg.output_dir):  # before anything is loaded or written: a second run fails at once
        plan = prepare(cfg)
        save_resolved_config(cfg.output_dir, cfg)
        stats = SufficiencySynthesizer(cfg).run(lock=False, plan=plan)
    print({k: {kk: vv for kk, vv in v.items() if kk in ("samples", "positives", "negatives")}
           for k, v in stats.items() if k in ("train", "eval")}, stats["discarded_by_answer_models"])
    return stats


if __name__ == "__main__":
    main()
