"""An agent-trajectory QA corpus from a real engine: TextWorld cooking games, played and questioned.

For each game ``i`` (seeded, offline): generate a ``tw-cooking`` game with the TextWorld Python API
(settings drawn from the config's ranges), play it with an agent that follows the engine's own winning
policy (re-planned after every step) but interleaves noise -- random safe admissible commands, ``look`` /
``inventory`` / ``examine``, and actions chosen to fail for a known reason (a closed door, no exit that
way, an object in another room or in a closed container, an object already carried, a container
already open) -- so trajectories are long (``min_steps``..``max_steps``). Every step is recorded with
the facts it added and removed (``infos["facts"]``), which gives the exact world state after each step.
Questions come from :mod:`data_synthesis.textworld_qa` with exact evidence step ids.

Output (``output_dir``): ``episodes.jsonl`` (one ``Episode.to_dict()`` per game, ``source: textworld``),
``games/<episode_id>.{z8,json,ni}``, ``stats.json``, ``manifest.json``, ``resolved_config.yaml``. A killed
run continues where it stopped (per game, no duplicates). Load with :func:`load_textworld` or
``load_corpus("textworld", path)``.

TextWorld (https://github.com/microsoft/TextWorld) is MIT-licensed, (c) Microsoft Corporation.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import sys
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from routers.io import OutputLock, ResumableJsonlWriter, atomic_write_json, read_jsonl
from data_synthesis.textworld_qa import CATEGORIES, DIRECTIONS, World, generate_qa
from routers.memory.schema import SCHEMA_VERSION, Episode, LoadStats, Step

FORMAT = "memroute.textworld"
EPISODES_FILE = "episodes.jsonl"
# Verbs a noise action never uses: they can make the game unwinnable (eating or burning an ingredient,
# cutting it the wrong way, preparing the meal early) or need keys the agent does not track.
UNSAFE_VERBS = {"eat", "drink", "cook", "chop", "dice", "slice", "prepare", "lock", "unlock"}
INFO_VERBS = {"look", "inventory", "examine"}
_PROMPT_TAIL = re.compile(r"\n>\s[^\n]*$")


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


@contextlib.contextmanager
def quiet_jericho():
    """Jericho warns that it cannot analyse TextWorld-built games ("unsupported game"): harmless here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(not fully supported|unsupported game)")
        yield


def make_game(settings: dict, game_seed: int, games_dir: Path, name: str) -> tuple[Path, dict]:
    """Generate and compile one game (offline); files appear in ``games_dir`` only once complete."""
    import textworld.generator
    from textworld.challenges.tw_cooking import cooking
    from textworld.generator.game import GameOptions

    tmp = games_dir / f".tmp-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    options = GameOptions()
    options.seeds = game_seed
    options.path = str(tmp / f"{name}.z8")
    options.force_recompile = True
    with quiet_jericho():
        game = cooking.make(dict(settings), options)
        textworld.generator.compile_game(game, options)
    for f in sorted(tmp.iterdir()):
        os.replace(f, games_dir / f.name)
    tmp.rmdir()
    meta = {k: game.metadata.get(k) for k in ("uuid", "walkthrough", "max_score", "ingredients")}
    return games_dir / f"{name}.z8", meta


def clean_observation(text: str) -> str:
    """Drop the prompt and status line TextWorld appends, and collapse blank lines."""
    text = _PROMPT_TAIL.sub("", text.rstrip())
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _facts(state) -> set[tuple[str, ...]]:
    return {(f.name, *(v.name for v in f.arguments)) for f in state["facts"]}


def _types(state) -> dict[str, str]:
    return {v.name: v.type for f in state["facts"] for v in f.arguments}


