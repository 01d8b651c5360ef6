"""Summary (S): segment-wise summaries of the history, concatenated in temporal order.

The history is cut into consecutive, turn-aligned segments (a session, split into chunks of at most
``segment_steps`` steps). Two builders:

* ``extractive`` (default): per segment, the most central sentences by TF-IDF (IDF fitted on the episode):
  cosine to the segment centroid (damped for sentences under 8 content words) with an MMR redundancy penalty, ``max(min_sentences, ceil(ratio * n))``
  sentences for a segment of n steps, each kept verbatim with its step anchor and speaker. A 135M model
  summarizes poorly (it drops names and values, or loops), and this builder needs no model at all.
* ``llm``: the compress prompt of MESA appendix C.1 per segment through a :mod:`routers.backends` backend.

The access returns the whole summary (query-independent, so ``top_score`` is null). The steps it covers are
the anchors of the kept sentences (extractive) or, for the LLM builder, the steps whose key content words
survive in the summary (:func:`key_word_survival` >= 0.5), the same measure the build-quality report uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from routers.logs import get_logger
from routers.memory.retrieval import tokenize
from routers.memory.schema import Episode, Step
from routers.mesa.base import Access

logger = get_logger(__name__)
SURVIVAL_THRESHOLD = 0.5
COMPRESS_PROMPT = (
    "You are presented with a section of {kind}. Compress it into a state memory that future readers can use to "
    "answer detailed questions about what happened.\nTask: {task}\nSection:\n{section}\n\nKeep the key turns "
    "(turn id first) and copy names, numbers, dates, places and objects VERBATIM. Write one short line per key "
    "turn, like:\n[turn id] who did what (values)\n")


def segments(episode: Episode, segment_steps: int = 32) -> list[list[Step]]:
    """Consecutive turn-aligned segments: sessions, each split into chunks of at most ``segment_steps``."""
    out: list[list[Step]] = []
    for step in episode.steps:
        if out and step.session == out[-1][-1].session and len(out[-1]) < segment_steps:
            out[-1].append(step)
        else:
            out.append([step])
    return out


def split_sentences(text: str) -> list[str]:
    import re

    parts = re.split(r"(?<=[.!?])\s+|\n+", text)
    return [p.strip() for p in parts if len(tokenize(p)) >= 2]


def key_words(step: Step, idf: dict[str, float], k: int = 5) -> list[str]:
    """The ``k`` rarest content words of a step (by episode IDF; ties by first occurrence)."""
    toks = list(dict.fromkeys(t for t in tokenize(step.text) if len(t) > 2))
    return sorted(toks, key=lambda t: -idf.get(t, 0.0))[:k]


def episode_idf(episode: Episode) -> dict[str, float]:
    docs = [set(tokenize(s.text)) for s in episode.steps]
    n = max(len(docs), 1)
    df: dict[str, int] = {}
    for d in docs:
        for t in d:
            df[t] = df.get(t, 0) + 1
    return {t: math.log((n + 1) / (c + 0.5)) for t, c in df.items()}


def key_word_survival(step: Step, summary_tokens: set[str], idf: dict[str, float], k: int = 5) -> float:
    """Share of the step's key content words present in the summary (1.0 for a step with none)."""
    keys = key_words(step, idf, k)
    return 1.0 if not keys else sum(t in summary_tokens for t in keys) / len(keys)


def _segment_head(seg: list[Step], c: int) -> str:
    when = f", {seg[0].timestamp}" if seg[0].timestamp else ""
    span = seg[0].step_id if len(seg) == 1 else f"{seg[0].step_id}-{seg[-1].step_id}"
    return f"Segment {c + 1} (steps {span}{when}):"


def _task(episode: Episode) -> tuple[str, str]:
    if episode.source == "locomo":
        names = " and ".join(x for x in episode.meta.get("speakers", []) if x) or "two people"
        return "a long conversation", f"remember the conversation between {names}"
    return "an agent trajectory (actions and observations)", str(episode.meta.get("objective") or "the agent's task")


