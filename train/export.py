"""Export a training checkpoint (LoRA adapter or full model) as a router directory (DESIGN §9).

    memroute export sufficiency --checkpoint outputs/sufficiency_router --export_dir outputs/router
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ExportConfig:
    checkpoint: str = field(default="outputs/sufficiency_router", metadata={"help": "output_dir or checkpoint-N"})
    export_dir: str = "outputs/sufficiency_router_export"
    base_model: str | None = field(default=None, metadata={"help": "base for a LoRA adapter; default from the adapter config"})
    threshold: float = 0.5
    max_input_tokens: int = 1024

    def __post_init__(self):
        check_threshold_options(threshold=self.threshold, max_input_tokens=self.max_input_tokens)


def check_threshold_options(max_input_tokens: int, **thresholds) -> None:
    """Thresholds in [0, 1] and a positive input budget (parse time: ``parse_config`` names the source)."""
    from train.distributed import number_in, option_problems, positive_int, raise_option_problems

    raise_option_problems(option_problems([*(number_in(v, k, low=0, high=1) for k, v in thresholds.items()),
                                           positive_int(max_input_tokens, "max_input_tokens")]))


def check_checkpoint(checkpoint: str, markers: tuple[str, ...] = ("adapter_config.json", "config.json")) -> Path:
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

    check_checkpoint(cfg.checkpoint, *(() if kind != "retriever" else (("modules.json", "config.json"),)))
    check_export_target(cfg.export_dir, kind, protect=(cfg.checkpoint,))


def read_training_summary(checkpoint: str | Path) -> dict | None:
    """train_summary.json of a checkpoint without its log history (for the model card); None when absent."""
    summary = Path(checkpoint) / "train_summary.json"
    if not summary.exists():
        return None
    try:
        data = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{summary}: unreadable ({getattr(err, 'msg', None) or err}); fix or remove it") from None
    if not isinstance(data, dict):
        raise ValueError(f"{summary}: expected a JSON object, got {type(data).__name__}")
    return {k: v for k, v in data.items() if k != "log_history"}


def load_checkpoint(checkpoint: str, base_model: str | None = None):
    """(model, tokenizer, base name) from an adapter folder (merged) or a full-model folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from routers.models import load_causal_lm
    from train.distributed import check_model_path

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
            from train.config import load_yaml

            base = load_yaml(summary).get("model_name_or_path", base)
        if not base:
            raise ValueError(f"{checkpoint}: a LoRA adapter that does not name its base model; pass --base_model")
        check_model_path(base, "base model")
        model, tok = load_causal_lm(base)
        model = PeftModel.from_pretrained(model, str(ckpt)).merge_and_unload()
        if (ckpt / "tokenizer_config.json").exists():
            tok = AutoTokenizer.from_pretrained(str(ckpt))
        return model, tok, base
    model = AutoModelForCausalLM.from_pretrained(str(ckpt))
    return model, AutoTokenizer.from_pretrained(str(ckpt)), base_model or str(ckpt)


def make_parser():
    from train.config import make_arg_parser

    return make_arg_parser([ExportConfig], prog="memroute export sufficiency",
                           description="Merge a checkpoint into an exported sufficiency router.")


def main(argv=None):
    from routers.sufficiency import SufficiencyRouter, default_model_card
    from train.config import parse_config

    (cfg,) = parse_config(make_parser(), [ExportConfig], argv)
    check_export_start(cfg, "sufficiency")
    training = read_training_summary(cfg.checkpoint)
    model, tok, base = load_checkpoint(cfg.checkpoint, cfg.base_model)
    router = SufficiencyRouter.from_model(model.float(), tok, threshold=cfg.threshold,
                                          max_input_tokens=cfg.max_input_tokens, base_model=base)
    router.save_pretrained(cfg.export_dir, model_card=default_model_card(router, training=training))
    print(f"[memroute] exported {cfg.checkpoint} -> {cfg.export_dir}")
    return router


if __name__ == "__main__":
    main()
