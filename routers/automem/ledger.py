"""The search memories of AutoMem (seed 003 §4.2): the experience ledger, the observation graph and the
Pareto front.

Ledger entry ``(condition, edit, evidence, status)``; ``kind`` ``principle`` (an edit direction from a
diagnosis) or ``dead_end`` (a module option that keeps losing to no memory). Differential validation
(:meth:`Ledger.validate`) compares a candidate carrying an entry's edit with its parent on the same batch:

* pending + improved -> active; pending + not improved -> refuted;
* active + not improved -> pending (downgraded), and refuted at the next contradiction;
* refuted entries are never followed again (a new diagnosis cannot revive them);
* an inert comparison (``inert=True``: the candidate repeated its parent's outcome and step count on every task, so
  the edit never changed what the agent did) is recorded and changes no status: it did not test the edit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

STATUSES = ("pending", "active", "refuted")


@dataclass
class LedgerEntry:
    entry_id: str
    condition: str
    edit: list                   # [module, option]
    kind: str = "principle"      # principle | dead_end
    status: str = "pending"
    evidence: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class Ledger:
    def __init__(self, entries: Sequence[dict] = ()):
        self.entries: list[LedgerEntry] = [LedgerEntry(**e) for e in entries]

    def to_list(self) -> list[dict]:
        return [e.to_dict() for e in self.entries]

    def find(self, condition: str, edit: Sequence, kind: str = "principle") -> LedgerEntry | None:
        return next((e for e in self.entries if e.condition == condition and list(e.edit) == list(edit)
                     and e.kind == kind), None)

    def propose(self, condition: str, edit: Sequence, evidence: dict, kind: str = "principle") -> LedgerEntry:
        """The entry for (condition, edit), created pending when new; evidence appended."""
        e = self.find(condition, edit, kind)
        if e is None:
            e = LedgerEntry(f"L{len(self.entries) + 1}", condition, list(edit), kind,
                            "active" if kind == "dead_end" else "pending")
            self.entries.append(e)
        e.evidence.append(evidence)
        return e

    def validate(self, entry_id: str, improved: bool, evidence: dict, inert: bool = False) -> LedgerEntry:
        """Differential validation: update the entry's status from a paired comparison (none when ``inert``)."""
        e = next(x for x in self.entries if x.entry_id == entry_id)
        e.evidence.append({**evidence, "improved": bool(improved), **({"inert": True} if inert else {})})
        if e.status == "refuted" or inert:
            return e
        if improved:
            e.status = "active"
        else:
            e.status = "refuted" if e.status == "pending" else "pending"
        return e

    def blocked(self, edit: Sequence) -> bool:
        """An edit that a refuted principle or an active dead end rules out."""
        edit = list(edit)
        for e in self.entries:
            if e.kind == "principle" and e.status == "refuted" and list(e.edit) == edit:
                return True
            if e.kind == "dead_end" and e.status == "active" and list(e.edit) == edit:
                return True
        return False

    def active(self) -> list[LedgerEntry]:
        return [e for e in self.entries if e.status == "active" and e.kind == "principle"]


class ObservationGraph:
    """Running mean gain over no memory per (task pattern, module:option): ``mu(c, u)`` and ``n(c, u)``."""

    def __init__(self, edges: dict | None = None):
        self.edges: dict[str, dict[str, dict]] = {p: {u: dict(s) for u, s in d.items()} for p, d in (edges or {}).items()}

    def update(self, choices: Sequence[tuple[str, str]], gains: dict[str, float], accs: dict[str, float]) -> None:
        for pattern, gain in gains.items():
            row = self.edges.setdefault(pattern, {})
            for module, option in choices:
                s = row.setdefault(f"{module}:{option}", {"n_trials": 0, "avg_gain": 0.0, "avg_acc": 0.0})
                s["n_trials"] += 1
                s["avg_gain"] += (gain - s["avg_gain"]) / s["n_trials"]
                s["avg_acc"] += (accs.get(pattern, 0.0) - s["avg_acc"]) / s["n_trials"]

    def mean(self, module: str, option: str) -> tuple[float, int]:
        """Trial-weighted mean gain of a choice over all patterns, and its trial count."""
        tot = n = 0
        for row in self.edges.values():
            s = row.get(f"{module}:{option}")
            if s:
                tot += s["avg_gain"] * s["n_trials"]
                n += s["n_trials"]
        return (tot / n if n else 0.0), n

    def to_dict(self) -> dict:
        return self.edges


def dominates(a: dict, b: dict) -> bool:
    """``a`` Pareto-dominates ``b`` on (accuracy up, gain up, cost down)."""
    ge = a["accuracy"] >= b["accuracy"] and a["gain"] >= b["gain"] and a["cost"] <= b["cost"]
    gt = a["accuracy"] > b["accuracy"] or a["gain"] > b["gain"] or a["cost"] < b["cost"]
    return ge and gt


def pareto_front(points: Sequence[dict]) -> list[dict]:
    return [p for p in points if not any(dominates(q, p) for q in points if q is not p)]


def leader(front: Sequence[dict]) -> dict | None:
    """The front member with the best accuracy (then gain, then lower cost, then earlier)."""
    if not front:
        return None
    return max(front, key=lambda p: (p["accuracy"], p["gain"], -p["cost"], -p["index"]))
