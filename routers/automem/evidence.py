"""Evidence annotations for the persistent-world suite, so the failure diagnosis can tell where a failure lost
the route (seed 003 §4.3 reads evidence ids; without them every failure with injected memory is ``retrieval_noise``).

A repeat visit ("find the black whisk in the coffer") is decided by the route of an earlier delivery from the same
holder in the same world: its evidence is that delivery's action text ("take silver ladle from coffer"; object
names are unique to a world and site), its sources the earlier objects (a unit written from their episodes), and
``follow`` the holder (an agent that acted on it followed the route). ``RolloutEvaluator`` then records
``evidence_in_pool / retrieved / injected / followed`` per failure and the diagnosis tells extraction gaps, retrieval
misses, judge rejections, noise and units the agent could not act on apart. In an unseen world (nothing delivered,
no sibling) a site's later tasks get the earlier tasks' objects of the same site: the agent's own episodes there (out
of scope by the diagnosis when none of them took its object). Moved-object tasks get none: their route was never seen
(out of scope; the guards decide them), and neither do first visits or unseen worlds' first tasks.
"""

from __future__ import annotations

from typing import Mapping, Sequence


def world_evidence(meta: Mapping, objects: Mapping[str, str]) -> dict:
    """``{"evidence": [...], "sources": [...], "follow": [holder]}`` of one world task (empty when memory holds no
    route for it).
    ``objects``: the world's object -> holder map."""
    holder = meta.get("holder")
    if meta.get("family") != "fetch" or meta.get("demonstration") or meta.get("moved") or not holder:
        return {}
    earlier = [o for o in meta.get("delivered") or [] if objects.get(o) == holder]
    if not earlier and not meta.get("sibling"):  # an unseen world: the site's objects played before this one
        site = [o for o, h in objects.items() if h == holder]
        obj = meta.get("object")
        earlier = site[:site.index(obj)] if obj in site else []
    if not earlier:
        return {}
    return {"evidence": [f"take {o} from {holder}" for o in earlier], "sources": earlier, "follow": [holder]}


def annotate_world_tasks(env, tasks: Sequence) -> int:
    """Add ``evidence`` / ``sources`` to the meta of ``tasks`` from ``env``'s world manifest (an environment
    without ``worlds()`` is left alone; annotations a task already has are kept). Returns how many were annotated."""
    worlds = env.worlds() if callable(getattr(env, "worlds", None)) else None
    if not worlds:
        return 0
    n = 0
    for task in tasks:
        meta = task.meta if task.meta is not None else {}
        world = worlds.get(meta.get("world_id"))
        if world is None or meta.get("evidence"):
            continue
        extra = world_evidence(meta, world.objects)
        if extra:
            meta.update(extra)
            n += 1
    return n
