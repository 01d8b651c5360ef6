"""Forced exploration for the MemAgent router (paper §data synthesis, Figure 4; DESIGN §6).

    memroute synth forced-exploration configs/memagent/synth/explore.yaml [--n_train 4 --providers '[voyager]' ...]

Per task (fixed order), every combination of Begin option (no memory + each provider) x In policy
(``inject``: Query whenever the short-term memory has content / ``never``: NoOp) is rolled out with the
same task agent; outcomes, trajectories, step counts and injected tokens are recorded. The providers are
read-only while a task's combinations run (their Begin memories are retrieved once, up front), so the
combinations can run in a process pool. When they are done the task's trajectory (or all of them,
``store_trajectories: all``) is stored into every provider through its outcome gate, in pool order, and
all provider states plus the progress are checkpointed in one atomic directory rename: a killed run
resumes exactly where it stopped, with the same stores and without duplicate records. Held-out tasks run
afterwards against the frozen training stores (nothing stored), for ``memroute eval memagent``.

Then the supervision (``data_synthesis.memagent_supervision``): Begin from correctness + judge
attribution, In from judge scores of Query vs NoOp, End from downstream reuse, reward-filtered into
``begin.jsonl``, ``in.jsonl``, ``end.jsonl`` (TRL conversational prompt-completion records plus
``phase``, ``task_id``, ``reward``).

Output directory::

    manifest.json                 config fingerprint (a resume with a different setup is refused)
    {split}/tasks.jsonl           one line per task: goal, probe previews, retrieved Begin memories
    {split}/exploration.jsonl     one line per rollout (schema below)
    stores/                       provider states after the last finished training task + progress.json
    stores.jsonl                  what each store wrote (task, rollout, provider, item ids, gated)
    judgments.jsonl               judge replies and parsed 0-5 scores (cache)
    begin.jsonl in.jsonl end.jsonl stats.json resolved_config.yaml

Exploration record (``schema_version`` 1): ``id`` ("task|option|policy"), ``task_id``, ``split``,
``begin_provider`` (null = no memory), ``in_policy``, ``success`` (bool), ``steps`` (int), ``reward``
(game score), ``max_score``, ``error`` (null or "Type: message"), ``injected_tokens`` (Begin + In),
``begin_tokens``, ``in_tokens``, ``in_queries``, ``retrieved_item_ids``, ``elapsed_s``, ``s_per_step``,
``agent``, ``trajectory`` (``Trajectory.to_dict()``; each step's ``meta.stm`` is the short-term summary
available at that step, ``meta.query`` whether it was injected).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from routers.io import OutputLock, ResumableJsonlWriter, atomic_write_json, atomic_write_text, read_jsonl
from routers.memagent.agent import IN_POLICIES
from routers.memagent.protocol import Task, Trajectory

FORMAT = "memroute.memagent.exploration"
SCHEMA_VERSION = 1
EXPLORATION_FIELDS = ("id", "task_id", "begin_provider", "in_policy", "success", "steps", "trajectory")
TASK_FIELDS = ("id", "task_id", "goal", "previews", "retrieved")
STORE_FIELDS = ("id", "task_id", "rollout_id", "provider", "item_ids")
PROGRESS_FILE = "progress.json"
# config fields that define the data: a resume with different values would mix two experiments
FINGERPRINT_FIELDS = ("providers", "include_no_memory", "in_policies", "n_train", "n_heldout", "env_seed",
                      "game_presets", "goal_style", "prune_commands", "agent", "agent_model", "agent_dtype",
                      "max_steps", "history_steps", "repeat_penalty", "length_norm", "store_trajectories",
                      "provider_llm", "provider_max_new_tokens", "encoder", "stm_max_words")


@dataclass
class ForcedExplorationConfig:
    """Options of ``memroute synth forced-exploration`` (YAML recipe + CLI overrides)."""

    output_dir: str = "outputs/memagent_data"
    splits: list[str] = field(default_factory=lambda: ["train", "heldout"],
                              metadata={"help": "explored in this order; only 'train' tasks are stored into memory"})
    stage: str = field(default="all", metadata={"help": "all | explore | label"})
    # environment
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
    # combinations
    providers: list[str] | None = field(default=None, metadata={"help": "Begin providers; None = all 13"})
    include_no_memory: bool = True
    in_policies: list[str] = field(default_factory=lambda: list(IN_POLICIES))
    # task agent
    agent: str = field(default="lm", metadata={"help": "lm (agent_model scores commands; openai:MODEL@URL picks by "
                                                       "number) | walkthrough (oracle) | random"})
    agent_model: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    agent_dtype: str = field(default="float32", metadata={"help": "float32 | bfloat16 | auto"})
    device: str | None = None
    history_steps: int = 3
    repeat_penalty: float = 1.0
    length_norm: str = "mean"
    num_workers: int = field(default=1, metadata={"help": "processes running one task's combinations"})
    torch_threads: int = field(default=1, metadata={"help": "torch threads per worker"})
    # memory
    encoder: str = "sentence-transformers/all-MiniLM-L6-v2"
    provider_llm: str = field(default="HuggingFaceTB/SmolLM2-135M-Instruct",
                              metadata={"help": "LLM backend the providers write memories with"})
    provider_max_new_tokens: int | None = field(default=None, metadata={"help": "cap on provider LLM generations"})
    stm_max_words: int = 160
    store_trajectories: str = field(default="representative", metadata={
        "help": "representative (per task: the shortest success, else the no-memory NoOp rollout) | all"})
    # supervision
    judge: str | None = field(default="HuggingFaceTB/SmolLM2-135M-Instruct",
                              metadata={"help": "judge LLM backend (openai:MODEL@URL for a real judge); none = outcome only"})
    judge_batch_size: int = 8
    judge_constrained: bool = field(default=True, metadata={
        "help": "force the 'Label: 0-5' reply format (local: restricted arg-max; HTTP: JSON-schema response_format) "
                "so every judgment parses; false = free generation + parsing"})
    judge_steps_per_rollout: int = 2
    begin_outcome_weight: float = 0.5
    begin_min_reward: float = 0.5
    in_outcome_weight: float = 0.0
    in_min_reward: float = 0.5
    end_min_reuse: float = 0.5
    end_min_retrievals: int = 1
    end_min_reward: float = 0.5
    seed: int = 0

    def __post_init__(self):
        if self.stage not in ("all", "explore", "label"):
            raise ValueError(f"stage must be all, explore or label, got {self.stage!r}")
        if self.store_trajectories not in ("representative", "all"):
            raise ValueError(f"store_trajectories must be representative or all, got {self.store_trajectories!r}")
        bad = [p for p in self.in_policies if p not in IN_POLICIES]
        if bad or not self.in_policies:
            raise ValueError(f"in_policies must be a non-empty subset of {IN_POLICIES}, got {self.in_policies}")
        bad = [s for s in self.splits if s not in ("train", "heldout")]
        if bad:
            raise ValueError(f"unknown split(s) {bad}; expected train / heldout")
        if self.agent not in ("lm", "walkthrough", "random"):
            raise ValueError(f"agent must be lm, walkthrough or random, got {self.agent!r}")
        from routers.validation import check_non_negative, check_positive, check_unit_interval

        if not self.splits:
            raise ValueError("splits is empty: give train and/or heldout")
        for split, n in (("train", "n_train"), ("heldout", "n_heldout")):
            if split in self.splits and getattr(self, n) < 1:
                raise ValueError(f"{n} must be >= 1 when splits includes {split!r}, got {getattr(self, n)}")
        check_non_negative(self, "n_train", "n_heldout", "history_steps", "judge_steps_per_rollout",
                           "end_min_retrievals", "repeat_penalty")
        check_positive(self, "max_steps", "num_workers", "torch_threads", "stm_max_words", "judge_batch_size",
                       "provider_max_new_tokens")
        check_unit_interval(self, "begin_outcome_weight", "begin_min_reward", "in_outcome_weight", "in_min_reward",
                            "end_min_reuse", "end_min_reward")
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
            if not self.providers and not self.include_no_memory:
                raise ValueError("providers is empty and include_no_memory is false: there is no Begin option to explore")


# -- combinations ---------------------------------------------------------------------------------------------
def combos(provider_names: Sequence[str], include_no_memory: bool, in_policies: Sequence[str]) -> list[tuple]:
    """(Begin option, In policy) pairs in a fixed order: no memory first, then pool order; policies inner."""
    options: list[str | None] = ([None] if include_no_memory else []) + list(provider_names)
    return [(o, p) for o in options for p in in_policies]


def rollout_id(task_id: str, option: str | None, policy: str) -> str:
    return f"{task_id}|{option or 'none'}|{policy}"


def validate_exploration(rec: dict) -> None:
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
    traj = rec["trajectory"]
    if not isinstance(traj, dict) or not isinstance(traj.get("steps"), list) or "task" not in traj:
        raise ValueError("trajectory must be an object with 'task' and a 'steps' list")
    if len(traj["steps"]) != rec["steps"]:
        raise ValueError(f"steps={rec['steps']} but the trajectory has {len(traj['steps'])} steps")


def load_exploration(path: str | os.PathLike) -> list[dict]:
    """Exploration records; a malformed one raises RecordError naming file and line."""
    return list(read_jsonl(path, required=EXPLORATION_FIELDS, validate=validate_exploration))


# -- building pieces from the config ------------------------------------------------------------------------
def build_env(cfg: ForcedExplorationConfig):
    from routers.memagent.textworld_env import TextWorldSuite

    return TextWorldSuite(cache_dir=cfg.games_dir, n_train=cfg.n_train, n_heldout=cfg.n_heldout, seed=cfg.env_seed,
                          max_steps=cfg.max_steps, presets=cfg.game_presets, goal_style=cfg.goal_style,
                          prune_commands=cfg.prune_commands)


def build_agent(cfg: ForcedExplorationConfig):
    from routers.memagent.agent import HTTPCommandAgent, LMCommandAgent, RandomCommandAgent, WalkthroughAgent

    if cfg.agent == "walkthrough":
        return WalkthroughAgent()
    if cfg.agent == "random":
        return RandomCommandAgent(cfg.seed)
    if cfg.agent_model.startswith("openai:"):
        from routers.models import make_backend

        return HTTPCommandAgent(make_backend(cfg.agent_model), history_steps=cfg.history_steps)
    return LMCommandAgent.from_pretrained(cfg.agent_model, dtype=cfg.agent_dtype, device=cfg.device,
                                          history_steps=cfg.history_steps, repeat_penalty=cfg.repeat_penalty,
                                          length_norm=cfg.length_norm)


def token_counter(agent) -> Callable[[str], int]:
    """The agent's tokenizer when it has one (what the injected memory costs it), else whitespace words."""
    tok = getattr(agent, "tokenizer", None)
    if tok is not None:
        return lambda text: len(tok(text, add_special_tokens=False)["input_ids"]) if text else 0
    return lambda text: len(text.split()) if text else 0


