"""MemAgent rollouts, shared by forced exploration (``data_synthesis.memagent``) and evaluation (``eval.memagent``).

* :class:`RolloutConfig`: the environment, task agent and provider runtime options (``ForcedExplorationConfig``
  inherits them; evaluation rebuilds the same runtime from an exploration directory's config).
* the builders: :func:`build_env`, :func:`build_agent`, :func:`build_providers_from`, :func:`token_counter`,
  :func:`short_term_factory`, :func:`build_context`.
* :func:`rollout`: one task played through ``run_episode``, with a fixed Begin option and In policy (exploration)
  or a router deciding Begin and every In step (evaluation; router times measured), and the injected-token fields.
* the exploration record: :func:`exploration_record`, :func:`validate_exploration`, ``EXPLORATION_FIELDS``
  (and ``OUTCOME_FIELDS``, the subset the evaluation's outcome tables need), and the process-pool worker.

Exploration record (``schema_version`` 1): ``id`` ("task|option|policy"), ``task_id``, ``split``,
``begin_provider`` (null = no memory), ``in_policy``, ``success`` (bool), ``steps`` (int), ``reward``
(game score), ``max_score``, ``error`` (null or "Type: message"), ``injected_tokens`` (Begin + In),
``begin_tokens``, ``in_tokens``, ``in_queries``, ``retrieved_item_ids``, ``elapsed_s``, ``s_per_step``,
``agent``, ``trajectory`` (``Trajectory.to_dict()``; each step's ``meta.stm`` is the short-term summary
available at that step, ``meta.query`` whether it was injected).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from routers.memagent.agent import IN_POLICIES, run_episode
from routers.memagent.protocol import Task, Trajectory

FORMAT = "memroute.memagent.exploration"  # an exploration directory (manifest.json, stats.json)
SCHEMA_VERSION = 1
EXPLORATION_FIELDS = ("id", "task_id", "begin_provider", "in_policy", "success", "steps", "trajectory")
# what a (task, option, policy) outcome needs: evaluation reads records without id / trajectory too
OUTCOME_FIELDS = tuple(f for f in EXPLORATION_FIELDS if f not in ("id", "trajectory"))
ENVS = ("textworld", "textworld_worlds")
# the options that define a textworld_worlds suite (part of a forced-exploration run's resume fingerprint)
WORLD_OPTIONS = ("env", "worlds_seen", "worlds_unseen", "worlds_train_unseen", "world_rooms", "world_sites",
                 "world_site_objects", "world_moved",
                 "world_min_site_depth", "budget_factor", "budget_slack", "train_budget_factor", "world_actions",
                 "worlds_manifest", "world_train_repeats", "world_goal_names_holder", "world_train_moved",
                 "world_demonstrations", "world_unique_objects", "world_moved_to", "world_moved_object")


@dataclass
class RolloutConfig:
    """Environment, task agent and provider runtime options (``ForcedExplorationConfig`` adds the rest)."""

    # environment
    env: str = field(default="textworld", metadata={
        "help": "textworld (seeded cooking games) | textworld_worlds (task families over persistent worlds: "
                "the worlds_* / world_* / budget_* options; n_train, n_heldout, game_presets, goal_style unused)"})
    games_dir: str = "outputs/textworld_games"
    n_train: int = 16
    n_heldout: int = 8
    env_seed: int = 0
    max_steps: int = 30
    game_presets: list[str] = field(default_factory=lambda: [
        "recipe=1,take=1,go=1", "recipe=1,take=1,go=1,cut", "recipe=1,take=1,go=6",
        "recipe=2,take=1,go=1,cook", "recipe=2,take=2,go=6,open,cut"],
        metadata={"help": "tw-cooking settings, assigned to seeds round-robin"})
    goal_style: str = "recipe"
    prune_commands: bool = True
    # env textworld_worlds (routers.memagent.worlds.WorldConfig; world seeds start at env_seed)
    worlds_seen: int = field(default=6, metadata={"help": "worlds with training tasks"})
    worlds_unseen: int = field(default=2, metadata={"help": "worlds with held-out tasks only"})
    worlds_train_unseen: int = field(default=0, metadata={"help": "training-only unseen worlds (no demonstrations)"})
    world_rooms: int = 8
    world_sites: int = field(default=3, metadata={"help": "containers holding task objects, one room each"})
    world_site_objects: int = field(default=3, metadata={"help": "objects per site: 1 training + the rest held out"})
    world_goal_names_holder: bool = field(default=True, metadata={
        "help": "goals name the container ('find the X in the chest'): memory is findable from the goal"})
    world_train_repeats: int = field(default=1, metadata={
        "help": "per seen site, objects that are training repeat visits (memory decides them) instead of held out"})
    world_moved: int = field(default=1, metadata={"help": "held-out changed-world (moved object) tasks per seen world"})
    world_train_moved: int = field(default=0, metadata={"help": "training changed-world tasks per seen world"})
    world_moved_to: list[str] = field(default_factory=lambda: ["cupboard"], metadata={
        "help": "hub containers that moved objects go to, rotating over a world's moved tasks"})
    world_moved_object: str = field(default="first", metadata={
        "help": "first: the first visit's object (the one memory remembers); other: the site's last (a held-out "
                "fetch's too); spare: an extra one per seen site no other task names (WorldConfig.moved_object)"})
    world_unique_objects: bool = field(default=True, metadata={
        "help": "each site holds one kind of object and no noun is in two sites, so a memory about an object "
                "belongs to one world and site (generator version 4; false = version 3's shared nouns)"})
    world_demonstrations: bool = field(default=False, metadata={
        "help": "training first visits are demonstrations: played once by the walkthrough (expert) agent and "
                "stored; they give no Begin/In labels"})
    world_min_site_depth: int = 2
    budget_factor: float = field(default=1.0, metadata={"help": "step budget = ceil(factor * optimal) + slack"})
    budget_slack: int = 2
    train_budget_factor: float = field(default=3.0, metadata={"help": "training tasks' budget factor (first visits)"})
    world_actions: str = field(default="goal", metadata={
        "help": "goal (moves + take/put the goal's object) | verbs (every go/take/put) | all (no pruning)"})
    worlds_manifest: str | None = field(default=None, metadata={
        "help": "load the worlds and tasks from this manifest.json instead of generating them"})
    # providers
    providers: list[str] | None = field(default=None, metadata={"help": "Begin providers; None = all 13"})
    # task agent
    agent: str = field(default="lm", metadata={"help": "lm (agent_model scores commands; openai:MODEL@URL picks by "
                                                       "number) | walkthrough (oracle) | random"})
    agent_model: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    agent_dtype: str = field(default="float32", metadata={"help": "float32 | bfloat16 | auto"})
    device: str | None = None
    history_steps: int = 3
    repeat_penalty: float = 1.0
    length_norm: str = "mean"
    memory_prior: float = field(default=0.0, metadata={"help": "lm agent: bonus weight for the next command of a "
                                                               "remembered route (routers.memagent.copy_prior); 0 = off"})
    torch_threads: int = field(default=1, metadata={"help": "torch threads per worker"})
    # memory
    encoder: str = "sentence-transformers/all-MiniLM-L6-v2"
    provider_llm: str = field(default="HuggingFaceTB/SmolLM2-135M-Instruct",
                              metadata={"help": "LLM backend the providers write memories with"})
    provider_max_new_tokens: int | None = field(default=None, metadata={"help": "cap on provider LLM generations"})
    provider_dtype: str = field(default="float32", metadata={"help": "local provider LLM: float32 | bfloat16 | auto"})
    stm_max_words: int = 160
    seed: int = 0

    def __post_init__(self):
        from routers.validation import check_non_negative, check_positive

        if self.env not in ENVS:
            raise ValueError(f"env must be one of {ENVS}, got {self.env!r}")
        if self.env == "textworld_worlds" and self.worlds_manifest is None:
            world_config(self)  # raises ValueError naming the bad option
        if self.world_actions not in ("goal", "verbs", "all"):
            raise ValueError(f"world_actions must be goal, verbs or all, got {self.world_actions!r}")
        if self.agent not in ("lm", "walkthrough", "random"):
            raise ValueError(f"agent must be lm, walkthrough or random, got {self.agent!r}")
        check_non_negative(self, "n_train", "n_heldout", "history_steps", "repeat_penalty", "memory_prior")
        check_positive(self, "max_steps", "torch_threads", "stm_max_words", "provider_max_new_tokens")
        if self.length_norm not in ("mean", "sum"):
            raise ValueError(f"length_norm must be 'mean' or 'sum', got {self.length_norm!r}")
        if self.goal_style not in ("recipe", "objective"):
            raise ValueError(f"goal_style must be 'recipe' or 'objective', got {self.goal_style!r}")
        if not self.game_presets:
            raise ValueError("game_presets is empty: give at least one tw-cooking preset (e.g. 'recipe=1,take=1,go=1')")
        if self.providers is not None:
            dup = sorted({p for p in self.providers if self.providers.count(p) > 1})
            if dup:
                raise ValueError(f"providers: {dup} given more than once")


# -- building the runtime from the config ----------------------------------------------------------------
def world_config(cfg: RolloutConfig):
    """The ``WorldConfig`` of ``env: textworld_worlds`` (world seeds start at ``env_seed``)."""
    import re

    from routers.memagent.worlds import WorldConfig

    names = {"seed": "env_seed", "n_seen": "worlds_seen", "n_unseen": "worlds_unseen", "train_unseen":
             "worlds_train_unseen", "n_rooms": "world_rooms", "n_sites": "world_sites", "site_objects":
             "world_site_objects", "train_repeats": "world_train_repeats",
             "goal_names_holder": "world_goal_names_holder", "n_moved": "world_moved", "train_moved":
             "world_train_moved", "demonstrations": "world_demonstrations", "unique_objects": "world_unique_objects",
             "moved_to": "world_moved_to", "moved_object": "world_moved_object", "min_site_depth":
             "world_min_site_depth", **{k: k for k in ("budget_factor", "budget_slack", "train_budget_factor")}}
    try:
        return WorldConfig(**{k: getattr(cfg, v) for k, v in names.items()})
    except ValueError as err:  # name this config's options, not WorldConfig's
        raise ValueError(re.sub(r"\b(" + "|".join(names) + r")\b", lambda m: names[m.group(1)], str(err))) from None


def build_env(cfg: RolloutConfig):
    from routers.memagent.textworld_env import TextWorldSuite

    if cfg.env == "textworld_worlds":
        from routers.memagent.worlds_env import WorldSuite

        return WorldSuite(cache_dir=cfg.games_dir, config=None if cfg.worlds_manifest else world_config(cfg),
                          manifest=cfg.worlds_manifest, prune_commands=cfg.prune_commands, actions=cfg.world_actions)

    return TextWorldSuite(cache_dir=cfg.games_dir, n_train=cfg.n_train, n_heldout=cfg.n_heldout, seed=cfg.env_seed,
                          max_steps=cfg.max_steps, presets=cfg.game_presets, goal_style=cfg.goal_style,
                          prune_commands=cfg.prune_commands)


def build_agent(cfg: RolloutConfig):
    from routers.memagent.agent import HTTPCommandAgent, LMCommandAgent, RandomCommandAgent, WalkthroughAgent

    if cfg.agent == "walkthrough":
        return WalkthroughAgent()
    if cfg.agent == "random":
        return RandomCommandAgent(cfg.seed)
    if cfg.agent_model.startswith("openai:"):
        from routers.backends import make_backend

        return HTTPCommandAgent(make_backend(cfg.agent_model), history_steps=cfg.history_steps)
    return LMCommandAgent.from_pretrained(cfg.agent_model, dtype=cfg.agent_dtype, device=cfg.device,
                                          history_steps=cfg.history_steps, repeat_penalty=cfg.repeat_penalty,
                                          length_norm=cfg.length_norm, memory_prior=cfg.memory_prior)


def count_words(text: str) -> int:
    """Whitespace words (the token count when the agent has no tokenizer)."""
    return len(text.split()) if text else 0


def token_counter(agent) -> Callable[[str], int]:
    """The agent's tokenizer when it has one (what the injected memory costs it), else whitespace words."""
    tok = getattr(agent, "tokenizer", None)
    if tok is not None:
        return lambda text: len(tok(text, add_special_tokens=False)["input_ids"]) if text else 0
    return count_words


