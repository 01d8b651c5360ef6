"""MemAgent evaluation metrics derived from recorded outcomes, without a rollout: reading the held-out
forced-exploration records, the baseline rows (no memory, single providers, random, oracle), the coverage
distribution (paper Table 13), Begin accuracy against the oracle, routing overhead, and Begin decisions on the
recorded probe previews (``offline_begin``) and on the router's own training tasks (``begin_train_fit``).
:mod:`eval.memagent` runs the rollouts and writes the outputs.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

from routers.io import read_jsonl
from routers.memagent.prompts import NONE
from routers.memagent.rollout import EXPLORATION_FIELDS, OUTCOME_FIELDS, validate_exploration  # noqa: F401

# EXPLORATION_FIELDS / validate_exploration: the one record schema, shared with forced exploration; the outcome
# tables need only OUTCOME_FIELDS (records without id / trajectory load too)


# -- exploration records -----------------------------------------------------------------------------
def load_outcomes(path: str, in_policy: str) -> tuple[dict[str, dict[str | None, dict]], list[str]]:
    """{task_id: {option: record}} for one In policy, and the provider names seen (first-seen order).

    A malformed record, or a second record for the same (task, option, policy), names file:line.
    """
    table: dict[str, dict[str | None, dict]] = {}
    providers: list[str] = []

    def validate(rec):
        validate_exploration(rec)
        if rec["in_policy"] == in_policy and rec["begin_provider"] in table.get(rec["task_id"], {}):
            raise ValueError(f"duplicate record for task {rec['task_id']!r}, option {rec['begin_provider']!r}, "
                             f"in_policy {in_policy!r}")
        table.setdefault(rec["task_id"], {})
        if rec["in_policy"] == in_policy:
            table[rec["task_id"]][rec["begin_provider"]] = rec

    for rec in read_jsonl(path, required=OUTCOME_FIELDS, validate=validate):
        p = rec["begin_provider"]
        if p is not None and p not in providers:
            providers.append(p)
    table = {t: row for t, row in table.items() if row}
    if not table:
        raise ValueError(f"{path}: no exploration records with in_policy={in_policy!r}")
    return table, providers


def load_all_outcomes(path: str) -> tuple[dict[str, dict], list[str]]:
    """{in_policy: table} for every In policy in the file, and the provider pool (first-seen order)."""
    policies: list[str] = []
    def validate(rec):
        if not isinstance(rec["in_policy"], str) or not rec["in_policy"]:
            raise ValueError(f"in_policy must be a non-empty string, got {rec['in_policy']!r:.60}")

    for rec in read_jsonl(path, required=("in_policy",), validate=validate):
        if rec["in_policy"] not in policies:
            policies.append(rec["in_policy"])
    tables, pool = {}, []
    for pol in policies:
        tables[pol], pool = load_outcomes(path, pol)
    return tables, pool


def complete_tasks(table: Mapping[str, Mapping], options: Sequence[str | None]) -> list[str]:
    """Tasks that have a record for every option (only those enter the comparison)."""
    return [t for t, row in table.items() if all(o in row for o in options)]


# -- metrics -----------------------------------------------------------------------------------------
def option_label(option: str | None) -> str:
    return NONE if option is None else option


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def row_metrics(records: Sequence[Mapping]) -> dict:
    return {"tasks": len(records), "success_rate": _mean([float(r["success"]) for r in records]),
            "avg_steps": _mean([r["steps"] for r in records]),
            "injected_tokens_per_task": _mean([r.get("injected_tokens", 0) for r in records]),
            "errors": sum(1 for r in records if r.get("error"))}


def oracle_option(row: Mapping[str | None, Mapping], options: Sequence[str | None]) -> str | None:
    """Best solving option: fewest steps, then fewest injected tokens, then pool order (None first)."""
    solving = [(row[o]["steps"], row[o].get("injected_tokens", 0), i, o) for i, o in enumerate(options)
               if row[o]["success"]]
    if not solving:
        raise ValueError("no option solves this task")
    return min(solving)[3]


def baseline_rows(table: Mapping[str, Mapping], options: Sequence[str | None], tasks: Sequence[str]) -> dict:
    """No memory, each provider, random (exact expectation over a uniform choice) and the oracle ceiling."""
    rows = {option_label(o): row_metrics([table[t][o] for t in tasks]) for o in options}
    k = len(options)
    rows["random"] = {
        "tasks": len(tasks),
        "success_rate": _mean([sum(table[t][o]["success"] for o in options) / k for t in tasks]),
        "avg_steps": _mean([sum(table[t][o]["steps"] for o in options) / k for t in tasks]),
        "injected_tokens_per_task": _mean([sum(table[t][o].get("injected_tokens", 0) for o in options) / k
                                           for t in tasks]),
        "errors": sum(1 for t in tasks for o in options if table[t][o].get("error"))}
    chosen = []
    for t in tasks:
        row = table[t]
        solvable = any(row[o]["success"] for o in options)
        chosen.append(row[oracle_option(row, options)] if solvable else row[None])
    rows["oracle"] = {**row_metrics(chosen), "note": "per task the oracle option; unsolvable tasks count the "
                                                      "no-memory rollout"}
    return rows


def coverage_distribution(table: Mapping[str, Mapping], options: Sequence[str | None], tasks: Sequence[str]) -> dict:
    """Paper Table 13: how many of the options solve each task, as a histogram and in the paper's buckets.

    Buckets for N options: 0 (unsolvable), 1-2 (routing-critical), 3..ceil(N/2)-1, ceil(N/2)..N-1, N (all);
    for N = 14 these are the paper's 0 / 1-2 / 3-6 / 7-13 / 14.
    """
    n = len(options)
    counts = [sum(bool(table[t][o]["success"]) for o in options) for t in tasks]
    hist = Counter(counts)
    mid = -(-n // 2)
    spans = [(0, 0), (1, min(2, n - 1)), (3, mid - 1), (max(3, mid), n - 1), (n, n)]
    names = {0: "0 (unsolvable)", n: f"{n} (all correct)"}
    buckets = {}
    for lo, hi in spans:
        if lo > hi:
            continue
        name = names.get(lo) if lo == hi and lo in names else (
            f"{lo}-{hi} (routing-critical)" if lo == 1 else f"{lo}-{hi}")
        c = sum(hist.get(i, 0) for i in range(lo, hi + 1))
        buckets[name] = {"tasks": c, "share": c / len(tasks) if tasks else None}
    return {"options": n, "histogram": {str(i): hist.get(i, 0) for i in range(n + 1)}, "buckets": buckets,
            "per_task": {t: c for t, c in zip(tasks, counts)}}


def begin_accuracy(choices: Mapping[str, str | None], table: Mapping[str, Mapping],
                   options: Sequence[str | None]) -> dict:
    """Router Begin choices vs the oracle, on tasks some option solves.

    ``solving``: the chosen option solved the task in exploration; ``exact``: it is the oracle's label.
    The confusion matrix counts (oracle label, routed choice) over the same tasks.
    """
    idx = {o: i for i, o in enumerate(options)}
    matrix = [[0] * len(options) for _ in options]
    solving = exact = n = 0
    for t, choice in choices.items():
        row = table.get(t)
        if row is None or not all(o in row for o in options) or not any(row[o]["success"] for o in options):
            continue
        if choice not in idx:
            raise ValueError(f"task {t}: routed choice {choice!r} is not an option")
        label = oracle_option(row, options)
        n += 1
        solving += bool(row[choice]["success"])
        exact += choice == label
        matrix[idx[label]][idx[choice]] += 1
    return {"solvable_tasks": n, "accuracy_solving": solving / n if n else None,
            "accuracy_exact": exact / n if n else None,
            "confusion": {"labels": [option_label(o) for o in options], "rows": "oracle", "columns": "routed",
                          "matrix": matrix}}


def overhead(runs: Sequence[Mapping]) -> dict:
    """Routing time (probe + router decisions) as a share of the whole task's wall time."""
    probe = sum(r["probe_s"] for r in runs)
    router = sum(r["router_s"] for r in runs)
    task = sum(r["task_s"] for r in runs)
    return {"probe_s_per_task": probe / len(runs) if runs else None,
            "router_s_per_task": router / len(runs) if runs else None,
            "task_s_per_task": task / len(runs) if runs else None,
            "share": (probe + router) / task if task > 0 else None,
            "probe_share": probe / task if task > 0 else None, "router_share": router / task if task > 0 else None}


