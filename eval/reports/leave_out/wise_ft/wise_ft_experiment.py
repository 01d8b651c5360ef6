"""Weight-space ensembles (WiSE-FT, Wortsman et al. 2022) of base MiniLM and the encoder trained without C (issue 21).

theta(alpha) = (1 - alpha) * theta_base + alpha * theta_trained_without_C, every parameter; alpha = 0 is base MiniLM,
1 the trained encoder. Scored on C's held-out questions (the leave-out run's resolved_config.yaml episodes) as dense
and as the hybrid (min-max, dense weight 0.5, the default). No label of C chooses anything: alpha is reported as a
curve; WiSE-FT's own default is 0.5.
    python eval/reports/leave_out/wise_ft/wise_ft_experiment.py taubench textworld   # writes wise_ft.json here
"""
import json
import sys
import time

import numpy as np
import torch
import yaml

from data_synthesis.corpora import load_corpus
from eval.retrieval import rank_by_scores, recall_at_k
from routers.memory.retrieval import HybridRetriever
from routers.models import load_encoder

ALPHAS = [float(a) for a in (sys.argv[sys.argv.index("--alphas") + 1:] if "--alphas" in sys.argv else
                             (0.0, 0.25, 0.5, 0.75, 1.0))]
corpora = [a for a in sys.argv[1:sys.argv.index("--alphas") if "--alphas" in sys.argv else None]]
out = {"_about": {"alphas": ALPHAS, "metric": "Recall@5 on C's held-out questions", "hybrid": "min-max, dense 0.5"}}
for c in corpora:
    cfg = yaml.safe_load(open(f"results/leave_out_retriever/{c}/without/resolved_config.yaml"))
    eps = [e for e in load_corpus(cfg["corpus"], cfg["corpus_path"]) if e.episode_id in set(cfg["eval_episodes"]) and e.qa]
    base = {k: v.detach().clone() for k, v in load_encoder(cfg["base_encoder"]).state_dict().items()}
    enc = load_encoder(cfg["trained_encoder"])
    trained = {k: v.detach().clone() for k, v in enc.state_dict().items()}
    assert base.keys() == trained.keys()
    for alpha in ALPHAS:
        t0 = time.time()
        with torch.no_grad():
            enc.load_state_dict({k: (1 - alpha) * base[k].float() + alpha * trained[k].float()
                                 if trained[k].is_floating_point() else trained[k] for k in trained})
        r = HybridRetriever(encoder=enc, dense_weight=0.5)
        dense, hybrid = [], []
        for ep in eps:
            ids = [s.step_id for s in ep.steps]
            for qa, qe in zip(ep.qa, r.encode_queries([qa.question for qa in ep.qa])):
                mixed, _, d = r.scores(qa.question, ep, query_embedding=qe)
                dense.append(recall_at_k(rank_by_scores(d, ids), set(qa.evidence), 5))
                hybrid.append(recall_at_k(rank_by_scores(mixed, ids), set(qa.evidence), 5))
        out[f"{c}/alpha={alpha:g}"] = {"dense": round(float(np.mean(dense)), 4), "hybrid": round(float(np.mean(hybrid)), 4),
                                       "n": len(dense), "s": round(time.time() - t0)}
        print(c, alpha, out[f"{c}/alpha={alpha:g}"], flush=True)
json.dump(out, open(__file__.rsplit("/", 1)[0] + "/wise_ft.json", "w"), indent=1)