def build_providers_from(cfg: RolloutConfig) -> dict:
    from routers.memagent.providers import PROVIDER_NAMES, build_providers
    from routers.backends import make_backend

    names = list(cfg.providers) if cfg.providers is not None else list(PROVIDER_NAMES)
    kw = {} if cfg.provider_max_new_tokens is None else {"max_new_tokens": cfg.provider_max_new_tokens}
    local = {"dtype": cfg.provider_dtype} if cfg.provider_llm and not cfg.provider_llm.startswith("openai:") else {}
    return build_providers(names, encoder=cfg.encoder, llm=make_backend(cfg.provider_llm, **local), **kw)


def short_term_factory(cfg: RolloutConfig) -> Callable:
    """A fresh short-term memory per rollout."""
    from routers.memagent.providers import ShortTermMemory

    return lambda: ShortTermMemory(max_words=cfg.stm_max_words)


def probe_function(providers: Mapping) -> Callable[[str], list]:
    """``goal -> previews``: one vectorized ``ProviderProbe`` pass when every provider is a ``BaseProvider``,
    else each provider's own ``probe`` (any protocol provider)."""
    from routers.memagent.providers import BaseProvider, ProviderProbe

    if providers and all(isinstance(p, BaseProvider) for p in providers.values()):
        return ProviderProbe(providers).probe
    return lambda goal: [p.probe(goal) for p in providers.values()]


