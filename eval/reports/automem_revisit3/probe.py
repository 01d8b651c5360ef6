"""Do the batches of ``configs/automem/train/worlds_revisit3_cpu.yaml`` rank what held-out ranks? Plays given
architectures on its search (and validation) batch through the search's own evaluation store (a later
``memroute train automem`` on the recipe replays them) and writes accuracy by task family and the failures' memory
traces (which units were injected, the injected words). ``none``: the no-memory agent.

    python eval/reports/automem_revisit3/probe.py search|both out.json 'workflow|hybrid|hybrid|tool_manager' ...
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from routers.automem import Arch
from routers.automem.evaluate import run_evaluation
from routers.automem.evidence import annotate_world_tasks
from routers.automem.trace import EvaluationStore
from routers.base import git_revision, library_versions
from routers.config import parse_config
from routers.io import atomic_write_json
from routers.machine import machine_info
from routers.memagent.rollout import env_tasks
from train.automem import (AutomemTrainConfig, build_evaluator, evaluation_settings, make_parser, split_tasks,
                           warmup_settings)

RECIPE = "configs/automem/train/worlds_revisit3_cpu.yaml"


def family(task_id: str) -> str:
    world, kind = task_id.split("-")[:2]
    return "unseen" if len(world) > 7 else kind  # world100000+ / world200000+: no memory of their own


def main(batches: str, out_path: str, archs: list[str]) -> None:
    (cfg,) = parse_config(make_parser(), [AutomemTrainConfig], [RECIPE])
    env, ev = build_evaluator(cfg)
    search, val = split_tasks(env_tasks(env, cfg.search_split), cfg.n_search, cfg.n_val)
    annotate_world_tasks(env, search + val)  # as the search does: the records carry the diagnosis's evidence
    store = EvaluationStore(Path(cfg.output_dir) / "evaluations.jsonl", {**evaluation_settings(cfg),
                                                                         **warmup_settings(cfg)})
    rows = []
    for key in archs:
        arch = None if key == "none" else Arch.parse(key)
        for batch, tasks in (("search", search), ("validation", val))[:2 if batches == "both" else 1]:
            found = store.get(arch, tasks)
            if found is None:
                found = run_evaluation(ev, arch, tasks, batch)
                store.put(arch, tasks, found)
            fams: dict[str, list[int]] = defaultdict(lambda: [0, 0])
            for r in found.results:
                fams[family(r.task_id)][0] += bool(r.success)
                fams[family(r.task_id)][1] += 1
            fails = {r.task_id: {k: (r.failure or {}).get("memory", {}).get(k) for k in ("pool", "kept", "scores")}
                     | {"injected_words": (r.failure or {}).get("injected_words")}
                     for r in found.results if not r.success and family(r.task_id) == "fetch"}
            rows.append({"arch": key, "batch": batch, "accuracy": round(found.accuracy, 4),
                         "by_family": {f: f"{s}/{n}" for f, (s, n) in sorted(fams.items())},
                         "tokens": found.tokens, "seconds": round(found.seconds, 1), "fetch_failures": fails})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "fetch_failures"}), flush=True)
            atomic_write_json(out_path, {  # after every row: a killed probe keeps what it played
                "config": RECIPE, "rows": rows, "machine": machine_info(), "versions": library_versions(),
                "git_revision": git_revision(), "models": {"agent": cfg.agent_model, "encoder": cfg.encoder}})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
