"""Experience-guided candidate proposal (EGAS, seed 003 §4.2). ``RuleProposer`` (default) and ``LLMProposer``
(any ``routers.backends`` backend) share one interface:

    proposals = proposer.propose(ctx, k)        # ctx: SearchContext (leader, front, ledger, graph, gradient)
    proposer.resample(ctx, rejected, rng)       # a replacement for an invalid / duplicate proposal

A proposal is ``Proposal(arch, origin, parent, edit, entry_id)``; it may be invalid (the search's checker
rejects, counts and resamples it). Rule proposer, per round: the gradient's recommended single-coordinate
edits of the leader (skipping refuted / dead-end edits; each tied to a ledger entry for differential
validation), active principles not yet applied to the leader, then an exploration edit chosen by the
observation graph (optimistic for untried options). An exploration edit the constraints forbid on its own (the
leader's ``graph | ... | graph_consolidate`` cannot take a ``hybrid`` store) is repaired by one other module's change
(``Proposal.repair``): otherwise coupled choices trap the search in one region of the space. With the search's
``swap_inert``, an Encode addition of the leader that left the agent's behaviour unchanged (``SearchContext.inert``: the
added form's units sat behind the others under the word limit) comes back first, in place of forms the diagnosis ranks
below it: a swap (the addition plus the removal of the lower form whose units the candidate kept most), then a focus
(the addition with every lower form removed).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field

from routers.automem.diagnosis import FORM_ORDER
from routers.automem.ledger import Ledger, ObservationGraph
from routers.automem.space import (ENCODE, KNOWN_SYSTEMS, MENU, MODULES, Arch, as_arch, feasible_space, neighbors,
                                   valid)


@dataclass
class Proposal:
    arch: Arch
    origin: str                      # init | gradient | principle | explore | structure | resample | llm | restart
                                     # | stagnation | swap | focus
    parent: str | None = None        # the leader's key the edit was applied to
    edit: list | None = None         # [module, option]
    entry_id: str | None = None      # the ledger entry this proposal tests
    repair: list | None = None       # [module, option, ...]: the other change(s) that make ``edit`` valid / tested

    def to_dict(self) -> dict:
        return {"arch": self.arch.key, "origin": self.origin, "parent": self.parent, "edit": self.edit,
                "entry_id": self.entry_id, **({"repair": self.repair} if self.repair else {})}


@dataclass
class SearchContext:
    round: int
    rng: random.Random
    leader: Arch | None
    front: list = field(default_factory=list)
    ledger: Ledger = field(default_factory=Ledger)
    graph: ObservationGraph = field(default_factory=ObservationGraph)
    gradient: dict | None = None
    evaluated: set = field(default_factory=set)
    init: str = "random"
    inert: dict = field(default_factory=dict)  # candidate key -> {parent, edit, entry_id, kinds}: no behaviour change


def _apply(arch: Arch, module: str, option: str) -> Arch | None:
    if module == "encode":
        if option[:1] == "+" and option[1:] in arch.encode:
            return None
        if option[:1] == "-" and (option[1:] not in arch.encode or len(arch.encode) == 1):
            return None
    elif getattr(arch, module) == option:
        return None
    return arch.edit(module, option)


def _options(module: str) -> list[str]:
    """A module's edit options: encoders as ``+x`` / ``-x``, other modules as their menu."""
    return [f"+{e}" for e in ENCODE] + [f"-{e}" for e in ENCODE] if module == "encode" else list(MENU[module])


def _optimistic(ctx: SearchContext, module: str, option: str) -> float:
    """Observed mean gain of a choice (negated for removing an encoder) plus a bonus shrinking with its trials."""
    mean, n = ctx.graph.mean(module, option.lstrip("+-"))
    return (-mean if option.startswith("-") else mean) + 0.3 / (1 + n) ** 0.5