def routed_metrics(runs: Sequence[Mapping]) -> dict:
    out = row_metrics(runs)
    out.update({"begin_injected_tokens_per_task": _mean([r["begin_tokens"] for r in runs]),
                "in_injected_tokens_per_task": _mean([r["in_tokens"] for r in runs]),
                "in_queries_per_task": _mean([r["in_queries"] for r in runs]),
                "in_query_rate": (sum(r["in_queries"] for r in runs) / sum(r.get("in_decisions", 0) for r in runs)
                                  if sum(r.get("in_decisions", 0) for r in runs) else None),
                "begin_choices": dict(Counter(option_label(r["begin_provider"]) for r in runs)),
                "overhead": overhead(runs)})
    out.update(end_report(runs))
    return out


def end_decisions(router, runs: Sequence[dict], providers: Mapping[str, Any]) -> None:
    """What the router's End would store for each routed trajectory, as ``run["end_choice"]`` (provider names).
    Evaluation keeps the stores frozen, so these are reported, not applied."""
    from tqdm.auto import tqdm

    from routers.memagent.protocol import Trajectory

    for r in tqdm(runs, desc="End decisions", unit="task"):
        if "end_choice" not in r and isinstance(r.get("trajectory"), dict):
            r["end_choice"] = router.end(Trajectory.from_dict(r["trajectory"]), providers)


