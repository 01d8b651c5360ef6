"""Leave-one-corpus-out evaluation: does a router trained without a corpus work on it?

``memroute eval sufficiency --leave_out CORPUS [CORPUS ...|all]`` (and ``memroute eval retrieval --leave_out ...``)
dispatch here. The per-corpus files come from a mix manifest (``--manifest``, written by ``memroute synth mix``:
each source's corpus is read from the ``manifest.json`` of the synthesis run beside it, else its folder name) or
are named (``--corpus_files NAME=TRAIN[,HELDOUT] ...``; ``TRAIN`` may carry ``:n=N`` / ``:per_label=M`` as in
``synth mix``; ``HELDOUT`` defaults to ``eval.jsonl`` beside ``TRAIN``). For every left-out corpus C:

1. the training file without C (``OUT/C/train_without.jsonl``, drawn by ``synth mix`` from every other
   source; it is checked to hold no record of C's files);
2. the router without C: taken (``--router_without [C=]DIR``), reused (``OUT/C/router`` already exported), or
   trained with the trainer's own ``main`` (``--train_recipe``, ``--train_top_layers``, ``--train_args "..."``);
3. on C's held-out file: the base, the router without C, and the in-corpus router (``--router_in_corpus [C=]DIR``,
   optional), each scored by the ordinary evaluator into ``OUT/C/<model>/`` (its score cache makes a rerun
   score nothing twice); with ``--extra_train_seeds S ...`` also the router without C at each trainer seed
   (``OUT/C/seed<S>/``), its AUROC on C per seed, mean and std.

Results: ``OUT/leave_out.json`` (per corpus, per model: AUROC / AP for the sufficiency router, Recall@5 / MRR@10
for the retriever), ``OUT/leave_out.md`` (one row per corpus) and ``OUT/leave_out.png`` (grouped bars).
Retrieval: ``--corpus_files NAME=TRAIN[,HELDOUT]`` are ``synth retriever`` record files; the held-out questions
are C's episodes named in ``HELDOUT`` and are ranked over ``--corpus_paths NAME=PATH`` (``load_corpus``).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from eval.leave_out_report import bar_plot, format_by_negative, format_calibration, format_seeds, format_table
from routers.io import OutputLock, atomic_write_json, atomic_write_text, read_jsonl
from routers.logs import get_logger

log = get_logger(__name__)

KINDS = ("sufficiency", "retrieval")
DEFAULT_BASE = {"sufficiency": "HuggingFaceTB/SmolLM2-135M-Instruct",
                "retrieval": "sentence-transformers/all-MiniLM-L6-v2"}


@dataclass
class LeaveOutConfig:
    """Options of ``memroute eval sufficiency|retrieval --leave_out``."""

    leave_out: list[str] = field(default_factory=list, metadata={"help": "corpora to leave out, or 'all'"})
    manifest: str | None = field(default=None, metadata={"help": "a `memroute synth mix` manifest (.manifest.json)"})
    corpus_files: list[str] = field(default_factory=list, metadata={"help": "NAME=TRAIN[,HELDOUT] ... (instead of --manifest)"})
    corpus_paths: list[str] = field(default_factory=list, metadata={
        "help": "retrieval: NAME=PATH of each corpus's episodes (load_corpus); default the loader's own"})
    train_recipe: str | None = field(default=None, metadata={"help": "trainer recipe (YAML) for the routers without C"})
    train_top_layers: int | None = field(default=None, metadata={"help": "sufficiency: the frozen-prefix path"})
    train_args: str = field(default="", metadata={"help": "more trainer flags, one string (e.g. \"--max_steps 50\")"})
    router_without: list[str] = field(default_factory=list, metadata={"help": "[NAME=]DIR: take, do not train"})
    router_in_corpus: list[str] = field(default_factory=list, metadata={"help": "[NAME=]DIR: the in-corpus router"})
    base_model: str | None = field(default=None, metadata={"help": "base model / encoder (default: SmolLM2 / MiniLM)"})
    eval_recipe: str | None = field(default=None, metadata={"help": "recipe of the per-model evaluator"})
    eval_args: str = field(default="", metadata={"help": "more evaluator flags, one string"})
    calibration_travel: bool = field(default=True, metadata={
        "help": "sufficiency: also score the router without C on the other corpora's held-out files, calibrate tau "
                "there and judge it on C (eval/calibration_travel.py)"})
    target_precision: float = field(default=0.9, metadata={"help": "stop-precision target of the calibration"})
    retrieval_hybrid: bool = field(default=True, metadata={
        "help": "retrieval: also score each encoder inside the hybrid prefix (BM25 + dense), as deployed"})
    retrieval_peak_fusion: bool = field(default=True, metadata={
        "help": "retrieval: also score each hybrid with the label-free per-query weight (--fusion peak): "
                "hybrid_base_peak, hybrid_without_peak, ..."})
    retrieval_dense_weights: list[float] = field(default_factory=list, metadata={
        "help": "retrieval: choose the hybrid's dense weight for the router without C among these, by mean Recall@5 "
                "on the other (training) corpora's held-out questions, and score C at it (hybrid_without_chosen); "
                "C's own labels are never used. Empty: the evaluator's dense_weight only"})
    surface_baseline: bool = field(default=True, metadata={
        "help": "sufficiency: also fit a no-reading baseline (eval/surface_baseline.py: step count, length, question-"
                "step cosines; logistic regression) on the training file without C and score C with it ('surface')"})
    surface_encoder: str = field(default="sentence-transformers/all-MiniLM-L6-v2", metadata={
        "help": "encoder of the surface baseline's cosines"})
    recalibration_labels: list[int] = field(default_factory=lambda: [20, 40], metadata={
        "help": "k: also recalibrate tau from k labelled samples of C (random draws), judged on the rest"})
    extra_train_seeds: list[int] = field(default_factory=list, metadata={
        "help": "sufficiency: also train the router without C at these trainer seeds (OUT/C/seed<S>/, `--seed S` "
                "after --train_args) and report its AUROC on C at every seed, mean and std: one seed cannot tell the "
                "data from the optimiser's luck. Reused on rerun, like the main router"})
    output_dir: str = "results/leave_out"
    seed: int = 0


# -- inputs ---------------------------------------------------------------------------------------------------
def _by_name(values: list[str], what: str) -> dict[str, str]:
    """``[NAME=]VALUE`` items -> {NAME: VALUE}; a bare VALUE is stored under ``"*"`` (every corpus)."""
    out = {}
    for v in values:
        name, sep, value = v.partition("=")
        name, value = (name, value) if sep and "/" not in name else ("*", v)
        if not value or name in out:
            raise ValueError(f"{what}: bad or repeated item {v!r}")
        out[name] = value
    return out


def _corpus_of(train_path: Path) -> str:
    for manifest in (train_path.parent / "manifest.json",):
        if manifest.exists():
            cfg = json.loads(manifest.read_text()).get("config", {})
            if isinstance(cfg.get("corpus"), str):
                return cfg["corpus"]
    return train_path.parent.name


def corpus_sources(cfg: LeaveOutConfig) -> dict[str, list[tuple[str, Path]]]:
    """{corpus: [(mix source spec, held-out file)]} from ``--corpus_files`` or the mix ``--manifest``."""
    from data_synthesis.mix import parse_source

    if bool(cfg.manifest) == bool(cfg.corpus_files):
        raise ValueError("give --manifest (a synth mix manifest) or --corpus_files NAME=TRAIN[,HELDOUT], one of them")
    items = []
    if cfg.manifest:
        manifest = json.loads(Path(cfg.manifest).read_text())
        for spec in manifest.get("config", {}).get("sources", []):
            path = Path(parse_source(spec)[0])
            items.append((_corpus_of(path), spec, path.parent / "eval.jsonl"))
    for item in cfg.corpus_files:
        name, sep, rest = item.partition("=")
        if not sep or not name or not rest:
            raise ValueError(f"--corpus_files: expected NAME=TRAIN[,HELDOUT], got {item!r}")
        spec, _, held = rest.partition(",")
        items.append((name, spec, Path(held) if held else Path(parse_source(spec)[0]).parent / "eval.jsonl"))
    out: dict[str, list[tuple[str, Path]]] = {}
    for name, spec, held in items:
        if not Path(parse_source(spec)[0]).exists():
            raise FileNotFoundError(f"{name}: training file {parse_source(spec)[0]} does not exist")
        out.setdefault(name, []).append((spec, held))
    if len(out) < 2:
        raise ValueError(f"leave-one-corpus-out needs at least two corpora, got {sorted(out)}")
    return out


def _held_out(sources: list[tuple[str, Path]], name: str) -> Path:
    held = sorted({h for _, h in sources})
    if len(held) != 1 or not held[0].exists():
        raise FileNotFoundError(f"{name}: one held-out file expected, got {[str(h) for h in held]} "
                                "(give NAME=TRAIN,HELDOUT)")
    return held[0]


# -- the training file without C ------------------------------------------------------------------------------
def write_train_without(kind: str, sources: dict, left: str, path: Path, seed: int) -> dict:
    """The training file of every corpus but ``left``; raises if any record of ``left``'s files got in."""
    from data_synthesis.mix import parse_source

    specs = [s for name, srcs in sources.items() if name != left for s, _ in srcs]
    if kind == "sufficiency":
        from data_synthesis.mix import MixConfig, mix

        info = mix(MixConfig(output=str(path), sources=specs, seed=seed), lock=False)
        key = "id"
    else:  # retriever records: concatenated, keeping only records of the other corpora
        # One `synth retriever` file may hold every corpus (each record names its `source`): a file named by
        # several corpora is read once, and a record belongs to its `source` (else to the corpus naming the file).
        path.parent.mkdir(parents=True, exist_ok=True)
        files = {}
        for name, srcs in sources.items():
            for s, _ in srcs:
                files.setdefault(str(parse_source(s)[0]), name)
        rows = [r for f, name in files.items() for r in read_jsonl(f) if (r.get("source") or name) != left]
        atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        info, key = {"samples": len(rows)}, "id"
    written = {r[key] for r in read_jsonl(path)}
    left_ids = {r[key] for s, h in sources[left] for p in (parse_source(s)[0], h) for r in read_jsonl(p)
                if kind == "sufficiency" or (r.get("source") or left) == left}
    leaked = written & left_ids
    if leaked:
        raise RuntimeError(f"{path}: {len(leaked)} record(s) of the left-out corpus {left} (e.g. {sorted(leaked)[:3]})")
    return info


