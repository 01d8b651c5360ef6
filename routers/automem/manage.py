"""Manage: how the memory pool evolves (seed 003 §3.1). Each op maps the complete next item list (old items +
the new ones, oldest first) to the kept list; items are ``MemoryItem`` with ``meta['record_key']`` (the source
task goal), ``meta['kind']`` (unit type), ``meta['t']`` (write order) and, in graph stores, ``meta['entities']``.

* ``lightweight`` (forget): a newer item with the same key and unit type supersedes the older one; the pool is capped at
  ``max_items`` by forgetting the oldest.
* ``json_full`` (merge + update): one record per (source task, unit type): the newer write updates it; items
  with identical text are merged (``meta['merged']`` counts them).
* ``tool_manager`` (validate): procedural units (workflow, shortcut) are kept only from successful tasks and
  deduplicated by key (the newest wins, ``meta['validated']`` counts confirmations); other units untouched.
* ``graph_consolidate`` (merge + evolve): nodes with the same unit type and entity set are merged, the newer
  text evolving the older node (its links are kept, ``meta['evolved']`` counts updates).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from routers.memagent.protocol import MemoryItem


def _cap(items: list[MemoryItem], max_items: int) -> list[MemoryItem]:
    return items[-max_items:] if max_items and len(items) > max_items else items


def _newest_by(items: Sequence[MemoryItem], key: Callable[[MemoryItem], object],
               merge: Callable[[MemoryItem, MemoryItem], MemoryItem] | None = None) -> list[MemoryItem]:
    """Keep the newest item per ``key`` (at the newest one's position); ``merge(old, new)`` builds the kept one."""
    last: dict = {}
    for i, it in enumerate(items):
        last[key(it)] = i
    out, acc = [], {}
    for i, it in enumerate(items):
        k = key(it)
        if merge is not None and k in acc:
            acc[k] = merge(acc[k], it)
        elif merge is not None:
            acc[k] = it
        if last[k] == i:
            out.append(acc[k] if merge is not None else it)
    return out


def lightweight(items, max_items: int = 200):
    return _cap(_newest_by(items, lambda it: (it.key, it.meta.get("kind"))), max_items)


def json_full(items, max_items: int = 200):
    def merge(old: MemoryItem, new: MemoryItem) -> MemoryItem:
        n = int(old.meta.get("merged", 1)) + 1
        return dataclasses.replace(new, meta={**new.meta, "merged": n, "updated_from": old.item_id})

    items = _newest_by(items, lambda it: " ".join(it.text.split()).lower())  # dedupe identical texts
    return _cap(_newest_by(items, lambda it: (it.meta.get("record_key", it.key), it.meta.get("kind")), merge),
                max_items)


def tool_manager(items, max_items: int = 200):
    procedural = ("workflow", "shortcut")
    kept = [it for it in items if it.meta.get("kind") not in procedural or it.meta.get("outcome") == "success"]

    def merge(old, new):
        return dataclasses.replace(new, meta={**new.meta, "validated": int(old.meta.get("validated", 1)) + 1})

    def key(it):
        return ("proc", it.key) if it.meta.get("kind") in procedural else ("id", it.item_id)

    return _cap(_newest_by(kept, key, merge), max_items)


def graph_consolidate(items, max_items: int = 200):
    def merge(old, new):
        links = sorted(set(old.meta.get("links", [])) | set(new.meta.get("links", [])) | {old.item_id})
        return dataclasses.replace(new, meta={**new.meta, "links": links,
                                              "evolved": int(old.meta.get("evolved", 0)) + 1})

    return _cap(_newest_by(items, lambda it: (it.meta.get("kind"), tuple(sorted(it.meta.get("entities", ())))),
                           merge), max_items)


MANAGERS: dict[str, Callable] = {"lightweight": lightweight, "json_full": json_full, "tool_manager": tool_manager,
                                 "graph_consolidate": graph_consolidate}
