"""The short-term memory provider (MemAgent Table 10): a per-step state summary for the In decision.

Three sections, each with a display threshold (shown only once it holds that many entries), a capacity
(oldest entries are evicted first) and a priority (when the summary exceeds ``max_words``, entries are
dropped from the lowest-priority section first, oldest first):

=================  =============  =========  ========
Section            Min to show    Max items  Priority
=================  =============  =========  ========
Collected Data     2 facts        8          Highest
Pages Visited      3 URLs         15         Medium
Recent Searches    4 queries      8          Lowest
=================  =============  =========  ========

Extraction is rule-based by default (:class:`RuleExtractor`, no model call per step, so the agent loop stays
cheap): searches are search-like actions (``search ...``, ``search(query=...)``, and for text games
``examine``/``look at``), pages are URLs in actions/observations and, for text games, room headers
(``-= Kitchen =-``), facts are informative sentences of the observations. :class:`LLMExtractor` asks an LLM
for the facts instead (searches and pages stay rule-based). ``max_words`` defaults to 160 words, about the
~210 tokens per In injection the paper measures (Table 5).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol, Sequence

from routers.memagent.protocol import TrajectoryStep
from routers.memagent.providers.text_limits import count_words, parse_bullets


@dataclass(frozen=True)
class STMSection:
    name: str
    min_show: int
    max_items: int
    priority: int  # 0 = highest


COLLECTED_DATA, PAGES_VISITED, RECENT_SEARCHES = "Collected Data", "Pages Visited", "Recent Searches"
STM_SECTIONS: tuple[STMSection, ...] = (
    STMSection(COLLECTED_DATA, 2, 8, 0),
    STMSection(PAGES_VISITED, 3, 15, 1),
    STMSection(RECENT_SEARCHES, 4, 8, 2),
)


class Extractor(Protocol):
    def extract(self, step: TrajectoryStep) -> dict[str, list[str]]: ...


_URL = re.compile(r"https?://[^\s<>\"')\]]+")
_ROOM = re.compile(r"-=\s*(.+?)\s*=-")
_SEARCH = re.compile(r"^\s*(?:web_?)?(?:search|google|bing|lookup|look up|query|find)\b\s*[:(]?\s*(?:query\s*=\s*)?"
                     r"[\"']?(.+?)[\"']?\s*\)?\s*$", re.IGNORECASE)
_INSPECT = re.compile(r"^\s*(examine|look at|read|inspect)\s+(.+?)\s*$", re.IGNORECASE)
_VISIT = re.compile(r"^\s*(?:visit|open_?url|goto|go to|browse|fetch)\b\s*[:(]?\s*[\"']?(\S+?)[\"']?\s*\)?\s*$",
                    re.IGNORECASE)
_SENT = re.compile(r"(?<=[.!?])\s+")
_FACT_CUE = re.compile(r"\d|\b(is|are|was|were|has|have|contains?|holds?|reveals?|shows?|found|find|see|take|took|"
                       r"open(?:ed)?|unlock(?:ed)?|carrying|located|costs?|born|founded)\b", re.IGNORECASE)
_BOILER = re.compile(r"^(you can't|i don't|that's not|what do you|there is nothing|nothing happens|"
                     r"you're not|i'm not sure)", re.IGNORECASE)


class RuleExtractor:
    """Pattern-based extraction (see the module docstring); ``facts_per_step`` caps facts taken per observation."""

    def __init__(self, facts_per_step: int = 2, min_fact_words: int = 4, max_fact_words: int = 30):
        self.facts_per_step = facts_per_step
        self.min_fact_words = min_fact_words
        self.max_fact_words = max_fact_words

    def searches(self, action: str) -> list[str]:
        m = _SEARCH.match(action) or _INSPECT.match(action)
        if m is None:
            return []
        query = m.group(m.lastindex).strip()
        return [f"{m.group(1).lower()} {query}" if m.re is _INSPECT else query] if query else []

    def pages(self, action: str, observation: str) -> list[str]:
        out = _URL.findall(action)
        m = _VISIT.match(action)
        if m and not out:
            out.append(m.group(1))
        out += _URL.findall(observation)[:1]  # the page the observation shows, not every link on it
        out += [r.strip() for r in _ROOM.findall(observation)]
        return [p.rstrip(".,;") for p in out if p.strip()]

    def facts(self, observation: str) -> list[str]:
        text = _ROOM.sub(" ", _URL.sub(" ", observation))
        out = []
        for sent in _SENT.split(" ".join(text.split())):
            sent = sent.strip(" -*#>")
            n = len(sent.split())
            if n < self.min_fact_words or n > self.max_fact_words or sent.endswith("?") or _BOILER.match(sent):
                continue
            if _FACT_CUE.search(sent):
                out.append(sent)
            if len(out) >= self.facts_per_step:
                break
        return out

    def extract(self, step: TrajectoryStep) -> dict[str, list[str]]:
        return {COLLECTED_DATA: self.facts(step.observation), PAGES_VISITED: self.pages(step.action, step.observation),
                RECENT_SEARCHES: self.searches(step.action)}


class LLMExtractor(RuleExtractor):
    """Facts written by an LLM (one short call per step); searches and pages stay rule-based."""

    def __init__(self, llm, max_new_tokens: int = 80, **kw):
        super().__init__(**kw)
        self.llm = llm
        self.max_new_tokens = max_new_tokens

    def facts(self, observation: str) -> list[str]:
        if not observation.strip():
            return []
        out = self.llm.generate([[
            {"role": "system", "content": "List the concrete facts in this tool output that could help finish the "
                                          "task, one per line, at most 20 words each. Answer 'none' if there are none."},
            {"role": "user", "content": observation[:4000]}]], self.max_new_tokens)[0]
        facts = [f for f in parse_bullets(out or "") if f.lower().strip(". ") != "none"]
        return [" ".join(f.split()[:20]) for f in facts][: self.facts_per_step]


class ShortTermMemory:
    """Within-task state, updated after every step; ``summary()`` is what an In 'Query' decision injects."""

    name = "short_term"

    def __init__(self, extractor: Extractor | None = None, max_words: int = 160,
                 sections: Sequence[STMSection] = STM_SECTIONS):
        self.extractor = extractor or RuleExtractor()
        self.max_words = max_words
        self.sections = tuple(sections)
        self.reset()

    def reset(self) -> None:
        self._entries: dict[str, OrderedDict[str, None]] = {s.name: OrderedDict() for s in self.sections}
        self.steps_seen = 0
        self.dropped: dict[str, int] = {s.name: 0 for s in self.sections}  # evicted by capacity

    def add(self, section: str, entry: str) -> None:
        """Record one entry (a repeat moves to the most recent position); evicts the oldest past capacity."""
        spec = next((s for s in self.sections if s.name == section), None)
        if spec is None:
            raise KeyError(f"unknown short-term memory section {section!r}")
        entry = " ".join(str(entry).split())
        if not entry:
            return
        bucket = self._entries[section]
        bucket.pop(entry, None)
        bucket[entry] = None
        while len(bucket) > spec.max_items:
            bucket.popitem(last=False)
            self.dropped[section] += 1

    def update(self, step: TrajectoryStep) -> None:
        for section, entries in self.extractor.extract(step).items():
            for e in entries:
                self.add(section, e)
        self.steps_seen += 1

    def entries(self, section: str) -> list[str]:
        return list(self._entries[section])

    def visible(self) -> dict[str, list[str]]:
        """Sections that pass their display threshold, trimmed to ``max_words`` by priority."""
        shown = {s.name: list(self._entries[s.name]) for s in sorted(self.sections, key=lambda s: s.priority)
                 if len(self._entries[s.name]) >= s.min_show}

        def words():
            return sum(count_words(f"## {n}") + sum(count_words(e) + 1 for e in v) for n, v in shown.items())

        for spec in sorted(self.sections, key=lambda s: -s.priority):  # lowest priority loses entries first
            while spec.name in shown and words() > self.max_words:
                shown[spec.name].pop(0)
                if len(shown[spec.name]) < spec.min_show:
                    del shown[spec.name]
        return shown

    def summary(self) -> str:
        """'' when no section reaches its threshold (nothing worth injecting)."""
        return "\n".join(f"## {name}\n" + "\n".join(f"- {e}" for e in entries)
                         for name, entries in self.visible().items())

    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())
