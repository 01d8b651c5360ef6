"""Begin probe over all providers at once, and End storage into a chosen subset.

:class:`ProviderProbe` gives the same previews as calling every provider's ``preview`` in a loop (the
reference), computed with one pass over a cached, concatenated key matrix:

1. the goal is encoded once (per distinct encoder) and tokenized once;
2. dense part: every provider's key embeddings are quantized to int8 with a per-row scale and
   concatenated once; one int8 matrix product (``torch._int_mm``: a quarter of float32's memory traffic,
   integer-exact) gives approximate scores whose error is bounded per provider by
   ``E = max_i |k_i - s_i c_i| * |q| + max_i |s_i c_i| * |q - s_q c_q|`` (+ slack for float rounding);
3. keyword part: the keyword providers' sparse weight matrices are stacked; one sparse product gives
   their exact scores, divided by each provider's query normalizer (hybrids add them in with their weight);
4. ``np.maximum.reduceat`` takes each provider's best approximate score ``m`` in one pass; only rows with
   an approximate score >= ``m - 2E`` can hold the true maximum; those few candidates are re-scored exactly
   (float32 keys from the provider's own state, float64 keyword scores) and the best one (ties: the earlier
   item) is the preview.

So the chosen item and its snippet are the reference's, and the score is the same float computation on
the same row (BLAS may round the last bit differently for a different number of rows, so scores agree to
~1e-7 and only items whose scores tie within that could be picked differently).
When ``torch._int_mm`` is missing or fails a self-check at build time, the dense part falls back to a
float32 product over the concatenated matrix (exact, ~4x the memory traffic).

The cache is keyed on each provider's state object: a ``store``/``load`` replaces the state, and the next
probe rebuilds (only the changed providers' blocks are re-quantized).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
from scipy import sparse

from routers.memagent.protocol import MemoryItem, Preview, Trajectory
from routers.memagent.providers.base import BaseProvider
from routers.memagent.providers.state import ProviderState
from routers.memagent.providers.keyword import sparse_scores, term_counts
from routers.logs import get_logger

log = get_logger(__name__)
_SLACK = 1e-4  # >> float32 rounding of a 384-term dot product of unit vectors


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-row symmetric int8 quantization: codes ``c``, scale ``s``, residual norm ``|x - s c|`` and ``|s c|``.

    Computed in float32 (their rounding, ~1e-7, is far inside the probe's slack)."""
    x = np.asarray(x, np.float32)
    if x.ndim == 1:
        x = x[None, :]
    amax = np.abs(x).max(axis=1) if x.size else np.zeros(len(x), np.float32)
    scale = np.where(amax > 0, amax / np.float32(127.0), np.float32(1.0)).astype(np.float32)
    codes = np.rint(x / scale[:, None]).astype(np.int8)  # |x / s| <= 127 by construction
    approx = codes.astype(np.float32)
    approx *= scale[:, None]
    norm = np.sqrt(np.einsum("ij,ij->i", approx, approx))
    approx -= x
    resid = np.sqrt(np.einsum("ij,ij->i", approx, approx))
    return codes, scale, resid, norm


class _IntMatmul:
    """int8 x int8 -> int32 matrix-vector product; ``torch._int_mm`` when it passes a self-check on this
    machine (same code path as the real call); otherwise ``backend`` is None and the probe uses float32."""

    def __init__(self):
        self.backend = None
        try:
            rng = np.random.default_rng(0)
            a = rng.integers(-127, 128, (37, 20)).astype(np.int8)
            b = rng.integers(-127, 128, 20).astype(np.int8)
            if np.array_equal(self._torch(a, b), a.astype(np.int64) @ b.astype(np.int64)):
                self.backend = "torch._int_mm"
        except Exception:  # noqa: BLE001 - any failure means: use the fallback
            pass

    @staticmethod
    def _torch(codes: np.ndarray, q: np.ndarray) -> np.ndarray:
        import torch

        # a fresh (w, 1) tensor: a numpy view with a 0 stride on the size-1 axis gives wrong results
        rhs = torch.from_numpy(np.array(q, dtype=np.int8, copy=True)).reshape(-1, 1)
        return torch._int_mm(torch.from_numpy(codes), rhs).numpy().ravel()

    def __call__(self, codes: np.ndarray, q: np.ndarray) -> np.ndarray:
        try:
            return self._torch(codes, q)
        except RuntimeError:  # a shape the kernel rejects: exact in float32 too (|sums| < 2**24)
            return (codes.astype(np.float32) @ q.astype(np.float32)).astype(np.int32)


