"""Encode: what a finished trajectory writes into memory (seed 003 §3.1, appendix B.5).

Five unit types -- ``tip`` (transferable heuristic), ``insight`` (root cause of a failed task), ``trajectory``
(grounded action-observation trace), ``workflow`` (generalized template with ``<PLACEHOLDER>`` slots) and
``shortcut`` (parameterized macro with an input schema). Rule-based by default; with an LLM (anything with the
``routers.backends`` ``generate`` interface) each type is written by one prompt and falls back to the rule
when the answer is empty. Every unit carries ``use_when`` (the source task's pattern) and ``avoid_when`` (where
its task's sought items were: ``routers.automem.guards``), ``route_to`` (where a successful trajectory took
things from), ``took`` (what it took) and ``world`` (the world its goal named, if any) for the injection judge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from routers.automem.guards import goal_world, location_facts
from routers.memagent.protocol import Trajectory
from routers.memagent.providers.keyword import keyword_tokens
from routers.memagent.providers.text_limits import (action_sequence, count_words, ends_first, limit_words,
                                                    render_trajectory)

_NUM = re.compile(r"\b\d+(?:\.\d+)?\b")
_ID = re.compile(r"\b(?=[a-z]*\d)[a-z0-9_]*[a-z][a-z0-9_]*\b", re.IGNORECASE)  # tokens mixing letters + digits
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*")


@dataclass
class Unit:
    """One memory unit before storage: ``kind`` (unit type), ``key`` (what retrieval matches), ``text``."""

    kind: str
    key: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict)


def generalize(text: str) -> str:
    """Replace task-specific values (quoted strings, identifiers with digits, numbers) by placeholders."""
    text = _QUOTED.sub("<VALUE>", text)
    text = _ID.sub("<ID>", text)
    return _NUM.sub("<NUM>", text)


def task_pattern(task) -> str:
    """The task pattern the observation graph and the judge use: ``meta['pattern']`` or the goal's first
    two generalized words."""
    meta = getattr(task, "meta", None) or {}
    if meta.get("pattern"):
        return str(meta["pattern"])
    words = [w for w in re.findall(r"[a-z]+", generalize(getattr(task, "goal", str(task))).lower())
             if w not in ("id", "num", "value", "the", "a", "an")]
    return " ".join(words[:2]) or "task"


def _verbs(traj: Trajectory) -> list[str]:
    return list(dict.fromkeys(s.action.split()[0].lower() for s in traj.steps if s.action.split()))


def rule_tip(traj: Trajectory) -> list[Unit]:
    if not traj.success or not traj.steps:
        return []
    pat = generalize(traj.task.goal)
    text = f"Tip: for tasks like '{pat}', {len(traj.steps)} step(s) sufficed using: {', '.join(_verbs(traj))}."
    return [Unit("tip", pat, text)]


def rule_insight(traj: Trajectory) -> list[Unit]:
    if traj.success:
        return []
    last = traj.steps[-1] if traj.steps else None
    seen = limit_words(" ".join(last.observation.split()), 30)[0] if last else "nothing"
    tried = last.action if last else "no action"
    text = (f"Insight (failed task '{traj.task.goal}'): the attempt '{tried}' ended with '{seen}'. "
            "Do not repeat it; look for the missing information first.")
    return [Unit("insight", traj.task.goal, text)]


def observed_facts(observation: str, names: set[str], goal: str = "") -> str:
    """The sentences of ``observation`` that name one of ``names`` (the content words of the trace's action
    arguments), in order, without those the goal already says: what the agent saw of the things it acted on ("The
    coffer contains a blue skillet, a yellow whisk and a golden teapot."), not a room's flavour text."""
    return " ".join(_fact_sentences(observation, names, goal))


def _fact_sentences(observation: str, names: set[str], goal: str = "") -> list[str]:
    said = " ".join(goal.lower().split())
    out = []
    for m in _SENTENCE.finditer(observation or ""):
        sentence = " ".join(m.group(0).split())
        if sentence and sentence.lower() not in said and names & set(keyword_tokens(sentence)):
            out.append(sentence)
    return out


def _acted_on(traj: Trajectory) -> set[str]:
    """Content words of the trace's multi-word action arguments ("take blue skillet from coffer") that its goal does
    not say: the things acted on that a reader of the goal does not know of (the coffer, not the table the goal names).
    A one-word argument ("go south") names a direction, which nearly every room's description also does."""
    said = set(keyword_tokens(traj.task.goal))
    return {w for s in traj.steps if len(args := s.action.split()[1:]) > 1
            for w in keyword_tokens(" ".join(args)) if w not in said}


def rule_trajectory(traj: Trajectory, max_words: int = 160, facts: bool = False, obs_words: int = 40) -> list[Unit]:
    """Every action of the trace on one line right after the goal, then what the observations showed as the budget
    allows (v3). v2 wrote ``Step i: > action`` lines with the first and last steps' observations between them: at a
    60-word injection limit the agent read the goal, the way there and a room's description, never the way back
    (session 43: the 135M agent took the object and wandered). ``facts``: the observations are cut to
    :func:`observed_facts` (what the LLM writer is asked for: "The coffer contains ... a golden teapot"), each kept
    once; otherwise each is clipped to ``obs_words``, the first and last steps' kept first."""
    if not traj.steps:
        return []
    head = [f"Task: {traj.task.goal}", f"Outcome: {'success' if traj.success else 'failure'}",
            "Actions: " + "; ".join(a for s in traj.steps if (a := s.action.strip()))]
    budget = max_words - count_words("\n".join(head))
    if facts:
        names, seen = _acted_on(traj), []
        for s in traj.steps:
            seen += [f for f in _fact_sentences(s.observation, names, traj.task.goal) if f not in seen]
        obs = [limit_words("Seen: " + " ".join(seen), max(budget, 0))[0]] if seen and budget > 1 else []
    else:
        lines = [f"At step {s.index}: {limit_words(s.observation, obs_words)[0]}" for s in traj.steps
                 if (s.observation or "").strip()]
        shown = ends_first([count_words(x) for x in lines], budget)
        obs = [x for i, x in enumerate(lines) if i in shown]
    return [Unit("trajectory", traj.task.goal, "\n".join(head + obs))]


def rule_workflow(traj: Trajectory) -> list[Unit]:
    if not traj.success or not traj.steps:
        return []
    steps = "\n".join(f"{i + 1}. {generalize(s.action)}" for i, s in enumerate(traj.steps))
    pat = generalize(traj.task.goal)
    return [Unit("workflow", pat, f"Workflow: {pat}\n{steps}")]


def rule_shortcut(traj: Trajectory) -> list[Unit]:
    if not traj.success or not traj.steps:
        return []
    pat = generalize(traj.task.goal)
    name = "_".join(re.findall(r"[a-z]+", pat.lower())[:3]) or "macro"
    args = sorted(set(re.findall(r"<([A-Z]+)>", generalize(action_sequence(traj)))))
    schema = ", ".join(a.lower() for a in args)
    body = " ; ".join(generalize(s.action) for s in traj.steps)
    return [Unit("shortcut", pat, f"Shortcut {name}({schema}): {body}", {"function": name})]


RULES: dict[str, Callable[[Trajectory], list[Unit]]] = {
    "tip": rule_tip, "insight": rule_insight, "trajectory": rule_trajectory, "workflow": rule_workflow,
    "shortcut": rule_shortcut}

PROMPTS = {
    "tip": "Write one transferable tip (at most 40 words) that would help with similar tasks. No task-specific values.",
    "insight": "This task failed. Write one root-cause insight (at most 40 words): what went wrong and what to do instead.",
    "trajectory": "Rewrite this trajectory as a compact grounded trace: the actions that mattered and the facts the "
                  "observations revealed (keep exact names and values). At most 120 words.",
    "workflow": "Induce a reusable workflow: numbered abstract steps with <PLACEHOLDER> slots for task-specific "
                "values. At most 100 words.",
    "shortcut": "Write one executable macro 'Shortcut name(args): action ; action' with {arg} slots for "
                "task-specific values. At most 60 words.",
}
# A unit type's rule version, bumped when its rule writes different text. Evaluations are replayed by architecture
# (``routers.automem.trace``), so an architecture's replay key names the versions of the types it encodes (v1 is
# unnamed: the results recorded before versions existed stay valid for every type not changed since).
UNIT_VERSIONS = {"trajectory": 3}


def versioned_key(arch) -> str:
    """``arch.key`` plus the rule versions (above 1) of the unit types it encodes: the key its results replay by."""
    tags = [f"{kind}.v{UNIT_VERSIONS[kind]}" for kind in arch.encode if UNIT_VERSIONS.get(kind, 1) > 1]
    return arch.key + "".join(f"@{t}" for t in tags)


GATES = {"tip": "success", "insight": "failure", "trajectory": "all", "workflow": "success", "shortcut": "success"}


class Encoder:
    """The Encode module: the union of the chosen unit types. ``ask(system, user) -> str`` (an LLM call) makes
    the LLM writers active; without it every type is rule-based."""

    def __init__(self, kinds, ask: Callable[[str, str], str] | None = None, max_prompt_words: int = 600,
                 trajectory_facts: bool = False):
        self.kinds = tuple(kinds)
        self.ask = ask
        self.max_prompt_words = max_prompt_words
        self.trajectory_facts = trajectory_facts

    def __call__(self, traj: Trajectory) -> list[Unit]:
        pattern = task_pattern(traj.task)
        actions = [s.action for s in traj.steps] if traj.success else []  # a failed take is no fact
        avoid_when = [[item, where] for item, where in location_facts(traj.task.goal, *actions).items()]
        moved = location_facts(*actions)  # what a successful episode took, and from where
        route_to, took = sorted(set(moved.values())), sorted(moved)
        world = goal_world(traj.task.goal)
        out = []
        for kind in self.kinds:
            units = rule_trajectory(traj, facts=True) if kind == "trajectory" and self.trajectory_facts \
                else RULES[kind](traj)
            if self.ask is not None and units:  # the rule's gate decides whether this type writes at all
                text = (self.ask(PROMPTS[kind], render_trajectory(traj, self.max_prompt_words)) or "").strip()
                if text:
                    units = [Unit(kind, units[0].key, text, dict(units[0].meta, writer="llm"))]
            for u in units:
                u.meta.setdefault("use_when", pattern)
                u.meta.setdefault("avoid_when", avoid_when)
                u.meta.setdefault("route_to", route_to)
                u.meta.setdefault("took", took)
                if world:
                    u.meta.setdefault("world", world)
                u.meta.setdefault("outcome", "success" if traj.success else "failure")
            out.extend(units)
        return out
