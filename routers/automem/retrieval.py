"""Retrieve: how memories are selected at inference time (seed 003 §3.1). Each strategy ranks the live items
of a :class:`~routers.automem.system.MemorySystem` for a goal and returns at most ``k`` item positions, best
first. ``base`` is the store's own score per item (``BaseProvider.score_items``: dense cosine, BM25 or their
mix, by store); the dense strategies use the store's embedding matrix (the constraints in
``routers.automem.space`` guarantee one).

* ``hybrid``: the store's lexical + semantic score.
* ``contrastive``: success / failure cohorts (dense; the trained retriever export is the encoder when given):
  the k-1 most similar successes plus the most similar failure as a contrast case.
* ``cbr_rerank``: a case bank of 3k candidates reranked by outcome, reuse and recency.
* ``graph``: multi-hop traversal from the best-matching nodes over shared entities (2 hops).
* ``hyde``: the query is a hypothetical memory for the goal (written by the LLM when configured).
* ``mmr``: maximal marginal relevance over 3k dense candidates (lambda 0.7).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from routers.memagent.providers.keyword import keyword_tokens
from routers.memory.index import top_k


def _ranked(scores: np.ndarray, rows: Sequence[int], n: int) -> list[int]:
    rows = list(rows)
    if not rows or n <= 0:
        return []
    return [rows[j] for j in top_k(np.asarray(scores, np.float64)[np.asarray(rows)], n)[0]]


def _dense(system, text: str) -> np.ndarray:
    st = system.state
    q = system.encoder.encode([text])[0]
    return np.asarray(st.embeddings @ q, np.float64)


def hybrid(system, goal, live, base, k):
    return _ranked(base, live, k)


def cbr_rerank(system, goal, live, base, k):
    items = system.state.items
    cands = _ranked(base, live, 3 * k)
    if not cands:
        return []
    t_max = max(int(items[i].meta.get("t", 0)) for i in cands) or 1
    rer = np.array(base, np.float64)
    for i in cands:
        m = items[i].meta
        rer[i] += (0.15 * (m.get("outcome") == "success") + 0.05 * min(int(m.get("merged", 1)) - 1, 3)
                   + 0.1 * int(m.get("t", 0)) / t_max)
    return _ranked(rer, cands, k)


def contrastive(system, goal, live, base, k):
    items = system.state.items
    sims = _dense(system, goal)
    succ = [i for i in live if items[i].meta.get("outcome") == "success"]
    fail = [i for i in live if items[i].meta.get("outcome") != "success"]
    picked = _ranked(sims, succ, max(1, k - 1) if fail else k)
    picked += _ranked(sims, fail, k - len(picked))
    return picked


def graph(system, goal, live, base, k, hops: int = 2):
    items = system.state.items
    q = set(keyword_tokens(goal))
    ent = {i: set(items[i].meta.get("entities", ())) for i in live}
    score = {i: float(base[i]) + 0.5 * len(ent[i] & q) / (len(q) or 1) for i in live}
    frontier = _ranked(np.array([score.get(i, -1e9) for i in range(len(items))]), live, 2)
    reached = {i: score[i] for i in frontier}
    for h in range(1, hops + 1):
        nxt = []
        for i in frontier:
            for j in live:
                if j not in reached and ent[i] & ent[j]:
                    reached[j] = score[j] * (0.5 ** h)
                    nxt.append(j)
        frontier = nxt
    arr = np.full(len(items), -1e9)
    for i, s in reached.items():
        arr[i] = s
    return _ranked(arr, list(reached), k)


def hyde(system, goal, live, base, k):
    doc = ""
    if system.llm is not None:
        doc = system._ask("Write the memory (at most 60 words) that would best help an agent solve this task: "
                          "what it did and what it found.", f"Task: {goal}", 96)
    doc = doc or f"Task: {goal}\nOutcome: success\nStep 0: > {goal}"
    return _ranked(_dense(system, doc), live, k)


def mmr(system, goal, live, base, k, lam: float = 0.7):
    st = system.state
    sims = _dense(system, goal)
    cands = _ranked(sims, live, 3 * k)
    picked: list[int] = []
    while cands and len(picked) < k:
        def value(i):
            red = max((float(st.embeddings[i] @ st.embeddings[j]) for j in picked), default=0.0)
            return lam * sims[i] - (1 - lam) * red
        best = max(cands, key=lambda i: (value(i), -cands.index(i)))
        picked.append(best)
        cands.remove(best)
    return picked


RETRIEVERS = {"hybrid": hybrid, "contrastive": contrastive, "cbr_rerank": cbr_rerank, "graph": graph,
              "hyde": hyde, "mmr": mmr}
