"""The AutoMem search space (seed 003 §3.1, appendix C): a memory architecture is a tuple ``(e, s, r, m)`` of
Encode, Store, Retrieve and Manage choices; ``valid`` applies the cross-module constraints.

    from routers.automem.space import Arch, valid, violations, all_archs
    a = Arch(("trajectory", "insight"), "hybrid", "mmr", "json_full")
    valid(a)                       # True
    violations(Arch(("tip",), "json", "graph", "lightweight"))   # ['retrieve graph needs a graph-family store ...']

Encode is a non-empty set of unit types (combinations allowed; kept sorted in menu order so one architecture
has one key). The constraints (what each module needs from the others):

* graph retrieval (multi-hop traversal) and graph_consolidate (merge + evolve nodes) need a graph-family store
  (``graph``, ``llm_graph``);
* the embedding retrievers (contrastive, hyde, mmr) need a store that keeps a dense index (``vector``,
  ``hybrid``, ``llm_graph``);
* json_full (merge + update keyed records) needs keyed records (``json``, ``hybrid``);
* tool_manager (validates procedural units) needs a procedural encoder (``workflow`` or ``shortcut``).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Iterable, Sequence

ENCODE = ("tip", "insight", "trajectory", "workflow", "shortcut")
STORE = ("json", "vector", "hybrid", "graph", "llm_graph")
RETRIEVE = ("hybrid", "contrastive", "cbr_rerank", "graph", "hyde", "mmr")
MANAGE = ("lightweight", "json_full", "tool_manager", "graph_consolidate")
MODULES = ("encode", "store", "retrieve", "manage")
MODULE_LETTER = {"encode": "E", "store": "S", "retrieve": "R", "manage": "M"}
LETTER_MODULE = {v: k for k, v in MODULE_LETTER.items()}
MENU = {"encode": ENCODE, "store": STORE, "retrieve": RETRIEVE, "manage": MANAGE}

GRAPH_STORES = ("graph", "llm_graph")
DENSE_STORES = ("vector", "hybrid", "llm_graph")
KEYED_STORES = ("json", "hybrid")
DENSE_RETRIEVERS = ("contrastive", "hyde", "mmr")
PROCEDURAL = ("workflow", "shortcut")


@dataclass(frozen=True)
class Arch:
    """One memory architecture ``(encode, store, retrieve, manage)``; ``encode`` is normalized to menu order."""

    encode: tuple[str, ...]
    store: str
    retrieve: str
    manage: str

    def __post_init__(self):
        enc = self.encode
        if isinstance(enc, str):
            enc = tuple(e for e in enc.replace("+", ",").split(",") if e)
        enc = tuple(dict.fromkeys(enc))
        order = {e: i for i, e in enumerate(ENCODE)}
        object.__setattr__(self, "encode", tuple(sorted(enc, key=lambda e: (order.get(e, len(order)), e))))

    @property
    def key(self) -> str:
        return f"{'+'.join(self.encode)}|{self.store}|{self.retrieve}|{self.manage}"

    def __str__(self) -> str:
        return self.key

    def to_dict(self) -> dict:
        return {"encode": list(self.encode), "store": self.store, "retrieve": self.retrieve, "manage": self.manage}

    @classmethod
    def from_dict(cls, d: dict) -> "Arch":
        missing = [m for m in MODULES if m not in d]
        if missing:
            raise ValueError(f"architecture is missing {missing} (needs {list(MODULES)})")
        enc = d["encode"]
        if not isinstance(enc, (list, tuple, str)):
            raise ValueError(f"encode must be a list of unit types, got {enc!r}")
        return cls(tuple(enc) if not isinstance(enc, str) else enc, str(d["store"]), str(d["retrieve"]),
                   str(d["manage"]))

    @classmethod
    def parse(cls, key: str) -> "Arch":
        parts = key.split("|")
        if len(parts) != 4:
            raise ValueError(f"architecture key must be 'encode+...|store|retrieve|manage', got {key!r}")
        return cls(parts[0], parts[1], parts[2], parts[3])

    def choices(self) -> list[tuple[str, str]]:
        """(module, option) pairs, one per encoder plus store, retrieve and manage (observation-graph edges)."""
        return [("encode", e) for e in self.encode] + [("store", self.store), ("retrieve", self.retrieve),
                                                       ("manage", self.manage)]

    def edit(self, module: str, option) -> "Arch":
        """The architecture with one coordinate changed (``encode``: a tuple, or ``+x`` / ``-x`` to add / drop)."""
        if module == "encode":
            if isinstance(option, str) and option[:1] in "+-":
                cur = set(self.encode)
                cur = cur | {option[1:]} if option[0] == "+" else cur - {option[1:]}
                option = tuple(cur)
            return Arch(tuple(option), self.store, self.retrieve, self.manage)
        if module not in MODULES:
            raise ValueError(f"module must be one of {MODULES}, got {module!r}")
        d = self.to_dict()
        d[module] = option
        return Arch.from_dict(d)

    def diff(self, other: "Arch") -> list[str]:
        return [m for m in MODULES if getattr(self, m) != getattr(other, m)]


def violations(arch: Arch) -> list[str]:
    """Why ``arch`` is not in the feasible space (empty list: valid)."""
    out = []
    if not arch.encode:
        out.append("encode needs at least one unit type")
    for e in arch.encode:
        if e not in ENCODE:
            out.append(f"unknown encode option {e!r} (choose from {list(ENCODE)})")
    for module in ("store", "retrieve", "manage"):
        if getattr(arch, module) not in MENU[module]:
            out.append(f"unknown {module} option {getattr(arch, module)!r} (choose from {list(MENU[module])})")
    if out:
        return out
    if arch.retrieve == "graph" and arch.store not in GRAPH_STORES:
        out.append(f"retrieve graph needs a graph-family store {list(GRAPH_STORES)}, got {arch.store!r}")
    if arch.manage == "graph_consolidate" and arch.store not in GRAPH_STORES:
        out.append(f"manage graph_consolidate needs a graph-family store {list(GRAPH_STORES)}, got {arch.store!r}")
    if arch.retrieve in DENSE_RETRIEVERS and arch.store not in DENSE_STORES:
        out.append(f"retrieve {arch.retrieve} needs a store with a dense index {list(DENSE_STORES)}, got {arch.store!r}")
    if arch.manage == "json_full" and arch.store not in KEYED_STORES:
        out.append(f"manage json_full needs keyed records {list(KEYED_STORES)}, got {arch.store!r}")
    if arch.manage == "tool_manager" and not set(arch.encode) & set(PROCEDURAL):
        out.append(f"manage tool_manager validates procedural units: encode needs one of {list(PROCEDURAL)}")
    return out


def valid(arch) -> bool:
    """``Valid(e, s, r, m)``: True when ``arch`` (an :class:`Arch`, dict or key) is in the feasible space."""
    try:
        arch = as_arch(arch)
    except (ValueError, TypeError):
        return False
    return not violations(arch)


def as_arch(arch) -> Arch:
    if isinstance(arch, Arch):
        return arch
    if isinstance(arch, str):
        return Arch.parse(arch)
    if isinstance(arch, dict):
        return Arch.from_dict(arch)
    if isinstance(arch, (tuple, list)) and len(arch) == 4:
        return Arch(*arch)
    raise TypeError(f"not an architecture: {arch!r}")


def encode_subsets(options: Sequence[str] = ENCODE) -> list[tuple[str, ...]]:
    return [c for n in range(1, len(options) + 1) for c in itertools.combinations(options, n)]


def all_archs() -> list[Arch]:
    """Every valid architecture, in a fixed order."""
    return [a for e in encode_subsets() for s in STORE for r in RETRIEVE for m in MANAGE
            if valid(a := Arch(e, s, r, m))]


def sample_arch(rng: random.Random, space: Sequence[Arch] | None = None) -> Arch:
    """Uniform over the valid space (``a ~ Unif(A)``)."""
    return rng.choice(list(space) if space is not None else _space())


_SPACE: list[Arch] = []


def _space() -> list[Arch]:
    if not _SPACE:
        _SPACE.extend(all_archs())
    return _SPACE


def feasible_space() -> list[Arch]:
    """``all_archs()``, computed once per process."""
    return _space()


def neighbors(arch: Arch, module: str, exclude: Iterable[str] = ()) -> list[Arch]:
    """Single-coordinate edits of ``arch`` on ``module`` (valid or not: the caller checks)."""
    exclude = set(exclude)
    if module == "encode":
        out = [arch.edit("encode", f"+{e}") for e in ENCODE if e not in arch.encode and e not in exclude]
        out += [arch.edit("encode", f"-{e}") for e in arch.encode if len(arch.encode) > 1 and e not in exclude]
        return out
    return [arch.edit(module, o) for o in MENU[module] if o != getattr(arch, module) and o not in exclude]


# Human-designed memory systems as points of the space (seed 003 Table 1, as far as a tuple captures them).
KNOWN_SYSTEMS = {
    "expel": Arch(("insight", "trajectory"), "vector", "hybrid", "lightweight"),
    "awm": Arch(("workflow",), "vector", "hybrid", "tool_manager"),
    "voyager": Arch(("shortcut",), "vector", "hybrid", "tool_manager"),
    "memorybank": Arch(("trajectory",), "vector", "hybrid", "lightweight"),
    "mem0": Arch(("tip", "insight"), "hybrid", "hybrid", "json_full"),
    "zep": Arch(("trajectory",), "llm_graph", "graph", "graph_consolidate"),
    "a_mem": Arch(("insight",), "graph", "graph", "graph_consolidate"),
    "memento": Arch(("trajectory",), "json", "cbr_rerank", "lightweight"),
}
