"""A built-in, offline :class:`~routers.memagent.protocol.TaskEnvironment`: a suite of TextWorld cooking games.

Each task is one ``tw-cooking`` game (the First TextWorld Problems family) generated from a seed: the
recipe, the ingredients, where they lie and the map all vary with the seed, while the kind of task (find
the kitchen, gather ingredients, cut/cook them as the recipe says, prepare and eat the meal) stays, so
experience from earlier games transfers to later ones. Difficulty presets (``"recipe=2,take=1,go=6,cut"``)
are assigned round-robin, train and held-out seeds never overlap, and compiled games are cached on disk
(written under a temporary name, then renamed, so concurrent runs never read a half-written game).

The goal text is the game objective; with ``goal_style="recipe"`` (default) the recipe's ingredients and
directions are appended, which makes goals differ between tasks (the objective alone is the same sentence
in every cooking game) and gives retrieval something to match. Admissible commands can be pruned to the
verbs a cooking game needs (``prune_commands``): dropping ``examine``/``look``/``put``/``close``..., and
the cook/cut verbs of games generated without those skills (where using them only loses the game), cuts
the candidate list from ~40 to ~10-20 in a kitchen, which is what keeps LM scoring cheap.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from routers.memagent.protocol import Observation, Task

DEFAULT_PRESETS = ("recipe=1,take=1,go=1", "recipe=1,take=1,go=1,cut", "recipe=1,take=1,go=6",
                   "recipe=2,take=1,go=1,cook", "recipe=2,take=2,go=6,open,cut")
SETTING_KEYS = {"recipe": int, "take": int, "go": int, "open": bool, "cook": bool, "cut": bool, "drop": bool}
HELDOUT_SEED_OFFSET = 100_000
_KEEP_VERBS = ("go ", "take ", "open ", "cook ", "slice ", "dice ", "chop ", "drop ", "prepare meal", "eat meal",
               "examine cookbook", "read cookbook", "unlock ")
_JUNK_LINE = re.compile(r"^[\s$_|\\/<>()\-=*~`'.,:]*$")


def parse_preset(spec: str) -> dict:
    """``"recipe=2,take=1,go=6,cut"`` -> the full tw-cooking settings dict (flags default to False)."""
    settings = {"recipe": 1, "take": 1, "go": 1, "open": False, "cook": False, "cut": False, "drop": False}
    for raw in str(spec).split(","):
        part = raw.strip()
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip()
        if key not in SETTING_KEYS:
            raise ValueError(f"game preset {spec!r}: unknown setting {key!r}; known: {sorted(SETTING_KEYS)}")
        if SETTING_KEYS[key] is bool:
            settings[key] = (value.strip().lower() in {"1", "true", "yes"}) if eq else True
        else:
            try:
                settings[key] = int(value)
            except ValueError:
                raise ValueError(f"game preset {spec!r}: {key} needs an integer, got {value!r}") from None
    if settings["go"] not in (1, 6, 9, 12):
        raise ValueError(f"game preset {spec!r}: go must be 1, 6, 9 or 12")
    if not 1 <= settings["recipe"] <= 5 or not 0 <= settings["take"] <= settings["recipe"]:
        raise ValueError(f"game preset {spec!r}: need 1 <= recipe <= 5 and 0 <= take <= recipe")
    return settings


def clean_feedback(text: str) -> str:
    """Strip TextWorld's ASCII banner, prompt lines and padding; keep the prose."""
    lines = []
    for line in (text or "").splitlines():
        stripped = line.strip()
        if stripped.startswith(">") or (stripped and _JUNK_LINE.match(stripped) and len(stripped) > 2):
            continue
        lines.append(stripped)
    out = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return out


