"""Convert a sessions-of-turns conversational-memory dataset (the LoCoMo layout) into Episode JSONL.

    python -m data_synthesis.examples.convert_sessions data_synthesis/data/locomo/locomo10.json out/locomo.jsonl
    memroute validate out/locomo.jsonl
    memroute synth sufficiency --corpus episodes --corpus_path out/locomo.jsonl --eval_fraction 0.2

Input: a JSON list of ``{"sample_id", "conversation": {"session_<n>": [{"dia_id", "speaker", "text"}, ...],
"session_<n>_date_time", "speaker_a", "speaker_b"}, "qa": [{"question", "answer", "evidence": [dia_id, ...],
"category"}]}``. One episode per conversation, one step per turn (step_id = the turn id), one QA per question
whose evidence names known turns. Other layouts map the same way: LongMemEval's ``haystack_sessions`` are the
sessions (turn id ``f"{session_id}:{i}"``), its turns with ``has_answer`` the evidence of the item's question.
"""

from __future__ import annotations

import json
import re
import sys

from data_synthesis.corpora import LOCOMO_CATEGORIES, normalize_locomo_evidence
from routers.io import atomic_write_text


def convert(conversations: list[dict], include_adversarial: bool = False) -> list[dict]:
    episodes = []
    for conv in conversations:
        c, eid = conv["conversation"], str(conv["sample_id"])
        sessions = sorted(int(k.split("_")[1]) for k, v in c.items() if re.fullmatch(r"session_\d+", k) and isinstance(v, list))
        steps = [{"step_id": str(t["dia_id"]), "index": 0, "speaker": t.get("speaker"), "session": str(n),
                  "timestamp": c.get(f"session_{n}_date_time"),
                  "text": f"{t.get('text', '')} [shares a photo: {t['blip_caption']}]".strip() if t.get("blip_caption")
                  else t.get("text", "")} for n in sessions for t in c[f"session_{n}"]]
        for i, s in enumerate(steps):
            s["index"] = i
        ids, qa = {s["step_id"] for s in steps}, []
        for i, q in enumerate(conv.get("qa", [])):
            category = LOCOMO_CATEGORIES.get(q.get("category"), str(q.get("category")))
            evidence = [e for e in normalize_locomo_evidence(q.get("evidence") or [])[0] if e in ids]
            if evidence and (include_adversarial or category != "adversarial"):
                qa.append({"qa_id": f"{eid}/q{i}", "question": q["question"], "evidence": evidence, "category": category,
                           "answer": str(q.get("answer", q.get("adversarial_answer", "")))})
        episodes.append({"schema_version": 1, "episode_id": eid, "source": "locomo", "steps": steps, "qa": qa,
                         "meta": {"speakers": [c.get("speaker_a"), c.get("speaker_b")]}})
    return episodes


def main(argv=None) -> int:
    src, dst = (sys.argv[1:] if argv is None else argv)[:2]
    with open(src, encoding="utf-8") as fh:
        episodes = convert(json.load(fh))
    atomic_write_text(dst, "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in episodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
