"""Train the Router-Mem sufficiency router: LoRA + grouped-token loss + representation distillation.

    accelerate launch -m train.sufficiency configs/sufficiency/train/smollm2.yaml [--max_steps 50 ...]
    memroute train sufficiency configs/sufficiency/train/smollm2.yaml

L = L_cls + lambda_rep * s_0 * L_rep. The teacher is, by default, the frozen base model itself
(LoRA adapters disabled) reading question + context + rationale, so no second copy of the weights
is held; its decision-position states never change and are cached after the first pass.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import Trainer, TrainingArguments

from routers.io import atomic_write_json
from data_synthesis.sufficiency_samples import read_samples
from routers.models import DEFAULT_CAUSAL_LM, left_pad, padding_safe_mask
from routers.sufficiency import NO_WORDS, YES_WORDS, build_prompt, last_token_logits, verbalizer_ids
from routers.config import check_resume_value
from train.args import LoraArgs, RunArgs
from train.checkpoints import resolve_resume, time_budget_callback
from routers.models import check_local_model_path
from routers.validation import int_option, number_option, option_problems, raise_option_problems
from train.distributed import (check_start, check_world_size, cpu_ddp_defaults, resolve_attn_implementation,
                               run_fingerprint, training_argument_checks, warn_if_fsdp_ignored)
from train.frozen_prefix import (check_split, decoder_of, freeze_all_but_top, layer_slice, linear_module_names,
                                 lower_states, num_layers, pad_states)
from train.losses import GroupedTokenLoss, RepresentationDistillationLoss



@dataclass
class SufficiencyTrainingConfig(LoraArgs, RunArgs, TrainingArguments):
    """TrainingArguments plus the router, LoRA and distillation options."""

    model_name_or_path: str = field(default=DEFAULT_CAUSAL_LM, metadata={"help": "HF id, local path or 'smollm2'"})
    train_file: str = "outputs/sufficiency_data/train.jsonl"
    max_train_samples: int | None = None
    max_length: int = field(default=768, metadata={"help": "longer student prompts are skipped (and counted)"})
    init_adapter: str | None = field(default=None, metadata={
        "help": "continue fine-tuning from a saved LoRA adapter (a previous run's output_dir); its r/alpha/targets "
                "win over the lora_* options. The schedule and optimizer start fresh."})
    lambda_rep: float = field(default=0.1, metadata={"help": "weight of the distillation term; 0 disables it"})
    rep_layer: int | None = field(default=None, metadata={"help": "hidden_states index; None = middle layer"})
    s0: float | None = field(default=None, metadata={"help": "scale of L_rep; None = L_cls/L_rep on the first batch"})
    cache_teacher_states: bool = True
    teacher_model_name_or_path: str | None = field(
        default=None, metadata={"help": "separate frozen teacher (same hidden size); None = base model, adapters off"})
    threshold: float = 0.5
    router_max_input_tokens: int = 1024
    padding_safe_mask: bool = field(default=True, metadata={
        "help": "with sdpa attention, train on a 4D mask where each left-pad query sees itself (no empty "
                "attention rows: CUDA SDPA returns NaN gradients for them); false = the plain 2D mask"})
    attn_implementation: str | None = field(default="auto", metadata={
        "help": "'auto': flash_attention_2 on CUDA when flash-attn is installed, else the transformers default "
                "(sdpa); or sdpa / eager / flash_attention_2"})
    train_top_layers: int | None = field(default=None, metadata={
        "help": "CPU-efficient path: train only the top K decoder layers (LoRA on them, or full fine-tuning with "
                "use_lora false); the frozen layers' outputs are computed once per sample and reused every epoch "
                "(train/frozen_prefix.py). Needs lambda_rep 0 and no init_adapter"})
    # Sensible defaults for this trainer (override the TrainingArguments ones).
    output_dir: str = "outputs/sufficiency_router"
    remove_unused_columns: bool = False
    logging_steps: int = 5
    save_steps: int = 50
    save_total_limit: int | None = 2
    learning_rate: float = 2e-4
    per_device_train_batch_size: int = 4

    def __post_init__(self):
        # Conflicts and impossible values fail at parse time, before any model or data is loaded.
        check_resume_value(self.resume)
        problems = option_problems([
            *training_argument_checks(self),
            int_option(self.max_length, "max_length"),
            int_option(self.max_train_samples, "max_train_samples", allow_none=True),
            int_option(self.lora_r, "lora_r"),
            number_option(self.lora_alpha, "lora_alpha", low=0, low_open=True),
            number_option(self.lora_dropout, "lora_dropout", low=0, high=1, high_open=True),
            (bool(self.lora_target_modules), "lora_target_modules must not be empty"),
            number_option(self.lambda_rep, "lambda_rep", low=0),
            number_option(self.s0, "s0", low=0, low_open=True, allow_none=True),
            number_option(self.threshold, "threshold", low=0, high=1),
            int_option(self.router_max_input_tokens, "router_max_input_tokens"),
            (self.use_lora or not self.init_adapter, "init_adapter needs use_lora: true"),
            int_option(self.train_top_layers, "train_top_layers", allow_none=True),
            (self.train_top_layers is None or not self.lambda_rep,
             "train_top_layers needs lambda_rep 0: distillation reads a middle layer, which the frozen-prefix path "
             "never runs again (the student's and teacher's states there are identical)"),
            (self.train_top_layers is None or not self.init_adapter,
             "train_top_layers cannot continue an init_adapter (its adapters may sit in the frozen layers)"),
            (self.use_lora or not self.lambda_rep or bool(self.teacher_model_name_or_path),
             "lambda_rep > 0 (distillation) needs use_lora: true (the teacher is the base model with its adapters "
             "off) or a separate teacher_model_name_or_path; pass --lambda_rep 0 to fine-tune without it"),
        ])
        raise_option_problems(problems)
        super().__post_init__()


# What a resumed run must share with the run that wrote its checkpoints (plus the TrainingArguments
# optimisation options and the train file's path and sha256; see train.distributed.run_fingerprint).
FINGERPRINT_KEYS = ("model_name_or_path", "max_train_samples", "max_length", "use_lora", "lora_r", "lora_alpha",
                    "lora_dropout", "lora_target_modules", "init_adapter", "lambda_rep", "rep_layer", "s0",
                    "teacher_model_name_or_path", "padding_safe_mask", "train_top_layers")


class SufficiencyDataset(torch.utils.data.Dataset):
    """Tokenized student prompts (question + context) and teacher prompts (+ rationale).

    ``data`` is a sample file (read and validated with :func:`data_synthesis.sufficiency.read_samples`) or
    the records it returned: the trainer reads them before loading the model, so bad data fails fast.
    """

    def __init__(self, data, tokenizer, max_length: int, max_samples: int | None = None, teacher_tokenizer=None,
                 source: str | None = None):
        teacher_tokenizer = teacher_tokenizer or tokenizer
        if isinstance(data, (str, os.PathLike)):
            path, records = str(data), read_samples(data)
        else:
            path, records = source or "training samples", list(data)
        self.items, self.skipped_too_long = [], 0
        for rec in records:
            student = tokenizer.encode(build_prompt(tokenizer, rec["question"], rec["context"]), add_special_tokens=False)
            if len(student) > max_length:
                self.skipped_too_long += 1
                continue
            rationale = rec.get("rationale") or ""
            teacher = teacher_tokenizer.encode(build_prompt(teacher_tokenizer, rec["question"], rec["context"], rationale),
                                               add_special_tokens=False)
            self.items.append({"idx": len(self.items), "input_ids": student, "teacher_input_ids": teacher,
                               "label": int(rec["label"])})
            if max_samples and len(self.items) >= max_samples:
                break
        if not self.items:
            raise ValueError(f"{path}: no usable samples ({self.skipped_too_long} longer than max_length={max_length})")

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


@dataclass
class SufficiencyCollator:
    """Left-pads student and teacher prompts so the decision position is the last column."""

    pad_token_id: int

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        if "lower_states" in features[0]:  # the frozen-prefix path: the top layers' input, not token ids
            return {**pad_states([f["lower_states"] for f in features]),
                    "labels": torch.tensor([f["label"] for f in features], dtype=torch.long),
                    "sample_idx": torch.tensor([f["idx"] for f in features], dtype=torch.long)}
        student = left_pad([f["input_ids"] for f in features], self.pad_token_id)
        teacher = left_pad([f["teacher_input_ids"] for f in features], self.pad_token_id)
        return {**student, **{f"teacher_{k}": v for k, v in teacher.items()},
                "labels": torch.tensor([f["label"] for f in features], dtype=torch.long),
                "sample_idx": torch.tensor([f["idx"] for f in features], dtype=torch.long)}


class SufficiencyTrainer(Trainer):
    """Trainer whose loss is L_cls + lambda_rep * s_0 * L_rep, with both parts logged.

    Distributed runs match one process with gradient accumulation: the loss is a per-batch mean (so
    the Trainer divides it by the accumulation steps), s_0 comes from rank 0's first batch (one process
    takes it from its first micro-batch), and the logged parts are averaged over ranks.
    """

    # compute_loss returns a per-batch mean and ignores num_items_in_batch: without this the Trainer
    # (seeing "labels" and a model taking **kwargs) skips the 1/accumulation scaling and doubles the loss at GA=2.
    loss_is_scaled_for_ga = False

    def __init__(self, *args, yes_ids, no_ids, lambda_rep: float, rep_layer: int, s0: float | None,
                 teacher_model=None, cache_teacher_states: bool = True, top_split: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.top_split = top_split  # frozen-prefix path: batches carry layers[:top_split]'s output
        self.cls_loss = GroupedTokenLoss(yes_ids, no_ids)
        self.rep_loss = RepresentationDistillationLoss()
        self.lambda_rep, self.rep_layer, self.s0 = lambda_rep, rep_layer, s0
        # A separate frozen teacher is no part of the wrapped model, so the Trainer never moves it.
        self.teacher_model = teacher_model.to(self.accelerator.device) if teacher_model is not None else None
        self.cache_teacher_states = cache_teacher_states
        self.teacher_cache: dict[int, torch.Tensor] = {}
        self._parts: dict[str, list[float]] = {"loss_cls": [], "loss_rep": []}

    @torch.no_grad()
    def teacher_states(self, model, inputs) -> torch.Tensor:
        idx = inputs["sample_idx"].tolist()
        if self.cache_teacher_states and all(i in self.teacher_cache for i in idx):
            return torch.stack([self.teacher_cache[i] for i in idx]).to(inputs["input_ids"].device)
        batch = {k[len("teacher_"):]: v for k, v in inputs.items() if k.startswith("teacher_")}
        base = self.accelerator.unwrap_model(model)
        if self.teacher_model is not None:
            out = self.teacher_model(**batch, logits_to_keep=1, output_hidden_states=True, use_cache=False)
        elif hasattr(base, "disable_adapter"):
            with base.disable_adapter():
                out = base(**batch, logits_to_keep=1, output_hidden_states=True, use_cache=False)
        else:
            raise ValueError("distillation needs LoRA (use_lora) or a separate teacher_model_name_or_path")
        states = out.hidden_states[self.rep_layer][:, -1, :].float()
        if self.cache_teacher_states:
            for i, s in zip(idx, states):
                # clone: on CPU .cpu() is a no-op and the row would be a view that keeps the whole
                # [batch, seq, hidden] layer output alive (GBs over an epoch).
                self.teacher_cache[i] = s.detach().cpu().clone()
        return states

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        first = "inputs_embeds" if "inputs_embeds" in inputs else "input_ids"
        student = {k: inputs[k] for k in (first, "attention_mask", "position_ids")}
        config = getattr(self.accelerator.unwrap_model(model), "config", None)  # DDP wraps the model
        if self.args.padding_safe_mask and getattr(config, "_attn_implementation", None) == "sdpa":
            student["attention_mask"] = padding_safe_mask(student["attention_mask"])
        use_rep = self.lambda_rep > 0
        if first == "inputs_embeds":
            with layer_slice(model, self.top_split):
                logits, out = last_token_logits(model, student)
        else:
            logits, out = last_token_logits(model, student, output_hidden_states=use_rep)
        l_cls = self.cls_loss(logits, inputs["labels"])
        loss = l_cls
        if use_rep:
            h_s = out.hidden_states[self.rep_layer][:, -1, :]
            l_rep = self.rep_loss(h_s, self.teacher_states(model, inputs))
            if self.s0 is None:
                # s_0 matches the two terms on the first batch; the floor keeps it finite when the
                # student starts almost equal to the teacher (then L_rep ~ 0).
                s0 = (l_cls.detach() / l_rep.detach().clamp(min=1e-2)).float().reshape(1)
                if self.accelerator.num_processes > 1:  # one s_0 for all ranks: rank 0's first batch
                    from accelerate.utils import broadcast

                    s0 = broadcast(s0.contiguous(), from_process=0)
                self.s0 = float(s0)
                self._save_s0()
            loss = l_cls + self.lambda_rep * self.s0 * l_rep
            self._parts["loss_rep"].append(float(l_rep.detach()))
        self._parts["loss_cls"].append(float(l_cls.detach()))
        return (loss, out) if return_outputs else loss

    def _save_s0(self):
        if self.is_world_process_zero():
            atomic_write_json(Path(self.args.output_dir) / "distill_scale.json", {"s0": self.s0})

    def log(self, logs: dict, *args, **kwargs):
        for name, vals in self._parts.items():
            if vals and "loss" in logs:
                mean = sum(vals) / len(vals)
                if self.accelerator.num_processes > 1:  # every rank logs (collectively): average over ranks
                    device = self.accelerator.device
                    mean = float(self.accelerator.reduce(torch.tensor([mean], device=device), reduction="mean"))
                logs[name] = round(mean, 6)
                vals.clear()
        if self.s0 is not None and "loss" in logs:
            logs["s0"] = round(self.s0, 6)
        super().log(logs, *args, **kwargs)


def default_rep_layer(model) -> int:
    return model.config.num_hidden_layers // 2


def lora_targets(modules: list[str]):
    """peft takes the special value "all-linear" as a bare string, module names as a list."""
    return "all-linear" if list(modules) == ["all-linear"] else list(modules)


def build_model(cfg: SufficiencyTrainingConfig):
    from transformers import set_seed

    from routers.models import load_causal_lm

    # Seed before the LoRA adapters are created: Trainer only seeds in its __init__, after their
    # random init, so without this the same config trains a different router on every run.
    set_seed(cfg.seed)
    if cfg.init_adapter:
        if not cfg.use_lora:
            raise ValueError("init_adapter needs use_lora: true")
        if not (Path(cfg.init_adapter) / "adapter_config.json").is_file():
            raise FileNotFoundError(f"init_adapter {cfg.init_adapter}: no adapter_config.json (expected a LoRA output_dir)")
    model, tokenizer = load_causal_lm(cfg.model_name_or_path)
    model.config.use_cache = False
    attn = resolve_attn_implementation(cfg.attn_implementation)
    if attn:
        model.set_attn_implementation(attn)
    if cfg.init_adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, cfg.init_adapter, is_trainable=True)
    elif cfg.use_lora:
        from peft import LoraConfig, get_peft_model

        targets, top = lora_targets(cfg.lora_target_modules), {}
        if cfg.train_top_layers:  # adapters only where gradients flow
            n = num_layers(model)
            top = {"layers_to_transform": list(range(max(0, n - cfg.train_top_layers), n))}
            if targets == "all-linear":  # peft takes layers_to_transform only with explicit module names
                targets = linear_module_names(decoder_of(model).layers[-1])
        model = get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                                                 target_modules=targets, task_type="CAUSAL_LM", **top))
    elif cfg.train_top_layers:
        freeze_all_but_top(model, max(0, num_layers(model) - cfg.train_top_layers))
    return model, tokenizer


def cache_lower_layers(model, dataset: "SufficiencyDataset", cfg: SufficiencyTrainingConfig, pad_id: int) -> dict:
    """The frozen-prefix path: check that the decoder can be split, then store each sample's residual stream after
    the frozen layers in the dataset (computed once; every epoch then runs only the top layers)."""
    import time

    n = num_layers(model)
    split = max(0, n - cfg.train_top_layers)
    model.to(cfg.device)
    t = time.perf_counter()
    deviation = check_split(model, dataset.items[0]["input_ids"], split, pad_id)
    states = lower_states(model, [it["input_ids"] for it in dataset.items], split, pad_id,
                          batch_size=max(1, cfg.per_device_train_batch_size * 2), progress=True)
    for item, st in zip(dataset.items, states):
        item["lower_states"] = st
    return {"split": split, "layers": n, "trained_layers": n - split, "cache_s": round(time.perf_counter() - t, 1),
            "cached_tokens": sum(st.shape[0] for st in states), "split_check_deviation": deviation}


def lora_summary(model) -> dict | None:
    """The adapter actually trained (with ``init_adapter`` its rank and targets, not the recipe's lora_* keys)."""
    pc = getattr(model, "peft_config", {}).get("default")
    if pc is None:
        return None
    targets = pc.target_modules
    return {"r": pc.r, "alpha": pc.lora_alpha,
            "targets": sorted(targets) if isinstance(targets, (set, list, tuple)) else targets}


def export_router(model, tokenizer, cfg: SufficiencyTrainingConfig, export_dir: str, training_info: dict | None = None):
    """Merge LoRA (if any) into a copy-free plain model and write the router directory atomically."""
    from routers.sufficiency import SufficiencyRouter

    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model = model.float()
    router = SufficiencyRouter.from_model(model, tokenizer, threshold=cfg.threshold,
                                          max_input_tokens=cfg.router_max_input_tokens, base_model=cfg.model_name_or_path)
    router.save_pretrained(export_dir, model_card=router.model_card(training=training_info))
    return router


def prepare_run(cfg: SufficiencyTrainingConfig) -> tuple[list[dict], str | None]:
    """Everything that can fail on user input without a model: the samples (read and validated), the
    local model / adapter paths, the export target, and the checkpoint to resume with its fingerprint."""
    check_local_model_path(cfg.model_name_or_path, "model_name_or_path")
    if cfg.teacher_model_name_or_path:
        check_local_model_path(cfg.teacher_model_name_or_path, "teacher_model_name_or_path")
    if cfg.init_adapter and not (Path(cfg.init_adapter) / "adapter_config.json").is_file():
        raise FileNotFoundError(f"init_adapter {cfg.init_adapter}: no adapter_config.json (expected a LoRA output_dir)")
    records = read_samples(cfg.train_file)
    resume = resolve_resume(cfg)
    check_start(cfg, "sufficiency", resume, run_fingerprint(cfg, FINGERPRINT_KEYS, {"train_file": cfg.train_file}),
                protect=(cfg.init_adapter, resume))
    return records, resume


def make_parser():
    from routers.config import make_arg_parser

    return make_arg_parser([SufficiencyTrainingConfig], prog="memroute train sufficiency",
                           description="Train the Router-Mem evidence-sufficiency router.")


def main(argv=None):
    from routers.config import parse_config, save_resolved_config

    parser = make_parser()
    cpu_ddp_defaults(parser)
    (cfg,) = parse_config(parser, [SufficiencyTrainingConfig], argv)
    records, resume = prepare_run(cfg)
    model, tokenizer = build_model(cfg)
    yes_ids, no_ids = verbalizer_ids(tokenizer, YES_WORDS), verbalizer_ids(tokenizer, NO_WORDS)
    teacher = None
    teacher_tokenizer = None
    if cfg.lambda_rep > 0 and cfg.teacher_model_name_or_path:
        from routers.models import load_causal_lm

        teacher, teacher_tokenizer = load_causal_lm(cfg.teacher_model_name_or_path)
        teacher.eval().requires_grad_(False)
    dataset = SufficiencyDataset(records, tokenizer, cfg.max_length, cfg.max_train_samples, teacher_tokenizer,
                                 source=cfg.train_file)
    frozen = cache_lower_layers(model, dataset, cfg, tokenizer.pad_token_id) if cfg.train_top_layers else None
    if frozen and int(os.environ.get("RANK", "0")) == 0:
        print(f"[memroute] frozen-prefix path: layers 0-{frozen['split'] - 1} cached once "
              f"({frozen['cached_tokens']} tokens, {frozen['cache_s']:.0f}s); training the top {frozen['trained_layers']}",
              file=sys.stderr)
    rep_layer = cfg.rep_layer if cfg.rep_layer is not None else default_rep_layer(model)
    n_states = model.config.num_hidden_layers + 1  # hidden_states: embeddings + one per layer
    if cfg.lambda_rep > 0 and not -n_states <= rep_layer < n_states:
        raise ValueError(f"rep_layer {rep_layer} is out of range for {cfg.model_name_or_path} "
                         f"({n_states} hidden states: -{n_states}..{n_states - 1})")
    s0 = cfg.s0
    scale_file = Path(cfg.output_dir) / "distill_scale.json"
    if s0 is None and resume and scale_file.exists():
        s0 = json.loads(scale_file.read_text())["s0"]
    trainer = SufficiencyTrainer(model=model, args=cfg, train_dataset=dataset,
                                 data_collator=SufficiencyCollator(tokenizer.pad_token_id), processing_class=tokenizer,
                                 yes_ids=yes_ids, no_ids=no_ids, lambda_rep=cfg.lambda_rep, rep_layer=rep_layer, s0=s0,
                                 teacher_model=teacher, cache_teacher_states=cfg.cache_teacher_states,
                                 top_split=frozen["split"] if frozen else None)
    check_world_size(trainer.args)
    warn_if_fsdp_ignored(trainer)
    if teacher is not None:
        teacher.to(trainer.args.device)
    if trainer.is_world_process_zero():
        save_resolved_config(cfg.output_dir, cfg)
        print(f"[memroute] {len(dataset)} training samples ({dataset.skipped_too_long} skipped > {cfg.max_length} tokens); "
              f"rep layer {rep_layer}; resume from {resume}", file=sys.stderr)
    budget = time_budget_callback(cfg.max_train_minutes) if cfg.max_train_minutes is not None else None
    if budget is not None:
        trainer.add_callback(budget)
    result = trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(cfg.output_dir)
    info = {"model": cfg.model_name_or_path, "train_file": cfg.train_file, "samples": len(dataset),
            "skipped_too_long": dataset.skipped_too_long, "steps": result.global_step,
            "train_runtime_s": result.metrics.get("train_runtime"), "final_loss": result.training_loss,
            "lambda_rep": cfg.lambda_rep, "s0": trainer.s0, "rep_layer": rep_layer, "world_size": trainer.args.world_size,
            "resumed_from": resume, "init_adapter": cfg.init_adapter,
            "stopped_by_time_budget_at_step": budget.stopped_at_step if budget is not None else None,
            "lora": lora_summary(model) if cfg.use_lora else None, "frozen_prefix": frozen}
    if trainer.is_world_process_zero():
        atomic_write_json(Path(cfg.output_dir) / "train_summary.json", {**info, "log_history": trainer.state.log_history})
        if cfg.export_dir:
            export_router(trainer.accelerator.unwrap_model(trainer.model), tokenizer, cfg, cfg.export_dir, info)
            print(f"[memroute] exported router to {cfg.export_dir}", file=sys.stderr)
    return trainer, info


if __name__ == "__main__":
    main()
