"""Named architectures on a search recipe's search batch, into the recipe's shared evaluation store (so the search
replays them): ``python eval/reports/automem_tight/probe.py RECIPE [overrides] [--batch validation] --probe none KEY
...``.

Prints each system's accuracy on the batch (default: search) by task family. Used before ``worlds_tight_cpu.yaml``
was written, to see whether a 60-word budget leaves fewer Encode sets at the top (its store was copied into the
recipe's output), and to test seed 0's one-edit neighbours on both batches (session 40).
"""

import sys
import time
from pathlib import Path


def main(argv=None) -> None:
    from routers.automem.evaluate import run_evaluation
    from routers.automem.evidence import annotate_world_tasks
    from routers.automem.space import Arch
    from routers.automem.trace import EvaluationStore
    from routers.config import parse_config
    from routers.memagent.rollout import env_tasks
    from train.automem import (AutomemTrainConfig, build_evaluator, evaluation_settings, make_parser, split_tasks,
                               warmup_settings)

    argv = list(sys.argv[1:] if argv is None else argv)
    batch = "search"
    if "--batch" in argv:
        j = argv.index("--batch")
        batch = argv[j + 1]
        del argv[j:j + 2]
    if batch not in ("search", "validation"):
        raise SystemExit(f"--batch must be search or validation, got {batch!r}")
    i = argv.index("--probe")
    (cfg,) = parse_config(make_parser(), [AutomemTrainConfig], argv[:i])
    env, evaluator = build_evaluator(cfg)
    search, val = split_tasks(env_tasks(env, cfg.search_split), cfg.n_search, cfg.n_val)
    annotate_world_tasks(env, search + val)
    tasks = search if batch == "search" else val
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    store = EvaluationStore(out / "evaluations.jsonl", {**evaluation_settings(cfg), **warmup_settings(cfg)})
    for key in argv[i + 1:]:
        arch = None if key == "none" else Arch.parse(key)
        ev = store.get(arch, tasks)
        if ev is None:
            t = time.perf_counter()
            ev = run_evaluation(evaluator, arch, tasks, batch)
            store.put(arch, tasks, ev)
            print(f"played in {time.perf_counter() - t:.0f} s", flush=True)
        fam: dict = {}
        for r in ev.results:
            fam.setdefault(r.task_id.split("-")[1], []).append(r.success)
        print(key, f"{ev.accuracy:.3f}", ev.tokens, {f: f"{sum(v)}/{len(v)}" for f, v in fam.items()}, flush=True)


if __name__ == "__main__":
    main()
