"""Benchmark ``precision_step``: one causal-LM training step in fp32 vs bf16 autocast on this machine.

Why: bf16 halves a step's time where the hardware has it (a GPU, a CPU with AVX512-BF16 / AMX) and multiplies it
where it is emulated (a Linear layer ran 6.6x slower than fp32 on a 2-core EPYC without AVX-512). The trainers'
``bf16`` auto default (``train.distributed.resolve_auto_bf16``) picks by :func:`routers.models.bf16_supported`;
this measures whether that pick is the faster one here. Same model, same random token batch
(``batch_size`` x ``precision_seq_len``), forward + backward + AdamW over all weights. Target: the auto pick's step
time <= 1.05 x the faster mode's.
"""

from __future__ import annotations

import time

import torch

from eval.bench.common import BenchConfig, figure, release, summarize, sync, with_target
from routers.models import bf16_supported, load_causal_lm, resolve_causal_lm

MODES = ("fp32", "bf16_autocast")  # the first is the baseline


def _time_mode(cfg: BenchConfig, device: str, bf16: bool, ids: torch.Tensor) -> dict:
    model, _ = load_causal_lm(cfg.model_name_or_path, dtype=torch.float32, device=device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    amp = torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=bf16)
    times, losses = [], []
    for i in range(cfg.warmup_steps + cfg.train_steps):
        sync(device)
        t0 = time.perf_counter()
        with amp:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        if i >= cfg.warmup_steps:
            times.append(time.perf_counter() - t0)
            losses.append(float(loss.detach()))
    del model, opt
    release()
    return {**summarize(times), "losses": losses}


def bench_precision_step(cfg: BenchConfig, records: list[dict], device: str) -> dict:
    from transformers import AutoConfig

    gen = torch.Generator().manual_seed(cfg.seed)
    vocab = AutoConfig.from_pretrained(resolve_causal_lm(cfg.model_name_or_path)).vocab_size
    ids = torch.randint(0, vocab, (cfg.batch_size, cfg.precision_seq_len), generator=gen).to(device)
    modes = {name: _time_mode(cfg, device, name == "bf16_autocast", ids) for name in MODES}
    native = bf16_supported("cpu" if device == "cpu" else None)
    auto = "bf16_autocast" if native else "fp32"
    fastest = min(modes[m]["mean_s"] for m in MODES)
    result = {
        "benchmark": "precision_step",
        "description": "forward + backward + AdamW step of the causal LM on one random token batch: bf16 autocast vs "
                       "fp32 (baseline); which one the trainers' bf16 auto default picks here",
        "device": device, "bf16_native": native, "auto_pick": auto, "batch_size": cfg.batch_size,
        "seq_len": cfg.precision_seq_len, "warmup_steps": cfg.warmup_steps, "timed_steps": cfg.train_steps,
        "modes": modes,
        "figures": [
            figure("step_time_bf16_autocast", "s", modes["bf16_autocast"]["mean_s"], modes["fp32"]["mean_s"],
                   "value/baseline", description="mean step seconds in bf16 autocast; baseline fp32"),
            figure("step_time_auto_pick", "s", modes[auto]["mean_s"], fastest, "value/baseline", ("<=", 1.05),
                   f"mean step seconds of the auto pick ({auto}); baseline the faster of the two modes"),
        ],
    }
    return with_target(result)
