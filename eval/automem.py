"""Held-out evaluation of an AutoMem search: the validated best architecture vs no memory vs the random-search
best, per seed, on the test split; the search traces; the best-so-far plot; the exported memory system.

    memroute eval automem configs/automem/eval/default.yaml [--search_dir outputs/automem/search]
    python -m eval.automem configs/automem/eval/default.yaml

Reads ``search_dir`` (``memroute train automem``'s output: ``summary.json``, ``seed<S>/*_trace.json``), plays
the first ``n_test`` tasks of ``test_split`` (memory accumulates in task order, from empty) with each system
and writes into ``output_dir``: ``evaluations.jsonl`` (each distinct system's held-out evaluation, played
once: a rerun or another seed's identical architecture replays it), ``results.json`` (per seed: accuracy, also
per task family (``task_family``), gain over no memory, tokens, wall time, evaluations used; the mean / std over
seeds; ``comparison``: AutoMem vs random search paired over seeds; ``reach_random_best``: evaluations to random
search's final best, and to the better of the two final bests), ``heldout_by_family.png``, ``search_trace.json``
(per seed and method: every evaluated architecture, the ledger, the observation graph, gradients, validations),
``best_so_far.png`` (best search accuracy vs evaluations, AutoMem and random search, every seed) and
``memory_system.json`` (the best AutoMem architecture over seeds by validation accuracy, with its held-out metrics;
``routers.automem.load_system``).
``--score_candidates N`` also plays the search's N best candidates held-out: does its objective predict held-out?
(``candidates.json``, ``search_vs_heldout.png``; ``eval.automem_candidates``). ``--compare_final_select true``
plays each trace's pick under every ``--final_select`` rule held-out: does the comparison survive the pick rule?
(``final_select.json``, ``final_select.png``; ``eval.automem_picks``). ``--archs KEY ...`` plays named architectures
and no memory instead, without reading a search (``eval.automem_archs``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from eval.automem_picks import mean_std, summarize_rule
from routers.base import git_revision, library_versions
from routers.config import make_arg_parser, parse_config, save_resolved_config
from routers.io import OutputLock, atomic_write_json
from routers.logs import get_logger, setup_cli_logging
from routers.machine import machine_info, played_on
from routers.memagent.rollout import RolloutConfig

log = get_logger(__name__)


# the memory-system options a search and its held-out evaluation both set, with the value a config that predates
# the option ran with (a search resolved before guards existed ran without them)
MEMORY_OPTIONS = {"memory_llm": None, "retriever": None, "memory_k": 3, "memory_words": 120, "memory_guards": False,
                  "memory_route_guards": False, "memory_world_guards": False,
                  "memory_site_guards": False, "memory_world_scope": False,
                  "memory_guards_first": False, "memory_trajectory_facts": False, "memory_sought_guards": False}


@dataclass
class AutomemEvalConfig(RolloutConfig):
    search_dir: str = "outputs/automem/search"
    output_dir: str = "outputs/automem/eval"
    test_split: str = field(default="heldout", metadata={"help": "split of the held-out tasks"})
    n_test: int | None = field(default=None, metadata={"help": "first n tasks of test_split (None: all)"})
    warmup_split: str | None = field(default=None, metadata={
        "help": "played and stored (unscored) before the test tasks by every memory system, e.g. train: the "
                "persistent-world suite's held-out tasks need what the training episodes of their worlds stored"})
    memory_llm: str | None = None
    retriever: str | None = None
    memory_k: int = 3
    memory_words: int = 120
    memory_guards: bool = field(default=True, metadata={
        "help": "the injection judge's avoid_when guards (as in memroute train automem); false replays the "
                "search's picks without them (the ablation)"})
    memory_route_guards: bool = field(default=True, metadata={
        "help": "the route guard (as in memroute train automem): also withhold units whose route leads elsewhere"})
    memory_world_guards: bool = field(default=True, metadata={
        "help": "the world guard (as in memroute train automem): also withhold units written in another world"})
    memory_site_guards: bool = field(default=True, metadata={
        "help": "the site guard (as in memroute train automem): also withhold a failure's record about another site"})
    memory_world_scope: bool = field(default=False, metadata={
        "help": "retrieve only among the goal's world's units (as in memroute train automem); on with a search run "
                "without it: the search's picks replayed with scoped retrieval (the ablation)"})
    memory_guards_first: bool = field(default=False, metadata={
        "help": "apply the guards before ranking (as in memroute train automem); on with a search run without it: "
                "the search's picks replayed with guarded retrieval (the ablation)"})
    memory_trajectory_facts: bool = field(default=False, metadata={
        "help": "trajectory units keep the observations' facts (as in memroute train automem)"})
    memory_sought_guards: bool = field(default=False, metadata={
        "help": "the sought-item guards (as in memroute train automem); on with a search run without them: the "
                "search's picks replayed with them (the ablation)"})
    archs: list[str] = field(default_factory=list, metadata={
        "help": "play these architecture keys ('workflow|json|cbr_rerank|json_full' ...) and no memory held-out "
                "instead of a search's picks; search_dir is not read (eval/automem_archs.py)"})
    score_candidates: int = field(default=0, metadata={
        "help": "also play the N best distinct search candidates (all seeds and methods, by search accuracy; -1: "
                "every one) held-out and report how search / validation accuracy rank them against held-out "
                "(candidates.json, search_vs_heldout.png; eval/automem_candidates.py); 0: off"})
    candidate_selection: str = field(default="top", metadata={
        "help": "top: the N best by search accuracy; spread: N evenly spaced from best to worst"})
    compare_final_select: bool = field(default=False, metadata={
        "help": "also play every trace's pick under each final_select rule (validation, pooled, search) held-out "
                "and compare the methods per rule (final_select.json, final_select.png; eval/automem_picks.py)"})

    def __post_init__(self):
        super().__post_init__()
        if self.n_test is not None and self.n_test < 1:
            raise ValueError(f"n_test must be >= 1 or None, got {self.n_test}")
        from eval.automem_candidates import SELECTIONS

        if self.candidate_selection not in SELECTIONS:
            raise ValueError(f"candidate_selection must be one of {SELECTIONS}, got {self.candidate_selection!r}")


def read_search(search_dir) -> tuple[dict, dict]:
    d = Path(search_dir)
    try:
        summary = json.loads((d / "summary.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{d}: no readable summary.json (run memroute train automem first): {err}") from None
    traces = {}
    for seed in summary.get("seeds", {}):
        traces[seed] = {}
        for method in ("automem", "random"):
            p = d / f"seed{seed}" / f"{method}_trace.json"
            if p.exists():
                traces[seed][method] = json.loads(p.read_text(encoding="utf-8"))
    return summary, traces


def plot_best_so_far(traces: dict, path) -> None:
    """Best search accuracy vs evaluations: every seed thin, the mean over seeds bold (where seeds' curves overlap,
    the mean says which method gets there first)."""
    import numpy as np
    from matplotlib.figure import Figure

    from eval.plots import finish_and_save

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    colors = {"automem": "tab:blue", "random": "tab:orange"}
    curves: dict[str, list] = {}
    for seed, by_method in traces.items():
        for method, tr in by_method.items():
            ys = [y if y is not None else float("nan") for y in tr["best_so_far"]]
            curves.setdefault(method, []).append(ys)
            ax.plot(range(1, len(ys) + 1), ys, color=colors[method], alpha=0.3, linewidth=0.9,
                    label=f"{method}, each seed" if len(curves[method]) == 1 else None,
                    linestyle="-" if method == "automem" else "--")
        base = next(iter(by_method.values()))["baseline"]["search_accuracy"]
        if base is not None:
            ax.axhline(base, color="gray", linewidth=0.8, linestyle=":")
    for method, ys in curves.items():
        n = min(len(y) for y in ys)
        if n:
            mean = np.nanmean(np.array([y[:n] for y in ys], dtype=float), axis=0)
            ax.plot(range(1, n + 1), mean, marker="o", color=colors[method], linewidth=2.2,
                    label=f"{method}, mean of {len(ys)} seeds", linestyle="-" if method == "automem" else "--")
    finish_and_save(fig, ax, path, "candidate evaluations", "best search-batch accuracy so far",
                    "AutoMem vs random search (dotted: no memory)")


def plot_by_family(by_family: dict, path) -> None:
    """Held-out accuracy per task family (mean over seeds, std as error bars) for no memory, AutoMem and random
    search: where the architectures gain and where memory hurts."""
    from matplotlib.figure import Figure

    from eval.plots import finish_and_save

    fig = Figure(figsize=(6.5, 4.5))
    ax = fig.subplots()
    systems = [m for m in ("no_memory", "automem", "random") if by_family.get(m)]
    families = list(by_family[systems[0]]) if systems else []
    width = 0.8 / max(1, len(systems))
    colors = {"no_memory": "tab:gray", "automem": "tab:blue", "random": "tab:orange"}
    for j, m in enumerate(systems):
        stats = [by_family[m].get(f) or {"mean": 0.0, "std": 0.0} for f in families]
        ax.bar([i + (j - (len(systems) - 1) / 2) * width for i in range(len(families))], [s["mean"] for s in stats],
               width, yerr=[s["std"] for s in stats], capsize=3, color=colors[m], label=m.replace("_", " "))
    ax.set_xticks(range(len(families)), families)
    finish_and_save(fig, ax, path, "held-out task family", "held-out accuracy (mean over seeds; bars: std)",
                    "Where memory architectures gain and hurt")


def evaluations_to_reach(curve: list, target: float | None) -> int | None:
    """1-based index of the first evaluation whose best-so-far accuracy reaches ``target`` (None: never)."""
    from routers.automem.trace import first_reach

    return None if target is None else first_reach(curve, target)


def reach_random_best(traces: dict) -> dict:
    """Issue 20's speed target per seed: evaluations each method needed to reach random search's final best search
    accuracy, and over seeds how often AutoMem got there in fewer / as many / more (or never). ``best_of_both``: the
    same for the higher of the two final bests (None: never) -- where random search's best is the round-1 draw both
    methods share, the first count is a tie by construction, and this one still says which method got further."""
    seeds, both = {}, {}
    for seed, by in traces.items():
        if "automem" in by and "random" in by:
            finals = {m: max((y for y in by[m]["best_so_far"] if y is not None), default=None)
                      for m in ("automem", "random")}
            target = finals["random"]
            seeds[seed] = {"random_final_best": target, **{m: evaluations_to_reach(by[m]["best_so_far"], target)
                                                          for m in ("automem", "random")}}
            top = max((v for v in finals.values() if v is not None), default=None)
            both[seed] = {"best": top, **{m: evaluations_to_reach(by[m]["best_so_far"], top)
                                          for m in ("automem", "random")}}
    a_r = [(r["automem"], r["random"]) for r in seeds.values() if r["random"] is not None]
    never = float("inf")
    b = [(r["automem"] or never, r["random"] or never) for r in both.values() if r["best"] is not None]
    return {"seeds": seeds, "fewer": sum(a is not None and a < r for a, r in a_r),
            "same": sum(a == r for a, r in a_r), "more_or_never": sum(a is None or a > r for a, r in a_r),
            "best_of_both": {"seeds": both, "fewer": sum(a < r for a, r in b), "same": sum(a == r for a, r in b),
                             "more_or_never": sum(a > r for a, r in b)}}


def task_family(task) -> str:
    """The family a held-out task reports under: on the persistent-world suite ``fetch`` (seen world, new goal),
    ``moved`` (changed world) or ``unseen`` (unseen world; ``routers.memagent.worlds_probe.task_kind``); elsewhere
    the task's ``kind`` metadata, or ``all``. Memory can only help where it holds the evidence (seen worlds), so
    a system's gain is read per family: a whole-set gain can come from a family no memory speaks to."""
    meta = task.meta or {}
    if "world_id" in meta and "sibling" in meta:
        from routers.memagent.worlds_probe import task_kind

        return task_kind(task)
    return str(meta.get("kind", "all"))


