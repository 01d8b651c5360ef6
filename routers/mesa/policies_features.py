"""Selection-time signals of a :class:`~routers.mesa.selector_view.QueryView` (question, corpus, previews only).

* :func:`question_type`: temporal / who / where / why / how / which / what / yesno / other (first match);
* :func:`cues`: lexical flags of the question (``cue:temporal``, ``cue:number``, ...), ``qtype=<t>``,
  ``corpus=<c>`` and preview flags (``unavailable:<k>``, ``no_overlap:<k>``); repair rules test these;
* :func:`preview_stats`: per structure ``ok``, ``log_tokens``, ``top_score``/``has_score``, ``overlap`` (share
  of the question's content words found in the preview), the preview's word set, the steps it cites
  (``[D1:3]``, ``(T9)``) and the share of those another structure's preview cites too;
* :func:`gate_features`: the feature vector of (question, structure) used by the learned gates.
Everything is cached on the view.
"""

from __future__ import annotations

import math
import re

import numpy as np

from routers.mesa.selector_view import STRUCTURES, QueryView

WORD = re.compile(r"[a-z0-9']+")
STOP = frozenset("""a an the of to in on at for from by with and or but is are was were be been being do does did
have has had it its this that these those i you he she we they me him her us them my your his our their what when
where who whom whose why how which there here as if than then so not no yes can could would should will shall may
might must about into over after before up down out off again further once just any all both each few more most
other some such only own same too very s t don now""".split())
CUE_PATTERNS = {
    "temporal": r"\b(when|date|time|year|month|week|day|days|before|after|ago|since|until|first|last|earliest|"
                r"latest|recently|yesterday|today|during|how long|what time|january|february|march|april|may|june|"
                r"july|august|september|october|november|december|\d{4})\b",
    "step_ref": r"\b(step|turn|session|round|action)\s*#?\d+",
    "number": r"\b(\d+|how many|how much|number|count|times)\b",
    "list": r"\b(which|list|all|both|every|each|various|kinds?|types?)\b",
    "conjunction": r"\b(and|or|also|as well as)\b",
    "causal": r"\b(why|because|cause|reason|led|result)\b",
    "state": r"\b(current|currently|now|still|changed?|updated?|status|state)\b",
    "identity": r"\b(who|whom|whose|name|named)\b",
    "place": r"\b(where|place|city|country|location)\b",
    "opinion": r"\b(think|feel|like|likes|favorite|prefer|enjoy|would)\b",
}
CUE_RE = {name: re.compile(p) for name, p in CUE_PATTERNS.items()}
QTYPES = ("temporal", "who", "where", "why", "how", "which", "what", "yesno", "other")
_YESNO = re.compile(r"^\s*(is|are|was|were|did|do|does|can|could|has|have|had|will|would|should)\b")
CUE_NAMES = tuple(f"cue:{n}" for n in CUE_PATTERNS) + ("cue:entity", "cue:long")
PREVIEW_FEATURES = ("ok", "log_tokens", "top_score", "has_score", "overlap", "overlap_rank", "n_steps", "steps_shared")
GATE_FEATURES = ("bias",) + CUE_NAMES + tuple(f"qtype:{t}" for t in QTYPES) + PREVIEW_FEATURES
STEP_REF = re.compile(r"[\[(]([A-Z]\d+(?::\d+)?)[\])]")  # [D1:3], (T9), [T18]: the steps a preview cites


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def content_words(text: str) -> set[str]:
    return {w for w in words(text) if w not in STOP and len(w) > 1}


def question_type(question: str) -> str:
    q = question.lower()
    if re.match(r"^\s*(when|what (year|month|day|date|time))\b", q) or re.search(r"\bhow long\b", q):
        return "temporal"
    for t in ("who", "where", "why", "how", "which", "what"):
        if re.search(rf"\b{t}\b", q):
            return t
    if _YESNO.match(q):
        return "yesno"
    return "temporal" if CUE_RE["temporal"].search(q) else "other"


def _cached(view: QueryView, key: str, make):
    cache = view._cache
    if key not in cache:
        cache[key] = make()
    return cache[key]


