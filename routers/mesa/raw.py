"""Raw episodic trace (R): overlapping turn-aligned windows read with BM25.

w = clip(ceil(L / 12), 3, 16), overlap d = round(0.25 w) (half up), stride w - d; the last window is extended back so
the final step is always covered. Access: BM25 over the window texts, the top k_R = 3 windows with a positive
score, else the single best window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from routers.memory.retrieval import tokenize
from routers.memory.schema import Episode
from routers.mesa.base import Access, bm25_scores, ranked, serialize_step


def window_size(n_steps: int) -> tuple[int, int]:
    """(w, d) for a trajectory of ``n_steps`` steps."""
    w = min(max(math.ceil(n_steps / 12), 3), 16)
    return w, int(math.floor(0.25 * w + 0.5))  # round half up (Python's round() would give 2 for w=10)


def windows(n_steps: int) -> list[tuple[int, int]]:
    """[start, end) positions of the windows over ``n_steps`` steps."""
    if n_steps <= 0:
        return []
    w, d = window_size(n_steps)
    stride = max(w - d, 1)
    out, start = [], 0
    while True:
        end = min(start + w, n_steps)
        out.append((max(end - w, 0), end))
        if end >= n_steps:
            break
        start += stride
    return out


@dataclass
class RawWindows:
    k: int = 3
    name: str = "raw"

    def fingerprint(self) -> dict:
        return {"k": self.k, "w": "clip(ceil(L/12),3,16)", "d": "round(0.25w)"}

    def build(self, episode: Episode) -> dict:
        spans = windows(len(episode.steps))
        texts = ["\n".join(serialize_step(s) for s in episode.steps[a:b]) for a, b in spans]
        return {"spans": [list(s) for s in spans], "texts": texts,
                "indices": [[s.index for s in episode.steps[a:b]] for a, b in spans]}

    def access(self, state: dict, episode: Episode, question: str) -> Access:
        texts = state["texts"]
        if not texts:
            return Access("", [], None)
        scores = bm25_scores([tokenize(t) for t in texts], question)
        top = [i for i in ranked(scores, self.k) if scores[i] > 0] or ranked(scores, 1)
        top = sorted(top)  # temporal order
        steps = sorted({i for c in top for i in state["indices"][c]})
        body = "\n\n".join(f"[window {c + 1}/{len(texts)}]\n{texts[c]}" for c in top)
        return Access(body, steps, top_score=float(scores.max()))
