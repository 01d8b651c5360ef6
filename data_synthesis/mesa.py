"""The MESA 31-subset sweep (seed 002, DESIGN §7): ``memroute synth mesa``.

Per corpus episode, the five memory structures (:mod:`routers.mesa`) are built once (timed, cached under
``<output_dir>/structures/``; a structure that fails is recorded and left out for that episode only). Each
question is then read through every structure once, and all 31 non-empty subsets are scored:

* ``evidence_recall`` (always): the share of the gold evidence steps among the steps the subset's composed
  context covers;
* ``f1`` (optional, budgeted: ``reader`` + ``max_reader_questions``): token F1 of the answer model's greedy
  answer to the appendix-C.3 prompt, answers cached per (question, subset, prompt) in ``reader_cache.jsonl``.

Output (``output_dir``): ``sweep.jsonl`` (one record per question, format and validator in
:mod:`routers.mesa.sweep_format`), ``structures_report.json`` (build times, failures, tokens, recall per
structure, summary build quality), ``reader_cache.jsonl``, ``structures/``, ``resolved_config.yaml``. A killed
sweep resumes: written questions are skipped, built structures and reader answers are loaded, not redone. A
run with a larger ``max_reader_questions`` re-scores the newly selected questions whose records lack ``f1``
(their reader-free part is recomputed, cheaply; nothing else is).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from data_synthesis.corpora import load_corpus
from data_synthesis.mesa_reader import CachedReader, reader_selection
from routers.config import prepare_output
from routers.io import OutputLock, ResumableJsonlWriter, atomic_write_text, read_jsonl, repair_truncated_tail
from routers.logs import get_logger
from routers.memory.schema import Episode
from routers.mesa.compose import TokenCounter, task_line
from routers.mesa.library import MemoryLibrary, default_structures
from routers.mesa.sweep_format import ALL_SUBSET_KEYS, SCHEMA_VERSION, STRUCTURES, parse_subset, validate_record
from routers.text import token_f1
from routers.validation import check_positive

logger = get_logger(__name__)
SWEEP_FILE = "sweep.jsonl"
REPORT_FILE = "structures_report.json"
CORPORA = ("locomo", "textworld")


@dataclass
class MesaSweepConfig:
    """Options of ``memroute synth mesa`` (YAML recipe + CLI overrides)."""

    output_dir: str = "outputs/mesa/locomo"
    corpus: str = field(default="locomo", metadata={"help": "locomo or textworld"})
    corpus_path: str | None = field(default=None, metadata={"help": "textworld: the output_dir of `memroute synth "
                                                                    "textworld`; locomo: defaults to the bundled file"})
    episodes: list[str] | None = field(default=None, metadata={"help": "only these episode ids (default: all)"})
    max_questions_per_episode: int | None = None
    encoder: str = field(default="sentence-transformers/all-MiniLM-L6-v2",
                         metadata={"help": "vector structure encoder; 'hashing' = a model-free hashed bag of words"})
    summary_builder: str = field(default="extractive", metadata={"help": "extractive (TF-IDF centrality) or llm"})
    graph_extractor: str = field(default="heuristic", metadata={"help": "heuristic OpenIE-lite or llm"})
    builder_model: str | None = field(default=None, metadata={"help": "backend of the llm summary / graph builders"})
    token_counter: str = field(default="HuggingFaceTB/SmolLM2-135M-Instruct",
                               metadata={"help": "tokenizer counting evidence tokens; 'whitespace' = words"})
    reader: str = field(default="none", metadata={"help": "answer model (backend spec) for f1; 'none' = reader-free"})
    max_reader_questions: int | None = field(default=None, metadata={
        "help": "reader budget: questions (seeded hash order over the corpus) scored with the reader; None = all"})
    reader_seed: int = 0
    reader_max_evidence_tokens: int = field(default=1536, metadata={"help": "evidence cut for the reader's input"})
    reader_max_new_tokens: int = 24
    reader_batch_size: int = 8
    reader_dtype: str = field(default="float32", metadata={
        "help": "reader weights: float32, bfloat16, float16 or auto (bfloat16 where the CPU has it: 2-3x faster)"})
    summary_compare_episodes: int = field(default=0, metadata={
        "help": "build quality of the llm summary vs the extractive one on this many episodes (needs builder_model)"})
    summary_compare_segments: int = field(default=4, metadata={"help": "segments per compared episode"})
    progress: bool = True
    resume: str = field(default="auto", metadata={"help": "auto: continue output_dir | never: start over"})

    def __post_init__(self):
        from routers.config import check_resume_value

        check_resume_value(self.resume)
        if self.corpus not in CORPORA:
            raise ValueError(f"unknown corpus {self.corpus!r}; choose {', '.join(map(repr, CORPORA))}")
        if self.summary_builder not in ("extractive", "llm"):
            raise ValueError(f"summary_builder must be 'extractive' or 'llm', got {self.summary_builder!r}")
        if self.graph_extractor not in ("heuristic", "llm"):
            raise ValueError(f"graph_extractor must be 'heuristic' or 'llm', got {self.graph_extractor!r}")
        if "llm" in (self.summary_builder, self.graph_extractor) and not self.builder_model:
            raise ValueError("an llm summary builder / graph extractor needs builder_model")
        check_positive(self, "max_questions_per_episode", "reader_max_evidence_tokens", "reader_max_new_tokens",
                       "reader_batch_size", "summary_compare_segments")
        if self.max_reader_questions is not None and self.max_reader_questions < 0:
            raise ValueError(f"max_reader_questions must be >= 0, got {self.max_reader_questions}")
        if self.episodes is not None and not self.episodes:
            raise ValueError("episodes is an empty list: name episodes or leave it unset for all")
        if self.reader_dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ValueError(f"reader_dtype must be float32, bfloat16, float16 or auto, got {self.reader_dtype!r}")

    @property
    def reader_on(self) -> bool:
        return self.reader.lower() not in ("", "none", "null")


# options that change which questions get done or how fast, not what a record contains
NOT_FINGERPRINTED = ("output_dir", "resume", "progress", "episodes", "max_questions_per_episode",
                     "max_reader_questions", "reader_seed", "reader_batch_size", "summary_compare_episodes",
                     "summary_compare_segments")


def evidence_indices(episode: Episode, evidence: list[str]) -> list[int]:
    return sorted({episode.step(e).index for e in evidence if episode.has_step(e)})


def score_question(library: MemoryLibrary, mem, qa, count, corpus: str, reader: CachedReader | None = None) -> dict:
    """One sweep record: every structure accessed once, the 31 subsets composed and scored."""
    episode = mem.episode
    acc = library.access(mem, qa.question)
    tokens = {n: count(a.text) if a is not None else 0 for n, a in acc.items()}
    gold = evidence_indices(episode, qa.evidence)
    structures = {n: {"ok": acc[n] is not None, "tokens": tokens[n], "preview": acc[n].preview if acc[n] else "",
                      "top_score": acc[n].top_score if acc[n] else None} for n in STRUCTURES}
    answers = {}
    if reader is not None:
        evidence = {n: a.text for n, a in acc.items() if a is not None}
        live = [k for k in ALL_SUBSET_KEYS if any(acc[n] is not None for n in parse_subset(k))]
        task = task_line(episode.source, episode.meta.get("speakers", []))
        answers = reader.answer(qa.qa_id, reader.prompts(task, qa.question, evidence, live))
    subsets = {}
    for key in ALL_SUBSET_KEYS:
        live = [n for n in parse_subset(key) if acc[n] is not None]
        covered = set().union(*(acc[n].steps for n in live)) if live else set()
        recall = sum(g in covered for g in gold) / len(gold) if gold and live else 0.0
        f1 = None
        if reader is not None:
            f1 = float(token_f1(answers[key], str(qa.answer))) if live else 0.0
        subsets[key] = {"tokens": sum(tokens[n] for n in live), "evidence_recall": float(recall), "f1": f1}
    rec = {"schema_version": SCHEMA_VERSION, "id": qa.qa_id, "episode_id": episode.episode_id, "corpus": corpus,
           "question": qa.question, "gold_answer": str(qa.answer), "evidence_steps": gold,
           "structures": structures, "subsets": subsets}
    validate_record(rec)
    return rec


def drop_records_needing_reader(path: Path, reader_ids: set[str]) -> int:
    """Remove (atomically) the records of questions now in the reader budget that were written without f1,
    so this run scores them. Returns how many were removed."""
    if not path.exists():
        return 0
    repair_truncated_tail(path)
    keep, dropped = [], 0
    with open(path, encoding="utf-8") as fh:
        lines = fh.readlines()
    recs = list(read_jsonl(path, required=("id", "subsets")))
    for line, rec in zip([x for x in lines if x.strip()], recs):
        if rec["id"] in reader_ids and any(s.get("f1") is None for s in rec["subsets"].values()):
            dropped += 1
        else:
            keep.append(line if line.endswith("\n") else line + "\n")
    if dropped:
        atomic_write_text(path, "".join(keep))
        logger.info("%s: %d record(s) without reader scores are redone for the reader budget", path, dropped)
    return dropped


def load_episodes(cfg: MesaSweepConfig) -> list[Episode]:
    episodes = load_corpus(cfg.corpus, cfg.corpus_path)
    if cfg.episodes is not None:
        known = {e.episode_id for e in episodes}
        unknown = sorted(set(cfg.episodes) - known)
        if unknown:
            raise ValueError(f"episodes {unknown} are not in corpus {cfg.corpus!r} (it has {sorted(known)[:6]} ...)")
        episodes = [e for e in episodes if e.episode_id in set(cfg.episodes)]
    if not any(e.qa for e in episodes):
        raise ValueError(f"corpus {cfg.corpus!r}: no episode with a usable question")
    return episodes


class MesaSweep:
    """The sweep job. ``library`` / ``reader_backend`` / ``count`` may be injected (tests)."""

    def __init__(self, cfg: MesaSweepConfig, library: MemoryLibrary | None = None, reader_backend=None,
                 count=None):
        self.cfg = cfg
        out = Path(cfg.output_dir)
        if library is None:
            backend = None
            if cfg.builder_model:
                from routers.backends import make_backend

                backend = make_backend(cfg.builder_model, batch_size=cfg.reader_batch_size)
            library = MemoryLibrary(default_structures(cfg.encoder, cfg.summary_builder, cfg.graph_extractor, backend),
                                    cache_dir=out / "structures")
        self.library = library
        self.count = count if count is not None else TokenCounter(cfg.token_counter)
        if reader_backend is None and cfg.reader_on:
            from routers.backends import make_backend

            reader_backend = make_backend(cfg.reader, batch_size=cfg.reader_batch_size,
                                          max_input_tokens=cfg.reader_max_evidence_tokens + 512,
                                          **({} if cfg.reader.startswith("openai:") else {"dtype": cfg.reader_dtype}))
        self.reader_backend = reader_backend

    def run(self, episodes: list[Episode]) -> dict:
        from tqdm.auto import tqdm

        from data_synthesis.mesa_report import write_report

        cfg, out = self.cfg, Path(self.cfg.output_dir)
        questions = [(ep, qa) for ep in episodes for qa in ep.qa[: cfg.max_questions_per_episode]]
        reader_ids = (reader_selection([qa.qa_id for _, qa in questions], cfg.max_reader_questions, cfg.reader_seed)
                      if self.reader_backend is not None else set())
        drop_records_needing_reader(out / SWEEP_FILE, reader_ids)
        reader = (CachedReader(self.reader_backend, out, self.count, cfg.reader_max_evidence_tokens,
                               cfg.reader_max_new_tokens) if self.reader_backend is not None else None)
        t0 = time.perf_counter()
        memories = {}
        written = 0
        try:
            with ResumableJsonlWriter(out / SWEEP_FILE) as writer:
                bar = tqdm(total=len(questions), desc=f"mesa sweep {cfg.corpus}", unit="q", disable=not cfg.progress,
                           file=sys.stderr)
                for ep in tqdm(episodes, desc="episodes", unit="ep", disable=not cfg.progress, file=sys.stderr):
                    mem = memories[ep.episode_id] = self.library.build(ep)
                    for qa in ep.qa[: cfg.max_questions_per_episode]:
                        if qa.qa_id not in writer:
                            rec = score_question(self.library, mem, qa, self.count, cfg.corpus,
                                                 reader if qa.qa_id in reader_ids else None)
                            written += writer.write(rec)
                        bar.update(1)
                bar.close()
        finally:
            if reader is not None:
                reader.close()
        run = {"written_this_run": written, "seconds": round(time.perf_counter() - t0, 1),
               "reader_questions_selected": len(reader_ids), "token_counter": self.count.name
               if hasattr(self.count, "name") else "custom"}
        if reader is not None:
            run.update(reader_generations=reader.generated, reader_cache_hits=reader.cache_hits,
                       reader_seconds=round(reader.seconds, 1), reader_prompts_truncated=reader.truncated)
        return write_report(cfg, memories, run)


def make_parser():
    from routers.config import make_arg_parser

    return make_arg_parser([MesaSweepConfig], prog="memroute synth mesa",
                           description="MESA: build the five memory structures and score all 31 subsets.")


def main(argv=None) -> dict:
    from routers.config import parse_config, save_resolved_config

    (cfg,) = parse_config(make_parser(), [MesaSweepConfig], argv)
    with OutputLock(cfg.output_dir):
        episodes = load_episodes(cfg)
        fp = {k: v for k, v in asdict(cfg).items() if k not in NOT_FINGERPRINTED}
        if fp["reader_dtype"] == "float32":  # added later: at its default, sweeps started before it resume
            del fp["reader_dtype"]
        prepare_output(cfg.output_dir, fp, cfg.resume, resumable=[SWEEP_FILE, "reader_cache.jsonl"],
                       derived=[REPORT_FILE, "structures"], what="MESA sweep")
        save_resolved_config(cfg.output_dir, cfg)
        report = MesaSweep(cfg).run(episodes)
    logger.info("MESA sweep: %s", {k: report[k] for k in ("questions", "run") if k in report})
    return report


if __name__ == "__main__":
    main()
