"""Export a training checkpoint as a router directory (DESIGN §9): one path for every router type.

    memroute export sufficiency --checkpoint outputs/sufficiency_router --export_dir outputs/router
    memroute export retriever --checkpoint outputs/retriever_minilm/checkpoint-100 --export_dir outputs/r
    memroute export memagent --checkpoint outputs/memagent_router --export_dir outputs/memagent_export

:func:`export` runs every one of them: parse the router's options, check the checkpoint and the export target
before any model loads (never the checkpoint itself or a directory holding it), read ``train_summary.json``
for the model card, build the router from the checkpoint (``EXPORTS[router_type].build``) and save it
atomically. ``main`` is ``memroute export sufficiency``; ``retriever_main`` and ``memagent_main`` are the
other two.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from routers.base import cast_weights
from routers.logs import get_logger
from train.checkpoints import training_summary

log = get_logger(__name__)


# -- options, one dataclass per router ----------------------------------------------------------------------
EXPORT_DTYPES = ("auto", "fp32", "bf16", "fp16")
EXPORT_DTYPE_HELP = ("dtype of the exported weights: auto = the training dtype (bf16 / fp16 when the run trained "
                     "with --bf16 / --fp16, else fp32), or fp32 / bf16 / fp16")


def check_export_dtype(value) -> None:
    if value not in EXPORT_DTYPES:
        raise ValueError(f"export_dtype must be one of {list(EXPORT_DTYPES)}, got {value!r:.40}")


@dataclass
class ExportConfig:
    """``memroute export sufficiency``."""

    checkpoint: str = field(default="outputs/sufficiency_router", metadata={"help": "output_dir or checkpoint-N"})
    export_dir: str = "outputs/sufficiency_router_export"
    base_model: str | None = field(default=None, metadata={"help": "base for a LoRA adapter; default from the adapter config"})
    threshold: float = 0.5
    max_input_tokens: int = 1024
    export_dtype: str = field(default="auto", metadata={"help": EXPORT_DTYPE_HELP})

    def __post_init__(self):
        check_threshold_options(threshold=self.threshold, max_input_tokens=self.max_input_tokens)
        check_export_dtype(self.export_dtype)


@dataclass
class RetrieverExportConfig:
    """``memroute export retriever``."""

    checkpoint: str = field(default="outputs/retriever_minilm", metadata={"help": "output_dir or checkpoint-N"})
    export_dir: str = "outputs/retriever_minilm/export"
    base_model: str | None = field(default=None, metadata={"help": "recorded in router_config; default from resolved_config.yaml"})
    temperature: float | None = None
    export_dtype: str = field(default="auto", metadata={"help": EXPORT_DTYPE_HELP})

    def __post_init__(self):
        from routers.validation import number_option, option_problems, raise_option_problems

        raise_option_problems(option_problems([number_option(self.temperature, "temperature", low=0, low_open=True,
                                                         allow_none=True)]))
        check_export_dtype(self.export_dtype)


@dataclass
class MemAgentExportConfig:
    """``memroute export memagent``."""

    checkpoint: str = field(default="outputs/memagent_router", metadata={"help": "output_dir or checkpoint-N"})
    export_dir: str = "outputs/memagent_router/export"
    base_model: str | None = field(default=None, metadata={"help": "base for a LoRA adapter; default from the checkpoint"})
    in_threshold: float = 0.5
    end_threshold: float = 0.5
    max_input_tokens: int = 4096
    export_dtype: str = field(default="auto", metadata={"help": EXPORT_DTYPE_HELP})

    def __post_init__(self):
        check_threshold_options(in_threshold=self.in_threshold, end_threshold=self.end_threshold,
                                max_input_tokens=self.max_input_tokens)
        check_export_dtype(self.export_dtype)


def check_threshold_options(max_input_tokens: int, **thresholds) -> None:
    """Thresholds in [0, 1] and a positive input budget (parse time: ``parse_config`` names the source)."""
    from routers.validation import int_option, number_option, option_problems, raise_option_problems

    raise_option_problems(option_problems([*(number_option(v, k, low=0, high=1) for k, v in thresholds.items()),
                                           int_option(max_input_tokens, "max_input_tokens")]))


# -- checks before any model loads ----------------------------------------------------------------------------
CAUSAL_LM_MARKERS = ("adapter_config.json", "config.json")
ENCODER_MARKERS = ("modules.json", "config.json")


def check_checkpoint(checkpoint: str, markers: tuple[str, ...] = CAUSAL_LM_MARKERS) -> Path:
    """The checkpoint to export must be an existing directory holding one of ``markers``; otherwise say so
    (transformers would take a missing path for a Hub id: 'Repo id must be in the form ...')."""
    ckpt = Path(checkpoint)
    if not ckpt.exists():
        raise FileNotFoundError(f"checkpoint {checkpoint}: directory does not exist")
    if not ckpt.is_dir():
        raise NotADirectoryError(f"checkpoint {checkpoint}: not a directory (expected a training output_dir "
                                 "or checkpoint-N)")
    if not any((ckpt / m).is_file() for m in markers):
        raise FileNotFoundError(f"checkpoint {checkpoint}: none of {list(markers)} found (expected a training "
                                "output_dir or checkpoint-N)")
    return ckpt


def check_export_start(cfg, kind: str) -> None:
    """Before any model is loaded: the checkpoint exists and the export target may be replaced (never the
    checkpoint itself or a directory containing it)."""
    from routers.base import check_export_target

    check_checkpoint(cfg.checkpoint, EXPORTS[kind].markers if kind in EXPORTS else CAUSAL_LM_MARKERS)
    check_export_target(cfg.export_dir, kind, protect=(cfg.checkpoint,))


# -- the run behind a checkpoint, the export dtype ----------------------------------------------------------------
def run_config(checkpoint: str | Path) -> dict:
    """The training run's ``resolved_config.yaml`` (the checkpoint's, else its output_dir's), {} when absent."""
    from routers.config import load_yaml

    ckpt = Path(checkpoint)
    for resolved in (ckpt / "resolved_config.yaml", ckpt.parent / "resolved_config.yaml"):
        if resolved.is_file():
            return load_yaml(resolved) or {}
    return {}


