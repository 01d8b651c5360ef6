"""An agent-trajectory QA corpus from a real engine: TextWorld cooking games, played and questioned.

For each game ``i`` (seeded, offline): generate a ``tw-cooking`` game with the TextWorld Python API
(settings drawn from the config's ranges), play it with an agent that follows the engine's own winning
policy (re-planned after every step) but interleaves noise -- random safe admissible commands, ``look`` /
``inventory`` / ``examine``, and actions chosen to fail for a known reason (a closed door, no exit that
way, an object in another room or in a closed container, an object already carried, a container
already open) -- so trajectories are long (``min_steps``..``max_steps``). Every step is recorded with
the facts it added and removed (``infos["facts"]``), which gives the exact world state after each step.
Questions come from :mod:`data_synthesis.textworld_qa` with exact evidence step ids. This module holds the
config and the job; a game is made and played in :mod:`data_synthesis.textworld_player` and the corpus is
read back by :mod:`data_synthesis.textworld_episodes`.

Output (``output_dir``): ``episodes.jsonl`` (one ``Episode.to_dict()`` per game, ``source: textworld``),
``games/<episode_id>.{z8,json,ni}``, ``stats.json``, ``manifest.json``, ``resolved_config.yaml``. A killed
run continues where it stopped (per game, no duplicates). Load with :func:`load_textworld` or
``load_corpus("textworld", path)``.

TextWorld (https://github.com/microsoft/TextWorld) is MIT-licensed, (c) Microsoft Corporation.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from data_synthesis.textworld_episodes import EPISODES_FILE, load_textworld
from data_synthesis.textworld_player import make_game, play
from data_synthesis.textworld_qa import CATEGORIES, generate_qa
from routers.io import OutputLock, ResumableJsonlWriter, atomic_write_json
from routers.memory.schema import SCHEMA_VERSION, Episode

FORMAT = "memroute.textworld"


@dataclass
class TextWorldCorpusConfig:
    """Options of ``memroute synth textworld`` (YAML recipe + CLI overrides)."""

    output_dir: str = "outputs/textworld"
    n_games: int = 24
    seed: int = 0
    challenge: str = field(default="tw-cooking", metadata={"help": "only tw-cooking is supported"})
    recipe: list[int] = field(default_factory=lambda: [1, 2, 3], metadata={"help": "recipe sizes drawn per game"})
    take: list[int] = field(default_factory=lambda: [1, 2, 3],
                            metadata={"help": "ingredients to find, drawn per game (clipped to the recipe size)"})
    go: list[int] = field(default_factory=lambda: [6, 9], metadata={"help": "rooms per game, from {1, 6, 9, 12}"})
    open: bool = field(default=True, metadata={"help": "containers/doors must be opened"})
    cook: bool = True
    cut: bool = True
    drop: bool = field(default=False, metadata={"help": "limited inventory capacity"})
    split: str | None = field(default=None, metadata={"help": "tw-cooking food split: train, valid, test or none"})
    noise_prob: float = field(default=0.7, metadata={"help": "chance that a step is a noise action"})
    noise_random: float = field(default=0.45, metadata={"help": "weight of random safe admissible commands"})
    noise_info: float = field(default=0.25, metadata={"help": "weight of look / inventory / examine"})
    noise_fail: float = field(default=0.3, metadata={"help": "weight of actions chosen to fail for a known reason"})
    min_steps: int = field(default=40, metadata={"help": "noise is forced until the trajectory can reach this length"})
    max_steps: int = field(default=120, metadata={"help": "no noise once the remaining walkthrough would exceed this"})
    questions_per_type: int = field(default=8, metadata={"help": "QA per category per game"})
    state_probes: int = field(default=12, metadata={"help": "steps k sampled for 'state after step k' questions"})
    keep_game_files: bool = field(default=True, metadata={"help": "keep games/<id>.z8/.json/.ni"})
    resume: str = field(default="auto", metadata={
        "help": "auto: continue the games in output_dir (same settings only) | never: start over"})

    def __post_init__(self):
        from routers.config import check_resume_value

        check_resume_value(self.resume)
        for name, low in (("n_games", 0), ("min_steps", 0), ("max_steps", 1), ("questions_per_type", 1),
                          ("state_probes", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if not 0.0 <= self.noise_prob <= 1.0:
            raise ValueError(f"noise_prob must be in [0, 1], got {self.noise_prob}")
        if self.challenge != "tw-cooking":
            raise ValueError(f"challenge {self.challenge!r}: only 'tw-cooking' is supported")
        bad = [g for g in self.go if g not in (1, 6, 9, 12)]
        if bad or not self.go:
            raise ValueError(f"go {self.go}: each value must be one of 1, 6, 9, 12")
        if not self.recipe or min(self.recipe) < 1 or not self.take or min(self.take) < 1:
            raise ValueError("recipe and take need values >= 1")
        if self.split in ("", "none", "None"):
            self.split = None
        if self.split not in (None, "train", "valid", "test"):
            raise ValueError(f"split {self.split!r}: choose train, valid, test or none")
        if self.min_steps > self.max_steps:
            raise ValueError(f"min_steps {self.min_steps} > max_steps {self.max_steps}")
        if min(self.noise_random, self.noise_info, self.noise_fail) < 0 or \
                self.noise_random + self.noise_info + self.noise_fail <= 0:
            raise ValueError("noise weights must be >= 0 and not all zero")


# -- games ---------------------------------------------------------------------------------------------
def episode_id(cfg: TextWorldCorpusConfig, index: int) -> str:
    return f"tw-s{cfg.seed}-g{index:03d}"


def game_settings(cfg: TextWorldCorpusConfig, index: int) -> tuple[dict, int]:
    """The tw-cooking settings and generator seed of game ``index`` (a pure function of the config)."""
    rng = random.Random(f"{cfg.seed}:{index}:settings")
    recipe = rng.choice(cfg.recipe)
    take = rng.choice([t for t in cfg.take if t <= recipe] or [recipe])
    settings = {"recipe": recipe, "take": take, "go": rng.choice(cfg.go), "open": cfg.open, "cook": cfg.cook,
                "cut": cfg.cut, "drop": cfg.drop, "recipe_seed": 0, "split": cfg.split}
    return settings, rng.randrange(1, 2 ** 31 - 1)


def build_episode(cfg: TextWorldCorpusConfig, index: int, games_dir: Path) -> tuple[Episode, dict]:
    """Generate, play and question game ``index``. Returns the episode and QA generation counts."""
    eid = episode_id(cfg, index)
    settings, game_seed = game_settings(cfg, index)
    game_file, gmeta = make_game(settings, game_seed, games_dir, eid)
    rng = random.Random(f"{cfg.seed}:{index}:play")
    steps, outcome = play(game_file, cfg, rng)
    if not cfg.keep_game_files:
        for ext in (".z8", ".json", ".ni"):
            (games_dir / f"{eid}{ext}").unlink(missing_ok=True)
    ep = Episode(episode_id=eid, steps=steps, source="textworld", meta={
        "challenge": cfg.challenge, "settings": settings, "game_seed": game_seed,
        "game_file": f"games/{eid}.z8" if cfg.keep_game_files else None, **gmeta, **outcome,
        "noise_steps": sum(s.meta["kind"] not in ("policy", "start") for s in steps),
        "failed_steps": sum(s.meta["failed"] for s in steps)})
    ep.qa, counts = generate_qa(ep, cfg.questions_per_type, cfg.seed, cfg.state_probes)
    return ep, counts


# -- the job -------------------------------------------------------------------------------------------
# settings that do not change what a game is: more games extend the same corpus
NOT_FINGERPRINTED = ("output_dir", "n_games", "resume")


def fingerprint(cfg: TextWorldCorpusConfig) -> dict:
    return {k: v for k, v in asdict(cfg).items() if k not in NOT_FINGERPRINTED}


def prepare(cfg: TextWorldCorpusConfig) -> None:
    """Refuse to extend ``episodes.jsonl`` written with other settings (unless ``resume: never``, which
    starts over) and record the settings. Call with the output lock held."""
    from routers.config import prepare_output

    prepare_output(cfg.output_dir, fingerprint(cfg), cfg.resume, resumable=[EPISODES_FILE],
                   derived=["stats.json", "manifest.json", "games"], what="TextWorld corpus")


def run(cfg: TextWorldCorpusConfig, progress: bool = True, lock: bool = True) -> dict:
    """Generate the corpus. ``lock``: hold the output directory's lock (False when the caller holds it)."""
    if lock:
        with OutputLock(cfg.output_dir):
            prepare(cfg)
            return run(cfg, progress, lock=False)
    from tqdm.auto import tqdm

    out = Path(cfg.output_dir)
    games_dir = out / "games"
    games_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "manifest.json", {"format": FORMAT, "schema_version": SCHEMA_VERSION, "config": asdict(cfg),
                                              "episodes": [episode_id(cfg, i) for i in range(cfg.n_games)]})
    this_run: Counter = Counter()
    t0 = time.perf_counter()
    with ResumableJsonlWriter(out / EPISODES_FILE, key="episode_id") as writer:
        bar = tqdm(total=cfg.n_games, desc="textworld games", unit="game", disable=not progress, file=sys.stderr)
        for i in range(cfg.n_games):
            eid = episode_id(cfg, i)
            if eid in writer:
                this_run["resumed_skip"] += 1
            else:
                ep, counts = build_episode(cfg, i, games_dir)
                writer.write(ep.to_dict())
                this_run["generated"] += 1
                this_run["unsupported_candidates_dropped"] += counts["unsupported"]
            bar.update(1)
        bar.close()
    this_run["seconds"] = round(time.perf_counter() - t0, 1)
    stats = summarize(out, dict(this_run))
    atomic_write_json(out / "stats.json", stats)
    return stats


