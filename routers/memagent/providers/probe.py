"""Begin probe over all providers at once, and End storage into a chosen subset.

:class:`ProviderProbe` gives the same previews as calling every provider's ``preview`` in a loop (the
reference), computed with one pass over a cached, concatenated key matrix:

1. the goal is encoded once (per distinct encoder) and tokenized once;
2. dense part: every provider's key embeddings are quantized to int8 with a per-row scale and
   concatenated; one int8 matrix product (``torch._int_mm``: 4x less memory traffic than float32,
   integer-exact) gives approximate cosines with a rigorous per-row error bound ``e_i = |k_i - s_i c_i| +
   |s_i c_i| |q - s_q c_q|`` (+ slack for float rounding);
3. keyword part: the keyword providers' sparse weight matrices are stacked; one sparse product gives
   their exact scores, divided by each provider's query normalizer;
4. per provider (segment max via ``np.maximum.reduceat``) the best lower bound is found; only rows whose
   upper bound reaches it can be the maximum; those few candidates are re-scored exactly in float32
   from the provider's own embeddings, and the best one (ties: the earlier item) is the preview.

So the chosen item and its snippet are exactly the reference's; the score is the same float computation
on the same row (BLAS may round the last bit differently for a different row count: equal to ~1e-7).
When ``torch._int_mm`` is missing or fails a self-check at build time, the dense part falls back to a
float32 product over the concatenated matrix (exact, ~4x the memory traffic).

The cache is keyed on each provider's state object: a ``store``/``load`` replaces the state, and the next
probe rebuilds (only the changed providers' blocks are re-quantized).
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
from scipy import sparse

from routers.memagent.protocol import MemoryItem, Preview, Trajectory
from routers.memagent.providers.base import BaseProvider, ProviderState
from routers.memagent.providers.keyword import N_FEATURES, sparse_scores, term_counts

_SLACK = 1e-4  # >> float32 rounding of a 384-term dot product of unit vectors


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """int8 codes, per-row scale, residual norm |x - s c| and norm |s c| (all float64 but the codes)."""
    x = np.asarray(x, np.float32)
    if x.ndim == 1:
        x = x[None, :]
    amax = np.abs(x).max(axis=1) if x.size else np.zeros(len(x), np.float32)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float64)
    codes = np.clip(np.rint(x / scale[:, None]), -127, 127).astype(np.int8)
    approx = codes.astype(np.float64) * scale[:, None]
    resid = np.linalg.norm(x.astype(np.float64) - approx, axis=1)
    norm = np.linalg.norm(approx, axis=1)
    return codes, scale, resid, norm


def _pad_cols(codes: np.ndarray, width: int) -> np.ndarray:
    if codes.shape[1] == width:
        return codes
    out = np.zeros((codes.shape[0], width), np.int8)
    out[:, : codes.shape[1]] = codes
    return out


class _IntMatmul:
    """int8 x int8 -> int32 matrix-vector product; ``torch._int_mm`` when it passes a self-check on this
    machine (same code path as the real call); otherwise ``backend`` is None and the probe uses float32."""

    def __init__(self):
        self.backend = None
        try:
            rng = np.random.default_rng(0)
            a = rng.integers(-127, 128, (37, 24)).astype(np.int8)
            b = rng.integers(-127, 128, 24).astype(np.int8)
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
        return self._torch(codes, q)


@dataclass
class _Block:
    state: ProviderState
    codes: np.ndarray | None = None   # (n, width) int8
    scale: np.ndarray | None = None
    resid: np.ndarray | None = None
    norm: np.ndarray | None = None


class ProviderProbe:
    """``probe(goal) -> list[Preview]`` for every provider, in the given order, without any LLM call."""

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
        key = tuple(id(p.state) for p in self.providers)
        if key == self._key:
            return
        states = [p.state for p in self.providers]
        dims = {int(s.embeddings.shape[1]) for p, s in zip(self.providers, states)
                if p.uses_dense and s.embeddings is not None and len(s.items)}
        if len(dims) > 1:
            raise ValueError(f"providers' key embeddings have different dimensions {sorted(dims)}: one encoder is needed")
        self.dim = dims.pop() if dims else 0
        width = -(-self.dim // 8) * 8 if self.dim else 0  # int8 kernels want a multiple of 8
        for p, st in zip(self.providers, states):
            blk = self._blocks.get(p.name)
            if blk is not None and blk.state is st:
                continue
            blk = _Block(st)
            if self.quantized and p.uses_dense and st.embeddings is not None and len(st.items):
                codes, blk.scale, blk.resid, blk.norm = quantize_rows(st.embeddings)
                blk.codes = _pad_cols(codes, width)
            self._blocks[p.name] = blk
        sizes = np.array([len(s.items) for s in states], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)])
        n = int(self.offsets[-1])
        self.n_total = n
        self.row_provider = np.repeat(np.arange(len(states)), sizes)
        wd = np.array([p.score_dense_weight for p in self.providers])
        wk = np.array([p.keyword_weight for p in self.providers])
        self.wd_rows, self.wk_rows = wd[self.row_provider], wk[self.row_provider]
        self.dense_providers = [i for i, p in enumerate(self.providers) if p.uses_dense and sizes[i]]
        self.kw_providers = [i for i, p in enumerate(self.providers) if p.uses_keyword and sizes[i]]
        # dense: one int8 (or float32) matrix over every row (zero rows for keyword-only providers)
        self._codes = self._scale = self._err_k = self._err_n = self._dense32 = None
        if self.dense_providers and self.dim:
            if self.quantized:
                codes = np.zeros((n, width), np.int8)
                scale, resid, norm = np.zeros(n), np.zeros(n), np.zeros(n)
                for i in self.dense_providers:
                    blk, sl = self._blocks[self.providers[i].name], slice(self.offsets[i], self.offsets[i + 1])
                    codes[sl], scale[sl], resid[sl], norm[sl] = blk.codes, blk.scale, blk.resid, blk.norm
                self._codes, self._scale, self._err_k, self._err_n = codes, scale, resid, norm
            else:
                dense = np.zeros((n, self.dim), np.float32)
                for i in self.dense_providers:
                    dense[self.offsets[i]:self.offsets[i + 1]] = states[i].embeddings
                self._dense32 = dense
        # keyword: stacked sparse weights (zero rows elsewhere)
        self._kw = None
        if self.kw_providers:
            blocks = [states[i].keyword.weights if i in self.kw_providers
                      else sparse.csc_matrix((int(sizes[i]), N_FEATURES)) for i in range(len(states))]
            self._kw = sparse.vstack(blocks, format="csc")
        self._encoders = {}
        for i in self.dense_providers:
            enc = self.providers[i].encoder
            self._encoders.setdefault(id(enc), (enc, []))[1].append(i)
        self._key = key
        self.rebuilds += 1

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
            vecs = {i: np.asarray(goal_vector, np.float32) for i in self.dense_providers}
        else:
            vecs = self.encode_goal(goal)
        cols, counts = term_counts(goal) if self.kw_providers else (np.zeros(0, np.int32), np.zeros(0))
        return self._previews(vecs, cols, counts)

    def _previews(self, vecs: dict[int, np.ndarray], cols, counts) -> list[Preview]:
        n, provs = self.n_total, self.providers
        kw = np.zeros(n)
        if self._kw is not None and len(cols):
            kw = sparse_scores(self._kw, cols, counts)
            z = np.ones(len(provs))
            for i in self.kw_providers:
                z[i] = self._blocks[provs[i].name].state.keyword.normalizer(cols, counts)
            zr = z[self.row_provider]
            kw = np.divide(kw, zr, out=np.zeros(n), where=zr > 0)
        q = vecs[self.dense_providers[0]] if self.dense_providers else None
        if len({id(v) for v in vecs.values()}) > 1:  # several encoders: the dense part per provider
            return self._previews_exact(vecs, kw)
        if q is None or self.dim == 0:
            lower = upper = self.wk_rows * kw
        elif self._codes is not None:
            qc, qs, qr, qn = quantize_rows(q)
            qcodes = _pad_cols(qc, self._codes.shape[1])[0]
            approx = self._matmul(self._codes, qcodes).astype(np.float64) * (self._scale * qs[0])
            err = self._err_k * np.linalg.norm(q) + self._err_n * qr[0] + _SLACK
            base = self.wk_rows * kw
            lower = self.wd_rows * (approx - err) + base
            upper = self.wd_rows * (approx + err) + base
        else:
            dense = np.asarray(self._dense32 @ q, np.float64)
            lower = upper = self.wd_rows * dense + self.wk_rows * kw
        nonempty = [i for i in range(len(provs)) if self.offsets[i + 1] > self.offsets[i]]
        out = [Preview(p.name, 0.0, "", 0) for p in provs]
        if not nonempty:
            return out
        starts = self.offsets[nonempty]
        seg_lb = np.full(len(provs), -np.inf)
        seg_lb[nonempty] = np.maximum.reduceat(lower, starts)
        cand = np.flatnonzero(upper >= seg_lb[self.row_provider])
        cand_prov = self.row_provider[cand]
        bounds = np.searchsorted(cand_prov, np.arange(len(provs) + 1))
        for i in nonempty:
            rows = cand[bounds[i]:bounds[i + 1]]
            p, st = provs[i], self._blocks[provs[i].name].state
            local = rows - self.offsets[i]
            dense = (np.asarray(st.embeddings[local] @ q, np.float64) if p.uses_dense and q is not None
                     else np.zeros(len(rows)))
            exact = p.score_dense_weight * dense + p.keyword_weight * kw[rows]
            j = int(np.argmax(exact))  # rows are ascending: ties go to the earlier item
            out[i] = Preview(p.name, float(exact[j]), p.snippet(st.items[int(local[j])]), len(st.items))
        return out

    def _previews_exact(self, vecs, kw) -> list[Preview]:
        out = []
        for i, p in enumerate(self.providers):
            st = self._blocks[p.name].state
            if not st.items:
                out.append(Preview(p.name, 0.0, "", 0))
                continue
            sl = slice(self.offsets[i], self.offsets[i + 1])
            dense = np.asarray(st.embeddings @ vecs[i], np.float64) if p.uses_dense else np.zeros(len(st.items))
            s = p.score_dense_weight * dense + p.keyword_weight * kw[sl]
            j = int(np.argmax(s))
            out.append(Preview(p.name, float(s[j]), p.snippet(st.items[j]), len(st.items)))
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
                traceback.print_exc(file=sys.stderr)
    return report


def save_providers(providers: Mapping[str, BaseProvider], path) -> None:
    """All providers in one directory (one sub-directory each), replaced atomically as a whole."""
    from data_synthesis.jsonl import atomic_write_json
    from routers.base import atomic_directory

    with atomic_directory(path) as tmp:
        for name, p in providers.items():
            p.save(Path(tmp) / name)
        atomic_write_json(Path(tmp) / "providers.json", {"providers": list(providers)})


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
