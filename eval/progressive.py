"""``memroute eval progressive``: Router-Mem quality-latency evaluation (seed 001, Tables 1-5).

    memroute eval progressive configs/progressive_locomo.yaml [--router outputs/sufficiency_router/export]
        [--encoder outputs/retriever_minilm/export] [--max_questions_per_episode 3]

Every question is executed once per path, and cached (``records.jsonl``, keyed by split, question id and a
hash of the settings that change results): the shared prefix (hits, time), the router score of every
router (base and trained on the same C_f, with their times; null = over the input budget), the fast
answer (early return from C_f in temporal order), the slow answer (anchor blocks + neighbours -> memory
agents in one batched call -> aggregate -> answer, each stage timed) and the baselines (RAG top-k; long
context truncated to the model window, most recent steps kept, the dropped count recorded). Every row is
then derived exactly from the records, without running anything again:

* ``fast_only``: T_mem = prefix; ``slow_only``: T_mem = prefix + blocks + aggregate (no router);
* router ``r`` at tau: fast where s >= tau (null score -> slow), T_mem = prefix + router (+ blocks +
  aggregate on the slow path); T_e2e adds the chosen path's answer time;
* ``rag``: T_mem = retrieval; ``long_context``: T_mem = context assembly; T_build = index construction
  per episode (mean over the split's episodes).

Scores are LoCoMo token F1 x 100 and, with ``--judge``, the AMA-Bench binary judge accuracy x 100;
``score_metric`` picks which one is "score". tau is picked on the dev split (smallest T_mem whose score
is within ``max_score_drop`` points of slow-only) and reported on the test split.

Router scores are cached apart from the paths (keyed by the router's identity: model spec + a fingerprint of
its folder), so evaluating a new or retrained router on the same questions reuses every cached path and only
scores C_f (rebuilt exactly from the cached hit ids): minutes instead of hours.

A backend that keeps failing marks the question failed (counted, listed in ``failures.jsonl``, not
cached, so a rerun retries it) and the run goes on; a killed run resumes from ``records.jsonl``.
Outputs (atomic): ``rows.csv``, ``metrics.json``, ``pareto.png``, ``failures.jsonl``,
``resolved_config.yaml``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from data_synthesis.jsonl import ResumableJsonlWriter, atomic_write_json, atomic_write_text, read_jsonl
from eval.qa_scoring import token_f1
from routers.models import DEFAULT_CAUSAL_LM, DEFAULT_ENCODER

RECORD_VERSION = 2  # 2: router scores carry router_id; routers are not in the path hash
TAUS = (0.1, 0.3, 0.5, 0.7, 0.9)
BASE, TRAINED = "base", "trained"
PAPER_TAUS = (0.3, 0.7)  # the tau span of seed 001 Tables 3 and 5
PATHS = ("fast", "slow", "rag", "long_context")


@dataclass
class ProgressiveEvalConfig:
    corpus: str = field(default="locomo", metadata={"help": "Corpus for data_synthesis.corpora.load_corpus."})
    corpus_path: str | None = field(default=None, metadata={"help": "Corpus file/folder (default: bundled LoCoMo)."})
    dev_episodes: list[str] = field(default_factory=lambda: ["conv-26"], metadata={
        "help": "Held-out episodes where tau is chosen."})
    test_episodes: list[str] = field(default_factory=lambda: ["conv-30"], metadata={
        "help": "Held-out episodes where the chosen tau is reported ([] = a dev-only run)."})
    max_questions_per_episode: int | None = field(default=None, metadata={
        "help": "Seeded random sample of questions per episode (None = all)."})
    seed: int = 0
    answer_model: str = field(default=DEFAULT_CAUSAL_LM, metadata={
        "help": "Answer model and memory agent: alias, HF id, local path, or openai:MODEL@URL (vLLM)."})
    tokenizer: str | None = field(default=None, metadata={
        "help": "Tokenizer for window fitting with an HTTP backend (default: estimate 4 chars per token)."})
    router: str | None = field(default=None, metadata={"help": "Trained router export (None: base router only)."})
    router_base: str | None = field(default=None, metadata={
        "help": "Untrained router model; default: the trained router's base_model, else answer_model; 'none' skips."})
    encoder: str = field(default=DEFAULT_ENCODER, metadata={
        "help": "Prefix encoder: alias, path, a `memroute train retriever` export; 'none' = BM25 only."})
    rag_encoder: str = field(default=DEFAULT_ENCODER, metadata={"help": "Dense RAG baseline encoder ('none' = BM25)."})
    dense_weight: float = field(default=0.5, metadata={"help": "Dense share of the hybrid prefix."})
    top_k: int = field(default=10, metadata={"help": "Prefix hits."})
    rag_k: int = field(default=5, metadata={"help": "RAG baseline: top-k steps, in rank order."})
    block_size: int = 8
    block_overlap: int = 2
    neighbours: int = field(default=1, metadata={"help": "Temporal neighbour blocks on each side of an anchor."})
    max_blocks: int = field(default=8, metadata={"help": "Bound on the blocks analysed per question."})
    model_window: int = field(default=2048, metadata={"help": "Answer-model window in tokens (prompt + new)."})
    answer_max_new_tokens: int = 16
    note_max_new_tokens: int = 64
    aggregate: str = field(default="concat", metadata={"help": "concat or llm"})
    aggregate_max_new_tokens: int = 128
    judge: str = field(default="none", metadata={
        "help": "AMA-Bench binary judge: none, 'answer' (the answer backend), or a backend spec."})
    score_metric: str = field(default="f1", metadata={"help": "f1 or judge: the 'score' column."})
    taus: list[float] = field(default_factory=lambda: list(TAUS))
    max_score_drop: float = field(default=2.0, metadata={"help": "Dev tau choice: score within this of slow-only."})
    batch_size: int = field(default=8, metadata={"help": "Local generation batch size (memory agents)."})
    http_concurrency: int = field(default=8, metadata={"help": "Concurrent requests to an HTTP backend."})
    http_timeout: float = 60.0
    max_retries: int = 2
    retry_backoff: float = 1.0
    device: str | None = None
    output_dir: str = "results/progressive_locomo"

    def __post_init__(self):
        from train.config import ConfigError

        if self.score_metric not in ("f1", "judge"):
            raise ConfigError(f"score_metric must be 'f1' or 'judge', got {self.score_metric!r}")
        if self.score_metric == "judge" and _is_none(self.judge):
            raise ConfigError("score_metric 'judge' needs --judge (e.g. 'answer' or openai:MODEL@URL)")
        if self.aggregate not in ("concat", "llm"):
            raise ConfigError(f"aggregate must be 'concat' or 'llm', got {self.aggregate!r}")
        if [e.lower() for e in self.test_episodes] == ["none"]:  # `--test_episodes none` on the command line
            self.test_episodes = []
        overlap = set(self.dev_episodes) & set(self.test_episodes)
        if overlap:
            raise ConfigError(f"dev_episodes and test_episodes overlap: {sorted(overlap)}")
        if not self.dev_episodes:
            raise ConfigError("give at least one dev episode (test_episodes may be empty for a dev-only run)")
        for name in ("dev_episodes", "test_episodes"):
            ids = getattr(self, name)
            dup = sorted({e for e in ids if ids.count(e) > 1})
            if dup:
                raise ConfigError(f"{name}: {dup} listed more than once")
        # Numeric options, checked when the recipe is read (not after the models load): plain ValueErrors,
        # which parse_config reports as a ConfigError naming the recipe or the command line.
        positive = ("top_k", "rag_k", "block_size", "max_blocks", "model_window", "answer_max_new_tokens",
                    "note_max_new_tokens", "aggregate_max_new_tokens", "batch_size", "http_concurrency")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("neighbours", "max_retries"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.block_overlap < self.block_size:
            raise ValueError(f"block_overlap must be in [0, block_size) = [0, {self.block_size}), "
                             f"got {self.block_overlap}")
        if self.max_questions_per_episode is not None and self.max_questions_per_episode < 1:
            raise ValueError(f"max_questions_per_episode must be >= 1 (got {self.max_questions_per_episode}); "
                             "omit it to evaluate every question")
        if not 0.0 <= self.dense_weight <= 1.0:
            raise ValueError(f"dense_weight must lie in [0, 1], got {self.dense_weight}")
        if not self.taus or any(not 0.0 <= t <= 1.0 for t in self.taus):
            raise ValueError(f"taus must be a non-empty list of thresholds in [0, 1], got {self.taus}")
        for name in ("http_timeout", "retry_backoff", "max_score_drop"):
            v = getattr(self, name)
            if not v >= 0.0 or (name == "http_timeout" and v == 0.0):  # `not >=` also refuses NaN
                raise ValueError(f"{name} must be {'> 0' if name == 'http_timeout' else '>= 0'}, got {v}")


HASHED = ("corpus", "corpus_path", "answer_model", "tokenizer", "encoder", "rag_encoder",
          "dense_weight", "top_k", "rag_k", "block_size", "block_overlap", "neighbours", "max_blocks", "model_window",
          "answer_max_new_tokens", "note_max_new_tokens", "aggregate", "aggregate_max_new_tokens", "judge")


def _is_none(spec) -> bool:
    return spec is None or str(spec).lower() in ("", "none", "null")


def check_router_dir(router: str) -> Path:
    """The trained router's export directory; a missing path or a plain file is one clear error."""
    from train.config import ConfigError

    path = Path(router)
    if not path.exists():
        raise FileNotFoundError(f"--router {router}: no such directory (give a `memroute export sufficiency` "
                                "directory, or leave --router out for the base router only)")
    if not path.is_dir():
        raise ConfigError(f"--router {router}: not a directory (give a router export directory)")
    return path