def training_dtype(run: dict) -> str:
    """``bf16`` / ``fp16`` when the run trained with mixed precision (``--bf16`` / ``--fp16``), else ``fp32``."""
    return "bf16" if run.get("bf16") is True else "fp16" if run.get("fp16") is True else "fp32"


def export_torch_dtype(choice: str, checkpoint: str | Path):
    """The torch dtype to write: ``auto`` follows the training run (:func:`training_dtype`)."""
    from routers.base import torch_dtype

    check_export_dtype(choice)
    return torch_dtype(training_dtype(run_config(checkpoint)) if choice == "auto" else choice)


# -- loading a checkpoint ----------------------------------------------------------------------------------------
def load_checkpoint(checkpoint: str, base_model: str | None = None):
    """(model, tokenizer, base name) from an adapter folder (merged) or a full-model folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from routers.models import load_causal_lm
    from routers.models import check_local_model_path

    ckpt = check_checkpoint(checkpoint)
    adapter_cfg = ckpt / "adapter_config.json"
    if adapter_cfg.exists():
        from peft import PeftModel

        try:
            adapter = json.loads(adapter_cfg.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ValueError(f"{adapter_cfg}: unreadable ({getattr(err, 'msg', None) or err})") from None
        base = base_model or (adapter.get("base_model_name_or_path") if isinstance(adapter, dict) else None)
        summary = ckpt / "resolved_config.yaml"
        if summary.exists() and base_model is None:
            from routers.config import load_yaml

            run = load_yaml(summary)
            if run.get("keep_layers") is None:  # a pruned router's adapter names its pruned base (pruned_base/)
                base = run.get("model_name_or_path", base)
        if not base:
            raise ValueError(f"{checkpoint}: a LoRA adapter that does not name its base model; pass --base_model")
        check_local_model_path(base, "base model")
        model, tok = load_causal_lm(base)
        model = PeftModel.from_pretrained(model, str(ckpt)).merge_and_unload()
        if (ckpt / "tokenizer_config.json").exists():
            tok = AutoTokenizer.from_pretrained(str(ckpt))
        return model, tok, base
    import torch

    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32)
    base = base_model or run_config(ckpt).get("model_name_or_path") or str(ckpt)
    return model, AutoTokenizer.from_pretrained(str(ckpt)), base


def model_for_export(trainer, output_dir: str, base_model: str | None = None):
    """The trained model with full weights for an in-training export; call it on EVERY rank, after
    ``trainer.save_model(output_dir)``, and export on rank 0 only (other ranks get None).

    Without FSDP this is the unwrapped model. Under FSDP each rank holds only a shard, so merging LoRA or writing
    on rank 0 would export a fraction of the weights: ``save_model`` gathers the full state dict (it must be
    ``FULL_STATE_DICT``, as in configs/accelerate/fsdp.yaml) and rank 0 writes it; after a barrier rank 0 reloads
    those full weights on the CPU (a LoRA adapter merged into its base in float32) and returns them."""
    acc = trainer.accelerator
    if not getattr(trainer, "is_fsdp_enabled", False):
        return acc.unwrap_model(trainer.model) if trainer.is_world_process_zero() else None
    plugin = getattr(acc.state, "fsdp_plugin", None)
    if "FULL_STATE_DICT" not in str(getattr(plugin, "state_dict_type", "")):
        raise RuntimeError(f"FSDP with state dict type {getattr(plugin, 'state_dict_type', None)}: save_model wrote "
                           "no full weights to export; set fsdp_state_dict_type: FULL_STATE_DICT (configs/accelerate/"
                           "fsdp.yaml) or export a checkpoint with `memroute export`")
    acc.wait_for_everyone()  # rank 0 has finished writing the gathered weights
    if not trainer.is_world_process_zero():
        return None
    model, _, _ = load_checkpoint(output_dir, base_model)
    return model


# -- building each router from its checkpoint (after the checks) -------------------------------------------------
def _sufficiency_router(cfg: ExportConfig, training: dict | None):
    from routers.sufficiency import SufficiencyRouter

    model, tok, base = load_checkpoint(cfg.checkpoint, cfg.base_model)  # merged in float32, then cast
    model = cast_weights(model, export_torch_dtype(cfg.export_dtype, cfg.checkpoint))
    return SufficiencyRouter.from_model(model, tok, threshold=cfg.threshold,
                                        max_input_tokens=cfg.max_input_tokens, base_model=base)


def _retriever_router(cfg: RetrieverExportConfig, training: dict | None):
    """The sentence-transformers checkpoint; base model and temperature default to the run's resolved_config.yaml
    (the checkpoint's, else its output_dir's)."""
    import train.retriever as trainer  # heavy (sentence-transformers); load_model looked up at call time
    from routers.retriever import RetrieverConfig, RetrieverRouter
    from routers.config import load_yaml
    from routers.validation import number_option

    ckpt = Path(cfg.checkpoint)
    base, temp, source = cfg.base_model, cfg.temperature, "--temperature"
    for resolved in (ckpt / "resolved_config.yaml", ckpt.parent / "resolved_config.yaml"):
        if resolved.exists():
            data = load_yaml(resolved)
            base = base or data.get("model_name_or_path")
            if temp is None:
                temp, source = data.get("temperature"), str(resolved)
            break
    ok, msg = number_option(temp, f"{source}: temperature", low=0, low_open=True, allow_none=True)
    if not ok:
        raise ValueError(msg)
    model = cast_weights(trainer.load_model(str(ckpt)), export_torch_dtype(cfg.export_dtype, cfg.checkpoint))
    config = RetrieverConfig(base_model=base or str(ckpt), temperature=0.05 if temp is None else temp,
                             max_seq_length=getattr(model, "max_seq_length", None))
    return RetrieverRouter(model, config)


def _memagent_router(cfg: MemAgentExportConfig, training: dict | None):
    from routers.memagent.router import MemAgentRouter

    model, tok, base = load_checkpoint(cfg.checkpoint, cfg.base_model)  # merged in float32, then cast
    model = cast_weights(model, export_torch_dtype(cfg.export_dtype, cfg.checkpoint))
    return MemAgentRouter.from_model(model, tok, in_threshold=cfg.in_threshold, end_threshold=cfg.end_threshold,
                                     max_input_tokens=cfg.max_input_tokens, base_model=base,
                                     provider_names=list((training or {}).get("provider_names") or []))


@dataclass(frozen=True)
class Export:
    """How ``memroute export <router_type>`` works for one router type."""

    config: type                  # the options dataclass
    build: Callable               # (cfg, training summary or None) -> an ExportedRouter
    markers: tuple[str, ...]      # files that make a directory a checkpoint of this kind
    description: str
    log_to_stderr: bool = False   # unused: the "exported" line is logged (stderr under the CLI)


EXPORTS = {
    "sufficiency": Export(ExportConfig, _sufficiency_router, CAUSAL_LM_MARKERS,
                          "Merge a checkpoint into an exported sufficiency router."),
    "retriever": Export(RetrieverExportConfig, _retriever_router, ENCODER_MARKERS,
                        "Export a retriever checkpoint as a RetrieverRouter directory."),
    "memagent": Export(MemAgentExportConfig, _memagent_router, CAUSAL_LM_MARKERS,
                       "Merge a MemAgent SFT checkpoint into a router directory.", log_to_stderr=True),
}


def make_parser(router_type: str = "sufficiency"):
    from routers.config import make_arg_parser

    spec = EXPORTS[router_type]
    return make_arg_parser([spec.config], prog=f"memroute export {router_type}", description=spec.description)


def export(router_type: str, argv=None):
    """``memroute export <router_type> [recipe.yaml] --checkpoint DIR --export_dir OUT ...``: the exported router."""
    from routers.config import parse_config

    spec = EXPORTS[router_type]
    (cfg,) = parse_config(make_parser(router_type), [spec.config], argv)
    check_export_start(cfg, router_type)  # before any model loads: checkpoint exists, target is safe
    training = training_summary(cfg.checkpoint)
    router = spec.build(cfg, training)
    router.save_pretrained(cfg.export_dir, model_card=router.model_card(training=training))
    log.info("exported %s -> %s (%s)", cfg.checkpoint, cfg.export_dir, _dtype_name(router))
    return router


def _dtype_name(router) -> str:
    try:
        return str(next(router.model.parameters()).dtype).removeprefix("torch.")
    except (AttributeError, StopIteration, TypeError):
        return "?"


def _cli(router_type: str, argv):
    from routers.logs import setup_cli_logging

    setup_cli_logging()
    return export(router_type, argv)


def main(argv=None):
    """``memroute export sufficiency``."""
    return _cli("sufficiency", argv)


def retriever_main(argv=None):
    """``memroute export retriever``."""
    return _cli("retriever", argv)


def memagent_main(argv=None):
    """``memroute export memagent``."""
    return _cli("memagent", argv)


if __name__ == "__main__":
    main()
