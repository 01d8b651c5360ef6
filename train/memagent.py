"""SFT of the MemAgent router on Begin / In / End supervision, the three phases mixed in one run.

    accelerate launch -m train.memagent configs/memagent/train/sft.yaml [--max_steps 50 ...]
    memroute train memagent configs/memagent/train/sft.yaml

Inputs are the forced-exploration files (``begin.jsonl``, ``in.jsonl``, ``end.jsonl``) in TRL's
conversational prompt-completion format. TRL's SFTTrainer trains with a completion-only loss (the
prompt tokens are labelled -100) and LoRA adapters. Each completion is parsed and rewritten in its
canonical form, so the targets are exactly the candidates the router scores; every End record (a
chosen subset) becomes one yes/no sample per provider listed in its prompt (only the providers in its
``reuse`` field when it has one: unobserved providers are unknown, not negatives), the form the router
decides End in (see ``routers.memagent.router``). Resumes from the last checkpoint in ``output_dir``
and exports a router directory at the end.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from trl import SFTConfig, SFTTrainer

from routers.io import atomic_write_json, read_jsonl
from routers.memagent import prompts as P
from routers.models import DEFAULT_CAUSAL_LM
from routers.config import check_resume_value
from routers.logs import get_logger, setup_cli_logging
from train.args import DevSplitArgs, LoraArgs, RunArgs
from train.checkpoints import resolve_resume, time_budget_callback
from routers.models import check_local_model_path
from routers.validation import int_option, number_option, option_problems, raise_option_problems
from train.dev_split import (add_early_stopping, best_model_info, dev_fingerprint, eval_option_checks,
                             has_dev_split, has_eval_strategy, resolve_report_to, split_by_episode)
from train.distributed import check_start, resolve_auto_bf16, run_fingerprint, training_argument_checks

log = get_logger(__name__)

PHASES = ("begin", "in", "end")
ROLES = {"system", "user", "assistant"}


@dataclass
class MemAgentSFTConfig(LoraArgs, RunArgs, DevSplitArgs, SFTConfig):
    """trl.SFTConfig plus the model, LoRA, data-mixing, dev-evaluation (eval loss on held-out tasks) and export
    options. The dev split is drawn by ``task_id`` over the three phase files together."""

    model_name_or_path: str = field(default=DEFAULT_CAUSAL_LM, metadata={"help": "HF id, local path or 'smollm2'"})
    begin_file: str | None = field(default="outputs/memagent_data/begin.jsonl",
                                   metadata={"help": "Begin records; 'none' leaves the phase out (same for in/end)"})
    in_file: str | None = "outputs/memagent_data/in.jsonl"
    end_file: str | None = "outputs/memagent_data/end.jsonl"
    max_begin_samples: int | None = None
    max_in_samples: int | None = None
    max_end_samples: int | None = field(default=None, metadata={"help": "cap on End yes/no samples (after expansion)"})
    min_reward: float | None = field(default=None, metadata={"help": "drop records whose 'reward' is below this"})
    balance_decisions: bool = field(default=False, metadata={
        "help": "per phase, oversample every decision to the count of the most frequent one (training samples "
                "only), so that a router trained on few, skewed labels does not learn the majority decision alone"})
    export_merged: bool = field(default=True, metadata={"help": "merge LoRA into the weights; false = adapter export"})
    keep_layers: int | None = field(default=None, metadata={
        "help": "train and export a router with only the base's first N decoder layers (every decision ~N/L of "
                "the cost; with LoRA the pruned base is saved to output_dir/pruned_base); None = all layers"})
    in_threshold: float = 0.5
    end_threshold: float = 0.5
    router_max_input_tokens: int = 4096
    # Defaults for this trainer (override the SFTConfig ones).
    output_dir: str = "outputs/memagent_router"
    max_length: int | None = 2048
    completion_only_loss: bool | None = True
    shuffle_dataset: bool = True
    logging_steps: int = 5
    save_steps: int = 50
    save_total_limit: int | None = 2
    learning_rate: float = 2e-4
    per_device_train_batch_size: int = 4
    bf16: bool | None = field(default=None, metadata={
        "help": "bf16 autocast; None = auto: on where the GPU / CPU runs bf16 natively, else fp32 (TRL's default, "
                "always on, emulates bf16 on other CPUs at a fraction of fp32 speed)"})

    def __post_init__(self):
        # Impossible values and conflicts fail at parse time, before any model or data is loaded.
        check_resume_value(self.resume)
        raise_option_problems(option_problems([
            *training_argument_checks(self),
            (any(phase_file(f) for f in (self.begin_file, self.in_file, self.end_file)),
             "begin_file, in_file and end_file are all 'none': nothing to train on"),
            int_option(self.max_begin_samples, "max_begin_samples", allow_none=True, minimum=0),
            int_option(self.max_in_samples, "max_in_samples", allow_none=True, minimum=0),
            int_option(self.max_end_samples, "max_end_samples", allow_none=True, minimum=0),
            number_option(self.min_reward, "min_reward", allow_none=True),
            int_option(self.lora_r, "lora_r"),
            number_option(self.lora_alpha, "lora_alpha", low=0, low_open=True),
            number_option(self.lora_dropout, "lora_dropout", low=0, high=1, high_open=True),
            (bool(self.lora_target_modules), "lora_target_modules must not be empty"),
            number_option(self.in_threshold, "in_threshold", low=0, high=1),
            number_option(self.end_threshold, "end_threshold", low=0, high=1),
            int_option(self.router_max_input_tokens, "router_max_input_tokens"),
            int_option(self.keep_layers, "keep_layers", allow_none=True),
            int_option(self.max_length, "max_length", allow_none=True),
            *eval_option_checks(self),
        ]))
        resolve_auto_bf16(self)
        super().__post_init__()


def phase_file(value) -> str | None:
    """A phase file option: None / '' / 'none' leave the phase out."""
    return None if not value or str(value).lower() == "none" else str(value)


# What a resumed run must share with the run that wrote its checkpoints (plus the TrainingArguments
# optimisation options and each phase file's path and sha256).
FINGERPRINT_KEYS = ("model_name_or_path", "max_begin_samples", "max_in_samples", "max_end_samples", "min_reward",
                    "balance_decisions",
                    "use_lora", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "max_length",
                    "completion_only_loss", "shuffle_dataset", "keep_layers")


def _check_messages(messages, what: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{what} must be a non-empty list of messages")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"{what}: every message needs a role in {sorted(ROLES)} and string content, got {m!r}")


def _decision(rec: dict, phase: str):
    """Validate one record and parse its completion (the decision); errors become RecordError file:line."""
    _check_messages(rec["prompt"], "prompt")
    _check_messages(rec["completion"], "completion")
    if rec["prompt"][-1]["role"] != "user":
        raise ValueError("prompt must end with a user message")
    if len(rec["completion"]) != 1 or rec["completion"][0]["role"] != "assistant":
        raise ValueError("completion must be exactly one assistant message")
    if rec.get("phase", phase) != phase:
        raise ValueError(f"phase {rec.get('phase')!r} in the {phase} file")
    if "reward" in rec and rec["reward"] is not None and not isinstance(rec["reward"], (int, float)):
        raise ValueError(f"reward must be a number, got {rec['reward']!r}")
    text = rec["completion"][0]["content"]
    if phase == "begin":
        return P.parse_begin(text, P.begin_prompt_options(rec["prompt"]))
    if phase == "in":
        return P.parse_in(text)
    return P.parse_end(text, P.end_prompt_provider_names(rec["prompt"]))


def _turn(content: str) -> list[dict]:
    return [{"role": "assistant", "content": content}]


def phase_rows(path: str, phase: str, min_reward: float | None = None) -> tuple[list[dict], dict]:
    """Training rows (prompt, completion, phase) from one phase file, and counts of what was kept/dropped."""
    rows, stats = [], Counter()
    decisions: dict[int, object] = {}

    def validate(rec):
        decisions[id(rec)] = _decision(rec, phase)

    for rec in read_jsonl(path, required=("prompt", "completion"), validate=validate):
        decision = decisions.pop(id(rec))
        stats["records"] += 1
        if min_reward is not None and rec.get("reward") is not None and rec["reward"] < min_reward:
            stats["below_min_reward"] += 1
            continue
        if phase == "begin":
            rows.append({"prompt": rec["prompt"], "completion": _turn(P.begin_completion(decision)), "phase": phase,
                         "task_id": rec.get("task_id")})
        elif phase == "in":
            rows.append({"prompt": rec["prompt"], "completion": _turn(P.in_completion(decision)), "phase": phase,
                         "task_id": rec.get("task_id")})
        else:
            names = P.end_prompt_provider_names(rec["prompt"])
            # Only providers whose reuse was observed carry a label; the others are unknown, not "no".
            observed = rec.get("reuse")
            if isinstance(observed, dict) and observed:
                stats["end_unobserved_skipped"] += sum(1 for n in names if n not in observed)
                names = [n for n in names if n in observed]
            for name in names:
                rows.append({"prompt": P.end_provider_messages(rec["prompt"], name),
                             "completion": _turn(P.yes_no_completion(name in decision)), "phase": phase,
                             "task_id": rec.get("task_id")})
    return rows, dict(stats)


def phase_files(cfg: MemAgentSFTConfig) -> dict[str, str]:
    """{phase: file} of the phases in use (a phase whose file is None / 'none' is left out)."""
    files = {"begin": cfg.begin_file, "in": cfg.in_file, "end": cfg.end_file}
    return {ph: phase_file(f) for ph, f in files.items() if phase_file(f)}


def read_phases(cfg: MemAgentSFTConfig) -> dict[str, tuple[list[dict], dict]]:
    """Read and validate every phase file (no tokenizer needed): the trainer calls this before it loads the
    model, so a missing, empty or malformed file fails in seconds. A file given but empty, or whose every
    record is below ``min_reward``, is an error, not a phase silently left out."""
    out = {}
    for phase, path in phase_files(cfg).items():
        if not Path(path).exists():
            raise FileNotFoundError(f"{phase}_file {path}: file not found")
        if Path(path).is_dir():
            raise ValueError(f"{phase}_file {path}: is a directory, not a JSONL file")
        rows, stats = phase_rows(path, phase, cfg.min_reward)
        if not stats.get("records"):
            raise ValueError(f"{phase}_file {path}: no records (empty file); pass --{phase}_file none to leave "
                             "the phase out")
        if not rows:
            raise ValueError(f"{phase}_file {path}: all {stats['records']} records dropped ({stats}); lower "
                             f"min_reward or pass --{phase}_file none to leave the phase out")
        out[phase] = (rows, stats)
    return out


def build_rows(cfg: MemAgentSFTConfig, tokenizer, phases: dict | None = None, caps: bool = True) -> tuple[list[dict], dict]:
    """Mix the phase files: validate, canonicalize, cap per phase, drop over-length samples, shuffle.
    ``phases`` is :func:`read_phases`' result when the caller already read the files; ``caps=False`` keeps every
    sample (the dev split)."""
    from routers.memagent.router import chat_ids

    files = phase_files(cfg)
    balance = caps and cfg.balance_decisions  # the dev split keeps its natural label mix
    caps = ({"begin": cfg.max_begin_samples, "in": cfg.max_in_samples, "end": cfg.max_end_samples} if caps
            else dict.fromkeys(PHASES))
    phases = read_phases(cfg) if phases is None else phases
    rng = random.Random(cfg.seed)
    mixed, summary = [], {}
    for phase in PHASES:
        if phase not in phases:  # a phase can be left out
            continue
        rows, stats = list(phases[phase][0]), phases[phase][1]
        rng.shuffle(rows)
        kept, too_long = [], 0
        for row in rows:
            if caps[phase] is not None and len(kept) >= caps[phase]:
                break
            n = len(chat_ids(tokenizer, [*row["prompt"], *row["completion"]]))
            if cfg.max_length is not None and n > cfg.max_length:
                too_long += 1
                continue
            kept.append(row)
        if rows and not kept and caps[phase] != 0:
            raise ValueError(f"{phase}_file {files[phase]}: all {len(rows)} samples are longer than "
                             f"max_length={cfg.max_length} tokens; raise max_length")
        labels = Counter(r["completion"][0]["content"] for r in kept)
        if balance:
            kept = balance_decisions(kept, rng)
        summary[phase] = {**stats, "samples": len(kept), "skipped_too_long": too_long, "labels": dict(labels)}
        mixed.extend(kept)
    if not mixed:
        raise ValueError(f"no usable training samples in {list(files.values())}")
    rng.shuffle(mixed)
    return mixed, summary


def balance_decisions(rows: list[dict], rng: random.Random) -> list[dict]:
    """Every decision (completion text) oversampled to the count of the most frequent one: whole copies of its
    rows first, the remainder a seeded sample without replacement (order: decision by decision)."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["completion"][0]["content"], []).append(r)
    top = max((len(v) for v in by.values()), default=0)
    out = []
    for group in by.values():
        copies, rest = divmod(top, len(group))
        out += group * copies + rng.sample(group, rest)
    return out


