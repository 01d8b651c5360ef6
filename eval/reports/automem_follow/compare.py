"""What the follow fields (evaluation record v2) change, from a search directory's shared store and traces:

- replay check: every (architecture, batch) played under both records -- per-task success identical?
- per seed, AutoMem's search-batch failures of every round read by the current rules and by the rules before the
  follow fields (the fields stripped): failure-mode counts and the module each round's histogram names.

    python eval/reports/automem_follow/compare.py outputs/automem_follow/search eval/reports/automem_follow/rules.json
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from routers.automem import TaskResult, classify, scope
from routers.automem.diagnosis import FAILURE_MODULE
from routers.io import read_jsonl

NEW_FIELDS = ("evidence_followed", "foreign_injected")


def _mode(r: TaskResult) -> str:
    return scope(r) or classify(r)


def _old(r: TaskResult) -> TaskResult:
    return TaskResult.from_dict({**r.to_dict(), "failure": {k: v for k, v in r.failure.items() if k not in NEW_FIELDS}})


def _module(modes: Counter) -> str | None:
    hist = Counter()
    for m, n in modes.items():
        if m in FAILURE_MODULE:
            hist[FAILURE_MODULE[m]] += n
    return max(hist, key=hist.get) if hist else None


def replay_check(store: Path) -> dict:
    recs = {r["id"]: r["evaluation"] for r in read_jsonl(store, required=("id", "evaluation"))}
    pairs = [(recs[k[: -len(":r2")]], v) for k, v in recs.items() if k.endswith(":r2") and k[: -len(":r2")] in recs]
    same = sum([t["success"] for t in a["results"]] == [t["success"] for t in b["results"]] for a, b in pairs)
    return {"pairs": len(pairs), "identical_per_task_success": same,
            "tasks": sum(len(a["results"]) for a, _ in pairs)}


def rounds(trace: dict) -> list[dict]:
    out = []
    by_round: dict[int, list[TaskResult]] = {}
    for rec in trace["log"]:
        ev = rec["evaluation"]
        if ev["batch"] != "search" or ev["arch"] is None or ev.get("failed"):
            continue
        point = next((p for p in trace["evaluations"] if p["arch"] == ev["arch"]), None)
        if point is None:
            continue
        by_round.setdefault(point["round"], []).extend(
            TaskResult.from_dict(r) for r in ev["results"] if not r["success"])
    for rnd in sorted(by_round):
        new = Counter(_mode(r) for r in by_round[rnd])
        old = Counter(_mode(_old(r)) for r in by_round[rnd])
        out.append({"round": rnd, "failures": len(by_round[rnd]), "modes": dict(new), "modes_before": dict(old),
                    "module": _module(new), "module_before": _module(old)})
    return out


def main(search_dir, out_path) -> dict:
    search_dir = Path(search_dir)
    report = {"search_dir": str(search_dir), "replay": replay_check(search_dir / "evaluations.jsonl"), "seeds": {}}
    for d in sorted(search_dir.glob("seed*")):
        path = d / "automem_trace.json"
        if path.exists():
            report["seeds"][d.name[4:]] = rounds(json.loads(path.read_text()))
    Path(out_path).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
