"""``memroute env``: what a bug report needs (versions, devices, embedded models, cache paths)."""

from __future__ import annotations

import json
import os
import platform


def collect() -> dict:
    from routers.base import git_revision, library_versions
    from routers.models import MissingPackageError, cache_dir, minilm_path, smollm2_gguf_path

    info: dict = {"platform": platform.platform(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
                  "versions": library_versions(), "git_revision": git_revision()}
    try:
        import torch

        info["devices"] = {"cuda": torch.cuda.is_available(),
                           "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                           "bf16_cuda": torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
                           "mps": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
                           "torch_threads": torch.get_num_threads()}
    except ImportError:
        info["devices"] = "torch not installed"
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
