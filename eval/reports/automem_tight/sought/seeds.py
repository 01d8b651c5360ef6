"""AutoMem vs random search over seeds run in separate batches (one ``memroute train/eval automem`` pair each).

Each batch directory holds the search's ``summary.json`` and the held-out ``heldout_results.json`` (as the report
folders here keep them). A seed found in several batches is taken from the last one named, so a rerun replaces
its first run. Writes, per seed, both picks with search / validation / held-out accuracy, the evaluations each
method needed (AutoMem's to reach random search's final best search accuracy vs random's own; their means), memory
words injected, agent steps and wall time, then the comparison of ``eval.automem_picks.summarize_rule`` (means, wins / ties / losses, sign test) over
all seeds and over each batch, and a paired plot.

    python eval/reports/automem_tight/sought/seeds.py [--out F.json] BATCH_DIR ...
"""

import argparse
import json
from pathlib import Path

METHODS = ("automem", "random")


def _load(path: Path) -> dict:
    import gzip

    gz = path.with_name(path.name + ".gz")
    if not path.exists() and gz.exists():
        return json.loads(gzip.open(gz, "rt").read())
    return json.loads(path.read_text())


def agent_steps(trace: dict) -> dict:
    """Agent steps the method's rollouts took, per batch (search / validation), no-memory baseline left out: the
    paper's #Steps cost, which memory that solves a task early lowers and injected words do not show."""
    steps = {}
    for entry in trace.get("log", []):
        ev = entry["evaluation"]
        if ev.get("arch") is not None:
            steps[ev["batch"]] = steps.get(ev["batch"], 0) + sum(r.get("steps") or 0 for r in ev["results"])
    return steps


def seed_rows(batch: Path, earlier: dict) -> dict:
    """``{seed: row}`` of one batch directory. A method whose trace this batch lacks (a rerun of one method only)
    keeps its steps from the ``earlier`` row of that seed."""
    summary, heldout = _load(batch / "summary.json"), _load(batch / "heldout_results.json")
    shared = summary["config"]["k"] if summary["config"].get("init", "random") == "random" else 0  # round 1's draws
    rows = {}
    for seed, played in heldout["seeds"].items():
        searched = summary["seeds"].get(seed, {})
        row = {"batch": str(batch), "no_memory": played["no_memory"]["accuracy"], "shared_draws": shared,
               "evaluations_to_random_best": {"automem": searched.get("automem_reaches_random_best_at"),
                                              "random": searched.get("random_best_at")}}
        for m in METHODS:
            h, s = played.get(m) or {}, searched.get(m) or {}
            best = s.get("best") or {}
            row[m] = {"arch": h.get("arch"), "search_accuracy": best.get("search_accuracy"),
                      "validation_accuracy": best.get("validation_accuracy"), "heldout_accuracy": h.get("accuracy"),
                      "by_family": {f: v["accuracy"] for f, v in (h.get("by_family") or {}).items()},
                      "found_at": best.get("found_at"), "search_tokens": s.get("candidate_tokens"),
                      "search_wall_s": s.get("wall_s"),
                      "agent_steps": None}
            trace = batch / f"seed{seed}" / f"{m}_trace.json"
            if trace.exists() or trace.with_name(trace.name + ".gz").exists():
                row[m]["agent_steps"] = agent_steps(_load(trace))
            elif seed in earlier:
                row[m]["agent_steps"] = earlier[seed][m]["agent_steps"]
        rows[seed] = row
    return rows


def fewer_evaluations(rows: dict) -> list:
    """Per seed: AutoMem's evaluations to random search's final best, random's own, and whether that best is one
    of the draws both methods share in round 1 (then AutoMem cannot need fewer)."""
    out = []
    for seed, row in rows.items():
        e = row["evaluations_to_random_best"]
        out.append({"seed": seed, "automem": e["automem"], "random": e["random"],
                    "fewer": e["automem"] is not None and e["random"] is not None and e["automem"] < e["random"],
                    "random_best_is_shared_draw": e["random"] is not None and e["random"] <= row["shared_draws"]})
    return out


def plot(rows: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    from eval.plots import finish_and_save

    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    seeds = sorted(rows, key=int)
    for x, s in enumerate(seeds):
        a, r = rows[s]["automem"]["heldout_accuracy"], rows[s]["random"]["heldout_accuracy"]
        ax.plot([x, x], [r, a], color="gray", linewidth=0.8)
    for m, c in (("automem", "tab:blue"), ("random", "tab:orange")):
        ax.scatter(range(len(seeds)), [rows[s][m]["heldout_accuracy"] for s in seeds], color=c, label=m, zorder=3)
    ax.scatter(range(len(seeds)), [rows[s]["no_memory"] for s in seeds], color="gray", marker="_", s=120,
               label="no memory")
    ax.set_xticks(range(len(seeds)), seeds)
    finish_and_save(fig, ax, path, "seed", "held-out accuracy", "Held-out accuracy of each seed's pick")


def main(argv=None) -> None:
    from eval.automem_picks import summarize_rule
    from routers.base import git_revision, library_versions
    from routers.io import atomic_write_json
    from routers.machine import machine_info

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("batches", nargs="+", type=Path, help="batch folders, later ones override a seed")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("seeds.json"))
    args = parser.parse_args(argv)
    out = args.out
    rows, batches = {}, {}
    for batch in args.batches:
        found = seed_rows(batch, rows)
        rows.update(found)
        batches[str(batch)] = sorted(found, key=int)
    none = sum(row["no_memory"] for row in rows.values()) / len(rows)
    report = {"machine": machine_info(), "versions": library_versions(), "git_revision": git_revision(),
              "batches": batches, "seeds": dict(sorted(rows.items(), key=lambda kv: int(kv[0]))),
              "summary": summarize_rule(rows, none),
              "by_batch": {b: summarize_rule({s: rows[s] for s in ss if rows[s]["batch"] == b}, none)
                           for b, ss in batches.items()},
              "fewer_evaluations": fewer_evaluations(rows)}
    counts = [e for e in report["fewer_evaluations"] if e["automem"] is not None and e["random"] is not None]
    report["evaluations_to_random_best_mean"] = {m: sum(e[m] for e in counts) / len(counts) if counts else None
                                                 for m in METHODS}
    atomic_write_json(out, report)
    plot(rows, out.with_suffix(".png"))
    print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
