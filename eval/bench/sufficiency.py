"""Sufficiency-router benchmarks and their samples.

* ``router_latency``: decision latency per query at batch size 1. The one-forward sufficiency router
  (``SufficiencyRouter.score``, one decision token) against a generate-based router on the same
  backbone and the same (question, context): it is prompted to write a short rationale and then answer
  yes or no, decoded greedily with exactly ``generate_new_tokens`` new tokens (``min_new_tokens =
  max_new_tokens``, so the baseline is well defined whatever the model writes; KV cache on).
  Target: speedup (generate / router) >= 10.
* ``distill_step``: LoRA training step time (``SufficiencyTrainer.compute_loss`` + backward + AdamW
  step) on the same fixed batches in three modes: ``lambda_rep = 0`` (baseline, no distillation),
  distillation with the teacher forward each step (no cache), and distillation with the teacher states
  already cached. Targets: distill / base <= 1.5, cached / base <= 1.1.

Both read up to ``n_samples`` sufficiency records (:func:`load_samples`; the bundled LoCoMo when the data
file is missing).
"""

from __future__ import annotations

import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from data_synthesis.corpora import load_locomo
from routers.io import atomic_write_text, read_jsonl
from eval.bench.common import BenchConfig, figure, release, summarize, sync, with_target
from routers.memory.retrieval import render_context
from routers.sufficiency import CONTINUE, NO_WORDS, TERMINATE, YES_WORDS, SufficiencyRouter, build_prompt, verbalizer_ids

REQUIRED_FIELDS = ("id", "question", "context", "label")

# The generate-based baseline router: same question and context, asked to reason first, then answer.
GENERATE_SYSTEM_PROMPT = ("You decide whether retrieved memory is sufficient to answer a question. "
                          "First write a short rationale: which evidence is present and what decisive "
                          "piece is missing. Then end with 'Answer: yes' or 'Answer: no'.")
GENERATE_USER_TEMPLATE = ("Question: {question}\n\nRetrieved memory:\n{context}\n\n"
                          "Is the retrieved memory sufficient to answer the question? Write a short "
                          "rationale, then answer yes or no.")


# -- data ------------------------------------------------------------------------------------------------
def locomo_samples(n: int, seed: int = 0, neighbours: int = 2) -> list[dict]:
    """Sufficiency-shaped records from the bundled LoCoMo: question + evidence steps + neighbours.

    Even-numbered samples keep the evidence (label 1); odd-numbered ones keep only the neighbours
    (label 0), so the batches hold both classes. A template rationale names present/missing evidence.
    """
    episodes = load_locomo()
    pairs = [(ep, qa) for ep in episodes for qa in ep.qa]
    random.Random(seed).shuffle(pairs)
    out = []
    for i, (ep, qa) in enumerate(pairs[: max(4 * n, n + 8)]):
        ev = [ep.step(e) for e in qa.evidence]
        ev_idx = {s.index for s in ev}
        near = sorted({j for s in ev for j in range(s.index - neighbours, s.index + neighbours + 1)
                       if 0 <= j < len(ep.steps)} - ev_idx)
        positive = len(out) % 2 == 0
        steps = ev + [ep.steps[j] for j in near] if positive else [ep.steps[j] for j in near]
        if not steps:
            continue
        ids = ", ".join(qa.evidence)
        rationale = (f"The decisive evidence ({ids}) is present: {qa.answer}." if positive
                     else f"Only neighbouring turns are present; the decisive evidence ({ids}) is missing.")
        out.append({"id": f"{qa.qa_id}/{'pos' if positive else 'neg'}", "question": qa.question,
                    "context": render_context(steps), "label": int(positive), "rationale": rationale,
                    "source": "locomo-bench"})
    return out


