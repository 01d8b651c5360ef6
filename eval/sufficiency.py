"""Offline evaluation of the Router-Mem sufficiency router: base (zero-shot) vs trained, same data.

``python -m eval.sufficiency --router outputs/router --data data/eval.jsonl --output_dir results/suff``
(or a YAML recipe first; flags override it). Writes into ``output_dir``:

* ``metrics.json``: config, library versions, machine, per-model AUROC/AP/Brier/ECE, per-tau rows,
  timing (seconds per sample, scoring only), calibration;
* ``scores.jsonl``: id, label, variant, ``base`` and ``trained`` scores (null = over input budget);
* ``score_cache.jsonl``: every score as soon as its batch is done, keyed by model identity + sample id
  + input hash (eval/score_cache.py): a killed evaluation rerun with the same command scores only
  what is missing and ends with the same files as an uninterrupted run (``--resume false``: rescore);
* ``calibration.json`` when the data can calibrate tau (both classes, at least ``--min_calibration_samples``
  in-budget samples and ``--min_calibration_per_class`` of each; otherwise calibration is skipped, the
  reason recorded in metrics.json and printed). It goes into the router export only with
  ``--write_calibration_to_router true`` (its threshold then becomes the router's default tau);
* ``reliability.png``, ``early_termination.png``, ``resolved_config.yaml``.

The output directory is locked for the life of the run (a second run into it fails at once).

``calibrate_main`` re-derives ``calibration.json`` from a ``scores.jsonl`` without any model.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tqdm.auto import tqdm

from routers.io import OutputLock, RecordError, atomic_write_json, atomic_write_text, read_jsonl
from routers.logs import get_logger, setup_cli_logging
from routers.machine import machine_info
from data_synthesis.sufficiency_samples import read_samples
from eval.metrics import (DEFAULT_TAUS, MIN_CALIBRATION_PER_CLASS, MIN_CALIBRATION_SAMPLES, binary_metrics,
                          calibrate_threshold, calibration_refusal, finite_or_none, threshold_metrics)
from eval.score_cache import ResultCache, model_identity, score_field
from routers.base import CALIBRATION, check_router_dir, git_revision, library_versions
from routers.models import resolve_causal_lm, torch_dtype
from routers.sufficiency import SufficiencyRouter
from routers.config import ConfigError, make_arg_parser, parse_config, save_resolved_config

log = get_logger("eval.sufficiency")  # the same name under python -m

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
    max_samples: int | None = field(default=None, metadata={"help": "Evaluate only the first N records (N >= 1)."})
    batch_size: int = field(default=8, metadata={"help": "Scoring batch size."})
    dtype: str = field(default="float32", metadata={
        "help": "Weights dtype of both models while scoring: float32, bfloat16, float16, or auto (bfloat16 on a GPU or "
                "a CPU with native bf16, where it scores ~1.6x faster, else float32)."})
    write_calibration_to_router: bool = field(default=False, metadata={
        "help": "Also write calibration.json into the router export (its threshold becomes the router's default "
                "tau). Off by default: an eval on a small or skewed slice must not change the deployed tau."})
    min_calibration_samples: int = field(default=MIN_CALIBRATION_SAMPLES, metadata={
        "help": "Calibrate tau only from at least this many in-budget samples (else calibration is skipped)."})
    min_calibration_per_class: int = field(default=MIN_CALIBRATION_PER_CLASS, metadata={
        "help": "... and at least this many of each label (one class alone is always refused)."})
    resume: bool = field(default=True, metadata={
        "help": "Reuse the per-sample scores in output_dir/score_cache.jsonl (same model, same sample text); "
                "false rescores everything."})

    def __post_init__(self):
        _check_common(self)
        if self.max_samples is not None and self.max_samples < 1:
            raise ValueError(f"max_samples must be >= 1 (got {self.max_samples}); omit it to evaluate every record")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ValueError(f"dtype must be float32, bfloat16, float16 or auto, got {self.dtype!r}")
        if not self.taus:
            raise ValueError("taus must list at least one threshold in [0, 1]")
        bad = [t for t in self.taus if not 0.0 <= t <= 1.0]
        if bad:
            raise ValueError(f"taus must lie in [0, 1], got {bad}")


@dataclass
class CalibrateConfig:
    scores: str | None = field(default=None, metadata={"help": "scores.jsonl written by eval.sufficiency."})
    output: str | None = field(default=None, metadata={
        "help": "calibration.json to write (e.g. inside a router export)."})
    score_field: str = field(default=TRAINED, metadata={"help": "Which score column to calibrate."})
    target_precision: float | None = field(default=0.9, metadata={"help": "Target stop-precision."})
    target_early_termination: float | None = field(default=None, metadata={
        "help": "Target early-termination rate (takes precedence when set)."})
    min_calibration_samples: int = field(default=MIN_CALIBRATION_SAMPLES, metadata={
        "help": "Refuse to calibrate from fewer in-budget samples than this."})
    min_calibration_per_class: int = field(default=MIN_CALIBRATION_PER_CLASS, metadata={
        "help": "Refuse to calibrate with fewer of either label than this (one class alone is always refused)."})

    def __post_init__(self):
        _check_common(self)


def _check_common(cfg) -> None:
    """Targets and calibration minimums, checked when the options are read (not after scoring). A plain
    ValueError: ``parse_config`` turns it into a ConfigError naming the recipe (or the command line)."""
    for name in ("target_precision", "target_early_termination"):
        v = getattr(cfg, name)
        if v is not None and not 0.0 <= v <= 1.0:  # also refuses NaN
            raise ValueError(f"{name} must lie in [0, 1], got {v}")
    if cfg.min_calibration_samples < 2:
        raise ValueError(f"min_calibration_samples must be >= 2, got {cfg.min_calibration_samples}")
    if cfg.min_calibration_per_class < 1:
        raise ValueError(f"min_calibration_per_class must be >= 1, got {cfg.min_calibration_per_class}")


def make_parser():
    parser = make_arg_parser([SufficiencyEvalConfig], prog="memroute eval sufficiency",
                             description="Evaluate a sufficiency router against its untrained base model.")
    # The option used to default to true, with this flag to turn it off: scripts that pass it keep working.
    parser.add_argument("--no_write_calibration_to_router", "--no-write-calibration-to-router", action="store_false",
                        dest="write_calibration_to_router", help="The default: leave the router's calibration alone.")
    return parser


def make_calibrate_parser():
    return make_arg_parser([CalibrateConfig], prog="memroute calibrate",
                           description="Choose the router threshold tau from a scores.jsonl.")


# -- helpers -------------------------------------------------------------------------------------------
def load_eval_records(path: str | os.PathLike, max_samples: int | None = None) -> list[dict]:
    """Eval records in file order (the first ``max_samples`` when set), read by the one sample reader
    (``data_synthesis.sufficiency.read_samples``): RecordError names file:line, an empty file is an error."""
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"max_samples must be >= 1, got {max_samples}")
    return read_samples(path, max_samples, required=REQUIRED_FIELDS)



def _calibrate(labels, scores, target_precision, target_early_termination) -> dict | None:
    """An explicit early-termination target wins over the (defaulted) precision target."""
    if target_early_termination is not None:
        return calibrate_threshold(labels, scores, target_early_termination=target_early_termination)
    if target_precision is not None:
        return calibrate_threshold(labels, scores, target_precision=target_precision)
    return None


def score_records(router, records: list[dict], batch_size: int, cache=None, model_key: str | None = None,
                  name: str = "") -> tuple[np.ndarray, int]:
    """Scores in record order; returns (scores, number computed now). NaN = over the input budget.

    Batches are fixed by the whole set (length-sorted, as ``router.score`` batches), not by what is
    cached, so a resumed run feeds the model exactly the batches of an uninterrupted one and gets
    bit-identical scores. A batch whose scores are all in ``cache`` is skipped; each computed score is
    appended to the cache at once.
    """
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
            "device": str(next(router.model.parameters()).device),
            "dtype": str(next(router.model.parameters()).dtype).removeprefix("torch."), "model_identity": model_key,
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
    if any(a == "--leave_out" or a.startswith("--leave_out=") for a in (sys.argv[1:] if argv is None else argv)):
        from eval.leave_out import main as leave_out_main  # leave-one-corpus-out (eval/leave_out.py)

        return leave_out_main(argv, kind="sufficiency")
    setup_cli_logging()  # a CLI entry point (memroute eval sufficiency, python -m eval.sufficiency)
    (cfg,) = parse_config(make_parser(), [SufficiencyEvalConfig], argv)
    if not cfg.data:
        raise ConfigError("--data (an eval JSONL) is required")
    base_model = cfg.base_model
    if cfg.router:
        router_config = check_router_dir(cfg.router, "sufficiency")  # before any model loads: a bad export fails in seconds
        if base_model is None:
            base_model = router_config.get("base_model")
            if base_model is None:
                log.warning("%s/router_config.json names no base_model: skipping the base comparison", cfg.router)
            elif not isinstance(base_model, str):
                raise ConfigError(f"{cfg.router}/router_config.json: base_model must be a string, got "
                                  f"{base_model!r:.60} (pass --base_model)")
    if isinstance(base_model, str) and base_model.lower() == "none":
        base_model = None
    if not cfg.router and not base_model:
        raise ConfigError("nothing to evaluate: give --router and/or --base_model")
    if cfg.write_calibration_to_router and not cfg.router:
        raise ConfigError("--write_calibration_to_router true needs --router (the export to write it into)")
    records = load_eval_records(cfg.data, cfg.max_samples)  # bad data fails before the lock and any model
    with OutputLock(cfg.output_dir):
        return _run(cfg, base_model, records)


def _score_models(cfg: SufficiencyEvalConfig, base_model: str | None, records: list[dict], labels: np.ndarray,
                  out: Path) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """Score every record with the base and/or trained router (reusing ``score_cache.jsonl``); per model the
    metrics, the per-variant stop shares, the load/score timing and the model identity."""
    loaders, identities = {}, {}
    dtype = torch_dtype(cfg.dtype)
    precision = {} if str(dtype) == "torch.float32" else {"dtype": str(dtype)}  # float32 keeps the identities of old caches
    if base_model:
        loaders[BASE] = lambda: SufficiencyRouter.from_base(base_model, dtype=dtype)
        identities[BASE] = model_identity(resolve_causal_lm(base_model), kind="from_base", **precision)
    if cfg.router:
        loaders[TRAINED] = lambda: SufficiencyRouter.from_pretrained(cfg.router, dtype=dtype)
        identities[TRAINED] = model_identity(cfg.router, kind="from_pretrained", **precision)
    scores: dict[str, np.ndarray] = {}
    models: dict[str, dict] = {}
    cache = ResultCache(out / "score_cache.jsonl", fresh=not cfg.resume, required=("score",), validate=score_field)
    for name, load in loaders.items():
        log.info("scoring %d samples with the %s router", len(records), name)
        scores[name], info = _score_with(load, records, cfg.batch_size, cache, identities[name], name)
        if info["timing"]["from_cache"]:
            log.info("%s: %d scores reused from %s", name, info["timing"]["from_cache"], cache.path)
        m = binary_metrics(labels, scores[name], cfg.taus)
        m["at_0.5"] = threshold_metrics(labels, scores[name], 0.5)
        m["per_variant"] = _per_variant(records, scores[name], cfg.taus)
        m["source"] = base_model if name == BASE else str(cfg.router)
        models[name] = {**m, **info}
    cache.close()
    return scores, models


def _calibration(cfg: SufficiencyEvalConfig, labels: np.ndarray, scores: dict[str, np.ndarray],
                 out: Path) -> tuple[dict | None, str | None, bool]:
    """Calibrate tau on the primary model's scores, or record why not; writes ``calibration.json`` (and into
    the router only when asked). Returns (calibration, reason skipped, written into the router)."""
    primary = TRAINED if TRAINED in scores else BASE
    calibration, skipped = None, None
    if cfg.target_precision is not None or cfg.target_early_termination is not None:
        skipped = calibration_refusal(labels, scores[primary], cfg.min_calibration_samples,
                                      cfg.min_calibration_per_class)
        if skipped is None:
            calibration = _calibrate(labels, scores[primary], cfg.target_precision, cfg.target_early_termination)
    else:
        skipped = "no calibration target (target_precision and target_early_termination are both unset)"
    written_to_router = False
    if calibration is not None:
        calibration.update({"model": primary, "data": str(cfg.data), "created_by": "eval.sufficiency"})
        atomic_write_json(out / "calibration.json", calibration)
        if cfg.router and cfg.write_calibration_to_router:
            atomic_write_json(Path(cfg.router) / CALIBRATION, calibration)
            written_to_router = True
    else:
        (out / "calibration.json").unlink(missing_ok=True)  # a stale one from an earlier run would mislead
        log.info("calibration skipped: %s", skipped)
        if cfg.write_calibration_to_router:
            log.warning("--write_calibration_to_router was asked for, but NOTHING was written into %s: %s. "
                        "The router keeps its current tau.", cfg.router, skipped)
    return calibration, skipped, written_to_router


def _write_scores(records: list[dict], scores: dict[str, np.ndarray], path: Path) -> None:
    lines = []
    for i, r in enumerate(records):
        row = {"id": r["id"], "label": int(r["label"]), "variant": r.get("variant")}
        row.update({name: finite_or_none(s[i]) for name, s in scores.items()})
        lines.append(json.dumps(row, ensure_ascii=False))
    atomic_write_text(path, "\n".join(lines) + "\n")


def _print_result(cfg: SufficiencyEvalConfig, models: dict, calibration: dict | None, skipped: str | None,
                  written_to_router: bool) -> None:
    print(format_table(models))
    if calibration is not None:
        where = f"written into {cfg.router}" if written_to_router else \
            "not written into the router (--write_calibration_to_router true to do so)"
        print(f"calibrated tau={calibration['threshold']:.4f} ({calibration['method']}, reachable="
              f"{calibration['reachable']}): precision={calibration['precision']}, "
              f"early termination={calibration['early_termination_rate']:.3f}; {where}")
    else:
        print(f"calibration skipped: {skipped}")


def _run(cfg: SufficiencyEvalConfig, base_model: str | None, records: list[dict]) -> dict:
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    labels = np.array([int(r["label"]) for r in records], dtype=np.int64)
    scores, models = _score_models(cfg, base_model, records, labels, out)
    calibration, skipped, written_to_router = _calibration(cfg, labels, scores, out)
    _write_scores(records, scores, out / "scores.jsonl")

    from eval.plots import early_termination_curve, reliability_diagram  # matplotlib only when plots are drawn

    reliability_diagram({k: (labels, v) for k, v in scores.items()}, out / "reliability.png")
    early_termination_curve({k: m["per_tau"] for k, m in models.items()}, out / "early_termination.png")
    resolved = save_resolved_config(out, cfg)

    metrics = {
        "schema_version": 1, "task": "sufficiency_eval", "config": dataclasses.asdict(cfg),
        "resolved_base_model": base_model, "versions": library_versions(), "git_revision": git_revision(),
        "machine": machine_info(), "n_samples": len(records), "n_positive": int(labels.sum()),
        "models": models, "calibration": calibration, "calibration_skipped": skipped,
        "calibration_written_to_router": written_to_router,
        "files": {"scores": "scores.jsonl", "calibration": "calibration.json" if calibration else None,
                  "reliability": "reliability.png", "early_termination": "early_termination.png",
                  "resolved_config": resolved.name},
    }
    atomic_write_json(out / "metrics.json", metrics)
    _print_result(cfg, models, calibration, skipped, written_to_router)
    return metrics


def calibrate_main(argv=None) -> dict:
    """``memroute calibrate --scores scores.jsonl --output router/calibration.json [--score_field trained]``.

    Refuses (ValueError naming the scores file, nothing written) when the rows hold one class only or fewer
    than ``--min_calibration_samples`` in-budget rows / ``--min_calibration_per_class`` of either label."""
    setup_cli_logging()
    (cfg,) = parse_config(make_calibrate_parser(), [CalibrateConfig], argv)
    if not cfg.scores or not cfg.output:
        raise ConfigError("--scores and --output are required")
    if cfg.target_precision is None and cfg.target_early_termination is None:
        raise ConfigError("give --target_precision or --target_early_termination")
    if Path(cfg.output).is_dir():
        raise ConfigError(f"--output {cfg.output} is a directory; give the file to write, e.g. "
                          f"{Path(cfg.output) / 'calibration.json'}")
    if not Path(cfg.output).parent.is_dir():
        raise FileNotFoundError(f"--output {cfg.output}: directory {Path(cfg.output).parent} does not exist")

    def validate(rec):
        if isinstance(rec["label"], bool) or rec["label"] not in (0, 1):
            raise ValueError(f"label must be 0 or 1, got {rec['label']!r}")
        v = rec[cfg.score_field]
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"{cfg.score_field} must be a number or null, got {v!r}")
        if v is not None and not math.isnan(v) and not 0.0 <= v <= 1.0:
            raise ValueError(f"{cfg.score_field} must lie in [0, 1] (or be null for over-budget prompts), got {v!r}")

    try:
        recs = list(read_jsonl(cfg.scores, required=("label", cfg.score_field), validate=validate))
    except FileNotFoundError:
        raise FileNotFoundError(f"--scores {cfg.scores}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"--scores {cfg.scores}: is a directory (give the scores.jsonl of an eval)") from None
    if not recs:
        raise RecordError(cfg.scores, 0, "no records")
    labels = np.array([int(r["label"]) for r in recs], dtype=np.int64)
    s = np.array([math.nan if r[cfg.score_field] is None else float(r[cfg.score_field]) for r in recs])
    refused = calibration_refusal(labels, s, cfg.min_calibration_samples, cfg.min_calibration_per_class)
    if refused is not None:
        raise ValueError(f"{cfg.scores}: calibration refused, {refused} ({cfg.score_field!r} scores); "
                         f"nothing written to {cfg.output}")
    calibration = _calibrate(labels, s, cfg.target_precision, cfg.target_early_termination)
    calibration.update({"model": cfg.score_field, "data": str(cfg.scores), "created_by": "eval.sufficiency.calibrate"})
    atomic_write_json(cfg.output, calibration)
    print(json.dumps(calibration, indent=2))
    return calibration


if __name__ == "__main__":
    main()