def accuracy_by_family(results, tasks) -> dict:
    """``{family: {"accuracy", "n"}}`` of per-task results (``TaskResult``) over ``tasks``, families sorted."""
    family = {t.task_id: task_family(t) for t in tasks}
    by: dict[str, list[float]] = {}
    for r in results:
        by.setdefault(family.get(r.task_id, "all"), []).append(float(r.success))
    return {k: {"accuracy": sum(v) / len(v), "n": len(v)} for k, v in sorted(by.items())}


def _held_out(evaluator, arch_key, tasks, store=None) -> dict:
    """One system on the held-out tasks; ``store`` replays an architecture already played (another seed's or
    method's best, the same no-memory baseline) and what a killed evaluation had finished."""
    from routers.automem.evaluate import run_evaluation
    from routers.automem.space import Arch

    arch = Arch.parse(arch_key) if arch_key else None
    ev = store.get(arch, tasks) if store is not None else None
    if ev is None:
        ev = run_evaluation(evaluator, arch, tasks, "test")
        if store is not None:
            store.put(arch, tasks, ev)
    # wall time as the store keeps it (4 decimals): a replay then reports the very number the first run did
    # (rounding 0.00049 s to 3 decimals gave 0.0, its stored 0.0005 gave 0.001)
    # played_on: the machine the (possibly replayed) evaluation ran on -- held-out numbers repeat on one CPU only
    return {"arch": arch_key, "accuracy": ev.accuracy, "tokens": ev.tokens, "failed": ev.failed, "error": ev.error,
            "wall_s": ev.to_dict()["seconds"], "n": len(ev.results), "by_family": accuracy_by_family(ev.results, tasks),
            "played_on": store.played_on(arch, tasks) if store is not None else played_on()}