def _fingerprint(path) -> list | None:
    """(name, size, mtime) of the files directly inside a local model folder; None for ids and aliases."""
    if _is_none(path) or not Path(str(path)).is_dir():
        return None
    return sorted((p.name, p.stat().st_size, int(p.stat().st_mtime)) for p in Path(str(path)).iterdir() if p.is_file())


def config_hash(cfg: ProgressiveEvalConfig) -> str:
    """Hash of everything that changes a question's paths (not the routers, taus, splits or output paths):
    the prefix, fast / slow / RAG / long-context answers and their times. Router scores are keyed apart
    (:func:`router_ids`), so evaluating another router reuses every cached path and only scores C_f."""
    from routers.progressive import PROMPT_VERSION

    payload = {k: getattr(cfg, k) for k in HASHED}
    payload.update(prompt_version=PROMPT_VERSION, record_version=RECORD_VERSION)
    # A model retrained into the same folder must not reuse the old records: fingerprint local folders.
    payload["files"] = {k: _fingerprint(getattr(cfg, k)) for k in ("encoder", "answer_model")}
    return _sha(payload)


def _sha(payload) -> str:
    return hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


def base_router_spec(cfg: ProgressiveEvalConfig) -> str | None:
    """The untrained router's model: router_base, else the trained router's base_model, else the answer model."""
    from routers.base import ROUTER_CONFIG, RouterConfigError, read_router_config

    base = cfg.router_base
    if base is None and cfg.router:
        base = read_router_config(check_router_dir(cfg.router), "sufficiency").get("base_model")
        if base is not None and not isinstance(base, str):
            raise RouterConfigError(f"{Path(cfg.router) / ROUTER_CONFIG}: base_model must be a string, got "
                                    f"{base!r:.60} (pass --router_base)")
    if base is None:
        base = cfg.answer_model
    return None if _is_none(base) else base


