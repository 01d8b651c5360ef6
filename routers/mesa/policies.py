"""MESA selector policies: executable, inspectable, JSON-serializable structure selectors.

A :class:`Policy` is ``direction`` (one of the twenty prior directions of the MESA paper, appendix D; the
family that interprets it), ``hyper`` (the knobs the search proposes, from the family's grid), ``params``
(fitted on the train split from the sweep's subset scores by :func:`fit_policy`), ``rules`` (failure-repair
edits ``{"if": cue, "op": "add"|"remove", "structure": name}`` applied in order after the family's choice)
and ``default`` (the subset returned when the selection is empty). ``to_dict`` / ``from_dict`` round-trip
exactly (params hold only JSON values).

At selection time a policy sees a :class:`~routers.mesa.selector_view.QueryView` only (question, corpus,
previews); anything else is refused. Fitting sees the train split's views plus per-question objectives
``Q = score - lam * tokens / t_ref`` of the 31 subsets and the per-structure utilities ``U``
(:func:`routers.mesa.search_data.utilities`); the val / test splits are never fitted on.

Families (axis: directions) -- this module: demand inference (capability_prior, domain_task_prior,
lexical_demand, query_decomposition) and value estimation (marginal_value, conditional_value,
hierarchical_shrinkage, learned_gating); :mod:`routers.mesa.policies_more`: subset construction,
evidence-aware and robustness / cost families.
"""

from __future__ import annotations

import numpy as np

from routers.mesa.policies_core import (AXES, DIRECTIONS, FAMILIES, FIXED, Family, FitData, Policy,  # noqa: F401
                                        best_mask, family, fit_gates, fit_lookup, fit_policy, gate_probs,
                                        greedy_subset, mask_where, shrunk_means)
from routers.mesa.policies_features import decompose, lexical_cues, qtype, question_type
from routers.mesa.selector_view import K, STRUCTURES, key_of, mask_of_key

__all__ = ["AXES", "DIRECTIONS", "FAMILIES", "FIXED", "FitData", "Policy", "fit_policy"]


# -- axis A: demand inference ------------------------------------------------------------------------------------
def _qtype_table_fit(data: FitData, h):
    return {"table": fit_lookup(data.qtypes, data.Q, h["min_support"])}


def _table_select(view, p, h):
    key = p["table"].get(qtype(view))
    return mask_of_key(key) if key else 0


family("capability_prior", min_support=[5, 1, 3, 10, 20, 40])((_qtype_table_fit, _table_select))


def _domain_fit(data: FitData, h):
    ms = h["min_support"]
    return {"corpus_qtype": fit_lookup([f"{v.corpus}|{t}" for v, t in zip(data.views, data.qtypes)], data.Q, ms),
            "qtype": fit_lookup(data.qtypes, data.Q, ms), "corpus": fit_lookup([v.corpus for v in data.views], data.Q, ms)}


def _domain_select(view, p, h):
    for table, key in (("corpus_qtype", f"{view.corpus}|{qtype(view)}"), ("qtype", qtype(view)), ("corpus", view.corpus)):
        if key in p[table]:
            return mask_of_key(p[table][key])
    return 0


family("domain_task_prior", min_support=[10, 3, 5, 20, 40])((_domain_fit, _domain_select))


def _lexical_fit(data: FitData, h):
    base = data.U.mean(axis=0) if len(data.U) else np.zeros(K)
    weights = {}
    for cue in sorted({c for v in data.views for c in lexical_cues(v)}):
        idx = [i for i, v in enumerate(data.views) if cue in lexical_cues(v)]
        m = (data.U[idx].sum(axis=0) + h["alpha"] * base) / (len(idx) + h["alpha"])
        weights[cue] = (m - base).tolist()
    return {"bias": base.tolist(), "weights": weights}


def _lexical_select(view, p, h):
    s = np.array(p["bias"])
    for cue in sorted(lexical_cues(view)):  # fixed order: the float sum does not depend on the hash seed
        if cue in p["weights"]:
            s = s + np.array(p["weights"][cue])
    return mask_where(s, h["tau"])


family("lexical_demand", tau=[0.0, -0.05, -0.02, -0.01, 0.01, 0.02, 0.05], alpha=[5.0, 1.0, 20.0, 50.0])(
    (_lexical_fit, _lexical_select))


def _decomp_fit(data: FitData, h):
    ranks = {}
    for t in sorted(set(data.qtypes)):
        idx = [i for i, q in enumerate(data.qtypes) if q == t]
        if len(idx) >= h["min_support"]:
            ranks[t] = [STRUCTURES[k] for k in np.argsort(-data.U[idx].mean(axis=0), kind="stable")]
    glob = data.U.mean(axis=0) if len(data.U) else np.zeros(K)
    return {"ranks": ranks, "global": [STRUCTURES[k] for k in np.argsort(-glob, kind="stable")]}


def _decomp_select(view, p, h):
    mask = 0
    for part in decompose(view.question):
        order = p["ranks"].get(question_type(part), p["global"])
        for name in order[: h["per_part"]]:
            mask |= 1 << STRUCTURES.index(name)
    return mask


family("query_decomposition", per_part=[1, 2, 3], min_support=[5, 1, 10, 20])((_decomp_fit, _decomp_select))


# -- axis B: value estimation ------------------------------------------------------------------------------------
def _marginal_fit(data: FitData, h):
    return {"value": (data.U.mean(axis=0) if len(data.U) else np.zeros(K)).tolist()}


family("marginal_value", tau=[0.0, -0.02, -0.01, 0.01, 0.02, 0.05])(
    (_marginal_fit, lambda view, p, h: mask_where(p["value"], h["tau"])))


def _conditional_fit(data: FitData, h):
    table = {}
    for t in sorted(set(data.qtypes)):
        idx = [i for i, q in enumerate(data.qtypes) if q == t]
        if len(idx) >= h["min_support"]:
            m = greedy_subset(data.Q[idx], h["tau"])
            if m:
                table[t] = key_of(m)
    return {"table": table}


family("conditional_value", tau=[0.0, 0.005, 0.01, 0.02, 0.05], min_support=[5, 1, 10, 20])(
    (_conditional_fit, _table_select))


def _hier_fit(data: FitData, h):
    a = h["alpha"]
    glob = data.U.mean(axis=0) if len(data.U) else np.zeros(K)
    by_t = shrunk_means(data.qtypes, data.U, glob, a)
    keys = [f"{v.corpus}|{t}" for v, t in zip(data.views, data.qtypes)]
    prior = {k: by_t[k.split("|", 1)[1]] for k in set(keys)}
    return {"global": glob.tolist(), "qtype": by_t, "corpus_qtype": shrunk_means(keys, data.U, prior, a)}


def _hier_select(view, p, h):
    t = qtype(view)
    est = p["corpus_qtype"].get(f"{view.corpus}|{t}") or p["qtype"].get(t) or p["global"]
    return mask_where(est, h["tau"])


family("hierarchical_shrinkage", alpha=[10.0, 1.0, 3.0, 30.0, 100.0], tau=[0.0, -0.01, 0.01, 0.02, 0.05])(
    (_hier_fit, _hier_select))


family("learned_gating", l2=[1.0, 0.1, 10.0, 100.0], tau=[0.5, 0.3, 0.4, 0.6, 0.7])(
    (lambda data, h: fit_gates(data, h["l2"]), lambda view, p, h: mask_where(gate_probs(view, p), h["tau"])))

from routers.mesa import policies_more  # noqa: E402,F401  (registers the other twelve families)
