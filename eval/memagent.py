"""Evaluate the MemAgent router on held-out tasks against no memory, single providers, random and the oracle.

    memroute eval memagent configs/memagent/eval/default.yaml [--max_tasks 8 ...]

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
those choices imply under the baseline In policy; on the persistent-world suite, ``counterfactual_begin``:
Begin on held-out goals edited to name another container or object (eval.memagent_cues: which cue the router
reads). Writes ``metrics.json``, ``routed.jsonl`` (resumable, one line per task), ``begin_confusion.png``,
``coverage.png`` and ``resolved_config.yaml`` into ``output_dir``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

import data_synthesis.memagent as exploration  # its config + frozen stores; tests replace its build_providers_from
from routers.io import OutputLock, ResumableJsonlWriter, atomic_write_json, read_jsonl
from eval.memagent_metrics import (EXPLORATION_FIELDS, baseline_rows, begin_accuracy, begin_train_fit,
                                   complete_tasks, coverage_distribution, end_decisions, evaluate,
                                   load_all_outcomes, load_outcomes, offline_begin, option_label, oracle_any,
                                   oracle_option, overhead, routed_metrics, row_metrics)
from routers.base import library_versions
from eval.memagent_by_type import by_task_type, task_type, write_type_report
from routers.memagent.providers import ProviderProbe
from routers.memagent.rollout import RolloutContext, build_context, rollout
from routers.memagent.router import MemAgentRouter
from routers.config import ConfigError, load_yaml, make_arg_parser, parse_config, save_resolved_config
from routers.logs import setup_cli_logging

__all__ = [  # the metrics live in eval.memagent_metrics; they are re-exported here for existing callers
    "EXPLORATION_FIELDS", "MemAgentEvalConfig", "RolloutContext", "baseline_rows", "begin_accuracy",
    "build_rollout_context", "complete_tasks", "coverage_distribution", "evaluate", "exploration_config",
    "load_all_outcomes", "load_outcomes", "main", "make_parser", "offline_begin", "option_label", "oracle_any",
    "oracle_option", "overhead", "routed_metrics", "routed_rollout", "row_metrics", "run_routed", "write_plots",
]


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
    routed_in_policy: str | None = field(default=None, metadata={
        "help": "None = the router decides In at every step; never | inject = In fixed, only Begin routed (when "
                "the exploration explored no other In policy, the router has no In labels to have learned from)"})
    routed_in_every: int = field(default=1, metadata={
        "help": "the router is asked In at every k-th step only (NoOp between): its In time / k, for routing "
                "overhead when the router is as large as the agent; 1 = every step (the paper)"})
    max_tasks: int | None = field(default=None, metadata={"help": "only the first N complete tasks (N >= 1)"})
    providers: list[str] | None = field(default=None, metadata={
        "help": "provider subset offered to the router; None = every provider explored"})
    compare_base_router: bool = field(default=True, metadata={
        "help": "also score Begin offline (recorded previews, no rollouts) with the untrained base model"})
    base_model: str | None = field(default=None, metadata={"help": "untrained baseline; default: the router's base_model"})
    reuse_retrieved: bool = field(default=True, metadata={
        "help": "inject the Begin memories recorded in heldout/tasks.jsonl (exactly what the baseline rollouts "
                "saw); false = retrieve live from the frozen stores"})
    report_end: bool = field(default=True, metadata={
        "help": "also ask End what it would store for each routed trajectory (reported per task type; the stores "
                "stay frozen, nothing is stored)"})
    counterfactual_probes: bool = field(default=True, metadata={
        "help": "persistent-world suite: also ask the router Begin on edited held-out goals (container / object "
                "swapped, previews unchanged) to show which cue it reads (eval.memagent_cues)"})
    device: str | None = None
    router_dtype: str = field(default="float32", metadata={
        "help": "float32 | bfloat16 | float16 | auto (bfloat16 where it pays off, as agent_dtype: auto): the "
                "routing overhead is a ratio of router to agent time, so give both the same dtype"})

    def __post_init__(self):
        # plain ValueErrors: parse_config reports them as a ConfigError naming the recipe or the command line
        if self.routed_in_every < 1:
            raise ValueError(f"routed_in_every must be >= 1 (got {self.routed_in_every}); 1 asks In at every step")
        if self.max_tasks is not None and self.max_tasks < 1:
            raise ValueError(f"max_tasks must be >= 1 (got {self.max_tasks}); omit it to evaluate every task")
        if self.providers is not None and not self.providers:
            raise ValueError("providers is empty: list a provider subset, or null for every provider explored")
        if not self.exploration_dir:
            raise ValueError("exploration_dir is required (the output_dir of `memroute synth forced-exploration`)")
        if self.router_dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ValueError(f"router_dtype must be float32, bfloat16, float16 or auto, got {self.router_dtype!r}")
        if str(self.routed_in_policy).lower() in ("none", "null", "router"):  # from a command line
            self.routed_in_policy = None
        if self.routed_in_policy not in (None, "never", "inject"):
            raise ValueError(f"routed_in_policy must be null / router (the router decides), never or inject, "
                             f"got {self.routed_in_policy!r}")


def make_parser():
    return make_arg_parser([MemAgentEvalConfig], prog="memroute eval memagent",
                           description="Routed agent vs no memory / single providers / random / oracle on held-out tasks.")


# -- heldout/tasks.jsonl -----------------------------------------------------------------------------
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


# -- routed rollouts ---------------------------------------------------------------------------------
def routed_rollout(ctx: RolloutContext, task, router, in_policy: str | None = None, in_every: int = 1) -> dict:
    """One held-out task with the router deciding Begin and In; timings split into probe / router / task.

    ``ctx.probe(goal) -> previews`` (default: each provider's own ``probe``); ``ctx.count_tokens`` defaults
    to whitespace words; ``ctx.memories`` (recorded Begin memories) are used instead of a live retrieve.
    """
    r = rollout(ctx, task, in_policy=in_policy, router=router, in_every=in_every)
    return {"task_id": task.task_id, "begin_provider": r.begin_provider, "success": bool(r.trajectory.success),
            "steps": r.steps, "begin_tokens": r.begin_tokens, "in_tokens": r.in_tokens,
            "injected_tokens": r.injected_tokens, "in_queries": r.in_queries, "in_decisions": r.in_decisions,
            "probe_s": r.probe_s, "router_s": r.router_s, "task_s": r.elapsed_s, "error": r.trajectory.error,
            "trajectory": r.trajectory.to_dict()}


def run_routed(tasks, ctx: RolloutContext, router, out_path: str | Path, in_policy: str | None = None,
               in_every: int = 1) -> list[dict]:
    """Routed rollouts for ``tasks``, appended to ``out_path`` (rerunning skips tasks already there)."""
    with ResumableJsonlWriter(out_path, key="task_id") as writer:
        for task in tqdm(tasks, desc="routed rollouts", unit="task"):
            if task.task_id not in writer:
                writer.write(routed_rollout(ctx, task, router, in_policy, in_every))
    wanted = {t.task_id for t in tasks}
    return [r for r in read_jsonl(out_path) if r["task_id"] in wanted]


# -- outputs -----------------------------------------------------------------------------------------
def write_plots(metrics: dict, output_dir: Path) -> list[str]:
    from eval.plots import begin_confusion_plot, coverage_plot  # matplotlib only when plots are drawn

    paths = [str(coverage_plot(metrics["coverage"], output_dir / "coverage.png"))]
    if "begin" in metrics:
        paths.append(str(begin_confusion_plot(metrics["begin"]["confusion"], output_dir / "begin_confusion.png")))
    return paths


def exploration_config(exploration_dir: str | Path):
    """The ForcedExplorationConfig the held-out records were made with (manifest fingerprint wins)."""
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
    known = exploration.ForcedExplorationConfig.__dataclass_fields__
    try:
        return exploration.ForcedExplorationConfig(**{k: v for k, v in raw.items() if k in known})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{d}: the exploration config (resolved_config.yaml + manifest.json) is invalid: "
                          f"{err}") from None


def build_rollout_context(cfg: MemAgentEvalConfig, pool: Sequence[str]) -> RolloutContext:
    """Environment, agent, short-term memory and frozen stores exactly as forced exploration built them."""
    xcfg = exploration_config(cfg.exploration_dir)
    xcfg.providers = list(pool)
    if cfg.device is not None:
        xcfg.device = cfg.device
    # frozen: nothing is stored while evaluating
    ctx = build_context(xcfg, exploration.frozen_providers(xcfg, cfg.exploration_dir))
    tasks_file = Path(cfg.exploration_dir) / "heldout" / "tasks.jsonl"
    if cfg.reuse_retrieved and tasks_file.exists():
        ctx.memories = {r["task_id"]: {n: v.get("text", "") for n, v in r["retrieved"].items()}
                        for r in read_jsonl(tasks_file, required=("task_id", "retrieved"), validate=_validate_retrieved)}
    ctx.tasks = ctx.env.tasks("heldout")
    ctx.probe = ProviderProbe(ctx.providers).probe
    return ctx


def main(argv=None) -> dict:
    setup_cli_logging()  # a CLI entry point (memroute eval memagent, python -m eval.memagent)
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
    with OutputLock(cfg.output_dir):  # routed.jsonl is appended to: one run at a time
        return _main(cfg, records_file)


def _select(cfg: MemAgentEvalConfig, records_file: Path) -> tuple[dict, list[str], list, list[str]]:
    """The outcome tables of every In policy (restricted to the tasks evaluated), the provider pool, the
    options (None first) and the task order: tasks with a baseline record for every option."""
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
    return tables, pool, options, order


def _heldout_tasks(cfg: MemAgentEvalConfig) -> list:
    """The held-out tasks of a worlds exploration (their meta gives the task types; the suite's manifest is cached,
    so nothing compiles); other environments report one type, ``all``, without a router run."""
    from routers.memagent.rollout import build_env

    ecfg = exploration_config(cfg.exploration_dir)
    return build_env(ecfg).tasks("heldout") if ecfg.env == "textworld_worlds" else []


def _routed_runs(cfg: MemAgentEvalConfig, pool: Sequence[str], order: Sequence[str], out_dir: Path):
    """The trained router, the rebuilt rollout context and the routed rollouts of ``order``."""
    from routers.models import torch_dtype

    router = MemAgentRouter.from_pretrained(cfg.router, device=cfg.device, dtype=torch_dtype(cfg.router_dtype))
    ctx = build_rollout_context(cfg, pool)
    by_id = {t.task_id: t for t in ctx.tasks}
    missing = [t for t in order if t not in by_id]
    if missing:
        raise ValueError(f"{len(missing)} exploration tasks are not held-out tasks of the rebuilt environment, "
                         f"e.g. {missing[:3]}")
    return router, ctx, run_routed([by_id[t] for t in order], ctx, router, out_dir / "routed.jsonl",
                                   cfg.routed_in_policy, cfg.routed_in_every)


def _begin_offline(cfg: MemAgentEvalConfig, router, ctx: RolloutContext, tasks_file: Path, table: dict,
                   options: Sequence, order: Sequence[str]) -> dict:
    """Begin decisions on the recorded previews: the trained router and (optionally) its untrained base."""
    task_records = {r["task_id"]: r for r in read_jsonl(tasks_file, required=("task_id", "goal", "previews"),
                                                        validate=_validate_task_record)}
    todo = [t for t in order if t in task_records]
    out = {"trained": offline_begin(router, task_records, ctx.providers, table, options, todo)}
    base = cfg.base_model or router.config.base_model
    if cfg.compare_base_router and base and str(base).lower() != "none":
        base_router = MemAgentRouter.from_base(base, device=cfg.device)
        out["base"] = offline_begin(base_router, task_records, ctx.providers, table, options, todo)
        out["base_model"] = base
    return out


def _begin_train_fit(cfg: MemAgentEvalConfig, router, ctx: RolloutContext) -> dict | None:
    """Begin decisions on the training tasks the router learned from (``begin.jsonl`` + ``train/tasks.jsonl``)."""
    d = Path(cfg.exploration_dir)
    labels_file, tasks_file = d / "begin.jsonl", d / "train" / "tasks.jsonl"
    if not (labels_file.is_file() and tasks_file.is_file()):
        return None
    task_records = {r["task_id"]: r for r in read_jsonl(tasks_file, required=("task_id", "goal", "previews"),
                                                        validate=_validate_task_record)}
    labels = list(read_jsonl(labels_file, required=("task_id", "decision")))
    return begin_train_fit(router, task_records, labels, ctx.providers)


def _counterfactual(cfg: MemAgentEvalConfig, router, ctx: RolloutContext) -> dict | None:
    """Begin on edited held-out goals (eval.memagent_cues); persistent-world explorations only."""
    from eval.memagent_cues import counterfactual_begin, validate_task_meta

    tasks_file = Path(cfg.exploration_dir) / "heldout" / "tasks.jsonl"
    if exploration_config(cfg.exploration_dir).env != "textworld_worlds" or not tasks_file.is_file():
        return None
    def validate(rec):
        _validate_task_record(rec)
        validate_task_meta(rec)

    heldout = {r["task_id"]: r for r in read_jsonl(tasks_file, required=("task_id", "goal", "previews", "task"),
                                                   validate=validate)}
    return counterfactual_begin(router, heldout, ctx.providers)


def _main(cfg: MemAgentEvalConfig, records_file: Path) -> dict:
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_resolved_config(out_dir, cfg)
    tables, pool, options, order = _select(cfg, records_file)
    runs = None
    if cfg.router and str(cfg.router).lower() != "none":
        router, ctx, runs = _routed_runs(cfg, pool, order, out_dir)
        if cfg.report_end:
            end_decisions(router, runs, ctx.providers)
    metrics = evaluate(tables[cfg.baseline_in_policy], options, runs)
    tasks_file = Path(cfg.exploration_dir) / "heldout" / "tasks.jsonl"
    if runs is not None and tasks_file.exists():
        metrics["begin_offline"] = _begin_offline(cfg, router, ctx, tasks_file, tables[cfg.baseline_in_policy],
                                                  options, order)
    if runs is not None:
        fit = _begin_train_fit(cfg, router, ctx)
        if fit is not None:
            metrics["begin_train_fit"] = fit
        if cfg.counterfactual_probes:
            cues = _counterfactual(cfg, router, ctx)
            if cues is not None:
                metrics["counterfactual_begin"] = cues
    metrics["baselines_by_in_policy"] = {pol: baseline_rows(tab, options, complete_tasks(tab, options))
                                         for pol, tab in tables.items() if complete_tasks(tab, options)}
    metrics["oracle_any_in_policy"] = oracle_any(tables, options, order)
    types = {t.task_id: task_type(t) for t in (ctx.tasks if runs is not None else _heldout_tasks(cfg))}
    offline = {k: v["per_task"] for k, v in metrics.get("begin_offline", {}).items() if isinstance(v, dict)}
    metrics["by_task_type"] = by_task_type(tables[cfg.baseline_in_policy], options, order, types, runs, offline)
    metrics["baseline_in_policy"] = cfg.baseline_in_policy
    metrics["routed_in_policy"] = cfg.routed_in_policy or "router"
    metrics["config"] = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    metrics["library_versions"] = library_versions()
    metrics["notes"] = ("Held-out tasks; long-term stores frozen (built from training tasks only, nothing stored "
                        f"during evaluation, End not exercised). Baseline rows: exploration records with "
                        f"in_policy={cfg.baseline_in_policy!r}; random = exact expectation of a uniform Begin choice. "
                        "Routed row: live rollouts, the router decides Begin and every In step.")
    metrics["plots"] = write_plots(metrics, out_dir) + write_type_report(metrics, out_dir)
    atomic_write_json(out_dir / "metrics.json", metrics)
    _print_summary(metrics)
    return metrics


def _print_summary(m: dict) -> None:
    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    lines = [f"[memroute] memagent eval on {m['tasks']} held-out tasks, {len(m['options'])} options"]
    for name in ("routed",):
        if name in m:
            lines.append(f"  routed        {pct(m['routed']['success_rate'])}  steps {m['routed']['avg_steps']}")
            if "end_choices" in m["routed"]:
                rate = m["routed"]["end_store_rate"]
                lines.append(f"  End would store: {m['routed']['end_choices']} (stores something after "
                             f"{pct(rate['after_success'])} of successes, {pct(rate['after_failure'])} of failures)")
    for name, row in m["baselines"].items():
        lines.append(f"  {name:<13} {pct(row['success_rate'])}  steps {row['avg_steps']}")
    for kind, block in (m.get("by_task_type") or {}).items():
        rows = {**block["baselines"], **({"routed": block["routed"]} if "routed" in block else {})}
        lines.append(f"  [{kind}, {block['n']} tasks] " + ", ".join(f"{k} {pct(r['success_rate'])}"
                                                                   for k, r in rows.items()))
    if "counterfactual_begin" in m:
        from eval.memagent_cues import format_cues
        lines += format_cues(m["counterfactual_begin"])
    print("\n".join(lines))  # the result table the command was run for (stdout, as the other evaluations)


if __name__ == "__main__":
    main()
