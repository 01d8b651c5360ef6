"""Compose(E): the sectioned answer prompt of MESA appendix C.3, and evidence-token counting.

Only selected, non-empty sections appear, in the canonical order; the whole prompt is one user message. The
evidence tokens of a subset are the tokens of its section bodies (counted with the answer model's tokenizer,
or whitespace words when there is none), so a subset's cost is the sum of its members' costs.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from routers.mesa.sweep_format import STRUCTURES, subset_key

SECTION_TITLES = {
    "summary": "State Memory (compressed)",
    "temporal": "Temporal Turns (referenced by step/turn or neighborhood)",
    "graph": "Knowledge Graph (HippoRAG triples + neighbors)",
    "vector": "Retrieved Turns (embedding similarity)",
    "raw": "Chunked Context (BM25 over trajectory)",
}
INSTRUCTIONS = "Provide a direct and concise answer."


def task_line(source: str, speakers: Iterable[str] = ()) -> str:
    if source == "locomo":
        names = " and ".join(s for s in speakers if s) or "two people"
        return f"Answer a question about a long conversation between {names}, using the memory below."
    if source == "textworld":
        return "Answer a question about an agent's trajectory in a text-based cooking game, using the memory below."
    return "Answer a question about the interaction history, using the memory below."


def compose_prompt(task: str, question: str, evidence: Mapping[str, str], names: Iterable[str]) -> str:
    """The C.3 prompt for the structures ``names`` (their ``evidence`` texts; empty sections omitted)."""
    chosen = set(subset_key(names).split("+"))
    parts = [f"# Task\n{task}"]
    for name in STRUCTURES:
        body = (evidence.get(name) or "").strip()
        if name in chosen and body:
            parts.append(f"# {SECTION_TITLES[name]}\n{body}")
    parts.append(f"## Questions\nQuestion: {question}")
    parts.append(f"## Instructions\n{INSTRUCTIONS}\nAnswer:")
    return "\n\n".join(parts)


def fit_sections(evidence: Mapping[str, str], names: Iterable[str], budget: int,
                 count: Callable[[str], int]) -> dict[str, str]:
    """Cut the selected sections so their tokens total at most ``budget`` (a small reader's input window):
    every section keeps a share of the budget proportional to its size, its head kept line by line."""
    names = [n for n in STRUCTURES if n in set(names) and (evidence.get(n) or "").strip()]
    sizes = {n: count(evidence[n]) for n in names}
    total = sum(sizes.values())
    if total <= budget:
        return {n: evidence[n] for n in names}
    out = {}
    for n in names:
        room = max(int(budget * sizes[n] / total), 1)
        kept, used = [], 0
        for line in evidence[n].splitlines():
            c = count(line) + 1
            if used + c > room:
                break
            kept.append(line)
            used += c
        out[n] = "\n".join(kept) if kept else " ".join(evidence[n].split()[: room])
    return out


class TokenCounter:
    """Evidence tokens with a tokenizer (anything with ``encode``, or a model name/path to load one), or
    whitespace words when ``spec`` is None / "whitespace" / "none"."""

    def __init__(self, spec=None):
        self.name = "whitespace"
        self._tok = None
        if spec is not None and not (isinstance(spec, str) and spec.lower() in ("whitespace", "none", "")):
            if isinstance(spec, str):
                from transformers import AutoTokenizer

                from routers.models import resolve_causal_lm

                self._tok = AutoTokenizer.from_pretrained(resolve_causal_lm(spec))
                self.name = spec
            else:
                self._tok = spec
                self.name = getattr(spec, "name_or_path", type(spec).__name__)

    def __call__(self, text: str) -> int:
        if not text:
            return 0
        if self._tok is None:
            return len(text.split())
        return len(self._tok.encode(text, add_special_tokens=False))
