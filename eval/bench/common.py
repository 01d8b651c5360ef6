"""What every benchmark shares: the options (:class:`BenchConfig`), the registry (``BENCHMARKS``: name ->
``"module:function"``, imported only when the benchmark runs), the figure layout (:func:`figure`,
:func:`with_target`), timing summaries and the machine description.

A benchmark is ``fn(cfg: BenchConfig, records: list[dict], device: str) -> dict`` with a ``figures`` list;
:mod:`eval.bench.run` runs the selected ones and writes the report.
"""

from __future__ import annotations

import gc
import importlib
import math
import operator
import statistics
import traceback
from dataclasses import dataclass, field
from typing import Callable

from routers.machine import machine_info
from routers.models import DEFAULT_CAUSAL_LM

SCHEMA_VERSION = 1


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
    precision_seq_len: int = field(default=256, metadata={"help": "precision_step: tokens per sequence."})
    train_top_layers: int = field(default=24, metadata={"help": "frozen_prefix_step: trained top layers (K)."})
    lora_r: int = 16
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    device: str | None = field(default=None, metadata={"help": "cpu / cuda / mps; default: best available."})
    inference_dtype: str = field(default="float32", metadata={
        "help": "Weights dtype for router_latency (both sides): float32 or bfloat16."})
    index_steps: int = field(default=10_000, metadata={"help": "Memory size (steps) for index_latency."})
    memagent_memories: int = field(default=10_000, metadata={"help": "Memories per provider for memagent_probe."})
    memagent_encoder: str = field(default="minilm", metadata={
        "help": "Query encoder for memagent_probe; 'none' = random query vectors."})
    memagent_in_keep_layers: int = field(default=10, metadata={
        "help": "memagent_in: decoder layers of the pruned router it compares (MemAgentSFTConfig.keep_layers)."})
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


# -- registry --------------------------------------------------------------------------------------------
# name -> "module:function"; imported only when the benchmark runs (a missing module is an error entry).
BENCHMARKS: dict[str, str] = {
    "router_latency": "eval.bench.sufficiency:bench_router_latency",
    "distill_step": "eval.bench.sufficiency:bench_distill_step",
    "frozen_prefix_step": "eval.bench.training_step:bench_frozen_prefix_step",  # CPU path: LoRA dropout cost
    "index_latency": "eval.bench.retrieval:bench_index_latency",
    "memagent_probe": "eval.bench.memagent:bench_memagent_probe",
    "memagent_in": "eval.bench.memagent_in:bench_memagent_in",   # In decision: incremental KV cache vs full prompt
    "precision_step": "eval.bench.precision:bench_precision_step",  # bf16 autocast vs fp32 here: the auto pick
    "quality_targets": "eval.bench.targets:bench_quality_targets",
}
# Benchmarks that need the causal LM and its sufficiency samples (the others bring their own data).
NEEDS_SAMPLES = {"router_latency", "distill_step", "frozen_prefix_step"}


def resolve_benchmark(spec: str | Callable) -> Callable[[BenchConfig, list[dict], str], dict]:
    if callable(spec):
        return spec
    module, _, func = spec.partition(":")
    return getattr(importlib.import_module(module), func)


def error_entry(name: str, err: BaseException, kind: str = "error") -> dict:
    return {"benchmark": name, "error": f"{kind}: {type(err).__name__}: {err}", "traceback": traceback.format_exc(),
            "figures": [], "target": None, "meets_target": False}


# -- helpers ---------------------------------------------------------------------------------------------
def sync(device: str) -> None:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


def release() -> None:
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


def with_target(result: dict) -> dict:
    """Top-level ``target`` (text) and ``meets_target`` (all figures with a target meet it)."""
    targeted = [f for f in result["figures"] if "target" in f]
    result["target"] = "; ".join(f"{f['name']}: {f['target']['text']}" for f in targeted)
    result["meets_target"] = bool(targeted) and all(f["meets_target"] for f in targeted)
    return result
