"""Summarise the H200 sufficiency sweep (eval/reports/device/README.md) into one JSON + one PNG.

Reads each run's eval folder (metrics.json, scores.jsonl, train_summary.json, train log) as brought back from the
device; AUROC is also split by held-out conversation: conv-26 served as the dev half (selection), conv-30 as test.
    python eval/reports/device/make_sweep_report.py outputs/gpu eval/reports/device
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

from sklearn.metrics import roc_auc_score

# run -> (eval folder, train log, what differs from the common GPU settings)
RUNS = {
    "A": ("evalA", "logs/trainA.log", "LoRA r16 all-linear, lr 4e-4, 2 epochs, from base"),
    "B": ("evalB", "logs/trainB.log", "full fine-tuning, separate frozen teacher, lr 3e-5, 2 epochs, from base"),
    "C": ("evalC", "logs/trainC.log", "continue the CPU stage-3 adapter (r16 all-linear), lr 1e-4, 1 epoch"),
    "D": ("evalD", "logs/trainD.log", "LoRA r64 all-linear, lr 2e-4, 2 epochs, seed 0 (chosen on dev -> recipe)"),
    "D_seed1": ("r2/eS1", "r2/logs/tS1.log", "as D, seed 1"),
    "D_seed2": ("r2/eS2", "r2/logs/tS2.log", "as D, seed 2"),
    "D_3epochs": ("r2/eE3", "r2/logs/tE3.log", "as D, 3 epochs"),
    "D_no_distill": ("r2/eL0", "r2/logs/tL0.log", "as D, lambda_rep 0 (no representation distillation)"),
}
COMMON = ("SmolLM2-135M-Instruct, all 2,603 LoCoMo training samples <= 1024 tokens, batch 16, bf16, "
          "group_by_length, cosine, 20 warmup steps, lambda_rep 0.1 unless noted; 4 runs shared one H200 at a time")


def auroc_split(scores_path: Path) -> dict:
    rows = [json.loads(line) for line in scores_path.open()]
    out = {}
    for name, prefix in (("all", ""), ("dev_conv26", "conv-26/"), ("test_conv30", "conv-30/")):
        sel = [r for r in rows if r["id"].startswith(prefix)]
        out[name] = round(float(roc_auc_score([r["label"] for r in sel], [r["trained"] for r in sel])), 4)
    return out


def train_stats(log: Path) -> dict:
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("{")]
    dicts = [ast.literal_eval(ln) for ln in lines]
    end = next(d for d in dicts if "train_runtime" in d)
    losses = [float(d["loss"]) for d in dicts if "loss" in d]
    return {"train_runtime_s": float(end["train_runtime"]), "steps_per_s": float(end["train_steps_per_second"]),
            "epochs": float(end["epoch"]), "loss_first": losses[0], "loss_last": losses[-1], "loss_curve": losses}


def main(src: str, dst: str) -> None:
    src_p, dst_p = Path(src), Path(dst)
    runs = {}
    for name, (ev, log, what) in RUNS.items():
        m = json.loads((src_p / ev / "metrics.json").read_text())["models"]["trained"]
        runs[name] = {"what": what, "auroc": auroc_split(src_p / ev / "scores.jsonl"), "ap": round(m["ap"], 4),
                      "ece": round(m["ece"], 4), "brier": round(m["brier"], 4),
                      "accuracy_at_0.5": m["at_0.5"]["accuracy"], **train_stats(src_p / log)}
    base = json.loads((src_p / "evalA/metrics.json").read_text())["models"]["base"]
    seeds = [runs[k]["auroc"]["all"] for k in ("D", "D_seed1", "D_seed2")]
    report = {"common": COMMON, "held_out": "320 samples, conv-26 (dev) + conv-30 (test), 160 each",
              "base_auroc": round(base["auroc"], 4), "cpu_best_auroc": 0.839, "target_auroc": 0.85,
              "recipe_seeds_auroc": {"values": seeds, "mean": round(sum(seeds) / 3, 4), "min": min(seeds)},
              "runs": runs}
    (dst_p / "h200_sufficiency_sweep.json").write_text(json.dumps(report, indent=1) + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    names = list(runs)
    for off, key, label in ((-0.27, "dev_conv26", "dev (conv-26)"), (0, "all", "all 320"), (0.27, "test_conv30", "test (conv-30)")):
        ax.bar([i + off for i in range(len(names))], [runs[n]["auroc"][key] for n in names], width=0.27, label=label)
    ax.axhline(0.85, color="k", ls="--", lw=1, label="target 0.85")
    ax.axhline(0.839, color="grey", ls=":", lw=1, label="best CPU run (0.839)")
    ax.axhline(report["base_auroc"], color="r", ls=":", lw=1, label=f"untrained base ({report['base_auroc']:.3f})")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylim(0.5, 0.92); ax.set_ylabel("held-out AUROC"); ax.legend(fontsize=7, loc="lower right")
    ax.set_title("Sufficiency router trained on one H200 (SmolLM2-135M)")
    for n in names:
        ax2.plot(runs[n]["loss_curve"], label=n)
    ax2.set_xlabel("logging step (x10 optimizer steps)"); ax2.set_ylabel("training loss"); ax2.legend(fontsize=7)
    ax2.set_title("Training loss")
    fig.tight_layout()
    fig.savefig(dst_p / "h200_sufficiency_sweep.png", dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
