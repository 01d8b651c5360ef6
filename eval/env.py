"""``memroute env``: what a bug report needs (versions, devices, embedded models, cache paths)."""

from __future__ import annotations

import importlib.util
import json
import os
import platform

from routers.base import git_revision, library_versions
from routers.models import MissingPackageError, bf16_supported, cache_dir, minilm_path, smollm2_gguf_path


def collect() -> dict:
    info: dict = {"platform": platform.platform(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
                  "versions": library_versions(), "git_revision": git_revision()}
    try:
        import torch

        info["devices"] = {"cuda": torch.cuda.is_available(),
                           "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                           "bf16_cuda": torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
                           "mps": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
                           "torch_threads": torch.get_num_threads()}
        info["devices"]["bf16_native"] = bf16_supported()  # CUDA bf16, or a CPU with AVX512-BF16 / AMX
        import torch.distributed as dist

        info["distributed"] = {"available": dist.is_available(),
                               **({f"{b}": getattr(dist, f"is_{b}_available")() for b in ("gloo", "nccl", "mpi")}
                                  if dist.is_available() else {}),
                               "launched_world_size": int(os.environ.get("WORLD_SIZE", "1") or 1)}
    except ImportError:
        info["devices"] = "torch not installed"
    # The GPU path: bf16 autocast (--bf16 true) and flash attention when the package is installed
    # (attn_implementation "auto" picks flash_attention_2 on CUDA then).
    info["attention"] = {"flash_attn_installed": importlib.util.find_spec("flash_attn") is not None}
    try:
        from accelerate.commands.config import default_config_file

        info["accelerate_config"] = default_config_file if os.path.exists(default_config_file) else None
    except ImportError:
        info["accelerate_config"] = None
    models = {}
    for name, fn in (("smollm2_gguf", smollm2_gguf_path), ("minilm", minilm_path)):
        try:
            models[name] = str(fn())
        except MissingPackageError as err:
            models[name] = f"missing: {err}"
    converted = cache_dir() / "SmolLM2-135M-Instruct"
    models["smollm2_converted"] = str(converted) if (converted / "config.json").exists() else "not converted yet"
    info["embedded_models"] = models
    info["cache_dir"] = str(cache_dir())
    info["env"] = {k: os.environ.get(k) for k in ("MEMROUTE_CACHE", "HF_HOME", "HF_HUB_OFFLINE", "CUDA_VISIBLE_DEVICES")}
    return info


def main(argv=None) -> dict:
    info = collect()
    print(json.dumps(info, indent=2))
    return info


if __name__ == "__main__":
    main()
