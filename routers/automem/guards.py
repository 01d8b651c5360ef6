"""``avoid_when`` guards (seed 003 appendix B.5: every unit carries use_when / avoid_when guards, checked at
injection time): what a unit assumes about where the things its task sought were, and the check that withholds
it when the current goal says otherwise.

A unit written from "find the brass key in the oak chest ..." (or whose trajectory ran ``take brass key from oak
chest``) assumes the brass key is in the oak chest. A later goal "find the brass key in the cupboard ..." places
the same item elsewhere: the unit's route is stale for that goal, and injecting it sends the agent down it. The
rule reads only *sought-item* locations -- a finding verb (find / take / get / fetch / bring / retrieve / grab /
pick up) with ``the X in / from / inside / on / under the Y`` -- so a shared fixture ("the table in the hall")
is not a fact that conflicts across worlds, and a different item in the same place is no conflict (its route is
exactly what a sibling task needs).

The *route* guard (``off_route``) goes one step further, for units written away from their item (a workflow of a
sibling item, the same world's other sites): a successful trajectory's route leads to the places it took things
from (``route_to``: its ``take X from Y`` actions). A goal that sends its item to a place none of them is would copy
a route to somewhere else: "find the brass key in the cupboard" gets nothing from "take red cup from oak chest" but
the way to the oak chest. A failed trajectory has no route (the site guard below handles failures), and a
goal that names no place fires neither guard.

The *world* guard (``other_world``) withholds a unit written in another world than the one the goal names
(``"In Elm, ..."``: ``goal_world``): its rooms, containers and routes are another map's, so in a world memory
has never seen it can only mislead (an unseen world's tasks, measured: no memory 3/18, every searched
architecture 0-3/18 without it). A goal or unit without a world fires nothing.

The *site* guard (``other_site``) is for the records of failures (an ``insight`` "the attempt 'go east' ended with
... do not repeat it", a failed ``trajectory``): a failed task's record is about the way to the place its goal sought,
so a goal that seeks nothing there gets another site's dead end as advice. Measured on the persistent-world suite:
an architecture injecting its own failures' insights in 16 of 18 unseen-world tasks solved none (no memory 3), and
failed trajectories of other sites turned 4 of 4 moved tasks no memory solves into 0 of 4.

    location_facts("In Elm, find the brass key in the oak chest and put it on the table in the hall.")
    # {'brass key': 'oak chest'}
    conflicts([["brass key", "oak chest"]], {"brass key": "cupboard"})   # [('brass key', 'oak chest', 'cupboard')]
    off_route(["oak chest"], {"brass key": "cupboard"})                  # [('brass key', 'cupboard', ('oak chest',))]
    goal_world("In Elm, find the brass key in the oak chest ...")          # 'elm'
    other_world("elm", "In Oak Hollow, find ...")                          # True
    other_site([["red cup", "oak chest"]], {"brass key": "cupboard"})     # True
    sought_items("In Elm, find the brass key and put it on the table in the hall.")  # ['brass key']

The *sought* guards (``taken``, ``unsought``; off by default) are for goals that name their item but not its place
("find the golden teapot"), where the guards above read no fact. A successful episode that took the item its goal now
seeks moved it (to the table it delivered it to): its route to the item is stale by the episode's own record
(``took``), so a goal seeking that item again gets none of its units (``taken``). And a unit that names neither the
goal's item nor the place the goal names is not about this goal at all (``unsought``: another object's route in the
same world, which a world-sharing goal would otherwise keep). Measured on the no-container suite (session 43): memory
of any route cost the moved tasks no memory solves.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

_PHRASE = r"[a-z][a-z0-9'\-]*(?: [a-z][a-z0-9'\-]*){0,3}?"
_VERB = r"(?:find|take|get|fetch|bring|retrieve|grab|pick up|collect)"
_PREP = r"(?:in|from|inside|on|under|out of)"
_STOP = r"(?= and\b| then\b| to\b| for\b| in\b| on\b| at\b| with\b|[,.;:!?\n]|$)"
_SOUGHT = re.compile(rf"\b{_VERB} (?:the |a |an )?({_PHRASE}) {_PREP} (?:the |a |an )?({_PHRASE}){_STOP}",
                     re.IGNORECASE)
_ARTICLE = re.compile(r"^(?:the|a|an) ")
_WORLD = re.compile(r"^\s*In ((?:[A-Z][\w'\-]*)(?: [A-Z][\w'\-]*){0,3}),")


# the trace keys of the guards, in the order ``MemorySystem`` tries them
WITHHELD = ("other_world", "taken", "unsought", "stale", "off_route", "other_site")
_SEEK = re.compile(rf"\b{_VERB} (?:the |a |an )?({_PHRASE}){_STOP}", re.IGNORECASE)


def _norm(phrase: str) -> str:
    return _ARTICLE.sub("", " ".join(phrase.lower().split()))


def location_facts(*texts: str) -> dict[str, str]:
    """Sought item -> where the text places it, over ``texts`` in order (a later mention wins)."""
    out: dict[str, str] = {}
    for text in texts:
        for m in _SOUGHT.finditer(text or ""):
            item, where = _norm(m.group(1)), _norm(m.group(2))
            if item and where and item != where:
                out[item] = where
    return out


def conflicts(assumed: Iterable | None, goal_facts: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """``(item, assumed place, goal's place)`` for every item the unit places elsewhere than the goal does
    (``assumed``: the unit's ``avoid_when`` pairs)."""
    goal = {_norm(k): _norm(v) for k, v in goal_facts.items()}
    out = []
    for pair in assumed or ():
        item, where = _norm(str(pair[0])), _norm(str(pair[1]))
        now = goal.get(item)
        if now is not None and now != where:
            out.append((item, where, now))
    return out


def off_route(route_to: Iterable[str] | None, goal_facts: Mapping[str, str]) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(item, goal's place, the route's places)`` for every item the goal sends to a place the unit's route does
    not lead to (``route_to``: the unit's ``route_to``; a unit without a route is never off it)."""
    places = tuple(sorted({_norm(str(p)) for p in route_to or ()}))
    if not places:
        return []
    return [(_norm(k), _norm(v), places) for k, v in goal_facts.items() if _norm(v) not in places]


def goal_world(goal: str | None) -> str | None:
    """The world a goal is set in (its leading ``In <Name>,``; lower-cased), or None when it names none."""
    m = _WORLD.match(goal or "")
    return m.group(1).lower() if m else None


def other_world(unit_world: str | None, goal: str) -> bool:
    """Whether a unit written in ``unit_world`` belongs to another world than the one ``goal`` names."""
    now = goal_world(goal)
    return bool(unit_world and now and str(unit_world).lower() != now)


def other_site(assumed: Iterable | None, goal_facts: Mapping[str, str]) -> bool:
    """Whether the places a unit's task sought (``assumed``: its ``avoid_when`` pairs) and the places the goal seeks
    its items share none (either side naming no place: False)."""
    unit = {_norm(str(pair[1])) for pair in assumed or ()}
    goal = {_norm(v) for v in goal_facts.values()}
    return bool(unit and goal) and not unit & goal


def sought_items(goal: str) -> list[str]:
    """The items a goal seeks (what follows a finding verb), whether or not it says where they are."""
    return list(dict.fromkeys(_norm(m.group(1)) for m in _SEEK.finditer(goal or "") if m.group(1)))


def taken(took: Iterable[str] | None, goal: str) -> list[str]:
    """The items a unit's own episode took (``took``) that ``goal`` seeks again: the unit's route to them is stale."""
    mine = {_norm(str(t)) for t in took or ()}
    return [x for x in sought_items(goal) if x in mine]


def unsought(text: str, goal: str, goal_facts: Mapping[str, str]) -> bool:
    """Whether ``text`` (a unit's key and text) names none of the items ``goal`` seeks and none of the places it names
    (a goal seeking nothing: False)."""
    wanted = sought_items(goal) + [_norm(v) for v in goal_facts.values()]
    low = " ".join((text or "").lower().split())
    return bool(wanted) and not any(re.search(rf"\b{re.escape(w)}\b", low) for w in wanted)
