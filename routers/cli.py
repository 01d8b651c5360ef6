"""The ``memroute`` command: one entry point that dispatches to each job's ``main(argv)``.

Every job is also a module runnable with ``python -m`` or ``accelerate launch -m`` (e.g.
``accelerate launch -m train.sufficiency configs/sufficiency_smollm2.yaml``).
"""

from __future__ import annotations

import importlib
import sys

# command -> target -> "module:function"
JOBS = {
    "synth": {"sufficiency": "data_synthesis.sufficiency:main", "retriever": "data_synthesis.retriever:main",
              "textworld": "data_synthesis.textworld_corpus:main",
              "forced-exploration": "data_synthesis.memagent:main", "mix": "data_synthesis.mix:main"},
    "train": {"sufficiency": "train.sufficiency:main", "retriever": "train.retriever:main",
              "memagent": "train.memagent:main"},
    "export": {"sufficiency": "train.export:main", "retriever": "train.retriever:export_main",
               "memagent": "train.memagent:export_main"},
    "eval": {"sufficiency": "eval.sufficiency:main", "retrieval": "eval.retrieval:main",
             "progressive": "eval.progressive:main", "memagent": "eval.memagent:main"},
}
SINGLE = {
    "calibrate": "eval.sufficiency:calibrate_main",
    "env": "eval.env:main",
    "quickstart": "eval.quickstart:main",
    "bench": "eval.bench:main",
    "check-device": "eval.device_check:cli_main",
}
USAGE = """usage: memroute <command> [target] [options]

commands:
  synth sufficiency      evidence-intervention samples from LoCoMo / HotpotQA
  synth retriever        multi-positive contrastive pairs from evidence labels (LoCoMo / HotpotQA / TextWorld)
  synth textworld        TextWorld cooking games played with noise -> trajectory QA with exact evidence steps
  synth forced-exploration  MemAgent: Begin option x In policy rollouts per task -> begin/in/end.jsonl supervision
  synth mix              mix sufficiency sample files (seeded; per-file caps, label balance) into one train file
  train sufficiency      LoRA + grouped-token loss + distillation (or: accelerate launch -m train.sufficiency)
  train retriever        multi-positive InfoNCE on MiniLM (or: accelerate launch -m train.retriever)
  train memagent         SFT of the MemAgent Begin/In/End router (or: accelerate launch -m train.memagent)
  export sufficiency     merge a training checkpoint into a router directory
  export retriever       a retriever checkpoint as a RetrieverRouter directory
  export memagent        merge a MemAgent SFT checkpoint into a router directory
  eval memagent          routed agent vs no memory / single providers / random / oracle on held-out tasks
  eval sufficiency       AUROC/AP/ECE/Brier + tau sweep, base vs trained, calibration, plots
  eval retrieval         Recall@k/MRR/nDCG of evidence: BM25, base vs trained encoder, hybrid prefix
  eval progressive       Router-Mem fast/slow execution: tau sweep, endpoints, RAG, long context, T_mem/T_e2e
  calibrate              choose tau for a target precision or early-termination rate
  env                    versions, devices, embedded models, cache paths (for bug reports)
  quickstart             synth -> train -> export -> eval on LoCoMo with SmolLM2, end to end
  bench                  run the benchmarks and write a JSON + Markdown report
  check-device           bf16 training steps + export/reload of every router on this machine's accelerator

Each command accepts a YAML recipe (first argument or --config) and --help."""


def _call(spec: str, argv: list[str]):
    module, func = spec.split(":")
    return getattr(importlib.import_module(module), func)(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in SINGLE:
        code = _call(SINGLE[cmd], rest)
        return code if isinstance(code, int) else 0
    if cmd in JOBS:
        targets = JOBS[cmd]
        if not rest or rest[0] not in targets:
            print(f"memroute {cmd}: choose a target from {sorted(targets)}", file=sys.stderr)
            return 2
        _call(targets[rest[0]], rest[1:])
        return 0
    print(f"memroute: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
