"""MESA policy families, axes C-E (registered on import; use :mod:`routers.mesa.policies`).

Subset construction: independent_gating (one fitted decision stump per structure), cardinality_first (size per
question type, then the top structures by prior + preview relevance), forward_selection (greedy additions by
train-estimated conditional gains, among available structures), complementarity (greedy by utility minus
preview overlap with what is already chosen).
Evidence-aware: availability (best fixed subset restricted to structures whose preview is non-empty),
relevance (structures whose relevance is near the best one's), coverage (cover the question's content words
with previews), redundancy (drop structures whose preview duplicates a higher-valued chosen one).
Robustness / cost: confidence_fallback (learned gates, a fitted fallback subset when they are unsure),
disagreement (prior table vs preview ranking; union / intersection / fallback when they disagree),
parsimony (per-type best subset with a per-structure penalty and a size cap), support_aware (fine cue signature
-> question type -> global, each level used only with enough training questions).
"""

from __future__ import annotations

import numpy as np

from routers.mesa.policies_core import (FitData, best_mask, family, fit_gates, fit_lookup, gate_probs, mask_where,
                                        shrunk_means)
from routers.mesa.policies_features import (GATE_FEATURES, content_words, gate_features, lexical_cues, preview_similarity,
                                            preview_stats, qtype, relevance)
from routers.mesa.selector_view import FULL_MASK, K, STRUCTURES, key_of, mask_of_key


def _prior(data: FitData) -> list:
    return (data.U.mean(axis=0) if len(data.U) else np.zeros(K)).tolist()


def _by_qtype(data: FitData, alpha: float = 10.0) -> dict:
    return {"global": _prior(data), "qtype": shrunk_means(data.qtypes, data.U, np.array(_prior(data)), alpha)}


def _prior_of(view, p) -> np.ndarray:
    return np.array(p["qtype"].get(qtype(view), p["global"]))


def _available(view, min_tokens: int = 1) -> int:
    return sum(1 << k for k, n in enumerate(STRUCTURES)
               if view.structures[n].ok and view.structures[n].tokens >= min_tokens)


# -- axis C: subset construction ---------------------------------------------------------------------------------
def _stumps_fit(data: FitData, h):
    F = np.stack([gate_features(v) for v in data.views]) if data.views else np.zeros((0, K, len(GATE_FEATURES)))
    stumps = {}
    for k, name in enumerate(STRUCTURES):
        u = data.U[:, k]
        best = {"feature": None, "thr": 0.0, "above": True, "on": bool(u.sum() > 0)}
        base = max(u.sum(), 0.0)
        gain_best = base + h["min_gain"] * len(u)
        for f in range(1, F.shape[2]):
            x = F[:, k, f]
            for thr in sorted(set(np.quantile(x, [0.25, 0.5, 0.75]).tolist())) if len(x) else []:
                for above in (True, False):
                    on = x > thr if above else x <= thr
                    g = float(u[on].sum())
                    if g > gain_best:
                        gain_best = g
                        best = {"feature": GATE_FEATURES[f], "thr": float(thr), "above": above, "on": True}
        stumps[name] = best
    return {"stumps": stumps}


def _stumps_select(view, p, h):
    F = gate_features(view)
    mask = 0
    for k, name in enumerate(STRUCTURES):
        s = p["stumps"][name]
        if s["feature"] is None:
            on = s["on"]
        else:
            x = F[k, GATE_FEATURES.index(s["feature"])]
            on = x > s["thr"] if s["above"] else x <= s["thr"]
        mask |= int(bool(on)) << k
    return mask


family("independent_gating", min_gain=[0.0, 0.005, 0.01, 0.02])((_stumps_fit, _stumps_select))


def _ranked(view, p, h) -> list[int]:
    rel = relevance(view)
    score = _prior_of(view, p) + h["gamma"] * np.array([rel[n] for n in STRUCTURES])
    return [int(k) for k in np.argsort(-score, kind="stable")]