def prune(commands: Sequence[str], settings: dict | None = None) -> list[str]:
    """Admissible commands a cooking game can need (movement, taking, opening, cutting, cooking, the meal).

    With ``settings``, verbs of skills the game does not exercise go too: in a game generated without
    ``cook`` (``cut``) the ingredients come cooked (cut) as needed, and cooking (cutting) them again only
    ruins the meal, i.e. loses the game; without ``drop`` the inventory is unlimited, so dropping is
    never needed (it only feeds take/drop loops).
    """
    settings = settings or {}
    drop = ()
    if settings and not settings.get("drop"):
        drop += ("drop ",)
    if settings and not settings.get("cook"):
        drop += ("cook ",)
    if settings and not settings.get("cut"):
        drop += ("slice ", "dice ", "chop ")
    return [c for c in commands if c.startswith(_KEEP_VERBS) and not c.startswith(drop)
            and not c.startswith("take cookbook")]


def _recipe_sentence(ingredients) -> str:
    parts = []
    for name, cooked, cut in ingredients:
        prep = [p for p in (cut, cooked) if p not in ("uncut", "raw")]
        parts.append(f"{name} ({', '.join(prep)})" if prep else name)
    return ", ".join(parts)


def _directions(recipe_text: str) -> str:
    if "Directions:" not in recipe_text:
        return ""
    body = recipe_text.split("Directions:", 1)[1]
    return "; ".join(ln.strip() for ln in body.splitlines() if ln.strip())


@dataclass
class GameSpec:
    seed: int
    split: str
    settings: dict


class GameSession:
    """One running TextWorld game behind ``step`` / ``close`` (a suite sets ``_env`` in ``reset`` and provides
    ``_observation``); shared by the cooking suite and the persistent-world suite."""

    _env = None
    steps_taken = 0

    def step(self, command: str) -> Observation:
        if self._env is None:
            raise RuntimeError("step() before reset()")
        state, _, done = self._env.step(command)
        self.steps_taken += 1
        return self._observation(state, done)

    def close(self) -> None:
        if self._env is not None:
            try:
                self._env.close()
            finally:
                self._env = None


