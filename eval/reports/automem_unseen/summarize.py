"""Search rounds of the unseen-worlds run: per seed and method every candidate (round, origin, edit, search accuracy)
and, for AutoMem, each round's gradient (failure modes, out-of-scope counts), and how often ``memory_misled`` fired.

    python eval/reports/automem_unseen/summarize.py outputs/automem_unseen/search > eval/reports/automem_unseen/search_rounds.json
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def seed_rounds(d: Path) -> dict:
    out = {}
    for method in ("automem", "random"):
        path = d / f"{method}_trace.json"
        if not path.exists():
            continue
        t = json.loads(path.read_text())
        out[method] = {
            "baseline_search_accuracy": t["baseline"]["search_accuracy"],
            "candidates": [{k: e.get(k) for k in ("round", "arch", "accuracy", "origin", "edit", "tokens")}
                           for e in t["evaluations"]],
            "validations": [{k: v.get(k) for k in ("round", "arch", "accuracy", "search_accuracy")}
                            for v in t["validations"]],
            "best": t["best"], "wall_s": t["wall_s"], "candidate_tokens": t["candidate_tokens"]}
        if method == "automem":
            out[method]["gradients"] = [{k: g.get(k) for k in ("round", "module", "failure_mode", "modes",
                                                              "out_of_scope")} for g in t["gradients"]]
    return out


def main(search_dir: str) -> dict:
    root = Path(search_dir)
    seeds = {p.name[4:]: seed_rounds(p) for p in sorted(root.glob("seed*")) if p.is_dir()}
    modes, named = Counter(), Counter()
    for s in seeds.values():
        for g in s.get("automem", {}).get("gradients", []):
            modes.update(g["modes"] or {})
            named[g["failure_mode"]] += 1
    return {"search_dir": search_dir, "seeds": seeds, "failure_modes_over_rounds": dict(modes),
            "gradient_named_mode": dict(named)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "outputs/automem_unseen/search"), indent=1))