def build_providers_from(cfg: ForcedExplorationConfig) -> dict:
    from routers.memagent.providers import PROVIDER_NAMES, build_providers
    from routers.models import make_backend

    names = list(cfg.providers) if cfg.providers is not None else list(PROVIDER_NAMES)
    kw = {} if cfg.provider_max_new_tokens is None else {"max_new_tokens": cfg.provider_max_new_tokens}
    return build_providers(names, encoder=cfg.encoder, llm=make_backend(cfg.provider_llm), **kw)


# -- one rollout (in-process or in a worker) -------------------------------------------------------------------
@dataclass
class RolloutJob:
    task: Task
    option: str | None
    policy: str
    memory: str
    item_ids: list[str]
    retrieve_error: str | None = None


def run_rollout(job: RolloutJob, env, agent, short_term_factory, count_tokens, max_steps: int) -> dict:
    """One exploration record. Never raises for agent/LLM/env errors: they land in ``error``."""
    from routers.memagent.agent import run_episode

    t0 = time.perf_counter()
    if job.retrieve_error is not None:  # the Begin memory could not be retrieved: the rollout fails with it
        traj = Trajectory(task=job.task, steps=[], success=False, begin_provider=job.option,
                          error=job.retrieve_error, meta={"in_policy": job.policy})
    else:
        stm = short_term_factory() if short_term_factory is not None else None
        traj = run_episode(env, agent, job.task, begin_provider=job.option, begin_memory=job.memory,
                           in_policy=job.policy, short_term=stm, max_steps=max_steps)
    elapsed = time.perf_counter() - t0
    begin_tokens = count_tokens(job.memory) if job.memory else 0
    in_tokens = sum(count_tokens(s.injected) for s in traj.steps if s.injected)
    n = len(traj.steps)
    return {"schema_version": SCHEMA_VERSION, "id": rollout_id(job.task.task_id, job.option, job.policy),
            "task_id": job.task.task_id, "split": job.task.split, "begin_provider": job.option,
            "in_policy": job.policy, "success": bool(traj.success), "steps": n, "reward": traj.reward,
            "max_score": job.task.meta.get("max_score"), "error": traj.error,
            "injected_tokens": begin_tokens + in_tokens, "begin_tokens": begin_tokens, "in_tokens": in_tokens,
            "in_queries": sum(1 for s in traj.steps if s.injected), "retrieved_item_ids": list(job.item_ids),
            "elapsed_s": round(elapsed, 4), "s_per_step": round(elapsed / n, 4) if n else None,
            "agent": getattr(agent, "name", type(agent).__name__), "trajectory": traj.to_dict()}


