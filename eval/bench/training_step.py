"""Benchmark ``frozen_prefix_step``: what one training step of the CPU path costs, LoRA dropout on vs off.

The quickstart trains LoRA on SmolLM2's top 24 layers over cached lower-layer states (train/frozen_prefix.py).
Profiling that step on a 2-core CPU showed peft's dropout path (``lora_B(lora_A(dropout(x)))`` with a fresh
mask over every adapted input, kept for backward) as a large share of it, next to the base model's own matmuls.
This benchmark times ``SufficiencyTrainer.compute_loss`` + backward + AdamW step on the same cached batches,
under the trainer's precision (bf16 autocast where the machine has native bf16), for ``lora_dropout`` 0.05 (the
trainer default, the baseline) and 0 (the quickstart's setting). Target: dropout-0 step / baseline step <= 0.9.
Whether dropout 0 still learns is a quality question this benchmark does not answer: the quickstart runs do
(configs/sufficiency/README.md).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm.auto import tqdm

from eval.bench.common import BenchConfig, figure, release, summarize, sync, with_target
from routers.io import atomic_write_text
from routers.models import bf16_supported
from routers.sufficiency import NO_WORDS, YES_WORDS, verbalizer_ids

DROPOUTS = {"lora_dropout_0.05": 0.05, "lora_dropout_0": 0.0}  # the first is the baseline
BASELINE = "lora_dropout_0.05"


def _trainer(cfg: BenchConfig, data_path: Path, device: str, tmp: str, dropout: float, bf16: bool,
             states: tuple | None):
    """(model, trainer, dataset, split) for one dropout; the lower-layer states (``(split, states)``) are computed
    once, as the trainer computes them (under its autocast), and reused for the other dropout."""
    from train.sufficiency import (SufficiencyCollator, SufficiencyDataset, SufficiencyTrainer,
                                   SufficiencyTrainingConfig, build_model)
    from train.sufficiency_data import cache_lower_layers

    targs = SufficiencyTrainingConfig(
        output_dir=str(Path(tmp) / "trainer"), report_to="none", per_device_train_batch_size=cfg.batch_size,
        model_name_or_path=cfg.model_name_or_path, train_file=str(data_path), max_length=cfg.max_length,
        lora_r=cfg.lora_r, lora_alpha=2 * cfg.lora_r, lora_dropout=dropout, lora_target_modules=["all-linear"],
        lambda_rep=0.0, train_top_layers=cfg.train_top_layers, save_strategy="no", use_cpu=device == "cpu",
        seed=cfg.seed)
    model, tok = build_model(targs)
    dataset = SufficiencyDataset(str(data_path), tok, targs.max_length)
    if states is None:
        frozen = cache_lower_layers(model, [dataset], cfg.train_top_layers, device, tok.pad_token_id,
                                    autocast_dtype=torch.bfloat16 if bf16 else None)
        split = frozen["split"]
    else:
        split = states[0]
        for item, st in zip(dataset.items, states[1]):
            item["lower_states"] = st
    trainer = SufficiencyTrainer(model=model, args=targs, train_dataset=dataset,
                                 data_collator=SufficiencyCollator(tok.pad_token_id), processing_class=tok,
                                 yes_ids=verbalizer_ids(tok, YES_WORDS), no_ids=verbalizer_ids(tok, NO_WORDS),
                                 lambda_rep=0.0, rep_layer=0, s0=None, top_split=split)
    model.to(device).train()
    return model, trainer, dataset, split


def _time_steps(cfg: BenchConfig, model, trainer, batches, device: str, bf16: bool, name: str) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    amp = torch.autocast(device.split(":")[0], dtype=torch.bfloat16) if bf16 else nullcontext()

    def step(batch):
        sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with amp:
            loss = trainer.compute_loss(model, batch)
        loss.backward()
        opt.step()
        sync(device)
        return time.perf_counter() - t0

    for i in range(cfg.warmup_steps):
        step(batches[i % len(batches)])
    times = [step(batches[(cfg.warmup_steps + i) % len(batches)])
             for i in tqdm(range(cfg.train_steps), desc=f"frozen_prefix_step[{name}]", unit="step", file=sys.stderr)]
    return summarize(times)


def bench_frozen_prefix_step(cfg: BenchConfig, records: list[dict], device: str) -> dict:
    bf16 = bf16_supported() if device == "cpu" else device.startswith("cuda")
    out, tokens, states = {}, None, None
    with tempfile.TemporaryDirectory(prefix="memroute-bench-") as tmp:
        data_path = Path(tmp) / "samples.jsonl"
        atomic_write_text(data_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        for name, dropout in DROPOUTS.items():
            model, trainer, dataset, split = _trainer(cfg, data_path, device, tmp, dropout, bf16, states)
            states = (split, [it["lower_states"] for it in dataset.items])
            collate = trainer.data_collator
            batches = [{k: v.to(device) for k, v in collate(dataset.items[i:i + cfg.batch_size]).items()}
                       for i in range(0, len(dataset), cfg.batch_size)]
            tokens = sum(st.shape[0] for st in states[1])
            out[name] = {**_time_steps(cfg, model, trainer, batches, device, bf16, name), "lora_dropout": dropout}
            del model, trainer, batches
            release()
    base = out[BASELINE]["mean_s"]
    result = {
        "benchmark": "frozen_prefix_step",
        "description": "training step of the frozen-prefix path (LoRA all-linear on the top layers, cached lower "
                       "states): lora_dropout 0 vs 0.05 (baseline) on the same batches and precision",
        "device": device, "bf16_autocast": bf16, "train_top_layers": cfg.train_top_layers, "split": states[0],
        "batch_size": cfg.batch_size, "samples": len(states[1]), "tokens": tokens, "lora_r": cfg.lora_r,
        "warmup_steps": cfg.warmup_steps, "timed_steps": cfg.train_steps, "modes": out,
        "figures": [figure("step_time_lora_dropout_0", "s", out["lora_dropout_0"]["mean_s"], base, "value/baseline",
                           ("<=", 0.9), "mean step seconds with lora_dropout 0; baseline lora_dropout 0.05")],
    }
    return with_target(result)