def env_tasks(env, split: str, progress: bool = False) -> list:
    """``env.tasks(split)``, with a progress bar when the environment offers one."""
    import inspect

    try:
        takes_progress = "progress" in inspect.signature(env.tasks).parameters
    except (TypeError, ValueError):
        takes_progress = False
    return env.tasks(split, progress=progress) if takes_progress else env.tasks(split)


@dataclass
class RolloutContext:
    """What a rollout plays with. ``probe(goal) -> previews`` (default: each provider's own ``probe``);
    ``count_tokens`` defaults to whitespace words; ``memories`` (recorded Begin memories) are used instead of
    a live retrieve."""

    env: Any
    tasks: list
    agent: Any
    providers: dict
    short_term_factory: Callable | None = None
    count_tokens: Callable[[str], int] | None = None
    probe: Callable | None = None
    memories: dict | None = None        # {task_id: {provider: Begin memory text}} from heldout/tasks.jsonl
    max_steps: int = 30


def build_context(cfg: RolloutConfig, providers: Mapping | None = None) -> RolloutContext:
    """Agent, environment, short-term memory and token counter built from the config (no tasks listed)."""
    agent = build_agent(cfg)
    return RolloutContext(env=build_env(cfg), tasks=[], agent=agent, providers=dict(providers or {}),
                          short_term_factory=short_term_factory(cfg), count_tokens=token_counter(agent),
                          max_steps=cfg.max_steps)


