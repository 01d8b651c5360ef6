"""Per held-out evaluation: what the injection judge did in the unseen worlds (tasks with memory injected, tasks
where the site guard withheld a failure's lesson, solved) next to the accuracy by family.

    python eval/reports/automem_site/injections.py outputs/automem_site/replay/evaluations.jsonl \
        > eval/reports/automem_site/injections.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SEEN = {f"world{i}" for i in range(6)}  # the recipe's 6 seen worlds; world100000+ are the unseen ones


def summarize(path: str) -> list[dict]:
    out = []
    for line in Path(path).read_text().splitlines():
        ev = json.loads(line)["evaluation"]
        arch = ev["arch"]
        if isinstance(arch, dict):
            arch = "|".join("+".join(v) if isinstance(v, list) else v for v in arch.values())
        unseen = [r for r in ev["results"] if r["task_id"].split("-")[0] not in SEEN]
        mem = [(r, (r.get("failure") or {}).get("memory") or {}) for r in unseen]
        out.append({"arch": arch, "accuracy": round(ev["accuracy"], 4), "unseen_tasks": len(unseen),
                    "unseen_solved": sum(r["success"] for r in unseen),
                    "unseen_injected": sum(bool(m.get("kept")) for _, m in mem),
                    "unseen_site_withheld": sum(bool(m.get("other_site")) for _, m in mem),
                    "site_withheld_all_tasks": sum(bool(((r.get("failure") or {}).get("memory") or {})
                                                        .get("other_site")) for r in ev["results"])})
    return out


if __name__ == "__main__":
    json.dump(summarize(sys.argv[1]), sys.stdout, indent=1)
    print()