@dataclass
class _Block:
    """One provider's cached part: its quantized keys and their error terms (reused while its state is)."""

    state: ProviderState
    codes: np.ndarray | None = None   # (n, dim) int8
    scale: np.ndarray | None = None   # (n,) per-row scale
    resid: np.ndarray | None = None   # (n,) |k - s c|
    norm: np.ndarray | None = None    # (n,) |s c|
    max_resid: float = 0.0            # max |k - s c| over rows
    max_norm: float = 0.0             # max |s c| over rows


class ProviderProbe:
    """``probe(goal) -> list[Preview]`` for every provider, in the given order, without any LLM call.

    ``quantized=False`` (or no working ``torch._int_mm``) uses one float32 product instead of the int8 pass.
    """

    def __init__(self, providers: Mapping[str, BaseProvider] | Sequence[BaseProvider], quantized: bool = True):
        self.providers: list[BaseProvider] = list(providers.values()) if isinstance(providers, Mapping) else list(providers)
        names = [p.name for p in self.providers]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate provider names {names}")
        self._matmul = _IntMatmul() if quantized else None
        self.quantized = bool(quantized and self._matmul.backend)
        self._blocks: dict[str, _Block] = {}
        self._key: tuple | None = None
        self.rebuilds = 0

    @property
    def backend(self) -> str:
        return self._matmul.backend if self.quantized else "float32"

    # -- cache ----------------------------------------------------------------------------------------
    def _ensure(self) -> None:
        """(Re)build the concatenated matrices when any provider's state object changed."""
        key = tuple(id(p.state) for p in self.providers)
        if key == self._key:
            return
        provs = self.providers
        states = [p.state for p in provs]
        sizes = [len(s.items) for s in states]
        dense = [i for i, p in enumerate(provs) if p.uses_dense and sizes[i]]
        dims = {int(states[i].embeddings.shape[1]) for i in dense}
        if len(dims) > 1:
            raise ValueError(f"providers' key embeddings have different dimensions {sorted(dims)}: one encoder is needed")
        self.dim = dims.pop() if dims else 0
        for p, st in zip(provs, states):
            blk = self._blocks.get(p.name)
            if blk is not None and blk.state is st:
                continue
            self._blocks[p.name] = self._quantize(p, st, blk)
        # row layout: providers with a dense part first (their rows are the matrix), then keyword-only ones
        kw_only = [i for i, p in enumerate(provs) if not p.uses_dense and sizes[i]]
        self.layout = dense + kw_only
        starts = np.cumsum([0] + [sizes[i] for i in self.layout])
        self.rows = {i: slice(int(starts[j]), int(starts[j + 1])) for j, i in enumerate(self.layout)}
        self.starts = starts[:-1]
        self.n_rows, self.n_dense = int(starts[-1]), int(starts[len(dense)])
        self._codes = self._wscale = self._dense32 = None
        if dense:
            if self.quantized:
                self._codes = np.concatenate([self._blocks[provs[i].name].codes for i in dense])
                self._wscale = np.concatenate([self._blocks[provs[i].name].scale
                                               * np.float32(provs[i].score_dense_weight) for i in dense])
            else:
                self._dense32 = np.concatenate([states[i].embeddings for i in dense])
        # keyword: the keyword providers' sparse weights stacked (in layout order)
        kw = [i for i in self.layout if provs[i].uses_keyword]
        kstarts = np.cumsum([0] + [sizes[i] for i in kw])
        self.kw_rows = {i: slice(int(kstarts[j]), int(kstarts[j + 1])) for j, i in enumerate(kw)}
        self._kw = sparse.vstack([states[i].keyword.weights for i in kw], format="csc") if kw else None
        self._encoders = {}
        for i in dense:
            enc = provs[i].encoder
            self._encoders.setdefault(id(enc), (enc, []))[1].append(i)
        self._dense = dense
        self._key = key
        self.rebuilds += 1

    def _quantize(self, p: BaseProvider, st: ProviderState, old: _Block | None) -> _Block:
        """A provider's block; rows whose item (id and key) is unchanged since ``old`` reuse their codes
        (``store`` keeps their embeddings bit for bit), so a store re-quantizes only what it wrote."""
        blk = _Block(st)
        if not (self.quantized and p.uses_dense and len(st.items)):
            return blk
        n, dim = st.embeddings.shape
        codes, scale = np.empty((n, dim), np.int8), np.empty(n, np.float32)
        resid, norm = np.empty(n, np.float32), np.empty(n, np.float32)
        todo = np.arange(n)
        if old is not None and old.codes is not None and old.codes.shape[1] == dim:
            pos = {(it.item_id, it.key): r for r, it in enumerate(old.state.items)}
            src = np.array([pos.get((it.item_id, it.key), -1) for it in st.items], np.int64)
            keep = np.flatnonzero(src >= 0)
            codes[keep], scale[keep] = old.codes[src[keep]], old.scale[src[keep]]
            resid[keep], norm[keep] = old.resid[src[keep]], old.norm[src[keep]]
            todo = np.flatnonzero(src < 0)
        if len(todo):
            codes[todo], scale[todo], resid[todo], norm[todo] = quantize_rows(st.embeddings[todo])
        blk.codes, blk.scale, blk.resid, blk.norm = codes, scale, resid, norm
        blk.max_resid, blk.max_norm = float(resid.max()), float(norm.max())
        return blk

    # -- probing ---------------------------------------------------------------------------------------
    def encode_goal(self, goal: str) -> dict[int, np.ndarray]:
        """The goal's vector per provider index (encoded once per distinct encoder)."""
        self._ensure()
        out = {}
        for enc, members in self._encoders.values():
            vec = enc.encode([goal])[0]
            for i in members:
                out[i] = vec
        return out

    def probe(self, goal: str, goal_vector: np.ndarray | None = None) -> list[Preview]:
        """Previews in provider order. ``goal_vector``: an already encoded goal (shared by all dense providers)."""
        self._ensure()
        if goal_vector is not None:
            q = np.asarray(goal_vector, np.float32)
            vecs = {i: q for i in self._dense}
        else:
            vecs = self.encode_goal(goal)
        cols, counts = term_counts(goal) if self._kw is not None else (np.zeros(0, np.int32), np.zeros(0))
        return self._previews(vecs, cols, counts)

    def _previews(self, vecs: dict[int, np.ndarray], cols, counts) -> list[Preview]:
        provs = self.providers
        out = [Preview(p.name, 0.0, "", 0) for p in provs]
        if not self.layout:
            return out
        # keyword scores (exact, float64) of every keyword provider: one sparse product
        kw = np.zeros(0)
        if self._kw is not None:
            kw = sparse_scores(self._kw, cols, counts)
            for i, sl in self.kw_rows.items():
                z = self._blocks[provs[i].name].state.keyword.normalizer(cols, counts)
                kw[sl] = kw[sl] / z if z > 0 else 0.0
        qs = {id(v) for v in vecs.values()}
        q = vecs[self._dense[0]] if self._dense else None
        if len(qs) > 1:  # several encoders: no shared query vector; score each provider with its own
            return self._previews_per_provider(vecs, kw)
        # approximate combined scores c (float32) for every row, with a per-provider error bound
        c = np.empty(self.n_rows, np.float32)
        err = np.full(len(provs), _SLACK)
        if self._codes is not None:
            qc, qscale, qresid, _ = quantize_rows(q)
            c[: self.n_dense] = self._matmul(self._codes, qc[0])
            c[: self.n_dense] *= self._wscale
            c[: self.n_dense] *= np.float32(qscale[0])
            qnorm = float(np.linalg.norm(q))
            for i in self._dense:
                blk = self._blocks[provs[i].name]
                err[i] += provs[i].score_dense_weight * (blk.max_resid * qnorm + blk.max_norm * float(qresid[0]))
        elif self._dense32 is not None:
            c[: self.n_dense] = self._dense32 @ q
            c[: self.n_dense] *= np.repeat(np.float32([provs[i].score_dense_weight for i in self._dense]),
                                           [self.rows[i].stop - self.rows[i].start for i in self._dense])
        for i, ksl in self.kw_rows.items():
            part = (provs[i].keyword_weight * kw[ksl]).astype(np.float32)
            if provs[i].uses_dense:
                c[self.rows[i]] += part
            else:
                c[self.rows[i]] = part
        seg_max = np.maximum.reduceat(c, self.starts)  # one pass: each provider's best approximate score
        for j, i in enumerate(self.layout):
            p, sl = provs[i], self.rows[i]
            st = self._blocks[p.name].state
            local = np.flatnonzero(c[sl] >= seg_max[j] - 2.0 * err[i])  # only these can be the maximum
            dense = (np.asarray(st.embeddings[local] @ q, np.float64) if p.uses_dense else np.zeros(len(local)))
            kpart = kw[self.kw_rows[i]][local] if p.uses_keyword else np.zeros(len(local))
            exact = p.score_dense_weight * dense + p.keyword_weight * kpart
            b = int(np.argmax(exact))  # local is ascending: ties go to the earlier item
            out[i] = Preview(p.name, float(exact[b]), p.snippet(st.items[int(local[b])]), len(st.items))
        return out

    def _previews_per_provider(self, vecs, kw) -> list[Preview]:
        out = []
        for i, p in enumerate(self.providers):
            st = self._blocks[p.name].state
            if not st.items:
                out.append(Preview(p.name, 0.0, "", 0))
                continue
            dense = np.asarray(st.embeddings @ vecs[i], np.float64) if p.uses_dense else np.zeros(len(st.items))
            kpart = kw[self.kw_rows[i]] if p.uses_keyword else np.zeros(len(st.items))
            s = p.score_dense_weight * dense + p.keyword_weight * kpart
            b = int(np.argmax(s))
            out.append(Preview(p.name, float(s[b]), p.snippet(st.items[b]), len(st.items)))
        return out