# -- one rollout -------------------------------------------------------------------------------------------
@dataclass
class Rollout:
    """One played task and what it cost: injected tokens (Begin memory + In summaries) and wall times."""

    trajectory: Trajectory
    begin_provider: str | None
    begin_tokens: int
    in_tokens: int
    in_queries: int                     # steps that injected the short-term summary
    in_decisions: int                   # steps that had a summary to decide on
    elapsed_s: float                    # the whole task (routed: probe + router + episode)
    probe_s: float = 0.0
    router_s: float = 0.0
    agent: str = ""                     # who played it (``demonstrator``: the expert on a demonstration)

    @property
    def steps(self) -> int:
        return len(self.trajectory.steps)

    @property
    def injected_tokens(self) -> int:
        return self.begin_tokens + self.in_tokens


class _TimedRouter:
    """A router's Begin and In decisions, with the seconds spent in them. ``in_every`` = k asks the In question
    at steps 0, k, 2k, ... only (NoOp between): a router as large as the agent costs ~1/k of its In time."""

    def __init__(self, router, in_every: int = 1):
        if int(in_every) < 1:
            raise ValueError(f"in_every must be >= 1, got {in_every}")
        self.router = router
        self.in_every = int(in_every)
        self.seconds = 0.0

    def begin(self, goal: str, previews, providers):
        t = time.perf_counter()
        choice = self.router.begin(goal, previews, providers)
        self.seconds += time.perf_counter() - t
        return choice

    def in_policy(self, task: Task, index: int, summary: str) -> bool:  # run_episode records this name
        if index % self.in_every:
            return False
        t = time.perf_counter()
        decision = self.router.inject(task.goal, index, summary)
        self.seconds += time.perf_counter() - t
        return decision


