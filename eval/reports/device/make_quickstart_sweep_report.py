"""Issue 16: held-out AUROC (measured on one H200) vs modelled 2-core-CPU minutes for each sufficiency training path.

Reads the two sweep JSONs written by quickstart_sweep.py (same data as the quickstart: 433 training samples of
LoCoMo's 8 training conversations, or the full 2,353 <= 512 tokens; held-out conv-26/30: the quickstart's 120
samples and the recipe's 320) and writes quickstart_sweep.png + quickstart_sweep.md beside them.

CPU cost model, calibrated on the measured idle CPU quickstart (top 4 layers, 3 epochs, 153k training tokens:
caching 26 layers 219 s, training 208 s): a full forward runs ~607 tokens/s; forward + backward of a trained layer
costs 2.06x its forward. Minutes = tokens / 607 * ((L - K) / L + epochs * K / L * 2.06) / 60, L = 30 layers,
K = trained layers (K = L for LoRA on every layer, with no caching pass).
"""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent
L, TOK_S, BWD = 30, 607.0, 2.06
TOKENS = {"q": 153_125, "m": 153_125 * 780 / 433, "h": 153_125 * 1173 / 433, "f": 153_125 * 2353 / 433}


def cpu_minutes(prefix: str, k: int | None, epochs: float) -> float:
    k = k or L
    return TOKENS[prefix] / TOK_S * ((L - k) / L + epochs * k / L * BWD) / 60


def main():
    runs = {}
    for name in ("h200_quickstart_sweep1.json", "h200_quickstart_sweep2.json"):
        runs.update(json.loads((HERE / name).read_text())["results"])
    rows = []
    for name, r in sorted(runs.items()):
        if "qs" not in r:
            continue
        spec = r["spec"]
        rows.append({"name": name, "data": name[0], "k": spec["top_k"] or L, "lora": spec["lora"], "r": spec["r"],
                     "lr": spec["lr"], "epochs": spec["epochs"], "seed": spec["seed"],
                     "auroc_qs": r["qs"]["trained"]["auroc"], "auroc_full": r["full"]["trained"]["auroc"],
                     "cpu_min": cpu_minutes(name[0], spec["top_k"], spec["epochs"])})
    base = next(r for r in runs.values() if "base" in r.get("qs", {}))
    lines = ["| run | data | trained layers | adapter | lr | epochs | seed | AUROC quickstart eval (120) | AUROC recipe eval (320) | modelled CPU min (train) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["data"], r["k"], r["lr"], r["epochs"], r["seed"])):
        lines.append(f"| {r['name']} | {dict(q='433', m='780', h='1,173', f='2,353')[r['data']]} | {r['k']} | "
                     f"{'LoRA r' + str(r['r']) if r['lora'] else 'full FT'} | {r['lr']:g} | {r['epochs']} | {r['seed']} | "
                     f"{r['auroc_qs']:.3f} | {r['auroc_full']:.3f} | {r['cpu_min']:.0f} |")
    lines.append(f"| base SmolLM2-135M (zero-shot) | | | | | | | {base['qs']['base']['auroc']:.3f} | "
                 f"{base['full']['base']['auroc']:.3f} | |")
    (HERE / "quickstart_sweep.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for data, marker, label in (("q", "o", "433 samples (quickstart data)"), ("m", "s", "780"), ("h", "D", "1,173"),
                                ("f", "^", "2,353 (all <= 512 tokens)")):
        pts = [r for r in rows if r["data"] == data]
        if pts:
            sc = ax.scatter([p["cpu_min"] for p in pts], [p["auroc_full"] for p in pts], c=[p["k"] for p in pts],
                            cmap="viridis", vmin=4, vmax=30, marker=marker, label=label, edgecolors="k")
    ax.axhline(base["full"]["base"]["auroc"], ls=":", c="grey", label="base (zero-shot)")
    ax.axhline(0.75, ls="--", c="r", lw=0.8, label="target 0.75")
    ax.set_xlabel("modelled training minutes on 2 CPU cores (fp32; caching + epochs)")
    ax.set_ylabel("held-out AUROC (320 samples, conv-26/30)")
    ax.set_title("Sufficiency router: AUROC vs CPU cost (colour = trained layers K)")
    fig.colorbar(sc, ax=ax, label="trained layers K")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(HERE / "quickstart_sweep.png", dpi=120)


if __name__ == "__main__":
    main()