def end_report(runs: Sequence[Mapping]) -> dict:
    """End's storage choices (``"memp+voyager"``, ``"None"``: store nowhere) and how often it stores anything
    after a success and after a failure (a useful End keeps successes, skips failures). Empty without choices."""
    ends = [r for r in runs if "end_choice" in r]
    if not ends:
        return {}
    def store_rate(success: bool):
        group = [bool(r["end_choice"]) for r in ends if bool(r["success"]) == success]
        return _mean([float(x) for x in group])
    return {"end_choices": dict(Counter("+".join(r["end_choice"]) or NONE for r in ends)),
            "end_store_rate": {"after_success": store_rate(True), "after_failure": store_rate(False)}}


# -- report --------------------------------------------------------------------------------------------
def evaluate(table: Mapping[str, Mapping], options: Sequence[str | None], runs: Sequence[Mapping] | None) -> dict:
    """All metrics from the exploration table (baselines, oracle, coverage) and the routed runs."""
    tasks = complete_tasks(table, options)
    if not tasks:
        raise ValueError(f"no task has exploration records for all {len(options)} options")
    rows = baseline_rows(table, options, tasks)
    singles = {option_label(o): rows[option_label(o)]["success_rate"] for o in options if o is not None}
    best = max(singles, key=singles.get) if singles else None
    out = {"tasks": len(tasks), "options": [option_label(o) for o in options],
           "baselines": rows, "best_single_provider": best, "coverage": coverage_distribution(table, options, tasks)}
    if runs is not None:
        done = [r for r in runs if r["task_id"] in set(tasks)]
        routed = routed_metrics(done)
        none_rate = rows[NONE]["success_rate"]
        routed["delta_vs_no_memory"] = (routed["success_rate"] - none_rate) if done else None
        routed["delta_vs_best_single"] = (routed["success_rate"] - singles[best]) if done and best else None
        out["routed"] = routed
        out["begin"] = begin_accuracy({r["task_id"]: r["begin_provider"] for r in done}, table, options)
    return out


def offline_begin(router, task_records: Mapping[str, Mapping], providers: Mapping[str, Any],
                  table: Mapping[str, Mapping], options: Sequence[str | None], tasks: Sequence[str]) -> dict:
    """Begin decisions from the recorded probe previews (no rollouts): accuracy vs the oracle and the success
    rate they imply under the baseline In policy (the chosen option's exploration outcome)."""
    choices = {}
    for t in tasks:
        rec = task_records[t]
        previews = [p for p in rec["previews"] if p["provider"] in providers]
        choices[t] = router.begin(rec["goal"], previews, providers)
    acc = begin_accuracy(choices, table, options)
    return {"tasks": len(choices), "implied_success_rate": _mean([float(table[t][c]["success"]) for t, c in choices.items()]),
            "choices": dict(Counter(option_label(c) for c in choices.values())),
            "per_task": {t: option_label(c) for t, c in choices.items()},
            **{k: v for k, v in acc.items() if k != "confusion"}, "confusion": acc["confusion"]}


def begin_train_fit(router, task_records: Mapping[str, Mapping], labels: Sequence[Mapping],
                    providers: Mapping[str, Any]) -> dict:
    """The router's Begin decisions on its own training tasks (``begin.jsonl`` labels, recorded previews).

    Why: with a few dozen labels, SFT can learn the label *marginal* and ignore the prompt: every task then gets
    the same option probabilities (the label shares) and the majority option. ``prob_spread`` (the standard
    deviation over tasks of each option's probability, averaged over options) is ~0 for such a router;
    ``accuracy`` tells memorized from not learned; ``majority_share`` is what the majority label alone scores."""
    import torch

    picks, probs, gold = [], [], []
    for lab in labels:
        rec = task_records.get(lab["task_id"])
        if rec is None:
            continue
        previews = [p for p in rec["previews"] if p["provider"] in providers]
        options, scores = router.score_begin(rec["goal"], previews, providers)
        if scores is None:
            continue
        picks.append(options[int(torch.argmax(scores))])
        probs.append(torch.softmax(scores.float(), dim=0))
        gold.append(lab["decision"])
    if not picks:
        return {"tasks": 0}
    spread = float(torch.stack(probs).std(dim=0, unbiased=False).mean()) if len(probs) > 1 else 0.0
    majority = Counter(gold).most_common(1)[0][1]
    return {"tasks": len(picks), "accuracy": _mean([float(a == b) for a, b in zip(picks, gold)]),
            "majority_share": majority / len(gold), "prob_spread": round(spread, 6),
            "labels": dict(Counter(option_label(g) for g in gold)),
            "choices": dict(Counter(option_label(c) for c in picks))}


def oracle_any(tables: Mapping[str, Mapping], options: Sequence[str | None], tasks: Sequence[str]) -> dict:
    """Share of tasks solved by any (Begin option, In policy) combination explored."""
    solved = [any(tab.get(t, {}).get(o, {}).get("success", False) for tab in tables.values() for o in options)
              for t in tasks]
    return {"tasks": len(tasks), "success_rate": sum(solved) / len(solved) if solved else None,
            "in_policies": sorted(tables)}