# -- the player ----------------------------------------------------------------------------------------
def failing_actions(world: World, seen: set[str]) -> dict[str, list[tuple[str, dict]]]:
    """Commands that must fail in this state, grouped by the reason they fail."""
    room = world.player_room()
    exits = world.exits(room)
    out: dict[str, list[tuple[str, dict]]] = {r: [] for r in ("closed_door", "no_exit", "not_here", "closed_container",
                                                              "already_carried", "already_open")}
    for d in DIRECTIONS:
        if d not in exits:
            out["no_exit"].append((f"go {d}", {"direction": d}))
        elif exits[d][1] and world.is_open(exits[d][1]) is False:
            out["closed_door"].append((f"go {d}", {"direction": d, "door": exits[d][1]}))
    for x in world.portables():
        rel, where = world.holder(x)
        if where == "I":
            out["already_carried"].append((f"take {x}", {"entity": x}))
        elif x in seen and world.room_of(x) not in (None, room):
            out["not_here"].append((f"take {x}", {"entity": x}))
        elif x in seen and rel == "in" and world.is_open(where) is False and world.room_of(where) == room:
            out["closed_container"].append((f"take {x}", {"entity": x, "container": where}))
    for c in world.openables():
        if world.types.get(c) != "d" and world.is_open(c) and world.room_of(c) == room:
            out["already_open"].append((f"open {c}", {"container": c}))
    return {k: v for k, v in out.items() if v}


def choose_noise(world: World, admissible: list[str], seen: set[str], rng: random.Random,
                 cfg: TextWorldCorpusConfig) -> tuple[str, str, dict | None]:
    """(command, kind, intended failure) for one noise step."""
    kinds = ["random", "info", "fail"]
    kind = rng.choices(kinds, weights=[cfg.noise_random, cfg.noise_info, cfg.noise_fail])[0]
    if kind == "fail":
        fails = failing_actions(world, seen)
        if fails:
            reason = rng.choice(sorted(fails))
            cmd, detail = rng.choice(fails[reason])
            return cmd, "fail", {"reason": reason, **detail}
        kind = "random"
    if kind == "random":
        safe = [c for c in admissible if c.split(" ", 1)[0] not in UNSAFE_VERBS | INFO_VERBS]
        if safe:
            return rng.choice(safe), "random", None
    info = ["look", "inventory"] + [c for c in admissible if c.startswith("examine ")]
    return rng.choice(info), "info", None


def play(game_file: Path, cfg: TextWorldCorpusConfig, rng: random.Random) -> tuple[list[Step], dict]:
    """Play one game: the engine's winning policy interleaved with noise. Returns steps and outcome."""
    import textworld

    infos = textworld.EnvInfos(admissible_commands=True, facts=True, inventory=True, policy_commands=True,
                               score=True, won=True, lost=True, description=True, objective=True, max_score=True)
    with quiet_jericho():
        return _play(textworld.start(str(game_file), request_infos=infos), cfg, rng)


def _play(env, cfg: TextWorldCorpusConfig, rng: random.Random) -> tuple[list[Step], dict]:
    try:
        state = env.reset()
        facts = _facts(state)
        types = _types(state)
        intro = f"{state['objective']}\n\n{clean_observation(state['description'])}"
        world = World(facts, types)
        steps = [_step(0, "start", intro, world, 0, "start", None, set(), set())]
        steps[0].meta["facts"] = [list(f) for f in sorted(facts)]
        steps[0].meta["entity_types"] = dict(sorted(types.items()))
        seen = set(_mentioned(intro, types))
        done, examined_cookbook = False, False
        hard_cap = cfg.max_steps + 60
        while not done and len(steps) <= hard_cap:
            n_done = len(steps) - 1
            policy = list(state["policy_commands"] or [])
            admissible = sorted(state["admissible_commands"] or [])
            failure = None
            if n_done == 0:
                cmd, kind = "inventory", "info"
            elif not examined_cookbook and "examine cookbook" in admissible:
                cmd, kind, examined_cookbook = "examine cookbook", "info", True
            elif not policy:
                break
            elif n_done + len(policy) < cfg.max_steps and (n_done + len(policy) < cfg.min_steps
                                                          or rng.random() < cfg.noise_prob):
                cmd, kind, failure = choose_noise(world, admissible, seen, rng, cfg)
            else:
                cmd, kind = policy[0], "policy"
            prev_score = int(state["score"])
            state, score, done = env.step(cmd)
            new_facts = _facts(state)
            added, removed = new_facts - facts, facts - new_facts
            obs = clean_observation(state["feedback"])
            if failure is not None and (added or removed or int(score) != prev_score):
                failure = None  # it did not fail after all: no cause to ask about
            facts, world = new_facts, World(new_facts, types)
            seen |= _mentioned(obs, types)
            steps.append(_step(len(steps), cmd, obs, world, int(score), kind, failure, added, removed))
        outcome = {"won": bool(state["won"]), "lost": bool(state["lost"]), "final_score": int(state["score"]),
                   "max_score": int(state["max_score"]), "objective": state["objective"]}
    finally:
        env.close()
    return steps, outcome