def probe_loop(providers: Mapping[str, BaseProvider] | Sequence[BaseProvider], goal: str,
               goal_vector: np.ndarray | None = None) -> list[Preview]:
    """The reference (and the naive way): each provider scores its own memory in turn."""
    provs = list(providers.values()) if isinstance(providers, Mapping) else list(providers)
    out = []
    for p in provs:
        if goal_vector is not None:
            qvec = np.asarray(goal_vector, np.float32) if p.uses_dense else None
            cols, counts = term_counts(goal) if p.uses_keyword else (np.zeros(0, np.int32), np.zeros(0))
            out.append(p.preview(qvec, cols, counts))
        else:
            out.append(p.probe(goal))
    return out


# -- End: storing into a subset -------------------------------------------------------------------------
@dataclass
class StoreReport:
    """What ``store_all`` did: items written per provider, providers the gate skipped, errors by provider."""

    stored: dict[str, list[MemoryItem]] = field(default_factory=dict)
    gated: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict:
        return {"stored": {k: [it.item_id for it in v] for k, v in self.stored.items()},
                "gated": list(self.gated), "errors": dict(self.errors)}


def _chosen(decisions, names: Sequence[str]) -> list[str]:
    if isinstance(decisions, str):
        decisions = [decisions]
    if isinstance(decisions, Mapping):
        chosen = [n for n, v in decisions.items() if v]
        unknown = [n for n in decisions if n not in names]
    else:
        chosen = list(dict.fromkeys(decisions))
        unknown = [n for n in chosen if n not in names]
    if unknown:
        raise ValueError(f"store decision names unknown provider(s) {unknown}; known: {list(names)}")
    return chosen


