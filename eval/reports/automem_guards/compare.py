"""Held-out effect of the avoid_when guards on the persistent-world suite: the same architecture with and without them.

Recipe: ``configs/automem/train/worlds_cpu.yaml --world_train_moved 2 --n_search 24 --n_val 24`` (budget 8, k 2),
held-out ``memroute eval automem configs/automem/eval/worlds_cpu.yaml --world_train_moved 2`` (42 tasks after every
system stored the 42 training episodes). Result files beside this script:

* ``guards_seed0_results.json``: seed 0 searched and evaluated with guards (the default now);
* ``guards_seed0_same_picks_off_results.json``: the same picks with ``--memory_guards false``;
* ``guards_on_old_seed{1,2}_results.json``: seed 1's and seed 2's picks of the search without guards (the committed 12-seed run),
  evaluated with guards; their numbers without guards are in
  ``eval/reports/automem_stagnation/default_seeds0-11_results.json`` (which the seed-0 ablation reproduces exactly).

Writes ``compare.json``: per (seed, method) pick the held-out accuracy and per-family accuracies with and without
guards, and the mean difference over the distinct architectures.

    python eval/reports/automem_guards/compare.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from routers.io import atomic_write_json

HERE = Path(__file__).parent
BEFORE = HERE.parent / "automem_stagnation" / "default_seeds0-11_results.json"
# (with guards, without guards, seed)
PAIRS = [("guards_seed0_results.json", "guards_seed0_same_picks_off_results.json", "0"),
         ("guards_on_old_seed1_results.json", BEFORE, "1"), ("guards_on_old_seed2_results.json", BEFORE, "2")]


def _load(p) -> dict:
    p = Path(p)
    return json.loads((p if p.is_absolute() or p.exists() else HERE / p).read_text(encoding="utf-8"))


def _cell(r: dict) -> dict:
    return {"accuracy": r["accuracy"], **{f: v["accuracy"] for f, v in r["by_family"].items()}}


def main() -> dict:
    rows, seen = [], {}
    for on_file, off_file, seed in PAIRS:
        if not (HERE / on_file).exists():
            continue
        on, off = _load(on_file)["seeds"][seed], _load(off_file)["seeds"][seed]
        for method in ("automem", "random"):
            assert on[method]["arch"] == off[method]["arch"], (seed, method)
            row = {"seed": seed, "method": method, "arch": on[method]["arch"], "guards": _cell(on[method]),
                   "no_guards": _cell(off[method])}
            row["difference"] = row["guards"]["accuracy"] - row["no_guards"]["accuracy"]
            rows.append(row)
            seen.setdefault(row["arch"], row["difference"])
    no_memory = _cell(_load(PAIRS[0][0])["seeds"]["0"]["no_memory"])
    diffs = list(seen.values())
    out = {"no_memory": no_memory, "picks": rows,
           "distinct_architectures": len(seen), "mean_difference": statistics.fmean(diffs),
           "higher_same_lower": [sum(d > 1e-9 for d in diffs), sum(abs(d) <= 1e-9 for d in diffs),
                                 sum(d < -1e-9 for d in diffs)]}
    atomic_write_json(HERE / "compare.json", out)
    for r in rows:
        print(r["seed"], r["method"], r["arch"], round(r["no_guards"]["accuracy"], 3), "->",
              round(r["guards"]["accuracy"], 3), {f: (round(r["no_guards"][f], 3), round(r["guards"][f], 3))
                                                   for f in ("fetch", "moved", "unseen")})
    print({k: v for k, v in out.items() if k != "picks"})
    return out


if __name__ == "__main__":
    main()