def load_samples(cfg: BenchConfig, tokenizer) -> tuple[list[dict], dict]:
    """Up to ``n_samples`` records whose router prompt fits ``max_length``; plus a description."""
    if cfg.data and Path(cfg.data).exists():
        candidates, source = read_jsonl(cfg.data, required=REQUIRED_FIELDS), str(cfg.data)
    else:
        candidates, source = locomo_samples(cfg.n_samples, cfg.seed), "bundled LoCoMo (fallback: data file missing)"
    records, lengths, skipped = [], [], 0
    for rec in candidates:
        n_tok = len(tokenizer.encode(build_prompt(tokenizer, rec["question"], rec["context"]), add_special_tokens=False))
        if n_tok > cfg.max_length:
            skipped += 1
            continue
        records.append(rec)
        lengths.append(n_tok)
        if len(records) >= cfg.n_samples:
            break
    if not records:
        raise ValueError(f"{source}: no sample fits max_length={cfg.max_length} tokens")
    info = {"source": source, "requested": cfg.data, "n_samples": len(records), "skipped_too_long": skipped,
            "n_positive": sum(int(r["label"]) for r in records),
            "router_prompt_tokens": {"mean": statistics.fmean(lengths), "min": min(lengths), "max": max(lengths)}}
    return records, info


# -- benchmark: router latency ---------------------------------------------------------------------------
def _parse_verdict(text: str) -> str | None:
    words = re.findall(r"\b(yes|no)\b", text.lower())
    return None if not words else (TERMINATE if words[-1] == "yes" else CONTINUE)


def _latency_router(cfg: BenchConfig, records: list[dict], device: str) -> tuple[SufficiencyRouter, str, bool]:
    """The router (export or base, in ``inference_dtype``), its weights' source, and whether its input budget
    was lifted so that no sample is skipped (a skipped prompt would time nothing)."""
    if cfg.router:
        router = SufficiencyRouter.from_pretrained(cfg.router, device=device)
        weights = str(cfg.router)
    else:
        router = SufficiencyRouter.from_base(cfg.model_name_or_path, device=device)
        weights = cfg.model_name_or_path
    router.model.to(getattr(torch, cfg.inference_dtype))  # same weights and dtype for both sides
    router.model.eval()
    budget_lifted = False
    longest = max(len(e) for e in router.encode([r["question"] for r in records], [r["context"] for r in records]))
    if longest > router.config.max_input_tokens:  # an over-budget prompt is skipped, which would time nothing
        router.config.max_input_tokens, budget_lifted = longest, True
    return router, weights, budget_lifted


