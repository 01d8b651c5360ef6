"""Paired bootstrap of the per-query fusion's Recall@5 on each left-out corpus (issue 21).

Reads the per-question rankings of `memroute eval retrieval --leave_out all ... --output_dir results/leave_out_retriever`
(configs/retriever/README.md) and compares hybrid_without_peak (the encoder trained without C, per-query weight) with
BM25, base MiniLM + 5 points, the same encoder at the fixed min-max 0.5, and the base MiniLM at the per-query weight:
mean difference, 95 % interval over 5,000 resamples of C's questions, questions won / lost.
    python eval/reports/leave_out/retrieval_peak/bootstrap.py [results/leave_out_retriever]   # writes bootstrap.json here
"""
import json
import sys
from pathlib import Path

import numpy as np

R = Path(sys.argv[1] if len(sys.argv) > 1 else "results/leave_out_retriever")


def recall5(path: Path, system: str) -> dict[str, float]:
    return {r["qa_id"]: r["recall@5"] for r in map(json.loads, path.open()) if r["system"] == system}


rng = np.random.default_rng(0)
out = {}
for c in ("hotpotqa", "locomo", "taubench", "textworld"):
    peak = recall5(R / c / "without_peak" / "rankings.jsonl", "hybrid_trained")
    ids = sorted(peak)
    p = np.array([peak[i] for i in ids])
    minmax = {s: recall5(R / c / "without" / "rankings.jsonl", s) for s in ("bm25", "base", "hybrid_trained")}
    base_peak = recall5(R / c / "without_peak" / "rankings.jsonl", "hybrid_base")
    against = {"bm25": [minmax["bm25"][i] for i in ids], "base+0.05": [minmax["base"][i] + 0.05 for i in ids],
               "hybrid_without_minmax0.5": [minmax["hybrid_trained"][i] for i in ids],
               "hybrid_base_peak": [base_peak[i] for i in ids]}
    res = {"n": len(ids), "hybrid_without_peak": round(float(p.mean()), 4)}
    for name, other in against.items():
        d = p - np.array(other)
        boot = [d[rng.integers(0, len(d), len(d))].mean() for _ in range(5000)]
        res[name] = {"diff": round(float(d.mean()), 4),
                     "ci95": [round(float(np.percentile(boot, 2.5)), 4), round(float(np.percentile(boot, 97.5)), 4)]}
        if name != "base+0.05":
            res[name] |= {"won": int((d > 1e-9).sum()), "lost": int((d < -1e-9).sum())}
    out[c] = res
    print(c, json.dumps(res), flush=True)
(Path(__file__).parent / "bootstrap.json").write_text(json.dumps(out, indent=1) + "\n")
