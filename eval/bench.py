"""``memroute bench``: benchmarks that back the project's speed claims, written as JSON + Markdown.

    memroute bench                                   # all benchmarks, SmolLM2, default data
    memroute bench --which router_latency --router outputs/quickstart/router
    python -m eval.bench my_bench.yaml --train_steps 10      # YAML recipe, flags override it

Benchmarks (``BENCHMARKS``; pick with ``--which``):

* ``router_latency``: decision latency per query at batch size 1. The one-forward sufficiency router
  (``SufficiencyRouter.score``, one decision token) against a generate-based router on the same
  backbone and the same (question, context): it is prompted to write a short rationale and then answer
  yes or no, decoded greedily with exactly ``generate_new_tokens`` new tokens (``min_new_tokens =
  max_new_tokens``, so the baseline is well defined whatever the model writes; KV cache on).
  Target: speedup (generate / router) >= 10.
* ``index_latency`` (eval/bench_retrieval.py): dense memory index top-10 query latency and indexing
  throughput at ``index_steps`` steps, against a pure-Python loop and the 5 ms budget.
* ``memagent_probe`` (eval/bench_memagent.py): MemAgent's Begin probe over 13 providers x
  ``memagent_memories`` memories, against a per-provider loop and the 10 ms budget.
* ``distill_step``: LoRA training step time (``SufficiencyTrainer.compute_loss`` + backward + AdamW
  step) on the same fixed batches in three modes: ``lambda_rep = 0`` (baseline, no distillation),
  distillation with the teacher forward each step (no cache), and distillation with the teacher states
  already cached. Targets: distill / base <= 1.5, cached / base <= 1.1.
* ``quality_targets`` (eval/bench_targets.py): the quality targets of every issue (sufficiency AUROC,
  retriever Recall@5, progressive T_mem / score at the dev-chosen tau on LoCoMo and TextWorld, MemAgent
  routed success and routing overhead), read from the latest evaluation ``metrics.json`` files; a
  missing file is a figure without a value that names the command producing it.

Every benchmark writes ``<output_dir>/<name>.json`` with machine info, library versions, git revision,
config, the data used, and a list of figures ``{name, unit, value, baseline, ratio, ratio_definition,
target, meets_target}``; ``report.json`` gathers them and ``report.md`` is the table that is printed.
Nothing here asserts on a time: a missed target is reported (``meets_target: false``), not raised.

The registry (``BENCHMARKS``) maps names to ``"module:function"`` and imports each one only when it runs:
a benchmark whose module is missing, or that raises, becomes an error entry in the report (the others
still run, the report is still written); ``--strict`` then makes the command fail.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import json
import math
import operator
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from data_synthesis.jsonl import atomic_write_json, atomic_write_text, read_jsonl
from routers.models import DEFAULT_CAUSAL_LM
from train.config import ConfigError, make_arg_parser, parse_config

SCHEMA_VERSION = 1
REQUIRED_FIELDS = ("id", "question", "context", "label")

# The generate-based baseline router: same question and context, asked to reason first, then answer.
GENERATE_SYSTEM_PROMPT = ("You decide whether retrieved memory is sufficient to answer a question. "
                          "First write a short rationale: which evidence is present and what decisive "
                          "piece is missing. Then end with 'Answer: yes' or 'Answer: no'.")
GENERATE_USER_TEMPLATE = ("Question: {question}\n\nRetrieved memory:\n{context}\n\n"
                          "Is the retrieved memory sufficient to answer the question? Write a short "
                          "rationale, then answer yes or no.")


@dataclass
class BenchConfig:
    model_name_or_path: str = field(default=DEFAULT_CAUSAL_LM, metadata={
        "help": "Backbone (alias, HF id or local path); SmolLM2 resolves offline."})
    router: str | None = field(default=None, metadata={
        "help": "Exported router directory; when given, router_latency uses its weights (both sides)."})
    data: str = field(default="outputs/quickstart/data/eval.jsonl", metadata={
        "help": "Sufficiency JSONL (id, question, context, label[, rationale]). Missing: samples are "
                "built from the bundled LoCoMo (question + evidence steps and their neighbours)."})
    n_samples: int = field(default=16, metadata={"help": "Queries timed / samples batched."})
    output_dir: str = field(default="results/bench", metadata={"help": "Where the JSON and Markdown go."})
    which: list[str] = field(default_factory=lambda: list(BENCHMARKS), metadata={
        "help": "Benchmarks to run (default: all)."})
    train_steps: int = field(default=6, metadata={"help": "Timed training steps per distill_step mode."})
    warmup_steps: int = field(default=2, metadata={"help": "Untimed steps before the timed ones, per mode."})
    batch_size: int = field(default=4, metadata={"help": "Training batch size for distill_step."})
    generate_new_tokens: int = field(default=64, metadata={
        "help": "Exact number of new tokens the generate baseline decodes (min = max)."})
    max_length: int = field(default=768, metadata={
        "help": "Samples whose router prompt is longer (tokens) are skipped, as in training."})
    lambda_rep: float = field(default=0.1, metadata={"help": "Distillation weight in the distill modes."})
    lora_r: int = 16
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    device: str | None = field(default=None, metadata={"help": "cpu / cuda / mps; default: best available."})
    inference_dtype: str = field(default="float32", metadata={
        "help": "Weights dtype for router_latency (both sides): float32 or bfloat16."})
    index_steps: int = field(default=10_000, metadata={"help": "Memory size (steps) for index_latency."})
    memagent_memories: int = field(default=10_000, metadata={"help": "Memories per provider for memagent_probe."})
    memagent_encoder: str = field(default="minilm", metadata={
        "help": "Query encoder for memagent_probe; 'none' = random query vectors."})
    sufficiency_metrics: str | None = field(default="results/sufficiency_eval/metrics.json", metadata={
        "help": "quality_targets: metrics.json of `memroute eval sufficiency`."})
    retrieval_metrics: str | None = field(default="results/retriever_eval/metrics.json", metadata={
        "help": "quality_targets: metrics.json of `memroute eval retrieval`."})
    progressive_locomo_metrics: str | None = field(default="results/progressive_locomo/metrics.json", metadata={
        "help": "quality_targets: metrics.json of `memroute eval progressive` on LoCoMo."})
    progressive_textworld_metrics: str | None = field(default="results/progressive_textworld/metrics.json", metadata={
        "help": "quality_targets: metrics.json of `memroute eval progressive` on TextWorld."})
    memagent_metrics: str | None = field(default="results/memagent_eval/metrics.json", metadata={
        "help": "quality_targets: metrics.json of `memroute eval memagent`."})
    strict: bool = field(default=False, metadata={
        "help": "Fail (after writing the report) when a benchmark errors or is unavailable."})
    seed: int = 0


# -- helpers ---------------------------------------------------------------------------------------------
def machine_info(device: str) -> dict:
    import torch

    info = {"platform": platform.platform(), "machine": platform.machine(), "processor": platform.processor(),
            "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["device_name"] = torch.cuda.get_device_name(torch.device(device))
    return info


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


def _release() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def summarize(times: list[float]) -> dict:
    """n, mean, p50, p90, min, max and the raw per-call seconds."""
    s = sorted(times)
    p90 = s[min(len(s) - 1, math.ceil(0.9 * len(s)) - 1)] if s else None
    return {"n": len(s), "mean_s": statistics.fmean(s) if s else None, "p50_s": statistics.median(s) if s else None,
            "p90_s": p90, "min_s": s[0] if s else None, "max_s": s[-1] if s else None, "all_s": list(times)}


_OPS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le, ">": operator.gt}


def figure(name: str, unit: str, value: float | None, baseline: float | None, ratio_definition: str,
           target: tuple[str, float] | None = None, description: str = "") -> dict:
    """One reported number with its baseline, the ratio and whether the ratio meets the target.

    ``ratio_definition`` is ``"value/baseline"`` (a slowdown; smaller is better) or
    ``"baseline/value"`` (a speedup; larger is better).
    """
    ok_nums = all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in (value, baseline))
    if not ok_nums:
        ratio = None
    elif ratio_definition == "value/baseline":
        ratio = value / baseline
    elif ratio_definition == "baseline/value":
        ratio = baseline / value
    else:
        raise ValueError(f"unknown ratio_definition {ratio_definition!r}")
    out = {"name": name, "unit": unit, "value": value, "baseline": baseline, "ratio": ratio,
           "ratio_definition": ratio_definition, "description": description}
    if target is not None:
        op, bound = target
        out["target"] = {"op": op, "value": bound, "text": f"ratio {op} {bound:g}"}
        out["meets_target"] = bool(ratio is not None and _OPS[op](ratio, bound))
    return out


def _with_target(result: dict) -> dict:
    """Top-level ``target`` (text) and ``meets_target`` (all figures with a target meet it)."""
    targeted = [f for f in result["figures"] if "target" in f]
    result["target"] = "; ".join(f"{f['name']}: {f['target']['text']}" for f in targeted)
    result["meets_target"] = bool(targeted) and all(f["meets_target"] for f in targeted)
    return result


# -- data ------------------------------------------------------------------------------------------------
def locomo_samples(n: int, seed: int = 0, neighbours: int = 2) -> list[dict]:
    """Sufficiency-shaped records from the bundled LoCoMo: question + evidence steps + neighbours.

    Even-numbered samples keep the evidence (label 1); odd-numbered ones keep only the neighbours
    (label 0), so the batches hold both classes. A template rationale names present/missing evidence.
    """
    from data_synthesis.corpora import load_locomo
    from routers.memory.retrieval import render_context

    episodes = load_locomo()
    pairs = [(ep, qa) for ep in episodes for qa in ep.qa]
    random.Random(seed).shuffle(pairs)
    out = []
    for i, (ep, qa) in enumerate(pairs[: max(4 * n, n + 8)]):
        ev = [ep.step(e) for e in qa.evidence]
        ev_idx = {s.index for s in ev}
        near = sorted({j for s in ev for j in range(s.index - neighbours, s.index + neighbours + 1)
                       if 0 <= j < len(ep.steps)} - ev_idx)
        positive = len(out) % 2 == 0
        steps = ev + [ep.steps[j] for j in near] if positive else [ep.steps[j] for j in near]
        if not steps:
            continue
        ids = ", ".join(qa.evidence)
        rationale = (f"The decisive evidence ({ids}) is present: {qa.answer}." if positive
                     else f"Only neighbouring turns are present; the decisive evidence ({ids}) is missing.")
        out.append({"id": f"{qa.qa_id}/{'pos' if positive else 'neg'}", "question": qa.question,
                    "context": render_context(steps), "label": int(positive), "rationale": rationale,
                    "source": "locomo-bench"})
    return out


def load_samples(cfg: BenchConfig, tokenizer) -> tuple[list[dict], dict]:
    """Up to ``n_samples`` records whose router prompt fits ``max_length``; plus a description."""
    from routers.sufficiency import build_prompt

    if cfg.data and Path(cfg.data).exists():
        candidates, source = read_jsonl(cfg.data, required=REQUIRED_FIELDS), str(cfg.data)
    else:
        candidates, source = locomo_samples(cfg.n_samples, cfg.seed), "bundled LoCoMo (fallback: data file missing)"
    records, lengths, skipped = [], [], 0
    for rec in candidates:
        n_tok = len(tokenizer.encode(build_prompt(tokenizer, rec["question"], rec["context"]), add_special_tokens=False))
        if n_tok > cfg.max_length:
            skipped += 1
            continue
        records.append(rec)
        lengths.append(n_tok)
        if len(records) >= cfg.n_samples:
            break
    if not records:
        raise ValueError(f"{source}: no sample fits max_length={cfg.max_length} tokens")
    info = {"source": source, "requested": cfg.data, "n_samples": len(records), "skipped_too_long": skipped,
            "n_positive": sum(int(r["label"]) for r in records),
            "router_prompt_tokens": {"mean": statistics.fmean(lengths), "min": min(lengths), "max": max(lengths)}}
    return records, info


# -- benchmark 1: router latency ------------------------------------------------------------------------
def _parse_verdict(text: str) -> str | None:
    from routers.sufficiency import CONTINUE, TERMINATE

    words = re.findall(r"\b(yes|no)\b", text.lower())
    return None if not words else (TERMINATE if words[-1] == "yes" else CONTINUE)


def bench_router_latency(cfg: BenchConfig, records: list[dict], device: str) -> dict:
    import torch
    from tqdm.auto import tqdm

    from routers.sufficiency import SufficiencyRouter, build_prompt

    if cfg.router:
        router = SufficiencyRouter.from_pretrained(cfg.router, device=device)
        weights = str(cfg.router)
    else:
        router = SufficiencyRouter.from_base(cfg.model_name_or_path, device=device)
        weights = cfg.model_name_or_path
    router.model.to(getattr(torch, cfg.inference_dtype))  # same weights and dtype for both sides
    model, tok = router.model.eval(), router.tokenizer
    budget_lifted = False
    longest = max(len(e) for e in router.encode([r["question"] for r in records], [r["context"] for r in records]))
    if longest > router.config.max_input_tokens:  # an over-budget prompt is skipped, which would time nothing
        router.config.max_input_tokens, budget_lifted = longest, True
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    n_new = cfg.generate_new_tokens

    def route(rec):
        return router.score(rec["question"], rec["context"], batch_size=1)

    @torch.inference_mode()
    def generate(rec):
        prompt = build_prompt(tok, rec["question"], rec["context"], system_prompt=GENERATE_SYSTEM_PROMPT,
                              user_template=GENERATE_USER_TEMPLATE)
        enc = tok(prompt, return_tensors="pt", add_special_tokens=False).to(model.device)
        out = model.generate(**enc, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                             pad_token_id=pad, use_cache=True)
        new = out[0, enc["input_ids"].shape[1]:]
        return tok.decode(new, skip_special_tokens=True), int(new.shape[0])

    def timed(fn, rec):
        _sync(device)
        t0 = time.perf_counter()
        res = fn(rec)
        _sync(device)
        return time.perf_counter() - t0, res

    timed(route, records[0])  # warmup (allocations, kernel selection, lazy init)
    timed(generate, records[0])
    r_times, g_times, n_tokens, agree, parsed = [], [], [], 0, 0
    for rec in tqdm(records, desc="router_latency", unit="query", file=sys.stderr):
        t, score = timed(route, rec)
        r_times.append(t)
        t, (text, k) = timed(generate, rec)
        g_times.append(t)
        n_tokens.append(k)
        verdict = _parse_verdict(text)
        parsed += verdict is not None
        agree += verdict is not None and verdict == router.decide(score)[0]
    r, g = summarize(r_times), summarize(g_times)
    result = {
        "benchmark": "router_latency",
        "description": "Decision latency per query (batch size 1): one-forward sufficiency router vs a "
                       "generate-based router (rationale then yes/no) on the same backbone and prompts.",
        "weights": weights, "device": str(model.device), "dtype": str(next(model.parameters()).dtype),
        "router": {**r, "method": "SufficiencyRouter.score: one forward, logits_to_keep=1, one decision token"},
        "generate_baseline": {
            **g, "method": "model.generate greedy, rationale then 'Answer: yes/no'",
            "max_new_tokens": n_new, "min_new_tokens": n_new, "kv_cache": True,
            "note": f"min_new_tokens = max_new_tokens = {n_new}: exactly {n_new} new tokens are decoded per query "
                    "(no early stop at EOS), so the baseline cost is well defined.",
            "new_tokens_generated": {"min": min(n_tokens), "max": max(n_tokens)},
            "verdict_parsed": parsed, "verdict_agrees_with_router": agree},
        "timing_includes": "prompt building + tokenization + model call (+ decoding the generated text); "
                           "torch.inference_mode; one untimed warmup call each",
        "router_input_budget_lifted": budget_lifted,
        "figures": [
            figure("decision_latency_p50", "s", r["p50_s"], g["p50_s"], "baseline/value", (">=", 10.0),
                   "median seconds per decision; baseline = generate-based router; ratio = speedup"),
            figure("decision_latency_mean", "s", r["mean_s"], g["mean_s"], "baseline/value", (">=", 10.0),
                   "mean seconds per decision; baseline = generate-based router; ratio = speedup"),
        ],
    }
    del router, model
    _release()
    return _with_target(result)


# -- benchmark 2: distillation step time ----------------------------------------------------------------
def bench_distill_step(cfg: BenchConfig, records: list[dict], device: str) -> dict:
    import torch
    from tqdm.auto import tqdm

    from routers.sufficiency import NO_WORDS, YES_WORDS, verbalizer_ids
    from train.sufficiency import (SufficiencyCollator, SufficiencyDataset, SufficiencyTrainer,
                                   SufficiencyTrainingConfig, build_model, default_rep_layer)

    with tempfile.TemporaryDirectory(prefix="memroute-bench-") as tmp:
        data_path = Path(tmp) / "samples.jsonl"
        atomic_write_text(data_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        targs = SufficiencyTrainingConfig(
            output_dir=str(Path(tmp) / "trainer"), report_to="none", max_steps=cfg.train_steps + cfg.warmup_steps,
            per_device_train_batch_size=cfg.batch_size, model_name_or_path=cfg.model_name_or_path,
            train_file=str(data_path), max_length=cfg.max_length, lora_r=cfg.lora_r, lora_alpha=2 * cfg.lora_r,
            lora_target_modules=list(cfg.lora_target_modules), lambda_rep=cfg.lambda_rep, save_strategy="no",
            use_cpu=device == "cpu", seed=cfg.seed)
        torch.manual_seed(cfg.seed)
        model, tok = build_model(targs)
        dataset = SufficiencyDataset(str(data_path), tok, targs.max_length)
        collate = SufficiencyCollator(tok.pad_token_id)
        batches = [collate([dataset[j] for j in range(i, min(i + cfg.batch_size, len(dataset)))])
                   for i in range(0, len(dataset), cfg.batch_size)]
        rep_layer = default_rep_layer(model)
        trainer = SufficiencyTrainer(model=model, args=targs, train_dataset=dataset, data_collator=collate,
                                     processing_class=tok, yes_ids=verbalizer_ids(tok, YES_WORDS),
                                     no_ids=verbalizer_ids(tok, NO_WORDS), lambda_rep=cfg.lambda_rep,
                                     rep_layer=rep_layer, s0=1.0, cache_teacher_states=True)
        model.to(device)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        initial = [p.detach().clone() for p in params]
        batches = [{k: v.to(device) for k, v in b.items()} for b in batches]

        def step(batch):
            _sync(device)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = trainer.compute_loss(model, batch)
            loss.backward()
            opt.step()
            _sync(device)
            return time.perf_counter() - t0, float(loss.detach())

        modes = {"base": (0.0, False), "distill_no_cache": (cfg.lambda_rep, False),
                 "distill_cached": (cfg.lambda_rep, True)}
        out: dict[str, dict] = {}
        for name, (lam, cached) in modes.items():
            with torch.no_grad():  # every mode starts from the same LoRA weights and a fresh optimizer
                for p, p0 in zip(params, initial):
                    p.copy_(p0)
            opt = torch.optim.AdamW(params, lr=targs.learning_rate)
            trainer.lambda_rep, trainer.cache_teacher_states = lam, cached
            trainer.teacher_cache.clear()
            fill_s = None
            if cached:  # one pass fills the teacher cache; only later steps are timed
                t0 = time.perf_counter()
                with torch.no_grad():
                    for b in batches:
                        trainer.teacher_states(model, b)
                fill_s = time.perf_counter() - t0
            for i in range(cfg.warmup_steps):
                step(batches[i % len(batches)])
            times, losses = [], []
            for i in tqdm(range(cfg.train_steps), desc=f"distill_step[{name}]", unit="step", file=sys.stderr):
                t, loss = step(batches[(cfg.warmup_steps + i) % len(batches)])
                times.append(t)
                losses.append(loss)
            out[name] = {**summarize(times), "lambda_rep": lam, "teacher_cache": cached,
                         "cache_fill_s": fill_s, "cached_states": len(trainer.teacher_cache), "losses": losses}
        n_trainable = sum(p.numel() for p in params)
        n_total = sum(p.numel() for p in model.parameters())
        del trainer, model, opt, batches
        _release()
    base = out["base"]["mean_s"]
    result = {
        "benchmark": "distill_step",
        "description": "LoRA training step (SufficiencyTrainer.compute_loss + backward + AdamW step) on the same "
                       "fixed batches: no distillation (baseline) vs distillation with/without cached teacher states.",
        "device": device, "batch_size": cfg.batch_size, "n_batches": len(range(0, len(dataset), cfg.batch_size)),
        "warmup_steps": cfg.warmup_steps, "timed_steps": cfg.train_steps, "rep_layer": rep_layer,
        "s0": 1.0, "lora": {"r": cfg.lora_r, "alpha": 2 * cfg.lora_r, "targets": list(cfg.lora_target_modules)},
        "params": {"trainable": n_trainable, "total": n_total}, "modes": out,
        "figures": [
            figure("step_time_distill_no_cache", "s", out["distill_no_cache"]["mean_s"], base, "value/baseline",
                   ("<=", 1.5), "mean step seconds, lambda_rep>0, teacher forward every step; baseline lambda_rep=0"),
            figure("step_time_distill_cached", "s", out["distill_cached"]["mean_s"], base, "value/baseline",
                   ("<=", 1.1), "mean step seconds, lambda_rep>0, teacher states cached; baseline lambda_rep=0"),
        ],
    }
    return _with_target(result)


def bench_index_latency(cfg: BenchConfig, records: list[dict], device: str) -> dict:
    """Dense memory index query latency / indexing throughput at 10k steps (eval/bench_retrieval.py)."""
    from eval.bench_retrieval import bench_index_latency as run

    return run(cfg, records, device)


def bench_memagent_probe(cfg: BenchConfig, records: list[dict], device: str) -> dict:
    """MemAgent's Begin probe, 13 providers x ``memagent_memories`` (eval/bench_memagent.py)."""
    from eval.bench_memagent import bench_memagent_probe as run

    encoder = None if (cfg.memagent_encoder or "").lower() in ("", "none") else cfg.memagent_encoder
    return run(cfg, records, device, encoder=encoder)


