"""Which units does each architecture inject on one held-out fetch task? Plays one world's training tasks
(demonstrations by the expert) with a fresh memory system per architecture, then the held-out task, and prints the
retrieved units' texts, the injected memory and the agent's actions. Suite: configs/automem/eval/worlds_revisit_cpu.yaml
with memory_guards_first (the guards withhold other worlds' units before ranking, so one world's training tasks decide
what is retrieved; the held-out evaluation stores all 8 worlds' first).

    python eval/reports/automem_revisit3/unit_texts.py world0 world0-fetch-wooden_violin ARCH [ARCH ...]
"""

from __future__ import annotations

import json
import sys
import time

from eval.automem import AutomemEvalConfig, make_parser
from routers.automem.space import Arch
from routers.config import parse_config
from routers.memagent.rollout import RolloutContext, count_words, env_tasks, is_demonstration, rollout
from train.automem import build_evaluator

RECIPE = "configs/automem/eval/worlds_revisit_cpu.yaml"


def main(world: str, target: str, archs: list[str]) -> None:
    (cfg,) = parse_config(make_parser(), [AutomemEvalConfig], [RECIPE, "--memory_guards_first", "true"])
    env, ev = build_evaluator(cfg)
    train = [t for t in env_tasks(env, "train") if t.task_id.startswith(world + "-")]
    test = [t for t in env_tasks(env, "heldout") if t.task_id == target]
    print("train", [t.task_id for t in train], flush=True)
    for key in archs:
        system = ev.make_system(Arch.parse(key))
        ctx = RolloutContext(env=env, tasks=train + test, agent=ev.agent, providers={system.name: system},
                             count_tokens=count_words, max_steps=cfg.max_steps)
        t0 = time.time()
        for task in train + test:
            memory = system.retrieve(task.goal).text
            r = rollout(ctx, task, system.name if memory else None, memory=memory)
            print(f"[{key}] {task.task_id} demo={is_demonstration(task)} success={r.trajectory.success} "
                  f"steps={len(r.trajectory.steps)}", flush=True)
            if task in test:
                print("GOAL:", task.goal)
                print("TRACE:", json.dumps(system.last_trace))
                items = system.items_by_id()
                for i in system.last_trace.get("retrieved", []):
                    print("  UNIT", i, items[i].meta.get("kind"), "::", items[i].text[:400])
                print("MEMORY:\n" + memory)
                print("ACTIONS:", [s.action for s in r.trajectory.steps])
            system.store(r.trajectory)
        print("time", round(time.time() - t0, 1), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
