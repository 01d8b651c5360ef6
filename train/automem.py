"""AutoMem memory-architecture search (seed 003) and its random-search baseline at the same budget.

    memroute train automem configs/automem/train/default.yaml [--budget 15 --seeds 0 1 2]
    python -m train.automem configs/automem/train/default.yaml

Builds the environment and task agent from the MemAgent rollout options (``env``, ``agent``, ...), splits the
``search_split`` tasks (fixed shuffle, seed 42) into a search batch and a validation batch, and for every seed
runs the AutoMem loop and random search (``routers.automem.search``) with real rollouts
(``routers.automem.evaluate.RolloutEvaluator``). Writes into ``output_dir``: ``seed<S>/automem_trace.json`` and
``seed<S>/random_trace.json`` (baseline, every evaluated architecture, ledger, observation graph, gradients,
validations; resumable: a killed run rerun with the same command replays them), ``evaluations.jsonl`` (every
successful evaluation, shared by both methods and all seeds: an identical evaluation is played once),
``summary.json``,
``memory_system.json`` (the best validated architecture of ``export_seed``, loadable by
``routers.automem.load_system``) and ``resolved_config.yaml``. Held-out results: ``memroute eval automem``.
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from routers.config import check_resume_value, make_arg_parser, parse_config, save_resolved_config
from routers.io import OutputLock, atomic_write_json
from routers.logs import get_logger, setup_cli_logging
from routers.memagent.rollout import RolloutConfig
from routers.validation import int_option, option_problems, raise_option_problems

log = get_logger(__name__)


@dataclass
class AutomemTrainConfig(RolloutConfig):
    output_dir: str = "outputs/automem/search"
    search_split: str = field(default="train", metadata={"help": "split whose tasks are cut into search + validation"})
    search_warmup: str = field(default="none", metadata={
        "help": "what every memory system plays and stores before a search or validation batch, unscored: none | "
                "demonstrations (the search split's demonstrations outside the batch, played by the expert) | train "
                "(every search-split task outside the batch, as held-out's warmup_split: train): a pool nearer the "
                "one held-out tasks retrieve from"})
    n_search: int = field(default=16, metadata={"help": "search-batch tasks (played in order, memory accumulates)"})
    n_val: int = field(default=8, metadata={"help": "validation-batch tasks"})
    budget: int = field(default=15, metadata={"help": "candidate evaluations per method and seed"})
    k: int = field(default=3, metadata={"help": "candidates per AutoMem round"})
    val_every: int = field(default=2, metadata={"help": "validate the Pareto leader every this many rounds"})
    final_validate: int = field(default=3, metadata={
        "help": "at the end, both methods validate this many best candidates by search accuracy; the best on "
                "validation is the reported (and exported) architecture"})
    final_select: str = field(default="validation", metadata={
        "help": "how the reported architecture is picked among the validated ones: validation (best validation "
                "accuracy) | pooled (mean of search and validation accuracy) | search (best search accuracy)"})
    stagnation: int = field(default=0, metadata={
        "help": "AutoMem: after this many rounds without a better search accuracy, one candidate per round is a random "
                "restart (0: off)"})
    structure_after: int = field(default=0, metadata={
        "help": "AutoMem: once the leader has kept one Store|Retrieve|Manage for this many rounds, one candidate per "
                "round edits Store, Retrieve or Manage (the observation graph's most promising choice; 0: off)"})
    prune_declarative: bool = field(default=False, metadata={
        "help": "AutoMem: when the diagnosis reads unusable_form (evidence injected alone, not acted on) and the "
                "leader encodes a procedural unit (workflow, shortcut, trajectory) beside tip / insight, remove the "
                "declarative encoder before adding another procedural one"})
    swap_inert: bool = field(default=False, metadata={
        "help": "AutoMem: a candidate that repeats its parent's outcome and step count on every search task leaves "
                "its ledger entry untested, and an Encode addition that did so (its units cut behind the others) is "
                "retried in place of forms the diagnosis ranks below it: without the one the candidate kept most "
                "(swap), then without all of them (focus)"})
    diagnose_scope: str = field(default="round", metadata={
        "help": "AutoMem: whose failures the diagnosis reads: round (every candidate of the round, the paper's) | "
                "leader (the leader's only: its edits go to the leader)"})
    drop_forms_ahead: bool = field(default=False, metadata={
        "help": "AutoMem: when the diagnosis reads unusable_form, first remove the unit forms the agent read ahead "
                "of a form the diagnosis ranks higher (a shortcut or trajectory kept before the workflow)"})
    validate_saturated: bool = field(default=False, metadata={
        "help": "AutoMem: validate every candidate that solves the whole search batch at once; among those the "
                "leader is the best on validation, and the diagnosis reads the leader's validation failures (a "
                "solved batch ranks and diagnoses nothing); extra validation evaluations, off the search budget"})
    drop_noise_ahead: bool = field(default=False, metadata={
        "help": "AutoMem: when the diagnosis reads retrieval_noise, first remove the unit forms kept ahead of a form "
                "the diagnosis ranks higher (a trajectory that filled the word limit before the workflow)"})
    diagnose_unlinked: bool = field(default=False, metadata={
        "help": "AutoMem: a retrieval miss where no unit holding the evidence names the goal's object is an Encode "
                "failure (unlinked_evidence: keep what the episode observed), not a ranking one; reads the "
                "evaluation records' evidence_linked (search evaluations stored before it are played again)"})
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    init: str = field(default="random", metadata={"help": "round-1 candidates: random (as random search) | known "
                                                         "(human-designed systems as tuples)"})
    proposer: str = field(default="rule", metadata={"help": "rule | llm (needs backend)"})
    backend: str | None = field(default=None, metadata={"help": "LLM backend for the llm proposer and diagnostician"})
    memory_llm: str | None = field(default=None, metadata={"help": "LLM backend the memory systems write with "
                                                           "(None: rule-based encoders)"})
    retriever: str | None = field(default=None, metadata={"help": "trained RetrieverRouter export: the encoder of "
                                                          "contrastive retrieval"})
    memory_k: int = field(default=3, metadata={"help": "units retrieved per task"})
    memory_words: int = field(default=120, metadata={"help": "max injected memory words"})
    memory_guards: bool = field(default=True, metadata={
        "help": "the injection judge withholds a unit whose avoid_when the goal triggers (the goal places an item "
                "the unit's task sought elsewhere: routers/automem/guards.py); false: the judge before guards"})
    memory_route_guards: bool = field(default=True, metadata={
        "help": "also withhold a unit whose successful route took nothing from the place the goal sends its item "
                "(it leads elsewhere: guards.off_route; failed episodes have no route)"})
    memory_world_guards: bool = field(default=True, metadata={
        "help": "also withhold a unit written in another world than the one the goal names ('In <World>, ...': "
                "guards.other_world); false: the runs before this guard"})
    memory_site_guards: bool = field(default=True, metadata={
        "help": "also withhold a unit written from a failed episode (insight, failed trajectory) when the goal seeks "
                "nothing where the failed task did (guards.other_site); false: the runs before this guard"})
    memory_world_scope: bool = field(default=False, metadata={
        "help": "retrieve only among units written in the goal's world: another world's units do not take the k "
                "retrieval slots the world guard would then empty (large multi-world pools, e.g. held-out after "
                "warmup_split train)"})
    memory_guards_first: bool = field(default=False, metadata={
        "help": "apply every guard (avoid_when, route, world, site) to the pool before ranking: the k retrieval slots "
                "go to the best units that pass instead of units the guards then withhold"})
    memory_trajectory_facts: bool = field(default=False, metadata={
        "help": "the rule trajectory writer keeps the sentences of each observation that name what the trace acted "
                "on ('The coffer contains a blue skillet, ...'), not the first words of each: a later goal naming an "
                "object the agent saw can retrieve the episode that saw it"})
    memory_sought_guards: bool = field(default=False, metadata={
        "help": "a goal naming its item withholds the units of an episode that took that item away (their route is "
                "stale) and units naming neither the item nor a place the goal names (guards.taken / unsought)"})
    random_baseline: bool = True
    export_seed: int | None = None
    resume: str = "auto"

    def __post_init__(self):
        from routers.automem.search import DIAGNOSE_SCOPES, FINAL_SELECT

        super().__post_init__()
        raise_option_problems(option_problems([
            int_option(self.n_search, "n_search"), int_option(self.n_val, "n_val"), int_option(self.budget, "budget"),
            int_option(self.k, "k"), int_option(self.val_every, "val_every"),
            int_option(self.final_validate, "final_validate"), int_option(self.memory_k, "memory_k"),
            int_option(self.memory_words, "memory_words"), (bool(self.seeds), "seeds must list at least one seed"),
            int_option(self.stagnation, "stagnation", minimum=0),
            int_option(self.structure_after, "structure_after", minimum=0),
            (self.init in ("random", "known"), f"init must be random or known, got {self.init!r}"),
            (self.diagnose_scope in DIAGNOSE_SCOPES,
             f"diagnose_scope must be one of {DIAGNOSE_SCOPES}, got {self.diagnose_scope!r}"),
            (self.search_warmup in SEARCH_WARMUPS,
             f"search_warmup must be one of {SEARCH_WARMUPS}, got {self.search_warmup!r}"),
            (self.final_select in FINAL_SELECT,
             f"final_select must be one of {FINAL_SELECT}, got {self.final_select!r}"),
            (self.proposer in ("rule", "llm"), f"proposer must be rule or llm, got {self.proposer!r}"),
            (self.proposer == "rule" or bool(self.backend), "proposer llm needs --backend"),
            (self.export_seed is None or self.export_seed in self.seeds, "export_seed must be one of seeds")]))
        check_resume_value(self.resume)


def _meta(task) -> dict:
    return getattr(task, "meta", None) or {}


def split_tasks(tasks: list, n_search: int, n_val: int, seed: int = 42) -> tuple[list, list]:
    """Disjoint search / validation batches from a fixed shuffle (original order kept inside each batch).

    Tasks that share a world (``meta["world_id"]``, the persistent-world suite) are shuffled as whole worlds, so a
    repeat visit is never separated from the first visit whose memory it needs; batches are filled world by world
    and cut at ``n_search`` / ``n_val``. Worlds without memory of their own (no task with a ``sibling`` or a
    ``demonstration``: the ``worlds_train_unseen`` ones) are dealt in turn to search and validation first, so each
    batch holds the task kind that held-out unseen worlds pose."""
    if len(tasks) < n_search + n_val:
        raise ValueError(f"{len(tasks)} tasks cannot fill n_search={n_search} + n_val={n_val}")
    groups: dict = {}
    for i, t in enumerate(tasks):
        groups.setdefault(_meta(t).get("world_id", i), []).append(i)
    keys = list(groups)
    random.Random(seed).shuffle(keys)
    own = [k for k in keys if any(_meta(tasks[i]).get("sibling") or _meta(tasks[i]).get("demonstration")
                                  for i in groups[k])]
    fresh = [k for k in keys if k not in own and isinstance(k, str)] if own else []  # else: as before
    rest = [k for k in keys if k not in fresh]

    def flat(ks) -> list[int]:
        return [i for k in ks for i in groups[k]]

    s = (flat(fresh[0::2]) + flat(rest))[:n_search]
    taken = set(s)
    v = (flat(fresh[1::2]) + [i for i in flat(rest) if i not in taken])[:n_val]
    return [tasks[i] for i in sorted(s)], [tasks[i] for i in sorted(v)]


def build_evaluator(cfg, env=None, agent=None):
    """The rollout evaluator of a config (environment, agent, encoder, memory LLM built once)."""
    from routers.automem.evaluate import RolloutEvaluator
    from routers.memagent.rollout import build_agent, build_env, token_counter

    env = env if env is not None else build_env(cfg)
    agent = agent if agent is not None else build_agent(cfg)
    encoder = cfg.encoder
    if cfg.retriever:
        from routers.retriever import RetrieverRouter

        encoder = RetrieverRouter.from_pretrained(cfg.retriever)
    from routers.memagent.providers.encoder import as_encoder

    llm = None
    if cfg.memory_llm:
        from routers.backends import make_backend

        llm = make_backend(cfg.memory_llm)
    return env, RolloutEvaluator(env, agent, encoder=as_encoder(encoder), llm=llm, max_steps=cfg.max_steps,
                                 count_tokens=token_counter(agent), k=cfg.memory_k, max_words=cfg.memory_words,
                                 **system_guards(cfg))


def run(cfg: AutomemTrainConfig, evaluator=None, env=None) -> dict:
    from routers.automem.evidence import annotate_world_tasks
    from routers.automem.proposer import LLMProposer
    from routers.automem.search import run_automem, run_random
    from routers.automem.system import save_system_config
    from routers.automem.trace import EvaluationStore, first_reach
    from routers.memagent.rollout import env_tasks

    if evaluator is None:
        env, evaluator = build_evaluator(cfg, env)
    pool = env_tasks(env, cfg.search_split)
    search, val = split_tasks(pool, cfg.n_search, cfg.n_val)
    if cfg.search_warmup != "none":  # the evaluator skips those in the batch it plays
        evaluator.warmup = warmup_tasks(pool, cfg.search_warmup)
    annotate_world_tasks(env, search + val)  # the diagnosis's evidence on the persistent-world suite
    llm = None
    if cfg.backend:
        from routers.backends import make_backend

        llm = make_backend(cfg.backend)
    out = Path(cfg.output_dir)
    fp = {"env": cfg.env, "agent": cfg.agent, "agent_model": cfg.agent_model, "memory_llm": cfg.memory_llm,
          "retriever": cfg.retriever, "memory_k": cfg.memory_k, "memory_words": cfg.memory_words,
          "memory_guards": cfg.memory_guards, **guard_settings(cfg), **warmup_settings(cfg)}
    summary = {"schema_version": 1, "config": asdict(cfg), "seeds": {}}
    with OutputLock(out):
        save_resolved_config(out, cfg)
        if cfg.resume == "never":
            (out / "evaluations.jsonl").unlink(missing_ok=True)
        store = EvaluationStore(out / "evaluations.jsonl", {**evaluation_settings(cfg), **warmup_settings(cfg)})
        for seed in cfg.seeds:
            d = out / f"seed{seed}"
            proposer = LLMProposer(llm) if cfg.proposer == "llm" else None
            a = run_automem(evaluator, search, val, budget=cfg.budget, k=cfg.k, val_every=cfg.val_every, seed=seed,
                            trace_path=d / "automem_trace.json", fingerprint=fp, proposer=proposer,
                            diagnosis_llm=llm, init=cfg.init, resume=cfg.resume,
                            final_validate=cfg.final_validate, store=store,
                            final_select=cfg.final_select, stagnation=cfg.stagnation,
                            structure_after=cfg.structure_after, prune_declarative=cfg.prune_declarative,
                            swap_inert=cfg.swap_inert, diagnose_scope=cfg.diagnose_scope,
                            drop_forms_ahead=cfg.drop_forms_ahead, validate_saturated=cfg.validate_saturated,
                            drop_noise_ahead=cfg.drop_noise_ahead, diagnose_unlinked=cfg.diagnose_unlinked)
            row = {"automem": _brief(a)}
            if cfg.random_baseline:
                r = run_random(evaluator, search, val, budget=cfg.budget, seed=seed,
                               trace_path=d / "random_trace.json", fingerprint=fp, resume=cfg.resume,
                               final_validate=cfg.final_validate, store=store,
                               final_select=cfg.final_select)
                row["random"] = _brief(r)
                target = max((x for x in r["best_so_far"] if x is not None), default=None)
                row["automem_reaches_random_best_at"] = (first_reach(a["best_so_far"], target)
                                                         if target is not None else None)
                row["random_best_at"] = first_reach(r["best_so_far"], target) if target is not None else None
            summary["seeds"][str(seed)] = row
            log.info("seed %d: automem %s | random %s", seed, row["automem"]["best"], row.get("random", {}).get("best"))
        export_seed = cfg.export_seed if cfg.export_seed is not None else cfg.seeds[0]
        best = summary["seeds"][str(export_seed)]["automem"]["best"]
        if best:
            save_system_config(out / "memory_system.json", best["arch"], encoder=cfg.encoder, llm=cfg.memory_llm,
                               retriever=cfg.retriever, metrics={"seed": export_seed, **best},
                               k=cfg.memory_k, max_words=cfg.memory_words, **system_guards(cfg))
        summary["export"] = str(out / "memory_system.json") if best else None
        atomic_write_json(out / "summary.json", summary)
    return summary


def evaluation_settings(cfg) -> dict:
    """What a rollout evaluation depends on (the key of the shared evaluation store): the environment and agent
    options and the memory systems' options; not the search's own (method, seed, budget) nor thread counts.
    ``cfg``: the search's or the held-out evaluation's config (both carry these fields)."""
    keep = {f.name for f in fields(RolloutConfig)} - {"torch_threads"}
    if not getattr(cfg, "worlds_train_unseen", 0):  # added later: stores written before it keep their key
        keep.discard("worlds_train_unseen")
    return {**{k: v for k, v in asdict(cfg).items() if k in keep}, "memory_llm": cfg.memory_llm,
            "retriever": cfg.retriever, "memory_k": cfg.memory_k, "memory_words": cfg.memory_words,
            "memory_guards": cfg.memory_guards, **guard_settings(cfg)}


SEARCH_WARMUPS = ("none", "demonstrations", "train")


def warmup_tasks(pool: list, mode: str) -> list:
    """The tasks a ``search_warmup`` mode stores before each batch (the evaluator skips the batch's own)."""
    from routers.memagent.rollout import is_demonstration

    return [] if mode == "none" else [t for t in pool if mode == "train" or is_demonstration(t)]


def warmup_settings(cfg) -> dict:
    """The search warm-up in a fingerprint / store key only when on (runs before it keep their keys)."""
    return {"search_warmup": cfg.search_warmup} if cfg.search_warmup != "none" else {}


# memory options added after the first runs (world_scope and guards_first change where guards act, trajectory_facts
# what a trajectory unit keeps; keyed and exported the same way)
LATER_GUARDS = ("memory_route_guards", "memory_world_guards", "memory_site_guards", "memory_world_scope",
                "memory_guards_first", "memory_trajectory_facts", "memory_sought_guards")


def guard_settings(cfg) -> dict:
    """The guards added after the first runs in a fingerprint / store key only when on: the runs before them
    (``--memory_route_guards false``, ...) keep their keys and replay."""
    return {name: True for name in LATER_GUARDS if getattr(cfg, name)}


def system_guards(cfg) -> dict:
    """The ``MemorySystem`` guard options of a search or held-out config (``memory_X`` -> ``X``)."""
    return {name.removeprefix("memory_"): getattr(cfg, name) for name in ("memory_guards", *LATER_GUARDS)}


def _brief(trace: dict) -> dict:
    return {"best": trace["best"], "baseline": trace["baseline"], "evaluations": len(trace["evaluations"]),
            "validations": len(trace["validations"]), "evaluate_calls": trace["evaluate_calls"],
            "shared": trace.get("shared", 0), "candidate_tokens": trace["candidate_tokens"],
            "rejected_invalid": trace.get("rejected_invalid", 0), "wall_s": trace["wall_s"],
            "failed": sum(1 for p in trace["evaluations"] if p["failed"])}


def make_parser():
    return make_arg_parser([AutomemTrainConfig], prog="memroute train automem",
                           description="AutoMem: Encode/Store/Retrieve/Manage architecture search vs random search.")


def main(argv=None) -> dict:
    from routers.models import offline_by_default

    offline_by_default()
    setup_cli_logging()
    (cfg,) = parse_config(make_parser(), [AutomemTrainConfig], argv)
    return run(cfg)


if __name__ == "__main__":
    main()