def summarize(out: Path, this_run: dict | None = None) -> dict:
    """Counts recomputed from ``episodes.jsonl`` (right after any number of resumes)."""
    eps = load_textworld(out)
    n_steps = [len(e.steps) - 1 for e in eps]
    qa = [q for e in eps for q in e.qa]
    stats = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "games": len(eps),
             "steps": {"total": int(sum(n_steps)), "mean": float(np.mean(n_steps)) if eps else 0.0,
                       "min": min(n_steps, default=0), "max": max(n_steps, default=0)},
             "qa": {"total": len(qa), "by_category": {c: sum(q.category == c for q in qa) for c in CATEGORIES},
                    "by_template": dict(sorted(Counter(q.meta.get("template") for q in qa).items())),
                    "mean_evidence_steps": float(np.mean([len(q.evidence) for q in qa])) if qa else 0.0},
             "won": sum(bool(e.meta.get("won")) for e in eps), "lost": sum(bool(e.meta.get("lost")) for e in eps),
             "noise_steps": sum(e.meta.get("noise_steps", 0) for e in eps),
             "failed_steps": sum(e.meta.get("failed_steps", 0) for e in eps),
             "episodes": [e.episode_id for e in eps]}
    if this_run is not None:
        stats["this_run"] = this_run
    return stats



def make_parser():
    from routers.config import make_arg_parser

    return make_arg_parser([TextWorldCorpusConfig], prog="memroute synth textworld",
                           description="TextWorld cooking games played with noise, with evidence-exact QA.")


def main(argv=None) -> dict:
    from routers.config import parse_config, save_resolved_config
    from routers.logs import setup_cli_logging

    setup_cli_logging()  # a CLI entry point (memroute synth textworld, python -m data_synthesis.textworld_corpus)
    (cfg,) = parse_config(make_parser(), [TextWorldCorpusConfig], argv)
    with OutputLock(cfg.output_dir):
        prepare(cfg)
        save_resolved_config(cfg.output_dir, cfg)
        stats = run(cfg, lock=False)
    print({"games": stats["games"], "steps_mean": round(stats["steps"]["mean"], 1), "qa": stats["qa"]["by_category"],
           "won": stats["won"], "this_run": stats["this_run"]})
    return stats


if __name__ == "__main__":
    main()
