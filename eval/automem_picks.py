"""Does a comparison of AutoMem with random search survive the pick rule? Plays each rule's pick held-out.

Both methods end by validating their best search candidates and reporting one of them by a rule
(``routers.automem.search.final_pick``: best validation, pooled or search accuracy). On the persistent-world suite
the rule alone moved a method's held-out mean by 5-8 points and swung the comparison, so a method difference means
little unless it holds under every rule. ``memroute eval automem ... --compare_final_select true`` recomputes every
trace's pick under each rule from the validations it recorded (no search evaluation is replayed or added), plays
the distinct picks held-out (the evaluation store replays what was played) and writes ``final_select.json`` (per
rule: each seed's picks with search / validation / held-out accuracy; per method the mean and std over seeds; on
how many seeds AutoMem >= / > random search and >= +10 points over no memory; the paired difference and a sign
test) and ``final_select.png``. ``summarize_rule`` also gives the main held-out result its comparison.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from routers.automem.search import FINAL_SELECT, final_pick
from routers.io import atomic_write_json
from routers.logs import get_logger

log = get_logger(__name__)
METHODS = ("automem", "random")
TARGET_GAIN = 0.10  # issue 20: the validated leader beats no memory by >= 10 points


def mean_std(xs) -> dict | None:
    """Mean, population std and count of the non-None values (None when there are none)."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"mean": statistics.fmean(xs), "std": statistics.pstdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def picks_by_rule(traces: dict) -> dict:
    """``{rule: {seed: {method: pick or None}}}``: each trace's reported architecture under every rule."""
    return {rule: {seed: {m: final_pick(tr.get("validations", []), tr.get("evaluations", []), rule)
                          for m, tr in by_method.items()} for seed, by_method in traces.items()}
            for rule in FINAL_SELECT}


def summarize_rule(seeds: dict, none_accuracy: float | None) -> dict:
    """Per method the held-out mean / std over seeds, and the issue's per-seed comparisons (seeds where both
    methods have a held-out accuracy)."""
    from scipy.stats import binomtest

    acc = {m: [(row.get(m) or {}).get("heldout_accuracy") for row in seeds.values()] for m in METHODS}
    both = [(a, r) for a, r in zip(acc["automem"], acc["random"]) if a is not None and r is not None]
    gains = [a - none_accuracy for a in acc["automem"] if a is not None and none_accuracy is not None]
    wins, losses = sum(a > r for a, r in both), sum(a < r for a, r in both)
    return {"heldout": {m: mean_std(acc[m]) for m in METHODS}, "n_seeds": len(both),
            "automem_ge_random": sum(a >= r for a, r in both), "automem_gt_random": wins,
            "automem_gain_ge_10": sum(g >= TARGET_GAIN - 1e-9 for g in gains),
            # paired over seeds; the sign test ignores ties: is "AutoMem wins more seeds than it loses" chance?
            "automem_minus_random": mean_std([a - r for a, r in both]),
            "wins_ties_losses": [wins, len(both) - wins - losses, losses],
            "sign_test_p": binomtest(wins, wins + losses).pvalue if wins + losses else None}


def plot_rules(report: dict, path) -> None:
    from matplotlib.figure import Figure

    from eval.plots import finish_and_save

    fig = Figure(figsize=(6.5, 4.5))
    ax = fig.subplots()
    colors, width = {"automem": "tab:blue", "random": "tab:orange"}, 0.35
    rules = list(report["rules"])
    for j, m in enumerate(METHODS):
        xs = [i + (j - 0.5) * width for i in range(len(rules))]
        means = [((report["rules"][r]["summary"]["heldout"][m] or {}).get("mean") or 0.0) for r in rules]
        ax.bar(xs, means, width, color=colors[m], alpha=0.6, label=f"{m} (mean over seeds)")
        for x, r in zip(xs, rules):
            ys = [(row.get(m) or {}).get("heldout_accuracy") for row in report["rules"][r]["seeds"].values()]
            ys = [y for y in ys if y is not None]
            ax.scatter([x] * len(ys), ys, color=colors[m], edgecolors="black", s=18, zorder=3)
    if report["no_memory_heldout"] is not None:
        ax.axhline(report["no_memory_heldout"], color="gray", linewidth=0.8, linestyle=":", label="no memory")
    ax.set_xticks(range(len(rules)), rules)
    finish_and_save(fig, ax, path, "final pick rule (--final_select)", "held-out accuracy",
                    "Held-out accuracy of each rule's pick (dots: seeds)")


def compare_final_select(traces: dict, play, none: dict, out) -> dict:
    """Plays every trace's pick under each rule held-out (``play(arch_key) -> dict`` with ``accuracy`` and
    ``failed``; a replay when the store has it) and writes ``final_select.json`` and ``final_select.png``."""
    from tqdm.auto import tqdm

    by_rule = picks_by_rule(traces)
    archs = sorted({p["arch"] for seeds in by_rule.values() for row in seeds.values() for p in row.values() if p})
    held = {a: play(a) for a in tqdm(archs, desc="rule picks held-out", unit="arch")}
    report = {"schema_version": 1, "no_memory_heldout": none["accuracy"], "distinct_picks": len(archs), "rules": {}}
    for rule, seeds in by_rule.items():
        rows = {seed: {m: None if p is None else {**p, "heldout_accuracy": None if held[p["arch"]]["failed"]
                                                   else held[p["arch"]]["accuracy"],
                                                   "heldout_by_family": held[p["arch"]].get("by_family")}
                       for m, p in row.items()} for seed, row in seeds.items()}
        report["rules"][rule] = {"seeds": rows, "summary": summarize_rule(rows, none["accuracy"])}
        log.info("final_select %s: %s", rule, report["rules"][rule]["summary"])
    out = Path(out)
    atomic_write_json(out / "final_select.json", report)
    plot_rules(report, out / "final_select.png")
    return report