class RuleProposer:
    name = "rule"

    def propose(self, ctx: SearchContext, k: int) -> list[Proposal]:
        if ctx.leader is None:
            return self._init(ctx, k)
        seen = set(ctx.evaluated)
        out: list[Proposal] = self.swaps(ctx, seen)[:k]
        seen |= {p.arch.key for p in out}
        grad = ctx.gradient or {}
        edits = (grad.get("recommended_edit") or {}).get("edits", [])
        cond = grad.get("failure_mode") or ""
        for module, option in edits:
            if len(out) >= k:
                break
            if ctx.ledger.blocked([module, option]):
                continue
            arch = _apply(ctx.leader, module, option)
            if arch is None or arch.key in seen:
                continue
            entry = ctx.ledger.propose(cond, [module, option], {"round": ctx.round, "proposed_on": ctx.leader.key,
                                                                 "gradient_ids": grad.get("evidence_ids", [])})
            out.append(Proposal(arch, "gradient", ctx.leader.key, [module, option], entry.entry_id))
            seen.add(arch.key)
        for e in ctx.ledger.active():
            if len(out) >= k:
                break
            arch = _apply(ctx.leader, *e.edit)
            if arch is not None and arch.key not in seen and not ctx.ledger.blocked(e.edit):
                out.append(Proposal(arch, "principle", ctx.leader.key, list(e.edit), e.entry_id))
                seen.add(arch.key)
        while len(out) < k:
            p = self.explore(ctx, seen)
            if p is None:
                break
            out.append(p)
            seen.add(p.arch.key)
        return out

    def swaps(self, ctx: SearchContext, seen: set) -> list[Proposal]:
        """The leader's inert Encode additions (``+x`` that changed no task's outcome or step count) retried in
        place of forms the diagnosis ranks below ``x`` (``FORM_ORDER``): an addition the word limit cut behind other
        units was never shown to the agent, so it was not tested. First the swap ``+x -y`` (``y`` the lower form
        the inert candidate kept most; the addition's differential test), then the focus: ``x`` with every lower
        form removed (a further candidate, tied to no ledger entry)."""
        out = []
        for key, info in ctx.inert.items():
            module, option = info.get("edit") or ("", "")
            if info.get("parent") != ctx.leader.key or module != "encode" or option[:1] != "+" \
                    or ctx.ledger.blocked([module, option]) or option[1:] not in FORM_ORDER:
                continue
            kinds = info.get("kinds") or {}
            lower = [e for e in ctx.leader.encode if e in FORM_ORDER
                     and FORM_ORDER.index(e) > FORM_ORDER.index(option[1:])]
            ranked = sorted((e for e in lower if kinds.get(e)), key=lambda e: -kinds[e])
            added = Arch.parse(key)
            for kind in ranked:
                arch = _apply(added, "encode", f"-{kind}")
                if arch is not None and valid(arch) and arch.key not in seen:
                    out.append(Proposal(arch, "swap", ctx.leader.key, [module, option], info.get("entry_id"),
                                        repair=["encode", f"-{kind}"]))
                    seen = seen | {arch.key}
                    break
            focus = added.edit("encode", tuple(e for e in added.encode if e not in lower))
            if len(lower) > 1 and valid(focus) and focus.key not in seen:
                out.append(Proposal(focus, "focus", ctx.leader.key, [module, option],  # the swap tests the entry
                                    repair=["encode", *(f"-{e}" for e in sorted(lower))]))
                seen = seen | {focus.key}
        return out

    def _init(self, ctx: SearchContext, k: int) -> list[Proposal]:
        if ctx.init == "known":
            names = sorted(KNOWN_SYSTEMS)
            ctx.rng.shuffle(names)
            return [Proposal(KNOWN_SYSTEMS[n], "init") for n in names[:k]]
        space = feasible_space()
        return [Proposal(a, "init") for a in ctx.rng.sample(space, k)]

    def explore(self, ctx: SearchContext, seen: set, modules: tuple = MODULES,
                origin: str = "explore") -> Proposal | None:
        """The leader edited on one of ``modules`` toward the option with the best optimistic observed gain; an edit
        the constraints forbid alone competes as its best-scored repair (the edit plus one other module's change)."""
        cands = []
        for module in modules:
            for opt in _options(module):
                if ctx.ledger.blocked([module, opt]):
                    continue
                arch = _apply(ctx.leader, module, opt)
                if arch is None:
                    continue
                repair = None
                if not valid(arch):
                    fixes = [(_optimistic(ctx, m2, o2), m2, o2, fixed) for m2 in MODULES if m2 != module
                             for o2 in _options(m2) if not ctx.ledger.blocked([m2, o2])
                             for fixed in [_apply(arch, m2, o2)]
                             if fixed is not None and valid(fixed) and fixed.key not in seen]
                    if not fixes:
                        continue
                    _, m2, o2, arch = max(fixes, key=lambda f: f[0])
                    repair = [m2, o2]
                elif arch.key in seen:
                    continue
                cands.append((_optimistic(ctx, module, opt) + 1e-3 * ctx.rng.random(), module, opt, arch, repair))
        if not cands:
            return None
        _, module, opt, arch, repair = max(cands, key=lambda c: c[0])
        return Proposal(arch, origin, ctx.leader.key, [module, opt], repair=repair)

    def resample(self, ctx: SearchContext, rejected: Proposal, rng: random.Random) -> Proposal:
        """Repair an invalid proposal (keep its edit, change one other module, else two), else a random unevaluated
        neighbor of the leader, else a random valid architecture."""
        others = [m for m in MODULES if not (rejected.edit and m == rejected.edit[0])]
        fixes = [a for m in others for a in neighbors(rejected.arch, m) if valid(a) and a.key not in ctx.evaluated]
        if not fixes and rejected.edit:  # coupled choices: a graph store left needs both graph retrieval and
            #                              graph_consolidate changed; one change cannot keep the edit (session 43)
            fixes = [b for i, m1 in enumerate(others) for m2 in others[i + 1:] for a in neighbors(rejected.arch, m1)
                     for b in neighbors(a, m2) if valid(b) and b.key not in ctx.evaluated]
        if fixes:
            return Proposal(rng.choice(fixes), "resample", rejected.parent, rejected.edit, rejected.entry_id)
        if ctx.leader is not None:
            near = [a for m in MODULES for a in neighbors(ctx.leader, m) if valid(a) and a.key not in ctx.evaluated]
            if near:
                return Proposal(rng.choice(near), "resample", ctx.leader.key)
        pool = [a for a in feasible_space() if a.key not in ctx.evaluated]
        return Proposal(rng.choice(pool or feasible_space()), "resample")