def _cardinality_fit(data: FitData, h):
    p = _by_qtype(data)
    orders = [_ranked(v, p, h) for v in data.views]
    sizes = {}
    for t in sorted(set(data.qtypes)) + [None]:
        idx = [i for i, q in enumerate(data.qtypes) if t is None or q == t]
        if len(idx) < (1 if t is None else h["min_support"]):
            continue
        vals = [float(np.mean([data.Q[i, sum(1 << k for k in orders[i][:m]) - 1] for i in idx]))
                for m in range(1, K + 1)]
        sizes["*" if t is None else t] = int(np.argmax(vals)) + 1
    return {**p, "sizes": sizes}


def _cardinality_select(view, p, h):
    m = p["sizes"].get(qtype(view), p["sizes"].get("*", K))
    return sum(1 << k for k in _ranked(view, p, h)[:m])


family("cardinality_first", gamma=[0.5, 0.0, 0.2, 1.0, 2.0], min_support=[5, 1, 10, 20])(
    (_cardinality_fit, _cardinality_select))


def _forward_fit(data: FitData, h):
    n = len(data.views)
    Qe = np.concatenate([np.zeros((n, 1)), data.Q], axis=1)
    mean = Qe.mean(axis=0) if n else np.zeros(FULL_MASK + 1)
    return {"gain": {f"{s}:{STRUCTURES[k]}": float(mean[s | 1 << k] - mean[s])
                     for s in range(FULL_MASK + 1) for k in range(K) if not s >> k & 1}}


def _forward_select(view, p, h):
    allowed = _available(view) if h["availability"] else FULL_MASK
    mask = 0
    while True:
        cands = [(p["gain"][f"{mask}:{n}"], k) for k, n in enumerate(STRUCTURES) if allowed >> k & 1 and not mask >> k & 1]
        if not cands:
            return mask
        g, k = max(cands)
        if g <= h["tau"]:
            return mask
        mask |= 1 << k


family("forward_selection", tau=[0.0, 0.005, 0.01, 0.02, 0.05], availability=[True, False])(
    (_forward_fit, _forward_select))


def _complement_select(view, p, h):
    st = preview_stats(view)
    prior = _prior_of(view, p)
    mask = 0
    while True:
        best, val = None, h["tau"]
        for k, n in enumerate(STRUCTURES):
            if mask >> k & 1:
                continue
            red = max([preview_similarity(st, n, m) for j, m in enumerate(STRUCTURES) if mask >> j & 1], default=0.0)
            v = prior[k] - h["rho"] * red
            if v > val:
                best, val = k, v
        if best is None:
            return mask
        mask |= 1 << best


family("complementarity", rho=[0.05, 0.0, 0.02, 0.1, 0.2], tau=[0.0, -0.01, 0.01, 0.02])(
    (lambda data, h: _by_qtype(data), _complement_select))


# -- axis D: evidence-aware ----------------------------------------------------------------------------------------
def _availability_fit(data: FitData, h):
    avail = np.array([_available(v, h["min_tokens"]) for v in data.views], dtype=int)
    vals = [float(data.q_of(avail & m).mean()) if len(avail) else 0.0 for m in range(1, FULL_MASK + 1)]
    return {"subset": key_of(int(np.argmax(vals)) + 1)}


family("availability", min_tokens=[1, 10, 50, 200])(
    (_availability_fit, lambda view, p, h: mask_of_key(p["subset"]) & _available(view, h["min_tokens"])))


def _relevance_select(view, p, h):
    rel = relevance(view, h["w_score"])
    score = np.array([rel[n] for n in STRUCTURES]) + np.array(p["global"])
    top = score.max()
    return sum(1 << k for k in range(K) if rel[STRUCTURES[k]] > 0 and score[k] >= h["tau"] * top) if top > 0 else 0


family("relevance", tau=[0.8, 0.5, 0.6, 0.7, 0.9], w_score=[0.5, 0.0, 1.0])(
    (lambda data, h: {"global": _prior(data)}, _relevance_select))