def make_dataset(rows: list[dict]):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in rows])


def export_router(model, tokenizer, cfg: MemAgentSFTConfig, export_dir: str, training_info: dict | None = None,
                  provider_names: list[str] | None = None):
    """Merged weights (default) or the adapter over ``model_name_or_path``; written atomically."""
    from routers.base import cast_weights, torch_dtype
    from routers.memagent.router import MemAgentRouter
    from train.export import training_dtype

    if cfg.export_merged and hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model = cast_weights(model.float(), torch_dtype(training_dtype({"bf16": cfg.bf16, "fp16": cfg.fp16})))
    adapter_over_pruned = cfg.keep_layers is not None and hasattr(model, "peft_config")
    base = str(Path(cfg.output_dir) / "pruned_base") if adapter_over_pruned else cfg.model_name_or_path
    router = MemAgentRouter.from_model(model, tokenizer, in_threshold=cfg.in_threshold,
                                       end_threshold=cfg.end_threshold, max_input_tokens=cfg.router_max_input_tokens,
                                       provider_names=list(provider_names or []), base_model=base)
    router.save_pretrained(export_dir, model_card=router.model_card(training=training_info))
    return router


def pool_names(rows: list[dict]) -> list[str]:
    """The provider pool the Begin prompts offered (first Begin row), for the exported config."""
    for r in rows:
        if r["phase"] == "begin":
            return P.begin_prompt_options(r["prompt"])
    return []


