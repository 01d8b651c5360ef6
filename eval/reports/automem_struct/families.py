"""Which task families tell architectures apart: per batch (search / validation / held-out) and family (fetch, moved,
unseen world), the solved count of every evaluated architecture and the spread across them. A family where every
architecture solves the same number decides nothing in selection.

    python eval/reports/automem_struct/families.py outputs/automem_b10/search/evaluations.jsonl \
        outputs/automem_b10/eval/evaluations.jsonl > eval/reports/automem_struct/families.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

SEEN = {f"world{i}" for i in range(6)}  # the recipe's 6 seen worlds; world100000+ are the unseen ones


def family(task_id: str) -> str:
    world, kind = task_id.split("-")[:2]
    return kind if world in SEEN else "unseen"


def arch_key(arch) -> str:
    if isinstance(arch, dict):
        return "|".join("+".join(v) if isinstance(v, list) else v for v in arch.values())
    return arch or "no memory"


def summarize(paths: list[str]) -> dict:
    rows: dict[tuple, dict] = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            rec = json.loads(line)
            ev = rec["evaluation"]
            if ev["failed"]:
                continue
            counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
            for r in ev["results"]:
                counts[family(r["task_id"])][0] += bool(r["success"])
                counts[family(r["task_id"])][1] += 1
            rows[(rec["batch"], arch_key(ev["arch"]))] = {f: c for f, c in sorted(counts.items())}
    spread: dict[str, dict] = defaultdict(dict)
    for (batch, arch), counts in rows.items():
        for fam, (solved, total) in counts.items():
            entry = spread[batch].setdefault(fam, {"tasks": total, "solved_counts": defaultdict(int)})
            entry["solved_counts"][solved] += 1
    return {"spread": {b: {f: {"tasks": e["tasks"], "architectures_by_solved": dict(sorted(e["solved_counts"].items()))}
                           for f, e in sorted(fams.items())} for b, fams in sorted(spread.items())},
            "architectures": [{"batch": b, "arch": a, **{f: f"{s}/{t}" for f, (s, t) in c.items()}}
                              for (b, a), c in sorted(rows.items())]}


if __name__ == "__main__":
    json.dump(summarize(sys.argv[1:]), sys.stdout, indent=1)
    print()