# -- training and scoring -------------------------------------------------------------------------------------
def _trainer(kind: str) -> Callable:
    """The trainer, run in a child process: one process training and scoring corpus after corpus grew to 20 GB
    resident by the third left-out corpus (measured on the CPU run) and was OOM-killed; a child returns it all."""
    module = "train.sufficiency" if kind == "sufficiency" else "train.retriever"

    def train_in_child(argv: list[str]) -> None:
        from routers.workers import run_module_in_child

        code = run_module_in_child(module, argv)  # the child ends if this process is killed: no orphan trainer
        if code != 0:
            raise RuntimeError(f"{module} {' '.join(argv)} failed (exit code {code}); rerun to resume "
                               "from its last checkpoint")
    return train_in_child


def _evaluator(kind: str) -> Callable:
    """The ordinary evaluator's main (by name: eval.sufficiency / eval.retrieval dispatch here, no import cycle)."""
    import importlib

    return importlib.import_module(f"eval.{kind}").main


def train_without(kind: str, cfg: LeaveOutConfig, train_file: Path, root: Path, trainer: Callable | None,
                  seed: int | None = None) -> Path:
    export = root / "router"
    if (export / "router_config.json").exists() or (export / "modules.json").exists():
        log.info("%s: reusing the router trained without this corpus", export)
        return export
    if not cfg.train_recipe:
        raise ValueError("no router without this corpus: give --train_recipe (to train one) or --router_without DIR")
    argv = [cfg.train_recipe, "--train_file", str(train_file), "--output_dir", str(root / "train"),
            "--export_dir", str(export)]
    if cfg.train_top_layers and kind == "sufficiency":
        argv += ["--train_top_layers", str(cfg.train_top_layers)]
    argv += shlex.split(cfg.train_args) + (["--seed", str(seed)] if seed is not None else [])
    log.info("training without %s: %s", train_file.parent.name, " ".join(argv))
    (trainer or _trainer(kind))(argv)
    return export


