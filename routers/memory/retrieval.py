"""The shared retrieval prefix R_f(q, M) -> (C_f, H_f): BM25 + dense hybrid over single steps.

Scores from the two retrievers are min-max normalized per query and mixed with ``dense_weight`` (``fusion="minmax"``,
the default), or with a per-query dense weight read off the two score lists themselves (``fusion="peak"``: the
retriever whose top score stands further out of its own distribution gets more weight; no label, no parameter --
the choice for a corpus the weight was never tuned on, see configs/retriever/README.md "A per-query weight").
Step embeddings are computed once per episode and cached in memory (and optionally on disk).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from routers.memory.schema import Episode, Step

_TOKEN = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset(
    "a an the and or but of to in on at for with by from is are was were be been being do does did what "
    "when where who whom which why how that this these those it its i you he she they we me my your his her "
    "their our as about into than then so if not no yes have has had will would can could should".split())


def tokenize(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


@dataclass
class Hit:
    step: Step
    score: float
    bm25: float
    dense: float


def _minmax(x: np.ndarray) -> np.ndarray:
    if x.size == 0:
        return x
    lo, hi = float(x.min()), float(x.max())
    return np.zeros_like(x) if hi - lo < 1e-12 else (x - lo) / (hi - lo)


FUSIONS = ("minmax", "peak")


def peak(x: np.ndarray) -> float:
    """How far the top score stands out of its list: (max - mean) / std; 0 for a flat (or empty) list."""
    if x.size == 0:
        return 0.0
    sd = float(x.std())
    return 0.0 if sd < 1e-12 else (float(x.max()) - float(x.mean())) / sd


def peak_dense_weight(lex: np.ndarray, dense: np.ndarray) -> float:
    """The per-query dense weight of ``fusion="peak"``: peak(dense) / (peak(BM25) + peak(dense)); 0.5 when both are flat.

    A question that names an id or a rare word gives BM25 one step far above the rest, and the weight moves to BM25;
    a paraphrase gives BM25 a flat list and the weight moves to the dense encoder.
    """
    pl, pd = peak(lex), peak(dense)
    return 0.5 if pl + pd <= 0 else pd / (pl + pd)


def mix_scores(lex: np.ndarray, dense: np.ndarray, dense_weight: float, fusion: str = "minmax") -> np.ndarray:
    """The hybrid score: min-max normalised BM25 and dense scores, ``dense_weight`` of the dense one
    (``fusion="peak"``: the weight is ``peak_dense_weight(lex, dense)`` and ``dense_weight`` only says whether the
    dense half is used at all: 0 keeps BM25 alone)."""
    if fusion not in FUSIONS:
        raise ValueError(f"fusion must be one of {FUSIONS}, got {fusion!r}")
    if fusion == "peak" and dense_weight > 0:
        dense_weight = peak_dense_weight(lex, dense)
    return (1 - dense_weight) * _minmax(lex) + dense_weight * _minmax(dense)


class HybridRetriever:
    """BM25 (rank_bm25) + dense (sentence-transformers) retrieval over an episode's steps.

    ``encoder``: an object with a sentence-transformers ``encode`` (a ``SentenceTransformer``, a
    ``RetrieverRouter``), or a name/path to load -- an alias (``"minilm"``), an HF id, or a local folder
    such as a trained retriever export (``outputs/retriever_minilm/export``); ``None`` loads the default
    encoder when ``dense_weight > 0``; ``"none"`` means BM25 only. ``fusion``: ``"minmax"`` mixes at ``dense_weight``,
    ``"peak"`` at a per-query weight (``peak_dense_weight``).
    """

    def __init__(self, encoder=None, dense_weight: float = 0.5, batch_size: int = 64, fusion: str = "minmax"):
        if fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {FUSIONS}, got {fusion!r}")
        self.fusion = fusion
        if isinstance(encoder, (str, os.PathLike)):
            name = os.fspath(encoder)
            encoder = None
            if name.lower() not in ("", "none", "null"):
                from routers.models import load_encoder

                encoder = load_encoder(name)
            else:
                dense_weight = 0.0
        elif encoder is None and dense_weight > 0:
            from routers.models import load_encoder

            encoder = load_encoder()
        self.encoder = encoder
        self.dense_weight = dense_weight if encoder is not None else 0.0
        self.batch_size = batch_size
        self._index: dict[str, tuple] = {}

    def _build(self, episode: Episode):
        from rank_bm25 import BM25Okapi

        if episode.episode_id not in self._index:
            texts = [s.render() for s in episode.steps]
            bm25 = BM25Okapi([tokenize(t) or ["<empty>"] for t in texts]) if texts else None
            emb = None
            if self.dense_weight > 0 and texts:
                emb = self.encoder.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                          convert_to_numpy=True, show_progress_bar=False)
            self._index[episode.episode_id] = (bm25, emb)
        return self._index[episode.episode_id]

    def step_embeddings(self, episode: Episode) -> np.ndarray | None:
        return self._build(episode)[1]

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self.encoder.encode(queries, batch_size=self.batch_size, normalize_embeddings=True,
                                   convert_to_numpy=True, show_progress_bar=False)

    def scores(self, query: str, episode: Episode, query_embedding: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        bm25, emb = self._build(episode)
        n = len(episode.steps)
        if n == 0:
            z = np.zeros(0)
            return z, z, z
        lex = np.asarray(bm25.get_scores(tokenize(query) or ["<empty>"]), dtype=np.float64)
        dense = np.zeros(n)
        if emb is not None:
            q = query_embedding if query_embedding is not None else self.encode_queries([query])[0]
            dense = emb @ q
        return mix_scores(lex, dense, self.dense_weight, self.fusion), lex, dense

    def retrieve(self, query: str, episode: Episode, k: int = 10) -> list[Hit]:
        """Top-k steps by hybrid score (ties broken by temporal order)."""
        mixed, lex, dense = self.scores(query, episode)
        order = np.lexsort((np.arange(len(mixed)), -mixed))[:k]
        return [Hit(episode.steps[i], float(mixed[i]), float(lex[i]), float(dense[i])) for i in order]


def retrieval_prefix(retriever: "HybridRetriever", query: str, episode: Episode, k: int = 10) -> tuple[str, list[Hit]]:
    """R_f(q, M) -> (C_f, H_f): the top-k hits and the context built from them in temporal order."""
    hits = retriever.retrieve(query, episode, k)
    return render_context([h.step for h in hits]), hits


def render_context(steps: list[Step]) -> str:
    """C_f: the retrieved steps restored to temporal order, one per line."""
    return "\n".join(s.render() for s in sorted(steps, key=lambda s: s.index))
