"""Launch-time checks shared by the trainers: CPU DDP defaults, world-size sanity, attention kernel.

A multi-process launch on a machine without GPUs (``torchrun --nproc_per_node 2`` or ``accelerate launch
--multi_gpu --num_processes 2``) only forms one process group when ``TrainingArguments.use_cpu`` is true
(the Trainer then joins the ranks with gloo). Without it every process trains alone on the full data
and all of them write the same ``output_dir``: :func:`cpu_ddp_defaults` makes ``use_cpu`` the default
there, and :func:`check_world_size` refuses a launch whose ranks did not join.
"""

from __future__ import annotations

import importlib.util
import os

from routers.logs import get_logger
from routers.validation import int_option, number_option

log = get_logger(__name__)


def launched_world_size() -> int:
    """Processes the launcher started (``WORLD_SIZE`` set by torchrun / accelerate launch), else 1."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    except ValueError:
        return 1


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available() or bool(getattr(torch, "xpu", None) and torch.xpu.is_available())


def cpu_ddp_defaults(parser) -> None:
    """Several processes and no GPU: ``use_cpu`` defaults to true (a recipe or flag can still override it)."""
    if launched_world_size() > 1 and not has_gpu():
        parser.set_defaults(use_cpu=True)


def check_world_size(args) -> None:
    """Raise when the launcher started N processes but the Trainer sees another world size."""
    n = launched_world_size()
    if n > 1 and args.world_size != n:
        raise RuntimeError(
            f"{n} processes were launched but the trainer runs with world_size={args.world_size}: the ranks did not "
            "form one process group, so each would train alone on all the data. On CPU pass --use_cpu true "
            "(optionally --ddp_backend gloo).")


def warn_if_fsdp_ignored(trainer) -> None:
    """An FSDP launch (configs/accelerate/fsdp.yaml) on CPU trains with plain DDP: say so instead of pretending."""
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true") and not getattr(trainer, "is_fsdp_enabled", False):
        if trainer.is_world_process_zero():
            log.warning("FSDP was requested but is not active (%s): FSDP needs GPUs; on CPU the ranks train with "
                        "DDP (full replicas).", trainer.accelerator.distributed_type)


def resolve_attn_implementation(requested: str | None) -> str | None:
    """``"auto"``: flash_attention_2 on CUDA when the ``flash_attn`` package is installed, else None (the
    transformers default, sdpa). Any other value (``sdpa``, ``eager``, ``flash_attention_2``...) is kept."""
    if requested is None or requested.lower() in ("", "none", "default"):
        return None
    if requested != "auto":
        return requested
    import torch

    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return None


def resolve_auto_bf16(args) -> None:
    """``bf16=None`` (auto): bf16 autocast only where the hardware runs it natively (a CUDA GPU with bf16, a CPU
    with AVX512-BF16 / AMX), else fp32. Why: TRL's own default (bf16 on) fails on a CPU without ``use_cpu``
    and, on a CPU without native bf16, emulates it: a Linear layer ran 6.6x slower than in fp32 on a 2-core
    EPYC without AVX-512. A CPU run in bf16 sets ``use_cpu`` (transformers refuses bf16 on CPU without it)."""
    if args.bf16 is not None:
        return
    from routers.models import bf16_supported

    on_cpu = bool(args.use_cpu) or not has_gpu()
    args.bf16 = not args.fp16 and bf16_supported("cpu" if on_cpu else None)
    if args.bf16 and on_cpu:
        args.use_cpu = True


def warn_if_bf16_emulated(args) -> bool:
    """bf16 asked for on a CPU that emulates it: say so (a SmolLM2-135M training step ran 14.8x slower than in fp32,
    ``memroute bench --which precision_step``). Returns whether it warned."""
    if not getattr(args, "bf16", False) or not (getattr(args, "use_cpu", False) or not has_gpu()):
        return False
    from routers.models import bf16_supported

    if bf16_supported("cpu"):
        return False
    log.warning("bf16 autocast on this CPU is emulated (no AVX512-BF16 / AMX): training runs many times slower than "
                "in fp32 (14.8x for a SmolLM2-135M step on a 2-core EPYC; `memroute bench --which precision_step` "
                "measures this machine). Pass --bf16 false.")
    return True


# -- start-time checks shared by the trainers ---------------------------------------------------------
# Everything below runs before a model is loaded, so a bad option, data file or export target fails in
# seconds instead of after the (possibly long) model load or training run.

def training_argument_checks(args) -> list[tuple[bool, str]]:
    """Checks of the TrainingArguments options every trainer shares (batch sizes, learning rate, ...)."""
    return [
        int_option(args.per_device_train_batch_size, "per_device_train_batch_size"),
        int_option(args.gradient_accumulation_steps, "gradient_accumulation_steps"),
        number_option(args.learning_rate, "learning_rate", low=0),
        number_option(args.weight_decay, "weight_decay", low=0),
        number_option(args.max_grad_norm, "max_grad_norm", low=0, allow_none=True),
        number_option(getattr(args, "max_train_minutes", None), "max_train_minutes", low=0, allow_none=True),
    ]


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (the data a run trained on, for the run fingerprint)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# TrainingArguments options that change what a run learns (not logging, saving, export or duration:
# max_steps / num_train_epochs may grow on resume to train further).
FINGERPRINT_TRAINING_ARGS = ("learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps",
                             "warmup_ratio", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
                             "max_grad_norm", "optim", "per_device_train_batch_size", "gradient_accumulation_steps",
                             "seed", "data_seed")


def run_fingerprint(cfg, keys, files: dict | None = None) -> dict:
    """The settings a resumed run must share with the run that wrote its checkpoints: ``keys`` of ``cfg``,
    the shared TrainingArguments options above, and each data file's absolute path and sha256."""
    out = {k: getattr(cfg, k, None) for k in (*keys, *FINGERPRINT_TRAINING_ARGS)}
    for name, path in (files or {}).items():
        if path is None or str(path).lower() == "none":
            out[name] = None
            continue
        out[name] = os.path.abspath(path)
        out[f"{name}_sha256"] = file_digest(path) if os.path.isfile(path) else None
    return out


def check_start(cfg, kind: str, resume: str | None, fingerprint: dict, protect: tuple = ()) -> None:
    """Before anything is loaded: the export target is safe (never the output_dir, a checkpoint or an
    adapter being read), and a resumed run keeps the settings it started with (``run_fingerprint.json``)."""
    from routers.base import check_export_target
    from routers.config import check_run_fingerprint

    warn_if_bf16_emulated(cfg)
    if getattr(cfg, "export_dir", None):
        check_export_target(cfg.export_dir, kind, protect=(cfg.output_dir, *[p for p in protect if p]))
    check_run_fingerprint(cfg.output_dir, fingerprint, resuming=resume is not None, what=f"{kind} training run")
