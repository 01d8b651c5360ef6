"""``WorldSuite``: the persistent-world task families (:mod:`routers.memagent.worlds`) as a TaskEnvironment.

Games are compiled once and cached under ``cache_dir/worlds/<suite key>/`` (one ``.z8`` per task, written
under a temporary name and renamed), next to ``manifest.json``: the configuration, every world (map,
holders, objects) and every task (family, split, goal, walkthrough, optimal steps, budget, sibling, game
file, compile error). A later run loads the manifest instead of regenerating, validating it first (a bad
field raises :class:`WorldManifestError` naming the file and the field, e.g. ``tasks[3].budget``).

A game that fails to compile stays in the task list with ``meta["compile_error"]``: ``reset`` raises, which
``run_episode`` turns into a failed rollout (``Trajectory.error``), so it is recorded, never dropped; the
next run retries the compilation. ``step`` ends the episode (``done``, not won) once the task's step
budget is spent.

Action spaces (``actions``): ``goal`` (default) offers the moves plus taking the goal's object and putting it on
the table, so the task is pure navigation: *where* the object is and the way there and back is what the agent
must know (a 135M agent otherwise spends its budget taking and dropping whatever is in reach); ``verbs`` offers
every go / take / put command; ``all`` every admissible command.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import asdict, fields
from pathlib import Path

from routers.logs import get_logger
from routers.memagent.protocol import Observation, Task
from routers.memagent.textworld_env import GameSession
from routers.memagent.worlds import (FAMILIES, GENERATOR_VERSION, SPLITS, TARGET, TaskSpec, WorldConfig,
                                     WorldSpec, build_suite, compile_task)

logger = get_logger(__name__)
FORMAT = "memroute.memagent.worlds"
SCHEMA_VERSION = 1
_KEEP_VERBS = ("go ", "take ", "put ")  # containers are open; insert/drop/examine only waste steps
ACTION_SPACES = ("goal", "verbs", "all")
TASK_FIELDS = {"task_id": str, "world_id": str, "family": str, "split": str, "goal": str, "object": str,
               "holder": str, "room": str, "walkthrough": list, "optimal_steps": int, "budget": int}
WORLD_FIELDS = {"world_id": str, "seed": int, "name": str, "hub": str, "rooms": dict, "exits": list,
                "holders": dict, "objects": dict}


class WorldManifestError(ValueError):
    """A world/task manifest that cannot be used; the message names the file and the field."""


class WorldCompileError(RuntimeError):
    """The task's game could not be compiled (the rollout fails with this reason)."""


def suite_key(cfg: WorldConfig) -> str:
    conf = asdict(cfg)
    if not conf["train_unseen"]:  # added later: suites without such worlds keep their key (and cached games)
        del conf["train_unseen"]
    blob = json.dumps(dict(conf, generator=GENERATOR_VERSION), sort_keys=True)
    return f"worlds-s{cfg.seed}-{hashlib.sha1(blob.encode()).hexdigest()[:10]}"


def _game_name(world: WorldSpec, task: TaskSpec) -> str:
    blob = json.dumps({"world": world.to_dict(), "task": task.to_dict()}, sort_keys=True)
    return f"{task.task_id}-{hashlib.sha1(blob.encode()).hexdigest()[:8]}"


# -- manifest -----------------------------------------------------------------------------------------------
def _check(path, where: str, value, tp) -> None:
    ok = isinstance(value, tp) and not (tp is int and isinstance(value, bool))
    if not ok:
        raise WorldManifestError(f"{path}: {where}: expected {tp.__name__}, got {value!r:.60}")


