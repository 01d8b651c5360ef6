"""Train the Router-Mem sufficiency router: LoRA + grouped-token loss + representation distillation.

    accelerate launch -m train.sufficiency configs/sufficiency/train/smollm2.yaml [--max_steps 50 ...]
    memroute train sufficiency configs/sufficiency/train/smollm2.yaml

L = L_cls + lambda_rep * s_0 * L_rep. The teacher is, by default, the frozen base model itself
(LoRA adapters disabled) reading question + context + rationale, so no second copy of the weights
is held; its decision-position states never change and are cached after the first pass.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import Trainer, TrainingArguments

from routers.io import atomic_write_json
from data_synthesis.sufficiency_samples import read_samples
from routers.logs import get_logger, setup_cli_logging
from routers.models import DEFAULT_CAUSAL_LM, padding_safe_mask
from routers.sufficiency import NO_WORDS, YES_WORDS, last_token_logits, verbalizer_ids
from routers.config import check_resume_value
from train.args import EvalFileArgs, LoraArgs, RunArgs
from train.checkpoints import resolve_resume, time_budget_callback
from routers.models import check_local_model_path
from routers.validation import int_option, number_option, option_problems, raise_option_problems
from train.dev_split import (add_early_stopping, best_model_info, dev_fingerprint, eval_option_checks,
                             has_eval_strategy, resolve_report_to, train_and_eval_records)
from train.distributed import (check_start, check_world_size, cpu_ddp_defaults, resolve_attn_implementation,
                               run_fingerprint, training_argument_checks, warn_if_fsdp_ignored)
from train.frozen_prefix import decoder_of, freeze_all_but_top, layer_slice, linear_module_names, num_layers
from train.losses import GroupedTokenLoss, RepresentationDistillationLoss
from train.metrics_hooks import ScoreFromLogits, binary_metrics
from train.sufficiency_data import SufficiencyCollator, SufficiencyDataset, cache_lower_layers  # noqa: F401 (re-exported)

log = get_logger(__name__)


@dataclass
class SufficiencyTrainingConfig(LoraArgs, RunArgs, EvalFileArgs, TrainingArguments):
    """TrainingArguments plus the router, LoRA, distillation and dev-evaluation options."""

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
            *eval_option_checks(self),
        ])
        raise_option_problems(problems)
        super().__post_init__()


# What a resumed run must share with the run that wrote its checkpoints (plus the TrainingArguments
# optimisation options and the train file's path and sha256; see train.distributed.run_fingerprint).
FINGERPRINT_KEYS = ("model_name_or_path", "max_train_samples", "max_length", "use_lora", "lora_r", "lora_alpha",
                    "lora_dropout", "lora_target_modules", "init_adapter", "lambda_rep", "rep_layer", "s0",
                    "teacher_model_name_or_path", "padding_safe_mask", "train_top_layers")


class SufficiencyTrainer(Trainer):
    """Trainer whose loss is L_cls + lambda_rep * s_0 * L_rep, with both parts logged.

    Distributed runs match one process with gradient accumulation: the loss is a per-batch mean (so
    the Trainer divides it by the accumulation steps), s_0 comes from rank 0's first batch (one process
    takes it from its first micro-batch), and the logged parts are averaged over ranks.

    Evaluation (``eval_dataset``): the eval loss is L_cls alone (no teacher pass, nothing logged as a training
    part), and the eval loop keeps only the last-token logits, which ``preprocess_logits_for_metrics``
    (:class:`train.metrics_hooks.ScoreFromLogits`) reduces to one score per sample for ``compute_metrics``.
    """

    # compute_loss returns a per-batch mean and ignores num_items_in_batch: without this the Trainer
    # (seeing "labels" and a model taking **kwargs) skips the 1/accumulation scaling and doubles the loss at GA=2.
    # transformers >= 5.19 reads loss_is_scaled_for_ga; older versions only model_accepts_loss_kwargs (set in
    # __init__, as TRL does), so the scaling does not depend on the transformers version.
    loss_is_scaled_for_ga = False

    def __init__(self, *args, yes_ids, no_ids, lambda_rep: float, rep_layer: int, s0: float | None,
                 teacher_model=None, cache_teacher_states: bool = True, top_split: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.model_accepts_loss_kwargs = False
        self.label_names = ["labels"]  # PEFT wrappers hide the forward signature the Trainer infers this from
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
        evaluating = not model.training  # the eval loop: L_cls only (eval samples have no teacher states)
        use_rep = self.lambda_rep > 0 and not evaluating
        if first == "inputs_embeds":
            with layer_slice(model, self.top_split):
                logits, out = last_token_logits(model, student)
        else:
            logits, out = last_token_logits(model, student, output_hidden_states=use_rep)
        l_cls = self.cls_loss(logits, inputs["labels"])
        if evaluating:  # keep the [batch, vocab] last-token logits only: no hidden states, no other outputs
            return (l_cls, {"logits": logits}) if return_outputs else l_cls
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


def lora_summary(model) -> dict | None:
    """The adapter actually trained (with ``init_adapter`` its rank and targets, not the recipe's lora_* keys)."""
    pc = getattr(model, "peft_config", {}).get("default")
    if pc is None:
        return None
    targets = pc.target_modules
    return {"r": pc.r, "alpha": pc.lora_alpha,
            "targets": sorted(targets) if isinstance(targets, (set, list, tuple)) else targets}


def export_router(model, tokenizer, cfg: SufficiencyTrainingConfig, export_dir: str, training_info: dict | None = None):
    """Merge LoRA (if any) into a plain model in the training dtype (bf16 / fp16 / fp32, as ``memroute export``
    does by default) and write the router directory atomically."""
    from routers.base import cast_weights, torch_dtype
    from routers.sufficiency import SufficiencyRouter
    from train.export import training_dtype

    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model = cast_weights(model.float(), torch_dtype(training_dtype({"bf16": cfg.bf16, "fp16": cfg.fp16})))
    router = SufficiencyRouter.from_model(model, tokenizer, threshold=cfg.threshold,
                                          max_input_tokens=cfg.router_max_input_tokens, base_model=cfg.model_name_or_path)
    router.save_pretrained(export_dir, model_card=router.model_card(training=training_info))
    return router


def prepare_run(cfg: SufficiencyTrainingConfig) -> tuple[list[dict], list[dict] | None, dict | None, str | None]:
    """Everything that can fail on user input without a model: the samples (read and validated; split into train
    and dev, or the eval file read and checked disjoint), the local model / adapter paths, the export target, and
    the checkpoint to resume with its fingerprint. Returns (train records, eval records, eval info, resume)."""
    check_local_model_path(cfg.model_name_or_path, "model_name_or_path")
    if cfg.teacher_model_name_or_path:
        check_local_model_path(cfg.teacher_model_name_or_path, "teacher_model_name_or_path")
    if cfg.init_adapter and not (Path(cfg.init_adapter) / "adapter_config.json").is_file():
        raise FileNotFoundError(f"init_adapter {cfg.init_adapter}: no adapter_config.json (expected a LoRA output_dir)")
    records, evals, held_out = train_and_eval_records(cfg, read_samples(cfg.train_file), read_samples)
    resume = resolve_resume(cfg)
    fingerprint = {**run_fingerprint(cfg, FINGERPRINT_KEYS, {"train_file": cfg.train_file}), **dev_fingerprint(cfg)}
    check_start(cfg, "sufficiency", resume, fingerprint, protect=(cfg.init_adapter, resume))
    return records, evals, held_out, resume


def make_parser():
    from routers.config import make_arg_parser

    return make_arg_parser([SufficiencyTrainingConfig], prog="memroute train sufficiency",
                           description="Train the Router-Mem evidence-sufficiency router.")


def main(argv=None):
    from routers.config import parse_config, save_resolved_config

    parser = make_parser()
    cpu_ddp_defaults(parser)
    (cfg,) = parse_config(parser, [SufficiencyTrainingConfig], argv)
    setup_cli_logging()  # a CLI entry point (memroute train ..., python -m, accelerate launch -m)
    resolve_report_to(cfg)
    records, eval_records, held_out, resume = prepare_run(cfg)
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
    eval_dataset = None
    if eval_records is not None:  # no max_train_samples cap: the whole dev split / eval file is scored
        eval_dataset = SufficiencyDataset(eval_records, tokenizer, cfg.max_length, None, teacher_tokenizer,
                                          source=cfg.eval_file or f"dev split of {cfg.train_file}")
        held_out["eval_samples"], held_out["eval_skipped_too_long"] = len(eval_dataset), eval_dataset.skipped_too_long
    frozen = None
    if cfg.train_top_layers:  # eval samples need their cached lower-layer states too
        amp = torch.bfloat16 if cfg.bf16 else torch.float16 if cfg.fp16 else None
        frozen = cache_lower_layers(model, [d for d in (dataset, eval_dataset) if d is not None], cfg.train_top_layers,
                                    cfg.device, tokenizer.pad_token_id, max(1, cfg.per_device_train_batch_size * 2),
                                    autocast_dtype=amp)
        log.info("frozen-prefix path: layers 0-%d cached once (%d tokens, %.0fs); training the top %d",
                 frozen["split"] - 1, frozen["cached_tokens"], frozen["cache_s"], frozen["trained_layers"])
    rep_layer = cfg.rep_layer if cfg.rep_layer is not None else default_rep_layer(model)
    n_states = model.config.num_hidden_layers + 1  # hidden_states: embeddings + one per layer
    if cfg.lambda_rep > 0 and not -n_states <= rep_layer < n_states:
        raise ValueError(f"rep_layer {rep_layer} is out of range for {cfg.model_name_or_path} "
                         f"({n_states} hidden states: -{n_states}..{n_states - 1})")
    s0 = cfg.s0
    scale_file = Path(cfg.output_dir) / "distill_scale.json"
    if s0 is None and resume and scale_file.exists():
        s0 = json.loads(scale_file.read_text())["s0"]
    metric_hooks = {} if eval_dataset is None else {
        "eval_dataset": eval_dataset, "compute_metrics": binary_metrics,
        "preprocess_logits_for_metrics": ScoreFromLogits(yes_ids, no_ids)}
    trainer = SufficiencyTrainer(model=model, args=cfg, train_dataset=dataset, **metric_hooks,
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
        log.info("%d training samples (%d skipped > %d tokens); %s; rep layer %s; resume from %s", len(dataset),
                 dataset.skipped_too_long, cfg.max_length,
                 f"{len(eval_dataset)} eval samples" if eval_dataset is not None else "no eval set", rep_layer, resume)
    add_early_stopping(trainer, cfg)
    budget = time_budget_callback(cfg.max_train_minutes) if cfg.max_train_minutes is not None else None
    if budget is not None:
        trainer.add_callback(budget)
    result = trainer.train(resume_from_checkpoint=resume)  # load_best_model_at_end: trainer.model is the best one
    if eval_dataset is not None and not has_eval_strategy(cfg):
        trainer.evaluate()  # an eval set without eval_strategy: score the final model once
    trainer.save_model(cfg.output_dir)
    info = {"model": cfg.model_name_or_path, "train_file": cfg.train_file, "samples": len(dataset),
            "skipped_too_long": dataset.skipped_too_long, "steps": result.global_step,
            "train_runtime_s": result.metrics.get("train_runtime"), "final_loss": result.training_loss,
            "lambda_rep": cfg.lambda_rep, "s0": trainer.s0, "rep_layer": rep_layer, "world_size": trainer.args.world_size,
            "resumed_from": resume, "init_adapter": cfg.init_adapter,
            "stopped_by_time_budget_at_step": budget.stopped_at_step if budget is not None else None,
            "lora": lora_summary(model) if cfg.use_lora else None, "frozen_prefix": frozen,
            "eval": {**held_out, **best_model_info(trainer)} if held_out else None}
    if cfg.export_dir:  # on every rank: under FSDP the full weights are gathered first
        from train.export import model_for_export

        full_model = model_for_export(trainer, cfg.output_dir, cfg.model_name_or_path)
    if trainer.is_world_process_zero():
        atomic_write_json(Path(cfg.output_dir) / "train_summary.json", {**info, "log_history": trainer.state.log_history})
        if cfg.export_dir:
            export_router(full_model, tokenizer, cfg, cfg.export_dir, info)
            log.info("exported router to %s", cfg.export_dir)
    return trainer, info


if __name__ == "__main__":
    main()