def rollout(ctx: RolloutContext, task: Task, begin: str | None = None, in_policy=None, *, memory: str = "",
            router=None, error: str | None = None, in_every: int = 1) -> Rollout:
    """Play ``task`` once. Never raises for agent/LLM/env errors: they land in ``trajectory.error``.

    Fixed decisions (exploration): Begin option ``begin`` with its ``memory`` and the In policy ``in_policy``
    (a name of ``IN_POLICIES`` or a callable; default ``never``); ``error`` (the Begin memory could not be
    retrieved) fails the rollout without playing. Routed (evaluation): ``router.begin(goal, previews,
    providers)`` picks the Begin provider from the probe previews (``ctx.probe`` or each provider's ``probe``),
    its memory is the recorded one (``ctx.memories``) or a live retrieve, and ``router.inject(goal, index,
    summary)`` decides each In step (every ``in_every``-th step; NoOp between) unless ``in_policy`` fixes it.
    """
    count_tokens = ctx.count_tokens or count_words
    t_task = time.perf_counter()
    probe_s = 0.0
    timed = None
    if router is not None:
        timed = _TimedRouter(router, in_every)
        t = time.perf_counter()
        previews = ctx.probe(task.goal) if ctx.probe else [p.probe(task.goal) for p in ctx.providers.values()]
        probe_s = time.perf_counter() - t
        begin = timed.begin(task.goal, previews, ctx.providers)
        memory = _begin_memory(ctx, task, begin)
        in_policy = in_policy or timed.in_policy
    in_policy = in_policy or "never"
    agent = demonstrator(ctx.agent, task)
    if error is not None:
        traj = Trajectory(task=task, steps=[], success=False, begin_provider=begin, error=error,
                          meta={"in_policy": in_policy})
    else:
        stm = ctx.short_term_factory() if ctx.short_term_factory is not None else None
        traj = run_episode(ctx.env, agent, task, begin_provider=begin, begin_memory=memory, in_policy=in_policy,
                           short_term=stm, max_steps=ctx.max_steps)
    elapsed = time.perf_counter() - t_task
    return Rollout(trajectory=traj, begin_provider=begin, begin_tokens=count_tokens(memory) if memory else 0,
                   in_tokens=sum(count_tokens(s.injected) for s in traj.steps if s.injected),
                   in_queries=sum(1 for s in traj.steps if s.injected),
                   in_decisions=sum(1 for s in traj.steps if (s.meta or {}).get("stm")),
                   elapsed_s=elapsed, probe_s=probe_s, router_s=timed.seconds if timed else 0.0,
                   agent=getattr(agent, "name", type(agent).__name__))


def is_demonstration(task: Task) -> bool:
    """A demonstration task (``worlds.TaskSpec.demonstration``): played by the expert, stored, not labelled."""
    return bool((task.meta or {}).get("demonstration"))