_WORKER: dict = {}


def _init_worker(cfg: ForcedExplorationConfig) -> None:
    import torch

    from routers.memagent.providers import ShortTermMemory

    torch.set_num_threads(max(1, cfg.torch_threads))
    agent = build_agent(cfg)
    _WORKER.update(env=build_env(cfg), agent=agent, count=token_counter(agent), max_steps=cfg.max_steps,
                   stm=lambda: ShortTermMemory(max_words=cfg.stm_max_words))


def _worker_rollout(job: RolloutJob) -> dict:
    w = _WORKER
    return run_rollout(job, w["env"], w["agent"], w["stm"], w["count"], w["max_steps"])


# -- the explorer ------------------------------------------------------------------------------------------------
def fingerprint(cfg: ForcedExplorationConfig) -> dict:
    return {k: getattr(cfg, k) for k in FINGERPRINT_FIELDS}


def choose_to_store(records: Sequence[dict], mode: str) -> list[dict]:
    """Which of a task's rollouts go into memory: the shortest success (ties: combination order), else the
    no-memory NoOp rollout (else the first rollout without error); ``all``: every rollout without error."""
    ok = [r for r in records if not r.get("error")]
    if mode == "all":
        return ok
    wins = [r for r in ok if r["success"]]
    if wins:
        return [min(wins, key=lambda r: r["steps"])]
    base = [r for r in ok if r["begin_provider"] is None and r["in_policy"] == "never"]
    return base[:1] or ok[:1]


