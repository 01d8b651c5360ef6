"""A vectorized inner-product index over L2-normalized embeddings: the dense view that scales.

    index = VectorIndex(dim=384)
    index.add(["D1:1", "D1:2"], embeddings)         # incremental; rows are L2-normalized on the way in
    ids, scores = index.search(query_embeddings, k=10)
    index.save("outputs/memory_index")               # atomic: a crash never leaves half an index
    index = VectorIndex.load("outputs/memory_index")

Search is exact (brute-force inner product, which is cosine similarity on normalized rows): one
BLAS matrix-vector product over the whole memory plus an ``argpartition`` top-k, so a 10k-step
memory answers in well under a millisecond on one CPU core. Ties are broken by insertion order (the
earlier id wins), so results are deterministic and match a sorted brute-force scan exactly.

Backends: ``"numpy"`` (default; always available) or ``"faiss"`` (``faiss-cpu``'s ``IndexFlatIP``, also
exact; used with ``backend="auto"`` when installed). The stored vectors are the same either way and
``save``/``load`` write one format. Storage grows geometrically, so ``add`` is amortized O(rows added).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

INDEX_FORMAT = "memroute.vector_index"
INDEX_SCHEMA_VERSION = 1
_EMB_FILE, _IDS_FILE, _META_FILE = "embeddings.npy", "ids.json", "index.json"


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Row-wise L2 normalization (a zero row stays zero)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, eps)


def faiss_available() -> bool:
    return importlib.util.find_spec("faiss") is not None


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries per row, sorted by score desc, ties by lower index first.

    Exact (tie-aware) and O(n + k log k) per row: ``argpartition`` finds the k-th best score, every
    entry >= it is kept (so ties at the boundary are not cut arbitrarily), and only those are sorted.
    """
    scores = np.atleast_2d(scores)
    n = scores.shape[1]
    k = min(int(k), n)
    out = np.empty((scores.shape[0], k), dtype=np.int64)
    if k == 0:
        return out
    for r, row in enumerate(scores):
        if k < n:
            kth = row[np.argpartition(-row, k - 1)[k - 1]]
            cand = np.flatnonzero(row >= kth)
        else:
            cand = np.arange(n)
        order = np.lexsort((cand, -row[cand]))[:k]
        out[r] = cand[order]
    return out


