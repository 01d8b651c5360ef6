"""The exact world state of a played TextWorld game, step by step.

A played game is an :class:`~routers.memory.schema.Episode` whose step ``T0`` stores the game's initial
facts (``meta["facts"]``, lists like ``["at", "P", "kitchen"]``) and entity types, and whose later steps
store the facts each action added and removed. :class:`PlayedGame` replays those diffs into one
:class:`World` per step and answers "which step made this knowable" queries; the questions built on it
are in :mod:`data_synthesis.textworld_qa`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Iterable

from routers.memory.schema import Episode

DIRECTIONS = ("north", "south", "east", "west")
PORTABLE_TYPES = {"f", "o", "k", "meal"}
_HEADER = re.compile(r"-=\s*(.+?)\s*=-")
_SCORE_UP = re.compile(r"score has just gone up by (\w+) point", re.I)


def fact_key(fact: Iterable[str]) -> tuple[str, ...]:
    return tuple(fact)


class World:
    """Queries over one set of facts (the state after a step)."""

    def __init__(self, facts: Iterable[tuple[str, ...]], types: dict[str, str]):
        self.facts = frozenset(facts)
        self.types = types
        self._by_pred: dict[str, list[tuple[str, ...]]] = defaultdict(list)
        for f in self.facts:
            self._by_pred[f[0]].append(f)

    def player_room(self) -> str | None:
        return next((f[2] for f in self._by_pred["at"] if f[1] == "P"), None)

    def holder(self, x: str) -> tuple[str, str] | None:
        """("in", container) / ("on", supporter) / ("at", room) / ("in", "I") for the inventory."""
        for pred in ("in", "on", "at"):
            for f in self._by_pred[pred]:
                if f[1] == x and len(f) == 3:
                    return pred, f[2]
        return None

    def room_of(self, x: str, _depth: int = 0) -> str | None:
        h = self.holder(x)
        if h is None or _depth > 5:
            return None
        rel, where = h
        if where == "I":
            return self.player_room()
        if rel == "at":
            return where
        return self.room_of(where, _depth + 1)

    def inventory(self) -> list[str]:
        return sorted(f[1] for f in self._by_pred["in"] if f[2] == "I")

    def contents(self, holder: str) -> list[str]:
        return sorted(f[1] for f in self._by_pred["in"] + self._by_pred["on"] if f[2] == holder)

    def is_open(self, c: str) -> bool | None:
        if ("open", c) in self.facts:
            return True
        if ("closed", c) in self.facts or ("locked", c) in self.facts:
            return False
        return None

    def openables(self) -> list[str]:
        return sorted({f[1] for p in ("open", "closed", "locked") for f in self._by_pred[p]})

    def exits(self, room: str) -> dict[str, tuple[str, str | None]]:
        """direction -> (destination, door or None). ``north_of(A, B)``: A lies north of B."""
        out = {}
        for d in DIRECTIONS:
            for f in self._by_pred[f"{d}_of"]:
                if f[2] == room:
                    door = next((g[2] for g in self._by_pred["link"] if g[1] == room and g[3] == f[1]), None)
                    out[d] = (f[1], door)
        return out

    def portables(self) -> list[str]:
        return sorted(e for e, t in self.types.items() if t in PORTABLE_TYPES and self.holder(e) is not None)


def find_mentions(text: str, names: Iterable[str]) -> set[str]:
    """Entity names in ``text`` (whole words, longest first so "red hot pepper" does not count as "pepper")."""
    low = text.lower()
    found = set()
    for name in sorted(set(names), key=lambda n: (-len(n), n)):
        pat = re.compile(rf"(?<![\w-]){re.escape(name.lower())}(?![\w-])")
        if pat.search(low):
            found.add(name)
            low = pat.sub(" ", low)
    return found


def room_header(observation: str) -> str | None:
    m = _HEADER.search(observation)
    return m.group(1).lower().replace(" ", "") if m else None


def score_increment(observation: str) -> int | None:
    words = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}
    m = _SCORE_UP.search(observation)
    return words.get(m.group(1).lower()) if m else None


def state_sentence(observation: str, entity: str) -> str | None:
    """"open"/"closed" when a sentence of the observation states it for ``entity`` ("A closed fridge")."""
    for sent in re.split(r"(?<=[.!?])\s+|\n+", observation):
        low = sent.lower()
        if re.search(rf"(?<![\w-]){re.escape(entity.lower())}(?![\w-])", low):
            m = re.search(r"\b(closed|open)\b", low)
            if m and low.index(m.group(1)) < low.index(entity.lower()):
                return m.group(1)
    return None


class PlayedGame:
    """Per-step actions, observations, exact world states and fact diffs of a played episode."""

    def __init__(self, episode: Episode):
        self.episode = episode
        steps = episode.steps
        if not steps or "facts" not in steps[0].meta:
            raise ValueError(f"episode {episode.episode_id}: step 0 lacks meta['facts'] (not a TextWorld trajectory)")
        self.types: dict[str, str] = dict(steps[0].meta.get("entity_types", {}))
        facts = {fact_key(f) for f in steps[0].meta["facts"]}
        self.worlds = [World(facts, self.types)]
        self.added = [set(facts)]
        self.removed: list[set] = [set()]
        for s in steps[1:]:
            add = {fact_key(f) for f in s.meta.get("added", [])}
            rem = {fact_key(f) for f in s.meta.get("removed", [])}
            facts = (facts - rem) | add
            self.worlds.append(World(facts, self.types))
            self.added.append(add)
            self.removed.append(rem)
        self.actions = [s.meta.get("action", "") for s in steps]
        self.obs = [s.meta.get("observation", "") for s in steps]
        self.scores = [int(s.meta.get("score", 0)) for s in steps]
        names = [e for e in self.types if self.types[e] not in {"P", "I", "RECIPE"}]
        self.mentions = [find_mentions(o, names) for o in self.obs]
        self.headers = [room_header(o) for o in self.obs]
        self.ids = [s.step_id for s in steps]

    def __len__(self) -> int:
        return len(self.worlds)

    def verb(self, i: int) -> str:
        return self.actions[i].split(" ", 1)[0] if self.actions[i] else ""

    def target(self, i: int) -> str:
        parts = self.actions[i].split(" ", 1)
        return parts[1] if len(parts) > 1 else ""

    def failure(self, i: int) -> dict | None:
        return self.episode.steps[i].meta.get("failure")

    def holder_changed(self, x: str, i: int) -> bool:
        return i > 0 and self.worlds[i].holder(x) != self.worlds[i - 1].holder(x)

    def sighting(self, x: str, i: int) -> bool:
        """Step ``i``'s observation shows where ``x`` is (room description, opening/examining its holder, inventory)."""
        w = self.worlds[i]
        h = w.holder(x)
        if h is None or x not in self.mentions[i]:
            return False
        if h[1] == "I":
            return self.verb(i) == "inventory"
        if w.room_of(x) != w.player_room():
            return False
        if self.headers[i]:
            return True
        return self.verb(i) in ("open", "examine") and self.target(i) == h[1]

    def location_evidence(self, x: str, k: int) -> int | None:
        """The last step <= k that moved ``x`` or showed where it was (None: the player never learned it)."""
        for j in range(k, -1, -1):
            if self.holder_changed(x, j) or self.sighting(x, j):
                return j
        return None

    def last_room_step(self, k: int) -> int:
        """The last step <= k whose observation names the room the player was in (arrival, look, start)."""
        room = self.worlds[k].player_room()
        for j in range(k, -1, -1):
            if self.headers[j] == room:
                return j
        return 0

    def move_step(self, k: int) -> int:
        """The last step <= k that put the player where they were after step k (0 = never moved)."""
        for j in range(k, 0, -1):
            if any(f[0] == "at" and f[1] == "P" for f in self.added[j]):
                return j
        return 0

    def open_state_evidence(self, c: str, k: int) -> int | None:
        """The last step <= k that changed or stated whether ``c`` was open."""
        for j in range(k, -1, -1):
            if j > 0 and self.worlds[j].is_open(c) != self.worlds[j - 1].is_open(c):
                return j
            if state_sentence(self.obs[j], c) == ("open" if self.worlds[j].is_open(c) else "closed"):
                return j
        return None

    def inventory_steps(self, k: int) -> list[int] | None:
        """The last ``inventory`` listing <= k plus every later step up to k that changed the inventory."""
        last = next((j for j in range(k, 0, -1) if self.verb(j) == "inventory" and self.actions[j] == "inventory"), None)
        if last is None:
            return None
        changes = [j for j in range(last + 1, k + 1)
                   if any(f[0] == "in" and f[-1] == "I" for f in self.added[j] | self.removed[j])]
        return [last] + changes

