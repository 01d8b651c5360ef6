"""Report of the GPU leave-one-corpus-out run (run_gpu.py): report.md, leave_out_gpu.png, train_runs.json.

    python eval/reports/leave_out/sufficiency_gpu/make_report.py [RESULTS_DIR]

RESULTS_DIR is run_gpu.py's results.tgz unpacked (for the trainers' summaries -> train_runs.json); without it the
committed train_runs.json is used. The CPU numbers beside the GPU ones come from ../sufficiency_default/ (same data,
CPU recipe general.yaml, scored in bf16).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent
CORPORA = ("hotpotqa", "locomo", "taubench", "textworld")


def train_runs(results: Path) -> dict:
    runs = {}
    for path in sorted(results.rglob("train_summary.json")):
        s = json.loads(path.read_text())
        losses = [h["loss"] for h in s.get("log_history", []) if "loss" in h]
        runs[str(path.parent.parent.relative_to(results))] = {
            "samples": s.get("samples"), "skipped_too_long": s.get("skipped_too_long"), "steps": s.get("steps"),
            "train_runtime_s": round(s.get("train_runtime_s", 0), 1),
            "last5_loss": round(statistics.fmean(losses[-5:]), 3) if losses else None}
    return runs


def fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def auroc(row: dict, key: str):
    return (row.get(key) or {}).get("auroc")


def table(summary: dict, cpu: dict) -> str:
    lines = ["| mix | left out C | held-out n | base | without C: seed 0 / 1 (mean) | without - base | "
             "general (incl. C): seed 0 / 1 | CPU recipe, same data: without C / general |",
             "|---|---|---|---|---|---|---|---|"]
    for tag, mix in summary["mixes"].items():
        for c in CORPORA:
            r = mix["results"][c]
            seeds = [v for v in (r.get("without_seeds") or {}).get("auroc", {}).values() if v is not None]
            mean = statistics.fmean(seeds) if seeds else auroc(r, "without")
            s = " / ".join(fmt(v) for v in seeds) or fmt(auroc(r, "without"))
            g1 = (r.get("general_s1") or {}).get("trained")
            cpu_row = cpu["results"][c] if tag == "default" else {}
            cpu_txt = f"{fmt(auroc(cpu_row, 'without'))} / {fmt(auroc(cpu_row, 'in_corpus'))}" if cpu_row else ""
            n = r.get("base", {}).get("n")
            over = r.get("base", {}).get("n_over_budget")
            lines.append(f"| {tag} ({r.get('train_without_samples')} without C) | {c} | "
                         f"{n}{f' ({over} over budget)' if over else ''} | {fmt(auroc(r, 'base'))} | {s} "
                         f"({fmt(mean)}) | {mean - auroc(r, 'base'):+.3f} | {fmt(auroc(r, 'in_corpus'))} / {fmt(g1)} | "
                         f"{cpu_txt} |")
    return "\n".join(lines) + "\n"


def calibration(summary: dict) -> str:
    lines = ["| mix | left out C | tau from the other corpora | stop-precision on C | early termination on C | "
             "recalibrated from k = 20 / 40 labels of C: mean precision |", "|---|---|---|---|---|---|"]
    for tag, mix in summary["mixes"].items():
        for c in CORPORA:
            cal = mix["results"][c].get("calibration", {})
            t = cal.get("travel", {})
            rec = " / ".join(fmt(x.get("mean_precision")) for x in cal.get("recalibrated", []))
            lines.append(f"| {tag} | {c} | {fmt(t.get('tau'))} | {fmt(t.get('precision'))} | "
                         f"{fmt(t.get('early_termination_rate'))} | {rec or '-'} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.2))
    bars = [("base", "#bbbbbb"), ("default: without C", "#9ecae1"), ("large: without C", "#3182bd"),
            ("large: general (incl. C)", "#e6550d")]
    width = 0.2
    for j, (label, color) in enumerate(bars):
        for i, c in enumerate(CORPORA):
            tag = "large" if label.startswith("large") else "default"
            r = summary["mixes"][tag]["results"][c]
            if label == "base":
                vals = [auroc(r, "base")]
            elif "general" in label:
                vals = [auroc(r, "in_corpus"), (r.get("general_s1") or {}).get("trained")]
            else:
                vals = list((r.get("without_seeds") or {}).get("auroc", {}).values()) or [auroc(r, "without")]
            vals = [v for v in vals if v is not None]
            x = i + (j - 1.5) * width
            ax.bar(x, statistics.fmean(vals), width, color=color, label=label if i == 0 else None)
            ax.scatter([x] * len(vals), vals, color="black", s=8, zorder=3)
    ax.axhline(0.75, color="red", lw=1, ls="--", label="target 0.75")
    ax.set_xticks(range(len(CORPORA)), CORPORA)
    ax.set_ylim(0.35, 0.9)
    ax.set_ylabel("held-out AUROC (bars: mean of seeds 0, 1; dots: seeds)")
    ax.set_title("Sufficiency router, GPU recipe (general_gpu.yaml), leave-one-corpus-out; SmolLM2-135M, one H200")
    ax.legend(fontsize=8, ncol=3, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    if len(sys.argv) > 1:
        (HERE / "train_runs.json").write_text(json.dumps(train_runs(Path(sys.argv[1])), indent=2) + "\n")
    summary = json.loads((HERE / "summary.json").read_text())
    cpu = json.loads((HERE.parent / "sufficiency_default" / "leave_out.json").read_text())
    runs = json.loads((HERE / "train_runs.json").read_text())
    run_lines = ["| router | samples (skipped > 1,024 tokens) | steps | train s | last-5 loss |",
                 "|---|---|---|---|---|"]
    run_lines += [f"| {name} | {r['samples']} ({r['skipped_too_long']}) | {r['steps']} | {r['train_runtime_s']} | "
                  f"{r['last5_loss']} |" for name, r in runs.items()]
    m = summary.get("machine", {})
    text = (f"# Leave-one-corpus-out, GPU recipe\n\nMachine: {m.get('cuda')} ({m.get('cpu_model')}); versions: "
            f"{json.dumps(summary.get('versions'))}.\n\nHeld-out AUROC:\n\n" + table(summary, cpu)
            + "\nCalibration travel (target stop-precision 0.9; seed 0):\n\n" + calibration(summary)
            + "\nTrainings (each alone on the trainer's clock, several sharing the GPU):\n\n"
            + "\n".join(run_lines) + "\n")
    (HERE / "report.md").write_text(text)
    plot(summary, HERE / "leave_out_gpu.png")
    print(text)


if __name__ == "__main__":
    main()
