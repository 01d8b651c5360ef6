"""The MemAgent routing report per held-out task type, and success vs injected memory tokens.

Overall numbers hide what a router learned: on the persistent-world suite a good Begin choice is a
route-carrying provider for a new goal in a seen world, and *no memory* for a moved object (the memory is
stale) or an unseen world (nothing relevant is stored). Per task type this reports every baseline row (no
memory, each provider, random, oracle), the routed row, which providers Begin picked, how often In injected,
and (when measured) the untrained router's Begin picks; the plot puts success against injected tokens per task
for routed / no memory / each single provider / random / oracle.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Mapping, Sequence

from eval.memagent_metrics import baseline_rows, end_report, option_label, row_metrics


def task_type(task) -> str:
    """``fetch (seen world)`` / ``moved`` / ``fetch (unseen world)`` for the worlds suite, else the TextWorld
    preset (``settings``) or ``all``."""
    meta = getattr(task, "meta", None) or {}
    family = meta.get("family")
    if family == "moved":
        return "moved"
    if family == "fetch":
        return "fetch (seen world)" if meta.get("sibling") else "fetch (unseen world)"
    settings = meta.get("settings")
    if isinstance(settings, Mapping):
        return ",".join(f"{k}={v}" for k, v in sorted(settings.items()))
    return str(settings) if settings else "all"


def _routed_row(runs: Sequence[Mapping]) -> dict:
    decisions = sum(r.get("in_decisions", 0) for r in runs)
    return {**row_metrics(runs), "begin_choices": dict(Counter(option_label(r["begin_provider"]) for r in runs)),
            "in_query_rate": (sum(r["in_queries"] for r in runs) / decisions) if decisions else None,
            **end_report(runs)}


def by_task_type(table: Mapping[str, Mapping], options: Sequence[str | None], tasks: Sequence[str],
                 types: Mapping[str, str], runs: Sequence[Mapping] | None = None,
                 offline: Mapping[str, Mapping] | None = None) -> dict:
    """Per task type: ``n``, the baseline rows, the routed row (+ Begin choices, In query rate) and the trained /
    base routers' offline Begin choices (``offline``: ``{"trained": {task: option label}, "base": ...}``)."""
    groups: dict[str, list[str]] = {}
    for t in tasks:
        groups.setdefault(types.get(t, "all"), []).append(t)
    by_run = {r["task_id"]: r for r in runs or ()}
    out = {}
    for kind, ids in sorted(groups.items()):
        block = {"n": len(ids), "baselines": baseline_rows(table, options, ids)}
        mine = [by_run[t] for t in ids if t in by_run]
        if mine:
            block["routed"] = _routed_row(mine)
        for name, per_task in (offline or {}).items():  # {router name: {task: option label}}
            block[f"begin_offline_{name}"] = dict(Counter(per_task[t] for t in ids if t in per_task))
        out[kind] = block
    return out


def success_vs_tokens_plot(rows: Mapping[str, Mapping], path: str | Path, title: str = "") -> Path:
    """One point per row (routed, no memory, each provider, random, oracle): success rate vs injected tokens."""
    from matplotlib.figure import Figure

    from eval.plots import save_figure

    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for name, row in rows.items():
        x, y = row.get("injected_tokens_per_task"), row.get("success_rate")
        if x is None or y is None:
            continue
        style = {"routed": ("*", 220, "tab:red"), "oracle": ("D", 70, "black"), "random": ("x", 70, "gray"),
                 "None": ("s", 70, "tab:blue")}.get(name, ("o", 55, "tab:green"))
        ax.scatter([x], [y], marker=style[0], s=style[1], c=style[2], zorder=3)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("injected memory tokens per task")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.set_title(title or "Held-out success vs injected memory")
    return save_figure(fig, path)


def write_type_report(metrics: dict, out_dir: Path) -> list[str]:
    """PNG per task type (and overall) of success vs tokens; returns the paths."""
    paths = []
    overall = dict(metrics["baselines"])
    if "routed" in metrics:
        overall["routed"] = metrics["routed"]
    paths.append(str(success_vs_tokens_plot(overall, out_dir / "success_vs_tokens.png", "All held-out tasks")))
    for i, (kind, block) in enumerate((metrics.get("by_task_type") or {}).items()):
        rows = dict(block["baselines"])
        if "routed" in block:
            rows["routed"] = block["routed"]
        name = f"success_vs_tokens_{i}_{''.join(c if c.isalnum() else '_' for c in kind).strip('_')}.png"
        paths.append(str(success_vs_tokens_plot(rows, out_dir / name, f"{kind} ({block['n']} tasks)")))
    return paths


__all__ = ["by_task_type", "success_vs_tokens_plot", "task_type", "write_type_report"]