class LLMProposer(RuleProposer):
    """The proposer LLM reads the front, the ledger, the graph's best choices and the gradient and answers
    JSON architectures; unparsable answers fall back to the rule proposer (counted in ``fallbacks``)."""

    name = "llm"

    def __init__(self, llm, max_new_tokens: int = 400):
        self.llm = llm
        self.max_new_tokens = max_new_tokens
        self.fallbacks = 0

    def propose(self, ctx: SearchContext, k: int) -> list[Proposal]:
        if ctx.leader is None:
            return self._init(ctx, k)
        prompt = {"menu": {m: list(MENU[m]) for m in MODULES}, "leader": ctx.leader.to_dict(),
                  "front": ctx.front[:6], "gradient": ctx.gradient,
                  "ledger": [e.to_dict() for e in ctx.ledger.entries[-12:]],
                  "constraints": "graph retrieval and graph_consolidate need store graph|llm_graph; contrastive, hyde, "
                                 "mmr need store vector|hybrid|llm_graph; json_full needs store json|hybrid; "
                                 "tool_manager needs encode workflow or shortcut"}
        try:
            out = self.llm.generate([[{"role": "system", "content":
                                       f"You propose {k} memory architectures as a JSON list of objects with keys "
                                       "encode (list), store, retrieve, manage. Change one module of the leader each."},
                                      {"role": "user", "content": json.dumps(prompt)}]], self.max_new_tokens)[0] or ""
            m = re.search(r"\[.*\]", out, re.DOTALL)
            archs = [as_arch(d) for d in json.loads(m.group(0))][:k] if m else []
        except Exception:  # noqa: BLE001 - a bad answer falls back to the rules
            archs = []
        if not archs:
            self.fallbacks += 1
            return super().propose(ctx, k)
        props = []
        for a in archs:
            diff = a.diff(ctx.leader)
            edit = [diff[0], getattr(a, diff[0]) if diff[0] != "encode" else list(a.encode)] if len(diff) == 1 else None
            props.append(Proposal(a, "llm", ctx.leader.key, edit))
        return props
