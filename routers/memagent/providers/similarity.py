"""Similarity-retrieval providers (MemAgent Table 15): the indexable unit is a past task's query, so a new
task retrieves what was written about the most similar past tasks. Voyager, DILU, Generative, Cheatsheet."""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from routers.memagent.protocol import MemoryItem, Trajectory
from routers.memagent.providers.base import BaseProvider
from routers.memagent.providers.state import ProviderError
from routers.memagent.providers.text_limits import limit_sentences, render_trajectory


class Voyager(BaseProvider):
    """Voyager (Wang et al., 2024) as MemAgent runs it (Tables 6, 7, 11): a summary of every trajectory
    (all outcomes), stored with the embedding of its task; pure semantic search over task similarity, k = 1;
    the summary has at most 6 sentences and is written by hierarchical distillation.

    The paper names the distillation but not its levels; here a trajectory longer than ``chunk_steps``
    is first summarized chunk by chunk into notes, and the notes are distilled into the final summary
    (one LLM call when the trajectory is short). ``word_limit`` = 150 is a safety cap that is not in the
    paper (a small model may write one endless sentence)."""

    name, family, gate, k = "voyager", "similarity", "all", 1
    max_sentences = 6
    word_limit = 150
    max_new_tokens = 220
    chunk_steps = 12
    reference = "Wang et al., 2024 (Voyager)"
    storage_description = ("Generates trajectory summaries from all outcomes, stored as JSON with embeddings.")
    retrieval_description = "Semantic search for the most similar historical task; returns its summary."

    def _write(self, trajectory: Trajectory, items: tuple[MemoryItem, ...]) -> list[MemoryItem]:
        steps = trajectory.steps
        source = render_trajectory(trajectory, self.max_prompt_words)
        if len(steps) > self.chunk_steps:
            notes = []
            for start in range(0, len(steps), self.chunk_steps):
                part = Trajectory(task=trajectory.task, steps=steps[start:start + self.chunk_steps],
                                  success=trajectory.success)
                notes.append(self._ask(
                    "Summarize this part of an agent's attempt in at most 3 sentences: what it did and what it found.",
                    render_trajectory(part, self.max_prompt_words), 120))
            source = (f"Task: {trajectory.task.goal}\nOutcome: {'success' if trajectory.success else 'failure'}\n"
                      + "\n".join(f"Part {i + 1}: {n}" for i, n in enumerate(notes) if n))
        summary = self._ask(
            "You distill an agent's trajectory into a reusable memory. Write at most 6 sentences: the approach, "
            "the key actions and findings, and why it succeeded or failed. Plain sentences, no lists.", source)
        summary, dropped = limit_sentences(summary, self.max_sentences)
        if dropped:
            self._pending["truncated"] += 1
            self._pending["sentences_dropped"] += dropped
        if not summary:
            return list(items)
        outcome = "success" if trajectory.success else "failure"
        text = self._limit(f"Similar task: {trajectory.task.goal}\nOutcome: {outcome}\nSummary: {summary}")
        return [*items, self._new_item(trajectory, trajectory.task.goal, text, summary=summary)]


class DILU(BaseProvider):
    """DiLu (Wen et al., 2024) as MemAgent runs it: query embedding -> trajectory summary, from successes and
    failures; pure semantic search on query similarity, k = 1; an ultra-concise step format under 150 words.
    As in DiLu's reflection module, a failed trajectory's memory ends with a correction."""

    name, family, gate, k = "dilu", "similarity", "all", 1
    word_limit = 150
    max_new_tokens = 220
    reference = "Wen et al., 2024 (DiLu)"
    storage_description = "Stores query embeddings and trajectory summaries from both successes and failures."
    retrieval_description = "Semantic search on query similarity; returns the most similar query's step summary."

    def _write(self, trajectory, items):
        fix = (" The task failed: end with one line 'Correction: ...' saying what to do differently."
               if not trajectory.success else "")
        steps = self._ask(
            "Write the key steps of this trajectory as numbered lines 'N. action -> result', ultra-concise, "
            f"at most 150 words in total.{fix}", self._traj_prompt(trajectory))
        if not steps:
            return list(items)
        outcome = "success" if trajectory.success else "failure"
        text = self._limit(f"Query: {trajectory.task.goal}\nOutcome: {outcome}\n{steps}")
        return [*items, self._new_item(trajectory, trajectory.task.goal, text)]


