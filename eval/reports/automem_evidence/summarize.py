"""Per seed and method of a search directory: every evaluated candidate (origin, edit, repair, search accuracy) and
every round's diagnosis (failure mode, module histogram, modes), mean candidate accuracy, into one small JSON.

    python eval/reports/automem_evidence/summarize.py outputs/automem_evidence/search \
        eval/reports/automem_evidence/search_rounds.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def summarize(search_dir) -> dict:
    out: dict = {"search_dir": str(search_dir), "seeds": {}}
    for d in sorted(Path(search_dir).glob("seed*")):
        row = {}
        for path in sorted(d.glob("*_trace.json")):
            t = json.loads(path.read_text())
            cands = [{k: e.get(k) for k in ("round", "arch", "accuracy", "origin", "edit", "repair")}
                     for e in t["evaluations"]]
            accs = [c["accuracy"] for c in cands if c["accuracy"] is not None]
            row[t["method"]] = {
                "baseline_search_accuracy": t["baseline"]["search_accuracy"], "candidates": cands,
                "mean_candidate_accuracy": sum(accs) / len(accs) if accs else None,
                "best_so_far": t["best_so_far"], "best": t.get("best"),
                "diagnosis": [{k: g.get(k) for k in ("round", "failure_mode", "histogram", "modes", "out_of_scope")}
                              for g in t.get("gradients", [])]}
        out["seeds"][d.name[4:]] = row
    return out


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(json.dumps(summarize(sys.argv[1]), indent=1) + "\n")
