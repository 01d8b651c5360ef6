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
