"""Evidence-exact QA over a played TextWorld game (AMA-Bench-style questions), one generator per type.

A trajectory is an :class:`~routers.memory.schema.Episode` whose step ``T0`` stores the game's initial
facts (``meta["facts"]``, lists like ``["at", "P", "kitchen"]``) and entity types, and whose later steps
store the facts each action added and removed. Replaying those diffs gives the exact world state after
every step, so each answer below is computed from the engine's own facts, never parsed from prose, and
each question's evidence is the set of steps that made the answer knowable:

* ``recall``: what the game showed at one event (contents revealed by opening a container, the recipe
  in the cookbook, what lay on a supporter on arrival, where an object was taken from);
* ``state_after_step``: where the player / an object was, what the player carried, whether a container
  was open, the score, right after step k (evidence: the steps that determined that state);
* ``causal_failure``: why a failing action failed (a closed door, no exit that way, the object was in
  another room / in a closed container / already carried, the container was already open), evidence =
  the failing step plus the step(s) that established the cause;
* ``state_update``: when something first happened, how many times, where the player went next.

Each QA carries ``meta["support_terms"]`` (names that must appear in the evidence text),
``meta["answer_terms"]`` (those the answer is made of) and ``meta["derivation"]`` (``text`` / ``count`` /
``step_id`` / ``absent_direction``); :func:`support_problems` checks them, and candidates that fail are
dropped, never written. The replayed world state (:class:`~data_synthesis.textworld_state.PlayedGame`) is
in :mod:`data_synthesis.textworld_state`.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from typing import Iterable

from data_synthesis.textworld_state import PlayedGame, room_header, score_increment
from routers.memory.schema import QA, Episode

CATEGORIES = ("recall", "state_after_step", "causal_failure", "state_update")
# AMA-Bench's four memory capabilities (MESA §5); counting questions are kept under state updating.
AMA_CAPABILITY = {"recall": "recall", "state_after_step": "state_updating", "causal_failure": "causal_inference",
                  "state_update": "state_updating"}


def _qa(category: str, template: str, question: str, answer: str, evidence: Iterable[int], traj: PlayedGame,
        terms: Iterable[str] = (), derivation: str = "text", answer_terms: Iterable[str] | None = None,
        **extra) -> dict:
    """``terms`` must appear in the evidence text; ``answer_terms`` (default: ``terms`` for text answers) in the answer."""
    ev = sorted(set(evidence))
    terms = list(terms)
    if answer_terms is None:
        answer_terms = terms if derivation in ("text", "absent_direction") else []
    return {"category": category, "question": question, "answer": answer, "evidence": [traj.ids[i] for i in ev],
            "meta": {"template": template, "ama_capability": AMA_CAPABILITY[category], "support_terms": terms,
                     "answer_terms": list(answer_terms), "derivation": derivation, **extra}}


def _join(items: list[str]) -> str:
    return ", ".join(items)


# -- candidates ----------------------------------------------------------------------------------------
def recall_candidates(t: PlayedGame) -> list[dict]:
    out = []
    opened: set[str] = set()
    for i in range(1, len(t)):
        v, tgt, w, prev = t.verb(i), t.target(i), t.worlds[i], t.worlds[i - 1]
        if v == "open" and ("open", tgt) in t.added[i] and t.types.get(tgt) != "d":
            items = [x for x in w.contents(tgt) if x in t.mentions[i]]
            if items and len(items) == len(w.contents(tgt)):
                when = "when first opening it" if tgt not in opened else f"when opening it at step {t.ids[i]}"
                out.append(_qa("recall", "open_reveal", f"What did the player find inside the {tgt} {when}?",
                               _join(items), [i], t, items))
            opened.add(tgt)
        if v == "examine" and tgt == "cookbook" and "Ingredients:" in t.obs[i]:
            ings, directions = parse_recipe(t.obs[i])
            if ings:
                out.append(_qa("recall", "recipe_ingredients", "Which ingredients did the recipe in the cookbook list?",
                               _join(ings), [i], t, ings))
            for ing in ings:
                verbs = [d.split(" ", 1)[0] for d in directions if d.endswith(" " + ing)]
                if verbs:
                    out.append(_qa("recall", "recipe_directions",
                                   f"According to the cookbook, how should the {ing} be prepared?",
                                   " and ".join(verbs), [i], t, verbs))
        if t.headers[i] and any(f[0] == "at" and f[1] == "P" for f in t.added[i]):
            room = w.player_room()
            for s in sorted(e for e, ty in t.types.items() if ty in ("s", "stove") and w.holder(e) == ("at", room)):
                items = w.contents(s)
                if items and all(x in t.mentions[i] for x in items):
                    out.append(_qa("recall", "supporter_on_arrival",
                                   f"What was on the {s} when the player arrived in the {room} at step {t.ids[i]}?",
                                   _join(items), [i], t, items))
        if v == "take":
            took = sorted(f[1] for f in t.added[i] if f[0] == "in" and f[2] == "I")
            for x in took:
                h = prev.holder(x)
                if h and h[0] in ("in", "on") and h[1] != "I":
                    out.append(_qa("recall", "take_source", f"Where did the player take the {x} from at step {t.ids[i]}?",
                                   f"the {h[1]}", [i], t, [h[1]]))
    return out


def parse_recipe(observation: str) -> tuple[list[str], list[str]]:
    """Ingredient names and direction lines of the cookbook text shown by ``examine cookbook``."""
    m = re.search(r"Ingredients:\s*(.*?)\s*Directions:\s*(.*)$", observation, re.S)
    if not m:
        return [], []
    ings = [x.strip() for x in m.group(1).splitlines() if x.strip()]
    dirs = [x.strip() for x in m.group(2).splitlines() if x.strip() and x.strip() != "prepare meal"]
    return ings, [re.sub(r"^(\w+) the ", r"\1 ", d) for d in dirs]


def state_candidates(t: PlayedGame, ks: list[int]) -> list[dict]:
    out = []
    for k in ks:
        w, sid = t.worlds[k], t.ids[k]
        room = w.player_room()
        j = t.move_step(k)
        out.append(_qa("state_after_step", "player_location", f"Where was the player right after step {sid}?",
                       room, [j], t, [room], step=k))
        inv_steps = t.inventory_steps(k)
        items = w.inventory()
        if inv_steps and 0 < len(items) <= 5:
            out.append(_qa("state_after_step", "inventory", f"What was the player carrying right after step {sid}?",
                           _join(items), inv_steps, t, items, step=k))
        for x in w.portables():
            j = t.location_evidence(x, k)
            if j is None:
                continue
            rel, where = w.holder(x)
            if where == "I":
                answer, terms, ev = "in the player's inventory", [], [j]
            elif rel == "at":
                answer, terms = f"on the floor of the {where}", [where]
                ev = [j] if t.headers[j] == where else [j, t.last_room_step(j)]
            else:
                answer, terms, ev = f"{rel} the {where}", [where], [j]
            out.append(_qa("state_after_step", "object_location", f"Where was the {x} right after step {sid}?",
                           answer, ev, t, terms, step=k))
        for c in w.openables():
            j = t.open_state_evidence(c, k)
            if j is not None:
                state = "open" if w.is_open(c) else "closed"
                out.append(_qa("state_after_step", "open_state", f"Was the {c} open or closed right after step {sid}?",
                               state, [j], t, [state if state == "open" else "close", c],
                               answer_terms=[state if state == "open" else "close"], step=k))
        ups = [j for j in range(1, k + 1) if t.scores[j] > t.scores[j - 1]]
        if ups and all(t.scores[j] - t.scores[j - 1] == 1 == score_increment(t.obs[j]) for j in ups):
            out.append(_qa("state_after_step", "score", f"What was the player's score right after step {sid}?",
                           str(t.scores[k]), ups, t, derivation="count", step=k))
    return out


def causal_candidates(t: PlayedGame) -> list[dict]:
    out = []
    for k in range(1, len(t)):
        fail = t.failure(k)
        if not fail:
            continue
        reason, before = fail["reason"], t.worlds[k - 1]
        q = f"Why did the action '{t.actions[k]}' fail at step {t.ids[k]}?"
        room = before.player_room()
        if reason == "closed_door":
            door = fail["door"]
            j = t.open_state_evidence(door, k - 1)
            if j is not None:
                out.append(_qa("causal_failure", reason, q, f"the {door} was closed", [j, k], t, [door], reason=reason))
        elif reason == "no_exit":
            j = t.last_room_step(k - 1)
            out.append(_qa("causal_failure", reason, q, f"the {room} has no exit to the {fail['direction']}", [j, k], t,
                           [room], derivation="absent_direction", direction=fail["direction"], reason=reason))
        elif reason == "not_here":
            x = fail["entity"]
            where = before.room_of(x)
            j = t.location_evidence(x, k - 1)
            if j is not None and where:
                ev = [j, k] if where in (t.headers[j] or "") or where in t.obs[j].lower() else [j, t.last_room_step(j), k]
                out.append(_qa("causal_failure", reason, q, f"the {x} was in the {where}", ev, t, [x, where], reason=reason))
        elif reason == "closed_container":
            x, c = fail["entity"], fail["container"]
            j1 = t.location_evidence(x, k - 1)
            j2 = next((j for j in range(k - 1, 0, -1) if ("closed", c) in t.added[j]), None)
            if j1 is not None and j2 is not None and j2 >= j1:
                out.append(_qa("causal_failure", reason, q, f"the {c} was closed", [j1, j2, k], t, [c], reason=reason))
        elif reason == "already_carried":
            x = fail["entity"]
            j = next((j for j in range(k - 1, 0, -1) if ("in", x, "I") in t.added[j]), None)
            if j is None:
                j = next((j for j in range(k - 1, 0, -1) if t.actions[j] == "inventory" and x in t.mentions[j]), None)
            if j is not None:
                out.append(_qa("causal_failure", reason, q, f"the player was already carrying the {x}", [j, k], t, [x],
                               reason=reason))
        elif reason == "already_open":
            c = fail["container"]
            j = t.open_state_evidence(c, k - 1)
            if j is not None:
                out.append(_qa("causal_failure", reason, q, f"the {c} was already open", [j, k], t, [c, "open"],
                               reason=reason))
    return out


def update_candidates(t: PlayedGame) -> list[dict]:
    out = []
    first_take: dict[str, int] = {}
    takes: dict[str, list[int]] = defaultdict(list)
    opens: dict[str, list[int]] = defaultdict(list)
    enters: dict[str, list[int]] = defaultdict(list)
    left: dict[str, int] = {}
    first_up = None
    for i in range(1, len(t)):
        for f in sorted(t.added[i]):  # sorted: set order varies with PYTHONHASHSEED
            if f[0] == "in" and f[-1] == "I" and t.verb(i) == "take":
                first_take.setdefault(f[1], i)
                takes[f[1]].append(i)
            if f[0] == "open" and t.verb(i) == "open":
                opens[f[1]].append(i)
            if f[0] == "at" and f[1] == "P":
                enters[f[2]].append(i)
        for f in sorted(t.removed[i]):
            if f[0] == "at" and f[1] == "P":
                left.setdefault(f[2], i)
        if first_up is None and t.scores[i] > t.scores[i - 1]:
            first_up = i
    for x, j in first_take.items():
        out.append(_qa("state_update", "first_take", f"At which step did the player first pick up the {x}?",
                       t.ids[j], [j], t, [x], derivation="step_id"))
    for x, js in takes.items():
        if len(js) <= 8:
            out.append(_qa("state_update", "take_count", f"How many times did the player pick up the {x}?",
                           str(len(js)), js, t, [x], derivation="count"))
    for c, js in opens.items():
        if len(js) <= 8:
            out.append(_qa("state_update", "open_count", f"How many times did the player open the {c}?",
                           str(len(js)), js, t, [c], derivation="count"))
    for r, js in enters.items():
        if len(js) <= 8:
            out.append(_qa("state_update", "enter_count", f"How many times did the player enter the {r}?",
                           str(len(js)), js, t, [r], derivation="count"))
    for r, j in left.items():
        dest = t.worlds[j].player_room()
        out.append(_qa("state_update", "next_room",
                       f"Which room did the player go to right after leaving the {r} for the first time?",
                       dest, [j], t, [dest]))
    if first_up is not None:
        out.append(_qa("state_update", "first_score", "Which action first increased the player's score?",
                       t.actions[first_up], [first_up], t, [t.actions[first_up]]))
    return out


# -- checks and sampling -------------------------------------------------------------------------------
def support_problems(episode: Episode, qa: QA | dict) -> list[str]:
    """Why a QA is not supported by its evidence steps (empty list: supported)."""
    q = qa if isinstance(qa, dict) else {"answer": qa.answer, "evidence": qa.evidence, "meta": qa.meta}
    meta, answer, evidence = q["meta"], q["answer"], q["evidence"]
    problems = []
    if not evidence:
        return ["no evidence"]
    missing = [e for e in evidence if not episode.has_step(e)]
    if missing:
        return [f"unknown evidence ids {missing}"]
    text = "\n".join(episode.step(e).text for e in evidence).lower()
    for term in meta.get("support_terms", []):
        if term.lower() not in text:
            problems.append(f"term {term!r} not in evidence text")
    for term in meta.get("answer_terms", []):
        if term.lower() not in answer.lower():
            problems.append(f"term {term!r} not in answer")
    der = meta.get("derivation", "text")
    if der == "count" and answer != str(len(evidence)):
        problems.append(f"count answer {answer!r} != {len(evidence)} evidence steps")
    if der == "step_id" and answer not in evidence:
        problems.append(f"step answer {answer!r} is not an evidence step")
    if der == "absent_direction":
        direction = meta["direction"]
        described = [e for e in evidence if room_header(episode.step(e).meta.get("observation", ""))]
        if not described:
            problems.append("no room description among the evidence")
        elif any(re.search(rf"\b{direction}\b", episode.step(e).meta.get("observation", "").lower()) for e in described):
            problems.append(f"the room description mentions {direction!r}")
    return problems


def generate_qa(episode: Episode, per_type: int, seed: int | str = 0, state_probes: int = 12) -> tuple[list[QA], dict]:
    """Up to ``per_type`` supported questions per category (templates round-robin, seeded)."""
    t = PlayedGame(episode)
    rng = random.Random(f"{seed}:{episode.episode_id}:qa")
    n = len(t)
    ks = sorted(rng.sample(range(2, n), min(state_probes, max(0, n - 2)))) if n > 2 else []
    pools = {"recall": recall_candidates(t), "state_after_step": state_candidates(t, ks),
             "causal_failure": causal_candidates(t), "state_update": update_candidates(t)}
    counts = {"candidates": {c: len(v) for c, v in pools.items()}, "unsupported": 0}
    out: list[QA] = []
    for cat in CATEGORIES:
        by_template: dict[str, list[dict]] = defaultdict(list)
        seen_q: set[str] = set()
        for cand in pools[cat]:
            if cand["question"] in seen_q:
                continue
            if support_problems(episode, cand):
                counts["unsupported"] += 1
                continue
            seen_q.add(cand["question"])
            by_template[cand["meta"]["template"]].append(cand)
        for lst in by_template.values():
            rng.shuffle(lst)
        templates = sorted(by_template)
        rng.shuffle(templates)
        picked = []
        while len(picked) < per_type and any(by_template[tp] for tp in templates):
            for tp in templates:
                if by_template[tp] and len(picked) < per_type:
                    picked.append(by_template[tp].pop())
        for cand in sorted(picked, key=lambda c: (t.ids.index(c["evidence"][-1]), c["question"])):
            out.append(QA(qa_id=f"{episode.episode_id}/q{len(out)}", question=cand["question"], answer=cand["answer"],
                          evidence=cand["evidence"], category=cat, meta=cand["meta"]))
    return out, counts
