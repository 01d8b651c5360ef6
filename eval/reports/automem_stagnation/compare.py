"""Search-batch comparison of AutoMem with --stagnation 1, the default AutoMem and random search on seeds 9-11.

Reads the traces of ``memroute train automem configs/automem/train/worlds_cpu.yaml --world_train_moved 2
--n_search 24 --n_val 24 --seeds 9 10 11`` (``outputs/automem_moved2/search``) and of the same command with
``--stagnation 1 --random_baseline false --output_dir outputs/automem_stag1/search``; writes ``compare.json`` beside
this script: per seed the best search accuracy after the budget, the evaluations each needed to reach random search's
final best (``eval.automem.evaluations_to_reach``), the restart origins and the picks' validation accuracy.

    python eval/reports/automem_stagnation/compare.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from eval.automem import evaluations_to_reach
from routers.io import atomic_write_json

HERE = Path(__file__).parent
DEFAULT, STAG = Path("outputs/automem_moved2/search"), Path("outputs/automem_stag1/search")


def main() -> dict:
    rows = []
    for seed in (9, 10, 11):
        tr = {name: json.loads((d / f"seed{seed}" / f"{m}_trace.json").read_text())
              for name, d, m in (("random", DEFAULT, "random"), ("default", DEFAULT, "automem"),
                                 ("stagnation", STAG, "automem"))}
        target = max(y for y in tr["random"]["best_so_far"] if y is not None)
        rows.append({"seed": seed, "random_final_best": target, **{
            name: {"best_search": t["best_so_far"][-1],
                   "reach_random_best": evaluations_to_reach(t["best_so_far"], target),
                   "pick": t["best"]["arch"], "pick_validation": t["best"]["validation_accuracy"],
                   "origins": [p["origin"] for p in t["evaluations"]], "candidate_tokens": t["candidate_tokens"]}
            for name, t in tr.items()}})
    out = {"seeds": rows, "mean_best_search": {name: statistics.fmean(r[name]["best_search"] for r in rows)
                                               for name in ("random", "default", "stagnation")}}
    atomic_write_json(HERE / "compare.json", out)
    print(json.dumps(out["mean_best_search"]))
    return out


if __name__ == "__main__":
    main()
