"""The core of MESA selector policies: :class:`Policy`, the family registry, :class:`FitData` and the fitting
helpers shared by the twenty families (:mod:`routers.mesa.policies` documents them; import from there)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from routers.mesa.policies_features import GATE_FEATURES, cues, gate_features, qtype
from routers.mesa.search_data import SweepTable, utilities
from routers.mesa.selector_view import (ALL_FIVE, FULL_MASK, K, STRUCTURES, QueryView, key_of, mask_of_key,
                                        names_of)

AXES = {"demand": ("capability_prior", "domain_task_prior", "lexical_demand", "query_decomposition"),
        "value": ("marginal_value", "conditional_value", "hierarchical_shrinkage", "learned_gating"),
        "construction": ("independent_gating", "cardinality_first", "forward_selection", "complementarity"),
        "evidence": ("availability", "relevance", "coverage", "redundancy"),
        "robustness": ("confidence_fallback", "disagreement", "parsimony", "support_aware")}
DIRECTIONS = tuple(d for ds in AXES.values() for d in ds)
FIXED = "fixed"  # not an arm: a constant subset ("all five" initialises the archive)


@dataclass
class Family:
    name: str
    fit: Callable  # (FitData, hyper) -> params
    select: Callable  # (QueryView, params, hyper) -> mask
    grid: dict  # hyper name -> allowed values (first = default)

    def default_hyper(self) -> dict:
        return {k: v[0] for k, v in self.grid.items()}


FAMILIES: dict[str, Family] = {}


def family(name: str, **grid):
    def register(pair):
        fit, select = pair
        FAMILIES[name] = Family(name, fit, select, grid)
        return pair
    return register


@dataclass
class FitData:
    """The train split as the fitters see it."""
    views: list
    Q: np.ndarray
    lam: float
    t_ref: float
    U: np.ndarray = field(init=False)
    qtypes: list = field(init=False)
    default_mask: int = field(init=False)

    def __post_init__(self):
        self.U = utilities(self.Q) if len(self.views) else np.zeros((0, K))
        self.qtypes = [qtype(v) for v in self.views]
        self.default_mask = best_mask(self.Q) or FULL_MASK

    @classmethod
    def from_table(cls, table: SweepTable, lam: float, t_ref: float) -> "FitData":
        return cls(list(table.views), table.objective(lam, t_ref), lam, t_ref)

    def q_of(self, masks) -> np.ndarray:
        m = np.asarray(masks, dtype=int)
        return np.where(m > 0, self.Q[np.arange(len(m)), np.maximum(m, 1) - 1], 0.0)


class Policy:
    """An executable selector; see the module docstring."""

    def __init__(self, direction: str, hyper: dict | None = None, params: dict | None = None,
                 rules: list | None = None, default: str = ALL_FIVE):
        if direction != FIXED and direction not in FAMILIES:
            raise ValueError(f"unknown direction {direction!r}; known: {[FIXED, *DIRECTIONS]}")
        canon = json.loads(json.dumps({"hyper": hyper or {}, "params": params or {}, "rules": rules or []}))
        self.direction, self.hyper, self.params, self.rules = direction, canon["hyper"], canon["params"], canon["rules"]
        for r in self.rules:
            if set(r) != {"if", "op", "structure"} or r["op"] not in ("add", "remove") or r["structure"] not in STRUCTURES:
                raise ValueError(f"bad repair rule {r!r:.120}")
        self.default = key_of(mask_of_key(default))
        if direction == FIXED:
            mask_of_key(self.params.get("subset", ""))

    @classmethod
    def fixed(cls, subset: str = ALL_FIVE) -> "Policy":
        return cls(FIXED, params={"subset": subset}, default=subset)

    def to_dict(self) -> dict:
        return {"direction": self.direction, "hyper": self.hyper, "params": self.params, "rules": self.rules,
                "default": self.default}

    @classmethod
    def from_dict(cls, d: dict) -> "Policy":
        unknown = set(d) - {"direction", "hyper", "params", "rules", "default"}
        if unknown or "direction" not in d:
            raise ValueError(f"not a policy: unknown keys {sorted(unknown)}" if unknown else "policy: direction missing")
        return cls(d["direction"], d.get("hyper"), d.get("params"), d.get("rules"), d.get("default", ALL_FIVE))

    def canonical(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def __eq__(self, other):
        return isinstance(other, Policy) and self.canonical() == other.canonical()

    def __repr__(self):
        return f"Policy({self.direction}, hyper={self.hyper}, rules={len(self.rules)})"

    def select_mask(self, view: QueryView) -> int:
        if not isinstance(view, QueryView):
            raise TypeError(f"a policy selects from a QueryView (question, corpus, previews), got {type(view).__name__}")
        if self.direction == FIXED:
            mask = mask_of_key(self.params["subset"])
        else:
            mask = int(FAMILIES[self.direction].select(view, self.params, self.hyper)) & FULL_MASK
        if self.rules:
            flags = cues(view)
            for r in self.rules:
                if r["if"] in flags:
                    bit = 1 << STRUCTURES.index(r["structure"])
                    mask = mask | bit if r["op"] == "add" else mask & ~bit
        return mask or mask_of_key(self.default)

    def select(self, view: QueryView) -> tuple[str, ...]:
        return names_of(self.select_mask(view))


def fit_policy(direction: str, hyper: dict | None, data: FitData, rules: list | None = None) -> Policy:
    """Fit ``direction``'s family with ``hyper`` (grid defaults for missing knobs) on the train data."""
    if direction == FIXED:
        raise ValueError("a fixed policy has nothing to fit; use Policy.fixed(subset)")
    fam = FAMILIES[direction]
    h = {**fam.default_hyper(), **(hyper or {})}
    unknown = set(h) - set(fam.grid)
    if unknown:
        raise ValueError(f"{direction}: unknown hyper-parameter(s) {sorted(unknown)}")
    return Policy(direction, h, fam.fit(data, h), rules, default=key_of(data.default_mask))


