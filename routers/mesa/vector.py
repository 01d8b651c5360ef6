"""Vector database (V): serialized steps embedded once, read by cosine top k_V = 5.

x_j = Serialize(j, a_j, o_j); v_j = E(x_j) / |E(x_j)|. The encoder is anything with a sentence-transformers
``encode`` (MiniLM by default, loaded through :func:`routers.models.load_encoder`), or ``"hashing"``: a
dependency-free hashed bag-of-words encoder (tests, quick CPU runs; lexical, not semantic).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import numpy as np

from routers.memory.index import l2_normalize, top_k
from routers.memory.schema import Episode
from routers.mesa.base import Access, serialize_step


class HashingEncoder:
    """Hashed unigram+bigram counts, L2-normalized: a deterministic stand-in for a sentence encoder."""

    def __init__(self, dim: int = 512):
        self.dim = dim
        self.calls = 0

    def _vec(self, text: str) -> np.ndarray:
        toks = re.findall(r"[a-z0-9]+", text.lower())
        v = np.zeros(self.dim, dtype=np.float32)
        for tok in toks + [a + " " + b for a, b in zip(toks, toks[1:])]:
            h = int.from_bytes(hashlib.blake2b(tok.encode(), digest_size=8).digest(), "little")
            v[h % self.dim] += 1.0
        return v

    def encode(self, texts, batch_size: int = 64, normalize_embeddings: bool = True, convert_to_numpy: bool = True,
               show_progress_bar: bool = False, **_) -> np.ndarray:
        self.calls += 1
        out = np.stack([self._vec(t) for t in texts]) if len(texts) else np.zeros((0, self.dim), np.float32)
        return l2_normalize(out) if normalize_embeddings else out


def make_encoder(spec):
    """An encoder object from a name: ``"hashing"``, an alias / HF id / local folder, or an object with ``encode``."""
    if not isinstance(spec, str):
        return spec
    if spec.lower() == "hashing":
        return HashingEncoder()
    from routers.models import load_encoder

    return load_encoder(spec)


@dataclass
class VectorStore:
    encoder: object = "sentence-transformers/all-MiniLM-L6-v2"
    k: int = 5
    batch_size: int = 64
    name: str = "vector"
    _loaded: object = field(default=None, init=False, repr=False)

    def fingerprint(self) -> dict:
        enc = self.encoder if isinstance(self.encoder, str) else type(self.encoder).__name__
        return {"encoder": enc, "k": self.k}

    def _enc(self):
        if self._loaded is None:
            self._loaded = make_encoder(self.encoder)
        return self._loaded

    def _encode(self, texts: list[str]) -> np.ndarray:
        emb = self._enc().encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                 convert_to_numpy=True, show_progress_bar=False)
        return l2_normalize(np.asarray(emb, dtype=np.float32))

    def build(self, episode: Episode) -> dict:
        texts = [serialize_step(s) for s in episode.steps]
        return {"indices": [s.index for s in episode.steps], "texts": texts,
                "embeddings": self._encode(texts) if texts else np.zeros((0, 1), np.float32)}

    def access(self, state: dict, episode: Episode, question: str, query_embedding: np.ndarray | None = None) -> Access:
        emb = np.asarray(state["embeddings"], dtype=np.float32)
        if emb.shape[0] == 0:
            return Access("", [], None)
        q = self._encode([question])[0] if query_embedding is None else query_embedding
        scores = emb @ q
        top = [int(i) for i in top_k(scores, self.k)[0]]
        best = float(scores[top[0]])
        top = sorted(top)  # the reader sees them in temporal order
        return Access("\n".join(state["texts"][i] for i in top), [state["indices"][i] for i in top], top_score=best)
