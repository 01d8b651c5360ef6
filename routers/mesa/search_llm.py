"""Optional LLM pieces of MESA (off by default): a hyper-parameter proposer for the search and a zero-shot
structure selector baseline. Both go through :mod:`routers.backends`; a reply that cannot be used falls back
(the rule-based proposal / all five structures), and the trace notes which one was used."""

from __future__ import annotations

import json
import re
from typing import Sequence

from routers.logs import get_logger
from routers.mesa.selector_view import STRUCTURES, QueryView

log = get_logger(__name__)


class LLMProposer:
    """``proposer(arm=, slot=, hyper=, grid=, archive=) -> hyper | None`` for :func:`routers.mesa.search.run_search`."""

    def __init__(self, backend, max_new_tokens: int = 96):
        self.backend, self.max_new_tokens = backend, max_new_tokens

    def __call__(self, arm: str, slot: str, hyper: dict, grid: dict, archive: list) -> dict | None:
        best = sorted(archive, key=lambda t: -t[2])[:5]
        prompt = (f"You tune a memory-structure selector. Direction: {arm} ({slot} candidate).\n"
                  f"Allowed values per hyper-parameter: {json.dumps(grid)}\n"
                  f"Best policies so far (direction, hyper, validation objective): {json.dumps(best)}\n"
                  f"Rule-based suggestion: {json.dumps(hyper)}\n"
                  "Reply with one JSON object mapping every hyper-parameter to an allowed value.")
        try:
            reply = self.backend.generate([[{"role": "user", "content": prompt}]], max_new_tokens=self.max_new_tokens)[0]
            found = re.search(r"\{.*\}", reply, re.S)
            proposed = json.loads(found.group(0)) if found else None
        except (ValueError, RuntimeError, OSError) as err:
            log.warning("LLM proposer failed (%s); using the rule-based proposal", err)
            return None
        if not isinstance(proposed, dict) or set(proposed) != set(grid) or any(proposed[k] not in grid[k] for k in grid):
            return None
        return proposed


def zero_shot_select(backend, views: Sequence[QueryView], preview_chars: int = 200) -> list[tuple[str, ...]]:
    """LLM zero-shot baseline: the LLM reads the question and the five previews and names the structures to
    read; a reply naming none falls back to all five."""
    conversations = []
    for v in views:
        lines = [f"- {n}: {v.structures[n].preview[:preview_chars]!r}" for n in STRUCTURES]
        conversations.append([{"role": "user", "content": (
            f"Question: {v.question}\nMemory structures and what each retrieved:\n" + "\n".join(lines) +
            "\nWhich structures should be read to answer? Reply with their names, comma-separated.")}])
    replies = backend.generate(conversations, max_new_tokens=24)
    out = []
    for r in replies:
        names = tuple(n for n in STRUCTURES if re.search(rf"\b{n}\b", r.lower()))
        out.append(names or STRUCTURES)
    return out
