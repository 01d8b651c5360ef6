"""Held-out effect of the avoid_when guards on the persistent-world suite: the same architecture with and without them.

Recipe: ``configs/automem/train/worlds_cpu.yaml --world_train_moved 2 --n_search 24 --n_val 24`` (budget 8, k 2),
held-out ``memroute eval automem configs/automem/eval/worlds_cpu.yaml --world_train_moved 2`` (42 tasks after every
system stored the 42 training episodes). Result files beside this script:

* ``guards_seed0_results.json``: seed 0 searched and evaluated with guards (the default now);
* ``guards_seed0_same_picks_off_results.json``: the same picks with ``--memory_guards false``;
* ``guards_on_old_seed{1,2}_results.json``: seed 1's and seed 2's picks of the search without guards (the committed
  12-seed run), evaluated with guards; their numbers without guards are in
  ``eval/reports/automem_stagnation/default_seeds0-11_results.json`` (which the seed-0 ablation reproduces exactly);
* ``route_guards_results.json``: the same picks of seeds 0-2 (one search dir of the three) evaluated with the route
  guard too (``--memory_route_guards true``).

Writes ``compare.json``: per (seed, method) pick the held-out accuracy and per-family accuracies with and without
guards, and the mean difference over the distinct architectures; ``compare_route.json``: the same for the item
guards alone vs item + route guards, and which changed tasks the route guard withheld a unit on (a direct effect)
and which it did not (a knock-on effect: earlier tasks went differently, so memory held other units).
``route_guards_tasks.json`` (per pick and task: success with item guards, with both, units withheld off route) is
written from the held-out runs' ``evaluations.jsonl`` by ``--tasks_from ITEM_EVAL_DIR... --route_eval_dir DIR``.

    python eval/reports/automem_guards/compare.py
"""

from __future__ import annotations

import argparse
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


def compare(pairs, on_name: str, off_name: str, out_file: str) -> dict:
    """Per pick ``(on file, off file, seed)``: held-out accuracy / families with (``on_name``) and without."""
    rows, seen = [], {}
    for on_file, off_file, seed in pairs:
        if not (HERE / on_file).exists():
            continue
        on, off = _load(on_file)["seeds"][seed], _load(off_file)["seeds"][seed]
        for method in ("automem", "random"):
            assert on[method]["arch"] == off[method]["arch"], (seed, method)
            row = {"seed": seed, "method": method, "arch": on[method]["arch"], on_name: _cell(on[method]),
                   off_name: _cell(off[method])}
            row["difference"] = row[on_name]["accuracy"] - row[off_name]["accuracy"]
            rows.append(row)
            seen.setdefault(row["arch"], row["difference"])
    if not rows:
        return {}
    no_memory = _cell(_load(pairs[0][0])["seeds"][pairs[0][2]]["no_memory"])
    diffs = list(seen.values())
    out = {"no_memory": no_memory, "picks": rows,
           "distinct_architectures": len(seen), "mean_difference": statistics.fmean(diffs),
           "higher_same_lower": [sum(d > 1e-9 for d in diffs), sum(abs(d) <= 1e-9 for d in diffs),
                                 sum(d < -1e-9 for d in diffs)]}
    atomic_write_json(HERE / out_file, out)
    for r in rows:
        print(r["seed"], r["method"], r["arch"], round(r[off_name]["accuracy"], 3), "->",
              round(r[on_name]["accuracy"], 3), {f: (round(r[off_name][f], 3), round(r[on_name][f], 3))
                                                 for f in ("fetch", "moved", "unseen")})
    print(out_file, {k: v for k, v in out.items() if k != "picks"})
    return out


def _per_task(eval_dirs) -> dict:
    out: dict = {}
    for d in eval_dirs:
        for line in (Path(d) / "evaluations.jsonl").read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec["arch"] is not None:
                out[rec["arch"]] = {t["task_id"]: t for t in rec["evaluation"]["results"]}
    return out


def write_route_tasks(item_dirs, route_dir) -> None:
    """Per pick and task: success with the item guards alone and with both, and the units withheld off route."""
    item, route = _per_task(item_dirs), _per_task([route_dir])
    rows = {arch: [{"task_id": t, "item_guards": item[arch][t]["success"], "route_guards": r["success"],
                    "off_route": len(r["failure"].get("memory", {}).get("off_route", []))}
                   for t, r in tasks.items()] for arch, tasks in route.items()}
    atomic_write_json(HERE / "route_guards_tasks.json", rows)


def route_effects() -> dict:
    """Changed tasks per pick: where the route guard withheld a unit (direct) and where it did not (knock-on)."""
    p = HERE / "route_guards_tasks.json"
    if not p.exists():
        return {}
    out = {}
    for arch, rows in json.loads(p.read_text(encoding="utf-8")).items():
        changed = [r for r in rows if r["item_guards"] != r["route_guards"]]
        out[arch] = {f"{kind}_{sign}": sum(1 for r in changed if (r["off_route"] > 0) == (kind == "direct")
                                           and r["route_guards"] == (sign == "gained"))
                     for kind in ("direct", "knock_on") for sign in ("gained", "lost")}
        out[arch]["tasks_with_units_off_route"] = sum(r["off_route"] > 0 for r in rows)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks_from", nargs="*", default=None, help="held-out eval dirs run with the item guards")
    ap.add_argument("--route_eval_dir", default=None, help="the held-out eval dir run with the route guard")
    args = ap.parse_args(argv)
    if args.tasks_from and args.route_eval_dir:
        write_route_tasks(args.tasks_from, args.route_eval_dir)
    out = compare(PAIRS, "guards", "no_guards", "compare.json")
    route = [("route_guards_results.json", on_file, seed) for on_file, _, seed in PAIRS]
    out["route"] = compare(route, "route_guards", "item_guards", "compare_route.json")
    if out["route"]:
        out["route"]["effects"] = route_effects()
        atomic_write_json(HERE / "compare_route.json", out["route"])
        print("route guard effects", out["route"]["effects"])
    return out


if __name__ == "__main__":
    main()
