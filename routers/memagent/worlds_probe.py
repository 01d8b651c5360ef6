"""Does memory matter on the persistent-world suite? Per held-out task: no memory vs an oracle memory.

    python -m routers.memagent.worlds_probe [recipe.yaml] --agent walkthrough|random|lm [--max_tasks 10] \\
        [--output_file results/worlds_probe/lm.json] [any RolloutConfig option: worlds_seen, budget_slack, ...]

The oracle memory of a held-out task is the stored successful trajectory of its ``sibling`` (the training
task of the same site; for a changed-world task the training task with the same goal, now stale), injected
as Begin memory exactly as a provider's retrieved text is (``run_episode(begin_memory=...)``). The sibling's
trajectory is its optimal walkthrough played in its own game (``sibling_source: walkthrough``, a
demonstration), or the agent's own rollout of the sibling with the training budget (``agent``: no memory
when that rollout failed, as a store gated on success would hold nothing). ``memory_style``: ``actions``
(goal, outcome, one ``> command`` per line) or ``render`` (``Trajectory.render``, observations included).

Reports success without / with memory, the oracle (either), the gap, the share of routing-critical tasks
(exactly one of the two conditions succeeds), per family, and seconds per rollout. ``agent: walkthrough``
validates solvability and budgets (it ignores memory); ``random`` is the blind-exploration floor; ``copy``
(:class:`MemoryCopyAgent`) replays the memory's commands, what an agent that copies perfectly gets.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from routers.logs import get_logger
from routers.memagent.agent import run_episode
from routers.memagent.protocol import Trajectory
from routers.memagent.rollout import RolloutConfig, build_agent, build_env

logger = get_logger(__name__)


@dataclass
class WorldsProbeConfig(RolloutConfig):
    env: str = "textworld_worlds"
    max_steps: int = 60
    output_file: str = "results/worlds_probe/probe.json"
    max_tasks: int | None = field(default=None, metadata={"help": "first N held-out tasks after interleaving "
                                                                  "families (seen fetch, moved, unseen fetch)"})
    families: list[str] | None = field(default=None, metadata={"help": "fetch / moved / unseen; None = all"})
    memory_style: str = field(default="actions", metadata={"help": "actions | render"})
    sibling_source: str = field(default="walkthrough", metadata={"help": "walkthrough | agent"})

    def __post_init__(self):
        copy = self.agent == "copy"   # the scripted copier (MemoryCopyAgent); RolloutConfig knows lm/walkthrough/random
        if copy:
            self.agent = "random"
        super().__post_init__()
        if copy:
            self.agent = "copy"
        if self.env != "textworld_worlds":
            raise ValueError("the probe runs on env textworld_worlds")
        bad = sorted(set(self.families or ()) - {"fetch", "moved", "unseen"})
        if bad:  # e.g. "[fetch]" from a shell: would otherwise select no task at all, silently
            raise ValueError(f"families: unknown {bad}; choose from fetch, moved, unseen (space-separated)")
        if self.memory_style not in ("actions", "render"):
            raise ValueError(f"memory_style must be actions or render, got {self.memory_style!r}")
        if self.sibling_source not in ("walkthrough", "agent"):
            raise ValueError(f"sibling_source must be walkthrough or agent, got {self.sibling_source!r}")
        if self.max_tasks is not None and self.max_tasks < 1:
            raise ValueError(f"max_tasks must be >= 1, got {self.max_tasks}")


class MemoryCopyAgent:
    """Scripted ideal copier (no LM): replays the ``> command`` lines of its Begin memory in order, with the
    remembered task's object replaced by this task's; a command not on offer is skipped, and with nothing left
    to copy it falls back to a seeded random choice. It measures what the memory *contains*, i.e. what an agent
    that copies well could get from it."""

    name = "memory-copy"

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.last_info: dict = {}

    def act(self, task, history, observation, memory: str) -> str:
        import random
        import re

        cmds = list(observation.admissible_commands)
        lines = [ln[2:].strip() for ln in (memory or "").splitlines() if ln.startswith("> ")]
        m = re.search(r"find the (.+?)(?: in the [a-z]+)? and put", memory or "")
        obj = task.meta.get("object", "")
        plan = [ln.replace(m.group(1), obj) if m and obj else ln for ln in lines]
        i = len(history)
        while i < len(plan):  # position-aligned: step i replays the memory's i-th command when offered
            if plan[i] in cmds:
                return plan[i]
            break
        return random.Random(f"{self.seed}:{task.task_id}:{i}").choice(cmds)


def memory_text(traj: Trajectory, style: str = "actions") -> str:
    """A trajectory as Begin memory: ``actions`` = goal, outcome and the commands; ``render`` = with observations."""
    if style == "render":
        return traj.render()
    lines = [f"Task: {traj.task.goal}", f"Outcome: {'success' if traj.success else 'failure'}"]
    return "\n".join(lines + [f"> {s.action}" for s in traj.steps])


def task_kind(task) -> str:
    """``fetch`` (seen world, new goal), ``moved`` (changed world) or ``unseen`` (unseen world)."""
    if task.meta.get("family") == "moved":
        return "moved"
    return "fetch" if task.meta.get("sibling") else "unseen"


def select_tasks(tasks, families=None, max_tasks=None) -> list:
    """Held-out tasks interleaved by kind (fetch, moved, unseen, fetch, ...) and, within a kind, by world, so a
    prefix covers every kind and as many worlds as it can."""
    by_kind = defaultdict(list)
    for t in _round_robin(tasks, lambda t: t.meta.get("world_id")):  # each kind's prefix spans the worlds
        by_kind[task_kind(t)].append(t)
    order = [k for k in ("fetch", "moved", "unseen") if families is None or k in families]
    out, i = [], 0
    while any(i < len(by_kind[k]) for k in order):
        out += [by_kind[k][i] for k in order if i < len(by_kind[k])]
        i += 1
    return out[:max_tasks] if max_tasks else out


def _round_robin(items, key) -> list:
    groups: dict = defaultdict(list)
    for it in items:
        groups[key(it)].append(it)
    out, i = [], 0
    while len(out) < len(items):
        out += [g[i] for g in groups.values() if i < len(g)]
        i += 1
    return out


def summarize(rows: list[dict]) -> dict:
    """Success rates (no memory / memory / oracle = either), gap, routing-critical share; overall and per kind."""
    def block(rs):
        n = len(rs)
        if not n:
            return {"n": 0}
        no = sum(r["no_memory"]["success"] for r in rs) / n
        mem = sum(r["memory"]["success"] for r in rs) / n
        orc = sum(r["no_memory"]["success"] or r["memory"]["success"] for r in rs) / n
        crit = sum(r["no_memory"]["success"] != r["memory"]["success"] for r in rs) / n
        return {"n": n, "no_memory": round(no, 4), "memory": round(mem, 4), "oracle": round(orc, 4),
                "gap_points": round(100 * (orc - no), 1), "routing_critical": round(crit, 4),
                "errors": sum(bool(r["no_memory"]["error"]) + bool(r["memory"]["error"]) for r in rs)}
    kinds = sorted({r["kind"] for r in rows})
    return {"all": block(rows), **{k: block([r for r in rows if r["kind"] == k]) for k in kinds}}


def _outcome(traj: Trajectory) -> dict:
    return {"success": bool(traj.success), "steps": len(traj.steps), "error": traj.error,
            "actions": [s.action for s in traj.steps]}


def run_probe(cfg: WorldsProbeConfig, env=None, agent=None) -> dict:
    from routers.memagent.agent import WalkthroughAgent

    env = env if env is not None else build_env(cfg)
    if agent is None:
        agent = MemoryCopyAgent(cfg.seed) if cfg.agent == "copy" else build_agent(cfg)
    every = env.all_tasks()
    tasks = select_tasks(env.tasks("heldout"), cfg.families, cfg.max_tasks)
    sources: dict[str, Trajectory] = {}
    rows, seconds, n_rollouts = [], 0.0, 0
    for task in tasks:
        sib_id = task.meta.get("sibling")
        if sib_id and sib_id not in sources:
            sib = every[sib_id]
            player = WalkthroughAgent() if cfg.sibling_source == "walkthrough" else agent
            t0 = time.perf_counter()
            sources[sib_id] = run_episode(env, player, sib, max_steps=cfg.max_steps)
            if player is agent:
                seconds, n_rollouts = seconds + time.perf_counter() - t0, n_rollouts + 1
        src = sources.get(sib_id) if sib_id else None
        memory = memory_text(src, cfg.memory_style) if src is not None and src.success else ""
        row = {"task_id": task.task_id, "kind": task_kind(task), "optimal_steps": task.meta["optimal_steps"],
               "budget": task.meta["budget"], "sibling": sib_id, "memory_chars": len(memory)}
        for cond, mem in (("no_memory", ""), ("memory", memory)):
            if cond == "memory" and not mem:
                row[cond] = dict(row["no_memory"], note="no sibling memory: same as no memory")
                continue
            t0 = time.perf_counter()
            traj = run_episode(env, agent, task, begin_provider="oracle" if mem else None, begin_memory=mem,
                               max_steps=cfg.max_steps)
            seconds, n_rollouts = seconds + time.perf_counter() - t0, n_rollouts + 1
            row[cond] = _outcome(traj)
        rows.append(row)
        logger.info("%s %s: no memory %s, memory %s", task.task_id, row["kind"], row["no_memory"]["success"],
                    row["memory"]["success"])
    return {"agent": getattr(agent, "name", type(agent).__name__), "memory_style": cfg.memory_style,
            "sibling_source": cfg.sibling_source, "n_tasks": len(rows), "rollouts": n_rollouts,
            "s_per_rollout": round(seconds / n_rollouts, 3) if n_rollouts else None,
            "summary": summarize(rows), "tasks": rows}


def make_parser():
    from routers.config import make_arg_parser

    return make_arg_parser([WorldsProbeConfig], prog="python -m routers.memagent.worlds_probe",
                           description="No memory vs oracle sibling memory on the persistent-world suite.")


def main(argv=None) -> dict:
    from routers.config import parse_config, save_resolved_config
    from routers.io import atomic_write_json
    from routers.logs import setup_cli_logging

    setup_cli_logging()
    (cfg,) = parse_config(make_parser(), [WorldsProbeConfig], argv)
    result = run_probe(cfg)
    out = Path(cfg.output_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, result)
    save_resolved_config(out.parent, cfg, name=f"{out.stem}_config.yaml")
    logger.info("probe (%s, %d tasks, %s s/rollout): %s -> %s", result["agent"], result["n_tasks"],
                result["s_per_rollout"], json.dumps(result["summary"]["all"]), out)
    return result


if __name__ == "__main__":
    main()