def build_model(cfg: MemAgentSFTConfig):
    """Base causal LM (pruned to ``keep_layers``; + LoRA adapters), seeded before the adapters are initialised."""
    from transformers import set_seed

    from routers.models import keep_decoder_layers, load_causal_lm, save_pruned_base

    set_seed(cfg.seed)
    model, tokenizer = load_causal_lm(cfg.model_name_or_path)
    model.config.use_cache = False
    if cfg.keep_layers is not None:
        total = keep_decoder_layers(model, cfg.keep_layers)
        log.info("router: the first %d of %d decoder layers of %s", cfg.keep_layers, total, cfg.model_name_or_path)
        if cfg.use_lora:  # the adapter's base is the pruned model: saved, so that a checkpoint reloads (export)
            save_pruned_base(model, tokenizer, Path(cfg.output_dir) / "pruned_base")
    if cfg.use_lora:
        from peft import LoraConfig, get_peft_model

        targets = "all-linear" if list(cfg.lora_target_modules) == ["all-linear"] else list(cfg.lora_target_modules)
        model = get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                                                 target_modules=targets, task_type="CAUSAL_LM"))
    return model, tokenizer


def prepare_run(cfg: MemAgentSFTConfig) -> tuple[dict, str | None]:
    """Everything that can fail on user input without a model: the phase files (read and validated), the
    model path, the export target, and the checkpoint to resume with its fingerprint."""
    check_local_model_path(cfg.model_name_or_path, "model_name_or_path")
    phases = read_phases(cfg)
    resume = resolve_resume(cfg)
    files = {f"{ph}_file": phase_file(f) for ph, f in (("begin", cfg.begin_file), ("in", cfg.in_file),
                                                         ("end", cfg.end_file))}
    check_start(cfg, "memagent", resume, {**run_fingerprint(cfg, FINGERPRINT_KEYS, files), **dev_fingerprint(cfg)},
                protect=(resume,))
    return phases, resume


