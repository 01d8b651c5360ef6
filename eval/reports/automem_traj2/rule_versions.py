"""The same architectures on the same batches under the trajectory rule v1 (an earlier store) and v2 (the store of a
rerun that started from a copy of it): per pair the accuracy under each rule, then the paired summary and the
per-task flips, into one small JSON.

    python eval/reports/automem_traj2/rule_versions.py outputs/automem_evidence/search/evaluations.jsonl \
        outputs/automem_traj2/search/evaluations.jsonl eval/reports/automem_traj2/rule_versions.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from routers.io import read_jsonl


def _records(path) -> list[dict]:
    return list(read_jsonl(path, required=("id", "arch", "batch", "evaluation")))


def compare(old_path, new_path) -> dict:
    old = _records(old_path)
    seen = {r["id"] for r in old}

    def ident(r):
        return r["arch"], r["batch"], tuple(x["task_id"] for x in r["evaluation"]["results"])

    before = {ident(r): r["evaluation"] for r in old}
    pairs, up, down = [], 0, 0
    for r in _records(new_path):
        if r["id"] in seen or ident(r) not in before:
            continue
        a, b = before[ident(r)], r["evaluation"]
        pairs.append({"arch": r["arch"], "batch": r["batch"], "v1": a["accuracy"], "v2": b["accuracy"]})
        for x, y in zip(a["results"], b["results"]):
            up += (not x["success"]) and y["success"]
            down += x["success"] and not y["success"]
    diff = [p["v2"] - p["v1"] for p in pairs]
    return {"pairs": pairs, "n": len(pairs), "mean_change": statistics.fmean(diff) if diff else None,
            "better": sum(d > 0 for d in diff), "worse": sum(d < 0 for d in diff), "same": sum(d == 0 for d in diff),
            "task_flips": {"fail_to_success": up, "success_to_fail": down}}


if __name__ == "__main__":
    Path(sys.argv[3]).write_text(json.dumps(compare(sys.argv[1], sys.argv[2]), indent=1) + "\n")