def router_ids(cfg: ProgressiveEvalConfig, names=None) -> dict[str, str]:
    """name -> identity of each router this run scores (model spec + a fingerprint of a local folder).

    ``names`` are the routers actually present (tests inject their own); by default the config's."""
    specs = {BASE: base_router_spec(cfg), TRAINED: None if _is_none(cfg.router) else cfg.router}
    if names is None:
        names = [n for n, spec in specs.items() if spec is not None]
    return {n: _sha([n, specs.get(n), _fingerprint(specs.get(n))]) for n in names}


# -- per-question execution ------------------------------------------------------------------------------
def _scored(path: dict, gold: str) -> dict:
    path["f1"] = token_f1(path["answer"], gold)
    return path


def question_record(executor, routers: dict, rag_retriever, episode, qa, cfg: ProgressiveEvalConfig,
                    judge_generate=None) -> dict:
    """Run both paths and the baselines for one question; every stage timed. Raises on backend failure."""
    from routers.progressive import answer_messages

    question, gold = qa.question, qa.answer
    pre = executor.prefix(question, episode)
    scores = {}
    for name, router in routers.items():
        s, t = executor.route(question, pre.context, router)
        scores[name] = {"score": s, "seconds": t}
    fast = executor.fast(question, pre)
    slow = executor.slow(question, episode, pre)

    t0 = time.perf_counter()
    rag_hits = rag_retriever.retrieve(question, episode, cfg.rag_k)
    rag_s = time.perf_counter() - t0
    rag = executor.answer(question, lambda kept: "\n".join(s.render() for s in kept), [h.step for h in rag_hits])

    t0 = time.perf_counter()
    newest_first = list(reversed(episode.steps))
    _, kept = executor.fit(lambda ks: answer_messages(question, _temporal(ks)), newest_first,
                           executor.config.answer_max_new_tokens)
    long_steps = newest_first[:kept]
    long_s = time.perf_counter() - t0
    long = executor.answer(question, _temporal, long_steps)

    rec = {
        "prefix": {"hits": pre.hit_ids, "seconds": pre.seconds},
        "routers": scores,
        "fast": _scored({"answer": fast.answer, "seconds": fast.seconds, "units_dropped": fast.units_dropped}, gold),
        "slow": _scored({"anchor_blocks": slow.anchor_blocks, "blocks": slow.blocks, "notes": slow.notes,
                         "n_pieces": slow.n_pieces, "window_splits": slow.window_splits,
                         "truncated_steps": slow.truncated_steps, "blocks_s": slow.blocks_s,
                         "aggregate_s": slow.aggregate_s, "answer": slow.answer.answer,
                         "seconds": slow.answer.seconds, "units_dropped": slow.answer.units_dropped}, gold),
        "rag": _scored({"hits": [h.step.step_id for h in rag_hits], "retrieve_s": rag_s, "answer": rag.answer,
                        "seconds": rag.seconds, "units_dropped": rag.units_dropped}, gold),
        "long_context": _scored({"build_s": long_s, "steps_kept": len(long_steps),
                                 "steps_dropped": len(episode.steps) - len(long_steps),
                                 "answer": long.answer, "seconds": long.seconds}, gold),
    }
    if judge_generate is not None:
        from eval.judge import judge_answers

        verdicts, replies = judge_answers(judge_generate, [(question, gold, rec[p]["answer"]) for p in PATHS])
        for p, v, r in zip(PATHS, verdicts, replies):
            rec[p]["judge"], rec[p]["judge_reply"] = v, r
    return rec


def _temporal(steps) -> str:
    return "\n".join(s.render() for s in sorted(steps, key=lambda s: s.index))


# -- deriving rows ---------------------------------------------------------------------------------------
def _path_score(path: dict, metric: str) -> float:
    return 100.0 * (path["f1"] if metric == "f1" else float(path.get("judge") or 0))


def _mean(xs) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def _row(split, system, router, tau, per_q: list[tuple[dict, float, float, bool | None]], n_failed: int,
         t_build: float | None, judged: bool) -> dict:
    """per_q: (chosen path record, t_mem, t_e2e, early-terminated or None)."""
    ets = [e for *_, e in per_q if e is not None]
    return {"split": split, "system": system, "router": router, "tau": tau, "n": len(per_q), "n_failed": n_failed,
            "score": None, "f1": _mean(100.0 * p["f1"] for p, *_ in per_q),
            "judge": _mean(100.0 * float(p.get("judge") or 0) for p, *_ in per_q) if judged else None,
            "early_termination": _mean(100.0 * e for e in ets) if ets else None,
            "t_mem": _mean(t for _, t, _, _ in per_q), "t_e2e": _mean(t for _, _, t, _ in per_q), "t_build": t_build}


