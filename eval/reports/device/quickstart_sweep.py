"""GPU sweep for issue 16: which CPU-cheap sufficiency training config reaches held-out AUROC >= 0.75?

Runs the repository's own CLIs (train.sufficiency, eval.sufficiency) per config, several at a time on one GPU,
and writes $OUT/sweep.json incrementally (config, samples used, train seconds, AUROC/AP/ECE on the quickstart
eval (120) and the full eval (320)). Stops launching new runs after --budget seconds.
"""
import json, os, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor, as_completed

OUT = os.environ["OUT"]
D = "/tmp/data"
BUDGET = float(sys.argv[1]) if len(sys.argv) > 1 else 400
PAR = int(sys.argv[2]) if len(sys.argv) > 2 else 6
T0 = time.time()

# name: (train file, top K or None, use_lora, r, lr, epochs, seed, max_length)
Q, F, H, M = f"{D}/qs_train.jsonl", f"{D}/full_train.jsonl", f"{D}/h1300.jsonl", f"{D}/m866.jsonl"
CONFIGS = {
    "q_t4_r16_1e-3_e3_s0": (Q, 4, True, 16, 1e-3, 3, 0, 512),
    "q_t8_r16_5e-4_e3_s0": (Q, 8, True, 16, 5e-4, 3, 0, 512),
    "q_all_r16_5e-4_e3_s0": (Q, None, True, 16, 5e-4, 3, 0, 512),
    "q_t12_r16_5e-4_e3_s0": (Q, 12, True, 16, 5e-4, 3, 0, 512),
    "q_t8_r16_1e-3_e3_s0": (Q, 8, True, 16, 1e-3, 3, 0, 512),
    "q_all_r16_1e-3_e3_s0": (Q, None, True, 16, 1e-3, 3, 0, 512),
    "f_t8_r16_5e-4_e2_s0": (F, 8, True, 16, 5e-4, 2, 0, 512),
    "f_t4_r16_1e-3_e2_s0": (F, 4, True, 16, 1e-3, 2, 0, 512),
    "f_t12_r16_5e-4_e2_s0": (F, 12, True, 16, 5e-4, 2, 0, 512),
    "h_t8_r16_5e-4_e3_s0": (H, 8, True, 16, 5e-4, 3, 0, 512),
    "m_t8_r16_5e-4_e3_s0": (M, 8, True, 16, 5e-4, 3, 0, 512),
    "q_t4_r64_1e-3_e3_s0": (Q, 4, True, 64, 1e-3, 3, 0, 512),
    "q_t4_r16_2e-3_e3_s0": (Q, 4, True, 16, 2e-3, 3, 0, 512),
    "q_t4_r16_1e-3_e6_s0": (Q, 4, True, 16, 1e-3, 6, 0, 512),
    "q_t4_full_1e-4_e3_s0": (Q, 4, False, 16, 1e-4, 3, 0, 512),
    "q_t8_r64_5e-4_e3_s0": (Q, 8, True, 64, 5e-4, 3, 0, 512),
    "q_t16_r16_5e-4_e3_s0": (Q, 16, True, 16, 5e-4, 3, 0, 512),
    "q_t8_full_5e-5_e3_s0": (Q, 8, False, 16, 5e-5, 3, 0, 512),
    "f_t8_r64_5e-4_e2_s0": (F, 8, True, 64, 5e-4, 2, 0, 512),
    "q_t4_r16_1e-3_e3_s1": (Q, 4, True, 16, 1e-3, 3, 1, 512),
    "q_t4_r16_1e-3_e3_s2": (Q, 4, True, 16, 1e-3, 3, 2, 512),
    "q_t8_r16_5e-4_e3_s1": (Q, 8, True, 16, 5e-4, 3, 1, 512),
    "q_t8_r16_5e-4_e3_s2": (Q, 8, True, 16, 5e-4, 3, 2, 512),
}
results = {}
if os.environ.get("SWEEP_TEST"):
    CONFIGS = {"test_t4": (f"{D}/test_train.jsonl", 4, True, 16, 1e-3, 1, 0, 512)}