def validate_manifest(data, path="manifest.json") -> None:
    """Raise :class:`WorldManifestError` ("<file>: <field>: <problem>") on the first bad field."""
    if not isinstance(data, dict):
        raise WorldManifestError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise WorldManifestError(f"{path}: format: expected {FORMAT!r}, got {data.get('format')!r:.60}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise WorldManifestError(f"{path}: schema_version: expected {SCHEMA_VERSION}, "
                                 f"got {data.get('schema_version')!r:.20}")
    for key in ("config", "worlds", "tasks"):
        if key not in data:
            raise WorldManifestError(f"{path}: {key}: missing")
    _check(path, "config", data["config"], dict)
    try:
        WorldConfig(**data["config"])
    except (TypeError, ValueError) as err:
        raise WorldManifestError(f"{path}: config: {err}") from None
    _check(path, "worlds", data["worlds"], list)
    _check(path, "tasks", data["tasks"], list)
    world_ids = set()
    for i, w in enumerate(data["worlds"]):
        _check(path, f"worlds[{i}]", w, dict)
        for name, tp in WORLD_FIELDS.items():
            if name not in w:
                raise WorldManifestError(f"{path}: worlds[{i}].{name}: missing")
            _check(path, f"worlds[{i}].{name}", w[name], tp)
        bad = [o for o, h in w["objects"].items() if h not in w["holders"]]
        if bad:
            raise WorldManifestError(f"{path}: worlds[{i}].objects: {bad[0]!r} lies on an unknown holder")
        world_ids.add(w["world_id"])
    seen_ids = set()
    for i, t in enumerate(data["tasks"]):
        _check(path, f"tasks[{i}]", t, dict)
        for name, tp in TASK_FIELDS.items():
            if name not in t:
                raise WorldManifestError(f"{path}: tasks[{i}].{name}: missing")
            _check(path, f"tasks[{i}].{name}", t[name], tp)
        where = f"{path}: tasks[{i}]"
        if t["task_id"] in seen_ids:
            raise WorldManifestError(f"{where}.task_id: {t['task_id']!r} given twice")
        seen_ids.add(t["task_id"])
        if t["world_id"] not in world_ids:
            raise WorldManifestError(f"{where}.world_id: unknown world {t['world_id']!r}")
        if t["family"] not in FAMILIES:
            raise WorldManifestError(f"{where}.family: expected one of {list(FAMILIES)}, got {t['family']!r}")
        if t["split"] not in SPLITS:
            raise WorldManifestError(f"{where}.split: expected one of {list(SPLITS)}, got {t['split']!r}")
        if not all(isinstance(c, str) and c for c in t["walkthrough"]):
            raise WorldManifestError(f"{where}.walkthrough: expected a list of commands")
        if t["optimal_steps"] != len(t["walkthrough"]):
            raise WorldManifestError(f"{where}.optimal_steps: {t['optimal_steps']} but the walkthrough has "
                                     f"{len(t['walkthrough'])} commands")
        if t["budget"] < t["optimal_steps"]:
            raise WorldManifestError(f"{where}.budget: {t['budget']} is below optimal_steps {t['optimal_steps']}")
        for opt, tp in (("sibling", str), ("game_file", str), ("compile_error", str), ("moved", dict),
                        ("delivered", list), ("demonstration", bool)):
            if t.get(opt) is not None:
                _check(path, f"tasks[{i}].{opt}", t[opt], tp)
    for i, t in enumerate(data["tasks"]):
        if t.get("sibling") is not None and t["sibling"] not in seen_ids:
            raise WorldManifestError(f"{path}: tasks[{i}].sibling: unknown task {t['sibling']!r}")