def qtype(view: QueryView) -> str:
    return _cached(view, "qtype", lambda: question_type(view.question))


def lexical_cues(view: QueryView) -> frozenset:
    def make():
        q = view.question.lower()
        out = {f"cue:{n}" for n, rx in CUE_RE.items() if rx.search(q)}
        if re.search(r"(?<!^)(?<![.?!]\s)\b[A-Z][a-z]+", view.question.strip()):
            out.add("cue:entity")
        if len(words(q)) > 12:
            out.add("cue:long")
        return frozenset(out)
    return _cached(view, "lexical", make)


def preview_stats(view: QueryView) -> dict:
    def make():
        qw = content_words(view.question)
        out = {}
        for k in STRUCTURES:
            p = view.structures[k]
            pw = content_words(p.preview) if p.ok else set()
            steps = frozenset(STEP_REF.findall(p.preview)) if p.ok else frozenset()
            out[k] = {"ok": float(p.ok and p.tokens > 0), "log_tokens": math.log1p(p.tokens) / 10.0,
                      "top_score": float(p.top_score) if p.top_score is not None else 0.0,
                      "has_score": float(p.top_score is not None),
                      "overlap": len(qw & pw) / len(qw) if qw else 0.0, "words": frozenset(pw), "steps": steps,
                      "n_steps": math.log1p(len(steps))}
        for k in STRUCTURES:  # share of the steps k cites that another structure's preview cites too
            others = frozenset().union(*(out[j]["steps"] for j in STRUCTURES if j != k))
            out[k]["steps_shared"] = len(out[k]["steps"] & others) / len(out[k]["steps"]) if out[k]["steps"] else 0.0
        ranked = sorted(STRUCTURES, key=lambda k: -out[k]["overlap"])
        for r, k in enumerate(ranked):
            out[k]["overlap_rank"] = 1.0 - r / (len(STRUCTURES) - 1)
        return out
    return _cached(view, "preview", make)


def cues(view: QueryView) -> frozenset:
    """Every flag a repair rule may test."""
    def make():
        st = preview_stats(view)
        out = set(lexical_cues(view)) | {f"qtype={qtype(view)}", f"corpus={view.corpus}", "always"}
        out |= {f"unavailable:{k}" for k in STRUCTURES if not st[k]["ok"]}
        out |= {f"no_overlap:{k}" for k in STRUCTURES if st[k]["overlap"] == 0.0}
        return frozenset(out)
    return _cached(view, "cues", make)


def gate_features(view: QueryView) -> np.ndarray:
    """(5, F) features per structure: bias, lexical cue flags, then the structure's preview features."""
    def make():
        lex = lexical_cues(view)
        st = preview_stats(view)
        t = qtype(view)
        base = [1.0] + [float(c in lex) for c in CUE_NAMES] + [float(t == q) for q in QTYPES]
        return np.array([base + [st[k][f] for f in PREVIEW_FEATURES] for k in STRUCTURES])
    return _cached(view, "gate", make)


def relevance(view: QueryView, w_score: float = 0.5) -> dict[str, float]:
    """Preview relevance per structure: overlap + w_score * squashed top_score; 0 when unavailable."""
    st = preview_stats(view)
    return {k: 0.0 if not st[k]["ok"] else st[k]["overlap"] + w_score * (math.tanh(st[k]["top_score"]) if
                                                                      st[k]["has_score"] else 0.0)
            for k in STRUCTURES}


def decompose(question: str) -> list[str]:
    """Sub-questions: the clauses split at 'and' / 'or' / ',' / ';' / '?' with at least two words."""
    parts = re.split(r"\band\b|\bor\b|[,;?]", question)
    parts = [p.strip() for p in parts if len(words(p)) >= 2]
    return parts or [question]


def jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if (a or b) else 0.0


def preview_similarity(st: dict, a: str, b: str) -> float:
    """How much two structures' previews repeat each other: the larger of the word and cited-step Jaccards."""
    return max(jaccard(st[a]["words"], st[b]["words"]), jaccard(st[a]["steps"], st[b]["steps"]))