def split_phases(cfg: MemAgentSFTConfig, phases: dict) -> tuple[dict, dict | None, dict | None]:
    """(training phases, dev phases, dev info): the dev split takes every row of the dev tasks (``task_id``, drawn
    over the three phase files together) out of every phase."""
    if not has_dev_split(cfg):
        return phases, None, None
    every = [r for rows, _ in phases.values() for r in rows]
    _, _, dev_tasks = split_by_episode(every, cfg.dev_fraction, cfg.dev_episodes, cfg.dev_seed, "task_id", "phase files")
    dev = set(dev_tasks)
    train = {ph: ([r for r in rows if r["task_id"] not in dev], stats) for ph, (rows, stats) in phases.items()}
    held = {ph: ([r for r in rows if r["task_id"] in dev], {}) for ph, (rows, _) in phases.items()}
    log.info("dev split: %d task(s) %s held out of training", len(dev_tasks), dev_tasks)
    return ({ph: v for ph, v in train.items() if v[0]}, {ph: v for ph, v in held.items() if v[0]},
            {"dev_episodes": dev_tasks, "dev_seed": cfg.dev_seed, "dev_fraction": cfg.dev_fraction})


def build_trainer(cfg: MemAgentSFTConfig, phases: dict | None = None):
    """(SFTTrainer, mixed rows, per-phase counts): model + LoRA, data (minus the dev tasks, which become the eval
    set; what was held out is ``trainer.memroute_dev``, None without a dev split), TRL's tokenization and label masks."""
    phases = read_phases(cfg) if phases is None else phases
    phases, dev_phases, held_out = split_phases(cfg, phases)
    model, tokenizer = build_model(cfg)
    rows, per_phase = build_rows(cfg, tokenizer, phases)
    eval_dataset = None
    if dev_phases is not None:
        dev_rows, dev_per_phase = build_rows(cfg, tokenizer, dev_phases, caps=False)
        held_out.update(dev_samples=len(dev_rows), phases=dev_per_phase)
        eval_dataset = make_dataset(dev_rows)
    # TRL's SFTTrainer normalizes its token-level loss by the tokens of the whole accumulated batch itself.
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=make_dataset(rows), eval_dataset=eval_dataset,
                         processing_class=tokenizer)
    add_early_stopping(trainer, cfg)
    trainer.memroute_dev = held_out
    return trainer, rows, per_phase