class VectorIndex:
    """Exact inner-product index with string ids, incremental ``add`` and atomic ``save``/``load``.

    Args:
        dim: embedding size; ``None`` = taken from the first ``add``.
        normalize: L2-normalize added rows and queries (so scores are cosine similarities).
        backend: ``"numpy"``, ``"faiss"`` or ``"auto"`` (faiss when installed, else numpy).
    """

    def __init__(self, dim: int | None = None, normalize: bool = True, backend: str = "numpy"):
        if backend not in ("numpy", "faiss", "auto"):
            raise ValueError(f"backend must be 'numpy', 'faiss' or 'auto', got {backend!r}")
        if backend == "faiss" and not faiss_available():
            raise ImportError("backend='faiss' needs faiss-cpu: pip install faiss-cpu")
        self.backend = "faiss" if backend == "faiss" or (backend == "auto" and faiss_available()) else "numpy"
        self.dim = dim
        self.normalize = normalize
        self._ids: list[str] = []
        self._pos: dict[str, int] = {}
        self._buf = np.zeros((0, dim or 0), dtype=np.float32)
        self._n = 0
        self._faiss = None

    # -- size and contents -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def __contains__(self, item: str) -> bool:
        return item in self._pos

    @property
    def ids(self) -> list[str]:
        return list(self._ids)

    @property
    def embeddings(self) -> np.ndarray:
        """The stored (normalized) rows, in insertion order (a read-only view)."""
        view = self._buf[: self._n]
        view.flags.writeable = False
        return view

    def get(self, item: str) -> np.ndarray:
        return self._buf[self._pos[item]].copy()

    # -- building ----------------------------------------------------------------------------------
    def add(self, ids: Sequence[str], embeddings: np.ndarray) -> None:
        """Append rows. Ids must be new and unique; embeddings are (len(ids), dim)."""
        ids = [str(i) for i in ids]
        emb = np.asarray(embeddings, dtype=np.float32)
        if emb.ndim == 1 and len(ids) == 1:
            emb = emb[None, :]
        if emb.ndim != 2 or emb.shape[0] != len(ids):
            raise ValueError(f"expected embeddings of shape ({len(ids)}, dim), got {emb.shape}")
        if self.dim is None:
            self.dim = int(emb.shape[1])
            self._buf = np.zeros((0, self.dim), dtype=np.float32)
        if emb.shape[1] != self.dim:
            raise ValueError(f"embedding dim {emb.shape[1]} != index dim {self.dim}")
        if not np.isfinite(emb).all():
            raise ValueError("embeddings contain NaN or inf")
        seen: set[str] = set()
        dup = [i for i in ids if i in self._pos or (i in seen or seen.add(i))]
        if dup:
            raise ValueError(f"duplicate id(s) {dup[:5]}{' ...' if len(dup) > 5 else ''}")
        if not ids:
            return
        if self.normalize:
            emb = l2_normalize(emb)
        need = self._n + len(ids)
        if need > self._buf.shape[0]:
            grown = np.zeros((max(need, 2 * self._buf.shape[0], 64), self.dim), dtype=np.float32)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n:need] = emb
        for i in ids:
            self._pos[i] = len(self._ids)
            self._ids.append(i)
        if self._faiss is not None:
            self._faiss.add(np.ascontiguousarray(emb))
        self._n = need

    def _faiss_index(self):
        if self._faiss is None:
            import faiss

            self._faiss = faiss.IndexFlatIP(self.dim)
            if self._n:
                self._faiss.add(np.ascontiguousarray(self._buf[: self._n]))
        return self._faiss

    # -- search ------------------------------------------------------------------------------------
    def scores(self, queries: np.ndarray) -> np.ndarray:
        """Inner products of (normalized) queries with every stored row: (n_queries, len(self))."""
        q = self._prep_queries(queries)
        return q @ self._buf[: self._n].T

    def _prep_queries(self, queries: np.ndarray) -> np.ndarray:
        q = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        if self.dim is not None and q.shape[1] != self.dim:
            raise ValueError(f"query dim {q.shape[1]} != index dim {self.dim}")
        return l2_normalize(q) if self.normalize else q

    def search(self, queries: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Top-k ids and scores per query.

        ``queries`` (n, dim) -> ids (n, min(k, len)) object array and scores float32 of the same shape;
        a single 1-D query returns 1-D arrays. Exact; ties by insertion order.
        """
        single = np.asarray(queries).ndim == 1
        q = self._prep_queries(queries)
        k = min(int(k), self._n)
        if k <= 0:
            ids, scores = np.empty((len(q), 0), dtype=object), np.empty((len(q), 0), dtype=np.float32)
        elif self.backend == "faiss":
            ids, scores = self._search_faiss(q, k)
        else:
            s = q @ self._buf[: self._n].T
            idx = top_k(s, k)
            scores = np.take_along_axis(s, idx, axis=1)
            ids = np.asarray(self._ids, dtype=object)[idx]
        return (ids[0], scores[0]) if single else (ids, scores)

    def _search_faiss(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        # faiss does not promise a tie order, so ask for a few extra and re-rank them exactly.
        extra = min(self._n, k + 16)
        _, cand = self._faiss_index().search(np.ascontiguousarray(q), extra)
        all_ids = np.asarray(self._ids, dtype=object)
        out_ids, out_scores = [], []
        for row, c in zip(q, cand):
            c = c[c >= 0]
            s = self._buf[c] @ row
            order = np.lexsort((c, -s))[:k]
            out_ids.append(all_ids[c[order]])
            out_scores.append(s[order])
        return np.stack(out_ids), np.stack(out_scores).astype(np.float32)

    # -- persistence -------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write ``embeddings.npy``, ``ids.json`` and ``index.json`` into ``path`` atomically."""
        from routers.base import atomic_directory

        with atomic_directory(path, "vector_index") as tmp:
            np.save(tmp / _EMB_FILE, np.ascontiguousarray(self._buf[: self._n]), allow_pickle=False)
            (tmp / _IDS_FILE).write_text(json.dumps(self._ids, ensure_ascii=False))
            (tmp / _META_FILE).write_text(json.dumps({
                "format": INDEX_FORMAT, "schema_version": INDEX_SCHEMA_VERSION, "dim": self.dim,
                "count": self._n, "normalize": self.normalize, "metric": "inner_product"}, indent=2))
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike, backend: str = "numpy", mmap: bool = False) -> "VectorIndex":
        path = Path(path)
        meta = json.loads((path / _META_FILE).read_text())
        if meta.get("format") != INDEX_FORMAT:
            raise ValueError(f"{path}: not a memroute vector index (format {meta.get('format')!r})")
        ids = json.loads((path / _IDS_FILE).read_text())
        emb = np.load(path / _EMB_FILE, mmap_mode="r" if mmap else None, allow_pickle=False)
        if emb.shape != (meta["count"], meta["dim"]) or len(ids) != meta["count"]:
            raise ValueError(f"{path}: inconsistent index ({emb.shape}, {len(ids)} ids, meta {meta})")
        index = cls(dim=meta["dim"], normalize=meta["normalize"], backend=backend)
        # rows are stored normalized already: no re-normalization. A memory-mapped buffer is read-only;
        # the first add() after loading copies it into a growable in-memory one.
        index._buf = emb if mmap and emb.dtype == np.float32 else np.array(emb, dtype=np.float32)
        index._ids = list(ids)
        index._pos = {i: n for n, i in enumerate(ids)}
        index._n = len(ids)
        return index

    @classmethod
    def from_embeddings(cls, ids: Iterable[str], embeddings: np.ndarray, **kwargs) -> "VectorIndex":
        index = cls(**kwargs)
        index.add(list(ids), embeddings)
        return index
