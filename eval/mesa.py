"""MESA evaluation on the held-out test episodes (``memroute eval mesa``).

    memroute eval mesa configs/mesa/eval/default.yaml [--search_dir outputs/mesa/locomo/search --backend ...]

For every seed searched by ``memroute train mesa`` (its ``seed<S>/trace.json`` holds the split, lam, t_ref and
the chosen policy) the test split is read from the sweep and every method selects a subset per question:

* ``single:<name>`` (5), ``all_five``, ``random`` (a uniform non-empty subset per question, seeded);
* ``llm_zero_shot``: an LLM reads the question and previews and names the structures (only with ``backend``;
  otherwise n/a);
* ``route_to_one``: a learned policy that picks exactly one structure (the best single structure per question
  type, fitted on train + validation with the search's objective);
* ``best_fixed``: the one subset with the best J - lam C on train + validation;
* ``mesa``: the searched selector.

Per method: evidence_recall and f1 (questions with a reader score) means, structures and evidence tokens per
question, each a mean +- sample std over seeds (one value per seed = the mean over its test questions).
Writes ``mesa_eval.json`` (config, per-seed rows, summary, targets), ``mesa_eval.md`` and ``mesa_eval.png``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from routers.config import make_arg_parser, parse_config, save_resolved_config
from routers.io import OutputLock, atomic_write_json, atomic_write_text
from routers.logs import get_logger, setup_cli_logging
from routers.mesa.policies import FitData, Policy, best_mask, fit_policy
from routers.mesa.search_data import SweepTable
from routers.mesa.selector_view import FULL_MASK, STRUCTURES, key_of, mask_of

log = get_logger(__name__)
SCORE_COLUMNS = ("evidence_recall", "f1")


@dataclass
class MesaEvalConfig:
    sweep: str | None = field(default=None, metadata={"help": "sweep.jsonl of the structure sweep (required)"})
    search_dir: str | None = field(default=None, metadata={"help": "output_dir of memroute train mesa (required)"})
    output_dir: str = "results/mesa_eval"
    seeds: list[int] | None = field(default=None, metadata={"help": "default: every seed in search_dir/summary.json"})
    backend: str | None = field(default=None, metadata={"help": "LLM for the zero-shot baseline (else n/a)"})
    random_seed: int = 0

    def __post_init__(self):
        missing = [k for k in ("sweep", "search_dir") if not getattr(self, k)]
        if missing:
            raise ValueError(f"{missing} required: the sweep.jsonl and the output_dir of memroute train mesa")


def _selections(cfg, trace: dict, table: SweepTable, views, backend) -> dict[str, list[int]]:
    split, lam, t_ref = trace["split"], trace["lam"], trace["t_ref"]
    trval = table.subset(split["train"] + split["val"])
    data = FitData.from_table(trval, lam, t_ref)
    out = {f"single:{n}": [mask_of([n])] * len(views) for n in STRUCTURES}
    out["all_five"] = [FULL_MASK] * len(views)
    rng = np.random.default_rng([cfg.random_seed, trace["seed"]])
    out["random"] = [int(m) for m in rng.integers(1, FULL_MASK + 1, size=len(views))]
    if backend is not None:
        from routers.mesa.search_llm import zero_shot_select

        out["llm_zero_shot"] = [mask_of(s) for s in zero_shot_select(backend, views)]
    one = fit_policy("parsimony", {"mu": 0.0, "max_size": 1}, data)
    out["route_to_one"] = [one.select_mask(v) for v in views]
    fixed = Policy.fixed(key_of(best_mask(data.Q) or FULL_MASK))
    out["best_fixed"] = [fixed.select_mask(v) for v in views]
    mesa = Policy.from_dict(trace["best"]["policy"])
    out["mesa"] = [mesa.select_mask(v) for v in views]
    return out


def _seed_rows(records_by_id, test_ids, masks: list[int]) -> dict:
    row: dict = {}
    for score in SCORE_COLUMNS:
        vals = [records_by_id[i]["subsets"][key_of(m)][score] for i, m in zip(test_ids, masks)]
        vals = [v for v in vals if v is not None]
        row[score] = float(np.mean(vals)) if vals else None
        row[f"n_{score}"] = len(vals)
    row["structures"] = float(np.mean([bin(m).count("1") for m in masks]))
    row["evidence_tokens"] = float(np.mean([records_by_id[i]["subsets"][key_of(m)]["tokens"] for i, m in zip(test_ids, masks)]))
    return row


def _agg(values: list) -> dict | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"mean": float(np.mean(vals)), "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0, "n_seeds": len(vals)}


def markdown(summary: dict, counts: dict | None = None) -> str:
    head = "| method | evidence_recall | f1 | structures / query | evidence tokens / query |\n|---|---|---|---|---|"
    lines = [head]
    fmt = lambda a, d=3: "n/a" if a is None else f"{a['mean']:.{d}f} ± {a['std']:.{d}f}"  # noqa: E731
    for name, m in summary.items():
        lines.append(f"| {name} | {fmt(m['evidence_recall'])} | {fmt(m['f1'])} | {fmt(m['structures'], 2)} | "
                     f"{fmt(m['evidence_tokens'], 0)} |")
    if counts:
        lines.append(f"\nTest questions per seed (mean): {counts['evidence_recall']:.0f} with evidence_recall, "
                     f"{counts['f1']:.0f} with a reader f1.")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path) -> None:
    from matplotlib.figure import Figure

    from eval.plots import save_figure

    fig = Figure(figsize=(11, 4.5))
    axes = fig.subplots(1, 2)
    for ax, score in zip(axes, SCORE_COLUMNS):
        for name, m in summary.items():
            if m[score] is None:
                continue
            ax.errorbar(m["evidence_tokens"]["mean"], m[score]["mean"], xerr=m["evidence_tokens"]["std"],
                        yerr=m[score]["std"], fmt="*" if name == "mesa" else "o", markersize=12 if name == "mesa" else 6,
                        capsize=3, label=name)
        ax.set_xlabel("evidence tokens per question")
        ax.set_ylabel(f"{score} (test, mean ± std over seeds)")
        ax.grid(alpha=0.3)
    axes[0].set_title("MESA vs fixed structure choices")
    (axes[1] if axes[1].get_legend_handles_labels()[0] else axes[0]).legend(fontsize="x-small", loc="best")
    save_figure(fig, path)


def targets(s: dict) -> dict:
    mesa, allf = s["mesa"], s["all_five"]
    singles = [k for k in s if k.startswith("single:")]
    out = {"tokens_vs_all_five": mesa["evidence_tokens"]["mean"] / max(allf["evidence_tokens"]["mean"], 1e-9),
           ">=30%_fewer_tokens_than_all_five": mesa["evidence_tokens"]["mean"] <= 0.7 * allf["evidence_tokens"]["mean"]}
    for score in SCORE_COLUMNS:
        if mesa[score] is None:
            continue
        m = mesa[score]["mean"]
        best_single = max(singles, key=lambda k: s[k][score]["mean"])
        out[f"{score}:mesa_minus_all_five"] = m - allf[score]["mean"]
        out[f"{score}:at_least_all_five"] = m >= allf[score]["mean"]
        out[f"{score}:above_route_to_one"] = m > s["route_to_one"][score]["mean"]
        out[f"{score}:above_best_single({best_single})"] = m > s[best_single][score]["mean"]
    return out


def run(cfg: MesaEvalConfig) -> dict:
    from routers.mesa.sweep_format import read_sweep

    records = read_sweep(cfg.sweep)
    search = Path(cfg.search_dir)
    seeds = cfg.seeds
    if seeds is None:
        summary_file = search / "summary.json"
        if not summary_file.exists():
            raise FileNotFoundError(f"{summary_file}: not found (run memroute train mesa, or give --seeds)")
        seeds = [int(s) for s in json.loads(summary_file.read_text(encoding="utf-8"))["seeds"]]
    backend = None
    if cfg.backend:
        from routers.backends import make_backend

        backend = make_backend(cfg.backend)
    by_id = {r["id"]: r for r in records}
    per_seed: dict = {}
    with OutputLock(cfg.output_dir):
        save_resolved_config(cfg.output_dir, cfg)
        for seed in seeds:
            trace_file = search / f"seed{seed}" / "trace.json"
            if not trace_file.exists():
                raise FileNotFoundError(f"{trace_file}: no search trace for seed {seed}")
            trace = json.loads(trace_file.read_text(encoding="utf-8"))
            table = SweepTable.from_records(records, trace.get("score", "evidence_recall"))
            test_eps = set(trace["split"]["test"])
            test_recs = [r for r in records if r["episode_id"] in test_eps]
            views = SweepTable.from_records(test_recs).views
            sel = _selections(cfg, trace, table, views, backend)
            ids = [r["id"] for r in test_recs]
            per_seed[str(seed)] = {"n_test_questions": len(ids), "test_episodes": sorted(test_eps),
                                   "methods": {name: _seed_rows(by_id, ids, masks) for name, masks in sel.items()}}
        names = list(next(iter(per_seed.values()))["methods"])
        if "llm_zero_shot" not in names:
            names.insert(names.index("route_to_one"), "llm_zero_shot")
        summary = {}
        for name in names:
            rows = [p["methods"].get(name) for p in per_seed.values()]
            summary[name] = {c: (_agg([r[c] for r in rows]) if all(rows) else None)
                             for c in (*SCORE_COLUMNS, "structures", "evidence_tokens")}
        counts = {c: float(np.mean([p["methods"]["all_five"][f"n_{c}"] for p in per_seed.values()]))
                  for c in SCORE_COLUMNS}
        report = {"schema_version": 1, "task": "MESA structure selection on held-out episodes", "config": asdict(cfg),
                  "seeds": seeds, "objective_score": trace.get("score"), "lam": trace["lam"],
                  "test_questions_per_seed": counts, "methods": summary, "per_seed": per_seed, "targets": targets(summary),
                  "files": {"markdown": "mesa_eval.md", "plot": "mesa_eval.png"}}
        out = Path(cfg.output_dir)
        atomic_write_json(out / "mesa_eval.json", report)
        atomic_write_text(out / "mesa_eval.md", markdown(summary, counts))
        plot(summary, out / "mesa_eval.png")
    log.info("MESA eval over seeds %s written to %s", seeds, cfg.output_dir)
    return report


def make_parser():
    return make_arg_parser([MesaEvalConfig], prog="memroute eval mesa",
                           description="MESA selector vs single structures, all five, random, route-to-one, best fixed.")


def main(argv=None) -> dict:
    from routers.models import offline_by_default

    offline_by_default()
    setup_cli_logging()
    (cfg,) = parse_config(make_parser(), [MesaEvalConfig], argv)
    report = run(cfg)
    print(markdown(report["methods"], report["test_questions_per_seed"]))
    print(json.dumps(report["targets"], indent=1))
    return report


if __name__ == "__main__":
    main()