def store_all(providers: Mapping[str, BaseProvider], trajectory: Trajectory, decisions: Iterable[str] | Mapping[str, bool],
              verbose: bool = False) -> StoreReport:
    """Store ``trajectory`` into the chosen providers (End decision). A provider that raises keeps its previous
    memory (stores are atomic) and is reported in ``errors``; the others are stored normally."""
    report = StoreReport()
    for name in _chosen(decisions, list(providers)):
        p = providers[name]
        if not p.accepts(trajectory):
            report.gated.append(name)
            continue
        try:
            report.stored[name] = p.store(trajectory)
        except Exception as err:  # noqa: BLE001 - isolated per provider, reported
            report.errors[name] = f"{type(err).__name__}: {err}"
            if verbose:
                log.warning("provider %s: store failed", name, exc_info=True)
    return report


def save_providers(providers: Mapping[str, BaseProvider], path, extra: Mapping[str, object] | None = None) -> None:
    """All providers in one directory (one sub-directory each), replaced atomically as a whole; ``extra``
    (file name -> JSON value) is written into the same directory (e.g. an exploration's progress)."""
    from routers.io import atomic_write_json
    from routers.base import atomic_directory

    with atomic_directory(path, "providers") as tmp:
        for name, p in providers.items():
            p.save(Path(tmp) / name)
        atomic_write_json(Path(tmp) / "providers.json", {"providers": list(providers)})
        for file_name, value in (extra or {}).items():
            atomic_write_json(Path(tmp) / file_name, value)


def load_providers(providers: Mapping[str, BaseProvider], path) -> None:
    """Load every provider from ``save_providers`` output; all are read and validated before any is replaced."""
    import copy

    path = Path(path)
    staged = {}
    for name, p in providers.items():
        if not (path / name).exists():
            raise FileNotFoundError(f"{path / name}: no saved state for provider {name!r}")
        shadow = copy.copy(p)
        shadow.load(path / name)
        staged[name] = shadow
    for name, shadow in staged.items():  # commit: one assignment per provider, nothing can fail here
        providers[name]._state = shadow._state
        providers[name]._next_id = shadow._next_id