def load_manifest(path) -> dict:
    """A validated manifest (raises :class:`WorldManifestError` naming the file and field)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WorldManifestError(f"{path}: no such manifest") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise WorldManifestError(f"{path}: not valid JSON ({getattr(err, 'msg', type(err).__name__)})") from None
    validate_manifest(data, path)
    return data


def _task_spec(d: dict) -> TaskSpec:
    names = {f.name for f in fields(TaskSpec)}
    return TaskSpec(**{k: v for k, v in d.items() if k in names})


# -- the environment ----------------------------------------------------------------------------------------
class WorldSuite(GameSession):
    """Task families over persistent worlds; one live game at a time (not thread-safe, like TextWorldSuite)."""

    def __init__(self, cache_dir="outputs/textworld_games", config: WorldConfig | None = None,
                 manifest: str | os.PathLike | None = None, prune_commands: bool = True, compile_fn=None,
                 actions: str = "goal"):
        if actions not in ACTION_SPACES:
            raise ValueError(f"actions must be one of {ACTION_SPACES}, got {actions!r}")
        self.cache_dir = Path(cache_dir)
        self.manifest_path = Path(manifest) if manifest else None
        if self.manifest_path is not None:
            config = WorldConfig(**load_manifest(self.manifest_path)["config"])
        self.config = config or WorldConfig()
        self.dir = self.manifest_path.parent if self.manifest_path else self.cache_dir / "worlds" / suite_key(self.config)
        self.prune_commands = prune_commands
        self.actions = actions if prune_commands else "all"
        self._object = ""
        self._compile = compile_fn or compile_task   # tests inject failures
        self._data: dict | None = None
        self._tasks: dict[str, list[Task]] = {}
        self._env = None
        self._budget = 0
        self.steps_taken = 0

    # ---------------------------------------------------------------- games + manifest
    def manifest(self, progress: bool = False) -> dict:
        """The validated manifest, generating and compiling what is missing (failed compiles are retried)."""
        if self._data is not None:
            return self._data
        path = self.manifest_path or self.dir / "manifest.json"
        if path.exists():
            data = load_manifest(path)
            # through WorldConfig: a manifest written before a field existed holds its default
            if self.manifest_path is None and asdict(WorldConfig(**data["config"])) != asdict(self.config):
                raise WorldManifestError(f"{path}: config: does not match this suite's settings")
        else:
            worlds, tasks = build_suite(self.config)
            data = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "config": asdict(self.config),
                    "worlds": [w.to_dict() for w in worlds],
                    "tasks": [dict(t.to_dict(), game_file=None, compile_error=None) for t in tasks]}
        worlds = {w["world_id"]: WorldSpec.from_dict(w) for w in data["worlds"]}
        todo = [t for t in data["tasks"] if not t.get("game_file") or not (self.dir / t["game_file"]).exists()]
        from tqdm.auto import tqdm

        for t in tqdm(todo, desc="compile worlds", unit="game", disable=not progress or not todo):
            t["game_file"], t["compile_error"] = self._compile_one(worlds[t["world_id"]], _task_spec(t))
        if todo or not path.exists():
            from routers.io import atomic_write_json

            self.dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, data)
        self._data = data
        return data

    def _compile_one(self, world: WorldSpec, task: TaskSpec) -> tuple[str | None, str | None]:
        name = _game_name(world, task)
        target = self.dir / name
        if (target / "game.z8").exists():
            return f"{name}/game.z8", None
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=self.dir))
        try:
            self._compile(world, task, str(tmp / "game.z8"))
            try:
                os.replace(tmp, target)
            except OSError:  # another process cached it first
                shutil.rmtree(tmp, ignore_errors=True)
            return f"{name}/game.z8", None
        except Exception as err:  # noqa: BLE001 - recorded in the manifest; its rollouts fail with this reason
            shutil.rmtree(tmp, ignore_errors=True)
            logger.warning("world task %s: compile failed: %s: %s", task.task_id, type(err).__name__, err)
            return None, f"{type(err).__name__}: {err}"

    def worlds(self) -> dict[str, WorldSpec]:
        return {w["world_id"]: WorldSpec.from_dict(w) for w in self.manifest()["worlds"]}

    def tasks(self, split: str, progress: bool = False) -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {list(SPLITS)}")
        if split not in self._tasks:
            data = self.manifest(progress=progress)
            out = []
            for t in data["tasks"]:
                if t["split"] != split:
                    continue
                meta = {k: v for k, v in t.items() if k not in ("task_id", "goal", "split", "game_file")}
                meta["game_file"] = str(self.dir / t["game_file"]) if t.get("game_file") else None
                meta["max_score"] = 1
                out.append(Task(task_id=t["task_id"], goal=t["goal"], split=split, meta=meta))
            self._tasks[split] = out
        return self._tasks[split]

    def all_tasks(self) -> dict[str, Task]:
        return {t.task_id: t for s in SPLITS for t in self.tasks(s)}

    # ---------------------------------------------------------------- play
    def _observation(self, state, done: bool = False) -> Observation:
        from routers.memagent.textworld_env import clean_feedback

        commands = list(state.admissible_commands or [])
        if self.actions == "goal":
            keep = ("go ", f"take {self._object} from ", f"put {self._object} on {TARGET}")
            commands = [c for c in commands if c.startswith(keep)] or commands
        elif self.actions == "verbs":
            commands = [c for c in commands if c.startswith(_KEEP_VERBS)] or commands
        won, lost = bool(state.won), bool(state.lost)
        out_of_budget = self.steps_taken >= self._budget and not won
        return Observation(text=clean_feedback(state.feedback), admissible_commands=commands,
                           done=bool(done or won or lost or out_of_budget), won=won, score=float(state.score or 0))

    def reset(self, task: Task) -> Observation:
        import textworld

        if task.meta.get("compile_error"):
            raise WorldCompileError(f"task {task.task_id}: game failed to compile: {task.meta['compile_error']}")
        game_file = task.meta.get("game_file")
        if not game_file or not Path(game_file).exists():
            raise FileNotFoundError(f"task {task.task_id}: game file {game_file!r} is missing")
        self.close()
        infos = textworld.EnvInfos(admissible_commands=True, won=True, lost=True, score=True, feedback=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*(not fully supported|unsupported game)")
            self._env = textworld.start(game_file, request_infos=infos)
        self._budget = int(task.meta.get("budget") or 10**9)
        self._object = str(task.meta.get("object") or "")
        self.steps_taken = 0
        return self._observation(self._env.reset())

