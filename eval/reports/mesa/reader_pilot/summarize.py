"""f1_by_question.txt from the reader pilots' sweeps (configs/mesa/README.md "Which reader?").

    python eval/reports/mesa/reader_pilot/summarize.py qwen15=outputs/mesa/reader_pilot_qwen15 \
        qwen05=outputs/mesa/reader_pilot_qwen05 smollm2=outputs/mesa/reader_pilot_smollm2 > eval/reports/mesa/reader_pilot/f1_by_question.txt
Per question with a reader answer: F1 with all five structures, each single structure, the best subset (and on how
many of the 31 it is reached), the mean over the 31 subsets and how many score above 0.
"""
import json
import sys
from pathlib import Path

SINGLES = ("summary", "temporal", "graph", "vector", "raw")
for arg in sys.argv[1:]:
    name, _, folder = arg.partition("=")
    rows = [json.loads(line) for line in (Path(folder) / "sweep.jsonl").open()]
    rows = [r for r in rows if any(s.get("f1") is not None for s in r["subsets"].values())]
    print(f"## reader {name}: {len(rows)} questions")
    for r in rows:
        f1 = {k: v["f1"] for k, v in r["subsets"].items() if v.get("f1") is not None}
        best = max(f1.values())
        print(f"{r['id']} gold={r['gold_answer']!r} ev={r['evidence_steps']} | all five {f1['+'.join(SINGLES)]} | singles "
              + " ".join(f"{s}={f1[s]}" for s in SINGLES)
              + f" | best {best:.2f} on {sum(v == best for v in f1.values())}/{len(f1)} | mean {sum(f1.values()) / len(f1):.3f}"
              + f" | nonzero {sum(v > 0 for v in f1.values())}/{len(f1)}")