def derive_rows(records: Sequence[dict], builds: Sequence[dict], taus: Sequence[float], split: str,
                score_metric: str = "f1", n_failed: int = 0) -> list[dict]:
    """Every row of one split, exactly, from cached per-question records (no model runs)."""
    if not records:
        return []
    judged = all("judge" in r["fast"] for r in records)
    t_build = _mean(b["prefix_build_s"] for b in builds)
    t_build_rag = _mean(b["rag_build_s"] for b in builds)
    rows = []

    def slow_mem(r):
        return r["prefix"]["seconds"] + r["slow"]["blocks_s"] + r["slow"]["aggregate_s"]

    rows.append(_row(split, "fast_only", None, None,
                     [(r["fast"], r["prefix"]["seconds"], r["prefix"]["seconds"] + r["fast"]["seconds"], True)
                      for r in records], n_failed, t_build, judged))
    rows.append(_row(split, "slow_only", None, None,
                     [(r["slow"], slow_mem(r), slow_mem(r) + r["slow"]["seconds"], False) for r in records],
                     n_failed, t_build, judged))
    for name in sorted(set().union(*(r["routers"] for r in records))):
        for tau in taus:
            per_q = []
            for r in records:
                s, t_router = r["routers"][name]["score"], r["routers"][name]["seconds"]
                early = s is not None and s >= tau
                if early:
                    t_mem = r["prefix"]["seconds"] + t_router
                    per_q.append((r["fast"], t_mem, t_mem + r["fast"]["seconds"], True))
                else:
                    t_mem = slow_mem(r) + t_router
                    per_q.append((r["slow"], t_mem, t_mem + r["slow"]["seconds"], False))
            rows.append(_row(split, "router", name, tau, per_q, n_failed, t_build, judged))
    rows.append(_row(split, "rag", None, None,
                     [(r["rag"], r["rag"]["retrieve_s"], r["rag"]["retrieve_s"] + r["rag"]["seconds"], None)
                      for r in records], n_failed, t_build_rag, judged))
    rows.append(_row(split, "long_context", None, None,
                     [(r["long_context"], r["long_context"]["build_s"],
                       r["long_context"]["build_s"] + r["long_context"]["seconds"], None) for r in records],
                     n_failed, 0.0, judged))
    for row in rows:
        row["score"] = row["f1"] if score_metric == "f1" else row["judge"]
    return rows


def choose_tau(dev_rows: Sequence[dict], router: str, max_score_drop: float = 2.0) -> dict | None:
    """Smallest mean T_mem among the router's tau rows whose score is within ``max_score_drop`` of slow-only
    (ties: higher score, then smaller tau); when none qualifies, the best-scoring tau."""
    slow = next((r for r in dev_rows if r["system"] == "slow_only"), None)
    cands = [r for r in dev_rows if r["system"] == "router" and r["router"] == router]
    if slow is None or not cands:
        return None
    ok = [r for r in cands if r["score"] >= slow["score"] - max_score_drop - 1e-9]
    if ok:
        best = min(ok, key=lambda r: (r["t_mem"], -r["score"], r["tau"]))
    else:
        best = max(cands, key=lambda r: (r["score"], -r["t_mem"], -r["tau"]))
    return {"router": router, "tau": best["tau"], "within_drop": bool(ok), "dev_score": best["score"],
            "dev_slow_score": slow["score"], "dev_t_mem": best["t_mem"], "dev_slow_t_mem": slow["t_mem"]}


def test_report(test_rows: Sequence[dict], choice: dict | None, max_score_drop: float = 2.0) -> dict | None:
    """The chosen tau on the test split against test slow-only (the seed-001 style target)."""
    if choice is None:
        return None
    slow = next((r for r in test_rows if r["system"] == "slow_only"), None)
    row = next((r for r in test_rows if r["system"] == "router" and r["router"] == choice["router"]
                and r["tau"] == choice["tau"]), None)
    if slow is None or row is None:
        return None
    reduction = 1.0 - row["t_mem"] / slow["t_mem"] if slow["t_mem"] else None
    delta = row["score"] - slow["score"]
    return {"router": choice["router"], "tau": choice["tau"], "score": row["score"], "slow_score": slow["score"],
            "score_delta": delta, "t_mem": row["t_mem"], "slow_t_mem": slow["t_mem"], "t_mem_reduction": reduction,
            "t_e2e": row["t_e2e"], "slow_t_e2e": slow["t_e2e"], "early_termination": row["early_termination"],
            "targets": {"t_mem_reduction_>=_25%": reduction is not None and reduction >= 0.25,
                        f"score_within_{max_score_drop:g}_of_slow": delta >= -max_score_drop - 1e-9}}


def et_ranges(rows: Sequence[dict]) -> dict:
    """Per router: early-termination % at each tau, its range (max - min), whether it is monotone, and how many
    distinct intermediate operating points tau can pick (distinct ET values with 0 < ET < 100 %). The range
    alone rewards a router that jumps from all-fast to all-slow between two taus; the paper's point (Table 3)
    is that an untrained router's boundary sits at a fixed endpoint so tau stops controlling anything, which
    the count of graded levels measures. ``range_paper_taus`` is the range over tau in [0.3, 0.7], the taus
    of the paper's Tables 3 and 5 ("joint training increases this range to 22.1%-38.5%"), where the
    endpoints' saturation (everything stops at 0.1, nothing at 0.9) does not dominate."""
    out = {}
    for name in sorted({r["router"] for r in rows if r["system"] == "router"}):
        rs = sorted((r for r in rows if r["system"] == "router" and r["router"] == name), key=lambda r: r["tau"])
        ets = [r["early_termination"] for r in rs]
        mid = [r["early_termination"] for r in rs if PAPER_TAUS[0] - 1e-9 <= r["tau"] <= PAPER_TAUS[1] + 1e-9]
        out[name] = {"taus": [r["tau"] for r in rs], "early_termination": ets, "range": max(ets) - min(ets),
                     "range_paper_taus": (max(mid) - min(mid)) if len(mid) > 1 else None,
                     "monotone_non_increasing": all(a >= b for a, b in zip(ets, ets[1:])),
                     "graded_levels": len({round(e, 6) for e in ets if 0.0 < e < 100.0})}
    if BASE in out and TRAINED in out:
        out["trained_wider_than_base"] = out[TRAINED]["range"] > out[BASE]["range"]
        if out[TRAINED]["range_paper_taus"] is not None and out[BASE]["range_paper_taus"] is not None:
            out["trained_wider_than_base_paper_taus"] = out[TRAINED]["range_paper_taus"] > out[BASE]["range_paper_taus"]
        out["trained_more_graded_than_base"] = out[TRAINED]["graded_levels"] > out[BASE]["graded_levels"]
    return out


