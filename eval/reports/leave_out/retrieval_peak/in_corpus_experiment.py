"""Per-query (peak) vs min-max 0.5 fusion on each left-out encoder's *training* corpora, in-distribution for it (issue 21).

Each encoder trained without C (results/leave_out_retriever/C/router) scores the held-out questions of the other
corpora (it was trained on their training splits), once per fusion, through `memroute eval retrieval`.
    python eval/reports/leave_out/retrieval_peak/in_corpus_experiment.py   # writes results/in_corpus_peak/in_corpus_peak.json
"""
import json, yaml
from eval.retrieval import main as eval_main
out = {}
for router in ("taubench", "textworld", "locomo", "hotpotqa"):
    for other in ("hotpotqa", "locomo", "taubench", "textworld"):
        if other == router:
            continue
        src = f"results/leave_out_retriever/{router}/dense_weight/{other}/resolved_config.yaml"
        try:
            cfg = yaml.safe_load(open(src))
        except FileNotFoundError:
            src = None
        if src is None:
            cfg = yaml.safe_load(open(f"results/leave_out_retriever/{other}/without/resolved_config.yaml"))
        argv = ["--corpus", other, "--eval_episodes", *cfg["eval_episodes"], "--trained_encoder", f"results/leave_out_retriever/{router}/router",
                "--systems", "hybrid_trained"]
        if cfg.get("corpus_path"):
            argv += ["--corpus_path", cfg["corpus_path"]]
        r = {}
        for fusion in ("minmax", "peak"):
            m = eval_main(argv + ["--output_dir", f"results/in_corpus_peak/{router}/{other}_{fusion}", "--fusion", fusion])["systems"]["hybrid_trained"]
            r[fusion] = {"recall@5": m["recall@5"], "mrr@10": m["mrr@10"], "n": m["n_queries"]}
        out[f"{router}->{other}"] = r
        print(router, other, r, flush=True)
json.dump(out, open("results/in_corpus_peak/in_corpus_peak.json", "w"), indent=1)
