"""Benchmark: held-out AUROC reached vs wall time for the sufficiency trainer's paths, on the same data.

    python -m eval.bench.training_paths --train_file outputs/quickstart/data/train.jsonl \\
        --eval_file outputs/quickstart/data/eval.jsonl --output_dir results/bench_training_paths

Each path trains its own recipe to the end on the same samples and seed, is exported, and the export is scored
on the same held-out file with the same base model; the JSON holds machine, versions, each path's config,
wall time (caching included), steps and base / trained AUROC, AP and ECE, with the ratios against the
``lora_all_layers`` baseline; the PNG plots AUROC against wall time. Long (minutes to an hour on CPU): not part
of ``memroute bench``'s default set.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eval.bench.common import SCHEMA_VERSION, machine_info
from routers.base import git_revision, library_versions
from routers.config import make_arg_parser, parse_config
from routers.io import atomic_write_json
from routers.logs import setup_cli_logging
from routers.models import DEFAULT_CAUSAL_LM

# name -> trainer flags. frozen_prefix = the quickstart's path; lora_all_layers = the quickstart before it
# (LoRA r16 on every linear layer of every layer, distillation on, 60 steps of 4).
PATHS = {
    "frozen_prefix": ["--train_top_layers", "24", "--use_lora", "true", "--lora_r", "16", "--lora_target_modules",
                      "all-linear", "--lora_dropout", "0", "--lambda_rep", "0", "--learning_rate", "1e-3",
                      "--num_train_epochs", "3", "--per_device_train_batch_size", "8",
                      "--train_sampling_strategy", "group_by_length"],
    "lora_all_layers": ["--use_lora", "true", "--lora_r", "16", "--lora_target_modules", "all-linear",
                        "--lambda_rep", "0.1", "--learning_rate", "3e-4", "--max_steps", "60",
                        "--per_device_train_batch_size", "4"],
}
BASELINE = "lora_all_layers"


@dataclass
class TrainingPathsConfig:
    train_file: str = "outputs/quickstart/data/train.jsonl"
    eval_file: str = "outputs/quickstart/data/eval.jsonl"
    model_name_or_path: str = DEFAULT_CAUSAL_LM
    output_dir: str = "results/bench_training_paths"
    paths: list[str] = field(default_factory=lambda: list(PATHS), metadata={"help": f"any of {list(PATHS)}"})
    max_length: int = 512
    seed: int = 0

    def __post_init__(self):
        unknown = [p for p in self.paths if p not in PATHS]
        if unknown or not self.paths:
            raise ValueError(f"paths: unknown {unknown}; choose from {list(PATHS)}")


def run_path(cfg: TrainingPathsConfig, name: str, use_cpu: bool) -> dict:
    from eval import sufficiency as eval_sufficiency
    from train import sufficiency as train_sufficiency

    out = Path(cfg.output_dir) / name
    args = ["--model_name_or_path", cfg.model_name_or_path, "--train_file", cfg.train_file,
            "--output_dir", str(out / "train"), "--export_dir", str(out / "router"), "--resume", "never",
            "--max_length", str(cfg.max_length), "--seed", str(cfg.seed), "--save_strategy", "no",
            "--logging_steps", "10", "--warmup_steps", "0.1", "--lr_scheduler_type", "cosine",
            "--report_to", "none", *PATHS[name]]
    if use_cpu:
        args += ["--use_cpu", "true"]
    t = time.perf_counter()
    _, info = train_sufficiency.main(args)
    wall = time.perf_counter() - t
    metrics = eval_sufficiency.main(["--router", str(out / "router"), "--base_model", cfg.model_name_or_path,
                                     "--data", cfg.eval_file, "--output_dir", str(out / "eval")])
    pick = lambda m: {k: m.get(k) for k in ("auroc", "ap", "ece")}  # noqa: E731
    return {"flags": PATHS[name], "train_wall_s": round(wall, 1), "steps": info["steps"], "samples": info["samples"],
            "frozen_prefix": info.get("frozen_prefix"), "trained": pick(metrics["models"]["trained"]),
            "base": pick(metrics["models"]["base"]), "n_eval": metrics["n_samples"]}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from eval.plots import save_figure

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, r in results.items():
        ax.scatter([r["train_wall_s"] / 60], [r["trained"]["auroc"]], s=60, label=f"{name} ({r['steps']} steps)")
    base = next(iter(results.values()))["base"]["auroc"]
    ax.axhline(base, color="grey", linestyle="--", label=f"base (zero-shot) {base:.3f}")
    ax.set_xlabel("training wall time incl. caching (min)")
    ax.set_ylabel("held-out AUROC")
    ax.set_title("Sufficiency training paths, same data")
    ax.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


def make_parser():
    return make_arg_parser([TrainingPathsConfig], prog="python -m eval.bench.training_paths",
                           description="AUROC reached vs wall time for the sufficiency training paths.")


def main(argv=None) -> dict:
    import torch

    setup_cli_logging()  # python -m eval.bench.training_paths (the trainers log their progress)
    (cfg,) = parse_config(make_parser(), [TrainingPathsConfig], argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = {name: run_path(cfg, name, use_cpu=device == "cpu") for name in cfg.paths}
    if BASELINE in results:
        b = results[BASELINE]
        for r in results.values():
            r["vs_baseline"] = {"wall_ratio": round(r["train_wall_s"] / b["train_wall_s"], 3),
                                "auroc_delta": round(r["trained"]["auroc"] - b["trained"]["auroc"], 4)}
    report = {"schema_version": SCHEMA_VERSION, "benchmark": "training_paths", "machine": machine_info(device),
              "versions": library_versions(), "git_revision": git_revision(), "config": asdict(cfg),
              "results": results}
    out = Path(cfg.output_dir)
    atomic_write_json(out / "training_paths.json", report)
    plot(results, out / "training_paths.png")
    print(json.dumps(results, indent=2))  # the result the command was run for (also in training_paths.json)
    return report


if __name__ == "__main__":
    main()