# name -> "module:function"; imported only when the benchmark runs (a missing module is an error entry).
BENCHMARKS: dict[str, str] = {
    "router_latency": "eval.bench:bench_router_latency",
    "distill_step": "eval.bench:bench_distill_step",
    "index_latency": "eval.bench:bench_index_latency",
    "memagent_probe": "eval.bench:bench_memagent_probe",
    "quality_targets": "eval.bench_targets:bench_quality_targets",
}
# Benchmarks that need the causal LM and its sufficiency samples (the others bring their own data).
NEEDS_SAMPLES = {"router_latency", "distill_step"}


def resolve_benchmark(spec: str | Callable) -> Callable[[BenchConfig, list[dict], str], dict]:
    if callable(spec):
        return spec
    module, _, func = spec.partition(":")
    return getattr(importlib.import_module(module), func)


def error_entry(name: str, err: BaseException, kind: str = "error") -> dict:
    return {"benchmark": name, "error": f"{kind}: {type(err).__name__}: {err}", "traceback": traceback.format_exc(),
            "figures": [], "target": None, "meets_target": False}


# -- report ----------------------------------------------------------------------------------------------
def _fmt(x, unit: str = "") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.4g}{unit}"
    return f"{x}{unit}"


def markdown_report(results: dict[str, dict]) -> str:
    lines = ["| benchmark | figure | value | baseline | ratio | target | meets |",
             "|---|---|---|---|---|---|---|"]
    for name, res in results.items():
        if "error" in res:
            lines.append(f"| {name} | error | {res['error']} | | | | no |")
            continue
        for f in res["figures"]:
            unit = f" {f['unit']}" if f.get("unit") else ""
            ratio = "n/a" if f["ratio"] is None else f"{f['ratio']:.3g}x ({f['ratio_definition']})"
            target = f["target"]["text"] if "target" in f else ""
            meets = ("yes" if f["meets_target"] else "no") if "meets_target" in f else ""
            lines.append(f"| {name} | {f['name']} | {_fmt(f['value'], unit)} | {_fmt(f['baseline'], unit)} | "
                         f"{ratio} | {target} | {meets} |")
    return "\n".join(lines) + "\n"


