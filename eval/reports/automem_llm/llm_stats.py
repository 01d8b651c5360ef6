"""What the LLM proposer / diagnostician did in the AutoMem search with ``--proposer llm --backend ...``.

    python eval/reports/automem_llm/llm_stats.py [SEARCH_DIR]   # default outputs/automem_llm/search

Per seed, from ``seed*/automem_trace.json``: the origin of every evaluated candidate (``llm``: an LLM proposal
accepted; ``gradient`` / ``principle`` / ``explore`` / ``resample``: the rule proposer, which the LLM proposer falls
back to on an unparsable answer), the proposals rejected as invalid, and per round the LLM diagnostician's letter
against the rule diagnosis (``cross_source_agreement``; on disagreement the LLM's module is adopted).
Writes ``llm_stats.json`` beside this file.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def seed_stats(trace: dict) -> dict:
    evals = [e for e in trace["evaluations"] if e.get("round", 0) > 1]  # round 1: the shared random draw
    grads = trace.get("gradients") or []
    reviewed = [g for g in grads if g.get("cross_source_agreement") is not None]  # rounds with failures
    return {"origins_after_round1": dict(Counter(e.get("origin") for e in evals)),
            "rejected_invalid": trace.get("rejected_invalid"),
            "rounds_with_gradient": sum(1 for g in grads if g.get("failure_mode")),
            "llm_reviews": len(reviewed),
            "llm_agreed_with_rules": sum(1 for g in reviewed if g["cross_source_agreement"]),
            "llm_modules_adopted": dict(Counter(g.get("llm_module") for g in reviewed if g.get("llm_module"))),
            "rule_failure_modes": [g.get("failure_mode") for g in grads],
            "best_so_far": trace.get("best_so_far"), "evaluate_calls": trace.get("evaluate_calls"),
            "wall_s": trace.get("wall_s")}


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/automem_llm/search")
    out = {p.parent.name: seed_stats(json.loads(p.read_text())) for p in sorted(root.glob("seed*/automem_trace.json"))}
    (Path(__file__).parent / "llm_stats.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
