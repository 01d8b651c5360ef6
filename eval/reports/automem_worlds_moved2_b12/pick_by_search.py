"""What if each method reported its search leader instead of its best-on-validation candidate?

Reads the budget-12 search traces, takes each trace's search leader (``routers.automem.ledger.leader`` over the
Pareto front: best search accuracy, then gain, then lower cost, then earlier) and plays it on the 42 held-out tasks
with the held-out evaluation's settings and store (already played architectures are replayed, not played again).
Writes ``pick_by_search.json`` beside this script.

    python eval/reports/automem_worlds_moved2_b12/pick_by_search.py
"""

from __future__ import annotations

import json
from pathlib import Path

from eval.automem import AutomemEvalConfig, _held_out, held_out_store, read_search
from routers.automem.ledger import leader, pareto_front
from routers.config import parse_config
from routers.io import atomic_write_json
from routers.memagent.rollout import env_tasks
from train.automem import build_evaluator

HERE = Path(__file__).parent
SEARCH, EVAL = "outputs/automem_moved2_b12/search", "outputs/automem_moved2_b12/eval"


def main() -> dict:
    from eval.automem import make_parser

    (cfg,) = parse_config(make_parser(), [AutomemEvalConfig], [
        "configs/automem/eval/worlds_cpu.yaml", "--world_train_moved", "2", "--search_dir", SEARCH,
        "--output_dir", EVAL])
    _, traces = read_search(SEARCH)
    env, evaluator = build_evaluator(cfg)
    tasks = env_tasks(env, cfg.test_split)
    evaluator.warmup = env_tasks(env, cfg.warmup_split)
    store = held_out_store(cfg, EVAL, evaluator)
    none = _held_out(evaluator, None, tasks, store)["accuracy"]
    out = {"no_memory": none, "seeds": {}}
    for seed, by_method in traces.items():
        for method, tr in by_method.items():
            lead = leader(pareto_front([p for p in tr["evaluations"] if not p["failed"]]))
            picked = tr["best"]["arch"]
            row = {"search_leader": lead["arch"], "search_accuracy": lead["accuracy"],
                   "search_leader_heldout": _held_out(evaluator, lead["arch"], tasks, store)["accuracy"],
                   "validation_pick": picked,
                   "validation_pick_heldout": _held_out(evaluator, picked, tasks, store)["accuracy"]}
            out["seeds"].setdefault(seed, {})[method] = row
            print(seed, method, json.dumps(row))
    atomic_write_json(HERE / "pick_by_search.json", out)
    return out


if __name__ == "__main__":
    main()