class ForcedExplorer:
    """Runs the exploration. Pieces can be injected (tests, custom environments/agents); otherwise they
    are built from the config. With ``num_workers > 1`` the rollouts run in a spawned process pool whose
    workers build their own environment and agent from the config (injected env/agent stay in-process)."""

    def __init__(self, cfg: ForcedExplorationConfig, env=None, agent=None, providers: Mapping | None = None,
                 short_term_factory: Callable | None = None, probe: Callable | None = None, progress: bool = True):
        self.cfg = cfg
        self.out = Path(cfg.output_dir)
        self._injected_runtime = env is not None or agent is not None
        self.env = env if env is not None else build_env(cfg)
        self._agent = agent
        self.providers = dict(providers) if providers is not None else build_providers_from(cfg)
        if short_term_factory is None:
            from routers.memagent.providers import ShortTermMemory

            short_term_factory = lambda: ShortTermMemory(max_words=cfg.stm_max_words)  # noqa: E731
        self.short_term_factory = short_term_factory
        self._probe = probe
        self.progress = progress
        self.counts: Counter = Counter()

    @property
    def agent(self):
        if self._agent is None:
            self._agent = build_agent(self.cfg)
        return self._agent

    def probe(self, goal: str) -> list:
        if self._probe is None:
            from routers.memagent.providers import BaseProvider, ProviderProbe

            if self.providers and all(isinstance(p, BaseProvider) for p in self.providers.values()):
                self._probe = ProviderProbe(self.providers).probe  # one vectorized pass
            else:  # any protocol provider
                self._probe = lambda g: [p.probe(g) for p in self.providers.values()]
        return self._probe(goal)

    # -- manifest / checkpoint ----------------------------------------------------------------------------
    def check_manifest(self) -> None:
        path = self.out / "manifest.json"
        fp = fingerprint(self.cfg)
        if path.exists():
            try:
                old = json.loads(path.read_text(encoding="utf-8"))
                if not isinstance(old, dict) or not isinstance(old.get("fingerprint"), dict):
                    raise ValueError("no 'fingerprint' object")
            except (OSError, ValueError) as err:
                raise ValueError(f"{path}: unreadable manifest ({err}); use a new output_dir, or remove the "
                                 "directory to start over") from None
            diff = {k: (old["fingerprint"].get(k), v) for k, v in json.loads(json.dumps(fp)).items()
                    if old["fingerprint"].get(k) != v}
            if diff:
                raise ValueError(f"{self.out} was explored with a different setup {diff} (saved, now); "
                                 "use a new output_dir or restore the settings to resume")
            return
        atomic_write_json(path, {"format": FORMAT, "schema_version": SCHEMA_VERSION, "fingerprint": fp,
                                 "providers": list(self.providers)})

    def load_checkpoint(self) -> dict:
        """Restore provider states and progress from ``stores/`` (empty progress if there is none)."""
        stores = self.out / "stores"
        if not (stores / PROGRESS_FILE).exists():
            return {"tasks_done": [], "store_log": []}
        progress = json.loads((stores / PROGRESS_FILE).read_text())
        missing = [n for n in self.providers if not (stores / n).exists()]
        if missing:
            raise FileNotFoundError(f"{stores}: no saved state for provider(s) {missing}")
        for name, p in self.providers.items():
            p.load(stores / name)
        return progress

    def checkpoint(self, progress: dict) -> None:
        """Provider states + progress in one directory, replaced in one rename (never half-written)."""
        from routers.base import atomic_directory

        with atomic_directory(self.out / "stores", "providers") as tmp:
            for name, p in self.providers.items():
                p.save(Path(tmp) / name)
            atomic_write_json(Path(tmp) / "providers.json", {"providers": list(self.providers)})
            atomic_write_json(Path(tmp) / PROGRESS_FILE, progress)

    def sync_store_log(self, progress: dict) -> None:
        with ResumableJsonlWriter(self.out / "stores.jsonl") as w:
            for rec in progress["store_log"]:
                w.write(rec)

    # -- per task -----------------------------------------------------------------------------------------------
    def task_record(self, task: Task, writer: ResumableJsonlWriter) -> dict:
        """Previews and Begin memories of a task; reused from ``tasks.jsonl`` on resume (same stores)."""
        if task.task_id in writer:
            return self._task_records[task.task_id]
        previews = [asdict(p) for p in self.probe(task.goal)]
        retrieved = {}
        for name, p in self.providers.items():
            try:
                r = p.retrieve(task.goal)
                retrieved[name] = {"text": r.text, "item_ids": list(r.item_ids), "error": None}
            except Exception as err:  # noqa: BLE001 - that provider's rollouts fail with this reason
                retrieved[name] = {"text": "", "item_ids": [], "error": f"retrieve: {type(err).__name__}: {err}"}
        rec = {"schema_version": SCHEMA_VERSION, "id": task.task_id, "task_id": task.task_id, "split": task.split,
               "goal": task.goal, "task": asdict(task), "previews": previews, "retrieved": retrieved}
        writer.write(rec)
        self._task_records[task.task_id] = rec
        return rec

    def jobs(self, task: Task, trec: dict, done: set[str]) -> list[RolloutJob]:
        out = []
        for option, policy in combos(list(self.providers), self.cfg.include_no_memory, self.cfg.in_policies):
            if rollout_id(task.task_id, option, policy) in done:
                continue
            r = trec["retrieved"][option] if option is not None else {"text": "", "item_ids": [], "error": None}
            out.append(RolloutJob(task, option, policy, r["text"], r["item_ids"], r.get("error")))
        return out

    def _run_jobs(self, jobs: list[RolloutJob], pool, writer, bar) -> None:
        if pool is None:
            count = token_counter(self.agent)
            for job in jobs:
                rec = run_rollout(job, self.env, self.agent, self.short_term_factory, count, self.cfg.max_steps)
                self._record(rec, writer, bar)
            return
        from concurrent.futures import as_completed

        # written as they finish (a kill loses only running rollouts); the set of records does not depend on
        # the worker count, only their order in the file does
        for fut in as_completed([pool.submit(_worker_rollout, job) for job in jobs]):
            self._record(fut.result(), writer, bar)

    def _record(self, rec: dict, writer, bar) -> None:
        writer.write(rec)
        self.counts["rollouts"] += 1
        self.counts["successes"] += rec["success"]
        self.counts["errors"] += bool(rec["error"])
        if bar is not None:
            bar.update(1)
            bar.set_postfix(success=self.counts["successes"], errors=self.counts["errors"])

    def store_task(self, task: Task, records: list[dict], progress: dict) -> None:
        """Store the chosen rollouts into every provider (pool order) through its outcome gate."""
        for rec in choose_to_store(records, self.cfg.store_trajectories):
            traj = Trajectory.from_dict(rec["trajectory"])
            for name, p in self.providers.items():
                item_ids, gated, error = [], not _accepts(p, traj), None
                t0 = time.perf_counter()
                if not gated:
                    try:
                        item_ids = [it.item_id for it in p.store(traj)]
                    except Exception as err:  # noqa: BLE001 - isolated per provider (stores are atomic), logged
                        error = f"{type(err).__name__}: {err}"
                        self.counts["store_errors"] += 1
                progress["store_log"].append({
                    "id": f"{rec['id']}|{name}", "task_id": task.task_id, "rollout_id": rec["id"], "provider": name,
                    "success": rec["success"], "item_ids": item_ids, "gated": gated, "error": error,
                    "store_s": round(time.perf_counter() - t0, 4)})

    # -- run ---------------------------------------------------------------------------------------------------------
    def explore(self) -> dict:
        from tqdm.auto import tqdm

        self.out.mkdir(parents=True, exist_ok=True)
        self.check_manifest()
        progress = self.load_checkpoint()
        self.sync_store_log(progress)
        pool = None
        if self.cfg.num_workers > 1 and not self._injected_runtime:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            pool = ProcessPoolExecutor(self.cfg.num_workers, mp_context=mp.get_context("spawn"),
                                       initializer=_init_worker, initargs=(self.cfg,))
        t0 = time.perf_counter()
        try:
            for split in self.cfg.splits:
                self._explore_split(split, progress, pool, tqdm)
        finally:
            if pool is not None:
                pool.shutdown()
        self.counts["explore_s"] = round(time.perf_counter() - t0, 2)
        return dict(self.counts)

    def _explore_split(self, split: str, progress: dict, pool, tqdm) -> None:
        tasks = self.env.tasks(split, progress=self.progress) if _takes_progress(self.env) else self.env.tasks(split)
        store = split == "train"
        split_dir = self.out / split
        n_combos = len(combos(list(self.providers), self.cfg.include_no_memory, self.cfg.in_policies))
        with ResumableJsonlWriter(split_dir / "exploration.jsonl") as writer, \
                ResumableJsonlWriter(split_dir / "tasks.jsonl") as twriter:
            self._task_records = {r["id"]: r for r in read_jsonl(twriter.path)} if twriter.path.exists() else {}
            if store and set(progress["tasks_done"]) - {t.task_id for t in tasks}:
                raise ValueError(f"{self.out}/stores holds tasks that are not in this split's task list")
            pending = sum(1 for t in tasks for o, p in combos(list(self.providers), self.cfg.include_no_memory,
                                                               self.cfg.in_policies)
                          if rollout_id(t.task_id, o, p) not in writer)
            bar = tqdm(total=pending, desc=f"explore {split}", unit="rollout", disable=not self.progress,
                       file=sys.stderr)
            for task in tasks:
                if store and task.task_id in progress["tasks_done"]:
                    continue
                trec = self.task_record(task, twriter)
                jobs = self.jobs(task, trec, writer.done)
                self._run_jobs(jobs, pool, writer, bar)
                if store:
                    records = [r for r in read_jsonl(writer.path) if r["task_id"] == task.task_id]
                    if len(records) != n_combos:
                        raise RuntimeError(f"task {task.task_id}: {len(records)} records for {n_combos} combinations")
                    records.sort(key=lambda r: _combo_index(r, list(self.providers), self.cfg))
                    self.store_task(task, records, progress)
                    progress["tasks_done"].append(task.task_id)
                    self.checkpoint(progress)
                    self.sync_store_log(progress)
            bar.close()


