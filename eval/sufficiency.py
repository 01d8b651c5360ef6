"""Offline evaluation of the Router-Mem sufficiency router: base (zero-shot) vs trained, same data.

``python -m eval.sufficiency --router outputs/router --data data/eval.jsonl --output_dir results/suff``
(or a YAML recipe first; flags override it). Writes into ``output_dir``:

* ``metrics.json``: config, library versions, machine, per-model AUROC/AP/Brier/ECE, per-tau rows,
  timing (seconds per sample, scoring only), calibration;
* ``scores.jsonl``: id, label, variant, ``base`` and ``trained`` scores (null = over input budget);
* ``score_cache.jsonl``: every score as soon as its batch is done, keyed by model identity + sample id
  + input hash (eval/score_cache.py): a killed evaluation rerun with the same command scores only
  what is missing and ends with the same files as an uninterrupted run (``--resume false``: rescore);
* ``calibration.json`` (also into the router export unless ``--no_write_calibration_to_router``);
* ``reliability.png``, ``early_termination.png``, ``resolved_config.yaml``.

``calibrate_main`` re-derives ``calibration.json`` from a ``scores.jsonl`` without any model.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from data_synthesis.jsonl import RecordError, atomic_write_json, atomic_write_text, read_jsonl
from eval.metrics import DEFAULT_TAUS, binary_metrics, calibrate_threshold, finite_or_none, threshold_metrics
from train.config import ConfigError, make_arg_parser, parse_config, save_resolved_config

REQUIRED_FIELDS = ("id", "question", "context", "label")
BASE, TRAINED = "base", "trained"


@dataclass
class SufficiencyEvalConfig:
    router: str | None = field(default=None, metadata={
        "help": "Trained router export directory (SufficiencyRouter.save_pretrained). None: base only."})
    base_model: str | None = field(default=None, metadata={
        "help": "Untrained baseline model (alias, HF id or path). Default: base_model from the router's "
                "router_config.json; 'none' skips the baseline."})
    data: str | None = field(default=None, metadata={
        "help": "Eval JSONL: one {id, question, context, label 0/1, variant, ...} per line (required)."})
    output_dir: str = field(default="results/sufficiency_eval", metadata={"help": "Where results go."})
    taus: list[float] = field(default_factory=lambda: list(DEFAULT_TAUS),
                              metadata={"help": "Thresholds for the per-tau rows."})
    target_precision: float | None = field(default=0.9, metadata={
        "help": "Calibrate tau for this stop-precision (max early termination subject to it)."})
    target_early_termination: float | None = field(default=None, metadata={
        "help": "Calibrate tau for this early-termination rate instead (takes precedence when set)."})
    max_samples: int | None = field(default=None, metadata={"help": "Evaluate only the first N records."})
    batch_size: int = field(default=8, metadata={"help": "Scoring batch size."})
    write_calibration_to_router: bool = field(default=True, metadata={
        "help": "Also write calibration.json into the router export (its threshold becomes the default tau)."})
    resume: bool = field(default=True, metadata={
        "help": "Reuse the per-sample scores in output_dir/score_cache.jsonl (same model, same sample text); "
                "false rescores everything."})


@dataclass
class CalibrateConfig:
    scores: str | None = field(default=None, metadata={"help": "scores.jsonl written by eval.sufficiency."})
    output: str | None = field(default=None, metadata={
        "help": "calibration.json to write (e.g. inside a router export)."})
    score_field: str = field(default=TRAINED, metadata={"help": "Which score column to calibrate."})
    target_precision: float | None = field(default=0.9, metadata={"help": "Target stop-precision."})
    target_early_termination: float | None = field(default=None, metadata={
        "help": "Target early-termination rate (takes precedence when set)."})


def make_parser():
    return make_arg_parser([SufficiencyEvalConfig], prog="memroute eval-sufficiency",
                           description="Evaluate a sufficiency router against its untrained base model.")


def make_calibrate_parser():
    return make_arg_parser([CalibrateConfig], prog="memroute calibrate",
                           description="Choose the router threshold tau from a scores.jsonl.")


# -- helpers -------------------------------------------------------------------------------------------
def _label_validator():
    seen: set = set()

    def validate(rec: dict) -> None:
        if isinstance(rec["label"], bool) or rec["label"] not in (0, 1):
            raise ValueError(f"label must be 0 or 1, got {rec['label']!r}")
        if not isinstance(rec["question"], str) or not isinstance(rec["context"], str):
            raise ValueError("question and context must be strings")
        if rec["id"] in seen:
            raise ValueError(f"duplicate id {rec['id']!r}")
        seen.add(rec["id"])

    return validate


def load_eval_records(path: str | os.PathLike, max_samples: int | None = None) -> list[dict]:
    """Eval records in file order (the first ``max_samples`` when set); RecordError names file:line."""
    records = []
    for rec in read_jsonl(path, required=REQUIRED_FIELDS, validate=_label_validator()):
        records.append(rec)
        if max_samples is not None and len(records) >= max_samples:
            break
    if not records:
        raise ValueError(f"{path}: no eval records")
    return records


def _calibrate(labels, scores, target_precision, target_early_termination) -> dict | None:
    """An explicit early-termination target wins over the (defaulted) precision target."""
    if target_early_termination is not None:
        return calibrate_threshold(labels, scores, target_early_termination=target_early_termination)
    if target_precision is not None:
        return calibrate_threshold(labels, scores, target_precision=target_precision)
    return None


def machine_info() -> dict:
    info = {"platform": platform.platform(), "machine": platform.machine(), "processor": platform.processor(),
            "python": platform.python_version(), "cpu_count": os.cpu_count()}
    try:
        import torch

        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - machine info is best effort
        pass
    return info


def score_records(router, records: list[dict], batch_size: int, cache=None, model_key: str | None = None,
                  name: str = "") -> tuple[np.ndarray, int]:
    """Scores in record order; returns (scores, number computed now). NaN = over the input budget.

    Batches are fixed by the whole set (length-sorted, as ``router.score`` batches), not by what is
    cached, so a resumed run feeds the model exactly the batches of an uninterrupted one and gets
    bit-identical scores. A batch whose scores are all in ``cache`` is skipped; each computed score is
    appended to the cache at once.
    """
    from tqdm.auto import tqdm

    questions = [r["question"] for r in records]
    contexts = [r["context"] for r in records]
    lengths = [len(e) for e in router.encode(questions, contexts)]
    order = sorted(range(len(records)), key=lambda i: lengths[i])
    keys = ([cache.key(model_key, r["id"], r["question"], r["context"]) for r in records]
            if cache is not None and model_key else None)
    scores = np.full(len(records), math.nan)
    computed = 0
    for s in tqdm(range(0, len(order), batch_size), desc=f"score {name}".strip(), unit="batch", file=sys.stderr):
        chunk = order[s:s + batch_size]
        if keys is not None and all(keys[i] in cache for i in chunk):
            for i in chunk:
                v = cache.get(keys[i])["score"]
                scores[i] = math.nan if v is None else float(v)
            continue
        out = router.score([questions[i] for i in chunk], [contexts[i] for i in chunk], batch_size=len(chunk))
        for i, v in zip(chunk, out.numpy().astype(np.float64)):
            scores[i] = v
            if keys is not None:
                cache.put({"key": keys[i], "model": name, "id": records[i]["id"], "score": finite_or_none(v)})
        computed += len(chunk)
    return scores, computed


def _score_with(load, records, batch_size, cache=None, model_key=None, name="") -> tuple[np.ndarray, dict]:
    """Load a router, score everything (cached scores are reused), free it. Timing covers scoring only."""
    t0 = time.perf_counter()
    router = load()
    t1 = time.perf_counter()
    scores, computed = score_records(router, records, batch_size, cache, model_key, name)
    t2 = time.perf_counter()
    info = {"router_threshold": float(router.config.threshold), "max_input_tokens": router.config.max_input_tokens,
            "device": str(next(router.model.parameters()).device), "model_identity": model_key,
            "timing": {"load_s": t1 - t0, "score_s": t2 - t1,
                       "seconds_per_sample": (t2 - t1) / computed if computed else None,
                       "scored": computed, "from_cache": len(records) - computed}}
    del router
    gc.collect()
    return scores, info


def _per_variant(records, scores, taus) -> dict:
    """Stop share per record variant (positive / partial / none): where early stops go wrong."""
    out = {}
    variants = [str(r.get("variant", "unknown")) for r in records]
    for v in sorted(set(variants)):
        m = np.array([x == v for x in variants])
        s = scores[m]
        out[v] = {"n": int(m.sum()), "mean_score": finite_or_none(np.nanmean(s)) if (~np.isnan(s)).any() else None,
                  "early_termination_rate": {f"{t:g}": float(((~np.isnan(s)) & (np.nan_to_num(s) >= t)).mean())
                                             for t in taus}}
    return out


def format_table(models: dict) -> str:
    header = f"{'model':<10} | {'AUROC':>6} | {'AP':>6} | {'ECE':>6} | {'Brier':>6} | {'acc@0.5':>7} | {'ET@0.5':>6}"
    lines = [header, "-" * len(header)]

    def f(x, w):
        return f"{x:>{w}.3f}" if x is not None else f"{'n/a':>{w}}"

    for name, m in models.items():
        lines.append(f"{name:<10} | {f(m['auroc'], 6)} | {f(m['ap'], 6)} | {f(m['ece'], 6)} | {f(m['brier'], 6)} | "
                     f"{f(m['at_0.5']['accuracy'], 7)} | {f(m['at_0.5']['early_termination_rate'], 6)}")
    return "\n".join(lines)


# -- entry points --------------------------------------------------------------------------------------
def main(argv=None) -> dict:
    (cfg,) = parse_config(make_parser(), [SufficiencyEvalConfig], argv)
    if not cfg.data:
        raise ConfigError("--data (an eval JSONL) is required")
    base_model = cfg.base_model
    if base_model is None and cfg.router:
        from routers.base import ROUTER_CONFIG

        base_model = json.loads((Path(cfg.router) / ROUTER_CONFIG).read_text()).get("base_model")
        if base_model is None:
            print(f"[eval] {cfg.router}/{ROUTER_CONFIG} names no base_model: skipping the base comparison",
                  file=sys.stderr)
    if isinstance(base_model, str) and base_model.lower() == "none":
        base_model = None
    if not cfg.router and not base_model:
        raise ConfigError("nothing to evaluate: give --router and/or --base_model")

    from routers.base import git_revision, library_versions
    from routers.sufficiency import SufficiencyRouter

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = load_eval_records(cfg.data, cfg.max_samples)
    labels = np.array([int(r["label"]) for r in records], dtype=np.int64)

    from eval.score_cache import ResultCache, model_identity, score_field
    from routers.models import resolve_causal_lm

    loaders, identities = {}, {}
    if base_model:
        loaders[BASE] = lambda: SufficiencyRouter.from_base(base_model)
        identities[BASE] = model_identity(resolve_causal_lm(base_model), kind="from_base")
    if cfg.router:
        loaders[TRAINED] = lambda: SufficiencyRouter.from_pretrained(cfg.router)
        identities[TRAINED] = model_identity(cfg.router, kind="from_pretrained")
    scores: dict[str, np.ndarray] = {}
    models: dict[str, dict] = {}
    cache = ResultCache(out / "score_cache.jsonl", fresh=not cfg.resume, required=("score",), validate=score_field)
    for name, load in loaders.items():
        print(f"[eval] scoring {len(records)} samples with the {name} router", file=sys.stderr)
        scores[name], info = _score_with(load, records, cfg.batch_size, cache, identities[name], name)
        if info["timing"]["from_cache"]:
            print(f"[eval] {name}: {info['timing']['from_cache']} scores reused from {cache.path}", file=sys.stderr)
        m = binary_metrics(labels, scores[name], cfg.taus)
        m["at_0.5"] = threshold_metrics(labels, scores[name], 0.5)
        m["per_variant"] = _per_variant(records, scores[name], cfg.taus)
        m["source"] = base_model if name == BASE else str(cfg.router)
        models[name] = {**m, **info}
    cache.close()

    primary = TRAINED if TRAINED in scores else BASE
    calibration = _calibrate(labels, scores[primary], cfg.target_precision, cfg.target_early_termination)
    if calibration is not None:
        calibration.update({"model": primary, "data": str(cfg.data), "created_by": "eval.sufficiency"})
        atomic_write_json(out / "calibration.json", calibration)
        if cfg.router and cfg.write_calibration_to_router:
            from routers.base import CALIBRATION

            atomic_write_json(Path(cfg.router) / CALIBRATION, calibration)

    lines = []
    for i, r in enumerate(records):
        row = {"id": r["id"], "label": int(r["label"]), "variant": r.get("variant")}
        row.update({name: finite_or_none(s[i]) for name, s in scores.items()})
        lines.append(json.dumps(row, ensure_ascii=False))
    atomic_write_text(out / "scores.jsonl", "\n".join(lines) + "\n")

    from eval.plots import early_termination_curve, reliability_diagram

    reliability_diagram({k: (labels, v) for k, v in scores.items()}, out / "reliability.png")
    early_termination_curve({k: m["per_tau"] for k, m in models.items()}, out / "early_termination.png")
    resolved = save_resolved_config(out, cfg)

    metrics = {
        "schema_version": 1, "task": "sufficiency_eval", "config": dataclasses.asdict(cfg),
        "resolved_base_model": base_model, "versions": library_versions(), "git_revision": git_revision(),
        "machine": machine_info(), "n_samples": len(records), "n_positive": int(labels.sum()),
        "models": models, "calibration": calibration,
        "files": {"scores": "scores.jsonl", "calibration": "calibration.json" if calibration else None,
                  "reliability": "reliability.png", "early_termination": "early_termination.png",
                  "resolved_config": resolved.name},
    }
    atomic_write_json(out / "metrics.json", metrics)
    print(format_table(models))
    if calibration is not None:
        print(f"calibrated tau={calibration['threshold']:.4f} ({calibration['method']}, reachable="
              f"{calibration['reachable']}): precision={calibration['precision']}, "
              f"early termination={calibration['early_termination_rate']:.3f}")
    return metrics


def calibrate_main(argv=None) -> dict:
    """``memroute calibrate --scores scores.jsonl --output router/calibration.json [--score_field trained]``."""
    (cfg,) = parse_config(make_calibrate_parser(), [CalibrateConfig], argv)
    if not cfg.scores or not cfg.output:
        raise ConfigError("--scores and --output are required")
    if cfg.target_precision is None and cfg.target_early_termination is None:
        raise ConfigError("give --target_precision or --target_early_termination")

    def validate(rec):
        if isinstance(rec["label"], bool) or rec["label"] not in (0, 1):
            raise ValueError(f"label must be 0 or 1, got {rec['label']!r}")
        v = rec[cfg.score_field]
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"{cfg.score_field} must be a number or null, got {v!r}")
        if v is not None and not math.isnan(v) and not 0.0 <= v <= 1.0:
            raise ValueError(f"{cfg.score_field} must lie in [0, 1] (or be null for over-budget prompts), got {v!r}")

    recs = list(read_jsonl(cfg.scores, required=("label", cfg.score_field), validate=validate))
    if not recs:
        raise RecordError(cfg.scores, 0, "no records")
    labels = np.array([int(r["label"]) for r in recs], dtype=np.int64)
    s = np.array([math.nan if r[cfg.score_field] is None else float(r[cfg.score_field]) for r in recs])
    calibration = _calibrate(labels, s, cfg.target_precision, cfg.target_early_termination)
    calibration.update({"model": cfg.score_field, "data": str(cfg.scores), "created_by": "eval.sufficiency.calibrate"})
    atomic_write_json(cfg.output, calibration)
    print(json.dumps(calibration, indent=2))
    return calibration


if __name__ == "__main__":
    main()
