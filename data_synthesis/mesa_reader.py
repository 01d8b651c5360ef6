"""The reader of the MESA sweep: the answer model's answer for each (question, subset), cached on disk.

31 generations per question is the expensive part of a sweep on a CPU, so answers are cached in
``reader_cache.jsonl`` keyed by question id, subset and a hash of the exact prompt: a resumed or extended run
reuses them, a changed prompt (other evidence, other budget) is answered again, and within a question
identical prompts (e.g. two subsets that differ only by a structure that failed to build) are answered once.
The evidence is cut to ``max_evidence_tokens`` (proportionally per section, :func:`routers.mesa.compose.fit_sections`)
so a small model's window always keeps the question; the record's ``tokens`` stay the uncut cost.
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Callable, Mapping

from routers.io import ResumableJsonlWriter, read_jsonl
from routers.logs import get_logger
from routers.mesa.compose import compose_prompt, fit_sections
from routers.mesa.sweep_format import parse_subset

logger = get_logger(__name__)
CACHE_FILE = "reader_cache.jsonl"


def reader_selection(qa_ids: list[str], n: int | None, seed: int = 0) -> set[str]:
    """The questions the reader scores: the first ``n`` ids in a seeded hash order (so a larger ``n`` keeps
    every question of a smaller one, and the choice spreads over episodes). ``None`` = all."""
    if n is None:
        return set(qa_ids)
    order = sorted(qa_ids, key=lambda q: hashlib.sha256(f"{seed}:{q}".encode()).hexdigest())
    return set(order[:n])


def clean_answer(text: str) -> str:
    """The first non-empty line of a reply, without an ``Answer:`` prefix or brackets."""
    for line in str(text).splitlines():
        line = re.sub(r"^\s*(answer\s*:)\s*", "", line.strip(), flags=re.I).strip(" []")
        if line:
            return line
    return ""


class CachedReader:
    """Answers prompts with ``backend`` (an :class:`routers.backends.LLMBackend`), through the on-disk cache."""

    def __init__(self, backend, output_dir: str | Path, count: Callable[[str], int], max_evidence_tokens: int = 1536,
                 max_new_tokens: int = 24):
        self.backend = backend
        self.count = count
        self.max_evidence_tokens = max_evidence_tokens
        self.max_new_tokens = max_new_tokens
        path = Path(output_dir) / CACHE_FILE
        self.cache: dict[str, str] = {}
        if path.exists():
            from routers.io import repair_truncated_tail

            repair_truncated_tail(path)
            for rec in read_jsonl(path, required=("key", "answer")):
                self.cache[rec["key"]] = rec["answer"]
        self.writer = ResumableJsonlWriter(path, key="key", on_duplicate="skip")
        self.generated = 0
        self.cache_hits = 0
        self.truncated = 0
        self.seconds = 0.0

    def close(self) -> None:
        self.writer.close()

    def prompts(self, task: str, question: str, evidence: Mapping[str, str], subsets: list[str]) -> dict[str, str]:
        out = {}
        for key in subsets:
            names = parse_subset(key)
            fitted = fit_sections(evidence, names, self.max_evidence_tokens, self.count)
            if sum(self.count(evidence.get(n) or "") for n in names) > self.max_evidence_tokens:
                self.truncated += 1
            out[key] = compose_prompt(task, question, fitted, names)
        return out

    def answer(self, qa_id: str, prompts: Mapping[str, str]) -> dict[str, str]:
        """subset key -> cleaned answer, for the given prompts of one question."""
        keys = {s: f"{qa_id}|{s}|{hashlib.sha256(p.encode('utf-8')).hexdigest()[:16]}" for s, p in prompts.items()}
        todo: dict[str, list[str]] = {}  # prompt -> subsets still to answer
        for s, k in keys.items():
            if k in self.cache:
                self.cache_hits += 1
            else:
                todo.setdefault(prompts[s], []).append(s)
        if todo:
            uniq = sorted(todo, key=len)  # similar lengths batch together (less padding)
            t0 = time.perf_counter()
            replies = self.backend.generate([[{"role": "user", "content": p}] for p in uniq],
                                            max_new_tokens=self.max_new_tokens)
            self.seconds += time.perf_counter() - t0
            self.generated += len(uniq)
            for p, reply in zip(uniq, replies):
                for s in todo[p]:
                    ans = clean_answer(reply)
                    self.cache[keys[s]] = ans
                    self.writer.write({"key": keys[s], "id": qa_id, "subset": s, "answer": ans, "raw": reply})
        return {s: self.cache[k] for s, k in keys.items()}