def score_sufficiency(cfg: LeaveOutConfig, held: Path, models: dict[str, str | None], root: Path) -> dict:
    """{model: {auroc, ap, n}} on ``held``; the base is scored once (in the ``without`` run)."""
    from eval.metrics import auroc_by_negative_kind

    eval_main = _evaluator("sufficiency")
    out = {}
    base = models["base"]
    for name in ("without", "in_corpus"):
        if not models.get(name):
            continue
        argv = ([cfg.eval_recipe] if cfg.eval_recipe else []) + [
            "--data", str(held), "--router", str(models[name]), "--output_dir", str(root / name),
            "--base_model", base if name == "without" else "none"] + shlex.split(cfg.eval_args)
        metrics = eval_main(argv)
        scored = list(read_jsonl(root / name / "scores.jsonl"))
        for model, m in metrics["models"].items():
            key = "base" if model == "base" else name
            out[key] = {"auroc": m.get("auroc"), "ap": m.get("ap"), "n": metrics["n_samples"],
                        "n_over_budget": m.get("n_over_budget"), "from_cache": m.get("timing", {}).get("from_cache"),
                        "auroc_by_negative": auroc_by_negative_kind(scored, model)}
    return out


def score_seeds(cfg: LeaveOutConfig, held: Path, main_auroc: float | None, train_file: Path, root: Path,
                trainer: Callable | None) -> dict:
    """AUROC on C of the router without C at the main seed and at every ``extra_train_seeds`` (trained into
    ``OUT/C/seed<S>/``); mean and sample std over all of them."""
    import statistics

    auroc = {"main": main_auroc}
    for s in cfg.extra_train_seeds:
        router = train_without("sufficiency", cfg, train_file, root / f"seed{s}", trainer, seed=s)
        metrics = _evaluator("sufficiency")(([cfg.eval_recipe] if cfg.eval_recipe else []) + [
            "--data", str(held), "--router", str(router), "--output_dir", str(root / f"seed{s}" / "without"),
            "--base_model", "none"] + shlex.split(cfg.eval_args))
        auroc[str(s)] = next(m.get("auroc") for name, m in metrics["models"].items() if name != "base")
    vals = [v for v in auroc.values() if isinstance(v, (int, float))]
    return {"auroc": auroc, "mean": statistics.fmean(vals) if vals else None,
            "std": statistics.stdev(vals) if len(vals) > 1 else None, "n_seeds": len(vals)}


