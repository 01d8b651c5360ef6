"""Word and sentence limits on memory texts, and parsing/rendering of what provider LLMs read and write
(bullet lists, ``NAME: body`` sections, a trajectory clipped to a word budget)."""

from __future__ import annotations

import re
from typing import Sequence

from routers.memagent.protocol import Trajectory

_WORD = re.compile(r"\S+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


def count_words(text: str) -> int:
    return len(_WORD.findall(text))


def limit_words(text: str, max_words: int | None) -> tuple[str, int]:
    """Cut ``text`` after ``max_words`` words, keeping its line structure; returns (text, words dropped)."""
    text = text.strip()
    if max_words is None:
        return text, 0
    words = list(_WORD.finditer(text))
    if len(words) <= max_words:
        return text, 0
    if max_words <= 0:
        return "", len(words)
    return text[: words[max_words - 1].end()].rstrip(), len(words) - max_words


def limit_sentences(text: str, max_sentences: int) -> tuple[str, int]:
    """Keep the first ``max_sentences`` sentences; returns (text, sentences dropped)."""
    parts = [p for p in _SENTENCE_END.split(" ".join(text.split())) if p]
    if len(parts) <= max_sentences:
        return " ".join(parts), 0
    return " ".join(parts[:max_sentences]), len(parts) - max_sentences


_BULLET = re.compile(r"^\s*(?:[-*\u2022]+|\d+[.)]|\(\d+\))\s*")


def parse_bullets(text: str, max_items: int | None = None) -> list[str]:
    """Lines of an LLM answer as list entries (bullets/numbers stripped, empty lines and headers dropped)."""
    out = []
    for line in text.splitlines():
        line = _BULLET.sub("", line).strip().strip("*").strip()
        if not line or (line.endswith(":") and len(line.split()) <= 4):
            continue
        out.append(line)
    return out[:max_items] if max_items is not None else out


def parse_sections(text: str, names: Sequence[str]) -> dict[str, str]:
    """Split an answer into ``NAME: body`` sections (case-insensitive; a name may also be a markdown header).
    Missing sections map to ''."""
    pattern = re.compile(r"^\s*(?:#+\s*|\*\*)?(" + "|".join(re.escape(n) for n in names) + r")\s*(?:\*\*)?\s*:?\s*(?:\*\*)?",
                         re.IGNORECASE | re.MULTILINE)
    out = {n: "" for n in names}
    marks = list(pattern.finditer(text))
    lookup = {n.lower(): n for n in names}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        name = lookup[m.group(1).lower()]
        body = text[m.end():end].strip()
        out[name] = (out[name] + "\n" + body).strip() if out[name] else body
    return out


def render_trajectory(traj: Trajectory, max_words: int = 900, obs_words: int = 60, keep_actions: bool = False) -> str:
    """The trajectory an LLM reads when writing memories: goal, outcome, steps with observations clipped
    to ``obs_words``; when too long, the first and the last steps are kept (the ending carries the outcome).
    ``keep_actions``: when too long, every step's action stays and only observations are dropped (first and last
    ones kept first) -- a trace another task follows must not lose the middle of its route."""
    head = [f"Task: {traj.task.goal}", f"Outcome: {'success' if traj.success else 'failure'}"]
    steps = [f"Step {s.index}: > {s.action}\n{limit_words(s.observation, obs_words)[0]}" for s in traj.steps]
    budget = max_words - count_words("\n".join(head))
    cost = [count_words(s) for s in steps]
    if sum(cost) <= budget:
        return "\n".join(head + steps)
    if keep_actions:
        actions = [f"Step {s.index}: > {s.action}" for s in traj.steps]
        action_cost = [count_words(a) for a in actions]
        shown = ends_first([c - a for c, a in zip(cost, action_cost)], budget - sum(action_cost))
        return "\n".join(head + [steps[i] if i in shown else a for i, a in enumerate(actions)])
    shown = ends_first(cost, budget)
    n_head = next(i for i in range(len(steps) + 1) if i not in shown)  # the kept prefix; the rest are the tail
    keep_head, keep_tail = steps[:n_head], [steps[i] for i in sorted(shown) if i > n_head]
    skipped = len(steps) - len(keep_head) - len(keep_tail)
    return "\n".join(head + keep_head + [f"... ({skipped} steps omitted) ..."] + keep_tail)


def ends_first(cost: Sequence[int], budget: int) -> set[int]:
    """Indices kept when items are taken alternately from the front and the back until the next one does not fit."""
    kept: set[int] = set()
    used, i, j, n_head, n_tail = 0, 0, len(cost) - 1, 0, 0
    while i <= j:
        take_tail = n_tail < n_head
        idx = j if take_tail else i
        if used + cost[idx] > budget:
            break
        used += cost[idx]
        kept.add(idx)
        if take_tail:
            n_tail, j = n_tail + 1, j - 1
        else:
            n_head, i = n_head + 1, i + 1
    return kept


def action_sequence(traj: Trajectory, max_words: int | None = None) -> str:
    """The actions taken, '; '-joined (the concrete part of procedural memories; no LLM)."""
    return limit_words("; ".join(s.action.strip() for s in traj.steps if s.action.strip()), max_words)[0]