def prefix_sufficiency(records: Sequence[dict], evidence: dict[str, Sequence[str]], taus: Sequence[float]) -> dict:
    """Does s(q, C_f) track whether the prefix really holds the evidence? Label = every annotated evidence step
    is among the prefix hits (questions without evidence annotations are left out). Per router: AUROC of the
    score against that label and, per tau, the share of early stops whose prefix was evidence-complete.
    This is the router's job on the contexts it actually sees at inference, which differ from the synthetic
    intervention samples it is usually evaluated on (every retrieved step is similar to the question)."""
    from sklearn.metrics import roc_auc_score

    labelled = [(r, int(set(evidence[r["qa_id"]]) <= set(r["prefix"]["hits"]))) for r in records
                if evidence.get(r["qa_id"])]
    out: dict = {"n_labelled": len(labelled),
                 "evidence_complete_rate": (100.0 * sum(y for _, y in labelled) / len(labelled)) if labelled else None,
                 "routers": {}}
    names = sorted({n for r, _ in labelled for n in r.get("routers", {})})
    for name in names:
        pairs = [(r["routers"][name]["score"], y) for r, y in labelled
                 if r["routers"].get(name, {}).get("score") is not None]
        ys = [y for _, y in pairs]
        auroc = float(roc_auc_score(ys, [s for s, _ in pairs])) if 0 < sum(ys) < len(ys) else None
        precision = {}
        for tau in taus:
            stops = [y for s, y in pairs if s >= tau]
            precision[str(tau)] = (100.0 * sum(stops) / len(stops)) if stops else None
        out["routers"][name] = {"n_scored": len(pairs), "auroc": auroc, "stop_precision": precision}
    return out


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated (lower-or-equal time and higher-or-equal score, one strictly)."""
    front = []
    for i, (t, s) in enumerate(points):
        dominated = any((t2 <= t and s2 >= s) and (t2 < t or s2 > s) for j, (t2, s2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _label(row: dict) -> str:
    return f"{row['router']} tau={row['tau']:g}" if row["system"] == "router" else row["system"]


def pareto_plot(rows_by_split: dict[str, list[dict]], path, title: str = "Router-Mem quality vs latency"):
    """Score against T_mem and T_e2e per split; router tau sweeps as lines, the Pareto front dashed."""
    from matplotlib.figure import Figure

    from eval.plots import _save_atomic

    splits = [s for s, rows in rows_by_split.items() if rows]
    fig = Figure(figsize=(11, 4.4 * max(len(splits), 1)), layout="constrained")
    axes = fig.subplots(max(len(splits), 1), 2, squeeze=False)
    markers = {"fast_only": "s", "slow_only": "D", "rag": "^", "long_context": "v"}
    for si, split in enumerate(splits):
        rows = [r for r in rows_by_split[split] if r["score"] is not None]
        for ai, key in enumerate(("t_mem", "t_e2e")):
            ax = axes[si][ai]
            for name in sorted({r["router"] for r in rows if r["system"] == "router"}):
                rs = sorted((r for r in rows if r["system"] == "router" and r["router"] == name),
                            key=lambda r: r["tau"])
                ax.plot([r[key] for r in rs], [r["score"] for r in rs], marker="o", label=f"router ({name})")
                for r in rs:
                    ax.annotate(f"{r['tau']:g}", (r[key], r["score"]), fontsize=7, xytext=(3, 3),
                                textcoords="offset points")
            for r in rows:
                if r["system"] in markers:
                    ax.scatter([r[key]], [r["score"]], marker=markers[r["system"]], s=50, label=r["system"], zorder=3)
            pts = [(r[key], r["score"]) for r in rows]
            front = pareto_front(pts)
            ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], linestyle="--", color="grey",
                    linewidth=1, label="Pareto front")
            ax.set_xscale("symlog", linthresh=0.01)
            ax.set_xlabel(f"mean {'T_mem' if key == 't_mem' else 'T_e2e'} per question (s)")
            ax.set_ylabel("score")
            ax.set_title(f"{split}: score vs {'T_mem' if key == 't_mem' else 'T_e2e'}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize="x-small")
    fig.suptitle(title)
    return _save_atomic(fig, path)


CSV_COLUMNS = ("split", "system", "router", "tau", "n", "n_failed", "score", "f1", "judge", "early_termination",
               "t_mem", "t_e2e", "t_build")


def rows_csv(rows: Sequence[dict]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in rows:
        writer.writerow(["" if r[c] is None else (f"{r[c]:.6f}" if isinstance(r[c], float) and c != "tau" else r[c])
                         for c in CSV_COLUMNS])
    return buf.getvalue()


def format_table(rows: Sequence[dict]) -> str:
    head = f"{'split':<5} {'system':<22} {'score':>6} {'ET%':>6} {'T_mem':>8} {'T_e2e':>8} {'T_build':>8} {'n':>4}"
    lines = [head, "-" * len(head)]

    def f(x, w, p=2):
        return f"{x:>{w}.{p}f}" if x is not None else f"{'-':>{w}}"

    for r in rows:
        lines.append(f"{r['split']:<5} {_label(r):<22} {f(r['score'], 6)} {f(r['early_termination'], 6, 1)} "
                     f"{f(r['t_mem'], 8, 3)} {f(r['t_e2e'], 8, 3)} {f(r['t_build'], 8, 3)} {r['n']:>4}")
    return "\n".join(lines)


def split_stats(records: Sequence[dict], failures: Sequence[dict]) -> dict:
    """Counts of everything that was split, shortened, dropped, over budget or failed."""
    n = len(records)
    return {
        "n_questions": n + len(failures), "n_ok": n, "n_failed": len(failures),
        "empty_memory": sum(bool(r.get("empty_memory")) for r in records),
        "blocks_split_for_window": sum(r["slow"]["window_splits"] for r in records),
        "steps_shortened_for_window": sum(r["slow"]["truncated_steps"] for r in records),
        "mean_blocks_selected": _mean(len(r["slow"]["blocks"]) for r in records),
        "mean_anchor_blocks": _mean(len(r["slow"]["anchor_blocks"]) for r in records),
        "mean_memory_agent_calls": _mean(r["slow"]["n_pieces"] for r in records),
        "answer_context_units_dropped": {p: sum(r[p].get("units_dropped", 0) for r in records)
                                         for p in ("fast", "slow", "rag")},
        "long_context_steps_dropped_mean": _mean(r["long_context"]["steps_dropped"] for r in records),
        "router_over_budget": {name: sum(r["routers"][name]["score"] is None for r in records)
                               for name in sorted(set().union(*(r["routers"] for r in records)))} if records else {},
        "judge_unparsed": sum(1 for r in records for p in PATHS if "judge" in r[p] and r[p]["judge"] is None),
    }


# -- orchestration -----------------------------------------------------------------------------------------
def select_questions(cfg: ProgressiveEvalConfig, episodes) -> dict[str, list[tuple]]:
    from data_synthesis.corpora import sample_qa

    by_id = {e.episode_id: e for e in episodes}
    missing = [e for e in cfg.dev_episodes + cfg.test_episodes if e not in by_id]
    if missing:
        raise ValueError(f"episodes {missing} not in corpus {cfg.corpus!r} (it has {sorted(by_id)[:12]}"
                         f"{' ...' if len(by_id) > 12 else ''})")
    out = {}
    for split, ids in (("dev", cfg.dev_episodes), ("test", cfg.test_episodes)):
        cap = cfg.max_questions_per_episode
        out[split] = [(by_id[e], qa) for e in ids for qa in sample_qa(by_id[e], cap, cfg.seed)]
    if not out["dev"]:
        raise ValueError(f"dev_episodes {cfg.dev_episodes} of corpus {cfg.corpus!r} hold no questions: nothing "
                         "to choose tau on")
    if cfg.test_episodes and not out["test"]:
        raise ValueError(f"test_episodes {cfg.test_episodes} of corpus {cfg.corpus!r} hold no questions "
                         "(use --test_episodes none for a dev-only run)")
    return out


class _Models:
    """Backends, routers and retrievers, built only when some question is not cached yet."""

    def __init__(self, cfg: ProgressiveEvalConfig, backend=None, routers=None, retriever=None, rag_retriever=None,
                 judge=None, counter=None):
        self.cfg = cfg
        self._given = dict(backend=backend, routers=routers, retriever=retriever, rag_retriever=rag_retriever,
                           judge=judge, counter=counter)
        self.executor = None
        self.routers = None
        self.rag_shares_index = False

    def load_routers(self) -> dict:
        """Only the routers (to score cached questions for a new router), or those of :meth:`load`."""
        if self.routers is None:
            given = self._given["routers"]
            self.routers = given if given is not None else _load_routers(self.cfg, None)
        return self.routers

    def build_rag(self, episode):
        """The RAG index; with the prefix's encoder it is the prefix index itself (same BM25 and embeddings,
        only the mixing weight differs), so nothing is encoded twice."""
        if self.rag_shares_index:
            built = self.executor.retriever._index.get(episode.episode_id)
            if built is not None:
                self.rag._index.setdefault(episode.episode_id, built)
        self.rag.step_embeddings(episode)

    def load(self):
        if self.executor is not None:
            return self
        from routers.memory.retrieval import HybridRetriever
        from routers.progressive import ProgressiveConfig, ProgressiveExecutor, counter_for

        cfg, g = self.cfg, self._given
        backend = g["backend"] if g["backend"] is not None else _make_backend(cfg.answer_model, cfg)
        retriever = g["retriever"] or HybridRetriever(encoder=cfg.encoder, dense_weight=cfg.dense_weight)
        if g["rag_retriever"] is not None:
            rag = g["rag_retriever"]
        elif _is_none(cfg.rag_encoder):
            rag = HybridRetriever(encoder="none", dense_weight=0.0)
        elif cfg.rag_encoder == cfg.encoder and retriever.encoder is not None:
            rag = HybridRetriever(encoder=retriever.encoder, dense_weight=1.0)
            self.rag_shares_index = True
        else:
            rag = HybridRetriever(encoder=cfg.rag_encoder, dense_weight=1.0)
        if self.routers is None:
            self.routers = g["routers"] if g["routers"] is not None else _load_routers(cfg, backend)
        counter = g["counter"] or counter_for(backend, cfg.tokenizer)
        pcfg = ProgressiveConfig(top_k=cfg.top_k, block_size=cfg.block_size, block_overlap=cfg.block_overlap,
                                 neighbours=cfg.neighbours, max_blocks=cfg.max_blocks, model_window=cfg.model_window,
                                 answer_max_new_tokens=cfg.answer_max_new_tokens,
                                 note_max_new_tokens=cfg.note_max_new_tokens, aggregate=cfg.aggregate,
                                 aggregate_max_new_tokens=cfg.aggregate_max_new_tokens, max_retries=cfg.max_retries,
                                 retry_backoff=cfg.retry_backoff)
        self.executor = ProgressiveExecutor(retriever, backend, None, pcfg, counter)
        self.rag = rag
        judge = g["judge"]
        if judge is None and not _is_none(cfg.judge):
            judge = backend if cfg.judge == "answer" else _make_backend(cfg.judge, cfg)
        self.judge_generate = None
        if judge is not None:
            from routers.progressive import generate_with_retries

            self.judge_generate = lambda convs, n: generate_with_retries(judge, convs, n, cfg.max_retries,
                                                                         cfg.retry_backoff)
        return self


def _route_key(split: str, qa_id: str, h: str, rid: str) -> str:
    return f"route|{split}|{qa_id}|{h}|{rid}"


def _cached_score(cache: dict, rec: dict, name: str, rid: str, h: str) -> dict | None:
    """This router's score for a cached question: in the question record when it was computed with it,
    else in a ``route`` record added later; None when neither exists."""
    entry = rec["routers"].get(name)
    if entry is not None and entry.get("router_id") == rid:
        return entry
    return cache.get(_route_key(rec["split"], rec["qa_id"], h, rid))


def _with_routers(cache: dict, rec: dict, rids: dict, h: str) -> dict:
    """The question record with exactly this run's routers (a cached record may hold others)."""
    scores = {name: _cached_score(cache, rec, name, rid, h) for name, rid in rids.items()}
    return {**rec, "routers": {n: {"score": e["score"], "seconds": e["seconds"], "router_id": rids[n]}
                               for n, e in scores.items() if e is not None}}


