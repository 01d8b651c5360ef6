"""Which cue does a Begin router read? Counterfactual goals on the persistent-world suite's held-out tasks.

On that suite a remembered route is right exactly when the goal's container is the container of the memory the
router is shown (the goal quoted by its top preview, in the same world): new goals in a seen site need the memory,
a moved object in a hub container does not. A router can score well without comparing containers, through any
feature that predicts the task type in one suite (the first 10-world routers read the *object*: a moved task's
object was always the remembered one). Here each held-out goal is edited, the recorded previews left as they are,
and the router asked again. Goals naming the remembered container: ``container -> hub`` (memory now stale),
``object -> remembered`` (still right). Goals naming another container: ``container -> remembered`` (now right),
``container -> unseen name`` (still stale). Probes are grouped by task family and by which container the goal
names, e.g. ``moved (other container): container -> remembered``.

Per probe: the choices, the share using a memory provider, the share changed from the unedited goal's choice.
``agreement``: share of all decisions (unedited goals included) where "uses a memory provider" equals "the goal
names the remembered container", 1.0 for a router that compares containers.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Mapping

from eval.memagent_metrics import option_label

UNSEEN_CONTAINER = "sack"  # a container name no world of the suite uses
# routers.memagent.worlds.goal_text's sentence (a test round-trips it), found in a goal or a preview quoting one
_GOAL = re.compile(r"In (?P<world>[^,.]+), find the (?P<object>[^.]+?)(?: in the (?P<holder>[^.]+?))? and put it on the ")


def parse_goal(text: str) -> dict | None:
    """world / object / holder (None when the goal names no container) of the first goal sentence in ``text``."""
    m = _GOAL.search(text)
    return None if m is None else m.groupdict()


def _swap(goal: str, old: str, new: str) -> str | None:
    """``goal`` with the phrase ``the {old} `` replaced once, or None when it is not there exactly once."""
    needle = f"the {old} "
    return goal.replace(needle, f"the {new} ", 1) if goal.count(needle) == 1 else None


def validate_task_meta(rec: Mapping) -> None:
    """A tasks.jsonl record's ``task.meta`` has what the probes edit (read_jsonl names file:line on error)."""
    meta = (rec.get("task") or {}).get("meta") if isinstance(rec.get("task"), dict) else None
    if not isinstance(meta, dict):
        raise ValueError("task.meta must be an object (a persistent-world task record)")
    for key in ("family", "object", "holder"):
        if not isinstance(meta.get(key), str) or not meta[key]:
            raise ValueError(f"task.meta.{key} must be a non-empty string, got {meta.get(key)!r:.60}")


def remembered(rec: Mapping) -> dict | None:
    """What the router is shown of memory: the goal quoted by the highest-scoring preview that quotes one."""
    for p in sorted(rec["previews"], key=lambda p: -float(p.get("score") or 0.0)):
        got = parse_goal(str(p.get("snippet", "")))
        if got and got["holder"]:
            return got
    return None


def counterfactual_goals(heldout: Mapping[str, Mapping]) -> list[dict]:
    """Probe goals from held-out task records (``heldout/tasks.jsonl``: goal, previews, task.meta). Each:
    task_id, probe, goal, expect_memory. Tasks whose previews quote no goal of the same world are skipped (an
    unseen world: nothing remembered to compare with)."""
    hub = sorted({r["task"]["meta"]["moved"]["to"] for r in heldout.values()
                  if (r["task"]["meta"].get("moved") or {}).get("to")})
    out = []
    for tid, rec in heldout.items():
        meta, goal, mem = rec["task"]["meta"], rec["goal"], remembered(rec)
        own = parse_goal(goal)
        if mem is None or own is None or mem["world"] != own["world"]:
            continue
        same = mem["holder"] == meta["holder"]
        family = f"{meta.get('family')} ({'remembered' if same else 'other'} container)"
        out.append({"task_id": tid, "probe": f"{family}: as is", "goal": goal, "expect_memory": same})
        if same:
            if hub:
                out.append({"task_id": tid, "probe": f"{family}: container -> hub", "expect_memory": False,
                            "goal": _swap(goal, meta["holder"], hub[len(out) % len(hub)])})
            if mem["object"] != meta["object"]:
                out.append({"task_id": tid, "probe": f"{family}: object -> remembered", "expect_memory": True,
                            "goal": _swap(goal, meta["object"], mem["object"])})
        else:
            out.append({"task_id": tid, "probe": f"{family}: container -> remembered", "expect_memory": True,
                        "goal": _swap(goal, meta["holder"], mem["holder"])})
            out.append({"task_id": tid, "probe": f"{family}: container -> unseen name", "expect_memory": False,
                        "goal": _swap(goal, meta["holder"], UNSEEN_CONTAINER)})
    return [p for p in out if p["goal"]]


def counterfactual_begin(router, heldout: Mapping[str, Mapping], providers: Mapping[str, Any]) -> dict:
    """The router's Begin choice on every probe goal (same recorded previews); per probe: the choices, the share
    using memory, the share changed from the original goal's choice; overall ``agreement`` (module docstring)."""
    probes = counterfactual_goals(heldout)
    picks: dict[tuple[str, str], str] = {}
    for p in probes:
        previews = [v for v in heldout[p["task_id"]]["previews"] if v["provider"] in providers]
        picks[(p["task_id"], p["probe"])] = option_label(router.begin(p["goal"], previews, providers))
    by_probe: dict[str, dict] = {}
    agree = []
    for p in probes:
        pick = picks[(p["task_id"], p["probe"])]
        family = p["probe"].split(":")[0]
        original = picks.get((p["task_id"], f"{family}: as is"))
        row = by_probe.setdefault(p["probe"], {"n": 0, "expect_memory": p["expect_memory"], "choices": Counter(),
                                               "uses_memory": 0, "changed": 0})
        uses = pick != option_label(None)
        row["n"] += 1
        row["choices"][pick] += 1
        row["uses_memory"] += uses
        row["changed"] += pick != original
        agree.append(uses == p["expect_memory"])
    for row in by_probe.values():
        n = row["n"]
        row.update(choices=dict(row["choices"]), uses_memory=round(row["uses_memory"] / n, 4),
                   changed=round(row["changed"] / n, 4))
    return {"probes": by_probe, "decisions": len(agree),
            "agreement": round(sum(agree) / len(agree), 4) if agree else None}


def format_cues(result: Mapping) -> list[str]:
    """Summary lines for the command's printed table."""
    lines = [f"  counterfactual Begin probes: agreement with 'memory iff the goal names the remembered container' "
             f"{result['agreement']}"]
    for name, row in result["probes"].items():
        lines.append(f"    {name:<52} n={row['n']:<3} memory {row['uses_memory']:.2f} (expected "
                     f"{'yes' if row['expect_memory'] else 'no'}), changed {row['changed']:.2f}")
    return lines


__all__ = ["counterfactual_begin", "counterfactual_goals", "format_cues", "parse_goal", "remembered",
           "validate_task_meta"]
