"""``memroute bench``: run the selected benchmarks, write ``<name>.json``, ``report.json`` and ``report.md``."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from routers.io import atomic_write_json, atomic_write_text
from eval.bench.common import (BENCHMARKS, NEEDS_SAMPLES, SCHEMA_VERSION, BenchConfig, error_entry, machine_info,
                               resolve_benchmark)
from routers.base import git_revision, library_versions
from routers.models import default_device, resolve_causal_lm
from routers.config import ConfigError, make_arg_parser, parse_config
from routers.logs import get_logger, setup_cli_logging

log = get_logger(__name__)


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


def _markdown_header(cfg: BenchConfig, envelope: dict, device: str) -> str:
    m, v, data_info = envelope["machine"], envelope["versions"], envelope["data"]
    versions = ", ".join(f"{k} {v[k]}" for k in ("python", "torch", "transformers", "peft", "accelerate",
                                                  "sentence-transformers") if k in v)
    return (f"# memroute benchmarks\n\n- machine: {m['platform']}, {m['cpu_count']} CPUs, torch threads "
            f"{m['torch_threads']}, device {device}{' (' + m['cuda'] + ')' if m.get('cuda') else ''}\n"
            f"- versions: {versions}; git {envelope['git_revision'] or 'n/a'}\n"
            f"- model: {cfg.router or cfg.model_name_or_path}; data: {data_info.get('source')} "
            f"({data_info.get('n_samples', 0)} samples)\n"
            f"- ratio: value/baseline for slowdowns (smaller is better), baseline/value for speedups\n\n")


def _check(cfg: BenchConfig) -> None:
    unknown = [w for w in cfg.which if w not in BENCHMARKS]
    if unknown or not cfg.which:
        raise ConfigError(f"--which: unknown benchmark(s) {unknown}; choose from {sorted(BENCHMARKS)}")
    if cfg.n_samples < 1 or cfg.train_steps < 1 or cfg.batch_size < 1 or cfg.generate_new_tokens < 1:
        raise ConfigError("n_samples, train_steps, batch_size and generate_new_tokens must be >= 1")
    if cfg.warmup_steps < 0 or cfg.index_steps < 1 or cfg.memagent_memories < 1:
        raise ConfigError("warmup_steps must be >= 0, index_steps and memagent_memories >= 1")


def _samples(cfg: BenchConfig) -> tuple[list[dict], dict, BaseException | None]:
    """The sufficiency samples when a selected benchmark needs them: (records, data description, error)."""
    if not NEEDS_SAMPLES & set(cfg.which):
        return [], {"source": None, "n_samples": 0, "note": "no selected benchmark needs sufficiency samples"}, None
    try:
        from transformers import AutoTokenizer  # transformers only when a benchmark needs the tokenizer

        from eval.bench.sufficiency import load_samples

        tok_source = cfg.router if cfg.router else resolve_causal_lm(cfg.model_name_or_path)
        records, data_info = load_samples(cfg, AutoTokenizer.from_pretrained(tok_source))
        return records, data_info, None
    except Exception as err:  # noqa: BLE001 - only the benchmarks that need samples fail
        log.warning("no samples for the benchmarks that need them: %s: %s", type(err).__name__, err, exc_info=True)
        return [], {"source": None, "n_samples": 0, "error": f"{type(err).__name__}: {err}"}, err


def _run_one(name: str, cfg: BenchConfig, records: list[dict], device: str, data_info: dict,
             samples_error: BaseException | None) -> dict:
    """One benchmark's result; an unavailable or failing benchmark is an error entry (the others still run)."""
    log.info("%s on %s", name, device)
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
            log.warning("%s failed: %s: %s", name, type(err).__name__, err, exc_info=True)
            res = error_entry(name, err)
    res["wall_s"] = time.perf_counter() - t0
    return res


def run_benchmarks(cfg: BenchConfig) -> dict:
    """Run ``cfg.which``, write ``<name>.json``, ``report.json`` and ``report.md``; return the report.

    A benchmark that is unavailable (its module does not import) or raises is recorded as an error
    entry; the others still run and the report is written. With ``cfg.strict`` a RuntimeError then
    names the failures.
    """
    _check(cfg)
    from routers.models import offline_by_default

    offline_by_default()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    device = cfg.device or default_device()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    records, data_info, samples_error = _samples(cfg)
    envelope = {"schema_version": SCHEMA_VERSION, "machine": machine_info(device), "versions": library_versions(),
                "git_revision": git_revision(), "config": dataclasses.asdict(cfg), "data": data_info}
    results: dict[str, dict] = {}
    for name in cfg.which:
        results[name] = _run_one(name, cfg, records, device, data_info, samples_error)
        atomic_write_json(out / f"{name}.json", {**envelope, **results[name]})
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
    atomic_write_text(out / "report.md", _markdown_header(cfg, envelope, device) + markdown_report(results))
    if failed:
        log.warning("%d benchmark(s) failed or unavailable: %s; see %s/<name>.json", len(failed), sorted(failed), out)
        if cfg.strict:
            raise RuntimeError(f"benchmark(s) failed: {sorted(failed)}; see {out}/<name>.json (report written)")
    return report


def make_parser():
    return make_arg_parser([BenchConfig], prog="memroute bench",
                           description="Run the benchmarks and write a JSON + Markdown report.")


def main(argv=None) -> dict:
    setup_cli_logging()  # a CLI entry point (memroute bench, python -m eval.bench)
    (cfg,) = parse_config(make_parser(), [BenchConfig], argv)
    report = run_benchmarks(cfg)
    print((Path(cfg.output_dir) / "report.md").read_text())
    return report