def _score_new_routers(selection, cache: dict, writer, models: "_Models", rids: dict, h: str) -> int:
    """Score C_f with every router that a cached question has no score for; the paths are reused as they are
    (C_f is rebuilt exactly from the cached hit ids). Returns how many scores were added."""
    from routers.memory.retrieval import render_context
    from routers.progressive import route_score

    todo = []
    for split, pairs in selection.items():
        for ep, qa in pairs:
            rec = cache.get(f"{split}|{qa.qa_id}|{h}")
            if rec is not None:
                todo += [(ep, rec, n, rid) for n, rid in rids.items() if _cached_score(cache, rec, n, rid, h) is None]
    if not todo:
        return 0
    routers = models.load_routers()
    print(f"[eval progressive] scoring {len(todo)} cached question(s) with new router(s); paths reused", file=sys.stderr)
    steps = {}  # episode id -> {step id: step}, built once per episode
    for ep, rec, name, rid in todo:
        by_id = steps.setdefault(ep.episode_id, {st.step_id: st for st in ep.steps})
        s, t = route_score(routers[name], rec["question"], render_context([by_id[i] for i in rec["prefix"]["hits"]]))
        route = {"key": _route_key(rec["split"], rec["qa_id"], h, rid), "kind": "route", "split": rec["split"],
                 "qa_id": rec["qa_id"], "router": name, "router_id": rid, "score": s, "seconds": t}
        writer.write(route)
        cache[route["key"]] = route
    return len(todo)


