"""Seed-1 check (session 36): what AutoMem's seed-1 pick (trajectory + shortcut, `graph`) and random search's
(`workflow | hybrid`) inject on a fetch task of world 1 (search batch: the pick solves 15/18 fetch there) and of
world 2 (validation batch: 0/9), after storing only the sites' demonstrations (played by the expert), then plays the
task with that memory (a few minutes on 2 cores).

    python eval/reports/automem_revisit3/seed1_units.py > eval/reports/automem_revisit3/seed1_units.txt
"""
import sys

from eval.automem import AutomemEvalConfig, make_parser
from routers.automem.space import Arch
from routers.config import parse_config
from routers.memagent.rollout import RolloutContext, count_words, env_tasks, is_demonstration, rollout
from train.automem import build_evaluator

PICKS = ("insight+trajectory+shortcut|graph|cbr_rerank|graph_consolidate", "workflow|hybrid|hybrid|tool_manager")


def main() -> None:
    (cfg,) = parse_config(make_parser(), [AutomemEvalConfig], ["configs/automem/eval/worlds_revisit3_cpu.yaml"])
    env, ev = build_evaluator(cfg)
    train = env_tasks(env, "train")
    for world in ("world1", "world2"):
        demos = [t for t in train if t.task_id.startswith(world + "-") and is_demonstration(t)]
        targets = [t for t in train if t.task_id.startswith(world + "-fetch") and not is_demonstration(t)][:1]
        for key in PICKS:
            system = ev.make_system(Arch.parse(key))
            ctx = RolloutContext(env=env, tasks=demos + targets, agent=ev.agent, providers={system.name: system},
                                 count_tokens=count_words, max_steps=cfg.max_steps)
            for t in demos:
                r = rollout(ctx, t, None, memory="")
                system.store(r.trajectory)
                print(world, key, t.task_id, "demo steps", len(r.trajectory.steps), flush=True)
            for t in targets:
                mem = system.retrieve(t.goal).text
                print("==", world, key, t.task_id, "words", count_words(mem))
                print("GOAL:", t.goal)
                print(mem)
                r = rollout(ctx, t, system.name, memory=mem)
                print("PLAYED: success", r.trajectory.success, "actions", [st.action for st in r.trajectory.steps])
            sys.stdout.flush()


if __name__ == "__main__":
    main()
