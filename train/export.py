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
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from train.checkpoints import training_summary


# -- options, one dataclass per router ----------------------------------------------------------------------
@dataclass
class ExportConfig:
    """``memroute export sufficiency``."""

    checkpoint: str = field(default="outputs/sufficiency_router", metadata={"help": "output_dir or checkpoint-N"})
    export_dir: str = "outputs/sufficiency_router_export"
    base_model: str | None = field(default=None, metadata={"help": "base for a LoRA adapter; default from the adapter config"})
    threshold: float = 0.5
    max_input_tokens: int = 1024

    def __post_init__(self):
        check_threshold_options(threshold=self.threshold, max_input_tokens=self.max_input_tokens)


@dataclass
class RetrieverExportConfig:
    """``memroute export retriever``."""

    checkpoint: str = field(default="outputs/retriever_minilm", metadata={"help": "output_dir or checkpoint-N"})
    export_dir: str = "outputs/retriever_minilm/export"
    base_model: str | None = field(default=None, metadata={"help": "recorded in router_config; default from resolved_config.yaml"})
    temperature: float | None = None

    def __post_init__(self):
        from routers.validation import number_option, option_problems, raise_option_problems

        raise_option_problems(option_problems([number_option(self.temperature, "temperature", low=0, low_open=True,
                                                         allow_none=True)]))


@dataclass
class MemAgentExportConfig:
    """``memroute export memagent``."""

    checkpoint: str = field(default="outputs/memagent_router", metadata={"help": "output_dir or checkpoint-N"})
    export_dir: str = "outputs/memagent_router/export"
    base_model: str | None = field(default=None, metadata={"help": "base for a LoRA adapter; default from the checkpoint"})
    in_threshold: float = 0.5
    end_threshold: float = 0.5
    max_input_tokens: int = 4096

    def __post_init__(self):
        check_threshold_options(in_threshold=self.in_threshold, end_threshold=self.end_threshold,
                                max_input_tokens=self.max_input_tokens)


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

            base = load_yaml(summary).get("model_name_or_path", base)
        if not base:
            raise ValueError(f"{checkpoint}: a LoRA adapter that does not name its base model; pass --base_model")
        check_local_model_path(base, "base model")
        model, tok = load_causal_lm(base)
        model = PeftModel.from_pretrained(model, str(ckpt)).merge_and_unload()
        if (ckpt / "tokenizer_config.json").exists():
            tok = AutoTokenizer.from_pretrained(str(ckpt))
        return model, tok, base
    model = AutoModelForCausalLM.from_pretrained(str(ckpt))
    return model, AutoTokenizer.from_pretrained(str(ckpt)), base_model or str(ckpt)


# -- building each router from its checkpoint (after the checks) -------------------------------------------------
def _sufficiency_router(cfg: ExportConfig, training: dict | None):
    from routers.sufficiency import SufficiencyRouter

    model, tok, base = load_checkpoint(cfg.checkpoint, cfg.base_model)
    return SufficiencyRouter.from_model(model.float(), tok, threshold=cfg.threshold,
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
    model = trainer.load_model(str(ckpt))
    config = RetrieverConfig(base_model=base or str(ckpt), temperature=0.05 if temp is None else temp,
                             max_seq_length=getattr(model, "max_seq_length", None))
    return RetrieverRouter(model, config)


def _memagent_router(cfg: MemAgentExportConfig, training: dict | None):
    from routers.memagent.router import MemAgentRouter

    model, tok, base = load_checkpoint(cfg.checkpoint, cfg.base_model)
    return MemAgentRouter.from_model(model.float(), tok, in_threshold=cfg.in_threshold, end_threshold=cfg.end_threshold,
                                     max_input_tokens=cfg.max_input_tokens, base_model=base,
                                     provider_names=list((training or {}).get("provider_names") or []))


@dataclass(frozen=True)
class Export:
    """How ``memroute export <router_type>`` works for one router type."""

    config: type                  # the options dataclass
    build: Callable               # (cfg, training summary or None) -> an ExportedRouter
    markers: tuple[str, ...]      # files that make a directory a checkpoint of this kind
    description: str
    log_to_stderr: bool = False   # where the "exported" line goes (as before: memagent's to stderr)


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
    print(f"[memroute] exported {cfg.checkpoint} -> {cfg.export_dir}", file=sys.stderr if spec.log_to_stderr else sys.stdout)
    return router


def main(argv=None):
    """``memroute export sufficiency``."""
    return export("sufficiency", argv)


def retriever_main(argv=None):
    """``memroute export retriever``."""
    return export("retriever", argv)


def memagent_main(argv=None):
    """``memroute export memagent``."""
    return export("memagent", argv)


if __name__ == "__main__":
    main()
