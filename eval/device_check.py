"""``memroute check-device``: prove that every router trains and round-trips on this machine's accelerator.

For each router (sufficiency, retriever, MemAgent) it runs a few real training steps through the package's
own trainer, in bf16 where the device supports it and on whatever accelerator ``accelerate`` picks (no
hard-coded device), exports, reloads the export on the device, re-saves and reloads it again, and checks:

* the trainer really ran on the device, in bf16 mixed precision, and the loss is finite;
* the exported weights differ from the starting weights (training did something);
* a reload of a re-saved export reproduces the device scores bit for bit;
* the same export scored on the CPU agrees with the device to a stated tolerance.

Models are tiny random ones (a 2-layer Llama, a 2-layer BERT) built around real tokenizers, so the check
needs no download and runs in about a minute; the toy data are generated here. A cluster user runs it once
after installing, before launching a real job. Results go to ``device_check.json`` with machine and
library versions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from routers.base import git_revision, library_versions, write_json
from routers.memagent import prompts as P
from routers.memagent.protocol import Preview, Task, Trajectory, TrajectoryStep
from routers.logs import get_logger, setup_cli_logging
from routers.models import bf16_supported, default_device, minilm_path, resolve_causal_lm

log = get_logger("eval.device_check")  # the same name under python -m


# A score on the CPU and on a GPU differ by kernel choice (fp32 matmul order, fused attention); this is
# the largest difference accepted for probabilities and cosine similarities in [0, 1] / [-1, 1].
CROSS_DEVICE_TOL = 1e-3


# -- toy data --------------------------------------------------------------------------------------------
def sufficiency_toy(n: int = 24, seed: int = 0) -> list[dict]:
    """Question/context pairs whose label is whether the context holds the line that answers the question."""
    rng = random.Random(seed)
    people, pets = ["Ana", "Ben", "Cleo", "Dan", "Eve", "Finn"], ["cat", "dog", "parrot", "rabbit", "turtle"]
    out = []
    for i in range(n):
        who, pet, label = rng.choice(people), rng.choice(pets), i % 2
        filler = [f"[S{j}] {rng.choice(people)} mentioned the weather." for j in range(3)]
        if label:
            filler.insert(rng.randint(0, 3), f"[S9] {who} adopted a {pet} last week.")
        out.append({"schema_version": 1, "id": f"toy{i}", "question": f"Which pet did {who} adopt?",
                    "context": "\n".join(filler), "label": label,
                    "rationale": f"{who}'s adoption is stated." if label else f"Nothing says what {who} adopted."})
    return out


def retriever_toy(n: int = 8) -> list[dict]:
    """Queries with two positive and two negative memory texts each (the retriever's training schema)."""
    topics = ["kitchen", "garden", "station", "library", "harbor", "museum", "bakery", "stadium"]
    out = []
    for i, t in enumerate(topics[:n]):
        out.append({"schema_version": 1, "id": f"toy/q{i}", "qa_id": f"toy/q{i}", "episode_id": "toy", "source": "toy",
                    "split": "train", "category": "toy", "query": f"what happened at the {t}",
                    "positives": [f"[p{i}] we met at the {t} at noon", f"[w{i}] the {t} was crowded"],
                    "negatives": [f"[n{i}] the {topics[(i + 1) % n]} was closed", f"[m{i}] nothing about it"],
                    "positive_ids": [f"p{i}", f"w{i}"], "negative_ids": [f"n{i}", f"m{i}"],
                    "positive_kinds": ["step", "window"], "negative_kinds": ["bm25", "bm25"], "evidence_ids": [f"p{i}"]})
    return out


@dataclass
class ToyProvider:
    """The three things the MemAgent prompts read from a memory provider."""
    name: str
    gate: str = "all"

    def describe_storage(self) -> str:
        return f"{self.name} keeps summaries of finished tasks"

    def describe_retrieval(self) -> str:
        return f"{self.name} returns the most similar past tasks"


def memagent_toy(providers: dict) -> dict[str, list[dict]]:
    """Begin / In / End prompt-completion records in the exploration output schema."""
    goals = ["Cook the egg.", "Open the chest.", "Water the plant.", "Fix the lamp."]
    names = list(providers)
    rec = {"begin": [], "in": [], "end": []}
    for i, goal in enumerate(goals):
        previews = [Preview(n, 0.2 * (j + 1), f"note {j} on {goal}", j) for j, n in enumerate(names)]
        rec["begin"].append({"prompt": P.begin_messages(goal, previews, providers), "phase": "begin", "task_id": f"t{i}",
                             "completion": [{"role": "assistant", "content": P.begin_completion(names[i % len(names)])}],
                             "reward": 1.0})
        rec["in"].append({"prompt": P.in_messages(goal, i, "Collected Data:\n- a key" if i % 2 else ""), "phase": "in",
                          "completion": [{"role": "assistant", "content": P.in_completion(bool(i % 2))}],
                          "task_id": f"t{i}", "reward": 1.0})
        steps = [TrajectoryStep(k, f"Room {k}.", f"go north {k}") for k in range(3)]
        traj = Trajectory(Task(f"t{i}", goal), steps, bool(i % 2), begin_provider=names[0])
        rec["end"].append({"prompt": P.end_messages(traj, providers), "phase": "end", "task_id": f"t{i}",
                           "completion": [{"role": "assistant", "content": P.end_completion(names[: i % 2 + 1])}],
                           "reward": 1.0})
    return rec


def _write_jsonl(path: Path, records: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


# -- tiny models -----------------------------------------------------------------------------------------
def tiny_llama(tokenizer_path: str, out: Path) -> str:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=True, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def tiny_encoder(tokenizer_path: str, out: Path) -> str:
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    torch.manual_seed(0)
    bert = out.parent / f"{out.name}-bert"
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=128)).save_pretrained(bert)
    tok.save_pretrained(bert)
    st = SentenceTransformer(modules=[models.Transformer(str(bert), max_seq_length=64), models.Pooling(32, "mean"),
                                      models.Normalize()], device="cpu")
    st.save(str(out))
    return str(out)


