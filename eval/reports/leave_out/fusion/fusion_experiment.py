"""Label-free fusions of BM25 and the dense score on the leave-out held-out questions (issue 21).

For each left-out corpus C, the encoder trained without C (results/leave_out_retriever/C/router, from
`memroute eval retrieval --leave_out C ...`, configs/retriever/README.md) and the base MiniLM score C's held-out
questions (the same episodes as that run's resolved_config.yaml); Recall@5 under min-max mixing at 0.5 (the
hybrid's default), z-score sum, reciprocal-rank fusion (k = 60, 10), BM25 alone and dense alone.
    python eval/reports/leave_out/fusion/fusion_experiment.py taubench textworld   # writes fusion.json here
"""
import json, sys, time, yaml
import numpy as np
from data_synthesis.corpora import load_corpus
from routers.memory.retrieval import HybridRetriever, _minmax
from routers.models import load_encoder
from eval.retrieval import rank_by_scores, recall_at_k

def z(x):
    s = x.std()
    return np.zeros_like(x) if s < 1e-12 else (x - x.mean()) / s

def rrf(x, k=60):
    order = np.lexsort((np.arange(len(x)), -x)); r = np.empty(len(x)); r[order] = np.arange(1, len(x)+1)
    return 1.0 / (k + r)

FUSIONS = {
  "minmax0.5": lambda l, d: 0.5*_minmax(l)+0.5*_minmax(d),
  "z": lambda l, d: z(l)+z(d),
  "rrf60": lambda l, d: rrf(l)+rrf(d),
  "rrf10": lambda l, d: rrf(l,10)+rrf(d,10),
  "bm25": lambda l, d: l, "dense": lambda l, d: d,
}
out = {}
for c in sys.argv[1:]:
    cfgp = f"results/leave_out_retriever/{c}/without/resolved_config.yaml"
    cfg = yaml.safe_load(open(cfgp))
    eps = [e for e in load_corpus(cfg["corpus"], cfg["corpus_path"]) if e.episode_id in set(cfg["eval_episodes"])]
    for encname, encpath in (("without", cfg["trained_encoder"]), ("base", cfg["base_encoder"])):
        t0 = time.time(); enc = load_encoder(encpath)
        r = HybridRetriever(encoder=enc, dense_weight=0.5)
        rec = {f: [] for f in FUSIONS}
        for ep in eps:
            if not ep.qa: continue
            ids = [s.step_id for s in ep.steps]
            q = r.encode_queries([qa.question for qa in ep.qa])
            for qa, qe in zip(ep.qa, q):
                _, lex, dense = r.scores(qa.question, ep, query_embedding=qe)
                for f, fn in FUSIONS.items():
                    rec[f].append(recall_at_k(rank_by_scores(fn(lex, dense), ids), set(qa.evidence), 5))
        out[f"{c}/{encname}"] = {f: round(float(np.mean(v)), 4) for f, v in rec.items()} | {"n": len(rec["z"]), "s": round(time.time()-t0)}
        print(c, encname, out[f"{c}/{encname}"], flush=True)
json.dump(out, open(__file__.rsplit("/", 1)[0] + "/fusion.json", "w"), indent=1)