def bench_router_latency(cfg: BenchConfig, records: list[dict], device: str) -> dict:
    router, weights, budget_lifted = _latency_router(cfg, records, device)
    model, tok = router.model, router.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    n_new = cfg.generate_new_tokens

    def route(rec):
        return router.score(rec["question"], rec["context"], batch_size=1)

    @torch.inference_mode()
    def generate(rec):
        prompt = build_prompt(tok, rec["question"], rec["context"], system_prompt=GENERATE_SYSTEM_PROMPT,
                              user_template=GENERATE_USER_TEMPLATE)
        enc = tok(prompt, return_tensors="pt", add_special_tokens=False).to(model.device)
        out = model.generate(**enc, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                             pad_token_id=pad, use_cache=True)
        new = out[0, enc["input_ids"].shape[1]:]
        return tok.decode(new, skip_special_tokens=True), int(new.shape[0])

    def timed(fn, rec):
        sync(device)
        t0 = time.perf_counter()
        res = fn(rec)
        sync(device)
        return time.perf_counter() - t0, res

    timed(route, records[0])  # warmup (allocations, kernel selection, lazy init)
    timed(generate, records[0])
    r_times, g_times, n_tokens, agree, parsed = [], [], [], 0, 0
    for rec in tqdm(records, desc="router_latency", unit="query", file=sys.stderr):
        t, score = timed(route, rec)
        r_times.append(t)
        t, (text, k) = timed(generate, rec)
        g_times.append(t)
        n_tokens.append(k)
        verdict = _parse_verdict(text)
        parsed += verdict is not None
        agree += verdict is not None and verdict == router.decide(score)[0]
    r, g = summarize(r_times), summarize(g_times)
    result = {
        "benchmark": "router_latency",
        "description": "Decision latency per query (batch size 1): one-forward sufficiency router vs a "
                       "generate-based router (rationale then yes/no) on the same backbone and prompts.",
        "weights": weights, "device": str(model.device), "dtype": str(next(model.parameters()).dtype),
        "router": {**r, "method": "SufficiencyRouter.score: one forward, logits_to_keep=1, one decision token"},
        "generate_baseline": {
            **g, "method": "model.generate greedy, rationale then 'Answer: yes/no'",
            "max_new_tokens": n_new, "min_new_tokens": n_new, "kv_cache": True,
            "note": f"min_new_tokens = max_new_tokens = {n_new}: exactly {n_new} new tokens are decoded per query "
                    "(no early stop at EOS), so the baseline cost is well defined.",
            "new_tokens_generated": {"min": min(n_tokens), "max": max(n_tokens)},
            "verdict_parsed": parsed, "verdict_agrees_with_router": agree},
        "timing_includes": "prompt building + tokenization + model call (+ decoding the generated text); "
                           "torch.inference_mode; one untimed warmup call each",
        "router_input_budget_lifted": budget_lifted,
        "figures": [
            figure("decision_latency_p50", "s", r["p50_s"], g["p50_s"], "baseline/value", (">=", 10.0),
                   "median seconds per decision; baseline = generate-based router; ratio = speedup"),
            figure("decision_latency_mean", "s", r["mean_s"], g["mean_s"], "baseline/value", (">=", 10.0),
                   "mean seconds per decision; baseline = generate-based router; ratio = speedup"),
        ],
    }
    del router, model
    release()
    return with_target(result)


