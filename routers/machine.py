"""Which machine produced a number: results files and stored evaluations carry it.

Greedy rollouts of a small LM are deterministic on one machine but not across machines: a different CPU (or kernel
set: AVX2 vs AVX-512, bf16 support) rounds a logit differently, near ties flip, and held-out tasks change (3 of 42
for one AutoMem system). A number replayed from a store played elsewhere therefore has to say where it was played.
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache

# CPU features that change which matmul kernels run (and so the rounding of a greedy decision)
NUMERIC_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


@lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name with its numerics-relevant flags, e.g. ``"AMD EPYC [avx2 fma]"``; ``platform.processor()``
    is empty on most Linux machines, so /proc/cpuinfo is read where it exists."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    present = [f for f in NUMERIC_FLAGS if f in flags]
    return f"{name} [{' '.join(present)}]" if present else name


def machine_info(device: str | None = None) -> dict:
    """Platform, CPU (:func:`cpu_model`), core count, torch threads and, on a GPU, its name: what a results file
    records beside ``routers.base.library_versions()``."""
    info = {"platform": platform.platform(), "machine": platform.machine(), "processor": platform.processor(),
            "cpu_model": cpu_model(), "python": platform.python_version(), "cpu_count": os.cpu_count()}
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()  # ATen's kernel level (ATEN_CPU_CAPABILITY)
        cuda = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
        info["cuda"] = torch.cuda.get_device_name(torch.device(device) if device else 0) if cuda else None
    except Exception:  # noqa: BLE001 - machine info is best effort (a broken CUDA setup must not fail a report)
        pass
    if device is not None:
        info["device"] = device
    return info


def played_on() -> str:
    """The short provenance a stored evaluation carries: CPU model, torch version and the kernel level ATen runs
    (``ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2`` on an AVX-512 machine repeated an AVX2 machine's
    held-out numbers exactly: configs/automem/README.md)."""
    try:
        import torch

        return f"{cpu_model()}; torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()} kernels)"
    except ImportError:
        return cpu_model()