class TextWorldSuite(GameSession):
    """N cooking games per split, generated once per (seed, settings) and cached; one live game at a time.

    Not thread-safe (one interpreter per instance); a process pool builds one suite per worker.
    """

    def __init__(self, cache_dir: str | os.PathLike = "outputs/textworld_games", n_train: int = 16,
                 n_heldout: int = 8, seed: int = 0, max_steps: int = 30,
                 presets: Sequence[str] = DEFAULT_PRESETS, goal_style: str = "recipe", prune_commands: bool = True,
                 food_split: str | None = "train"):
        if goal_style not in ("recipe", "objective"):
            raise ValueError(f"goal_style must be 'recipe' or 'objective', got {goal_style!r}")
        if not presets:
            raise ValueError("need at least one game preset")
        self.cache_dir = Path(cache_dir)
        self.n = {"train": int(n_train), "heldout": int(n_heldout)}
        self.seed = int(seed)
        self.max_steps = int(max_steps)
        self.presets = [parse_preset(p) for p in presets]
        self.preset_specs = list(presets)
        self.goal_style = goal_style
        self.prune_commands = prune_commands
        self.food_split = food_split
        self._tasks: dict[str, list[Task]] = {}
        self._env = None
        self._env_file = None
        self._settings: dict = {}
        self.steps_taken = 0

    # ---------------------------------------------------------------- games
    def specs(self, split: str) -> list[GameSpec]:
        if split not in self.n:
            raise ValueError(f"unknown split {split!r}; expected one of {sorted(self.n)}")
        base = self.seed + (HELDOUT_SEED_OFFSET if split == "heldout" else 0)
        offset = 0 if split == "train" else self.n["train"]  # heldout continues the preset rotation
        return [GameSpec(base + i, split, self.presets[(offset + i) % len(self.presets)]) for i in range(self.n[split])]

    def _game_key(self, spec: GameSpec) -> str:
        blob = json.dumps({"seed": spec.seed, "settings": spec.settings, "food_split": self.food_split},
                          sort_keys=True)
        return f"cooking-s{spec.seed}-{hashlib.sha1(blob.encode()).hexdigest()[:8]}"

    def _generate(self, spec: GameSpec, key: str) -> dict:
        """Make + compile one game into a temp dir, then move it into the cache with one rename."""
        import textworld
        from textworld.challenges.tw_cooking import cooking
        from textworld.generator.game import GameOptions

        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.cache_dir))
        try:
            opts = GameOptions()
            opts.seeds = spec.seed
            opts.path = str(tmp / f"{key}.z8")
            opts.force_recompile = True
            settings = dict(spec.settings, recipe_seed=spec.seed, split=self.food_split)
            game = cooking.make(settings, opts)
            textworld.generator.compile_game(game, opts)
            meta = {"key": key, "seed": spec.seed, "settings": spec.settings, "food_split": self.food_split,
                    "objective": game.objective, "recipe": game.metadata.get("recipe", ""),
                    "ingredients": [list(i) for i in game.metadata.get("ingredients", [])],
                    "walkthrough": list(game.metadata.get("walkthrough", [])),
                    "max_score": game.max_score}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            target = self.cache_dir / key
            try:
                os.replace(tmp, target)
            except OSError:  # another process cached it first
                shutil.rmtree(tmp, ignore_errors=True)
            return json.loads((target / "meta.json").read_text())
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _goal(self, meta: dict) -> str:
        objective = " ".join(meta["objective"].split())
        if self.goal_style == "objective":
            return objective
        need = _recipe_sentence(meta["ingredients"])
        directions = _directions(meta["recipe"])
        return f"{objective} The recipe needs: {need}. Directions: {directions}; then eat the meal."

    def tasks(self, split: str, progress: bool = False) -> list[Task]:
        """Tasks of a split in a fixed order (generating and caching missing games first)."""
        if split in self._tasks:
            return self._tasks[split]
        specs = self.specs(split)
        from tqdm.auto import tqdm

        out = []
        for spec in tqdm(specs, desc=f"textworld {split}", disable=not progress, unit="game"):
            key = self._game_key(spec)
            meta_path = self.cache_dir / key / "meta.json"
            meta = json.loads(meta_path.read_text()) if meta_path.exists() else self._generate(spec, key)
            out.append(Task(task_id=f"tw-{key}", goal=self._goal(meta), split=split,
                            meta={"game_file": str(self.cache_dir / key / f"{key}.z8"), "seed": meta["seed"],
                                  "settings": meta["settings"], "recipe": meta["recipe"],
                                  "walkthrough": meta["walkthrough"], "max_score": meta["max_score"]}))
        self._tasks[split] = out
        return out

    # ---------------------------------------------------------------- play
    def _observation(self, state, done: bool = False) -> Observation:
        commands = list(state.admissible_commands or [])
        if self.prune_commands:
            commands = prune(commands, self._settings) or commands  # never prune to nothing
        won, lost = bool(state.won), bool(state.lost)
        return Observation(text=clean_feedback(state.feedback), admissible_commands=commands,
                           done=bool(done or won or lost), won=won, score=float(state.score or 0))

    def reset(self, task: Task) -> Observation:
        import textworld

        game_file = task.meta.get("game_file")
        if not game_file or not Path(game_file).exists():
            raise FileNotFoundError(f"task {task.task_id}: game file {game_file!r} is missing")
        self.close()
        infos = textworld.EnvInfos(admissible_commands=True, won=True, lost=True, score=True, max_score=True,
                                   feedback=True)
        with warnings.catch_warnings():  # jericho cannot analyse TextWorld-built games: harmless here
            warnings.filterwarnings("ignore", message=".*(not fully supported|unsupported game)")
            self._env = textworld.start(game_file, request_infos=infos)
        self._env_file = game_file
        self._settings = dict(task.meta.get("settings") or {})
        self.steps_taken = 0
        return self._observation(self._env.reset())