def surface_of(cfg: LeaveOutConfig, held: Path, root: Path) -> dict:
    """The no-reading baseline fitted without C, scored on C; cached in ``OUT/C/surface.json`` (same inputs only)."""
    from eval.surface_baseline import surface_baseline
    from routers.models import load_encoder

    train, cache = root / "train_without.jsonl", root / "surface.json"
    key = {"encoder": cfg.surface_encoder, "train": [str(train), train.stat().st_size],
           "held_out": [str(held), held.stat().st_size]}
    if cache.exists() and (hit := json.loads(cache.read_text())).get("key") == key:
        return hit["result"]
    result = surface_baseline(list(read_jsonl(train)), list(read_jsonl(held)), load_encoder(cfg.surface_encoder))
    atomic_write_json(cache, {"key": key, "result": result})
    return result


def _episodes_of(held: Path, corpus: str) -> list[str]:
    return sorted({r["episode_id"] for r in read_jsonl(held) if r.get("source", corpus) == corpus})


def choose_dense_weight(cfg: LeaveOutConfig, others: dict[str, Path], router: str, root: Path) -> dict:
    """The hybrid dense weight for ``router`` (trained without C) with the best mean Recall@5 over the other
    corpora's held-out questions (ties: the smaller weight), and every weight's per-corpus Recall@5."""
    eval_main, paths = _evaluator("retrieval"), _by_name(cfg.corpus_paths, "--corpus_paths")
    grid = [float(w) for w in cfg.retrieval_dense_weights]
    per: dict[str, dict[str, float]] = {}
    for other, held in sorted(others.items()):
        argv = ([cfg.eval_recipe] if cfg.eval_recipe else []) + [
            "--corpus", other, "--eval_episodes", *_episodes_of(held, other), "--trained_encoder", router,
            "--systems", "hybrid_trained", "--dense_weight_sweep", *map(str, grid),
            "--output_dir", str(root / "dense_weight" / other)]
        if other in paths:
            argv += ["--corpus_path", paths[other]]
        sweep = eval_main(argv + shlex.split(cfg.eval_args))["systems"]["hybrid_trained"]["by_dense_weight"]
        per[other] = {str(w): sweep[str(w)]["recall@5"] for w in grid}
    mean = {str(w): sum(per[o][str(w)] for o in per) / len(per) for w in grid}
    best = max(grid, key=lambda w: (mean[str(w)], -w))
    return {"dense_weight": best, "chosen_on": sorted(per), "mean_recall@5": mean, "recall@5": per}


