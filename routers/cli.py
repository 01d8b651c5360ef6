"""The ``memroute`` command: one entry point that dispatches to each job's ``main(argv)``.

Every job is also a module runnable with ``python -m`` or ``accelerate launch -m`` (e.g.
``accelerate launch -m train.sufficiency configs/sufficiency/train/smollm2.yaml``).
"""

from __future__ import annotations

import importlib
import sys

# command -> target -> "module:function"
JOBS = {
    "synth": {"sufficiency": "data_synthesis.sufficiency:main", "retriever": "data_synthesis.retriever:main",
              "textworld": "data_synthesis.textworld_corpus:main",
              "forced-exploration": "data_synthesis.memagent:main", "mix": "data_synthesis.mix:main",
              "mesa": "data_synthesis.mesa:main"},
    "train": {"sufficiency": "train.sufficiency:main", "retriever": "train.retriever:main",
              "memagent": "train.memagent:main", "mesa": "train.mesa:main",
              "automem": "train.automem:main"},
    # every export target runs train.export.export(<router>, argv); the retriever / memagent names are its aliases
    "export": {"sufficiency": "train.export:main", "retriever": "train.export:retriever_main",
               "memagent": "train.export:memagent_main"},
    "eval": {"sufficiency": "eval.sufficiency:main", "retrieval": "eval.retrieval:main",
             "progressive": "eval.progressive:main", "memagent": "eval.memagent:main",
             "mesa": "eval.mesa:main", "automem": "eval.automem:main"},
}
SINGLE = {
    "calibrate": "eval.sufficiency:calibrate_main",
    "env": "eval.env:main",
    "quickstart": "eval.quickstart:main",
    "bench": "eval.bench:main",
    "check-device": "eval.device_check:cli_main",
    "validate": "data_synthesis.validate:main",
    "push": "routers.push:main",
}
ONLINE = {"push"}  # every other command runs offline on the embedded models unless HF_HUB_OFFLINE is set
USAGE = """usage: memroute <command> [target] [options]

commands:
  synth sufficiency      evidence-intervention samples from LoCoMo / HotpotQA
  synth retriever        multi-positive contrastive pairs from evidence labels (LoCoMo / HotpotQA / TextWorld)
  synth textworld        TextWorld cooking games played with noise -> trajectory QA with exact evidence steps
  synth forced-exploration  MemAgent: Begin option x In policy rollouts per task -> begin/in/end.jsonl supervision
  synth mesa             MESA: five memory structures per episode + all 31 subsets per question, scored
  synth mix              mix sufficiency sample files (seeded; per-file caps, label balance) into one train file
  train sufficiency      LoRA + grouped-token loss + distillation (or: accelerate launch -m train.sufficiency)
  train retriever        multi-positive InfoNCE on MiniLM (or: accelerate launch -m train.retriever)
  train memagent         SFT of the MemAgent Begin/In/End router (or: accelerate launch -m train.memagent)
  train mesa             MESA selector: UCB-guided policy search over 20 prior directions on a structure sweep
  train automem          AutoMem: Encode/Store/Retrieve/Manage architecture search (+ random search, same budget)
  export sufficiency     merge a training checkpoint into a router directory
  export retriever       a retriever checkpoint as a RetrieverRouter directory
  export memagent        merge a MemAgent SFT checkpoint into a router directory
  eval memagent          routed agent vs no memory / single providers / random / oracle on held-out tasks
  eval mesa              MESA selector vs single structures / all five / random / route-to-one / best fixed
  eval automem           AutoMem best architecture vs no memory vs random-search best on held-out tasks
  eval sufficiency       AUROC/AP/ECE/Brier + tau sweep, base vs trained, calibration, plots
  eval retrieval         Recall@k/MRR/nDCG of evidence: BM25, base vs trained encoder, hybrid prefix
  eval progressive       Router-Mem fast/slow execution: tau sweep, endpoints, RAG, long context, T_mem/T_e2e
  calibrate              choose tau for a target precision or early-termination rate
  env                    versions, devices, embedded models, cache paths (for bug reports)
  quickstart             synth -> train -> export -> eval on LoCoMo with SmolLM2, end to end
  bench                  run the benchmarks and write a JSON + Markdown report
  check-device           bf16 training steps + export/reload of every router on this machine's accelerator
  validate               check an Episode corpus (your own data): every bad record with file:line and field
  push                   upload a router export to the Hugging Face Hub (--private, --revision)

Each command accepts a YAML recipe (first argument or --config) and --help. memroute --version prints
the version; --debug shows a full traceback on errors. Jobs run with HF_HUB_OFFLINE=1 unless you set it
(HF_HUB_OFFLINE=0 lets a job download a Hub model id); push always goes online."""


DEBUG_ENV = "MEMROUTE_DEBUG"


def user_error_types() -> tuple[type, ...]:
    """Errors caused by what the user gave (a recipe, a flag, a data file, an export directory): shown as one
    line. ``ConfigError``, ``RecordError``, ``RouterConfigError`` and ``ExportTargetError`` are ValueErrors."""
    from routers.io import OutputLockedError

    return (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, OutputLockedError)


def _call(spec: str, argv: list[str]):
    module, func = spec.split(":")
    return getattr(importlib.import_module(module), func)(argv)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("memroute")
    except PackageNotFoundError:
        return "unknown"


def run(argv: list[str]) -> int:
    """Dispatch to a job; errors propagate (tests and callers that want the exception use this)."""
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(USAGE)
        return 0
    if argv[0] in {"--version", "-V"}:
        print(f"memroute {_version()}")
        return 0
    cmd, rest = argv[0], argv[1:]
    from routers.logs import setup_cli_logging
    from routers.models import offline_by_default

    setup_cli_logging()
    if cmd not in ONLINE:
        offline_by_default()
    if cmd in SINGLE:
        code = _call(SINGLE[cmd], rest)
        return code if isinstance(code, int) else 0
    if cmd in JOBS:
        targets = JOBS[cmd]
        if rest and rest[0] in {"-h", "--help"}:
            print(f"usage: memroute {cmd} <target> [recipe.yaml] [options]\n\ntargets: {', '.join(sorted(targets))}"
                  f"\n\n'memroute {cmd} <target> --help' lists a target's options.")
            return 0
        if not rest or rest[0] not in targets:
            got = f" (got {rest[0]!r})" if rest else ""
            print(f"memroute {cmd}: choose a target from {sorted(targets)}{got}", file=sys.stderr)
            return 2
        _call(targets[rest[0]], rest[1:])
        return 0
    import difflib

    close = difflib.get_close_matches(cmd, list(JOBS) + list(SINGLE), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    print(f"memroute: unknown command {cmd!r}{hint}\n\n{USAGE}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Run a job. A user error (bad recipe, flag, record or export directory) prints one line naming the
    file / option / record and exits 2; ``--debug`` (or ``MEMROUTE_DEBUG=1``) shows the traceback instead."""
    import os

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get(DEBUG_ENV, "").lower() not in {"", "0", "false", "no"}
    argv = [a for a in argv if a != "--debug"]
    if debug:
        return run(argv)
    try:
        return run(argv)
    except user_error_types() as err:
        msg = str(err) if isinstance(err, ValueError) or not getattr(err, "filename", None) else \
            f"{err.filename}: {err.strerror or err}"
        print(f"memroute: error: {msg or type(err).__name__}\n(--debug or {DEBUG_ENV}=1 shows the traceback)",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