def _accepts(provider, trajectory: Trajectory) -> bool:
    """The provider's outcome gate (its own ``accepts`` when it has one); errored rollouts are never stored."""
    if hasattr(provider, "accepts"):
        return bool(provider.accepts(trajectory))
    return not trajectory.error and (provider.gate == "all" or bool(trajectory.success))


def _takes_progress(env) -> bool:
    import inspect

    try:
        return "progress" in inspect.signature(env.tasks).parameters
    except (TypeError, ValueError):
        return False


def _combo_index(rec: dict, names: list[str], cfg: ForcedExplorationConfig) -> int:
    order = combos(names, cfg.include_no_memory, cfg.in_policies)
    return order.index((rec["begin_provider"], rec["in_policy"]))


# -- supervision stage ------------------------------------------------------------------------------------------
def label(cfg: ForcedExplorationConfig, providers: Mapping | None = None, judge=None, progress: bool = True) -> dict:
    """Judge (cached) and write begin/in/end.jsonl + stats.json from the training split's records."""
    from data_synthesis import memagent_supervision as S
    from routers.models import make_backend

    out = Path(cfg.output_dir)
    if providers is None:
        from routers.memagent.providers import PROVIDER_NAMES, build_providers

        providers = build_providers(list(cfg.providers) if cfg.providers is not None else list(PROVIDER_NAMES))
    if judge is None and cfg.judge and cfg.judge.lower() not in ("none", "null"):
        kw = {} if cfg.judge.startswith("openai:") else {"batch_size": cfg.judge_batch_size}
        judge = make_backend(cfg.judge, **kw)
    rollouts = load_exploration(out / "train" / "exploration.jsonl")
    tasks = list(read_jsonl(out / "train" / "tasks.jsonl", required=TASK_FIELDS))
    stores_path = out / "stores.jsonl"
    stores = list(read_jsonl(stores_path, required=STORE_FIELDS)) if stores_path.exists() else []
    unknown = sorted({r["begin_provider"] for r in rollouts if r["begin_provider"] is not None} - set(providers))
    if unknown:
        raise ValueError(f"exploration records name providers {unknown} that are not in the pool {list(providers)}")
    counts: Counter = Counter()
    requests = S.judge_requests(rollouts, cfg.judge_steps_per_rollout)
    judgments, jcounts = S.run_judge(requests, judge, out / "judgments.jsonl", cfg.judge_batch_size,
                                     progress=progress, constrained=cfg.judge_constrained)
    counts.update(jcounts)
    begin = S.begin_labels(tasks, rollouts, providers, judgments, cfg.begin_outcome_weight, cfg.begin_min_reward,
                           counts)
    inn = S.in_labels(rollouts, judgments, cfg.judge_steps_per_rollout, cfg.in_outcome_weight, cfg.in_min_reward,
                      counts)
    end = S.end_labels(stores, rollouts, providers, [t["task_id"] for t in tasks], cfg.end_min_reuse,
                       cfg.end_min_retrievals, cfg.end_min_reward, counts)
    for name, recs in (("begin", begin), ("in", inn), ("end", end)):
        atomic_write_text(out / f"{name}.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
    stats = summarize(rollouts, begin, inn, end, counts, list(providers), cfg)
    atomic_write_json(out / "stats.json", stats)
    return stats


def summarize(rollouts, begin, inn, end, counts: Counter, names: Sequence[str], cfg) -> dict:
    """Success rates per option and policy, coverage (Table 13 style), timings, label counts."""
    options = ([None] if cfg.include_no_memory else []) + list(names)
    by_opt: dict[str, dict] = {}
    for o in options:
        for pol in cfg.in_policies:
            rs = [r for r in rollouts if r["begin_provider"] == o and r["in_policy"] == pol]
            if rs:
                by_opt[f"{o or 'None'}|{pol}"] = {"rollouts": len(rs), "success_rate": sum(r["success"] for r in rs) / len(rs),
                                                  "avg_steps": sum(r["steps"] for r in rs) / len(rs),
                                                  "injected_tokens": sum(r["injected_tokens"] for r in rs) / len(rs)}
    tasks = sorted({r["task_id"] for r in rollouts})
    solved_by = {t: len({r["begin_provider"] for r in rollouts if r["task_id"] == t and r["success"]}) for t in tasks}
    steps = sum(r["steps"] for r in rollouts)
    secs = sum(r.get("elapsed_s") or 0 for r in rollouts)
    return {"format": FORMAT, "schema_version": SCHEMA_VERSION, "tasks": len(tasks), "rollouts": len(rollouts),
            "errors": sum(bool(r["error"]) for r in rollouts),
            "success_rate": sum(r["success"] for r in rollouts) / len(rollouts) if rollouts else None,
            "by_option": by_opt, "coverage": {"options": len(options), "histogram": dict(Counter(solved_by.values()))},
            "timing": {"s_per_step": secs / steps if steps else None,
                       "s_per_rollout": secs / len(rollouts) if rollouts else None, "steps": steps},
            "labels": {"begin": len(begin), "in": len(inn), "end": len(end),
                       "begin_decisions": dict(Counter(str(r["decision"]) for r in begin)),
                       "in_decisions": dict(Counter(r["decision"] for r in inn)),
                       "end_sizes": dict(Counter(len(r["decision"]) for r in end))},
            "counts": dict(counts)}


def make_parser():
    from routers.config import make_arg_parser

    return make_arg_parser([ForcedExplorationConfig], prog="memroute synth forced-exploration",
                           description="Forced exploration (Begin option x In policy per task) and MemAgent supervision.")


def main(argv=None) -> dict:
    from routers.config import parse_config, save_resolved_config

    (cfg,) = parse_config(make_parser(), [ForcedExplorationConfig], argv)
    with OutputLock(cfg.output_dir):  # for the whole run: a second run into the same directory fails at once
        return _main(cfg, save_resolved_config)


def _main(cfg: ForcedExplorationConfig, save_resolved_config) -> dict:
    save_resolved_config(cfg.output_dir, cfg)
    result: dict[str, Any] = {}
    if cfg.stage in ("all", "explore"):
        result["explore"] = ForcedExplorer(cfg).explore()
        print(f"[memroute] exploration: {result['explore']}", file=sys.stderr)
    if cfg.stage in ("all", "label"):
        if "train" not in cfg.splits and cfg.stage == "all":
            return result
        stats = label(cfg)
        result["labels"] = stats["labels"]
        print(f"[memroute] supervision: {stats['labels']} success_rate={stats['success_rate']} "
              f"judge={ {k: v for k, v in stats['counts'].items() if k.startswith('judge')} }", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