def run_benchmarks(cfg: BenchConfig) -> dict:
    """Run ``cfg.which``, write ``<name>.json``, ``report.json`` and ``report.md``; return the report.

    A benchmark that is unavailable (its module does not import) or raises is recorded as an error
    entry; the others still run and the report is written. With ``cfg.strict`` a RuntimeError then
    names the failures.
    """
    unknown = [w for w in cfg.which if w not in BENCHMARKS]
    if unknown or not cfg.which:
        raise ConfigError(f"--which: unknown benchmark(s) {unknown}; choose from {sorted(BENCHMARKS)}")
    if cfg.n_samples < 1 or cfg.train_steps < 1 or cfg.batch_size < 1 or cfg.generate_new_tokens < 1:
        raise ConfigError("n_samples, train_steps, batch_size and generate_new_tokens must be >= 1")
    if cfg.warmup_steps < 0 or cfg.index_steps < 1 or cfg.memagent_memories < 1:
        raise ConfigError("warmup_steps must be >= 0, index_steps and memagent_memories >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from routers.base import git_revision, library_versions
    from routers.models import default_device

    device = cfg.device or default_device()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    data_info: dict = {"source": None, "n_samples": 0, "note": "no selected benchmark needs sufficiency samples"}
    samples_error: BaseException | None = None
    if NEEDS_SAMPLES & set(cfg.which):
        try:
            from transformers import AutoTokenizer

            from routers.models import resolve_causal_lm

            tok_source = cfg.router if cfg.router else resolve_causal_lm(cfg.model_name_or_path)
            records, data_info = load_samples(cfg, AutoTokenizer.from_pretrained(tok_source))
        except Exception as err:  # noqa: BLE001 - only the benchmarks that need samples fail
            traceback.print_exc()
            samples_error, data_info = err, {"source": None, "n_samples": 0, "error": f"{type(err).__name__}: {err}"}
    envelope = {"schema_version": SCHEMA_VERSION, "machine": machine_info(device), "versions": library_versions(),
                "git_revision": git_revision(), "config": dataclasses.asdict(cfg), "data": data_info}
    results: dict[str, dict] = {}
    for name in cfg.which:
        print(f"[bench] {name} on {device}", file=sys.stderr)
        t0 = time.perf_counter()
        try:
            if name in NEEDS_SAMPLES and samples_error is not None:
                raise RuntimeError(f"no samples: {data_info['error']}")
            fn = resolve_benchmark(BENCHMARKS[name])
        except Exception as err:  # noqa: BLE001 - recorded, the other benchmarks still run
            res = error_entry(name, err, "unavailable")
        else:
            try:
                res = fn(cfg, records, device)
            except Exception as err:  # noqa: BLE001 - recorded, the other benchmarks still run
                traceback.print_exc()
                res = error_entry(name, err)
        res["wall_s"] = time.perf_counter() - t0
        results[name] = res
        atomic_write_json(out / f"{name}.json", {**envelope, **res})
    failed = {n: r["error"] for n, r in results.items() if "error" in r}
    report = {**envelope, "benchmarks": results,
              "summary": [{"benchmark": n, **{k: f.get(k) for k in ("name", "unit", "value", "baseline", "ratio",
                                                                     "ratio_definition", "meets_target")},
                           "target": f.get("target", {}).get("text")}
                          for n, r in results.items() for f in r["figures"]],
              "errors": failed,
              "meets_all_targets": all(r["meets_target"] for r in results.values()),
              "files": {n: f"{n}.json" for n in results} | {"markdown": "report.md"}}
    atomic_write_json(out / "report.json", report)
    m, v = envelope["machine"], envelope["versions"]
    versions = ", ".join(f"{k} {v[k]}" for k in ("python", "torch", "transformers", "peft", "accelerate",
                                                  "sentence-transformers") if k in v)
    header = (f"# memroute benchmarks\n\n- machine: {m['platform']}, {m['cpu_count']} CPUs, torch threads "
              f"{m['torch_threads']}, device {device}{' (' + m['device_name'] + ')' if m.get('device_name') else ''}\n"
              f"- versions: {versions}; git {envelope['git_revision'] or 'n/a'}\n"
              f"- model: {cfg.router or cfg.model_name_or_path}; data: {data_info.get('source')} "
              f"({data_info.get('n_samples', 0)} samples)\n"
              f"- ratio: value/baseline for slowdowns (smaller is better), baseline/value for speedups\n\n")
    atomic_write_text(out / "report.md", header + markdown_report(results))
    if failed:
        print(f"[bench] {len(failed)} benchmark(s) failed or unavailable: {sorted(failed)}; see {out}/<name>.json",
              file=sys.stderr)
        if cfg.strict:
            raise RuntimeError(f"benchmark(s) failed: {sorted(failed)}; see {out}/<name>.json (report written)")
    return report


def make_parser():
    return make_arg_parser([BenchConfig], prog="memroute bench",
                           description="Run the benchmarks and write a JSON + Markdown report.")


def main(argv=None) -> dict:
    (cfg,) = parse_config(make_parser(), [BenchConfig], argv)
    report = run_benchmarks(cfg)
    print((Path(cfg.output_dir) / "report.md").read_text())
    return report


if __name__ == "__main__":
    main()
