"""What a MESA selector may look at: :class:`QueryView`, a read-only view of one question.

A view holds the question, the corpus name and, per structure, its preview (``ok``, ``tokens``, ``preview``,
``top_score``); nothing else. It is built from a sweep record by :func:`view_of` (which copies only those
fields, never ``gold_answer``, ``evidence_steps`` or the subset scores) or from a caller's previews by
:meth:`QueryView.from_previews` (extra preview keys are dropped). Views are immutable (``__slots__``,
assignment refused), so a policy cannot reach an outcome through one.

Subsets are handled as 5-bit masks (bit ``i`` = ``STRUCTURES[i]``, 1..31) and as canonical keys
(``routers.mesa.sweep_format.subset_key``).
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Iterable, Mapping

from routers.mesa.sweep_format import STRUCTURES, STRUCTURE_FIELDS, parse_subset, subset_key

K = len(STRUCTURES)
FULL_MASK = (1 << K) - 1
MASKS = tuple(range(1, FULL_MASK + 1))  # column m - 1 of a score table holds mask m
ALL_FIVE = subset_key(STRUCTURES)


def mask_of(names: Iterable[str]) -> int:
    m = 0
    for n in names:
        m |= 1 << STRUCTURES.index(n)
    return m


def names_of(mask: int) -> tuple[str, ...]:
    return tuple(n for i, n in enumerate(STRUCTURES) if mask >> i & 1)


def key_of(mask: int) -> str:
    return subset_key(names_of(mask))


def mask_of_key(key: str) -> int:
    return mask_of(parse_subset(key))


class _Frozen:
    __slots__ = ()

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is read-only")


class StructurePreview(_Frozen):
    """One structure's query-conditioned retrieval preview (no score, no gold)."""

    __slots__ = STRUCTURE_FIELDS

    def __init__(self, ok: bool = False, tokens: int = 0, preview: str = "", top_score: float | None = None):
        if not isinstance(ok, bool):
            raise TypeError(f"ok must be a boolean, got {ok!r:.40}")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise TypeError(f"tokens must be a non-negative integer, got {tokens!r:.40}")
        if not isinstance(preview, str):
            raise TypeError(f"preview must be a string, got {type(preview).__name__}")
        if top_score is not None and (isinstance(top_score, bool) or not isinstance(top_score, (int, float))
                                      or not math.isfinite(top_score)):
            raise TypeError(f"top_score must be a finite number or None, got {top_score!r:.40}")
        for name, value in zip(STRUCTURE_FIELDS, (ok, tokens, preview,
                                                  None if top_score is None else float(top_score))):
            object.__setattr__(self, name, value)

    def __repr__(self):
        return f"StructurePreview(ok={self.ok}, tokens={self.tokens}, top_score={self.top_score})"


class QueryView(_Frozen):
    """The selector's whole input: ``question``, ``corpus`` and ``structures`` (name -> StructurePreview).
    Derived features are cached in ``_cache`` (computed from these fields only)."""

    __slots__ = ("question", "corpus", "structures", "_cache")

    def __init__(self, question: str, corpus: str, structures: Mapping[str, StructurePreview]):
        if not isinstance(question, str):
            raise TypeError(f"question must be a string, got {type(question).__name__}")
        if not isinstance(corpus, str):
            raise TypeError(f"corpus must be a string, got {type(corpus).__name__}")
        unknown = sorted(set(structures) - set(STRUCTURES))
        if unknown:
            raise ValueError(f"unknown structure(s) {unknown}; expected some of {list(STRUCTURES)}")
        full = {n: structures.get(n) or StructurePreview() for n in STRUCTURES}  # absent -> not ok, 0 tokens
        object.__setattr__(self, "question", question)
        object.__setattr__(self, "corpus", corpus)
        object.__setattr__(self, "structures", MappingProxyType(full))
        object.__setattr__(self, "_cache", {})

    @classmethod
    def from_previews(cls, question: str, previews: Mapping[str, Mapping] | None, corpus: str = "") -> "QueryView":
        """From plain dicts: ``{name: {"ok", "tokens", "preview", "top_score"}}``; other keys are dropped."""
        previews = previews or {}
        if not isinstance(previews, Mapping):
            raise TypeError(f"previews must be a mapping of structure name -> preview, got {type(previews).__name__}")
        structures = {}
        for name, p in previews.items():
            if isinstance(p, StructurePreview):
                structures[name] = p
                continue
            if not isinstance(p, Mapping):
                raise TypeError(f"previews[{name!r}] must be a mapping, got {type(p).__name__}")
            structures[name] = StructurePreview(**{f: p[f] for f in STRUCTURE_FIELDS if f in p})
        return cls(question, corpus, structures)

    def to_dict(self) -> dict:
        return {"question": self.question, "corpus": self.corpus,
                "structures": {n: {f: getattr(p, f) for f in STRUCTURE_FIELDS} for n, p in self.structures.items()}}

    def __repr__(self):
        return f"QueryView(question={self.question!r:.60}, corpus={self.corpus!r})"


def view_of(record: Mapping) -> QueryView:
    """The selector's view of a sweep record: question, corpus and previews only."""
    return QueryView.from_previews(record["question"], record["structures"], record.get("corpus", ""))
