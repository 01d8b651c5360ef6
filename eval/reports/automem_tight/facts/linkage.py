"""Can an architecture's memory reach the evidence at all? Expert play, no agent: every training task of a world
recipe is played by its walkthrough, in order, and stored; before each annotated repeat visit the memory is asked
for the task's goal. Per architecture and trajectory rule (first words vs ``trajectory_facts``) it counts the visits
where a unit holding the evidence names the goal's object (linked), is ranked first / among the k retrieved, and
survives the injected-word limit (injected). Deterministic and minutes on a CPU (the MiniLM encoder only), so it
says which Encode / Store choices can change the outcome before any agent is played.

    python eval/reports/automem_tight/facts/linkage.py configs/automem/train/worlds_tight_noholder_cpu.yaml \
        [--out eval/reports/automem_tight/facts/linkage.json] [ARCH ...]
"""

import json
import sys
from pathlib import Path

ARCHS = ["trajectory|hybrid|hybrid|lightweight", "trajectory|vector|hybrid|lightweight",
         "trajectory|json|hybrid|lightweight", "trajectory+workflow|hybrid|hybrid|lightweight",
         "workflow|hybrid|hybrid|lightweight", "insight+trajectory+workflow+shortcut|hybrid|contrastive|json_full"]


def expert(env, task):
    """The walkthrough played as the agent would see it: each step's observation is the one before its action."""
    from routers.memagent.protocol import Trajectory, TrajectoryStep

    obs, steps = env.reset(task), []
    for i, cmd in enumerate(task.meta["walkthrough"]):
        steps.append(TrajectoryStep(i, obs.text, cmd))
        obs = env.step(cmd)
    return Trajectory(task, steps, bool(obs.won))


def expert_pool(cfg):
    """The recipe's environment, its training tasks (annotated with their evidence) in play order, and its encoder."""
    from routers.automem.evidence import annotate_world_tasks
    from routers.memagent.providers.encoder import as_encoder
    from routers.memagent.rollout import build_env, env_tasks

    env = build_env(cfg)
    pool = env_tasks(env, cfg.search_split)
    annotate_world_tasks(env, pool)
    return env, pool, as_encoder(cfg.encoder)


def linkage(env, pool, arch, encoder, facts: bool, cfg) -> dict:
    from routers.automem import Arch, MemorySystem
    from routers.automem.evaluate import _has
    from train.automem import system_guards

    opts = {**system_guards(cfg), "trajectory_facts": facts}
    mem = MemorySystem(Arch.parse(arch), encoder=encoder, k=cfg.memory_k, max_words=cfg.memory_words, **opts)
    n = {"visits": 0, "linked": 0, "first": 0, "retrieved": 0, "injected": 0}
    for task in pool:
        evidence = (task.meta or {}).get("evidence")
        if evidence and task.meta.get("family") == "fetch":
            text = mem.retrieve(task.goal).text
            items = mem.items_by_id()
            ranked = [items[i] for i in mem.last_trace.get("retrieved", [])]
            n["visits"] += 1
            n["linked"] += any(_has(u.text, evidence) and _has(u.key, [task.meta["object"]]) for u in items.values())
            n["first"] += bool(ranked) and _has(ranked[0].text, evidence)
            n["retrieved"] += any(_has(u.text, evidence) for u in ranked)
            n["injected"] += _has(text, evidence)
        mem.store(expert(env, task))
    return n


def main(argv=None) -> None:
    from routers.base import git_revision, library_versions
    from routers.config import parse_config
    from routers.io import atomic_write_json
    from routers.machine import machine_info
    from train.automem import AutomemTrainConfig, make_parser

    argv = list(sys.argv[1:] if argv is None else argv)
    out = Path(__file__).with_name("linkage.json")
    if "--out" in argv:
        j = argv.index("--out")
        out = Path(argv[j + 1])
        del argv[j:j + 2]
    recipe, archs = argv[0], argv[1:] or ARCHS
    (cfg,) = parse_config(make_parser(), [AutomemTrainConfig], [recipe])
    env, pool, encoder = expert_pool(cfg)
    rows = []
    for arch in archs:
        for facts in (False, True):
            row = {"arch": arch, "trajectory_facts": facts, **linkage(env, pool, arch, encoder, facts, cfg)}
            rows.append(row)
            print(json.dumps(row))
    atomic_write_json(out, {"recipe": recipe, "machine": machine_info(), "versions": library_versions(),
                            "git_revision": git_revision(),
                            "encoder": cfg.encoder, "memory_k": cfg.memory_k,
                            "memory_words": cfg.memory_words, "goal_names_holder": cfg.world_goal_names_holder,
                            "rows": rows})


if __name__ == "__main__":
    main()