def demonstrator(agent, task: Task):
    """The agent that plays ``task``: the expert (walkthrough) agent for a demonstration, else ``agent``."""
    if not is_demonstration(task):
        return agent
    from routers.memagent.agent import WalkthroughAgent

    return WalkthroughAgent()


def _begin_memory(ctx: RolloutContext, task: Task, choice: str | None) -> str:
    if choice is None:
        return ""
    recorded = (ctx.memories or {}).get(task.task_id, {})
    return recorded[choice] if choice in recorded else ctx.providers[choice].retrieve(task.goal).text


# -- exploration records ------------------------------------------------------------------------------------
def rollout_id(task_id: str, option: str | None, policy: str) -> str:
    return f"{task_id}|{option or 'none'}|{policy}"


@dataclass
class RolloutJob:
    """One (task, Begin option, In policy) combination, with the Begin memory retrieved up front."""

    task: Task
    option: str | None
    policy: str
    memory: str
    item_ids: list[str]
    retrieve_error: str | None = None


def exploration_record(job: RolloutJob, ctx: RolloutContext) -> dict:
    """Play one combination; the exploration record (schema in the module docstring)."""
    r = rollout(ctx, job.task, job.option, job.policy, memory=job.memory, error=job.retrieve_error)
    traj, n = r.trajectory, r.steps
    return {"schema_version": SCHEMA_VERSION, "id": rollout_id(job.task.task_id, job.option, job.policy),
            "task_id": job.task.task_id, "split": job.task.split, "begin_provider": job.option,
            "in_policy": job.policy, "success": bool(traj.success), "steps": n, "reward": traj.reward,
            "max_score": job.task.meta.get("max_score"), "error": traj.error,
            "injected_tokens": r.injected_tokens, "begin_tokens": r.begin_tokens, "in_tokens": r.in_tokens,
            "in_queries": r.in_queries, "retrieved_item_ids": list(job.item_ids),
            "elapsed_s": round(r.elapsed_s, 4), "s_per_step": round(r.elapsed_s / n, 4) if n else None,
            "agent": r.agent, "trajectory": traj.to_dict()}


def validate_exploration(rec: dict) -> None:
    """An exploration record's fields (``trajectory`` and ``injected_tokens`` when present)."""
    if not isinstance(rec["task_id"], str) or not rec["task_id"]:
        raise ValueError("task_id must be a non-empty string")
    if rec["begin_provider"] is not None and not isinstance(rec["begin_provider"], str):
        raise ValueError(f"begin_provider must be a provider name or null, got {rec['begin_provider']!r}")
    if rec["in_policy"] not in IN_POLICIES:
        raise ValueError(f"in_policy must be one of {IN_POLICIES}, got {rec['in_policy']!r}")
    if not isinstance(rec["success"], bool):
        raise ValueError(f"success must be true or false, got {rec['success']!r}")
    if not isinstance(rec["steps"], int) or isinstance(rec["steps"], bool) or rec["steps"] < 0:
        raise ValueError(f"steps must be a non-negative integer, got {rec['steps']!r}")
    tokens = rec.get("injected_tokens", 0)
    if not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"injected_tokens must be a non-negative integer, got {tokens!r}")
    if "trajectory" not in rec:
        return
    traj = rec["trajectory"]
    if not isinstance(traj, dict) or not isinstance(traj.get("steps"), list) or "task" not in traj:
        raise ValueError("trajectory must be an object with 'task' and a 'steps' list")
    if len(traj["steps"]) != rec["steps"]:
        raise ValueError(f"steps={rec['steps']} but the trajectory has {len(traj['steps'])} steps")


_WORKER: dict = {}  # process-pool workers (forced exploration with num_workers > 1)


def init_worker(cfg: RolloutConfig) -> None:
    """Pool initializer: this process's own environment, agent and short-term memory; it ends with its parent."""
    import torch

    from routers.workers import exit_with_parent
    exit_with_parent()
    torch.set_num_threads(max(1, cfg.torch_threads))
    _WORKER["ctx"] = build_context(cfg)


def worker_rollout(job: RolloutJob) -> dict:
    return exploration_record(job, _WORKER["ctx"])