# -- benchmark: distillation step time -------------------------------------------------------------------
def _distill_trainer(cfg: BenchConfig, records: list[dict], device: str, tmp: str):
    """(trainer config, model, trainer, batches on ``device``, number of samples, rep layer) for ``records``."""
    # train.sufficiency pulls in peft/trl: imported only when this benchmark runs
    from train.sufficiency import (SufficiencyCollator, SufficiencyDataset, SufficiencyTrainer,
                                   SufficiencyTrainingConfig, build_model, default_rep_layer)

    data_path = Path(tmp) / "samples.jsonl"
    atomic_write_text(data_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    targs = SufficiencyTrainingConfig(
        output_dir=str(Path(tmp) / "trainer"), report_to="none", max_steps=cfg.train_steps + cfg.warmup_steps,
        per_device_train_batch_size=cfg.batch_size, model_name_or_path=cfg.model_name_or_path,
        train_file=str(data_path), max_length=cfg.max_length, lora_r=cfg.lora_r, lora_alpha=2 * cfg.lora_r,
        lora_target_modules=list(cfg.lora_target_modules), lambda_rep=cfg.lambda_rep, save_strategy="no",
        use_cpu=device == "cpu", seed=cfg.seed)
    torch.manual_seed(cfg.seed)
    model, tok = build_model(targs)
    dataset = SufficiencyDataset(str(data_path), tok, targs.max_length)
    collate = SufficiencyCollator(tok.pad_token_id)
    batches = [collate([dataset[j] for j in range(i, min(i + cfg.batch_size, len(dataset)))])
               for i in range(0, len(dataset), cfg.batch_size)]
    rep_layer = default_rep_layer(model)
    trainer = SufficiencyTrainer(model=model, args=targs, train_dataset=dataset, data_collator=collate,
                                 processing_class=tok, yes_ids=verbalizer_ids(tok, YES_WORDS),
                                 no_ids=verbalizer_ids(tok, NO_WORDS), lambda_rep=cfg.lambda_rep,
                                 rep_layer=rep_layer, s0=1.0, cache_teacher_states=True)
    model.to(device)
    model.train()
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
    return targs, model, trainer, batches, len(dataset), rep_layer


def _time_mode(cfg: BenchConfig, trainer, model, params, initial, batches, lr: float, device: str, name: str,
               lam: float, cached: bool) -> dict:
    """Timed steps of one mode, from the initial LoRA weights and a fresh AdamW."""
    with torch.no_grad():  # every mode starts from the same LoRA weights and a fresh optimizer
        for p, p0 in zip(params, initial):
            p.copy_(p0)
    opt = torch.optim.AdamW(params, lr=lr)
    trainer.lambda_rep, trainer.cache_teacher_states = lam, cached
    trainer.teacher_cache.clear()

    def step(batch):
        sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(model, batch)
        loss.backward()
        opt.step()
        sync(device)
        return time.perf_counter() - t0, float(loss.detach())

    fill_s = None
    if cached:  # one pass fills the teacher cache; only later steps are timed
        t0 = time.perf_counter()
        with torch.no_grad():
            for b in batches:
                trainer.teacher_states(model, b)
        fill_s = time.perf_counter() - t0
    for i in range(cfg.warmup_steps):
        step(batches[i % len(batches)])
    times, losses = [], []
    for i in tqdm(range(cfg.train_steps), desc=f"distill_step[{name}]", unit="step", file=sys.stderr):
        t, loss = step(batches[(cfg.warmup_steps + i) % len(batches)])
        times.append(t)
        losses.append(loss)
    return {**summarize(times), "lambda_rep": lam, "teacher_cache": cached,
            "cache_fill_s": fill_s, "cached_states": len(trainer.teacher_cache), "losses": losses}


def bench_distill_step(cfg: BenchConfig, records: list[dict], device: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="memroute-bench-") as tmp:
        targs, model, trainer, batches, n_data, rep_layer = _distill_trainer(cfg, records, device, tmp)
        params = [p for p in model.parameters() if p.requires_grad]
        initial = [p.detach().clone() for p in params]
        modes = {"base": (0.0, False), "distill_no_cache": (cfg.lambda_rep, False),
                 "distill_cached": (cfg.lambda_rep, True)}
        out = {name: _time_mode(cfg, trainer, model, params, initial, batches, targs.learning_rate, device, name,
                                lam, cached) for name, (lam, cached) in modes.items()}
        n_trainable = sum(p.numel() for p in params)
        n_total = sum(p.numel() for p in model.parameters())
        del trainer, model, batches
        release()
    base = out["base"]["mean_s"]
    result = {
        "benchmark": "distill_step",
        "description": "LoRA training step (SufficiencyTrainer.compute_loss + backward + AdamW step) on the same "
                       "fixed batches: no distillation (baseline) vs distillation with/without cached teacher states.",
        "device": device, "batch_size": cfg.batch_size, "n_batches": len(range(0, n_data, cfg.batch_size)),
        "warmup_steps": cfg.warmup_steps, "timed_steps": cfg.train_steps, "rep_layer": rep_layer,
        "s0": 1.0, "lora": {"r": cfg.lora_r, "alpha": 2 * cfg.lora_r, "targets": list(cfg.lora_target_modules)},
        "params": {"trainable": n_trainable, "total": n_total}, "modes": out,
        "figures": [
            figure("step_time_distill_no_cache", "s", out["distill_no_cache"]["mean_s"], base, "value/baseline",
                   ("<=", 1.5), "mean step seconds, lambda_rep>0, teacher forward every step; baseline lambda_rep=0"),
            figure("step_time_distill_cached", "s", out["distill_cached"]["mean_s"], base, "value/baseline",
                   ("<=", 1.1), "mean step seconds, lambda_rep>0, teacher states cached; baseline lambda_rep=0"),
        ],
    }
    return with_target(result)
