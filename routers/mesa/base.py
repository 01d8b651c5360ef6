"""What every MESA structure shares: the access result, step serialization, lexical scoring, references.

A structure is a builder ``build(episode) -> state`` (a JSON-able dict, cached on disk per episode) and an
access mechanism ``access(state, question) -> Access``. :class:`Access` carries the retrieved text, the step
*indices* it covers (``Step.index``; the reader-free ``evidence_recall`` is computed from them) and a compact
preview for the selector (first ~160 characters + the top score).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from routers.memory.retrieval import tokenize
from routers.memory.schema import Episode, Step

PREVIEW_CHARS = 160


@dataclass
class Access:
    """One structure's answer to one question."""

    text: str
    steps: list[int] = field(default_factory=list)
    top_score: float | None = None

    @property
    def preview(self) -> str:
        head = " ".join(self.text.split())[:PREVIEW_CHARS]
        return head if self.top_score is None else f"{head} [top {self.top_score:.3g}]"


def serialize_step(step: Step) -> str:
    """Serialize(j, a_j, o_j): the temporal anchor, speaker/time and the text on one line."""
    return " ".join(step.render().split())


def step_positions(episode: Episode) -> dict[int, int]:
    """Step.index -> position in ``episode.steps``."""
    return {s.index: i for i, s in enumerate(episode.steps)}


def bm25_scores(docs: list[list[str]], query: str) -> np.ndarray:
    """BM25Okapi scores of ``query`` over tokenized ``docs`` (the project's tokenizer: lowercase, no stopwords)."""
    from rank_bm25 import BM25Okapi

    if not docs:
        return np.zeros(0)
    bm25 = BM25Okapi([d or ["<empty>"] for d in docs])
    return np.asarray(bm25.get_scores(tokenize(query) or ["<empty>"]), dtype=np.float64)


def ranked(scores: np.ndarray, k: int) -> list[int]:
    """Indices of the ``k`` best scores, ties broken by position (earlier first)."""
    order = np.lexsort((np.arange(len(scores)), -np.asarray(scores)))
    return [int(i) for i in order[:k]]


# -- explicit step references ---------------------------------------------------------------------------------
_NUM = r"[A-Za-z]?\d+"
_REF_WORD = r"(?:steps?|turns?|rounds?)"
_RANGE = re.compile(rf"\b{_REF_WORD}\s+({_NUM})\s*(?:-|–|to|through)\s*(?:{_REF_WORD}\s+)?({_NUM})\b", re.I)
_BETWEEN = re.compile(rf"\bbetween\s+{_REF_WORD}\s+({_NUM})\s+and\s+(?:{_REF_WORD}\s+)?({_NUM})\b", re.I)
_UNTIL = re.compile(rf"\b(?:until|up to|before|by|through|prior to)\s+(?:the\s+)?{_REF_WORD}\s+({_NUM})\b", re.I)
_LIST = re.compile(rf"\b{_REF_WORD}\s+((?:{_NUM}\s*,\s*)+(?:{_NUM})?(?:\s*,?\s*(?:and|or)\s+{_NUM})?)", re.I)
_SINGLE = re.compile(rf"\b{_REF_WORD}\s+#?({_NUM})\b", re.I)
_DIA = re.compile(r"\bD(\d+):(\d+)\b")
_SESSION = re.compile(r"\bsessions?\s+(\d+)\b", re.I)
_EDGE = re.compile(rf"\b(first|last|final)\s+{_REF_WORD}\b", re.I)


@dataclass
class StepRefs:
    """Step references found in a question: ``exact`` indices (single steps, lists, ranges, dia ids, sessions),
    ``until`` (prefix ``until step l``: the index l) and ``anchors`` (the referenced positions r, for the
    graph's proximity bonus)."""

    exact: list[int] = field(default_factory=list)
    until: int | None = None

    @property
    def anchors(self) -> list[int]:
        return sorted(set(self.exact) | ({self.until} if self.until is not None else set()))

    def __bool__(self) -> bool:
        return bool(self.exact) or self.until is not None


class StepResolver:
    """Turns the numbers of a question's references into ``Step.index`` values of one episode.

    ``step N`` names the step whose id ends in the number N when those trailing numbers are unique (TextWorld's
    ``T12`` is "step 12"); otherwise the step with ``index == N``. ``D2:5`` names a LoCoMo dia id, ``session 2``
    every step of that session.
    """

    def __init__(self, episode: Episode):
        self.indices = [s.index for s in episode.steps]
        self.known = set(self.indices)
        self.by_id = {s.step_id: s.index for s in episode.steps}
        trailing: dict[int, int] = {}
        unique = True
        for s in episode.steps:
            m = re.search(r"(\d+)$", s.step_id)
            if m is None or int(m.group(1)) in trailing:
                unique = False
                break
            trailing[int(m.group(1))] = s.index
        self.by_number = trailing if unique and trailing else {i: i for i in self.indices}
        self.sessions: dict[str, list[int]] = {}
        for s in episode.steps:
            if s.session is not None:
                self.sessions.setdefault(str(s.session), []).append(s.index)

    def number(self, token: str) -> int | None:
        if token in self.by_id:
            return self.by_id[token]
        m = re.search(r"(\d+)$", token)
        return None if m is None else self.by_number.get(int(m.group(1)))

    def parse(self, question: str) -> StepRefs:
        refs = StepRefs()
        exact: list[int] = []
        text = question
        for m in _DIA.finditer(text):
            idx = self.by_id.get(m.group(0))
            if idx is not None:
                exact.append(idx)
        for m in _SESSION.finditer(text):
            exact.extend(self.sessions.get(m.group(1), []))
        for pattern in (_RANGE, _BETWEEN):
            for m in pattern.finditer(text):
                a, b = self.number(m.group(1)), self.number(m.group(2))
                if a is not None and b is not None:
                    lo, hi = min(a, b), max(a, b)
                    exact.extend(i for i in self.indices if lo <= i <= hi)
            text = pattern.sub(" ", text)
        m = _UNTIL.search(text)
        if m is not None:
            refs.until = self.number(m.group(1))
            text = _UNTIL.sub(" ", text)
        for m in _LIST.finditer(text):
            for tok in re.findall(_NUM, m.group(1)):
                idx = self.number(tok)
                if idx is not None:
                    exact.append(idx)
        for m in _SINGLE.finditer(text):
            idx = self.number(m.group(1))
            if idx is not None:
                exact.append(idx)
        for m in _EDGE.finditer(text):
            if self.indices:
                exact.append(self.indices[0] if m.group(1).lower() == "first" else self.indices[-1])
        seen: set[int] = set()
        refs.exact = [i for i in exact if i in self.known and not (i in seen or seen.add(i))]
        return refs
