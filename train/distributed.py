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
    import sys

    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true") and not getattr(trainer, "is_fsdp_enabled", False):
        if trainer.is_world_process_zero():
            print(f"[memroute] FSDP was requested but is not active ({trainer.accelerator.distributed_type}): "
                  "FSDP needs GPUs; on CPU the ranks train with DDP (full replicas).", file=sys.stderr)


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
