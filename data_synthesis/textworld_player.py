"""Making and playing one TextWorld cooking game (see :mod:`data_synthesis.textworld_corpus`).

:func:`make_game` generates and compiles a ``tw-cooking`` game offline; :func:`play` follows the engine's
own winning policy (re-planned after every step) but interleaves noise -- random safe admissible commands,
``look`` / ``inventory`` / ``examine``, and actions chosen to fail for a known reason -- and records every
step with the facts it added and removed.

TextWorld (https://github.com/microsoft/TextWorld) is MIT-licensed, (c) Microsoft Corporation.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from data_synthesis.textworld_state import DIRECTIONS, World
from routers.memory.schema import Step

if TYPE_CHECKING:
    from data_synthesis.textworld_corpus import TextWorldCorpusConfig

# Verbs a noise action never uses: they can make the game unwinnable (eating or burning an ingredient,
# cutting it the wrong way, preparing the meal early) or need keys the agent does not track.
UNSAFE_VERBS = {"eat", "drink", "cook", "chop", "dice", "slice", "prepare", "lock", "unlock"}
INFO_VERBS = {"look", "inventory", "examine"}
_PROMPT_TAIL = re.compile(r"\n>\s[^\n]*$")


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