def differing_rollout_options(cfg: AutomemEvalConfig, search_dir) -> dict:
    """Environment / agent / provider options (``RolloutConfig``) and memory-system options this evaluation sets
    differently from the search's ``resolved_config.yaml``: ``{name: (search, eval)}`` (empty when the search saved
    none; a memory option the search's config predates counts at its default)."""
    from dataclasses import fields

    from routers.config import load_yaml

    path = Path(search_dir) / "resolved_config.yaml"
    if not path.exists():
        return {}
    saved = load_yaml(path)
    def search_value(name):  # unsaved: a memory option at its pre-option value, anything else as this eval's
        return saved[name] if name in saved else MEMORY_OPTIONS.get(name, getattr(cfg, name))

    names = [f.name for f in fields(RolloutConfig)] + list(MEMORY_OPTIONS)
    return {n: (v, getattr(cfg, n)) for n in names if (v := search_value(n)) != getattr(cfg, n)}


def held_out_store(cfg: AutomemEvalConfig, out, evaluator):
    """The held-out evaluations of ``out`` (``evaluations.jsonl``), keyed by the rollout settings and the warm-up
    tasks: a rerun, another seed's identical pick or a later script replays them instead of playing again."""
    from routers.automem.trace import EvaluationStore
    from train.automem import evaluation_settings

    return EvaluationStore(Path(out) / "evaluations.jsonl", {**evaluation_settings(cfg), "warmup": [
        t.task_id for t in getattr(evaluator, "warmup", ())]})