def run(name, spec, with_base):
    train, k, lora, r, lr, ep, seed, maxlen = spec
    root = f"/tmp/runs/{name}"
    os.makedirs(root, exist_ok=True)
    args = [sys.executable, "-m", "train.sufficiency", "--model_name_or_path", "HuggingFaceTB/SmolLM2-135M-Instruct",
            "--train_file", train, "--output_dir", f"{root}/train", "--export_dir", f"{root}/router",
            "--num_train_epochs", str(ep), "--per_device_train_batch_size", "8", "--learning_rate", str(lr),
            "--use_lora", str(lora).lower(), "--lora_r", str(r), "--lora_target_modules", "all-linear",
            "--lambda_rep", "0", "--max_length", str(maxlen), "--seed", str(seed), "--logging_steps", "10",
            "--save_strategy", "no", "--warmup_steps", "0.1", "--lr_scheduler_type", "cosine",
            "--train_sampling_strategy", "group_by_length", "--bf16", os.environ.get("SWEEP_BF16", "true"), "--report_to", "none"]
    if k:
        args += ["--train_top_layers", str(k)]
    rec = {"spec": dict(zip(["train", "top_k", "lora", "r", "lr", "epochs", "seed", "max_length"], spec))}
    t = time.time()
    p = subprocess.run(args, capture_output=True, text=True)
    rec["train_s"] = round(time.time() - t, 1)
    open(f"{root}/train.log", "w").write(p.stdout + p.stderr)
    if p.returncode:
        rec["error"] = (p.stdout + p.stderr)[-1500:]
        return name, rec
    for tag, data in (("qs", f"{D}/qs_eval.jsonl"), ("full", f"{D}/full_eval.jsonl")):
        ev = [sys.executable, "-m", "eval.sufficiency", "--router", f"{root}/router", "--data", data,
              "--output_dir", f"{root}/eval_{tag}", "--batch_size", "16"]
        if with_base:
            ev += ["--base_model", "HuggingFaceTB/SmolLM2-135M-Instruct"]
        p = subprocess.run(ev, capture_output=True, text=True)
        if p.returncode:
            rec[f"eval_{tag}_error"] = (p.stdout + p.stderr)[-1500:]
            continue
        m = json.load(open(f"{root}/eval_{tag}/metrics.json"))
        rec[tag] = {mn: {k2: mm.get(k2) for k2 in ("auroc", "ap", "ece", "brier")} for mn, mm in m["models"].items()}
        rec[tag]["n"] = m.get("n_samples")
    try:
        ti = json.load(open(f"{root}/train/train_summary.json"))
        rec["train_summary"] = {k2: v for k2, v in ti.items() if k2 != "log_history" and not isinstance(v, (list, dict))}
        rec["log"] = [h for h in ti.get("log_history", []) if "loss" in h][-3:]
    except Exception as e:  # noqa: BLE001
        rec["train_summary_error"] = repr(e)
    return name, rec


def dump():
    json.dump({"elapsed_s": round(time.time() - T0, 1), "results": results}, open(f"{OUT}/sweep.json", "w"), indent=1)


with ThreadPoolExecutor(PAR) as pool:
    futs, first = {}, True
    pending = list(CONFIGS.items())
    while pending or futs:
        while pending and len(futs) < PAR and time.time() - T0 < BUDGET:
            name, spec = pending.pop(0)
            futs[pool.submit(run, name, spec, first)] = name
            first = False
        if not futs:
            break
        done = next(as_completed(list(futs)))
        futs.pop(done)
        name, rec = done.result()
        results[name] = rec
        qa = rec.get("qs", {}).get("trained", {}).get("auroc")
        fa = rec.get("full", {}).get("trained", {}).get("auroc")
        print(f"{time.time() - T0:6.0f}s {name}: qs {qa} full {fa} train {rec.get('train_s')}s "
              f"{'ERR' if 'error' in rec else ''}", flush=True)
        dump()
        if time.time() - T0 > BUDGET:
            pending = []
dump()
