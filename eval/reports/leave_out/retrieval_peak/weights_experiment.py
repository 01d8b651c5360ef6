"""Is the per-query fusion more than a lower fixed weight? (issue 21)

For each left-out corpus C, the encoder trained without C (results/leave_out_retriever/C/router) scores C's held-out
questions; per question, the weight --fusion peak gives the dense half, and Recall@5 at that weight vs at fixed
min-max weights 0.2 .. 0.5 and at the fixed weight equal to the corpus's mean per-query weight. (The fixed sweep
reads C's labels: it is an analysis, never a choice.)
    python eval/reports/leave_out/retrieval_peak/weights_experiment.py hotpotqa locomo taubench textworld   # weights.json here
"""
import json
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from data_synthesis.corpora import load_corpus
from eval.retrieval import rank_by_scores, recall_at_k
from routers.memory.retrieval import HybridRetriever, mix_scores, peak_dense_weight
from routers.models import load_encoder

FIXED = (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)
out = {}
for c in sys.argv[1:]:
    t0 = time.time()
    cfg = yaml.safe_load(open(f"results/leave_out_retriever/{c}/without/resolved_config.yaml"))
    eps = [e for e in load_corpus(cfg["corpus"], cfg["corpus_path"]) if e.episode_id in set(cfg["eval_episodes"]) and e.qa]
    r = HybridRetriever(encoder=load_encoder(cfg["trained_encoder"]), dense_weight=0.5)
    scored = []
    for ep in eps:
        ids = [s.step_id for s in ep.steps]
        for qa, qe in zip(ep.qa, r.encode_queries([qa.question for qa in ep.qa])):
            _, lex, dense = r.scores(qa.question, ep, query_embedding=qe)
            scored.append((lex, dense, ids, set(qa.evidence)))
    weights = [peak_dense_weight(lex, dense) for lex, dense, _, _ in scored]
    mean_w = round(float(np.mean(weights)), 2)

    def recall(fusion, w):
        return round(float(np.mean([recall_at_k(rank_by_scores(mix_scores(lex, dense, w, fusion), ids), ev, 5)
                                    for lex, dense, ids, ev in scored])), 4)

    out[c] = {"n": len(scored), "peak_weight_mean": mean_w, "peak_weight_sd": round(float(np.std(weights)), 3),
              "peak": recall("peak", 0.5), "fixed": {str(w): recall("minmax", w) for w in FIXED},
              "fixed_at_mean_peak_weight": recall("minmax", mean_w), "seconds": round(time.time() - t0)}
    print(c, json.dumps(out[c]), flush=True)
(Path(__file__).parent / "weights.json").write_text(json.dumps(out, indent=1) + "\n")
