"""Contrastive-retriever training data from evidence labels (Router-Mem retriever, DESIGN §5).

For each question q over an episode (split by episode/conversation, never by question):

* **positives** (several per query): every evidence step, rendered exactly as the retrieval prefix
  indexes it (``Step.render()``), then *evidence-complete windows*: ``window_size`` adjacent steps
  centred on an evidence step (so the window contains that evidence), rendered like the context the
  router reads (``render_context``); at most ``max_positives``, evidence steps first;
* **hard negatives**: semantically related steps that are not evidence -- sampled from the top
  ``hard_pool`` BM25 hits and the top ``hard_pool`` base-MiniLM hits (``encoder``; ``none`` disables the
  dense ones) -- plus windows around those hard steps that contain no evidence step. A step that
  contains every content word of the gold answer is never a negative (it may well answer q:
  counted in ``dropped_answer_leaks``); steps within ``neighbour_exclusion`` of an evidence step are not
  negatives either (default 0: adjacent turns are the hardest, most useful negatives).

Sources: LoCoMo (held-out conversations ``eval_episodes``, default conv-26 and conv-30 as in the
sufficiency quickstart), the HotpotQA subset (supporting sentences are the evidence; one episode
per question; ``hotpotqa_eval_fraction`` of them held out, default none) and TextWorld trajectories
written by ``memroute synth textworld`` (``textworld_path``; ``textworld_eval_fraction`` of the games
held out), and your own Episode corpus (``corpora: [episodes]``, ``episodes_path``; held out by
``episodes_eval_episodes`` or ``episodes_eval_fraction``, default 0.2 of the episodes).

Output (``output_dir``): ``train.jsonl`` / ``eval.jsonl`` with one record per question::

    {schema_version, id, qa_id, episode_id, source, split, category, query, answer,
     positives: [text, ...], negatives: [text, ...], positive_ids, negative_ids,
     positive_kinds, negative_kinds, evidence_ids}

plus ``stats.json`` and ``manifest.json``. A question with empty evidence, or whose evidence ids are
not steps of its episode, is skipped and counted, its ids listed in ``stats.json`` (the loaders
already drop unknown ids and report them under ``corpus``). Rerunning continues where a killed run
stopped (``ResumableJsonlWriter``; each question's sample is a pure function of the seed and its id).
Loadable with ``datasets.load_dataset("json", data_files=...)`` or :func:`load_retriever_dataset`.

This module holds the config and the job; the record format, reader and :func:`build_record` are in
:mod:`data_synthesis.retriever_records`.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from data_synthesis.corpora import held_out_split, load_hotpotqa, load_locomo, sample_qa, split_episodes
from data_synthesis.episodes_corpus import load_episodes
from data_synthesis.retriever_records import RECORD_FIELDS, SCHEMA_VERSION, build_record, evidence_problem
from data_synthesis.retriever_records import (  # noqa: F401 (the record reader's home before the split)
    load_retriever_dataset, read_retriever_records)
from data_synthesis.taubench import DEFAULT_TAUBENCH, load_taubench
from data_synthesis.textworld_episodes import load_textworld
from routers.io import OutputLock, ResumableJsonlWriter, atomic_write_json, read_jsonl
from routers.memory.retrieval import HybridRetriever
from routers.memory.schema import Episode, LoadStats
from routers.models import DEFAULT_ENCODER

FORMAT = "memroute.retriever"
DEFAULT_HOTPOTQA = "../shared/data/hotpotqa/hotpotqa_train100.json"


@dataclass
class RetrieverSynthConfig:
    """Options of ``memroute synth retriever`` (YAML recipe + CLI overrides)."""

    output_dir: str = "outputs/retriever_data"
    corpora: list[str] = field(default_factory=lambda: ["locomo", "hotpotqa"],
                               metadata={"help": "any of: locomo, hotpotqa, textworld, taubench, episodes"})
    locomo_path: str | None = field(default=None, metadata={"help": "defaults to the LoCoMo file shipped in the package"})
    hotpotqa_path: str = field(default=DEFAULT_HOTPOTQA, metadata={"help": "HotpotQA subset (JSON list)"})
    eval_episodes: list[str] = field(default_factory=lambda: ["conv-26", "conv-30"],
                                     metadata={"help": "held-out LoCoMo conversations"})
    hotpotqa_eval_fraction: float = field(default=0.0, metadata={"help": "share of HotpotQA episodes held out"})
    textworld_path: str = field(default="outputs/textworld",
                                metadata={"help": "output_dir of `memroute synth textworld` (or its episodes.jsonl)"})
    textworld_eval_fraction: float = field(default=0.2, metadata={"help": "share of TextWorld games held out"})
    taubench_path: str = field(default=DEFAULT_TAUBENCH, metadata={"help": "tau-bench trajectories (JSON list)"})
    taubench_eval_fraction: float = field(default=0.2, metadata={
        "help": "share of tau-bench tasks held out (all trials of a task on one side)"})
    episodes_path: str | None = field(default=None, metadata={
        "help": "your own corpus (corpora: [episodes]): Episode JSONL / JSON list / parquet file or Hub dataset id"})
    episodes_eval_episodes: list[str] | None = field(default=None, metadata={"help": "held-out episodes of episodes_path"})
    episodes_eval_fraction: float | None = field(default=None, metadata={
        "help": "share of episodes_path's episodes held out (seeded; 0.2 when episodes_eval_episodes is unset too)"})
    split_seed: int = 0
    seed: int = 0
    max_qa_per_episode: int | None = field(default=None, metadata={"help": "cap per episode (both splits)"})
    window_size: int = field(default=3, metadata={"help": "adjacent steps per window (1 disables windows)"})
    max_positives: int = field(default=8, metadata={"help": "evidence steps first, then windows"})
    bm25_negatives: int = 6
    dense_negatives: int = 4
    window_negatives: int = 2
    hard_pool: int = field(default=30, metadata={"help": "negatives are sampled among this many top hits per retriever"})
    neighbour_exclusion: int = field(default=0, metadata={"help": "steps this close to an evidence step are not negatives"})
    encoder: str = field(default=DEFAULT_ENCODER, metadata={"help": "dense negative miner; 'none' = BM25 only"})
    drop_answer_leaks: bool = True
    encode_batch_size: int = 64
    resume: str = field(default="auto", metadata={
        "help": "auto: continue the files in output_dir (same data settings only) | never: start over"})

    def __post_init__(self):
        from routers.validation import check_non_negative, check_positive
        from routers.config import check_resume_value

        check_resume_value(self.resume)
        unknown = [c for c in self.corpora if c not in CORPORA]
        if unknown or not self.corpora:
            raise ValueError(f"corpora: unknown {unknown}; choose from {list(CORPORA)}")
        if len(set(self.corpora)) != len(self.corpora):
            raise ValueError(f"corpora: each corpus once, got {self.corpora}")
        if "episodes" in self.corpora and not self.episodes_path:
            raise ValueError("corpora has 'episodes': set episodes_path (an Episode JSONL / parquet file or Hub id)")
        if self.episodes_eval_episodes is not None and self.episodes_eval_fraction is not None:
            raise ValueError("give episodes_eval_episodes or episodes_eval_fraction, not both")
        if self.episodes_eval_fraction is not None and not 0.0 < self.episodes_eval_fraction < 1.0:
            raise ValueError(f"episodes_eval_fraction must be in (0, 1), got {self.episodes_eval_fraction}")
        check_positive(self, "max_qa_per_episode", "window_size", "max_positives", "hard_pool", "encode_batch_size")
        check_non_negative(self, "bm25_negatives", "dense_negatives", "window_negatives", "neighbour_exclusion")
        for name in ("hotpotqa_eval_fraction", "textworld_eval_fraction", "taubench_eval_fraction"):
            if not 0.0 <= getattr(self, name) < 1.0:  # 0 = nothing held out; 1 would leave no training data
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")


CORPORA = ("locomo", "hotpotqa", "textworld", "taubench", "episodes")
# options that only change batching / where the files go, not which records are made
NOT_FINGERPRINTED = ("output_dir", "encode_batch_size", "resume")


# -- the job -------------------------------------------------------------------------------------------
def _split_by_fraction(episodes: list[Episode], fraction: float, seed: int) -> tuple[list[Episode], list[Episode]]:
    """Hold out ``fraction`` of the episodes (0 = keep all for training)."""
    return split_episodes(episodes, fraction, seed) if fraction > 0 else (episodes, [])


def load_corpora(cfg: RetrieverSynthConfig, load_stats: dict[str, LoadStats]) -> tuple[list[Episode], list[Episode]]:
    """The train and held-out episodes of every configured corpus; empty corpora and splits are errors."""
    train, held = [], []
    unknown = [c for c in cfg.corpora if c not in CORPORA]
    if unknown or not cfg.corpora:
        raise ValueError(f"corpora: unknown {unknown}; choose from {list(CORPORA)}")

    def nonempty(eps: list[Episode], name: str, path) -> list[Episode]:
        if not eps:
            raise ValueError(f"corpus {name} ({path}): no episodes (empty corpus)")
        return eps

    if "locomo" in cfg.corpora:
        st = load_stats.setdefault("locomo", LoadStats())
        eps = nonempty(load_locomo(cfg.locomo_path, stats=st), "locomo", cfg.locomo_path or "bundled")
        missing = sorted(set(cfg.eval_episodes) - {e.episode_id for e in eps})
        if missing:
            raise ValueError(f"eval_episodes {missing} are not LoCoMo conversations")
        tr, ev = split_episodes(eps, eval_ids=list(cfg.eval_episodes))
        train += tr
        held += ev
    if "hotpotqa" in cfg.corpora:
        if not Path(cfg.hotpotqa_path).exists():
            raise FileNotFoundError(f"hotpotqa_path {cfg.hotpotqa_path} does not exist (or drop 'hotpotqa' from corpora)")
        eps = nonempty(load_hotpotqa(cfg.hotpotqa_path, stats=load_stats.setdefault("hotpotqa", LoadStats())),
                       "hotpotqa", cfg.hotpotqa_path)
        tr, ev = _split_by_fraction(eps, cfg.hotpotqa_eval_fraction, cfg.split_seed)
        train += tr
        held += ev
    for name, load in (("textworld", load_textworld), ("taubench", load_taubench)):  # split by a fraction
        if name in cfg.corpora:
            path = getattr(cfg, f"{name}_path")
            eps = nonempty(load(path, stats=load_stats.setdefault(name, LoadStats())), name, path)
            tr, ev = _split_by_fraction(eps, getattr(cfg, f"{name}_eval_fraction"), cfg.split_seed)
            train += tr
            held += ev
    if "episodes" in cfg.corpora:
        eps = nonempty(load_episodes(cfg.episodes_path, stats=load_stats.setdefault("episodes", LoadStats())),
                       "episodes", cfg.episodes_path)
        tr, ev = held_out_split(eps, cfg.episodes_eval_episodes, cfg.episodes_eval_fraction, cfg.split_seed,
                                name=f"corpus episodes ({cfg.episodes_path})")
        train += tr
        held += ev
    for split, eps in (("train", train), ("eval", held)):
        usable = sum(1 for ep in eps for qa in sample_qa(ep, cfg.max_qa_per_episode, cfg.seed)
                     if evidence_problem(ep, qa)[0] is None)
        if eps and not usable:  # an eval split with no episodes at all is a choice (fractions of 0)
            raise ValueError(f"the {split} split would have 0 records: its {len(eps)} episode(s) "
                             f"{[e.episode_id for e in eps][:5]} have no question with known evidence "
                             f"(corpus counts: { {k: v.to_dict() for k, v in load_stats.items()} })"[:600])
    if not train:
        raise ValueError(f"the train split would have no episodes (corpora {cfg.corpora})")
    return train, held


def prepare(cfg: RetrieverSynthConfig) -> tuple[list[Episode], list[Episode], dict[str, LoadStats]]:
    """Load and check the corpora, then (output lock held) check or reset an earlier run in output_dir."""
    from routers.config import prepare_output

    load_stats: dict[str, LoadStats] = {}
    train_eps, eval_eps = load_corpora(cfg, load_stats)
    fp = {k: v for k, v in asdict(cfg).items() if k not in NOT_FINGERPRINTED
          and not (k.startswith("episodes_") and v is None)}  # unset: earlier runs' fingerprints stay valid
    prepare_output(cfg.output_dir, fp, cfg.resume, resumable=["train.jsonl", "eval.jsonl"],
                   derived=["stats.json", "manifest.json"], what="retriever synthesis")
    return train_eps, eval_eps, load_stats


class RetrieverSynthesizer:
    def __init__(self, cfg: RetrieverSynthConfig, retriever: HybridRetriever | None = None):
        self.cfg = cfg
        if retriever is None:
            from routers.models import load_encoder

            use_dense = cfg.encoder and cfg.encoder.lower() != "none" and cfg.dense_negatives > 0
            encoder = load_encoder(cfg.encoder) if use_dense else None
            retriever = HybridRetriever(encoder=encoder, dense_weight=1.0 if encoder is not None else 0.0,
                                        batch_size=cfg.encode_batch_size)
        self.retriever = retriever

    def load(self, load_stats: dict[str, LoadStats]) -> tuple[list[Episode], list[Episode]]:
        return load_corpora(self.cfg, load_stats)

    def prepare(self) -> tuple[list[Episode], list[Episode], dict[str, LoadStats]]:
        return prepare(self.cfg)

    def run_split(self, episodes: list[Episode], split: str, counts: Counter, skipped: dict[str, list[str]],
                  progress: bool = True) -> None:
        from tqdm.auto import tqdm

        cfg = self.cfg
        out = Path(cfg.output_dir)
        total = sum(len(sample_qa(ep, cfg.max_qa_per_episode, cfg.seed)) for ep in episodes)
        with ResumableJsonlWriter(out / f"{split}.jsonl") as writer:
            bar = tqdm(total=total, desc=f"synth retriever {split}", unit="qa", disable=not progress, file=sys.stderr)
            for ep in episodes:
                qas = sample_qa(ep, cfg.max_qa_per_episode, cfg.seed)
                todo = []
                for qa in qas:
                    problem, ids = evidence_problem(ep, qa)
                    if problem:
                        counts[f"skipped_{problem}"] += 1
                        skipped[problem].append(qa.qa_id if not ids else f"{qa.qa_id}: {', '.join(ids)}")
                    elif qa.qa_id in writer:
                        counts["resumed_skip"] += 1
                    else:
                        todo.append(qa)
                if todo:
                    q_emb = (self.retriever.encode_queries([qa.question for qa in todo])
                             if self.retriever.dense_weight > 0 and ep.steps else None)
                    for j, qa in enumerate(todo):
                        _, lex, dense = self.retriever.scores(qa.question, ep,
                                                              query_embedding=None if q_emb is None else q_emb[j])
                        rec = build_record(ep, qa, cfg, split, lex, dense if q_emb is not None else None, counts)
                        writer.write(rec)
                bar.update(len(qas))
            bar.close()

    def run(self, progress: bool = True, lock: bool = True, prepared: tuple | None = None) -> dict:
        """``lock``: hold the output directory's lock (False when the caller holds it); ``prepared``: the
        result of :meth:`prepare` (made here when None)."""
        cfg = self.cfg
        if lock:
            with OutputLock(cfg.output_dir):
                return self.run(progress, lock=False, prepared=prepared)
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        train_eps, eval_eps, load_stats = prepared if prepared is not None else self.prepare()
        atomic_write_json(out / "manifest.json", {
            "format": FORMAT, "schema_version": SCHEMA_VERSION, "config": asdict(cfg),
            "train_episodes": [e.episode_id for e in train_eps], "eval_episodes": [e.episode_id for e in eval_eps]})
        counts: Counter = Counter()
        skipped: dict[str, list[str]] = {"no_evidence": [], "unknown_evidence": []}
        self.run_split(train_eps, "train", counts, skipped, progress)
        self.run_split(eval_eps, "eval", counts, skipped, progress)
        stats = summarize(out, load_stats, counts, skipped)
        atomic_write_json(out / "stats.json", stats)
        for split, eps in (("train", train_eps), ("eval", eval_eps)):
            if eps and not stats[split]["records"]:
                raise ValueError(f"{out / (split + '.jsonl')}: the {split} split ended with 0 records; "
                                 f"see {out / 'stats.json'}")
        return stats


def summarize(out: Path, load_stats: dict[str, LoadStats] | None = None, counts: Counter | None = None,
              skipped: dict[str, list[str]] | None = None) -> dict:
    """Record counts recomputed from the files on disk (right after any number of resumes)."""
    stats: dict = {"format": FORMAT, "schema_version": SCHEMA_VERSION}
    if load_stats is not None:
        stats["corpus"] = {k: v.to_dict() for k, v in load_stats.items()}
    if skipped is not None:
        stats["skipped"] = {"no_evidence": len(skipped["no_evidence"]), "unknown_evidence": len(skipped["unknown_evidence"]),
                            "no_evidence_ids": skipped["no_evidence"], "unknown_evidence_ids": skipped["unknown_evidence"]}
    if counts is not None:
        stats["this_run"] = {k: v for k, v in counts.items() if not k.startswith("skipped_")}
    for split in ("train", "eval"):
        path = out / f"{split}.jsonl"
        recs = list(read_jsonl(path, required=RECORD_FIELDS)) if path.exists() else []
        n_pos = [len(r["positives"]) for r in recs]
        n_neg = [len(r["negatives"]) for r in recs]
        stats[split] = {
            "records": len(recs),
            "positives": {"total": int(sum(n_pos)), "mean": float(np.mean(n_pos)) if recs else 0.0,
                          "max": max(n_pos, default=0),
                          "by_kind": dict(Counter(k for r in recs for k in r.get("positive_kinds", [])))},
            "negatives": {"total": int(sum(n_neg)), "mean": float(np.mean(n_neg)) if recs else 0.0,
                          "zero": sum(n == 0 for n in n_neg),
                          "by_kind": dict(Counter(k for r in recs for k in r.get("negative_kinds", [])))},
            "by_source": dict(Counter(r.get("source", "unknown") for r in recs)),
            "by_category": dict(Counter(r.get("category", "unknown") for r in recs)),
            "episodes": sorted({r["episode_id"] for r in recs}),
        }
    return stats


def make_parser():
    from routers.config import make_arg_parser

    return make_arg_parser([RetrieverSynthConfig], prog="memroute synth retriever",
                           description="Multi-positive contrastive pairs from evidence labels (LoCoMo, HotpotQA, TextWorld).")


def main(argv=None) -> dict:
    from routers.config import parse_config, save_resolved_config
    from routers.logs import setup_cli_logging

    setup_cli_logging()  # a CLI entry point (memroute synth retriever, python -m data_synthesis.retriever)
    (cfg,) = parse_config(make_parser(), [RetrieverSynthConfig], argv)
    with OutputLock(cfg.output_dir):  # before anything is loaded or written: a second run fails at once
        prepared = prepare(cfg)
        save_resolved_config(cfg.output_dir, cfg)
        stats = RetrieverSynthesizer(cfg).run(lock=False, prepared=prepared)
    print({s: {"records": stats[s]["records"], "mean_positives": round(stats[s]["positives"]["mean"], 2),
               "mean_negatives": round(stats[s]["negatives"]["mean"], 2)} for s in ("train", "eval")},
          {"skipped": {k: v for k, v in stats["skipped"].items() if not k.endswith("_ids")}})
    return stats


if __name__ == "__main__":
    main()
