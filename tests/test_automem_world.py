"""The planted AutoMem problem: a fast synthetic TaskEnvironment + scripted agent whose success depends on
whether the memory system stores and retrieves one specific fact.

Vault world: ``scout`` tasks reveal a room's vault code in an observation ("vault r3 code is 4821"); later
``unlock`` tasks ("unlock the strongbox in chamber r3") succeed only if the agent types the current code,
which it reads from the injected memory (the first code it finds for that room). Some rooms are re-scouted
with a new code, so a memory that keeps the stale code first fails. Only trajectory units keep observations;
workflows / shortcuts / tips generalize the code away; stale-handling managers or the temporal graph store fix
the re-scouted rooms; the word budget of the injected memory punishes noisy retrieval.
"""

from __future__ import annotations

import random
import re

from routers.automem.evaluate import RolloutEvaluator
from routers.memagent.protocol import Observation, Task


class VaultWorld:
    def __init__(self, seed: int = 0, rooms: int = 6, restale: int = 3):
        rng = random.Random(seed)
        self.tasks_by_split: dict[str, list[Task]] = {}
        for split, off in (("search", 0), ("validation", 100), ("test", 200)):
            tasks, codes = [], {}
            names = [f"r{off + i}" for i in range(rooms)]
            for r in names:
                codes[r] = [f"{rng.randrange(1000, 9999)}"]
                tasks.append(Task(f"{split}-scout-{r}-0", f"scout the vault in room {r}", split,
                                  {"kind": "scout", "room": r, "code": codes[r][0], "pattern": "scout"}))
            for r in names[:restale]:
                codes[r].append(f"{rng.randrange(1000, 9999)}")
                tasks.append(Task(f"{split}-scout-{r}-1", f"scout the vault in room {r}", split,
                                  {"kind": "scout", "room": r, "code": codes[r][-1], "pattern": "scout"}))
            order = names[:]
            rng.shuffle(order)
            for r in order:
                tasks.append(Task(f"{split}-unlock-{r}", f"unlock the strongbox in chamber {r}", split,
                                  {"kind": "unlock", "room": r, "code": codes[r][-1], "pattern": "unlock",
                                   "evidence": [f"vault {r} code is {codes[r][-1]}"],
                                   "stale": [f"vault {r} code is {c}" for c in codes[r][:-1]],
                                   "sources": [f"scout the vault in room {r}"]}))
            self.tasks_by_split[split] = tasks
        self.task = None

    def tasks(self, split):
        return list(self.tasks_by_split[split])

    def reset(self, task):
        self.task = task
        return Observation("You stand in the hall.", ["look", "enter"])

    def step(self, command):
        m = self.task.meta
        if m["kind"] == "scout":
            return Observation(f"The display reads: vault {m['room']} code is {m['code']}.", done=True, won=True)
        if command == f"enter {m['code']}":
            return Observation("The strongbox opens.", done=True, won=True)
        return Observation("Wrong code. The strongbox stays shut.", done=True, won=False)


class ScriptedAgent:
    """Scouts by looking; unlocks with the first code the memory gives for the room (else a wrong guess)."""

    name = "scripted"

    def act(self, task, history, observation, memory):
        if task.meta["kind"] == "scout":
            return "look"
        m = re.search(rf"vault {task.meta['room']} code is (\d+)", memory or "")
        return f"enter {m.group(1)}" if m else "enter 0000"


def scripted_evaluator(world, **kw) -> RolloutEvaluator:
    """The scripted agent on ``world`` with a hash encoder: what every vault-world test evaluates with."""
    from memagent_provider_fakes import HashEncoder

    return RolloutEvaluator(world, ScriptedAgent(), encoder=HashEncoder(64), max_steps=3, max_words=60, **kw)


def make_evaluator(seed: int = 0, **kw):
    world = VaultWorld(seed)
    return world, scripted_evaluator(world, **kw)


def fake_builder(world, built: list | None = None):
    """A ``train.automem.build_evaluator`` stand-in for job tests: ``world`` and a fresh scripted evaluator per call
    (appended to ``built``, so a test can count what a rerun played)."""
    def build(cfg, env=None):
        ev = scripted_evaluator(world)
        if built is not None:
            built.append(ev)
        return world, ev

    return build