def _mentioned(text: str, types: dict[str, str]) -> set[str]:
    low = text.lower()
    return {e for e in types if e.lower() in low}


def _step(i: int, action: str, obs: str, world: World, score: int, kind: str, failure: dict | None,
          added, removed) -> Step:
    meta = {"action": action, "observation": obs, "location": world.player_room(), "inventory": world.inventory(),
            "score": score, "kind": kind, "failed": failure is not None,
            "added": [list(f) for f in sorted(added)] if i else [], "removed": [list(f) for f in sorted(removed)]}
    if failure is not None:
        meta["failure"] = failure
    return Step(step_id=f"T{i}", index=i, text=f"> {action}\n{obs}", speaker="agent", meta=meta)


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


# -- loader --------------------------------------------------------------------------------------------
def check_schema_version(rec: dict, newest: int = SCHEMA_VERSION) -> None:
    """``schema_version`` must be an integer no newer than this reader (a string like "1" is an error)."""
    v = rec.get("schema_version", newest)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"schema_version must be an integer, got {v!r:.40}")
    if v > newest:
        raise ValueError(f"schema_version {v} is newer than this reader ({newest})")


def _validate(rec: dict) -> None:
    check_schema_version(rec)
    if not isinstance(rec["steps"], list) or not rec["steps"]:
        raise ValueError("steps must be a non-empty list")
    if not isinstance(rec.get("qa", []), list):
        raise ValueError("qa must be a list")
    Episode.from_dict(rec)  # raises ValueError naming the step / question and field


def _episode_validator():
    """``_validate`` plus ids unique across the file: a repeated episode_id, or a qa_id that another episode
    already used (sample ids are built from qa ids, so a repeat would silently lose a question). Run inside
    ``read_jsonl``, so the error names the real line."""
    episodes: set[str] = set()
    qa_owner: dict[str, str] = {}

    def validate(rec: dict) -> None:
        _validate(rec)
        eid = rec["episode_id"]
        if eid in episodes:
            raise ValueError(f"duplicate episode_id {eid!r}")
        for i, q in enumerate(rec.get("qa", [])):
            if q["qa_id"] in qa_owner:
                raise ValueError(f"qa #{i}: duplicate qa_id {q['qa_id']!r} (already used by episode "
                                 f"{qa_owner[q['qa_id']]!r})")
        episodes.add(eid)
        qa_owner.update((q["qa_id"], eid) for q in rec.get("qa", []))

    return validate


def load_textworld(path: str | os.PathLike, stats: LoadStats | None = None) -> list[Episode]:
    """Episodes from ``DIR/episodes.jsonl`` or a JSONL file; a bad line raises ``RecordError`` (file:line)."""
    path = Path(path)
    if path.is_dir():
        path = path / EPISODES_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (generate it with `memroute synth textworld`)")
    stats = stats if stats is not None else LoadStats()
    episodes = []
    for rec in read_jsonl(path, required=("schema_version", "episode_id", "steps"), validate=_episode_validator()):
        ep = Episode.from_dict(rec)
        kept = []
        for q in ep.qa:
            unknown = [e for e in q.evidence if not ep.has_step(e)]
            if unknown:
                stats.unknown_evidence_ids.extend(f"{ep.episode_id}/{e}" for e in unknown)
                q.evidence = [e for e in q.evidence if ep.has_step(e)]
            if not q.evidence:
                stats.skipped_no_evidence += 1
                continue
            kept.append(q)
        ep.qa = kept
        stats.qa_kept += len(kept)
        stats.episodes += 1
        stats.steps += len(ep.steps)
        episodes.append(ep)
    return episodes


def make_parser():
    from routers.config import make_arg_parser

    return make_arg_parser([TextWorldCorpusConfig], prog="memroute synth textworld",
                           description="TextWorld cooking games played with noise, with evidence-exact QA.")


def main(argv=None) -> dict:
    from routers.config import parse_config, save_resolved_config

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
