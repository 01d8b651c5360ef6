"""The encoder adapter every provider shares: L2-normalized float32 embeddings from any ``encode(list[str])``."""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Sequence

import numpy as np

from routers.memagent.providers.state import ProviderError


class TextEncoder:
    """``encode(list[str]) -> (n, d) float32`` with L2-normalized rows, around any object whose ``encode``
    takes a list of texts (a ``SentenceTransformer``, a trained retriever, a test fake)."""

    def __init__(self, model, batch_size: int = 64):
        self.model = model
        self.batch_size = batch_size
        params = inspect.signature(model.encode).parameters
        self._st_kwargs = ("normalize_embeddings" in params
                           or any(p.kind == p.VAR_KEYWORD for p in params.values()))
        self._dim: int | None = None

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        if self._st_kwargs:
            out = self.model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=False)
        else:
            out = self.model.encode(texts)
        out = np.asarray(out, dtype=np.float32)
        if out.ndim != 2 or out.shape[0] != len(texts):
            raise ProviderError(f"encoder returned shape {out.shape} for {len(texts)} texts")
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = out / np.maximum(norms, 1e-12)
        self._dim = out.shape[1]
        return np.ascontiguousarray(out)

    @property
    def dim(self) -> int:
        if self._dim is None:
            get = getattr(self.model, "get_sentence_embedding_dimension", None)
            self._dim = int(get()) if callable(get) and get() else int(self.encode(["dimension probe"]).shape[1])
        return self._dim


@lru_cache(maxsize=1)
def default_encoder() -> TextEncoder:
    """all-MiniLM-L6-v2 (offline copy), loaded once per process and shared by every provider."""
    from routers.models import load_encoder

    return TextEncoder(load_encoder())


def as_encoder(encoder) -> TextEncoder | None:
    if encoder is None or isinstance(encoder, TextEncoder):
        return encoder
    if isinstance(encoder, str):
        from routers.models import load_encoder

        return default_encoder() if encoder in ("default", "minilm") else TextEncoder(load_encoder(encoder))
    if not callable(getattr(encoder, "encode", None)):
        raise TypeError(f"encoder must have an encode(list[str]) method, got {type(encoder).__name__}")
    return TextEncoder(encoder)