def score_retrieval(cfg: LeaveOutConfig, corpus: str, held: Path, models: dict[str, str | None], root: Path,
                    others: dict[str, Path] | None = None) -> dict:
    """{system: {recall@5, mrr@10, n}}: BM25, the base encoder, the router without C (and in-corpus), each also
    as the hybrid prefix a deployment uses (BM25 + dense: ``hybrid_base``, ``hybrid_without``, ...; with
    ``retrieval_peak_fusion`` also at the per-query weight: ``hybrid_base_peak``, ``hybrid_without_peak``, ...); with
    ``retrieval_dense_weights`` and ``others`` (the training corpora's held-out files) also ``hybrid_without_chosen``:
    the router without C in the hybrid at the weight chosen on the training corpora."""
    eval_main = _evaluator("retrieval")
    episodes = _episodes_of(held, corpus)
    paths = _by_name(cfg.corpus_paths, "--corpus_paths")
    out = {}
    for name in ("without", "in_corpus"):
        if not models.get(name):
            continue
        systems = ["bm25", "base", "trained"] if name == "without" else ["trained"]
        if cfg.retrieval_hybrid:
            systems += ["hybrid_base", "hybrid_trained"] if name == "without" else ["hybrid_trained"]
        argv = ([cfg.eval_recipe] if cfg.eval_recipe else []) + [
            "--corpus", corpus, "--eval_episodes", *episodes, "--trained_encoder", str(models[name]),
            "--base_encoder", models["base"], "--systems", *systems, "--output_dir", str(root / name)]
        if corpus in paths:
            argv += ["--corpus_path", paths[corpus]]
        runs = [("", argv)]
        if cfg.retrieval_hybrid and cfg.retrieval_peak_fusion:  # the hybrids again, per-query weight
            hybrids = [s for s in systems if s.startswith("hybrid_")]
            runs.append(("_peak", argv[:argv.index("--systems") + 1] + hybrids + [
                "--output_dir", str(root / f"{name}_peak"), "--fusion", "peak"] + argv[argv.index("--output_dir") + 2:]))
        for suffix, run_argv in runs:
            for system, m in eval_main(run_argv + shlex.split(cfg.eval_args))["systems"].items():
                key = {"trained": name, "hybrid_trained": f"hybrid_{name}"}.get(system, system) + suffix
                out[key] = {"recall@5": m.get("recall@5"), "mrr@10": m.get("mrr@10"), "n": m.get("n_queries")}
    if cfg.retrieval_dense_weights and others and models.get("without"):
        chosen = choose_dense_weight(cfg, others, str(models["without"]), root)
        argv = ([cfg.eval_recipe] if cfg.eval_recipe else []) + [
            "--corpus", corpus, "--eval_episodes", *episodes, "--trained_encoder", str(models["without"]),
            "--systems", "hybrid_trained", "--dense_weight", str(chosen["dense_weight"]),
            "--output_dir", str(root / "without_chosen_weight")]
        if corpus in paths:
            argv += ["--corpus_path", paths[corpus]]
        m = eval_main(argv + shlex.split(cfg.eval_args))["systems"]["hybrid_trained"]
        out["hybrid_without_chosen"] = {"recall@5": m.get("recall@5"), "mrr@10": m.get("mrr@10"),
                                        "n": m.get("n_queries"), "choice": chosen}
    return out


def calibration_of(cfg: LeaveOutConfig, sources: dict, corpus: str, router: str, root: Path) -> dict:
    """tau calibrated on the training corpora's held-out samples, judged on C; and recalibrated from k of C's."""
    from eval.calibration_travel import recalibrate_with_labels, travel

    eval_main, pooled = _evaluator("sufficiency"), []
    for other in sorted(sources):
        if other == corpus:
            continue
        out = root / "calibration" / other
        eval_main(([cfg.eval_recipe] if cfg.eval_recipe else []) + [
            "--data", str(_held_out(sources[other], other)), "--router", router, "--output_dir", str(out),
            "--base_model", "none"] + shlex.split(cfg.eval_args))
        pooled += list(read_jsonl(out / "scores.jsonl"))
    target = list(read_jsonl(root / "without" / "scores.jsonl"))
    return {"calibrated_on": [c for c in sorted(sources) if c != corpus],
            "travel": travel(pooled, target, cfg.target_precision),
            "recalibrated": [r for k in cfg.recalibration_labels
                             if (r := recalibrate_with_labels(target, k, target_precision=cfg.target_precision,
                                                              seed=cfg.seed))]}


