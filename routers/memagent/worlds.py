"""Persistent TextWorld worlds whose tasks share knowledge: the layout, the task families and the step budget.

A **world** is fixed by its seed: a map of rooms grown as a tree on a grid from a hub room (exits
north/south/east/west), a few *sites* (an open container in a room at least ``min_site_depth`` moves from
the hub, holding several objects), distractor shelves in the other rooms, and in the hub a ``table`` (where
every task delivers) and empty containers (``moved_to``: the ``cupboard``). Every task of a world is played in
that same world (one compiled game per task; only the goal differs), so what an earlier episode learned (the
route to a room, which container holds which object, the command sequence that worked) is exactly what a later
task needs.

Task families (goal: ``"In <world>, find the <object> in the <container> and put it on the table in the <hub>."``;
the container is named, so a memory of that container's episode is findable from the goal, but not where it is):

* ``fetch``: bring an object from its site to the hub table. In a *seen* world one object per site is a
  training task; the site's other objects are held-out tasks with that training task as ``sibling`` (new goal,
  same route, same container). Objects of *unseen* worlds are held-out tasks without a sibling; those of the
  ``train_unseen`` worlds are training tasks of the same kind (no demonstration, the held-out budget), so that a
  search or a router's training data holds tasks where no memory of the world exists at its first visit.
* ``moved`` (changed world, adversarial memory): the object of a training task, in a variant of its world
  where that object now lies in a container of the hub (``moved_to``, the cupboard by default; several names
  rotate over the moved tasks: the family is not one fixed word of the goal, though hub containers still appear
  only in moved goals). The goal names that container. Memory of the training episode (its ``sibling``)
  sends the agent down the old, now useless route; without memory the object is in sight. ``n_moved`` per seen
  world are held out; ``train_moved`` more (later sites) are training tasks, so that a router's training labels
  also show memory misleading.

``demonstrations``: training first visits are *demonstrations* (``TaskSpec.demonstration``): forced exploration
plays them once with the expert (walkthrough) agent and stores that episode, instead of hoping a small agent
finds the room within its budget. The knowledge then enters memory the way expert trajectories enter the
memories of ALFWorld-style agents; what the suite tests is whether routing to it (or away from it) changes the
outcome of the tasks the agent itself plays. Demonstrations give no Begin/In labels (memory played no part).

Held-out games of a seen world are played after its training episodes: the objects those delivered are
gone (``TaskSpec.delivered``), so a remembered ``take <old object> from <container>`` is no longer on offer
and a copied route meets this task's object where the old one was.

The optimal command sequence (``walkthrough``) is known by construction (shortest path there and back), and
the step budget of a held-out task is :func:`step_budget` = ``ceil(budget_factor * optimal) + budget_slack``:
too tight for a blind search of the map, enough for an agent that knows the way. Training tasks (first
visits) get ``train_budget_factor`` instead, room to explore, so that their episodes can succeed and be stored.

Everything here is pure Python and deterministic (string-seeded ``random.Random``); compiling a task into a
TextWorld game is :func:`compile_task` (the GameMaker API; TextWorld is imported only there).
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

GENERATOR_VERSION = 4   # bump when generation changes what a config produces (it is part of the cache key)
FAMILIES = ("fetch", "moved")
SPLITS = ("train", "heldout")
UNSEEN_SEED_OFFSET = 100_000
DIRECTIONS = {"north": (0, 1), "south": (0, -1), "east": (1, 0), "west": (-1, 0)}
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
TARGET, CUPBOARD = "table", "cupboard"
from routers.memagent.worlds_vocab import (ADJECTIVES, CATEGORY_GROUPS, CATEGORY_SIZE, CONTAINERS,  # noqa: F401
                                           HUBS, NOUNS, OBJECT_CATEGORIES, ROOMS, SPARE_NOUNS, SUPPORTERS,
                                           WORLD_NAMES)


@dataclass
class WorldConfig:
    """What a suite of worlds is made of (every field is part of the games' cache key)."""

    seed: int = 0
    n_seen: int = 6               # worlds with training tasks (+ held-out new goals / moved tasks)
    n_unseen: int = 2             # worlds with held-out tasks only
    train_unseen: int = 0         # worlds with training tasks only, played as unseen worlds' are (no demonstrations)
    n_rooms: int = 8              # including the hub
    n_sites: int = 3              # containers holding task objects, one per room
    site_objects: int = 3         # objects per site: 1 training task + (site_objects - 1) held-out per seen site
    goal_names_holder: bool = True   # "find the X in the chest": memory of the chest's episode is findable
    train_repeats: int = 0        # of those held-out objects, how many per site are training *repeat* visits instead
    n_moved: int = 1              # held-out changed-world tasks per seen world (first sites)
    train_moved: int = 0          # training changed-world tasks per seen world (the next sites)
    moved_to: list[str] = field(default_factory=lambda: [CUPBOARD])   # hub containers moved objects go to (rotating)
    moved_object: str = "first"   # first: the first visit's object (the one memory remembers); other: the site's
    #   last object (never fetched in training, but a held-out fetch task's: that task then retrieves the stored
    #   moved memory); spare: an extra object per seen site (SPARE_NOUNS) that no other task names
    demonstrations: bool = False  # training first visits are played by the expert (walkthrough) agent
    unique_objects: bool = True   # one kind of object per site, no noun in two sites (OBJECT_CATEGORIES)
    min_site_depth: int = 2       # moves from the hub to a site's room
    budget_factor: float = 1.0
    budget_slack: int = 2
    train_budget_factor: float = 3.0   # training tasks are first visits: room to explore (and succeed, and be stored)

    def __post_init__(self):
        for name in ("n_seen", "n_unseen", "train_unseen", "n_moved", "train_moved"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.n_rooms < 2 or self.n_rooms > len(ROOMS) + 1:
            raise ValueError(f"n_rooms must be in [2, {len(ROOMS) + 1}], got {self.n_rooms}")
        if not 1 <= self.n_sites < self.n_rooms or self.n_sites > len(CONTAINERS):
            raise ValueError(f"n_sites must be in [1, n_rooms - 1], got {self.n_sites} (n_rooms={self.n_rooms})")
        if self.site_objects < 1 or self.n_sites * self.site_objects + self.n_rooms > len(NOUNS):
            raise ValueError(f"site_objects must be >= 1 and n_sites * site_objects + n_rooms <= {len(NOUNS)}")
        sites = (int(self.n_seen) + int(self.n_unseen) + int(self.train_unseen)) * self.n_sites
        per = CATEGORY_SIZE // max(1, self.site_objects)
        if self.unique_objects and sites > len(OBJECT_CATEGORIES) * per:
            raise ValueError(f"unique_objects: (n_seen + n_unseen + train_unseen) * n_sites = {sites} sites, but "
                             f"the object categories hold {len(OBJECT_CATEGORIES) * per} sites of {self.site_objects} "
                             "objects; use fewer worlds, sites or site_objects, or unique_objects false")
        if not 0 <= self.train_repeats < self.site_objects:
            raise ValueError(f"train_repeats must be in [0, site_objects - 1], got {self.train_repeats} "
                             f"(site_objects={self.site_objects})")
        if self.n_moved + self.train_moved > self.n_sites:
            raise ValueError(f"n_moved + train_moved ({self.n_moved} + {self.train_moved}) cannot exceed n_sites "
                             f"({self.n_sites}): each moved task uses its own site's first object")
        self.moved_to = list(self.moved_to)
        taken = {TARGET, *CONTAINERS, *SUPPORTERS}
        if not self.moved_to or len(set(self.moved_to)) != len(self.moved_to) or taken & set(self.moved_to):
            raise ValueError(f"moved_to must be distinct hub container names, none of {sorted(taken)}, got "
                             f"{list(self.moved_to)}")
        if self.moved_object not in ("first", "other", "spare"):
            raise ValueError(f"moved_object must be 'first', 'other' or 'spare', got {self.moved_object!r}")
        if self.moved_object == "spare" and self.n_seen * self.n_sites > len(SPARE_NOUNS):
            raise ValueError(f"moved_object 'spare' names one object per seen site: n_seen * n_sites = "
                             f"{self.n_seen * self.n_sites} > {len(SPARE_NOUNS)} spare nouns")
        if self.moved_object == "other" and self.site_objects - 1 <= self.train_repeats:
            raise ValueError("moved_object 'other' needs a site object no training task fetches: site_objects must "
                             f"exceed train_repeats + 1 (got {self.site_objects}, {self.train_repeats})")
        if self.min_site_depth < 1:
            raise ValueError(f"min_site_depth must be >= 1, got {self.min_site_depth}")
        if self.budget_factor < 1.0 or self.train_budget_factor < 1.0 or self.budget_slack < 0:
            raise ValueError(f"need budget_factor >= 1, train_budget_factor >= 1 and budget_slack >= 0, got "
                             f"{self.budget_factor}, {self.train_budget_factor}, {self.budget_slack}")


def step_budget(optimal: int, factor: float = 1.0, slack: int = 2) -> int:
    """Steps a task allows: ``ceil(factor * optimal) + slack`` (the optimal path plus a small margin)."""
    if optimal < 0:
        raise ValueError(f"optimal must be >= 0, got {optimal}")
    return int(math.ceil(factor * optimal - 1e-9)) + int(slack)


@dataclass
class WorldSpec:
    """One world: rooms with grid positions, exits, holders (``{name: {room, kind}}``) and objects
    (``{name: holder}``). ``hub`` is where the player starts and where the table is."""

    world_id: str
    seed: int
    name: str
    hub: str
    rooms: dict[str, list[int]]                      # room -> [x, y]
    exits: list[list[str]]                           # [room, direction, other room] (both ways listed once)
    holders: dict[str, dict[str, str]]               # holder -> {"room": ..., "kind": "container" | "supporter"}
    objects: dict[str, str]                          # object -> holder
    sites: list[str] = field(default_factory=list)   # site containers, in order

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "WorldSpec":
        return cls(**d)

    def neighbours(self) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {r: {} for r in self.rooms}
        for a, d, b in self.exits:
            out[a][d] = b
            out[b][OPPOSITE[d]] = a
        return out

    def path(self, start: str, goal: str) -> list[str]:
        """Directions of the shortest path (BFS; the map is a tree, so it is the only simple path)."""
        nb, prev, todo = self.neighbours(), {start: None}, deque([start])
        while todo:
            room = todo.popleft()
            if room == goal:
                break
            for d in sorted(nb[room]):
                nxt = nb[room][d]
                if nxt not in prev:
                    prev[nxt] = (room, d)
                    todo.append(nxt)
        if goal not in prev:
            raise ValueError(f"world {self.world_id}: no path from {start} to {goal}")
        out, room = [], goal
        while prev[room] is not None:
            room, d = prev[room]
            out.append(d)
        return out[::-1]

    def depth(self, room: str) -> int:
        return len(self.path(self.hub, room))


@dataclass
class TaskSpec:
    task_id: str
    world_id: str
    family: str
    split: str
    goal: str
    object: str
    holder: str                      # where the object is in this task's game
    room: str
    walkthrough: list[str]
    optimal_steps: int
    budget: int
    sibling: str | None = None       # task whose episode carries this task's knowledge (moved: the stale one)
    moved: dict[str, str] | None = None   # {"object", "from", "to"} for the changed-world family
    delivered: list[str] = field(default_factory=list)   # objects earlier (training) episodes took away
    demonstration: bool = False      # a training first visit played by the expert agent (stored, not labelled)

    def to_dict(self) -> dict:
        return asdict(self)


def _grow_map(rng: random.Random, names: list[str], hub: str) -> tuple[dict, list]:
    """A tree on the grid: each new room attaches to a free side of the newest room (p=0.6) or a random one."""
    pos = {hub: (0, 0)}
    taken = {(0, 0): hub}
    exits, order = [], [hub]
    for name in names:
        for _ in range(200):
            base = order[-1] if rng.random() < 0.6 else rng.choice(order)
            free = [d for d, (dx, dy) in DIRECTIONS.items()
                    if (pos[base][0] + dx, pos[base][1] + dy) not in taken]
            if free:
                d = rng.choice(sorted(free))
                xy = (pos[base][0] + DIRECTIONS[d][0], pos[base][1] + DIRECTIONS[d][1])
                pos[name], taken[xy] = xy, name
                exits.append([base, d, name])
                order.append(name)
                break
        else:  # pragma: no cover - a 2D grid always has a free side somewhere
            raise RuntimeError("could not place a room")
    return {k: list(v) for k, v in pos.items()}, exits


def object_nouns(cfg: WorldConfig, index: int) -> tuple[list[list[str]], list[str]]:
    """Under ``unique_objects``: the object nouns of each site of the suite's world ``index`` (site ``k`` is the
    suite's site ``n = n_sites * index + k``: among the first nine kinds, category ``n mod 9``, its ``n div 9``-th
    slice of ``site_objects`` nouns; sites beyond what those hold take the next group of kinds
    (``CATEGORY_GROUPS``) the same way; no two
    sites share a noun) and the distractor nouns (``NOUNS`` no site of this world uses)."""
    cats, per = list(OBJECT_CATEGORIES.values()), CATEGORY_SIZE // cfg.site_objects
    slots, bounds = [], (0, *CATEGORY_GROUPS)
    for lo, hi in zip(bounds, bounds[1:]):  # group by group, round-robin over the kinds of a group
        slots += [(lo + m % (hi - lo), m // (hi - lo)) for m in range((hi - lo) * per)]
    out = []
    for k in range(cfg.n_sites):
        cat, part = slots[cfg.n_sites * index + k]
        out.append(list(cats[cat][part * cfg.site_objects:(part + 1) * cfg.site_objects]))
    used = {w for site in out for w in site}
    return out, [w for w in NOUNS if w not in used]


def make_world(cfg: WorldConfig, seed: int, index: int = 0) -> WorldSpec:
    """The world of ``seed`` (same seed and config -> the same map, holders and objects); ``index`` (its
    position in the suite) picks the world's name and, with ``unique_objects``, its block of object nouns."""
    for attempt in range(100):
        rng = random.Random(f"memroute-world:{seed}:{attempt}")
        hub = rng.choice(HUBS)
        names = rng.sample(ROOMS, cfg.n_rooms - 1)
        rooms, exits = _grow_map(rng, names, hub)
        holders = {TARGET: {"room": hub, "kind": "supporter"}}
        holders.update({box: {"room": hub, "kind": "container"} for box in cfg.moved_to})
        spec = WorldSpec(world_id=f"world{seed}", seed=seed, name=_world_name(index), hub=hub, rooms=rooms,
                         exits=exits, holders=holders, objects={})
        deep = [r for r in names if spec.depth(r) >= cfg.min_site_depth]
        if len(deep) < cfg.n_sites:
            continue
        site_rooms = rng.sample(deep, cfg.n_sites)
        containers = rng.sample(CONTAINERS, cfg.n_sites)
        supporters = iter(rng.sample(SUPPORTERS, len(SUPPORTERS)))
        nouns = iter(rng.sample(NOUNS, len(NOUNS)))
        per_site = [nouns] * cfg.n_sites
        if cfg.unique_objects:
            own, spare = object_nouns(cfg, index)
            per_site, nouns = [iter(rng.sample(o, len(o))) for o in own], iter(rng.sample(spare, len(spare)))
        for k, (room, box, site_nouns) in enumerate(zip(site_rooms, containers, per_site)):
            spec.holders[box] = {"room": room, "kind": "container"}
            spec.sites.append(box)
            for _ in range(cfg.site_objects):
                spec.objects[f"{rng.choice(ADJECTIVES)} {next(site_nouns)}"] = box
            if cfg.moved_object == "spare" and index < cfg.n_seen:  # no rng draw: other modes generate as before
                n = cfg.n_sites * index + k
                spec.objects[f"{ADJECTIVES[n % len(ADJECTIVES)]} {SPARE_NOUNS[n]}"] = box
        for room in names:  # distractors: a supporter (maybe with an object) in every other room
            if room in site_rooms:
                continue
            shelf = next(supporters, None)
            if shelf is None:
                break
            spec.holders[shelf] = {"room": room, "kind": "supporter"}
            if rng.random() < 0.7:
                spec.objects[f"{rng.choice(ADJECTIVES)} {next(nouns)}"] = shelf
        return spec
    raise ValueError(f"world seed {seed}: no layout with {cfg.n_sites} rooms at depth >= {cfg.min_site_depth} "
                     f"among {cfg.n_rooms} rooms in 100 attempts; lower min_site_depth or n_sites")


def _world_name(index: int) -> str:
    name = WORLD_NAMES[index % len(WORLD_NAMES)]
    return name if index < len(WORLD_NAMES) else f"{name} {index // len(WORLD_NAMES) + 1}"


def goal_text(world: WorldSpec, obj: str, holder: str | None = None) -> str:
    where = f" in the {holder}" if holder else ""
    return f"In {world.name}, find the {obj}{where} and put it on the {TARGET} in the {world.hub}."


def walkthrough(world: WorldSpec, obj: str, holder: str) -> list[str]:
    """The optimal commands: the path to the holder's room, take, the path back, put on the table."""
    room = world.holders[holder]["room"]
    there = world.path(world.hub, room)
    return ([f"go {d}" for d in there] + [f"take {obj} from {holder}"]
            + [f"go {OPPOSITE[d]}" for d in reversed(there)] + [f"put {obj} on {TARGET}"])


def _task(cfg: WorldConfig, world: WorldSpec, family: str, split: str, obj: str, holder: str,
          sibling: str | None, moved: dict | None = None, seen: bool = True) -> TaskSpec:
    slug = obj.replace(" ", "_")
    wt = walkthrough(world, obj, holder)
    first_visit = seen and split == "train" and sibling is None  # an unseen world's tasks are never demonstrations
    goal = goal_text(world, obj, holder if cfg.goal_names_holder else None)
    return TaskSpec(task_id=f"{world.world_id}-{family}-{slug}", world_id=world.world_id, family=family,
                    split=split, goal=goal, object=obj, holder=holder,
                    room=world.holders[holder]["room"], walkthrough=wt, optimal_steps=len(wt),
                    budget=step_budget(len(wt), cfg.train_budget_factor if first_visit else cfg.budget_factor,
                                       cfg.budget_slack), sibling=sibling, moved=moved,
                    demonstration=first_visit and cfg.demonstrations)


def world_tasks(cfg: WorldConfig, world: WorldSpec, seen: bool, unseen_split: str = "heldout") -> list[TaskSpec]:
    """A world's tasks in a fixed order (site by site; moved tasks last).

    An unseen world's tasks are all ``unseen_split`` ("train" for the ``train_unseen`` worlds): no sibling, no
    demonstration, the held-out budget, nothing delivered; only what the agent itself stores within the world (or
    another world's memory) can help it.

    Per seen site: the first object is a training first visit (roomy budget), the next ``train_repeats`` are
    training repeat visits (sibling = the first visit, held-out budget: episodes where memory decides the
    outcome, so the router's training labels can show it), the rest are held out. Objects delivered by
    earlier training episodes are gone from every later game of the world. Moved tasks come last (held-out
    ones first, then ``train_moved`` training ones)."""
    out: list[TaskSpec] = []
    first: dict[str, TaskSpec] = {}
    for box in world.sites:
        objs = [o for o, h in world.objects.items() if h == box][:cfg.site_objects]  # not the spare one
        for i, obj in enumerate(objs):
            train = seen and i <= cfg.train_repeats
            sib = None if (i == 0 or not seen) else first[box].task_id
            split = ("train" if train else "heldout") if seen else unseen_split
            t = _task(cfg, world, "fetch", split, obj, box, sib, seen=seen)
            if seen and i == 0:
                first[box] = t
            out.append(t)
    if seen:  # later tasks are played after the earlier training episodes: their objects are gone
        played: list[str] = []
        for t in out:
            t.delivered = list(played) if t.split == "train" else []
            if t.split == "train":
                played.append(t.object)
        for t in out:
            if t.split == "heldout":
                t.delivered = list(played)
        moved_sites = [(box, "heldout") for box in world.sites[:cfg.n_moved]]
        moved_sites += [(box, "train") for box in world.sites[cfg.n_moved:cfg.n_moved + cfg.train_moved]]
        for i, (box, split) in enumerate(moved_sites):
            stale, to = first[box], cfg.moved_to[(world.seed + i) % len(cfg.moved_to)]
            in_box = [o for o, h in world.objects.items() if h == box]  # the spare one last
            obj = {"first": stale.object, "other": in_box[cfg.site_objects - 1], "spare": in_box[-1]}[cfg.moved_object]
            out.append(_task(cfg, world, "moved", split, obj, to, stale.task_id,
                             moved={"object": obj, "from": box, "to": to}))
            out[-1].delivered = [o for o in played if o != obj]
    return out


def world_seeds(cfg: WorldConfig) -> list[tuple[int, bool, str]]:
    """(seed, seen, split of an unseen world's tasks) for every world: seen seeds ``seed + i``, unseen
    ``seed + UNSEEN_SEED_OFFSET + i``, then the ``train_unseen`` ones at ``seed + 2 * UNSEEN_SEED_OFFSET + i`` (after
    the others: the suite's other worlds keep their index, name and objects)."""
    return ([(cfg.seed + i, True, "heldout") for i in range(cfg.n_seen)]
            + [(cfg.seed + UNSEEN_SEED_OFFSET + i, False, "heldout") for i in range(cfg.n_unseen)]
            + [(cfg.seed + 2 * UNSEEN_SEED_OFFSET + i, False, "train") for i in range(cfg.train_unseen)])


def build_suite(cfg: WorldConfig) -> tuple[list[WorldSpec], list[TaskSpec]]:
    """Every world and task of the configuration (pure Python, deterministic, no compilation)."""
    worlds, tasks = [], []
    for index, (seed, seen, unseen_split) in enumerate(world_seeds(cfg)):
        w = make_world(cfg, seed, index)
        worlds.append(w)
        tasks += world_tasks(cfg, w, seen, unseen_split)
    return worlds, tasks


def task_placement(world: WorldSpec, task: TaskSpec, delivered: list[str] = ()) -> dict[str, str]:
    """Objects -> holders in this task's game: the world's, without the objects ``delivered`` by earlier
    (training) episodes, and with a moved task's object back, in its new place."""
    placement = {o: h for o, h in world.objects.items() if o not in set(delivered)}
    if task.moved:
        placement[task.moved["object"]] = task.moved["to"]
    return placement


def compile_task(world: WorldSpec, task: TaskSpec, path: str) -> dict[str, Any]:
    """Build and compile the task's game with TextWorld's GameMaker into ``path`` (a ``.z8`` file).

    The grammar seed is the world seed and entities are created in the same order for every task of a world,
    so all of them describe the same rooms the same way; only the quest (and a moved object) differs.
    Returns the compiled game's facts (``{"facts": [...], "objective": ...}``) for checks.
    """
    import textworld
    from textworld import GameMaker
    from textworld.generator.game import Event, Quest

    opts = textworld.GameOptions()
    opts.seeds = world.seed
    M = GameMaker(opts)
    rooms = {name: M.new_room(name) for name in world.rooms}
    for a, d, b in world.exits:
        M.connect(getattr(rooms[a], d), getattr(rooms[b], OPPOSITE[d]))
    M.set_player(rooms[world.hub])
    ents = {}
    for name, h in world.holders.items():
        ent = M.new(type="c" if h["kind"] == "container" else "s", name=name)
        if h["kind"] == "container":
            ent.add_property("open")
        rooms[h["room"]].add(ent)
        ents[name] = ent
    placement = task_placement(world, task, task.delivered)
    objs = {}
    for name in placement:
        objs[name] = M.new(type="o", name=name)
        ents[placement[name]].add(objs[name])
    M.quests = [Quest(win_events=[Event(conditions={M.new_fact("on", objs[task.object], ents[TARGET])})])]
    game = M.build()
    game.objective = task.goal
    game.metadata.update({"walkthrough": list(task.walkthrough), "task_id": task.task_id})
    gopts = textworld.GameOptions()
    gopts.path = str(path)
    gopts.force_recompile = True
    textworld.generator.compile_game(game, gopts)
    return {"facts": sorted(str(f) for f in game.world.facts), "objective": game.objective}
