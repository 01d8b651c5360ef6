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


def load_checkpoint(checkpoint: str, base_model: str | None = None):
    """(model, tokenizer, base name) from an adapter folder (merged) or a full-model folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from routers.models import load_causal_lm

    ckpt = Path(checkpoint)
    adapter_cfg = ckpt / "adapter_config.json"
    if adapter_cfg.exists():
        from peft import PeftModel

        base = base_model or json.loads(adapter_cfg.read_text()).get("base_model_name_or_path")
        summary = ckpt / "resolved_config.yaml"
        if summary.exists() and base_model is None:
            import yaml

            base = yaml.safe_load(summary.read_text()).get("model_name_or_path", base)
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
    model, tok, base = load_checkpoint(cfg.checkpoint, cfg.base_model)
    router = SufficiencyRouter.from_model(model.float(), tok, threshold=cfg.threshold,
                                          max_input_tokens=cfg.max_input_tokens, base_model=base)
    training = None
    summary = Path(cfg.checkpoint) / "train_summary.json"
    if summary.exists():
        training = {k: v for k, v in json.loads(summary.read_text()).items() if k != "log_history"}
    router.save_pretrained(cfg.export_dir, model_card=default_model_card(router, training=training))
    print(f"[memroute] exported {cfg.checkpoint} -> {cfg.export_dir}")
    return router


if __name__ == "__main__":
    main()