# -- fitting helpers -------------------------------------------------------------------------------------------
def best_mask(Q: np.ndarray, extra_cost: float = 0.0, max_size: int = K) -> int | None:
    if not len(Q):
        return None
    sizes = np.array([bin(m).count("1") for m in range(1, FULL_MASK + 1)])
    score = Q.mean(axis=0) - extra_cost * sizes
    score[sizes > max_size] = -np.inf
    return int(np.argmax(score)) + 1


def fit_lookup(keys: list, Q: np.ndarray, min_support: int, **kw) -> dict:
    groups: dict = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return {key: key_of(best_mask(Q[idx], **kw)) for key, idx in sorted(groups.items()) if len(idx) >= min_support}


def shrunk_means(keys: list, values: np.ndarray, prior: dict | np.ndarray, alpha: float) -> dict:
    """{key: (sum + alpha * prior) / (n + alpha)} per group (prior: one vector, or one per key)."""
    out = {}
    for key in sorted(set(keys)):
        idx = [i for i, k in enumerate(keys) if k == key]
        p = np.asarray(prior[key] if isinstance(prior, dict) else prior)
        out[key] = ((values[idx].sum(axis=0) + alpha * p) / (len(idx) + alpha)).tolist()
    return out


def mask_where(scores, tau: float) -> int:
    return sum(1 << k for k in range(K) if scores[k] > tau)


def greedy_subset(Q: np.ndarray, tau: float, allowed: int = FULL_MASK) -> int:
    """Forward selection from the empty set on mean objective; stop when the best gain <= tau."""
    mask, cur = 0, 0.0
    while True:
        best, gain = None, tau
        for k in range(K):
            if mask >> k & 1 or not allowed >> k & 1:
                continue
            g = float(Q[:, (mask | 1 << k) - 1].mean()) - cur
            if g > gain:
                best, gain = k, g
        if best is None:
            return mask
        mask |= 1 << best
        cur += gain


def fit_logistic(X: np.ndarray, y: np.ndarray, w: np.ndarray, l2: float, iters: int = 25) -> tuple[list, list, list]:
    """Weighted L2 logistic regression by Newton steps on standardized features (column 0 = bias)."""
    mu, sd = X.mean(axis=0), X.std(axis=0)
    mu[0], sd[0] = 0.0, 1.0
    sd[sd < 1e-9] = 1.0
    Z = (X - mu) / sd
    beta = np.zeros(X.shape[1])
    reg = np.full(X.shape[1], l2)
    reg[0] = 1e-6
    w = w / max(w.sum(), 1e-12) * len(w)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(Z @ beta, -30, 30)))
        grad = Z.T @ (w * (p - y)) + reg * beta
        H = (Z * (w * p * (1 - p))[:, None]).T @ Z + np.diag(reg)
        step = np.linalg.solve(H, grad)
        beta -= step
        if np.abs(step).max() < 1e-8:
            break
    return beta.tolist(), mu.tolist(), sd.tolist()


def fit_gates(data: FitData, l2: float) -> dict:
    """Per structure P(k belongs to the best subset | features): labels U > 0, weights |U| (decisions that matter
    count more)."""
    gates = {}
    F = np.stack([gate_features(v) for v in data.views]) if data.views else np.zeros((0, K, len(GATE_FEATURES)))
    for k, name in enumerate(STRUCTURES):
        y = (data.U[:, k] > 0).astype(float)
        beta, mu, sd = fit_logistic(F[:, k, :], y, np.abs(data.U[:, k]) + 1e-3, l2)
        gates[name] = {"beta": beta, "mu": mu, "sd": sd}
    return {"features": list(GATE_FEATURES), "gates": gates}


def gate_probs(view: QueryView, p: dict) -> np.ndarray:
    F = gate_features(view)
    out = np.empty(K)
    for k, name in enumerate(STRUCTURES):
        g = p["gates"][name]
        z = (F[k] - np.array(g["mu"])) / np.array(g["sd"]) @ np.array(g["beta"])
        out[k] = 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))
    return out