# -- checks ----------------------------------------------------------------------------------------------
def _trainer_facts(trainer, info: dict) -> dict:
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    param = next(trainer.model.parameters())
    steps = info.get("steps") or 0
    runtime = info.get("train_runtime_s")
    return {"train_device": str(trainer.args.device), "param_device": str(param.device),
            "mixed_precision": str(trainer.accelerator.mixed_precision), "steps": steps,
            "s_per_step": runtime / steps if runtime and steps else None,
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
            "loss_finite": bool(losses) and all(math.isfinite(x) for x in losses)}


def _weights_changed(base_dir: str, export_dir: str) -> bool:
    """True when any tensor shared by the two checkpoints differs (name sets can differ: tied embeddings)."""
    import torch
    from safetensors.torch import load_file

    def tensors(d: str) -> dict:
        files = sorted(Path(d).rglob("*.safetensors"))
        out = {}
        for f in files:
            for k, v in load_file(str(f)).items():
                out[k.split("model.", 1)[-1]] = v.float()
        return out

    a, b = tensors(base_dir), tensors(export_dir)
    shared = [k for k in a if k in b and a[k].shape == b[k].shape]
    if not shared:
        raise RuntimeError(f"no tensor names in common between {base_dir} and {export_dir}")
    return any(not torch.equal(a[k], b[k]) for k in shared)


def _round_trip(load, score, export_dir: Path, device: str) -> dict:
    """Score on the device, re-save, reload, score again (must be bit-identical); then score on the CPU."""
    import numpy as np
    import torch

    def as_array(x):
        if isinstance(x, (tuple, list)):
            return np.concatenate([as_array(v) for v in x])
        return (x.detach().float().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)).ravel()

    first = load(export_dir, device)
    s1 = as_array(score(first))
    resaved = export_dir.parent / f"{export_dir.name}-resaved"
    first.save_pretrained(resaved)
    s2 = as_array(score(load(resaved, device)))
    cpu = as_array(score(load(export_dir, "cpu")))
    return {"reload_device": device, "n_scores": int(s1.size), "reload_bit_identical": bool(np.array_equal(s1, s2)),
            "scores_finite": bool(np.isfinite(s1).all()),
            "max_abs_diff_device_vs_cpu": float(np.max(np.abs(s1 - cpu))) if s1.size else 0.0}


def _train_export_reload(train_main, argv: list[str], base: str, export: Path, device: str, router_cls,
                         score) -> tuple[dict, dict]:
    """Train through the package's own ``main`` (exporting to ``export``), then check the export."""
    trainer, info = train_main([*argv, "--model_name_or_path", base, "--export_dir", str(export)])
    out = _trainer_facts(trainer, info)
    out["weights_changed"] = _weights_changed(base, str(export))
    out.update(_round_trip(lambda p, d: router_cls.from_pretrained(p, device=d), score, export, device))
    return out, info