def finished_checkpoint(checkpoint: str | None, max_steps: int) -> bool:
    """True when ``checkpoint`` already holds ``max_steps`` optimizer steps (a finished run)."""
    import json

    if not checkpoint or max_steps <= 0 or not (Path(checkpoint) / "trainer_state.json").exists():
        return False
    return json.loads((Path(checkpoint) / "trainer_state.json").read_text()).get("global_step", 0) >= max_steps


def make_parser():
    from routers.config import make_arg_parser

    return make_arg_parser([MemAgentSFTConfig], prog="memroute train memagent",
                           description="SFT of the MemAgent Begin/In/End router (TRL, LoRA, completion-only loss).")


def main(argv=None):
    from routers.config import parse_config, save_resolved_config

    (cfg,) = parse_config(make_parser(), [MemAgentSFTConfig], argv)
    setup_cli_logging()  # a CLI entry point (memroute train ..., python -m, accelerate launch -m)
    resolve_report_to(cfg)
    phases, resume = prepare_run(cfg)
    trainer, rows, per_phase = build_trainer(cfg, phases)
    held_out = trainer.memroute_dev
    tokenizer = trainer.processing_class
    if trainer.is_world_process_zero():
        save_resolved_config(cfg.output_dir, cfg)
        counts = ", ".join(f"{k} {v['samples']} (of {v.get('records', 0)} records; {v['skipped_too_long']} too long)"
                           for k, v in per_phase.items())
        log.info("memagent SFT samples: %s; total %d; %s; resume from %s", counts, len(rows),
                 f"{held_out['dev_samples']} dev samples" if held_out else "no dev set", resume)
    if finished_checkpoint(resume, cfg.max_steps):
        # transformers resumes a finished run mid-epoch by training one more step; just reload it instead
        from transformers import TrainerState

        log.info("%s already reached max_steps=%d: nothing to train", resume, cfg.max_steps)
        trainer._load_from_checkpoint(resume)
        trainer.state = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json"))
        steps, runtime = trainer.state.global_step, None
        final_loss = next((h["train_loss"] for h in reversed(trainer.state.log_history) if "train_loss" in h), None)
    else:
        if cfg.max_train_minutes is not None:
            trainer.add_callback(time_budget_callback(cfg.max_train_minutes))
        result = trainer.train(resume_from_checkpoint=resume)  # load_best_model_at_end: trainer.model is the best
        if held_out and not has_eval_strategy(cfg):
            trainer.evaluate()  # a dev set without eval_strategy: evaluate the final model once
        steps, runtime, final_loss = result.global_step, result.metrics.get("train_runtime"), result.training_loss
    trainer.save_model(cfg.output_dir)
    info = {"model": cfg.model_name_or_path, "files": {"begin": cfg.begin_file, "in": cfg.in_file, "end": cfg.end_file},
            "phases": per_phase, "samples": len(rows), "steps": steps,
            "train_runtime_s": runtime, "final_loss": final_loss,
            "end_mode": "per_provider", "provider_names": pool_names(rows),
            "layers_kept": cfg.keep_layers,
            "lora": {"r": cfg.lora_r, "alpha": cfg.lora_alpha, "targets": cfg.lora_target_modules} if cfg.use_lora else None,
            "eval": {**held_out, **best_model_info(trainer)} if held_out else None}
    if cfg.export_dir:  # on every rank: under FSDP the full weights are gathered first
        from train.export import model_for_export

        full_model = model_for_export(trainer, cfg.output_dir, cfg.model_name_or_path)
    if trainer.is_world_process_zero():
        atomic_write_json(Path(cfg.output_dir) / "train_summary.json", {**info, "log_history": trainer.state.log_history})
        if cfg.export_dir:
            export_router(full_model, tokenizer, cfg, cfg.export_dir, info,
                          provider_names=info["provider_names"])
            log.info("exported router to %s", cfg.export_dir)
    return trainer, info


if __name__ == "__main__":
    main()