@dataclass
class SummaryMemory:
    builder: str = "extractive"  # or "llm"
    segment_steps: int = 32
    ratio: float = 0.1
    min_sentences: int = 2
    mmr_lambda: float = 0.7
    max_new_tokens: int = 160
    backend: object = None  # an LLMBackend, needed when builder == "llm"
    name: str = "summary"

    def __post_init__(self):
        if self.builder not in ("extractive", "llm"):
            raise ValueError(f"summary builder must be 'extractive' or 'llm', got {self.builder!r}")

    def fingerprint(self) -> dict:
        fp = {"builder": self.builder, "segment_steps": self.segment_steps}
        if self.builder == "extractive":
            fp.update(ratio=self.ratio, min_sentences=self.min_sentences, mmr_lambda=self.mmr_lambda)
        else:
            fp.update(model=getattr(self.backend, "name", None), max_new_tokens=self.max_new_tokens)
        return fp

    def build(self, episode: Episode, max_segments: int | None = None) -> dict:
        segs = segments(episode, self.segment_steps)[:max_segments]
        if self.builder == "llm":
            return self._build_llm(episode, segs)
        return self._build_extractive(episode, segs)

    def _build_extractive(self, episode: Episode, segs: list[list[Step]]) -> dict:
        from sklearn.feature_extraction.text import TfidfVectorizer

        sents = [(s, sent) for s in episode.steps for sent in split_sentences(s.text)]
        if not sents:
            raise ValueError("no sentence with two content words to summarize")
        vec = TfidfVectorizer(tokenizer=tokenize, lowercase=False, token_pattern=None)
        vec.fit([x for _, x in sents])
        lines, covered = [], []
        for c, seg in enumerate(segs):
            cand = list(dict.fromkeys((s.index, x) for s in seg for x in split_sentences(s.text)))
            if not cand:
                continue
            m = vec.transform([x for _, x in cand])
            centroid = np.asarray(m.mean(axis=0)).ravel()
            norm = np.linalg.norm(centroid) or 1.0
            # centrality, damped for short sentences ("Wow, that's cool!" is central but says nothing)
            length = np.array([min(1.0, len(tokenize(x)) / 8) for _, x in cand])
            central = np.asarray(m @ centroid).ravel() / norm * length
            sim = (m @ m.T).toarray()
            k = min(len(cand), max(self.min_sentences, math.ceil(self.ratio * len(seg))))
            chosen: list[int] = []
            while len(chosen) < k:
                redundancy = sim[:, chosen].max(axis=1) if chosen else np.zeros(len(cand))
                score = self.mmr_lambda * central - (1 - self.mmr_lambda) * redundancy
                score[chosen] = -np.inf
                chosen.append(int(np.argmax(score)))
            by_index = {s.index: s for s in seg}
            lines.append(_segment_head(seg, c))
            for i in sorted(chosen, key=lambda j: (cand[j][0], j)):
                step = by_index[cand[i][0]]
                who = f"{step.speaker}: " if step.speaker and step.speaker != "agent" else ""
                lines.append(f"- [{step.step_id}] {who}{cand[i][1]}")
                covered.append(step.index)
        return {"text": "\n".join(lines), "steps": sorted(set(covered)), "segments": len(segs)}

    def _build_llm(self, episode: Episode, segs: list[list[Step]]) -> dict:
        if self.backend is None:
            raise ValueError("the llm summary builder needs a backend (summary_model)")
        kind, task = _task(episode)
        convs = [[{"role": "user", "content": COMPRESS_PROMPT.format(
            kind=kind, task=task, section="\n".join(" ".join(s.render().split()) for s in seg))}] for seg in segs]
        outs = self.backend.generate(convs, max_new_tokens=self.max_new_tokens)
        text = "\n".join(f"{_segment_head(seg, c)}\n{out.strip()}" for c, (seg, out) in enumerate(zip(segs, outs)))
        idf = episode_idf(episode)
        toks = set(tokenize(text))
        steps = [s.index for seg in segs for s in seg if key_word_survival(s, toks, idf) >= SURVIVAL_THRESHOLD]
        return {"text": text, "steps": steps, "segments": len(segs)}

    def access(self, state: dict, episode: Episode, question: str) -> Access:
        return Access(state["text"], list(state["steps"]), top_score=None)


def summary_quality(episode: Episode, state: dict, step_indices: set[int] | None = None) -> dict:
    """Build quality of a summary: over the episode's gold evidence steps (restricted to ``step_indices`` when
    given, e.g. the segments an LLM summary covered), the share whose key content words survive (>= 0.5) and
    the mean survival, plus the summary's size."""
    idf = episode_idf(episode)
    toks = set(tokenize(state["text"]))
    pos = {s.step_id: s for s in episode.steps}
    gold = {pos[e].index: pos[e] for q in episode.qa for e in q.evidence if e in pos}
    if step_indices is not None:
        gold = {i: s for i, s in gold.items() if i in step_indices}
    surv = [key_word_survival(s, toks, idf) for s in gold.values()]
    return {"evidence_steps": len(surv), "share_surviving": float(np.mean([x >= SURVIVAL_THRESHOLD for x in surv]))
            if surv else None, "mean_survival": float(np.mean(surv)) if surv else None,
            "summary_words": len(state["text"].split())}