def check_sufficiency(work: Path, llama: str, common: list[str], device: str) -> dict:
    from routers.sufficiency import SufficiencyRouter
    from train.sufficiency import main as train_main

    recs = sufficiency_toy()
    data = _write_jsonl(work / "suff.jsonl", recs)
    q, c = [r["question"] for r in recs[:8]], [r["context"] for r in recs[:8]]
    out, info = _train_export_reload(
        train_main, ["--train_file", data, "--output_dir", str(work / "suff_run"), "--per_device_train_batch_size", "8",
                     "--learning_rate", "5e-3", "--lora_r", "8", *common],
        llama, work / "suff_export", device, SufficiencyRouter, lambda r: r.score(q, c))
    out["distillation"] = {"lambda_rep": info["lambda_rep"], "s0": info["s0"]}
    return out


def check_retriever(work: Path, encoder: str, common: list[str], device: str) -> dict:
    from routers.retriever import RetrieverRouter
    from train.retriever import main as train_main

    recs = retriever_toy()
    data = _write_jsonl(work / "retr.jsonl", recs)
    queries = [r["query"] for r in recs]
    memory = [t for r in recs for t in r["positives"] + r["negatives"]]
    out, _ = _train_export_reload(
        train_main, ["--train_file", data, "--output_dir", str(work / "retr_run"), "--per_device_train_batch_size", "4",
                     "--learning_rate", "3e-3", "--warmup_steps", "0", "--positives_per_query", "2",
                     "--negatives_per_query", "2", "--max_seq_length", "32", *common],
        encoder, work / "retr_export", device, RetrieverRouter, lambda r: r.score(queries, memory))
    return out


def check_memagent(work: Path, llama: str, common: list[str], device: str) -> dict:
    from routers.memagent.router import MemAgentRouter
    from train.memagent import main as train_main

    providers = {n: ToyProvider(n) for n in ("Voyager", "ExpeL", "AWM")}
    files = {ph: _write_jsonl(work / f"ma_{ph}.jsonl", recs) for ph, recs in memagent_toy(providers).items()}
    goal = "Cook the egg."
    previews = [Preview(n, 0.5, f"note on {goal}", 1) for n in providers]
    traj = Trajectory(Task("t0", goal), [TrajectoryStep(0, "Kitchen.", "take egg")], True, begin_provider="Voyager")

    def score(r):
        return (r.score_begin(goal, previews, providers)[1], r.score_inject(goal, 1, "Collected Data:\n- egg"),
                r.score_end(traj, providers))

    out, _ = _train_export_reload(
        train_main, ["--begin_file", files["begin"], "--in_file", files["in"], "--end_file", files["end"],
                     "--output_dir", str(work / "ma_run"), "--per_device_train_batch_size", "2", "--learning_rate",
                     "2e-2", "--lora_target_modules", "all-linear", *common],
        llama, work / "ma_export", device, MemAgentRouter, score)
    return out


CHECKS = {"sufficiency": check_sufficiency, "retriever": check_retriever, "memagent": check_memagent}


def _verdict(r: dict, want_bf16: bool, device: str) -> list[str]:
    problems = []
    if not r.get("loss_finite"):
        problems.append("non-finite or missing training loss")
    if not str(r.get("param_device", "")).startswith(device):
        problems.append(f"trained on {r.get('param_device')} instead of {device}")
    if want_bf16 and r.get("mixed_precision") != "bf16":
        problems.append(f"mixed precision {r.get('mixed_precision')} instead of bf16")
    if not r.get("weights_changed"):
        problems.append("exported weights equal the starting weights")
    if not r.get("reload_bit_identical"):
        problems.append("reloaded export does not reproduce the device scores exactly")
    if not r.get("scores_finite"):
        problems.append("non-finite scores")
    if (r.get("max_abs_diff_device_vs_cpu") or 0.0) > CROSS_DEVICE_TOL:
        problems.append(f"device vs CPU scores differ by {r['max_abs_diff_device_vs_cpu']:.2e} > {CROSS_DEVICE_TOL}")
    return problems