class Generative(BaseProvider):
    """Generative Agents memory (Park et al., 2023) as MemAgent runs it: a scored pool of task queries +
    trajectory summaries; retrieval takes the 3 most similar memories (dense) and an LLM importance score
    picks one (k = 3 -> 1); output under 150 words. The paper's Table 11 row for its gate is not in the
    text we have; Park et al.'s memory stream records every experience, so the gate is 'all'. The
    importance prompt follows Park et al.'s 1-10 poignancy rating, asked relative to the new task."""

    name, family, gate, k = "generative", "similarity", "all", 1
    n_candidates = 3
    word_limit = 150
    llm_rerank = True
    max_new_tokens = 220
    reference = "Park et al., 2023 (Generative Agents)"
    storage_description = "Stores task queries with trajectory summaries in a scored memory pool (all outcomes)."
    retrieval_description = ("Vector retrieval of 3 candidates, then LLM importance scoring selects the single most "
                             "useful memory (<150 words).")

    def _write(self, trajectory, items):
        summary = self._ask(
            "Summarize this agent trajectory as a memory for future tasks in under 150 words: what was asked, "
            "what the agent did, what it learned, and the outcome.", self._traj_prompt(trajectory))
        if not summary:
            return list(items)
        outcome = "success" if trajectory.success else "failure"
        text = self._limit(f"Past task: {trajectory.task.goal}\nOutcome: {outcome}\n{summary}")
        return [*items, self._new_item(trajectory, trajectory.task.goal, text)]

    def _select(self, goal: str, scores: np.ndarray, items: Sequence[MemoryItem]) -> list[int]:
        from routers.memory.index import top_k

        cands = [int(i) for i in top_k(scores, self.n_candidates)[0]]
        if len(cands) <= 1:
            return cands
        if self.llm is None:
            raise ProviderError(f"{self.name}: retrieval reranks with an LLM (pass llm=...)")
        listing = "\n\n".join(f"[{j + 1}] {items[i].text}" for j, i in enumerate(cands))
        prompt = (f"New task: {goal}\n\nMemories:\n{listing}\n\nRate how important each memory is for solving the "
                  f"new task on a scale of 1 to 10. Answer with one line per memory: '<number>: <rating>'.")
        out = self.llm.generate([[{"role": "system", "content": "You rate the importance of memories for a task."},
                                  {"role": "user", "content": prompt}]], 32)
        rating = parse_ratings(out[0] if out else "", len(cands))
        best = max(range(len(cands)), key=lambda j: (rating[j], -j))  # ties: the more similar one
        return [cands[best]]


def parse_ratings(text: str, n: int) -> list[float]:
    """'1: 7' / '[2] 3' lines -> ratings by candidate (missing = 0); a bare list of n numbers also works."""
    ratings = [0.0] * n
    pairs = re.findall(r"\[?(\d+)\]?\s*[:=)\-]\s*(\d+(?:\.\d+)?)", text or "")
    if pairs:
        for idx, val in pairs:
            j = int(idx) - 1
            if 0 <= j < n:
                ratings[j] = float(val)
        return ratings
    nums = re.findall(r"\d+(?:\.\d+)?", text or "")
    if len(nums) == n:
        return [float(x) for x in nums]
    return ratings


class Cheatsheet(BaseProvider):
    """Dynamic Cheatsheet (Suzgun et al., 2025), retrieval-and-synthesis variant (DC-RS). MemAgent's text
    gives no parameters for it beyond its family (similarity retrieval, keyed by the query), so they follow
    DC-RS: after each task (DC has no correctness signal, so every outcome is kept) the LLM curates a
    cheatsheet entry -- reusable strategies, solution sketches or snippets, pitfalls -- keyed by the task
    query; a new task retrieves the entries of the k = 3 most similar past queries (dense), each at most
    80 words, presented as one cheatsheet."""

    name, family, gate, k = "cheatsheet", "similarity", "all", 3
    word_limit = 80
    max_new_tokens = 140
    reference = "Suzgun et al., 2025 (Dynamic Cheatsheet, DC-RS)"
    storage_description = ("Curates a cheatsheet entry (reusable strategies, solution sketches, pitfalls) from every "
                           "trajectory, keyed by the task query.")
    retrieval_description = "Retrieves the entries of the 3 most similar past queries as a compact cheatsheet."

    def _write(self, trajectory, items):
        entry = self._ask(
            "You maintain a cheatsheet of reusable problem-solving knowledge. From this trajectory write one "
            "cheatsheet entry of at most 80 words: the reusable strategy or solution sketch and any pitfall to "
            "avoid. No task-specific chatter.", self._traj_prompt(trajectory))
        entry = self._limit(entry)
        if not entry:
            return list(items)
        return [*items, self._new_item(trajectory, trajectory.task.goal, entry)]

    def _render(self, goal, items):
        return "Cheatsheet:\n" + "\n".join(f"- ({it.meta.get('goal', '')}) {it.text}" for it in items)
