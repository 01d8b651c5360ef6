"""The world-guard run against the run before it (same recipes, ``--memory_world_guards false`` then): per seed and
method the pick, its search / validation / held-out accuracy and held-out accuracy by task family.

    python eval/reports/automem_world/compare.py eval/reports/automem_unseen/results.json \
        eval/reports/automem_world/results.json > eval/reports/automem_world/compare.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(results: dict) -> dict:
    out = {}
    for seed, r in sorted(results["seeds"].items()):
        out[seed] = {}
        for method in ("no_memory", "automem", "random"):
            p = r.get(method)
            if not p:
                continue
            out[seed][method] = {"arch": p.get("arch"), "heldout": round(p["accuracy"], 4),
                                 "search": p.get("search_accuracy"), "validation": p.get("validation_accuracy"),
                                 "by_family": {f: round(v["accuracy"], 4) for f, v in p["by_family"].items()},
                                 "tokens": p.get("tokens"), "found_at": p.get("found_at")}
    return out


def main(before_path: str, after_path: str) -> dict:
    before, after = (json.loads(Path(p).read_text()) for p in (before_path, after_path))
    b, a = rows(before), rows(after)
    per_seed = {s: {"before": b.get(s), "after": a[s]} for s in a}
    mean = {}
    for name, rs in (("before", b), ("after", a)):
        for method in ("no_memory", "automem", "random"):
            vals = [r[method]["heldout"] for r in rs.values() if method in r]
            mean.setdefault(name, {})[method] = round(sum(vals) / len(vals), 4) if vals else None
    wtl = [sum(1 for r in a.values() if cmp(r["automem"]["heldout"], r["random"]["heldout"]))
           for cmp in (lambda x, y: x > y, lambda x, y: x == y, lambda x, y: x < y)]
    return {"before": before_path, "after": after_path, "mean_heldout": mean, "after_wins_ties_losses": wtl,
            "seeds": per_seed}


if __name__ == "__main__":
    json.dump(main(*sys.argv[1:3]), sys.stdout, indent=1)
    print()