# -- the report -----------------------------------------------------------------------------------------------
def run(kind: str, cfg: LeaveOutConfig, trainer: Callable | None = None) -> dict:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if cfg.extra_train_seeds and (kind != "sufficiency" or cfg.router_without):
        raise ValueError("--extra_train_seeds trains sufficiency routers: not with --router_without or retrieval")
    sources = corpus_sources(cfg)
    left_out = sorted(sources) if [c.lower() for c in cfg.leave_out] == ["all"] else list(cfg.leave_out)
    unknown = [c for c in left_out if c not in sources]
    if not left_out or unknown:
        raise ValueError(f"--leave_out {unknown or '[]'}: choose among the corpora {sorted(sources)} (or 'all')")
    without, in_corpus = _by_name(cfg.router_without, "--router_without"), _by_name(cfg.router_in_corpus, "--router_in_corpus")
    base = cfg.base_model or DEFAULT_BASE[kind]
    out = Path(cfg.output_dir)
    rows: dict[str, dict] = {}
    with OutputLock(out):
        for corpus in left_out:
            root = out / corpus
            held = _held_out(sources[corpus], corpus)
            info = write_train_without(kind, sources, corpus, root / "train_without.jsonl", cfg.seed)
            router = without.get(corpus) or without.get("*") or train_without(
                kind, cfg, root / "train_without.jsonl", root, trainer)
            models = {"base": base, "without": str(router), "in_corpus": in_corpus.get(corpus) or in_corpus.get("*")}
            score = score_sufficiency(cfg, held, models, root) if kind == "sufficiency" else \
                score_retrieval(cfg, corpus, held, models, root,
                                {o: _held_out(sources[o], o) for o in sources if o != corpus})
            rows[corpus] = {**score, "held_out": str(held), "train_without": {"file": str(root / "train_without.jsonl"),
                            "samples": info.get("samples")}, "models": models}
            if kind == "sufficiency" and cfg.extra_train_seeds:
                rows[corpus]["without_seeds"] = score_seeds(cfg, held, score.get("without", {}).get("auroc"),
                                                            root / "train_without.jsonl", root, trainer)
            if kind == "sufficiency" and cfg.surface_baseline:
                rows[corpus]["surface"] = surface_of(cfg, held, root)
            if kind == "sufficiency" and cfg.calibration_travel:
                rows[corpus]["calibration"] = calibration_of(cfg, sources, corpus, str(router), root)
        table = format_table(kind, rows)
        if kind == "sufficiency":
            table += "\nAUROC of the positives against each kind of negative:\n\n" + format_by_negative(rows)
        chosen = {c: r["hybrid_without_chosen"]["choice"] for c, r in rows.items() if "hybrid_without_chosen" in r}
        if chosen:
            table += "\nhybrid_without_chosen: dense weight chosen on the training corpora (mean Recall@5 there): " + \
                "; ".join(f"{c}: {ch['dense_weight']:g} on {', '.join(ch['chosen_on'])}" for c, ch in chosen.items()) + "\n"
        if any("without_seeds" in r for r in rows.values()):
            table += "\nThe router without C at every trainer seed (AUROC on C):\n\n" + format_seeds(rows)
        if kind == "sufficiency" and cfg.calibration_travel:
            table += (f"\nCalibration travel (target stop-precision {cfg.target_precision}):\n\n"
                      + format_calibration(rows))
        atomic_write_text(out / "leave_out.md", table)
        bar_plot(kind, rows, out / "leave_out.png")
        result = {"kind": kind, "config": asdict(cfg), "corpora": sorted(sources), "results": rows,
                  "files": {"table": "leave_out.md", "plot": "leave_out.png"}}
        atomic_write_json(out / "leave_out.json", result)
    log.info("leave-one-corpus-out (%s):\n%s", kind, table)
    return result


def make_parser(kind: str):
    from routers.config import make_arg_parser

    return make_arg_parser([LeaveOutConfig], prog=f"memroute eval {kind} --leave_out",
                           description="Leave-one-corpus-out: routers trained without a corpus, judged on it.")


def main(argv=None, kind: str = "sufficiency", trainer: Callable | None = None) -> dict:
    """``memroute eval sufficiency|retrieval --leave_out ...``; a leading evaluator recipe becomes ``eval_recipe``."""
    import sys

    from routers.config import parse_config
    from routers.logs import setup_cli_logging

    setup_cli_logging()
    argv = list(sys.argv[1:] if argv is None else argv)
    recipe = argv.pop(0) if argv and argv[0].endswith((".yaml", ".yml")) and not argv[0].startswith("-") else None
    (cfg,) = parse_config(make_parser(kind), [LeaveOutConfig], argv)
    if recipe and not cfg.eval_recipe:
        cfg.eval_recipe = recipe
    return run(kind, cfg, trainer)
