"""Evaluate the MemAgent router on held-out tasks against no memory, single providers, random and the oracle.

    memroute eval memagent configs/memagent_eval.yaml [--max_tasks 8 ...]

Two sources, both on the held-out split with the long-term stores **frozen** (built from training tasks
only; nothing is stored while evaluating, so every row sees the same memory and End is not exercised):

* baseline rows come from the held-out forced-exploration records (one rollout per task x Begin option x
  In policy, written by ``data_synthesis.memagent``): no memory, each single provider, random routing
  (the exact expectation of a uniform choice over the options, not a sample) and the oracle ceiling (a
  task counts as solved when any option solved it). They use the In policy ``baseline_in_policy``.
* the routed row runs real rollouts: per task the router sees every provider's probe preview, picks the
  Begin provider, and decides Query/NoOp at each step; probe, router and whole-task wall times are
  measured so the routing overhead is a share of the task time.

Also: Begin decision accuracy against the oracle (the routed choice solved the task in exploration; and
exact agreement with the oracle's label: the solving option with the fewest steps, then the fewest
injected tokens, then pool order with None first), the paper's Table 13 coverage distribution, injected
tokens per task and average steps; and ``begin_offline``: Begin decisions on the recorded probe previews
(no rollouts) for the trained router and the untrained base model (paper Table 12), with the success rate
those choices imply under the baseline In policy. Writes ``metrics.json``, ``routed.jsonl`` (resumable, one line per
task), ``begin_confusion.png``, ``coverage.png`` and ``resolved_config.yaml`` into ``output_dir``.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from data_synthesis.jsonl import ResumableJsonlWriter, atomic_write_json, read_jsonl
from routers.memagent.prompts import NONE

EXPLORATION_FIELDS = ("task_id", "begin_provider", "in_policy", "success", "steps")


@dataclass
class MemAgentEvalConfig:
    router: str | None = field(default="outputs/memagent_router/export", metadata={
        "help": "MemAgentRouter export directory; None/'none' = baseline rows only (no routed rollouts)."})
    exploration_dir: str = field(default="outputs/memagent_data", metadata={
        "help": "output_dir of `memroute synth forced-exploration`: heldout/exploration.jsonl (baselines), "
                "heldout/tasks.jsonl (Begin memories), stores/ (frozen), manifest.json + resolved_config.yaml "
                "(the environment, agent and providers the routed rollouts rebuild)"})
    output_dir: str = "results/memagent_eval"
    baseline_in_policy: str = field(default="never", metadata={"help": "In policy of the main baseline rows"})
    max_tasks: int | None = field(default=None, metadata={"help": "only the first N complete tasks (N >= 1)"})
    providers: list[str] | None = field(default=None, metadata={
        "help": "provider subset offered to the router; None = every provider explored"})
    compare_base_router: bool = field(default=True, metadata={
        "help": "also score Begin offline (recorded previews, no rollouts) with the untrained base model"})
    base_model: str | None = field(default=None, metadata={"help": "untrained baseline; default: the router's base_model"})
    reuse_retrieved: bool = field(default=True, metadata={
        "help": "inject the Begin memories recorded in heldout/tasks.jsonl (exactly what the baseline rollouts "
                "saw); false = retrieve live from the frozen stores"})
    device: str | None = None

    def __post_init__(self):
        # plain ValueErrors: parse_config reports them as a ConfigError naming the recipe or the command line
        if self.max_tasks is not None and self.max_tasks < 1:
            raise ValueError(f"max_tasks must be >= 1 (got {self.max_tasks}); omit it to evaluate every task")
        if self.providers is not None and not self.providers:
            raise ValueError("providers is empty: list a provider subset, or null for every provider explored")
        if not self.exploration_dir:
            raise ValueError("exploration_dir is required (the output_dir of `memroute synth forced-exploration`)")


def make_parser():
    from train.config import make_arg_parser

    return make_arg_parser([MemAgentEvalConfig], prog="memroute eval memagent",
                           description="Routed agent vs no memory / single providers / random / oracle on held-out tasks.")


# -- exploration records -----------------------------------------------------------------------------
def _validate_exploration(rec: dict) -> None:
    if not isinstance(rec["task_id"], str) or not rec["task_id"]:
        raise ValueError("task_id must be a non-empty string")
    if rec["begin_provider"] is not None and not isinstance(rec["begin_provider"], str):
        raise ValueError(f"begin_provider must be a provider name or null, got {rec['begin_provider']!r}")
    if not isinstance(rec["success"], bool):
        raise ValueError(f"success must be true or false, got {rec['success']!r}")
    if not isinstance(rec["steps"], int) or rec["steps"] < 0:
        raise ValueError(f"steps must be a non-negative integer, got {rec['steps']!r}")
    tokens = rec.get("injected_tokens", 0)
    if not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"injected_tokens must be a non-negative integer, got {tokens!r}")


def _validate_retrieved(rec: dict) -> None:
    """heldout/tasks.jsonl ``retrieved``: {provider: {"text": str, ...}}."""
    if not isinstance(rec["task_id"], str) or not rec["task_id"]:
        raise ValueError("task_id must be a non-empty string")
    r = rec["retrieved"]
    if not isinstance(r, dict) or not all(isinstance(v, dict) and isinstance(v.get("text", ""), str)
                                          for v in r.values()):
        raise ValueError("retrieved must map each provider to an object with a string 'text'")


def _validate_task_record(rec: dict) -> None:
    """heldout/tasks.jsonl for the offline Begin decisions: a goal and a list of provider previews."""
    if not isinstance(rec["task_id"], str) or not rec["task_id"]:
        raise ValueError("task_id must be a non-empty string")
    if not isinstance(rec["goal"], str):
        raise ValueError(f"goal must be a string, got {rec['goal']!r:.60}")
    if not isinstance(rec["previews"], list) or not all(isinstance(p, dict) and "provider" in p
                                                        for p in rec["previews"]):
        raise ValueError("previews must be a list of objects with a 'provider'")


def load_outcomes(path: str, in_policy: str) -> tuple[dict[str, dict[str | None, dict]], list[str]]:
    """{task_id: {option: record}} for one In policy, and the provider names seen (first-seen order).

    A malformed record, or a second record for the same (task, option, policy), names file:line.
    """
    table: dict[str, dict[str | None, dict]] = {}
    providers: list[str] = []

    def validate(rec):
        _validate_exploration(rec)
        if rec["in_policy"] == in_policy and rec["begin_provider"] in table.get(rec["task_id"], {}):
            raise ValueError(f"duplicate record for task {rec['task_id']!r}, option {rec['begin_provider']!r}, "
                             f"in_policy {in_policy!r}")
        table.setdefault(rec["task_id"], {})
        if rec["in_policy"] == in_policy:
            table[rec["task_id"]][rec["begin_provider"]] = rec

    for rec in read_jsonl(path, required=EXPLORATION_FIELDS, validate=validate):
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
    return out


# -- routed rollouts ---------------------------------------------------------------------------------
def routed_rollout(ctx: "RolloutContext", task, router) -> dict:
    """One held-out task with the router deciding Begin and In; timings split into probe / router / task.

    ``ctx.probe(goal) -> previews`` (default: each provider's own ``probe``); ``ctx.count_tokens`` defaults
    to whitespace words; ``ctx.memories`` (recorded Begin memories) are used instead of a live retrieve.
    """
    from routers.memagent.agent import run_episode

    count_tokens = ctx.count_tokens or (lambda s: len(s.split()))
    providers = ctx.providers
    t_task = time.perf_counter()
    t = time.perf_counter()
    previews = ctx.probe(task.goal) if ctx.probe else [prov.probe(task.goal) for prov in providers.values()]
    probe_s = time.perf_counter() - t
    router_s = 0.0
    t = time.perf_counter()
    choice = router.begin(task.goal, previews, providers)
    router_s += time.perf_counter() - t
    memory = ""
    if choice is not None:
        recorded = (ctx.memories or {}).get(task.task_id, {})
        memory = recorded[choice] if choice in recorded else providers[choice].retrieve(task.goal).text

    def in_policy(task_, index, summary):
        nonlocal router_s
        t0 = time.perf_counter()
        decision = router.inject(task_.goal, index, summary)
        router_s += time.perf_counter() - t0
        return decision

    short_term = ctx.short_term_factory() if ctx.short_term_factory else None
    traj = run_episode(ctx.env, ctx.agent, task, begin_provider=choice, begin_memory=memory, in_policy=in_policy,
                       short_term=short_term, max_steps=ctx.max_steps)
    task_s = time.perf_counter() - t_task
    in_tokens = sum(count_tokens(s.injected) for s in traj.steps if s.injected)
    begin_tokens = count_tokens(memory) if memory else 0
    return {"task_id": task.task_id, "begin_provider": choice, "success": bool(traj.success),
            "steps": len(traj.steps), "begin_tokens": begin_tokens, "in_tokens": in_tokens,
            "injected_tokens": begin_tokens + in_tokens, "in_queries": sum(1 for s in traj.steps if s.injected),
            "in_decisions": sum(1 for s in traj.steps if (s.meta or {}).get("stm")),
            "probe_s": probe_s, "router_s": router_s, "task_s": task_s, "error": traj.error,
            "trajectory": traj.to_dict()}


def run_routed(tasks, ctx: "RolloutContext", router, out_path: str | Path) -> list[dict]:
    """Routed rollouts for ``tasks``, appended to ``out_path`` (rerunning skips tasks already there)."""
    from tqdm.auto import tqdm

    with ResumableJsonlWriter(out_path, key="task_id") as writer:
        for task in tqdm(tasks, desc="routed rollouts", unit="task"):
            if task.task_id not in writer:
                writer.write(routed_rollout(ctx, task, router))
    wanted = {t.task_id for t in tasks}
    return [r for r in read_jsonl(out_path) if r["task_id"] in wanted]


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


def write_plots(metrics: dict, output_dir: Path) -> list[str]:
    paths = [str(coverage_plot(metrics["coverage"], output_dir / "coverage.png"))]
    if "begin" in metrics:
        paths.append(str(begin_confusion_plot(metrics["begin"]["confusion"], output_dir / "begin_confusion.png")))
    return paths


def coverage_plot(coverage: Mapping, path: str | Path) -> Path:
    """Bar chart: number of tasks solved by exactly k of the N options (paper Table 13 / Figure 5 right)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from eval.plots import _save_atomic

    hist = coverage["histogram"]
    ks = [int(k) for k in hist]
    total = max(sum(hist.values()), 1)
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    bars = ax.bar(ks, [hist[str(k)] for k in ks], color="tab:blue")
    for b, k in zip(bars, ks):
        if hist[str(k)]:
            ax.annotate(f"{100 * hist[str(k)] / total:.0f}%", (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=8)
    ax.set_xticks(ks)
    ax.set_xlabel(f"options (of {coverage['options']}: providers + no memory) that solve the task")
    ax.set_ylabel("tasks")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Task coverage distribution")
    ax.grid(axis="y", alpha=0.3)
    return _save_atomic(fig, path)


def begin_confusion_plot(confusion: Mapping, path: str | Path) -> Path:
    """Oracle Begin label (rows) vs routed choice (columns), counts annotated."""
    import numpy as np
    from matplotlib.figure import Figure

    from eval.plots import _save_atomic

    labels, m = confusion["labels"], np.asarray(confusion["matrix"], dtype=float)
    size = max(4.0, 0.45 * len(labels) + 2)
    fig = Figure(figsize=(size + 1, size))
    ax = fig.subplots()
    im = ax.imshow(m, cmap="Blues")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    for i in range(len(labels)):
        for j in range(len(labels)):
            if m[i, j]:
                ax.text(j, i, f"{int(m[i, j])}", ha="center", va="center", fontsize=7,
                        color="white" if m[i, j] > m.max() / 2 else "black")
    ax.set_xlabel("routed Begin choice")
    ax.set_ylabel("oracle Begin label")
    ax.set_title("Begin decisions vs oracle (solvable held-out tasks)")
    return _save_atomic(fig, path)


def exploration_config(exploration_dir: str | Path):
    """The ForcedExplorationConfig the held-out records were made with (manifest fingerprint wins)."""
    import json

    from data_synthesis.memagent import ForcedExplorationConfig
    from train.config import ConfigError, load_yaml

    d = Path(exploration_dir)
    raw = load_yaml(d / "resolved_config.yaml") if (d / "resolved_config.yaml").exists() else {}
    manifest = d / "manifest.json"
    if manifest.exists():
        try:
            fingerprint = json.loads(manifest.read_text(encoding="utf-8")).get("fingerprint", {})
        except (ValueError, UnicodeDecodeError) as err:
            raise ConfigError(f"{manifest}: not valid JSON ({getattr(err, 'msg', type(err).__name__)})") from None
        except AttributeError:
            raise ConfigError(f"{manifest}: expected a JSON object") from None
        if not isinstance(fingerprint, dict):
            raise ConfigError(f"{manifest}: fingerprint must be a JSON object, got {type(fingerprint).__name__}")
        raw.update(fingerprint)
    known = ForcedExplorationConfig.__dataclass_fields__
    try:
        return ForcedExplorationConfig(**{k: v for k, v in raw.items() if k in known})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{d}: the exploration config (resolved_config.yaml + manifest.json) is invalid: "
                          f"{err}") from None


@dataclass
class RolloutContext:
    env: Any
    tasks: list
    agent: Any
    providers: dict
    short_term_factory: Callable | None = None
    count_tokens: Callable[[str], int] | None = None
    probe: Callable | None = None
    memories: dict | None = None        # {task_id: {provider: Begin memory text}} from heldout/tasks.jsonl
    max_steps: int = 30


def build_rollout_context(cfg: MemAgentEvalConfig, pool: Sequence[str]) -> RolloutContext:
    """Environment, agent, short-term memory and frozen stores exactly as forced exploration built them."""
    from data_synthesis.memagent import build_agent, build_env, build_providers_from, token_counter
    from routers.memagent.providers import ProviderProbe, ShortTermMemory, load_providers

    xcfg = exploration_config(cfg.exploration_dir)
    xcfg.providers = list(pool)
    if cfg.device is not None:
        xcfg.device = cfg.device
    env = build_env(xcfg)
    agent = build_agent(xcfg)
    providers = build_providers_from(xcfg)
    load_providers(providers, Path(cfg.exploration_dir) / "stores")  # frozen: nothing is stored while evaluating
    memories = None
    tasks_file = Path(cfg.exploration_dir) / "heldout" / "tasks.jsonl"
    if cfg.reuse_retrieved and tasks_file.exists():
        memories = {r["task_id"]: {n: v.get("text", "") for n, v in r["retrieved"].items()}
                    for r in read_jsonl(tasks_file, required=("task_id", "retrieved"), validate=_validate_retrieved)}
    return RolloutContext(env=env, tasks=env.tasks("heldout"), agent=agent, providers=providers,
                          short_term_factory=lambda: ShortTermMemory(max_words=xcfg.stm_max_words),
                          count_tokens=token_counter(agent), probe=ProviderProbe(providers).probe,
                          memories=memories, max_steps=xcfg.max_steps)


def main(argv=None) -> dict:
    from train.config import parse_config

    (cfg,) = parse_config(make_parser(), [MemAgentEvalConfig], argv)
    if not Path(cfg.exploration_dir).is_dir():
        raise FileNotFoundError(f"exploration_dir {cfg.exploration_dir}: no such directory (the output_dir of "
                                "`memroute synth forced-exploration`)")
    records_file = Path(cfg.exploration_dir) / "heldout" / "exploration.jsonl"
    if not records_file.is_file():
        raise FileNotFoundError(f"{records_file}: run `memroute synth forced-exploration` with the heldout split first")
    routed = cfg.router and str(cfg.router).lower() != "none"
    if routed and not Path(cfg.router).is_dir():
        raise FileNotFoundError(f"--router {cfg.router}: no such directory (a `memroute export memagent` directory, "
                                "or --router none for the baseline rows only)")
    from data_synthesis.jsonl import OutputLock

    with OutputLock(cfg.output_dir):  # routed.jsonl is appended to: one run at a time
        return _main(cfg, records_file)


def _main(cfg: MemAgentEvalConfig, records_file: Path) -> dict:
    from routers.base import library_versions
    from train.config import save_resolved_config

    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_resolved_config(out_dir, cfg)
    tables, pool = load_all_outcomes(str(records_file))
    if cfg.baseline_in_policy not in tables:
        raise ValueError(f"{records_file}: no records with in_policy={cfg.baseline_in_policy!r}; found {sorted(tables)}")
    if cfg.providers:
        unknown = sorted(set(cfg.providers) - set(pool))
        if unknown:
            raise ValueError(f"providers {unknown} have no exploration records in {records_file}")
        pool = [p for p in pool if p in cfg.providers]
    options: list[str | None] = [None, *pool]
    order = complete_tasks(tables[cfg.baseline_in_policy], options)[: cfg.max_tasks]
    if not order:
        raise ValueError(f"{records_file}: no task has in_policy={cfg.baseline_in_policy!r} records for all "
                         f"{len(options)} options {[option_label(o) for o in options]}")
    tables = {pol: {t: tab[t] for t in order if t in tab} for pol, tab in tables.items()}
    runs = None
    if cfg.router and str(cfg.router).lower() != "none":
        from routers.memagent.router import MemAgentRouter

        router = MemAgentRouter.from_pretrained(cfg.router, device=cfg.device)
        ctx = build_rollout_context(cfg, pool)
        by_id = {t.task_id: t for t in ctx.tasks}
        missing = [t for t in order if t not in by_id]
        if missing:
            raise ValueError(f"{len(missing)} exploration tasks are not held-out tasks of the rebuilt environment, "
                             f"e.g. {missing[:3]}")
        runs = run_routed([by_id[t] for t in order], ctx, router, out_dir / "routed.jsonl")
    metrics = evaluate(tables[cfg.baseline_in_policy], options, runs)
    tasks_file = Path(cfg.exploration_dir) / "heldout" / "tasks.jsonl"
    if runs is not None and tasks_file.exists():
        task_records = {r["task_id"]: r for r in read_jsonl(tasks_file, required=("task_id", "goal", "previews"),
                                                            validate=_validate_task_record)}
        todo = [t for t in order if t in task_records]
        table = tables[cfg.baseline_in_policy]
        metrics["begin_offline"] = {"trained": offline_begin(router, task_records, ctx.providers, table, options, todo)}
        base = cfg.base_model or router.config.base_model
        if cfg.compare_base_router and base and str(base).lower() != "none":
            base_router = MemAgentRouter.from_base(base, device=cfg.device)
            metrics["begin_offline"]["base"] = offline_begin(base_router, task_records, ctx.providers, table,
                                                             options, todo)
            metrics["begin_offline"]["base_model"] = base
    metrics["baselines_by_in_policy"] = {pol: baseline_rows(tab, options, complete_tasks(tab, options))
                                         for pol, tab in tables.items() if complete_tasks(tab, options)}
    metrics["oracle_any_in_policy"] = oracle_any(tables, options, order)
    metrics["baseline_in_policy"] = cfg.baseline_in_policy
    metrics["config"] = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    metrics["library_versions"] = library_versions()
    metrics["notes"] = ("Held-out tasks; long-term stores frozen (built from training tasks only, nothing stored "
                        f"during evaluation, End not exercised). Baseline rows: exploration records with "
                        f"in_policy={cfg.baseline_in_policy!r}; random = exact expectation of a uniform Begin choice. "
                        "Routed row: live rollouts, the router decides Begin and every In step.")
    metrics["plots"] = write_plots(metrics, out_dir)
    atomic_write_json(out_dir / "metrics.json", metrics)
    _print_summary(metrics)
    return metrics


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
            **{k: v for k, v in acc.items() if k != "confusion"}, "confusion": acc["confusion"]}


def oracle_any(tables: Mapping[str, Mapping], options: Sequence[str | None], tasks: Sequence[str]) -> dict:
    """Share of tasks solved by any (Begin option, In policy) combination explored."""
    solved = [any(tab.get(t, {}).get(o, {}).get("success", False) for tab in tables.values() for o in options)
              for t in tasks]
    return {"tasks": len(tasks), "success_rate": sum(solved) / len(solved) if solved else None,
            "in_policies": sorted(tables)}


def _print_summary(m: dict) -> None:
    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    lines = [f"[memroute] memagent eval on {m['tasks']} held-out tasks, {len(m['options'])} options"]
    for name in ("routed",):
        if name in m:
            lines.append(f"  routed        {pct(m['routed']['success_rate'])}  steps {m['routed']['avg_steps']}")
    for name, row in m["baselines"].items():
        lines.append(f"  {name:<13} {pct(row['success_rate'])}  steps {row['avg_steps']}")
    print("\n".join(lines), file=sys.stderr)


if __name__ == "__main__":
    main()