def machine_facts() -> dict:
    import torch

    facts = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch_cuda": torch.version.cuda,
             "library_versions": library_versions(), "git_revision": git_revision()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gib=round(props.total_memory / 2**30, 1),
                     gpu_count=torch.cuda.device_count(), bf16_supported=torch.cuda.is_bf16_supported())
    return facts


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memroute check-device", description=__doc__.split("\n\n")[0])
    p.add_argument("--output_dir", default="results/device_check")
    p.add_argument("--routers", nargs="+", default=list(CHECKS), choices=list(CHECKS))
    p.add_argument("--tokenizer", default=None,
                   help="causal-LM tokenizer folder or HF id (default: the embedded SmolLM2 tokenizer)")
    p.add_argument("--encoder_tokenizer", default=None,
                   help="encoder tokenizer folder or HF id (default: the embedded MiniLM tokenizer)")
    p.add_argument("--steps", type=int, default=4, help="training steps per router")
    p.add_argument("--bf16", choices=["auto", "true", "false"], default="auto")
    return p


def main(argv=None) -> dict:
    setup_cli_logging()  # a CLI entry point (memroute check-device, python -m eval.device_check)
    args = make_parser().parse_args(argv)
    import torch

    device = default_device()
    want_bf16 = bf16_supported() if args.bf16 == "auto" else args.bf16 == "true"
    tok = args.tokenizer or resolve_causal_lm("HuggingFaceTB/SmolLM2-135M-Instruct")
    enc_tok = args.encoder_tokenizer or str(minilm_path())
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"device": device, "bf16": want_bf16, "machine": machine_facts(), "routers": {}}
    common = ["--max_steps", str(args.steps), "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
              "--disable_tqdm", "true", "--dataloader_num_workers", "0", "--seed", "0",
              "--bf16", "true" if want_bf16 else "false", "--use_cpu", "true" if device == "cpu" else "false"]
    with tempfile.TemporaryDirectory(prefix="memroute-device-check-") as tmp:
        work = Path(tmp)
        llama = tiny_llama(tok, work / "tiny-llama") if {"sufficiency", "memagent"} & set(args.routers) else None
        encoder = tiny_encoder(enc_tok, work / "tiny-encoder") if "retriever" in args.routers else None
        for name in args.routers:
            t0 = time.perf_counter()
            try:
                model = encoder if name == "retriever" else llama
                result = CHECKS[name](work, model, common, device)
                result["problems"] = _verdict(result, want_bf16, device)
            except Exception as exc:  # report every router, even when one breaks
                result = {"problems": [f"{type(exc).__name__}: {exc}"], "traceback": traceback.format_exc()}
            result["wall_s"] = round(time.perf_counter() - t0, 2)
            result["ok"] = not result["problems"]
            report["routers"][name] = result
            if device == "cuda":
                result["peak_gpu_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    report["ok"] = all(r["ok"] for r in report["routers"].values())
    write_json(out_dir / "device_check.json", report)
    print(f"{'router':<12} {'ok':<4} {'device':<8} {'precision':<9} {'steps':>5} {'s/step':>7} {'loss':>15} "
          f"{'reload exact':>12} {'|dev-cpu|':>9}")
    for name, r in report["routers"].items():
        loss = f"{r.get('loss_first', float('nan')):.3f}->{r.get('loss_last', float('nan')):.3f}" if r.get("loss_first") else "-"
        sps = f"{r['s_per_step']:.3f}" if r.get("s_per_step") else "-"
        print(f"{name:<12} {str(r['ok']):<4} {str(r.get('param_device', '-')):<8} {str(r.get('mixed_precision', '-')):<9} "
              f"{r.get('steps', 0):>5} {sps:>7} {loss:>15} {str(r.get('reload_bit_identical', '-')):>12} "
              f"{r.get('max_abs_diff_device_vs_cpu', float('nan')):>9.1e}")
        for p in r["problems"]:
            print(f"  problem: {p}")
    (log.info if report["ok"] else log.warning)("device check %s on %s; report: %s",
                                                "passed" if report["ok"] else "FAILED", device,
                                                out_dir / "device_check.json")
    return report


def cli_main(argv=None) -> int:
    """Exit status 0 when every router passed, 1 otherwise (for scripts and CI on GPU nodes)."""
    from routers.models import offline_by_default

    offline_by_default()  # an entry point: set here, never on import (the routers load after it)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return 0 if main(argv)["ok"] else 1


if __name__ == "__main__":
    sys.exit(cli_main())