def run(cfg: AutomemEvalConfig, evaluator=None, env=None) -> dict:
    from routers.automem.system import save_system_config
    from routers.memagent.rollout import env_tasks
    from train.automem import build_evaluator, system_guards

    if cfg.archs:
        from eval.automem_archs import check_archs, run_archs

        keys = check_archs(cfg.archs)  # before the environment is built
    else:
        summary, traces = read_search(cfg.search_dir)
        diff = differing_rollout_options(cfg, cfg.search_dir)
        if diff:  # a different agent or suite than the search's is allowed (transfer) but never silent
            log.warning("evaluating with options that differ from the search's (%s: search -> eval): %s",
                        Path(cfg.search_dir) / "resolved_config.yaml", diff)
    if evaluator is None:
        env, evaluator = build_evaluator(cfg, env)
    tasks = env_tasks(env, cfg.test_split)
    tasks = tasks[: cfg.n_test] if cfg.n_test else tasks
    if cfg.warmup_split:
        evaluator.warmup = env_tasks(env, cfg.warmup_split)
    if not tasks:
        raise ValueError(f"split {cfg.test_split!r} has no tasks")
    out = Path(cfg.output_dir)
    if cfg.archs:
        with OutputLock(out):
            save_resolved_config(out, cfg)
            store = held_out_store(cfg, out, evaluator)
            return run_archs(cfg, keys, tasks, lambda key: _held_out(evaluator, key, tasks, store),
                             {name: getattr(cfg, name) for name in MEMORY_OPTIONS})
    results: dict = {"schema_version": 1, "search_dir": cfg.search_dir, "test_split": cfg.test_split,
                     "n_test": len(tasks), "warmup_split": cfg.warmup_split, "seeds": {},
                     "options_differing_from_search": {k: list(v) for k, v in diff.items()},
                     "machine": machine_info(), "versions": library_versions(), "git_revision": git_revision()}
    with OutputLock(out):
        save_resolved_config(out, cfg)
        store = held_out_store(cfg, out, evaluator)
        none = _held_out(evaluator, None, tasks, store)
        for seed, by_method in traces.items():
            row = {"no_memory": none}
            for method, tr in by_method.items():
                best = tr.get("best")
                if not best:
                    row[method] = None
                    continue
                r = _held_out(evaluator, best["arch"], tasks, store)
                r.update(gain=None if r["accuracy"] is None else r["accuracy"] - none["accuracy"],
                         validation_accuracy=best["validation_accuracy"], search_accuracy=best["search_accuracy"],
                         found_at=best["found_at"], evaluations=len(tr["evaluations"]),
                         search_tokens=tr["candidate_tokens"], search_wall_s=tr["wall_s"],
                         search_candidate_s=tr.get("candidate_s"),
                         rejected_invalid=tr.get("rejected_invalid", 0))
                row[method] = r
            results["seeds"][seed] = row
            log.info("seed %s: no memory %.3f | automem %s | random %s", seed, none["accuracy"] or 0.0,
                     (row.get("automem") or {}).get("accuracy"), (row.get("random") or {}).get("accuracy"))
        rows = list(results["seeds"].values())
        results["aggregate"] = {m: mean_std([(r.get(m) or {}).get("accuracy") for r in rows])
                                for m in ("no_memory", "automem", "random")}
        results["aggregate"]["automem_gain"] = mean_std([(r.get("automem") or {}).get("gain") for r in rows])
        results["aggregate"]["by_family"] = {
            m: {f: mean_std([((r.get(m) or {}).get("by_family") or {}).get(f, {}).get("accuracy") for r in rows])
                for f in none["by_family"]} for m in ("no_memory", "automem", "random")}
        results["comparison"] = summarize_rule({seed: {m: {"heldout_accuracy": (r.get(m) or {}).get("accuracy")}
                                                      for m in ("automem", "random")}
                                               for seed, r in results["seeds"].items()}, none["accuracy"])
        results["reach_random_best"] = reach_random_best(traces)
        reach = results["reach_random_best"]
        log.info("AutoMem vs random search: %s; evaluations to random's best: %s; to the better best: %s",
                 results["comparison"], {k: v for k, v in reach.items() if k not in ("seeds", "best_of_both")},
                 {k: v for k, v in reach["best_of_both"].items() if k != "seeds"})
        atomic_write_json(out / "results.json", results)
        atomic_write_json(out / "search_trace.json", {
            seed: {m: {k: tr.get(k) for k in ("evaluations", "best_so_far", "ledger", "graph", "gradients",
                                                "validations", "rejected", "rejected_invalid", "baseline", "best")}
                   for m, tr in by_method.items()} for seed, by_method in traces.items()})
        plot_best_so_far(traces, out / "best_so_far.png")
        plot_by_family(results["aggregate"]["by_family"], out / "heldout_by_family.png")
        if cfg.score_candidates:
            from eval.automem_candidates import score_candidates

            results["candidates"] = score_candidates(
                traces, cfg.score_candidates, lambda arch: _held_out(evaluator, arch, tasks, store), none, out,
                cfg.candidate_selection)
        if cfg.compare_final_select:
            from eval.automem_picks import compare_final_select

            results["final_select"] = compare_final_select(
                traces, lambda arch: _held_out(evaluator, arch, tasks, store), none, out)["rules"]
        cands = [(s, r["automem"]) for s, r in results["seeds"].items() if r.get("automem")]
        if cands:
            seed, best = max(cands, key=lambda sr: (sr[1]["validation_accuracy"] or 0.0, -int(sr[0])))
            save_system_config(out / "memory_system.json", best["arch"], encoder=cfg.encoder, llm=cfg.memory_llm,
                               retriever=cfg.retriever, k=cfg.memory_k, max_words=cfg.memory_words,
                               **system_guards(cfg),
                               metrics={"seed": seed, "test_accuracy": best["accuracy"], "test_gain": best["gain"],
                                        "validation_accuracy": best["validation_accuracy"]})
    return results


def make_parser():
    return make_arg_parser([AutomemEvalConfig], prog="memroute eval automem",
                           description="AutoMem: held-out best architecture vs no memory vs random-search best.")


def main(argv=None) -> dict:
    from routers.models import offline_by_default

    offline_by_default()
    setup_cli_logging()
    (cfg,) = parse_config(make_parser(), [AutomemEvalConfig], argv)
    return run(cfg)


if __name__ == "__main__":
    main()
