"""How much of the valid space can reach the evidence, and how much keeps off the moved tasks? Expert play, no agent
(as ``facts/linkage.py``): every training task of a world recipe is played by its walkthrough in order and stored;
before each annotated repeat visit (fetch) and each moved task the memory is asked for the goal. Per architecture:
fetch visits whose injected text holds the evidence's route (``take ... from <holder>``) and moved tasks that get
any memory at all (their remembered route ends at an empty container). Architectures are the named ones or a uniform
sample of the valid space (random search's draw), so the share of the space at the suite's ceiling -- what decides
whether a random draw finds it -- is measured before any agent is played.

    python eval/reports/automem_tight/sought/reach.py RECIPE [overrides] [--sample N] [--seed S] [--out F] [ARCH ...]
"""

import json
import random
import sys
import time
from pathlib import Path


def _pop(argv: list, flag: str, default):
    if flag in argv:
        j = argv.index(flag)
        value = argv[j + 1]
        del argv[j:j + 2]
        return type(default)(value) if default is not None else value
    return default


def _linkage():
    """The sibling report ``facts/linkage.py`` (its expert play), loaded from its path: report scripts are no package."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "facts" / "linkage.py"
    spec = importlib.util.spec_from_file_location("automem_tight_linkage", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reach(env, pool, arch, encoder, cfg, expert) -> dict:
    from routers.automem import Arch, MemorySystem
    from routers.automem.evaluate import _has
    from train.automem import system_guards

    mem = MemorySystem(Arch.parse(arch), encoder=encoder, k=cfg.memory_k, max_words=cfg.memory_words,
                       **system_guards(cfg))
    n = {"fetch": 0, "fetch_injected": 0, "moved": 0, "moved_memory": 0}
    for task in pool:
        meta = task.meta or {}
        if meta.get("family") == "moved" or meta.get("evidence"):
            text = mem.retrieve(task.goal).text
            if meta.get("family") == "moved":
                n["moved"] += 1
                n["moved_memory"] += bool(text.strip())
            else:
                n["fetch"] += 1
                n["fetch_injected"] += _has(text, meta["evidence"])
        mem.store(expert(env, task))
    return n


def main(argv=None) -> None:
    from routers.automem.space import sample_arch
    from routers.base import git_revision, library_versions
    from routers.config import parse_config
    from routers.io import atomic_write_json
    from routers.machine import machine_info
    from train.automem import AutomemTrainConfig, make_parser

    argv = list(sys.argv[1:] if argv is None else argv)
    out = Path(_pop(argv, "--out", str(Path(__file__).with_name("reach.json"))))
    sample, seed = _pop(argv, "--sample", 0), _pop(argv, "--seed", 0)
    cut = next((i for i, a in enumerate(argv) if "|" in a), len(argv))
    (cfg,) = parse_config(make_parser(), [AutomemTrainConfig], argv[:cut])
    rng = random.Random(seed)
    archs = argv[cut:] + [sample_arch(rng).key for _ in range(sample)]
    linkage = _linkage()
    env, pool, encoder = linkage.expert_pool(cfg)
    rows = []
    for arch in archs:
        t = time.perf_counter()
        row = reach(env, pool, arch, encoder, cfg, linkage.expert)
        rows.append({"arch": arch, **row, "seconds": round(time.perf_counter() - t, 1)})
        print(json.dumps(rows[-1]), flush=True)
    atomic_write_json(out, {"argv": argv, "sample": sample, "seed": seed, "machine": machine_info(),
                            "versions": library_versions(), "git_revision": git_revision(), "encoder": cfg.encoder,
                            "memory_k": cfg.memory_k, "memory_words": cfg.memory_words,
                            "guards_first": cfg.memory_guards_first, "sought_guards": cfg.memory_sought_guards,
                            "rows": rows})


if __name__ == "__main__":
    main()
