"""Keyword scoring over hashed terms, kept as sparse matrices so the Begin probe can score every keyword
provider with one sparse product.

Terms are lower-cased alphanumeric words minus stop words (the shared ``routers.memory.retrieval``
tokenizer); CJK runs are cut with ``jieba`` when it is installed (Mobile-E's tokenizer) and into
characters + character bigrams otherwise. A term's column is ``crc32(term) mod 2**20``: stable across
processes, so no vocabulary has to be saved, and providers share one column space.

Both scorers are linear in the query's term counts ``c`` divided by a per-query normalizer, so a block of
providers scores as ``W[:, cols] @ c / z``:

* ``bm25``: Okapi BM25 (k1 = 1.5, b = 0.75, Lucene's non-negative idf) divided by its upper bound
  ``sum_t c_t * idf_t * (k1 + 1)`` -> a score in [0, 1].
* ``tfidf``: scikit-learn's TF-IDF (smooth idf, L2-normalized rows) cosine with the query; out-of-vocabulary
  query terms are ignored, as ``TfidfVectorizer.transform`` does -> a score in [0, 1].
"""

from __future__ import annotations

import re
import zlib
from functools import lru_cache

import numpy as np
from scipy import sparse

from routers.memory.retrieval import STOPWORDS

N_FEATURES = 1 << 20
KINDS = ("bm25", "tfidf")
_WORD = re.compile(r"[a-z0-9]+|[\u3400-\u9fff\uf900-\ufaff]+")


@lru_cache(maxsize=1)
def _jieba():
    try:
        import jieba  # noqa: F401

        return jieba
    except ImportError:
        return None


def keyword_tokens(text: str) -> list[str]:
    out: list[str] = []
    for tok in _WORD.findall(text.lower()):
        if tok[0] > "\u3000":  # a CJK run
            jb = _jieba()
            if jb is not None:
                out.extend(w for w in jb.lcut(tok) if w.strip())
            else:
                out.extend(tok)
                out.extend(tok[i:i + 2] for i in range(len(tok) - 1))
        elif tok not in STOPWORDS:
            out.append(tok)
    return out


@lru_cache(maxsize=65536)
def term_column(term: str) -> int:
    return zlib.crc32(term.encode("utf-8")) & (N_FEATURES - 1)


def term_counts(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique hashed columns (int32) and their counts (float64) for one text."""
    toks = keyword_tokens(text)
    if not toks:
        return np.zeros(0, np.int32), np.zeros(0, np.float64)
    cols, counts = np.unique(np.fromiter((term_column(t) for t in toks), np.int64, len(toks)), return_counts=True)
    return cols.astype(np.int32), counts.astype(np.float64)


def counts_matrix(rows: list[tuple[np.ndarray, np.ndarray]]) -> sparse.csr_matrix:
    """Stack per-document ``term_counts`` into an (n, N_FEATURES) CSR matrix."""
    indptr = np.zeros(len(rows) + 1, np.int64)
    if rows:
        np.cumsum([len(c) for c, _ in rows], out=indptr[1:])
    indices = np.concatenate([c for c, _ in rows]).astype(np.int32) if rows else np.zeros(0, np.int32)
    data = np.concatenate([v for _, v in rows]) if rows else np.zeros(0)
    return sparse.csr_matrix((data, indices, indptr), shape=(len(rows), N_FEATURES))


class KeywordIndex:
    """Immutable keyword scorer over ``n`` documents; build a new one to add documents."""

    def __init__(self, counts: sparse.csr_matrix, kind: str = "bm25", k1: float = 1.5, b: float = 0.75):
        if kind not in KINDS:
            raise ValueError(f"keyword kind must be one of {KINDS}, got {kind!r}")
        self.kind, self.k1, self.b = kind, k1, b
        self.counts = counts.tocsr()
        n = self.counts.shape[0]
        self.n_docs = n
        df = np.bincount(self.counts.indices, minlength=N_FEATURES)
        rows = np.repeat(np.arange(n), np.diff(self.counts.indptr))
        tf = self.counts.data
        cols = self.counts.indices
        if kind == "bm25":
            dl = np.asarray(self.counts.sum(axis=1)).ravel()
            avgdl = float(dl.mean()) if n and dl.mean() > 0 else 1.0
            idf = self._idf(df[cols])
            norm = k1 * (1.0 - b + b * dl[rows] / avgdl)
            data = idf * tf * (k1 + 1.0) / (tf + norm)
        else:
            v = tf * self._idf(df[cols])
            row_norm = np.sqrt(np.bincount(rows, weights=v * v, minlength=n))
            v = v / np.where(row_norm[rows] > 0, row_norm[rows], 1.0)
            data = v * self._idf(df[cols])  # the query's idf folded in: W[:, cols] @ c = doc . (c * idf)
        self.weights = sparse.csr_matrix((data, cols, self.counts.indptr), shape=self.counts.shape).tocsc()
        # document frequencies = entries per column (every stored weight is > 0): no separate df array kept
        self._colptr = self.weights.indptr

    @classmethod
    def from_texts(cls, texts, kind: str = "bm25", **kw) -> "KeywordIndex":
        return cls(counts_matrix([term_counts(t) for t in texts]), kind, **kw)

    def _idf(self, df: np.ndarray) -> np.ndarray:
        n = self.n_docs
        df = np.asarray(df, dtype=np.float64)
        if self.kind == "bm25":
            return np.log1p((n - df + 0.5) / (df + 0.5))
        return np.log((1.0 + n) / (1.0 + df)) + 1.0

    def take(self, rows: np.ndarray) -> sparse.csr_matrix:
        """Count rows (for rebuilding an index with some documents kept)."""
        return self.counts[np.asarray(rows, dtype=np.int64)]

    def normalizer(self, cols: np.ndarray, counts: np.ndarray) -> float:
        """The per-query divisor ``z`` (0 when no query term can match)."""
        if len(cols) == 0 or self.n_docs == 0:
            return 0.0
        df = self._colptr[cols + 1] - self._colptr[cols]
        if self.kind == "bm25":
            return float(np.sum(counts * self._idf(df) * (self.k1 + 1.0)))
        seen = df > 0
        u = counts[seen] * self._idf(df[seen])
        return float(np.sqrt(np.sum(u * u)))

    def raw_scores(self, cols: np.ndarray, counts: np.ndarray) -> np.ndarray:
        return sparse_scores(self.weights, cols, counts)

    def scores(self, cols: np.ndarray, counts: np.ndarray) -> np.ndarray:
        z = self.normalizer(cols, counts)
        raw = self.raw_scores(cols, counts)
        return raw / z if z > 0 else np.zeros(self.n_docs)


def sparse_scores(weights_csc: sparse.csc_matrix, cols: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``W[:, cols] @ counts`` as float64 (rows accumulate in query-column order, so a row block of a
    stacked matrix gives bit-identical results to the block alone)."""
    n = weights_csc.shape[0]
    if len(cols) == 0 or n == 0:
        return np.zeros(n)
    return np.asarray(weights_csc[:, cols] @ counts, dtype=np.float64).ravel()