def _coverage_select(view, p, h):
    st = preview_stats(view)
    prior = _prior_of(view, p)
    qw = content_words(view.question)
    first = int(np.argmax(prior))
    mask, covered = 1 << first, set(st[STRUCTURES[first]]["words"]) & qw
    while qw and len(covered) / len(qw) < h["tau"]:
        gains = [(len((st[n]["words"] & qw) - covered), prior[k], k) for k, n in enumerate(STRUCTURES) if not mask >> k & 1]
        g, _, k = max(gains) if gains else (0, 0, 0)
        if g <= 0:
            break
        mask |= 1 << k
        covered |= st[STRUCTURES[k]]["words"] & qw
    return mask


family("coverage", tau=[0.7, 0.3, 0.5, 0.9, 1.0])((lambda data, h: _by_qtype(data), _coverage_select))


def _redundancy_select(view, p, h):
    st = preview_stats(view)
    base = mask_of_key(p["subset"]) & _available(view)
    kept: list[int] = []
    for k in sorted(range(K), key=lambda k: -p["global"][k]):
        if base >> k & 1 and all(preview_similarity(st, STRUCTURES[k], STRUCTURES[j]) < h["tau"] for j in kept):
            kept.append(k)
    return sum(1 << k for k in kept)


family("redundancy", tau=[0.5, 0.2, 0.3, 0.7, 0.9])(
    (lambda data, h: {"subset": key_of(data.default_mask), "global": _prior(data)}, _redundancy_select))


# -- axis E: robustness / cost --------------------------------------------------------------------------------------
def _confidence_select(view, p, h):
    probs = gate_probs(view, p)
    if float(np.mean(np.abs(probs - 0.5)) * 2) < h["margin"]:
        return mask_of_key(p["fallback"])
    return mask_where(probs, 0.5)


family("confidence_fallback", margin=[0.3, 0.1, 0.2, 0.4, 0.5], l2=[1.0, 10.0])(
    (lambda data, h: {**fit_gates(data, h["l2"]), "fallback": key_of(data.default_mask)}, _confidence_select))


def _disagree_select(view, p, h):
    a = mask_of_key(p["table"].get(qtype(view), p["fallback"]))
    rel = relevance(view)
    order = np.argsort(-(np.array(p["global"]) + np.array([rel[n] for n in STRUCTURES])), kind="stable")
    b = sum(1 << int(k) for k in order[: bin(a).count("1")])
    agree = bin(a & b).count("1") / bin(a | b).count("1")
    if agree >= h["agree"]:
        return a
    return {"union": a | b, "intersection": (a & b) or a, "fallback": mask_of_key(p["fallback"])}[h["mode"]]


family("disagreement", mode=["union", "intersection", "fallback"], agree=[0.5, 0.34, 0.67, 1.0])(
    (lambda data, h: {"table": fit_lookup(data.qtypes, data.Q, 5), "global": _prior(data),
                      "fallback": key_of(data.default_mask)}, _disagree_select))


def _parsimony_fit(data: FitData, h):
    kw = {"extra_cost": h["mu"], "max_size": h["max_size"]}
    glob = best_mask(data.Q, **kw) or data.default_mask
    return {"table": fit_lookup(data.qtypes, data.Q, 5, **kw), "global": key_of(glob)}


family("parsimony", mu=[0.01, 0.0, 0.005, 0.02, 0.05], max_size=[3, 1, 2, 4, 5])(
    (_parsimony_fit, lambda view, p, h: mask_of_key(p["table"].get(qtype(view), p["global"]))))


def _signature(view) -> str:
    return "|".join([qtype(view), *sorted(lexical_cues(view))])


def _support_fit(data: FitData, h):
    n = h["n_min"]
    return {"signature": fit_lookup([_signature(v) for v in data.views], data.Q, n),
            "qtype": fit_lookup(data.qtypes, data.Q, n), "global": key_of(data.default_mask)}


def _support_select(view, p, h):
    key = p["signature"].get(_signature(view)) or p["qtype"].get(qtype(view)) or p["global"]
    return mask_of_key(key)


family("support_aware", n_min=[10, 3, 5, 20, 40])((_support_fit, _support_select))
