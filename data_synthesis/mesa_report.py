"""``structures_report.json`` of a MESA sweep: build time per structure, failures, tokens and evidence recall
per structure and subset (recomputed from ``sweep.jsonl`` on disk, so right after any number of resumes) and
the build quality of the summary (extractive on every episode; optionally extractive vs LLM on a few)."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from routers.io import atomic_write_json
from routers.logs import get_logger
from routers.mesa.sweep_format import ALL_SUBSET_KEYS, STRUCTURES, read_sweep

logger = get_logger(__name__)


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(float(np.mean(xs)), 4) if xs else None


def subset_table(records: list[dict]) -> dict:
    """subset key -> mean tokens, mean evidence_recall, mean f1 (over records with a reader score) and n_f1."""
    out = {}
    for key in ALL_SUBSET_KEYS:
        rows = [r["subsets"][key] for r in records]
        f1 = [x["f1"] for x in rows if x["f1"] is not None]
        out[key] = {"tokens": _mean(x["tokens"] for x in rows), "evidence_recall": _mean(x["evidence_recall"] for x in rows),
                    "f1": _mean(f1), "n_f1": len(f1)}
    return out


def summary_quality_report(episodes, memories: dict) -> dict:
    from routers.mesa.summary import summary_quality

    rows = [summary_quality(ep, memories[ep.episode_id].states["summary"]) for ep in episodes
            if ep.episode_id in memories and memories[ep.episode_id].ok("summary")]
    return {"builder": "extractive", "episodes": len(rows),
            "share_evidence_steps_surviving": _mean(r["share_surviving"] for r in rows),
            "mean_key_word_survival": _mean(r["mean_survival"] for r in rows),
            "mean_summary_words": _mean(r["summary_words"] for r in rows)}


def compare_summaries(cfg, episodes) -> dict:
    """Extractive vs LLM summary on the first ``summary_compare_segments`` segments of a few episodes."""
    from routers.backends import make_backend
    from routers.mesa.summary import SummaryMemory, segments, summary_quality

    backend = make_backend(cfg.builder_model or "HuggingFaceTB/SmolLM2-135M-Instruct", batch_size=4,
                           max_input_tokens=4096)
    rows = []
    for ep in [e for e in episodes if e.qa][: cfg.summary_compare_episodes]:
        segs = segments(ep)[: cfg.summary_compare_segments]
        covered = {s.index for seg in segs for s in seg}
        row = {"episode_id": ep.episode_id, "segments": len(segs)}
        for builder in ("extractive", "llm"):
            t0 = time.perf_counter()
            state = SummaryMemory(builder=builder, backend=backend).build(ep, max_segments=len(segs))
            q = summary_quality(ep, state, covered)
            row[builder] = {**q, "build_s": round(time.perf_counter() - t0, 2), "example": state["text"][:400]}
        rows.append(row)
    out = {"model": backend.name, "rows": rows}
    for builder in ("extractive", "llm"):
        out[f"{builder}_share_surviving"] = _mean(r[builder]["share_surviving"] for r in rows)
    return out


def write_report(cfg, memories: dict, run: dict) -> dict:
    out = Path(cfg.output_dir)
    records = read_sweep(out / "sweep.jsonl") if (out / "sweep.jsonl").exists() and (out / "sweep.jsonl").stat().st_size else []
    table = subset_table(records)
    eps = [m.episode for m in memories.values()]
    structures = {}
    for name in STRUCTURES:
        times = [m.build_s[name] for m in memories.values() if name in m.build_s]
        structures[name] = {
            "build_s_mean": _mean(times), "build_s_max": round(max(times), 4) if times else None,
            "build_s_total": round(float(sum(times)), 3),
            "built_this_run": sum(not m.cached.get(name, True) for m in memories.values()),
            "failures": [{"episode_id": m.episode.episode_id, "error": m.failures[name]}
                         for m in memories.values() if name in m.failures],
            "ok_share_questions": _mean(float(r["structures"][name]["ok"]) for r in records),
            "tokens_mean": _mean(r["structures"][name]["tokens"] for r in records),
            "tokens_max": max((r["structures"][name]["tokens"] for r in records), default=None),
            "evidence_recall_mean": table[name]["evidence_recall"], "f1_mean": table[name]["f1"],
        }
    allkey = "+".join(STRUCTURES)
    best_single = max(STRUCTURES, key=lambda n: table[n]["evidence_recall"] or 0.0) if records else None
    report = {
        "corpus": cfg.corpus, "episodes": len(memories), "steps": int(sum(len(e.steps) for e in eps)),
        "questions": len(records), "questions_with_f1": sum(r["subsets"][allkey]["f1"] is not None for r in records),
        "structures": structures, "all_five": table[allkey], "best_single_by_recall": best_single,
        "subsets": table, "summary_quality": summary_quality_report(eps, memories), "run": run, "config": asdict(cfg),
    }
    if cfg.summary_compare_episodes:
        report["summary_llm_vs_extractive"] = compare_summaries(cfg, eps)
    atomic_write_json(out / "structures_report.json", report)
    return report