def _make_backend(spec: str, cfg: ProgressiveEvalConfig):
    from routers.models import make_backend

    if spec.startswith("openai:"):
        return make_backend(spec, timeout=cfg.http_timeout, max_retries=cfg.max_retries, backoff=cfg.retry_backoff,
                            concurrency=cfg.http_concurrency)
    return make_backend(spec, batch_size=cfg.batch_size, device=cfg.device, max_input_tokens=cfg.model_window)


def _load_routers(cfg: ProgressiveEvalConfig, backend) -> dict:
    """Base (untrained) and trained sufficiency routers; the base shares the answer model when it is the same."""
    from routers.models import TransformersBackend, resolve_causal_lm
    from routers.sufficiency import SufficiencyRouter

    base = base_router_spec(cfg)
    routers = {}
    if base is not None:
        if isinstance(backend, TransformersBackend) and resolve_causal_lm(backend.model_name) == resolve_causal_lm(
                base):
            model, tok = backend._load()
            routers[BASE] = SufficiencyRouter.from_model(model, tok, base_model=base)
        elif str(base).startswith("openai:"):
            raise ValueError("the router needs local weights (next-token probabilities): set --router_base to a "
                             "model name or path, or 'none'")
        else:
            routers[BASE] = SufficiencyRouter.from_base(base, device=cfg.device)
    if cfg.router:
        routers[TRAINED] = SufficiencyRouter.from_pretrained(cfg.router, device=cfg.device)
    return routers


def run(cfg: ProgressiveEvalConfig, backend=None, routers=None, retriever=None, rag_retriever=None, judge=None,
        counter=None) -> dict:
    """Evaluate (resuming from the cache) and write every output; returns metrics.json's content.

    Models are injected in tests; by default they are built from the config, and only when a question is
    missing from the cache.
    """
    from data_synthesis.corpora import load_corpus
    from data_synthesis.jsonl import OutputLock
    from train.config import save_resolved_config

    episodes = load_corpus(cfg.corpus, cfg.corpus_path)
    selection = select_questions(cfg, episodes)
    rids = router_ids(cfg, list(routers) if routers is not None else None)  # checks the router export
    with OutputLock(cfg.output_dir):  # one run at a time appends to records.jsonl
        save_resolved_config(cfg.output_dir, cfg)
        return _run(cfg, selection, rids, backend, routers, retriever, rag_retriever, judge, counter)


