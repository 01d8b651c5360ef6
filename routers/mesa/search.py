"""MESA prior-guided policy search (paper Algorithm 1) with UCB-scheduled directions, resumable from its trace.

The archive starts with "all five" evaluated on validation. Each round, from the state at the start of the round:

* every direction ``a`` (arm) has ``UCB(a) = mean_obj(a) + beta * sqrt(log(N + 2) / (n_a + 1))`` (eq. 9), where
  ``n_a`` counts the candidates evaluated under ``a``, ``N = sum n_a`` and ``mean_obj(a)`` is their mean validation
  objective (an untried arm gets the mean over every candidate evaluated so far);
* **exploit**: the arm with the highest UCB; the candidate is its best archived policy with one hyper-parameter
  moved to a neighbouring grid value (the family's defaults when the arm is untried);
* **explore**: the least-tried other arm (ties: highest UCB); a random grid point of its family;
* **failure repair**: the validation questions the incumbent fails (its objective is more than ``fail_margin``
  below the best subset's) rank the single edits (add / remove one structure) by how much of them they recover;
  the cues that gate an edit (lexical / question-type / preview flags) are ranked on the *train* split; the
  candidate is the incumbent plus the best such rule not tried yet, credited to the incumbent's arm
  ("parsimony" for a fixed subset).

Each candidate is fitted on train and evaluated on validation: objective = J - lam * C / t_ref. It is accepted
when it beats the incumbent (so accepted candidates never lower the validation objective); the result is the
incumbent, which is also the archive's best. After every candidate the trace JSON is rewritten atomically; a
rerun replays the trace (no candidate is fitted or evaluated again) and continues where it stopped.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from routers.config import ConfigError, fingerprint_diff
from routers.io import atomic_write_json
from routers.logs import get_logger
from routers.mesa.policies import DIRECTIONS, FAMILIES, FIXED, FitData, Policy, fit_policy
from routers.mesa.policies_features import cues
from routers.mesa.search_data import SweepTable
from routers.mesa.selector_view import K, STRUCTURES

log = get_logger(__name__)
SLOTS = ("exploit", "explore", "repair")
TRACE_KIND = "memroute.mesa.search_trace"
REPAIR_FALLBACK_ARM = "parsimony"


def ucb(mean: float, n_a: int, n_total: int, beta: float) -> float:
    """Eq. 9: mean + beta * sqrt(log(N + 2) / (n_a + 1))."""
    return mean + beta * math.sqrt(math.log(n_total + 2) / (n_a + 1))


@dataclass
class SearchStats:
    evaluations: int = 0
    fits: int = 0
    replayed: int = 0


@dataclass
class SearchState:
    archive: list = field(default_factory=list)  # (Policy, objective, arm)
    arm_objs: dict = field(default_factory=lambda: {a: [] for a in DIRECTIONS})
    incumbent: Policy | None = None
    incumbent_obj: float = -math.inf
    incumbent_arm: str = FIXED

    def apply(self, e: dict) -> None:
        pol = Policy.from_dict(e["policy"])
        self.archive.append((pol, e["objective"], e["direction"]))
        if e["direction"] in self.arm_objs:
            self.arm_objs[e["direction"]].append(e["objective"])
        if e["accepted"]:
            self.incumbent, self.incumbent_obj, self.incumbent_arm = pol, e["objective"], e["direction"]

    def ucb_table(self, beta: float) -> dict[str, float]:
        n_total = sum(len(v) for v in self.arm_objs.values())
        prior = float(np.mean([o for _, o, _ in self.archive])) if self.archive else 0.0
        return {a: ucb(float(np.mean(v)) if v else prior, len(v), n_total, beta) for a, v in self.arm_objs.items()}

    def plan(self, beta: float) -> dict[str, str]:
        table = self.ucb_table(beta)
        exploit = max(DIRECTIONS, key=lambda a: (table[a], -DIRECTIONS.index(a)))
        explore = min((a for a in DIRECTIONS if a != exploit),
                      key=lambda a: (len(self.arm_objs[a]), -table[a], DIRECTIONS.index(a)))
        repair = self.incumbent_arm if self.incumbent_arm in DIRECTIONS else REPAIR_FALLBACK_ARM
        return {"exploit": exploit, "explore": explore, "repair": repair, "ucb": table}


def evaluate(policy: Policy, table: SweepTable, lam: float, t_ref: float) -> dict:
    masks = [policy.select_mask(v) for v in table.views]
    r, t = table.at(masks)
    J, C = float(r.mean()), float(t.mean())
    return {"J": J, "C": C, "C_norm": C / t_ref, "objective": J - lam * C / t_ref,
            "structures_per_query": float(np.mean([bin(m).count("1") for m in masks]))}


def _mutate(hyper: dict, grid: dict, rng: np.random.Generator) -> dict:
    h = dict(hyper)
    movable = [k for k, v in grid.items() if len(v) > 1]
    if not movable:
        return h
    key = movable[int(rng.integers(len(movable)))]
    values = grid[key]
    i = values.index(h[key]) if h[key] in values else 0
    j = i + (1 if rng.random() < 0.5 else -1)
    j = j if 0 <= j < len(values) else i - (j - i)
    h[key] = values[max(0, min(len(values) - 1, j))]
    return h


def _random_hyper(grid: dict, rng: np.random.Generator) -> dict:
    return {k: v[int(rng.integers(len(v)))] for k, v in grid.items()}


def propose_rules(incumbent: Policy, train: FitData, val: SweepTable, lam: float, t_ref: float,
                  fail_margin: float, per_edit: int = 3) -> list[dict]:
    """Failure-repair rules, best first: edits (add / remove one structure) ranked by how much they recover on the
    validation questions the incumbent fails; for each, the cues that gate it best on *train* (positive gain)."""
    Qv = val.objective(lam, t_ref)
    masks = np.array([incumbent.select_mask(v) for v in val.views])
    rows = np.arange(len(masks))
    q_inc = Qv[rows, masks - 1]
    fails = np.where(Qv.max(axis=1) - q_inc > fail_margin)[0]
    if not len(fails):
        return []
    edits = []
    for k in range(K):
        for op in ("add", "remove"):
            edited = masks[fails] | 1 << k if op == "add" else masks[fails] & ~(1 << k)
            q = np.where(edited > 0, Qv[fails, np.maximum(edited, 1) - 1], 0.0)
            gain = float((q - q_inc[fails]).sum())
            if gain > 0:
                edits.append((gain, op, k))
    tr_masks = np.array([incumbent.select_mask(v) for v in train.views], dtype=int)
    flags = [cues(v) for v in train.views]
    out = []
    for _, op, k in sorted(edits, key=lambda e: (-e[0], e[1], e[2])):
        edited = tr_masks | 1 << k if op == "add" else tr_masks & ~(1 << k)
        delta = train.q_of(edited) - train.q_of(tr_masks)
        gains: dict = {}
        for i, fl in enumerate(flags):
            for c in fl:
                gains[c] = gains.get(c, 0.0) + float(delta[i])
        for cue in sorted((c for c in gains if gains[c] > 0), key=lambda c: (-gains[c], c))[:per_edit]:
            out.append({"if": cue, "op": op, "structure": STRUCTURES[k]})
    return out


def run_search(train: SweepTable, val: SweepTable, *, seed: int, lam: float = 0.1, beta: float = 0.05,
               rounds: int = 30, fail_margin: float = 0.05, trace_path: str | Path | None = None,
               fingerprint: dict | None = None, proposer: Callable | None = None,
               stats: SearchStats | None = None, extra: dict | None = None) -> dict:
    """Run (or resume) the search; returns the trace dict (``best`` = the chosen policy and its metrics)."""
    from routers.mesa.search_data import reference_tokens

    stats = stats if stats is not None else SearchStats()
    t_ref = reference_tokens(train)
    fingerprint = json.loads(json.dumps({**(fingerprint or {}), "seed": seed, "lam": lam, "beta": beta,
                                         "fail_margin": fail_margin, "n_train": len(train), "n_val": len(val),
                                         "t_ref": t_ref}))
    trace = {"schema_version": 1, "kind": TRACE_KIND, "seed": seed, "fingerprint": fingerprint, "lam": lam,
             "beta": beta, "t_ref": t_ref, "rounds": rounds, **(extra or {}), "entries": [], "best": None}
    old: list = []
    if trace_path is not None and Path(trace_path).exists():
        prev = json.loads(Path(trace_path).read_text(encoding="utf-8"))
        if not isinstance(prev, dict) or prev.get("kind") != TRACE_KIND:
            raise ConfigError(f"{trace_path}: not a MESA search trace")
        diff = fingerprint_diff(prev.get("fingerprint", {}), fingerprint)
        if diff:
            raise ConfigError(f"{trace_path}: this search was started with other settings ({sorted(diff)}); "
                              "restore them or pass --resume never")
        old = prev.get("entries", [])
    data = FitData.from_table(train, lam, t_ref)
    state = SearchState()

    def step(rnd: int, slot: str, make: Callable, arm: str, ucb_value: float | None) -> None:
        n = len(trace["entries"])
        if n < len(old):
            e = old[n]
            if (e["round"], e["slot"]) != (rnd, slot):
                raise ConfigError(f"{trace_path}: entry {n} is round {e['round']} {e['slot']}, expected {rnd} {slot}")
            stats.replayed += 1
        else:
            policy, note = make()
            dup = next((o for p, o, _ in state.archive if p == policy), None)
            if dup is None:
                metrics = evaluate(policy, val, lam, t_ref)
                stats.evaluations += 1
            else:
                metrics = next(dict(x) for x in trace["entries"] if Policy.from_dict(x["policy"]) == policy)
            e = {"round": rnd, "slot": slot, "direction": arm, "ucb": ucb_value, "policy": policy.to_dict(),
                 **{k: metrics[k] for k in ("J", "C", "C_norm", "objective", "structures_per_query")},
                 "accepted": bool(metrics["objective"] > state.incumbent_obj + 1e-12), "duplicate": dup is not None,
                 "note": note}
        state.apply(e)
        e["incumbent_objective"] = state.incumbent_obj
        trace["entries"].append(e)
        best = next(x for x in reversed(trace["entries"]) if x["accepted"])
        trace["best"] = {k: best[k] for k in ("round", "slot", "direction", "policy", "J", "C", "C_norm",
                                              "objective", "structures_per_query")}
        if trace_path is not None and n >= len(old):
            atomic_write_json(trace_path, trace)

    step(0, "init", lambda: (Policy.fixed(), "all five"), FIXED, None)
    for rnd in range(1, rounds + 1):
        plan = state.plan(beta)
        archive = list(state.archive)
        inc = state.incumbent

        def build(slot: str, arm: str):
            rng = np.random.default_rng([seed, rnd, SLOTS.index(slot)])
            fam = FAMILIES[arm]
            if slot == "repair":  # the best-ranked rule that makes a policy not in the archive yet
                for rule in propose_rules(inc, data, val, lam, t_ref, fail_margin):
                    cand = Policy(inc.direction, inc.hyper, inc.params, inc.rules + [rule], inc.default)
                    if all(p != cand for p, _, _ in archive):
                        return cand, f"rule {rule}"
                return _fit(arm, _random_hyper(fam.grid, rng), None), "no new repair: random point of the arm"
            tried = [(p, o) for p, o, a in archive if a == arm and p.direction == arm]
            seen = {json.dumps([p.hyper, p.rules], sort_keys=True) for p, _ in tried}
            hyper, rules = fam.default_hyper(), []
            if slot == "exploit" and tried:
                base = max(tried, key=lambda t: t[1])[0]
                rules = base.rules
                for _ in range(8):
                    hyper = _mutate(base.hyper, fam.grid, rng)
                    if json.dumps([hyper, rules], sort_keys=True) not in seen:
                        break
            elif tried:
                for _ in range(8):
                    hyper = _random_hyper(fam.grid, rng)
                    if json.dumps([hyper, []], sort_keys=True) not in seen:
                        break
            note = "rule-based"
            if proposer is not None:
                proposed = proposer(arm=arm, slot=slot, hyper=hyper, grid=fam.grid,
                                    archive=[(p.direction, p.hyper, o) for p, o, _ in archive])
                if proposed is not None:
                    hyper, note = proposed, "llm"
            return _fit(arm, hyper, rules), note

        def _fit(arm, hyper, rules):
            stats.fits += 1
            return fit_policy(arm, hyper, data, rules)

        for slot in SLOTS:
            arm = plan[slot]
            step(rnd, slot, lambda s=slot, a=arm: build(s, a), arm, plan["ucb"][arm])
        log.info("seed %d round %d/%d: best objective %.4f (%s)", seed, rnd, rounds, state.incumbent_obj,
                 state.incumbent.direction)
    return trace
