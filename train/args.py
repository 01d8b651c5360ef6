"""Option groups every trainer shares, declared once (TRL's ``ModelConfig`` pattern).

A trainer config inherits them next to ``TrainingArguments``: ``class XConfig(LoraArgs, RunArgs,
TrainingArguments)``; the flags and recipe keys are the same in every trainer, and a trainer that needs another
default re-declares just that field.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoraArgs:
    """The adapter a causal-LM router trains (peft LoRA), or full fine-tuning with ``use_lora: false``."""

    use_lora: bool = True
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
                                           metadata={"help": "module names, or 'all-linear'"})


@dataclass
class RunArgs:
    """Where a run ends (export), how long it may take, and whether it continues an earlier one."""

    export_dir: str | None = field(default=None, metadata={"help": "export the trained router here after training"})
    max_train_minutes: float | None = field(default=None, metadata={
        "help": "stop gracefully (checkpoint + export) after this many minutes of training; for time-boxed jobs"})
    resume: str = field(default="auto", metadata={
        "help": "'auto' resumes from the last complete checkpoint in output_dir (refused if the settings changed); "
                "'never' starts over"})


@dataclass
class DevSplitArgs:
    """Evaluation during training on a dev split drawn from the *training* file's episodes (never a held-out
    episode), and early stopping. With none of these set a run trains exactly as before (no dev split)."""

    dev_fraction: float | None = field(default=None, metadata={
        "help": "hold out this fraction of the training file's episodes (at least one, seeded by dev_seed) as the dev "
                "split, evaluated during training; the rest trains"})
    dev_episodes: list[str] | None = field(default=None, metadata={
        "help": "hold out these episode ids of the training file as the dev split (instead of dev_fraction)"})
    dev_seed: int = field(default=0, metadata={
        "help": "seed of the dev_fraction episode draw (separate from seed: changing the training seed keeps the split)"})
    early_stopping_patience: int | None = field(default=None, metadata={
        "help": "stop after this many evaluations without improvement of metric_for_best_model (needs an eval set, "
                "eval_strategy steps/epoch and load_best_model_at_end)"})
    early_stopping_threshold: float = field(default=0.0, metadata={
        "help": "minimum improvement of metric_for_best_model that resets the early-stopping patience"})


@dataclass
class EvalFileArgs(DevSplitArgs):
    """A dev split, or a separate eval file whose episodes are disjoint from the training file's."""

    eval_file: str | None = field(default=None, metadata={
        "help": "evaluate on this file during training (its episode ids must not overlap the training file's); "
                "instead of dev_fraction / dev_episodes"})