def _run(cfg: ProgressiveEvalConfig, selection, rids, backend, routers, retriever, rag_retriever, judge,
         counter) -> dict:
    from routers.base import git_revision, library_versions
    from tqdm.auto import tqdm

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    h = config_hash(cfg)
    cache_path = out / "records.jsonl"
    models = _Models(cfg, backend, routers, retriever, rag_retriever, judge, counter)
    failures: dict[str, list[dict]] = {"dev": [], "test": []}
    computed = 0
    with ResumableJsonlWriter(cache_path, key="key") as writer:
        cache = {r["key"]: r for r in read_jsonl(cache_path, required=("key",))}
        todo = [(split, ep, qa) for split, pairs in selection.items() for ep, qa in pairs
                if f"{split}|{qa.qa_id}|{h}" not in writer]
        if todo:
            models.load()
            print(f"[eval progressive] {len(todo)} question(s) to run, "
                  f"{sum(len(p) for p in selection.values()) - len(todo)} cached", file=sys.stderr)
        for split, ep, qa in tqdm(todo, desc="progressive eval", unit="q", disable=not todo):
            ex = models.executor
            bkey = f"build|{split}|{ep.episode_id}|{h}"
            if bkey not in writer:
                t_prefix = ex.build(ep)
                t0 = time.perf_counter()
                models.build_rag(ep)
                rag_s = t_prefix if models.rag_shares_index else time.perf_counter() - t0
                rec = {"key": bkey, "kind": "build", "split": split, "episode_id": ep.episode_id,
                       "prefix_build_s": t_prefix, "rag_build_s": rag_s, "rag_shares_prefix_index":
                       models.rag_shares_index, "n_steps": len(ep.steps), "n_blocks": len(ex.views(ep).blocks)}
                writer.write(rec)
                cache[bkey] = rec
            ex.build(ep)
            models.build_rag(ep)
            key = f"{split}|{qa.qa_id}|{h}"
            try:
                body = question_record(ex, models.routers, models.rag, ep, qa, cfg, models.judge_generate)
            except Exception as err:  # noqa: BLE001 - a failed question is counted and the run goes on
                failures[split].append({"split": split, "qa_id": qa.qa_id, "episode_id": ep.episode_id,
                                        "error": f"{type(err).__name__}: {err}"})
                print(f"[eval progressive] {qa.qa_id} failed: {type(err).__name__}: {err}", file=sys.stderr)
                continue
            for name, entry in body["routers"].items():
                entry["router_id"] = rids.get(name)
            rec = {"key": key, "kind": "question", "record_version": RECORD_VERSION, "config_hash": h, "split": split,
                   "episode_id": ep.episode_id, "qa_id": qa.qa_id, "category": qa.category, "question": qa.question,
                   "gold": qa.answer, "empty_memory": not ep.steps, **body}
            writer.write(rec)
            cache[key] = rec
            computed += 1
        rescored = _score_new_routers(selection, cache, writer, models, rids, h)

    rows_by_split, stats, prefix_stats = {}, {}, {}
    for split, pairs in selection.items():
        recs = [_with_routers(cache, cache[f"{split}|{qa.qa_id}|{h}"], rids, h) for _, qa in pairs
                if f"{split}|{qa.qa_id}|{h}" in cache]
        ep_ids = list(dict.fromkeys(ep.episode_id for ep, _ in pairs))
        builds = [cache[k] for k in (f"build|{split}|{e}|{h}" for e in ep_ids) if k in cache]
        rows_by_split[split] = derive_rows(recs, builds, cfg.taus, split, cfg.score_metric, len(failures[split]))
        stats[split] = split_stats(recs, failures[split])
        prefix_stats[split] = prefix_sufficiency(recs, {qa.qa_id: qa.evidence for _, qa in pairs}, cfg.taus)
    rows = rows_by_split["dev"] + rows_by_split["test"]
    router_names = sorted({r["router"] for r in rows if r["system"] == "router"})
    primary = TRAINED if TRAINED in router_names else (router_names[0] if router_names else None)
    choice = choose_tau(rows_by_split["dev"], primary, cfg.max_score_drop) if primary else None
    report = test_report(rows_by_split["test"], choice, cfg.max_score_drop)
    all_failures = failures["dev"] + failures["test"]
    ex = models.executor
    metrics = {
        "schema_version": 1, "task": "router-mem progressive execution", "config": asdict(cfg),
        "config_hash": h, "versions": library_versions(), "git_revision": git_revision(),
        "machine": _machine(), "token_counter": None if ex is None else ("approximate" if ex.counter.approximate
                                                                          else "tokenizer"),
        "questions_computed_this_run": computed, "router_scores_added_this_run": rescored,
        "router_ids": rids, "stats": stats,
        "definitions": {
            "score": f"{cfg.score_metric} x 100, mean over answered questions",
            "early_termination": "% of questions the router returns early on (s >= tau; over budget -> continue)",
            "t_mem": "memory time per question: prefix + router (+ block analysis + aggregation on the slow path)",
            "t_e2e": "t_mem + answer generation", "t_build": "index + views construction per episode (mean)"},
        "rows": rows, "tau_choice_dev": choice, "test_at_dev_tau": report,
        "early_termination_range": {s: et_ranges(r) for s, r in rows_by_split.items()},
        "prefix_sufficiency": prefix_stats,
        "failures": all_failures,
        "files": {"rows": "rows.csv", "plot": "pareto.png", "records": "records.jsonl", "failures": "failures.jsonl"},
    }
    atomic_write_text(out / "rows.csv", rows_csv(rows))
    atomic_write_text(out / "failures.jsonl", "".join(json.dumps(f, ensure_ascii=False) + "\n" for f in all_failures))
    if rows:
        pareto_plot(rows_by_split, out / "pareto.png")
    atomic_write_json(out / "metrics.json", metrics)
    return metrics


def _machine() -> dict:
    import platform

    import torch

    return {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def make_parser():
    from train.config import make_arg_parser

    return make_arg_parser([ProgressiveEvalConfig], prog="memroute eval progressive",
                           description="Router-Mem progressive execution: tau sweep, endpoints, baselines, "
                                       "score / early termination / T_mem / T_e2e, Pareto plot.")


def main(argv=None) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from train.config import parse_config

    (cfg,) = parse_config(make_parser(), [ProgressiveEvalConfig], argv)
    metrics = run(cfg)  # writes resolved_config.yaml once it holds the output lock
    print(format_table(metrics["rows"]))
    if metrics["tau_choice_dev"]:
        print({"tau_choice_dev": metrics["tau_choice_dev"], "test_at_dev_tau": metrics["test_at_dev_tau"]})
    n_failed = len(metrics["failures"])
    if n_failed:
        print(f"[eval progressive] {n_failed} question(s) failed; rerun to retry them (see failures.jsonl)",
              file=sys.stderr)
    return metrics


if __name__ == "__main__":
    main()
