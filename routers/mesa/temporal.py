"""Temporal store (T): the turn-indexed action-observation sequence, read by explicit step references.

M^T = {(l, a_l, o_l)}. Access: the steps the question names (``step 12``, ``turn 3``, ``steps 3-7``, ``steps 3,
5 and 8``, ``until step 12``, LoCoMo dia ids ``D2:5`` and ``session 2``), deduplicated and in step order; a
prefix reference (``until step l``) keeps the last ``max_referenced`` steps up to l, every other reference
is cut to ``max_referenced`` in step order. With no usable reference, BM25 over the temporal keys (the
serialized steps, timestamps included) returns the top ``k_lex`` = 5 turns.
"""

from __future__ import annotations

from dataclasses import dataclass

from routers.memory.retrieval import tokenize
from routers.memory.schema import Episode
from routers.mesa.base import Access, StepResolver, bm25_scores, ranked, serialize_step


@dataclass
class TemporalStore:
    k_lex: int = 5
    max_referenced: int = 32
    name: str = "temporal"

    def fingerprint(self) -> dict:
        return {"k_lex": self.k_lex, "max_referenced": self.max_referenced}

    def build(self, episode: Episode) -> dict:
        return {"indices": [s.index for s in episode.steps], "keys": [serialize_step(s) for s in episode.steps]}

    def access(self, state: dict, episode: Episode, question: str) -> Access:
        indices, keys = state["indices"], state["keys"]
        pos = {idx: i for i, idx in enumerate(indices)}
        refs = StepResolver(episode).parse(question)
        chosen: list[int] = []
        if refs:
            chosen = sorted(set(refs.exact))[: self.max_referenced]
            if refs.until is not None:
                prefix = [i for i in indices if i <= refs.until and i not in chosen]
                room = max(self.max_referenced - len(chosen), 0)
                chosen = sorted(set(chosen) | set(prefix[len(prefix) - room:] if room else []))
        if chosen:
            return Access("\n".join(keys[pos[i]] for i in chosen), chosen, top_score=None)
        scores = bm25_scores([tokenize(k) for k in keys], question)
        top = ranked(scores, self.k_lex)
        top = sorted(top, key=lambda i: indices[i])
        best = float(max(scores)) if len(scores) else None
        return Access("\n".join(keys[i] for i in top), [indices[i] for i in top], top_score=best)
