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
A demonstration task (``task.meta["demonstration"]``, the worlds suite's first visits) has one rollout,
played by the expert agent without memory, and is stored but never labelled.

Then the supervision (``data_synthesis.memagent_supervision``): Begin from correctness + judge
attribution, In from judge scores of Query vs NoOp, End from downstream reuse, reward-filtered into
``begin.jsonl``, ``in.jsonl``, ``end.jsonl`` (TRL conversational prompt-completion records plus
``phase``, ``task_id``, ``reward``).

Output directory::

    manifest.json                 config fingerprint (a resume with a different setup is refused)
    {split}/tasks.jsonl           one line per task: goal, probe previews, retrieved Begin memories
    {split}/exploration.jsonl     one line per rollout (schema: routers.memagent.rollout)
    stores/                       provider states after the last finished training task + progress.json
    stores.jsonl                  what each store wrote (task, rollout, provider, item ids, gated)
    judgments.jsonl               judge replies and parsed 0-5 scores (cache)
    begin.jsonl in.jsonl end.jsonl stats.json resolved_config.yaml

The exploration record (``schema_version`` 1), the rollout that writes it, its validator and the runtime
builders live in :mod:`routers.memagent.rollout`, shared with ``memroute eval memagent``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from data_synthesis.memagent_label import STORE_FIELDS, TASK_FIELDS, label, load_exploration  # noqa: F401
from routers.io import OutputLock, ResumableJsonlWriter, atomic_write_json, read_jsonl
from routers.logs import get_logger, setup_cli_logging
from routers.memagent.agent import IN_POLICIES
from routers.memagent.protocol import Task, Trajectory
from routers.memagent.rollout import (  # noqa: F401 - RolloutJob, token_counter: importable from here as before
    EXPLORATION_FIELDS, FORMAT, SCHEMA_VERSION, RolloutConfig, RolloutContext, RolloutJob, build_agent, build_env,
    build_providers_from, env_tasks, exploration_record, init_worker, is_demonstration, probe_function, rollout_id,
    token_counter, validate_exploration, worker_rollout, WORLD_OPTIONS, short_term_factory as _stm_factory)

log = get_logger("data_synthesis.memagent")  # the same name under python -m
PROGRESS_FILE = "progress.json"
# config fields that define the data: a resume with different values would mix two experiments
FINGERPRINT_FIELDS = ("providers", "include_no_memory", "in_policies", "n_train", "n_heldout", "env_seed",
                      "game_presets", "goal_style", "prune_commands", "agent", "agent_model", "agent_dtype",
                      "max_steps", "history_steps", "repeat_penalty", "length_norm", "store_trajectories",
                      "provider_llm", "provider_max_new_tokens", "encoder", "stm_max_words")


@dataclass
class ForcedExplorationConfig(RolloutConfig):
    """Options of ``memroute synth forced-exploration`` (YAML recipe + CLI overrides); the environment, agent
    and provider options are inherited from :class:`routers.memagent.rollout.RolloutConfig`."""

    output_dir: str = "outputs/memagent_data"
    splits: list[str] = field(default_factory=lambda: ["train", "heldout"],
                              metadata={"help": "explored in this order; only 'train' tasks are stored into memory"})
    stage: str = field(default="all", metadata={"help": "all | explore | label"})
    # combinations
    include_no_memory: bool = True
    in_policies: list[str] = field(default_factory=lambda: list(IN_POLICIES))
    heldout_in_policies: list[str] | None = field(default=None, metadata={
        "help": "In policies played on held-out tasks (null = in_policies). Held-out rollouts only score the "
                "baselines (eval reads baseline_in_policy) and each names its policy, so this may change on a resume"})
    num_workers: int = field(default=1, metadata={"help": "processes running one task's combinations"})
    # memory
    store_trajectories: str = field(default="representative", metadata={
        "help": "representative (per task: the shortest success, else the no-memory NoOp rollout) | all"})
    # supervision
    judge: str | None = field(default="HuggingFaceTB/SmolLM2-135M-Instruct",
                              metadata={"help": "judge LLM backend (openai:MODEL@URL for a real judge); none = outcome only"})
    judge_batch_size: int = 8
    judge_dtype: str = field(default="float32", metadata={
        "help": "local judge: float32 | bfloat16 | auto (bfloat16 where supported: a 0.5B judge ~2x faster on CPU)"})
    judge_constrained: bool = field(default=True, metadata={
        "help": "force the 'Label: 0-5' reply format (local: restricted arg-max; HTTP: JSON-schema response_format) "
                "so every judgment parses; false = free generation + parsing"})
    judge_steps_per_rollout: int = 2
    begin_outcome_weight: float = 0.5
    begin_min_reward: float = 0.5
    begin_step_tolerance: float = field(default=0.0, metadata={
        "help": "Begin labels: options within this many steps of the fewest (at the best reward) tie, and the one "
                "injecting fewer memory tokens wins (no memory first)"})
    in_outcome_weight: float = 0.0
    in_min_reward: float = 0.5
    end_min_reuse: float = 0.5
    end_min_retrievals: int = 1
    end_min_reward: float = 0.5

    def __post_init__(self):
        from routers.validation import check_non_negative, check_positive, check_unit_interval

        if self.stage not in ("all", "explore", "label"):
            raise ValueError(f"stage must be all, explore or label, got {self.stage!r}")
        if self.store_trajectories not in ("representative", "all"):
            raise ValueError(f"store_trajectories must be representative or all, got {self.store_trajectories!r}")
        bad = [p for p in self.in_policies if p not in IN_POLICIES]
        if bad or not self.in_policies:
            raise ValueError(f"in_policies must be a non-empty subset of {IN_POLICIES}, got {self.in_policies}")
        if self.judge_dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ValueError(f"judge_dtype must be float32, bfloat16, float16 or auto, got {self.judge_dtype!r}")
        bad = [p for p in self.heldout_in_policies or () if p not in IN_POLICIES]
        if bad or self.heldout_in_policies == []:
            raise ValueError(f"heldout_in_policies must be null or a non-empty subset of {IN_POLICIES}, "
                             f"got {self.heldout_in_policies}")
        bad = [s for s in self.splits if s not in ("train", "heldout")]
        if bad:
            raise ValueError(f"unknown split(s) {bad}; expected train / heldout")
        if not self.splits:
            raise ValueError("splits is empty: give train and/or heldout")
        for split, n in (("train", "n_train"), ("heldout", "n_heldout")):
            if split in self.splits and getattr(self, n) < 1:
                raise ValueError(f"{n} must be >= 1 when splits includes {split!r}, got {getattr(self, n)}")
        super().__post_init__()  # environment, agent and provider options
        check_non_negative(self, "judge_steps_per_rollout", "end_min_retrievals", "begin_step_tolerance")
        check_positive(self, "num_workers", "judge_batch_size")
        check_unit_interval(self, "begin_outcome_weight", "begin_min_reward", "in_outcome_weight", "in_min_reward",
                            "end_min_reuse", "end_min_reward")
        if self.providers is not None and not self.providers and not self.include_no_memory:
            raise ValueError("providers is empty and include_no_memory is false: there is no Begin option to explore")


# -- combinations ---------------------------------------------------------------------------------------------
def combos(provider_names: Sequence[str], include_no_memory: bool, in_policies: Sequence[str]) -> list[tuple]:
    """(Begin option, In policy) pairs in a fixed order: no memory first, then pool order; policies inner."""
    options: list[str | None] = ([None] if include_no_memory else []) + list(provider_names)
    return [(o, p) for o in options for p in in_policies]


def task_combos(task: Task, cfg: "ForcedExplorationConfig", provider_names: Sequence[str]) -> list[tuple]:
    """A task's combinations: every one, or for a demonstration (played by the expert) one, no memory. A
    held-out task plays ``heldout_in_policies`` when set."""
    if is_demonstration(task):
        return [(None, "never")]
    policies = cfg.heldout_in_policies if task.split == "heldout" and cfg.heldout_in_policies else cfg.in_policies
    return combos(provider_names, cfg.include_no_memory, policies)


def frozen_providers(cfg: ForcedExplorationConfig, exploration_dir: str | os.PathLike) -> dict:
    """The providers of ``cfg`` holding the training stores an exploration ended with (``stores/``), for
    evaluation: nothing is stored into them afterwards."""
    from routers.memagent.providers import load_providers

    providers = build_providers_from(cfg)  # this module's name: tests replace it with fake encoders/LLMs
    load_providers(providers, Path(exploration_dir) / "stores")
    return providers


# -- the explorer ------------------------------------------------------------------------------------------------
def fingerprint(cfg: ForcedExplorationConfig) -> dict:  # world options / a copy prior only when used: old runs resume
    fp = {k: getattr(cfg, k) for k in FINGERPRINT_FIELDS + (WORLD_OPTIONS if cfg.env != "textworld" else ())
          + (("memory_prior",) if cfg.memory_prior else ())}
    defaults = {f.name: f.default_factory() if f.default_factory is not MISSING else f.default for f in fields(cfg)}
    # added later: at their default, as before, old runs resume
    for key in ("world_moved_to", "world_moved_object", "worlds_train_unseen"):
        if key in fp and fp[key] == defaults[key]:
            del fp[key]
    return fp


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
        self.short_term_factory = short_term_factory if short_term_factory is not None else _stm_factory(cfg)
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
            self._probe = probe_function(self.providers)
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
        from routers.memagent.providers import save_providers

        save_providers(self.providers, self.out / "stores", extra={PROGRESS_FILE: progress})

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
        for option, policy in task_combos(task, self.cfg, list(self.providers)):
            if rollout_id(task.task_id, option, policy) in done:
                continue
            r = trec["retrieved"][option] if option is not None else {"text": "", "item_ids": [], "error": None}
            out.append(RolloutJob(task, option, policy, r["text"], r["item_ids"], r.get("error")))
        return out

    def _run_jobs(self, jobs: list[RolloutJob], pool, writer, bar) -> None:
        if pool is None:
            ctx = RolloutContext(env=self.env, tasks=[], agent=self.agent, providers={},
                                 short_term_factory=self.short_term_factory, count_tokens=token_counter(self.agent),
                                 max_steps=self.cfg.max_steps)
            for job in jobs:
                self._record(exploration_record(job, ctx), writer, bar)
            return
        from concurrent.futures import as_completed

        # written as they finish (a kill loses only running rollouts); the set of records does not depend on
        # the worker count, only their order in the file does
        for fut in as_completed([pool.submit(worker_rollout, job) for job in jobs]):
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
                                       initializer=init_worker, initargs=(self.cfg,))
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
        tasks = env_tasks(self.env, split, progress=self.progress)
        store = split == "train"
        split_dir = self.out / split
        with ResumableJsonlWriter(split_dir / "exploration.jsonl") as writer, \
                ResumableJsonlWriter(split_dir / "tasks.jsonl") as twriter:
            self._task_records = {r["id"]: r for r in read_jsonl(twriter.path)} if twriter.path.exists() else {}
            if store and set(progress["tasks_done"]) - {t.task_id for t in tasks}:
                raise ValueError(f"{self.out}/stores holds tasks that are not in this split's task list")
            pending = sum(1 for t in tasks for o, p in task_combos(t, self.cfg, list(self.providers))
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
                    order = task_combos(task, self.cfg, list(self.providers))
                    if len(records) != len(order):
                        raise RuntimeError(f"task {task.task_id}: {len(records)} records for {len(order)} combinations")
                    records.sort(key=lambda r: order.index((r["begin_provider"], r["in_policy"])))
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


def make_parser():
    from routers.config import make_arg_parser

    return make_arg_parser([ForcedExplorationConfig], prog="memroute synth forced-exploration",
                           description="Forced exploration (Begin option x In policy per task) and MemAgent supervision.")


def main(argv=None) -> dict:
    from routers.config import parse_config, save_resolved_config
    setup_cli_logging()  # a CLI entry point (memroute synth forced-exploration, python -m data_synthesis.memagent)
    (cfg,) = parse_config(make_parser(), [ForcedExplorationConfig], argv)
    with OutputLock(cfg.output_dir):  # for the whole run: a second run into the same directory fails at once
        return _main(cfg, save_resolved_config)


def _main(cfg: ForcedExplorationConfig, save_resolved_config) -> dict:
    save_resolved_config(cfg.output_dir, cfg)
    result: dict[str, Any] = {}
    if cfg.stage in ("all", "explore"):
        result["explore"] = ForcedExplorer(cfg).explore()
        log.info("exploration: %s", result["explore"])
    if cfg.stage in ("all", "label"):
        if "train" not in cfg.splits and cfg.stage == "all":
            return result
        stats = label(cfg)
        result["labels"] = stats["labels"]
        log.info("supervision: %s success_rate=%s judge=%s", stats["labels"], stats["success_rate"],
                 {k: v for k, v in stats["counts"].items() if k.startswith("judge")})
    return result


if __name__ == "__main__":
    main()
