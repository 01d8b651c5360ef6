"""A memory system instantiated from any valid architecture ``(e, s, r, m)``: a ``MemoryProvider`` (the
MemAgent protocol) built on the shared provider substrate (``BaseProvider``: atomic store, keyword index,
embedding matrix, persistence), so the existing rollout injects it like any of the 13 providers.

    from routers.automem import Arch, MemorySystem, build_system, load_system
    mem = MemorySystem(Arch(("trajectory",), "hybrid", "mmr", "json_full"), encoder=my_encoder)
    mem.store(trajectory); mem.retrieve("open the vault in room r3").text
    mem.last_trace        # pool size, retrieved / judge-kept / judge-dropped ids (the diagnosis reads it)
    save_system_config("best_memory.json", arch); mem = load_system("best_memory.json")

Store decides the record and its index: ``json`` (exact key-value records keyed by the source task, BM25),
``vector`` (each unit's text, dense), ``hybrid`` (task key ++ unit text, BM25 + dense), ``graph``
(entity-relation nodes: entities are linked across units, BM25 over entities + text) and ``llm_graph`` (a
temporal knowledge graph: entities by the LLM when configured, BM25 + dense, and a newer node about the same
entities invalidates the older one instead of deleting it). After retrieval an injection judge drops units
sharing no content word with the goal (its kept / dropped ids are the 'judge-rejected' diagnosis signal) and,
with ``guards`` (default), units whose ``avoid_when`` the goal triggers: the goal places an item the unit's task
sought somewhere else (``routers.automem.guards``; their ids are the trace's ``stale``); with ``route_guards``
(default) also units whose successful route took nothing from where the goal sends its item (it leads elsewhere;
``off_route``); with ``world_guards`` (default) units written in another world than the goal's (``other_world``:
the trace's ``other_world``); with ``site_guards`` (default) a unit written from a failed episode when the goal seeks
nothing where the failed task did (``other_site``). With ``world_scope`` (off by default) another world's units are
not candidates at all: retrieval ranks only the goal's world's units, so in a pool of many worlds the ``k`` slots are
not spent on units the world guard then withholds (the trace's ``out_of_scope`` counts them). With ``guards_first``
(off by default) every guard is applied before ranking instead of after it: the ``k`` slots go to the best units that
pass, not to units then withheld (the trace's ``guarded_out`` counts the pool's withheld units per guard). With
``sought_guards`` (off by default) a goal that names its item withholds the units of an episode that took that item
away (``taken``: their route is stale) and the units naming neither the item nor a place the goal names
(``unsought``): ``routers.automem.guards``.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Sequence

from routers.automem.encoders import Encoder, task_pattern, _ID
from routers.automem.guards import (WITHHELD, conflicts, location_facts, off_route, other_site, other_world, taken,
                                    unsought)
from routers.automem.manage import MANAGERS
from routers.automem.retrieval import RETRIEVERS
from routers.automem.space import Arch, as_arch, violations
from routers.memagent.protocol import MemoryItem, Retrieved, Trajectory
from routers.memagent.providers.base import BaseProvider
from routers.memagent.providers.keyword import keyword_tokens
from routers.memagent.providers.text_limits import limit_words

SYSTEM_FORMAT = "memroute.automem.system"
SYSTEM_SCHEMA_VERSION = 1
STORE_INDEX = {"json": "keyword", "vector": "dense", "hybrid": "hybrid", "graph": "keyword", "llm_graph": "hybrid"}


class MemorySystem(BaseProvider):
    """One architecture as a memory provider. ``llm`` (a ``routers.backends`` backend) makes the Encode writers,
    llm_graph entity extraction and HyDE use it; ``encoder`` embeds keys (a trained ``RetrieverRouter`` export
    plugs in here for contrastive retrieval); ``k`` units are retrieved, at most ``max_words`` injected;
    ``judge`` / ``guards`` / ``route_guards`` / ``world_guards`` / ``site_guards`` switch the injection judge's
    goal-overlap, avoid_when, route, world and failure-site checks; ``world_scope`` retrieves within the goal's
    world only; ``guards_first`` applies the guards to the pool before ranking; ``trajectory_facts`` has the rule
    trajectory writer keep the sentences of each observation that name what the trace acted on (``encoders``)."""

    name, family, gate = "automem", "insight", "all"
    reference = "AutoMem (seed 003): Encode / Store / Retrieve / Manage"

    def __init__(self, arch, encoder=None, llm=None, *, k: int = 3, max_words: int = 120, max_items: int = 200,
                 judge: bool = True, guards: bool = True, route_guards: bool = True, world_guards: bool = True,
                 site_guards: bool = True, world_scope: bool = False, guards_first: bool = False,
                 trajectory_facts: bool = False, sought_guards: bool = False, llm_encode: bool = True, **kw):
        arch = as_arch(arch)
        problems = violations(arch)
        if problems:
            raise ValueError(f"invalid architecture {arch.key}: {'; '.join(problems)}")
        if max_words < 1 or max_items < 1:
            raise ValueError("max_words and max_items must be >= 1")
        self.arch = arch
        self.retrieval = STORE_INDEX[arch.store]
        self.dense_weight = 0.5
        self.output_word_limit = max_words
        self.max_items = max_items
        self.judge = judge
        self.guards = guards
        self.route_guards = route_guards
        self.world_guards = world_guards
        self.site_guards = site_guards
        self.world_scope = world_scope
        self.guards_first = guards_first
        self.trajectory_facts = trajectory_facts
        self.sought_guards = sought_guards
        super().__init__(encoder=encoder, llm=llm, k=k, **kw)
        self.encode_units = Encoder(arch.encode, ask=self._ask if (llm is not None and llm_encode) else None,
                                    max_prompt_words=self.max_prompt_words, trajectory_facts=trajectory_facts)
        self.last_trace: dict = {}

    def describe_storage(self) -> str:
        return f"Encodes {'+'.join(self.arch.encode)} units into a {self.arch.store} store; manage: {self.arch.manage}."

    def describe_retrieval(self) -> str:
        return f"{self.arch.retrieve} retrieval of {self.k} units (at most {self.output_word_limit} words)."

    def params(self) -> dict:
        return {**super().params(), "arch": self.arch.to_dict(), "max_items": self.max_items, "judge": self.judge,
                "guards": self.guards, "route_guards": self.route_guards, "world_guards": self.world_guards,
                "site_guards": self.site_guards, "world_scope": self.world_scope,
                "guards_first": self.guards_first, "trajectory_facts": self.trajectory_facts,
                "sought_guards": self.sought_guards}

    # -- store ---------------------------------------------------------------------------------------------
    def _entities(self, goal: str, text: str) -> list[str]:
        if self.arch.store == "llm_graph" and self.llm is not None:
            out = self._ask("List the entities (names, ids, objects, places) this memory is about, comma-separated.",
                            f"Task: {goal}\nMemory: {text}", 48)
            ents = [e.strip().lower() for e in out.split(",") if e.strip()]
            if ents:
                return sorted(set(ents))[:12]
        ids = {m.lower() for m in _ID.findall(f"{goal} {text}")}
        return sorted(ids | set(keyword_tokens(goal)[:6]))[:12]

    def _key(self, goal: str, unit_key: str, text: str, entities: Sequence[str]) -> str:
        store = self.arch.store
        if store == "json":
            return goal
        if store == "vector":
            return text
        if store == "hybrid":
            return f"{goal} :: {text}"
        return f"{' '.join(entities)} :: {unit_key}"

    def _write(self, trajectory: Trajectory, items: tuple[MemoryItem, ...]) -> list[MemoryItem]:
        goal = trajectory.task.goal
        new = []
        for unit in self.encode_units(trajectory):
            ents = self._entities(goal, unit.text) if self.arch.store in ("graph", "llm_graph") else []
            key = self._key(goal, unit.key, unit.text, ents)
            if not key.strip() or not unit.text.strip():
                continue
            t = self._next_id
            meta = {**unit.meta, "kind": unit.kind, "record_key": goal, "t": t}
            if ents:
                meta["entities"] = ents
            new.append(self._new_item(trajectory, key, unit.text, **meta))
        self._pending["units_written"] += len(new)
        items = list(items)
        if self.arch.store == "llm_graph":  # temporal KG: a newer node about the same entities invalidates
            sigs = {(it.meta["kind"], tuple(it.meta.get("entities", ()))): it.meta["t"] for it in new}
            items = [dataclasses.replace(it, meta={**it.meta, "valid_to": sigs[s]})
                     if (s := (it.meta.get("kind"), tuple(it.meta.get("entities", ())))) in sigs
                     and "valid_to" not in it.meta else it for it in items]
        before = len(items) + len(new)
        kept = MANAGERS[self.arch.manage]([*items, *new], self.max_items)
        self._pending["managed_out"] += before - len(kept)
        return kept

    # -- retrieve ------------------------------------------------------------------------------------------
    def retrieve(self, goal: str) -> Retrieved:
        st = self._state
        live = [i for i, it in enumerate(st.items) if "valid_to" not in it.meta]
        self.last_trace = {"pool": len(live), "retrieved": [], "kept": [], "dropped": [],
                           **{name: [] for name in WITHHELD}}
        if self.world_scope:  # another world's units never compete for the k slots
            scoped = [i for i in live if not other_world(st.items[i].meta.get("world"), goal)]
            self.last_trace["out_of_scope"] = len(live) - len(scoped)
            live = scoped
        facts = location_facts(goal) if (self.guards or self.route_guards or self.site_guards) else {}
        if self.guards_first:  # withheld units never compete for the k slots
            why = {i: self._withheld_by(st.items[i], goal, facts) for i in live}
            self.last_trace["guarded_out"] = dict(Counter(w for w in why.values() if w))
            live = [i for i in live if why[i] is None]
        if not live:
            return Retrieved(self.name, "", [])
        base = self.score_items(*self.query(goal), state=st)
        ranked = RETRIEVERS[self.arch.retrieve](self, goal, live, base, self.k)
        q = set(keyword_tokens(goal))
        pattern = task_pattern(goal)
        kept, dropped = [], []
        withheld: dict[str, list[int]] = {name: [] for name in WITHHELD}
        for i in ranked:
            it = st.items[i]
            why = self._withheld_by(it, goal, facts)
            if why:
                withheld[why].append(i)
                continue
            ok = (not self.judge or it.meta.get("use_when") == pattern
                  or bool(q & set(keyword_tokens(f"{it.key} {it.text}"))))
            (kept if ok else dropped).append(i)
        picked = [st.items[i] for i in kept]
        text, _ = limit_words(self._render(goal, picked), self.output_limit)
        self.last_trace.update(retrieved=[st.items[i].item_id for i in ranked],
                               kept=[it.item_id for it in picked], dropped=[st.items[i].item_id for i in dropped],
                               **{name: [st.items[i].item_id for i in ids] for name, ids in withheld.items()},
                               scores=[round(float(base[i]), 4) for i in ranked])
        return Retrieved(self.name, text, [it.item_id for it in picked])

    def _withheld_by(self, it: MemoryItem, goal: str, facts: dict) -> str | None:
        """The trace key of the first guard that withholds ``it`` from ``goal`` (None: it passes every guard on)."""
        if self.world_guards and other_world(it.meta.get("world"), goal):
            return "other_world"
        if self.sought_guards and taken(it.meta.get("took"), goal):
            return "taken"
        if self.sought_guards and unsought(f"{it.key} {it.text}", goal, facts):
            return "unsought"
        if facts and self.guards and conflicts(it.meta.get("avoid_when"), facts):
            return "stale"
        if facts and self.route_guards and off_route(it.meta.get("route_to"), facts):
            return "off_route"
        if (facts and self.site_guards and it.meta.get("outcome") == "failure"
                and other_site(it.meta.get("avoid_when"), facts)):
            return "other_site"
        return None

    def _render(self, goal, items) -> str:
        parts = []
        for it in items:
            label = it.meta.get("kind", "memory")
            if self.arch.retrieve == "contrastive" and it.meta.get("outcome") != "success":
                label = f"contrast: failed {label}"
            parts.append(f"[{label}] {it.text}")
        return "\n\n".join(parts)

    def items_by_id(self) -> dict[str, MemoryItem]:
        return {it.item_id: it for it in self._state.items}


# -- the loadable memory-system config ----------------------------------------------------------------------
SYSTEM_OPTIONS = ("k", "max_words", "max_items", "judge", "guards", "route_guards", "world_guards", "site_guards",
                  "world_scope", "guards_first", "trajectory_facts", "sought_guards")


def system_config(arch, *, encoder: str | None = None, llm: str | None = None, retriever: str | None = None,
                  metrics: dict | None = None, **options) -> dict:
    """The JSON an exported architecture is: format, the tuple, the system options and how it was measured."""
    arch = as_arch(arch)
    bad = sorted(set(options) - set(SYSTEM_OPTIONS))
    if bad:
        raise ValueError(f"unknown memory-system option(s) {bad}; choose from {list(SYSTEM_OPTIONS)}")
    problems = violations(arch)
    if problems:
        raise ValueError(f"invalid architecture {arch.key}: {'; '.join(problems)}")
    return {"format": SYSTEM_FORMAT, "schema_version": SYSTEM_SCHEMA_VERSION, "arch": arch.to_dict(), "key": arch.key,
            "options": dict(options), "encoder": encoder, "llm": llm, "retriever": retriever, "metrics": metrics or {}}


def save_system_config(path, arch, **kw) -> dict:
    from routers.io import atomic_write_json

    cfg = system_config(arch, **kw)
    atomic_write_json(path, cfg)
    return cfg


def read_system_config(path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "memory_system.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable memory-system config ({err})") from None
    if not isinstance(cfg, dict) or cfg.get("format") != SYSTEM_FORMAT:
        raise ValueError(f"{path}: format must be {SYSTEM_FORMAT!r}")
    if cfg.get("schema_version") != SYSTEM_SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {cfg.get('schema_version')!r} (this memroute reads "
                         f"{SYSTEM_SCHEMA_VERSION})")
    system_config(Arch.from_dict(cfg["arch"]), **cfg.get("options", {}))  # validates
    return cfg


def build_system(arch_or_config, encoder=None, llm=None, **options) -> MemorySystem:
    """A :class:`MemorySystem` from an architecture or a config dict. ``encoder`` / ``llm`` objects override the
    config's names; a config's ``retriever`` (a RetrieverRouter export directory) becomes the encoder when the
    architecture retrieves contrastively."""
    if isinstance(arch_or_config, dict) and arch_or_config.get("format") == SYSTEM_FORMAT:
        cfg = arch_or_config
        options = {**cfg.get("options", {}), **options}
        if encoder is None:
            arch = Arch.from_dict(cfg["arch"])
            encoder = (cfg.get("retriever") if arch.retrieve == "contrastive" and cfg.get("retriever")
                       else cfg.get("encoder"))
            if encoder and Path(str(encoder)).is_dir() and (Path(str(encoder)) / "router_config.json").exists():
                from routers.retriever import RetrieverRouter

                encoder = RetrieverRouter.from_pretrained(encoder)
        if llm is None and cfg.get("llm"):
            from routers.backends import make_backend

            llm = make_backend(cfg["llm"])
        return MemorySystem(Arch.from_dict(cfg["arch"]), encoder=encoder, llm=llm, **options)
    return MemorySystem(as_arch(arch_or_config), encoder=encoder, llm=llm, **options)


def load_system(path, encoder=None, llm=None, **options) -> MemorySystem:
    """Instantiate an exported architecture (``memory_system.json`` or its directory)."""
    return build_system(read_system_config(path), encoder=encoder, llm=llm, **options)
