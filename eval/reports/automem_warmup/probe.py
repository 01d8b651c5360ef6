"""Does a search warm-up make the search batch see what held-out sees? Plays given architectures on the search and
validation batches of ``configs/automem/train/worlds_unseen_cpu.yaml`` with ``--search_warmup demonstrations`` or
``train`` (every memory system first stores the search split's demonstrations, or all its tasks, outside the batch)
and writes accuracy by family, pool sizes and the wall time per evaluation (``none`` and other options after ``--``:
the same batches without a warm-up on another suite). Without the warm-up, the same architectures are in the search
store (``families.py`` in eval/reports/automem_struct) and held-out in eval/reports/automem_site.

    python eval/reports/automem_warmup/probe.py demonstrations|train|none search|both out.json \
        'workflow|hybrid|hybrid|tool_manager' ... [-- other memroute train automem options]
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict

from routers.automem import Arch
from routers.base import git_revision, library_versions
from routers.io import atomic_write_json
from routers.config import parse_config
from routers.machine import machine_info
from routers.memagent.rollout import env_tasks
from train.automem import AutomemTrainConfig, build_evaluator, make_parser, split_tasks, warmup_tasks

SEEN = {f"world{i}" for i in range(6)}


def family(task_id: str) -> str:
    world, kind = task_id.split("-")[:2]
    return kind if world in SEEN else "unseen"


def main(warmup: str, batches: str, out_path: str, archs: list[str], options: list[str]) -> None:
    (cfg,) = parse_config(make_parser(), [AutomemTrainConfig], [
        "configs/automem/train/worlds_unseen_cpu.yaml", "--search_warmup", warmup,
        "--output_dir", "/tmp/automem_warmup_probe", *options])
    env, ev = build_evaluator(cfg)
    pool = env_tasks(env, cfg.search_split)
    search, val = split_tasks(pool, cfg.n_search, cfg.n_val)
    ev.warmup = warmup_tasks(pool, warmup)
    rows = []
    for key in archs:  # "none": the no-memory agent
        for batch, tasks in (("search", search), ("validation", val))[:2 if batches == "both" else 1]:
            t0 = time.perf_counter()
            results = ev(None if key == "none" else Arch.parse(key), tasks)
            fams: dict[str, list[int]] = defaultdict(lambda: [0, 0])
            for r in results:
                fams[family(r.task_id)][0] += bool(r.success)
                fams[family(r.task_id)][1] += 1
            pools = [((r.failure or {}).get("memory") or {}).get("pool") for r in results]
            acc = round(sum(r.success for r in results) / len(results), 4)
            rows.append({"arch": key, "batch": batch, "accuracy": acc,
                         "by_family": {f: f"{s}/{n}" for f, (s, n) in sorted(fams.items())},
                         "warmup_tasks": len([t for t in ev.warmup if t.task_id not in {u.task_id for u in tasks}]),
                         "pool_first_last": [pools[0], pools[-1]], "seconds": round(time.perf_counter() - t0, 1)})
            print(json.dumps(rows[-1]), flush=True)
            atomic_write_json(out_path, {  # after every row: a killed probe keeps what it played
                "config": " ".join(["configs/automem/train/worlds_unseen_cpu.yaml --search_warmup", warmup, *options]),
                "models": {"agent": cfg.agent_model, "encoder": cfg.encoder}, "machine": machine_info(),
                "versions": library_versions(), "git_revision": git_revision(), "rows": rows})


if __name__ == "__main__":
    args = sys.argv[1:]
    cut = args.index("--") if "--" in args else len(args)
    main(args[0], args[1], args[2], args[3:cut], args[cut + 1:])
