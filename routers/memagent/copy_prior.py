"""A copy prior for command agents: "the next command of a remembered route" gets a score bonus.

Small LMs copy well but do not *decide* to copy: SmolLM2-135M scoring admissible commands picks the same
actions with or without a remembered route in its prompt (issue 18, eval/reports/worlds/). This prior makes
the memory actionable without changing the model: it reads the Begin memory as an ordered list of
command-like segments, follows the agent's own history along it, and gives each admissible command a bonus
equal to its word similarity with the next remembered command. The LM still decides everything the memory
does not cover (and where a remembered command is not on offer, e.g. an object that is gone).

Format-agnostic within what our providers write: ``> go north`` lines (trajectory renders), ``1. take key ->
taken`` (step lists), ``go north; open chest`` (action sequences), ``Step 3: > go east | ...``. Segments are
the pieces between newlines, ``;``, ``->`` and ``|``, with list markers and short labels (``Concrete
actions:``) stripped; only short ones (at most
``max_words`` words) count as commands, so observations and task headers are skipped.
"""

from __future__ import annotations

import re
from typing import Sequence

_SPLIT = re.compile(r"\n|;|->|\||=>")
_MARKER = re.compile(r"^\s*(?:step\s*\d+\s*[:.)]|\d+\s*[.):]|[-*>•]+|[a-z][a-z ]{0,24}:)\s*", re.I)
_WORD = re.compile(r"[a-z0-9']+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def remembered_commands(memory: str, max_words: int = 8) -> list[list[str]]:
    """The memory's command-like segments, in order, as word lists."""
    out = []
    for piece in _SPLIT.split(memory or ""):
        text = piece.strip()
        while True:  # "Step 3: > go east" carries two markers
            stripped = _MARKER.sub("", text, count=1)
            if stripped == text:
                break
            text = stripped
        words = _words(text)
        if 1 <= len(words) <= max_words:
            out.append(words)
    return out


def similarity(a: Sequence[str], b: Sequence[str]) -> float:
    """Shared words over the longer command's length (``take red key from chest`` vs ``take blue ball from
    chest`` = 0.6; ``go north`` vs ``go south`` = 0.5), 0 when the first words (the verbs) differ."""
    if not a or not b or a[0] != b[0]:
        return 0.0
    common = sum(min(a.count(w), b.count(w)) for w in set(a))
    return common / max(len(a), len(b))


def route_prior(memory: str, history: Sequence[str], commands: Sequence[str], threshold: float = 0.6,
                lookahead: int = 4) -> list[float]:
    """Per admissible command: its similarity (>= ``threshold``, else 0) to the next remembered command.

    The position on the route is found by replaying ``history``: each action moves the pointer past the first
    remembered command within ``lookahead`` segments that it matches; an action the memory does not contain
    (a detour) leaves the pointer where it was. The next command is the first remembered one at or after the
    pointer (within ``lookahead``) that some admissible command matches."""
    cands = [_words(c) for c in commands]
    # only segments that start with a command verb (one this step offers, or one the agent used) count as the
    # route: prose around it (an LLM-written script, game messages) must not use up the lookahead
    verbs = {c[0] for c in cands if c} | {w[0] for w in map(_words, history) if w}
    route = [seg for seg in remembered_commands(memory) if seg[0] in verbs]
    if not route or not cands:
        return [0.0] * len(cands)
    ptr = 0
    for action in history:
        aw = _words(action)
        for j in range(ptr, min(ptr + lookahead, len(route))):
            if similarity(aw, route[j]) >= threshold:
                ptr = j + 1
                break
    for j in range(ptr, min(ptr + lookahead, len(route))):
        sims = [similarity(c, route[j]) for c in cands]
        if max(sims) >= threshold:
            return [s if s >= threshold else 0.0 for s in sims]
    return [0.0] * len(cands)


__all__ = ["remembered_commands", "route_prior", "similarity"]
