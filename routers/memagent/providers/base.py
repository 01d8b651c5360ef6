"""The machinery every long-term memory provider shares.

A provider's whole memory is one immutable :class:`ProviderState` (items, key-embedding matrix, keyword
index, id counter, stats). ``store`` computes the next state completely (LLM writes, word limits,
embeddings of new keys, keyword index) and commits it with a single attribute assignment, so a provider
that raises half-way leaves its memory exactly as it was; ``load`` does the same with what it read.
``save`` writes a directory atomically (``routers.base.atomic_directory``).

Scoring is the same function for ``probe`` and ``retrieve``: ``dense_weight * cosine(goal, key) +
(1 - dense_weight) * keyword(goal, key)`` (dense providers: weight 1, keyword providers: 0, hybrids in
between); ``ProviderProbe`` reproduces it for all providers at once.

Subclasses set the paper's parameters as class attributes and implement ``_write`` (trajectory ->
the full next item list, through the LLM) and optionally ``_select`` / ``_render`` for retrieval.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from routers.memagent.protocol import Gate, MemoryItem, Preview, Retrieved, Trajectory
from routers.memagent.providers.keyword import KeywordIndex, counts_matrix, term_counts

PROVIDER_FORMAT = "memroute.memagent.provider"
PROVIDER_SCHEMA_VERSION = 1
_ITEMS_FILE, _EMB_FILE, _META_FILE = "items.jsonl", "embeddings.npy", "provider.json"
RETRIEVALS = ("dense", "keyword", "hybrid")
_WORD = re.compile(r"\S+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


class ProviderError(RuntimeError):
    """A provider cannot do what was asked (no LLM to write with, incompatible saved state, ...)."""


# -- text limits ------------------------------------------------------------------------------------
def count_words(text: str) -> int:
    return len(_WORD.findall(text))


def limit_words(text: str, max_words: int | None) -> tuple[str, int]:
    """Cut ``text`` after ``max_words`` words, keeping its line structure; returns (text, words dropped)."""
    text = text.strip()
    if max_words is None:
        return text, 0
    words = list(_WORD.finditer(text))
    if len(words) <= max_words:
        return text, 0
    if max_words <= 0:
        return "", len(words)
    return text[: words[max_words - 1].end()].rstrip(), len(words) - max_words


def limit_sentences(text: str, max_sentences: int) -> tuple[str, int]:
    """Keep the first ``max_sentences`` sentences; returns (text, sentences dropped)."""
    parts = [p for p in _SENTENCE_END.split(" ".join(text.split())) if p]
    if len(parts) <= max_sentences:
        return " ".join(parts), 0
    return " ".join(parts[:max_sentences]), len(parts) - max_sentences


_BULLET = re.compile(r"^\s*(?:[-*\u2022]+|\d+[.)]|\(\d+\))\s*")


def parse_bullets(text: str, max_items: int | None = None) -> list[str]:
    """Lines of an LLM answer as list entries (bullets/numbers stripped, empty lines and headers dropped)."""
    out = []
    for line in text.splitlines():
        line = _BULLET.sub("", line).strip().strip("*").strip()
        if not line or (line.endswith(":") and len(line.split()) <= 4):
            continue
        out.append(line)
    return out[:max_items] if max_items is not None else out


def parse_sections(text: str, names: Sequence[str]) -> dict[str, str]:
    """Split an answer into ``NAME: body`` sections (case-insensitive; a name may also be a markdown header).
    Missing sections map to ''."""
    pattern = re.compile(r"^\s*(?:#+\s*|\*\*)?(" + "|".join(re.escape(n) for n in names) + r")\s*(?:\*\*)?\s*:?\s*(?:\*\*)?",
                         re.IGNORECASE | re.MULTILINE)
    out = {n: "" for n in names}
    marks = list(pattern.finditer(text))
    lookup = {n.lower(): n for n in names}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        name = lookup[m.group(1).lower()]
        body = text[m.end():end].strip()
        out[name] = (out[name] + "\n" + body).strip() if out[name] else body
    return out


def render_trajectory(traj: Trajectory, max_words: int = 900, obs_words: int = 60) -> str:
    """The trajectory an LLM reads when writing memories: goal, outcome, steps with observations clipped
    to ``obs_words``; when too long, the first and the last steps are kept (the ending carries the outcome)."""
    head = [f"Task: {traj.task.goal}", f"Outcome: {'success' if traj.success else 'failure'}"]
    steps = [f"Step {s.index}: > {s.action}\n{limit_words(s.observation, obs_words)[0]}" for s in traj.steps]
    budget = max_words - count_words("\n".join(head))
    cost = [count_words(s) for s in steps]
    if sum(cost) <= budget:
        return "\n".join(head + steps)
    keep_head, keep_tail, used = [], [], 0
    i, j = 0, len(steps) - 1
    while i <= j:  # alternate: first steps, last steps
        take_tail = len(keep_tail) < len(keep_head)
        idx = j if take_tail else i
        if used + cost[idx] > budget:
            break
        used += cost[idx]
        if take_tail:
            keep_tail.insert(0, steps[idx])
            j -= 1
        else:
            keep_head.append(steps[idx])
            i += 1
    skipped = len(steps) - len(keep_head) - len(keep_tail)
    return "\n".join(head + keep_head + [f"... ({skipped} steps omitted) ..."] + keep_tail)


def action_sequence(traj: Trajectory, max_words: int | None = None) -> str:
    """The actions taken, '; '-joined (the concrete part of procedural memories; no LLM)."""
    return limit_words("; ".join(s.action.strip() for s in traj.steps if s.action.strip()), max_words)[0]


# -- encoders ---------------------------------------------------------------------------------------
class TextEncoder:
    """``encode(list[str]) -> (n, d) float32`` with L2-normalized rows, around any object whose ``encode``
    takes a list of texts (a ``SentenceTransformer``, a trained retriever, a test fake)."""

    def __init__(self, model, batch_size: int = 64):
        self.model = model
        self.batch_size = batch_size
        params = inspect.signature(model.encode).parameters
        self._st_kwargs = ("normalize_embeddings" in params
                           or any(p.kind == p.VAR_KEYWORD for p in params.values()))
        self._dim: int | None = None

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        if self._st_kwargs:
            out = self.model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=False)
        else:
            out = self.model.encode(texts)
        out = np.asarray(out, dtype=np.float32)
        if out.ndim != 2 or out.shape[0] != len(texts):
            raise ProviderError(f"encoder returned shape {out.shape} for {len(texts)} texts")
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = out / np.maximum(norms, 1e-12)
        self._dim = out.shape[1]
        return np.ascontiguousarray(out)

    @property
    def dim(self) -> int:
        if self._dim is None:
            get = getattr(self.model, "get_sentence_embedding_dimension", None)
            self._dim = int(get()) if callable(get) and get() else int(self.encode(["dimension probe"]).shape[1])
        return self._dim


@lru_cache(maxsize=1)
def default_encoder() -> TextEncoder:
    """all-MiniLM-L6-v2 (offline copy), loaded once per process and shared by every provider."""
    from routers.models import load_encoder

    return TextEncoder(load_encoder())


def as_encoder(encoder) -> TextEncoder | None:
    if encoder is None or isinstance(encoder, TextEncoder):
        return encoder
    if isinstance(encoder, str):
        from routers.models import load_encoder

        return default_encoder() if encoder in ("default", "minilm") else TextEncoder(load_encoder(encoder))
    if not callable(getattr(encoder, "encode", None)):
        raise TypeError(f"encoder must have an encode(list[str]) method, got {type(encoder).__name__}")
    return TextEncoder(encoder)


# -- state ------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ProviderState:
    """Everything a provider remembers; replaced as a whole, never modified."""

    items: tuple[MemoryItem, ...] = ()
    embeddings: np.ndarray | None = None     # (n, d) float32, read-only; None for keyword-only providers
    keyword: KeywordIndex | None = None      # over the item keys; None for dense-only providers
    next_id: int = 0
    stats: Mapping[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float32)
    a.flags.writeable = False
    return a


class BaseProvider:
    """One long-term memory provider. See the module docstring; subclasses document their sources."""

    name: str = ""
    family: str = ""
    gate: Gate = "all"
    k: int = 1
    word_limit: int | None = None           # per stored memory text
    output_word_limit: int | None = None    # on the injected text (None: k * word_limit)
    retrieval: str = "dense"                # dense | keyword | hybrid
    dense_weight: float = 1.0               # hybrid: weight of the dense score; keyword gets the rest
    keyword_kind: str = "bm25"              # bm25 | tfidf
    llm_rerank: bool = False                # an LLM call on the retrieval path (Generative)
    max_new_tokens: int = 256
    reference: str = ""
    storage_description: str = ""
    retrieval_description: str = ""

    def __init__(self, encoder=None, llm=None, *, k: int | None = None, snippet_words: int = 24,
                 max_new_tokens: int | None = None, max_prompt_words: int = 900):
        if self.retrieval not in RETRIEVALS:
            raise ValueError(f"{self.name}: retrieval must be one of {RETRIEVALS}")
        self._encoder = as_encoder(encoder)
        self.llm = llm
        if k is not None:
            if k < 1:
                raise ValueError(f"{self.name}: k must be >= 1, got {k}")
            self.k = k
        self.snippet_words = snippet_words
        if max_new_tokens is not None:
            self.max_new_tokens = max_new_tokens
        self.max_prompt_words = max_prompt_words
        self._state = ProviderState(keyword=self._empty_keyword())
        self._pending: Counter = Counter()
        self._pending_emb: dict[str, np.ndarray] = {}
        self._next_id = 0

    # -- description (Begin prompts use both, End prompts storage + gate) ------------------------------
    @property
    def uses_dense(self) -> bool:
        return self.retrieval != "keyword"

    @property
    def uses_keyword(self) -> bool:
        return self.retrieval != "dense"

    @property
    def keyword_weight(self) -> float:
        return {"dense": 0.0, "keyword": 1.0}.get(self.retrieval, 1.0 - self.dense_weight)

    @property
    def score_dense_weight(self) -> float:
        return {"dense": 1.0, "keyword": 0.0}.get(self.retrieval, self.dense_weight)

    def describe_storage(self) -> str:
        return self.storage_description

    def describe_retrieval(self) -> str:
        return self.retrieval_description

    def describe_gate(self) -> str:
        return "stores successful trajectories only" if self.gate == "success" else "stores every outcome"

    def describe(self, phase: str = "begin") -> str:
        """The provider line of a router prompt: Begin = storage + retrieval, End = storage + outcome gate."""
        if phase == "begin":
            return f"{self.name}: Storage: {self.describe_storage()} Retrieval: {self.describe_retrieval()}"
        if phase == "end":
            return f"{self.name}: Storage: {self.describe_storage()} Gate: {self.describe_gate()}."
        raise ValueError(f"phase must be 'begin' or 'end', got {phase!r}")

    def params(self) -> dict:
        """The implementation parameters (Table 7 style), saved with the state."""
        return {"name": self.name, "family": self.family, "gate": self.gate, "k": self.k,
                "word_limit": self.word_limit, "output_word_limit": self.output_limit, "retrieval": self.retrieval,
                "dense_weight": self.score_dense_weight, "keyword_kind": self.keyword_kind if self.uses_keyword else None,
                "llm_rerank": self.llm_rerank, "reference": self.reference}

    @property
    def output_limit(self) -> int | None:
        if self.output_word_limit is not None:
            return self.output_word_limit
        return None if self.word_limit is None else self.k * self.word_limit

    # -- state access ----------------------------------------------------------------------------------
    @property
    def state(self) -> ProviderState:
        return self._state

    @property
    def items(self) -> tuple[MemoryItem, ...]:
        return self._state.items

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._state.stats)

    def __len__(self) -> int:
        return len(self._state.items)

    @property
    def encoder(self) -> TextEncoder:
        if self._encoder is None:
            self._encoder = default_encoder()
        return self._encoder

    def _empty_keyword(self) -> KeywordIndex | None:
        return KeywordIndex(counts_matrix([]), self.keyword_kind) if self.uses_keyword else None

    # -- storage -----------------------------------------------------------------------------------------
    def accepts(self, trajectory: Trajectory) -> bool:
        """The outcome gate. A rollout that failed with an error (``trajectory.error``) is never stored."""
        if trajectory.error:
            return False
        return self.gate == "all" or bool(trajectory.success)

    def store(self, trajectory: Trajectory) -> list[MemoryItem]:
        """Write memories for ``trajectory`` if the gate lets it through; returns the new/changed items.

        Atomic: the next state is computed first and committed with one assignment."""
        if not self.accepts(trajectory):
            return []
        old = self._state
        self._pending, self._pending_emb, self._next_id = Counter(), {}, old.next_id
        try:
            items = list(self._write(trajectory, old.items))
            self._pending["stored_trajectories"] += 1
            new = self._build_state(items, old, stats=Counter(old.stats) + self._pending)
        finally:
            self._pending_emb = {}
        self._state = new  # the commit
        before = {it.item_id: it for it in old.items}
        return [dataclasses.replace(it, meta=dict(it.meta)) for it in new.items if before.get(it.item_id) != it]

    def _write(self, trajectory: Trajectory, items: tuple[MemoryItem, ...]) -> list[MemoryItem]:
        """Provider logic: the complete next item list. Must not modify ``items`` (use ``dataclasses.replace``)."""
        raise NotImplementedError

    def bulk_load(self, items: Sequence[MemoryItem], embeddings: np.ndarray | None = None) -> None:
        """Replace the memory with ready items (migration, benchmarks); ``embeddings`` are the keys' vectors
        (encoded when omitted). Atomic like ``store``."""
        items = list(items)
        if embeddings is not None:
            emb = np.asarray(embeddings, np.float32)
            if emb.shape[0] != len(items):
                raise ValueError(f"{self.name}: {emb.shape[0]} embeddings for {len(items)} items")
        ids = [int(m.group(1)) for it in items if (m := re.fullmatch(rf"{re.escape(self.name)}-(\d+)", it.item_id))]
        next_id = max(ids, default=-1) + 1
        self._state = self._build_state(items, ProviderState(next_id=next_id), stats=Counter(),
                                        embeddings=embeddings)

    def _new_item(self, trajectory: Trajectory, key: str, text: str, **meta: Any) -> MemoryItem:
        item_id = f"{self.name}-{self._next_id:06d}"
        self._next_id += 1
        meta.setdefault("outcome", "success" if trajectory.success else "failure")
        meta.setdefault("goal", trajectory.task.goal)
        return MemoryItem(provider=self.name, item_id=item_id, key=key.strip(), text=text.strip(),
                          source_task_id=trajectory.task.task_id, meta=meta)

    def _build_state(self, items: list[MemoryItem], old: ProviderState, stats: Counter,
                     embeddings: np.ndarray | None = None, normalize: bool = True) -> ProviderState:
        seen: set[str] = set()
        for it in items:
            if not isinstance(it, MemoryItem) or it.provider != self.name:
                raise ProviderError(f"{self.name}: item {getattr(it, 'item_id', it)!r} is not a {self.name} MemoryItem")
            if it.item_id in seen:
                raise ProviderError(f"{self.name}: duplicate item id {it.item_id}")
            if not it.key.strip():
                raise ProviderError(f"{self.name}: item {it.item_id} has an empty key")
            seen.add(it.item_id)
        old_pos = {it.item_id: i for i, it in enumerate(old.items)}
        reuse = [old_pos.get(it.item_id, -1) for it in items]
        reuse = [j if j >= 0 and old.items[j].key == it.key else -1 for j, it in zip(reuse, items)]
        emb = None
        if self.uses_dense:
            if embeddings is not None:
                emb = np.asarray(embeddings, np.float32)
                if normalize and len(emb):  # not on load: saved rows are already normalized, keep their bits
                    emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
            else:
                missing = sorted({it.key for it, j in zip(items, reuse) if j < 0 or old.embeddings is None}
                                 - set(self._pending_emb))
                fresh = dict(zip(missing, self.encoder.encode(missing))) if missing else {}
                fresh.update(self._pending_emb)
                dim = (old.embeddings.shape[1] if old.embeddings is not None and len(old.embeddings)
                       else next(iter(fresh.values())).shape[0] if fresh else 0)
                emb = np.zeros((len(items), dim), np.float32)
                for r, (it, j) in enumerate(zip(items, reuse)):
                    emb[r] = old.embeddings[j] if j >= 0 and old.embeddings is not None else fresh[it.key]
            emb = _frozen(emb)
        kw = None
        if self.uses_keyword:
            src = np.asarray(reuse, np.int64)
            if old.keyword is not None and np.array_equal(src, np.arange(len(old.items))):
                kw = old.keyword  # nothing added, removed, re-keyed or moved
            else:
                from scipy import sparse

                kept = src >= 0  # unchanged keys keep their count rows; only new keys are tokenized
                parts = [old.keyword.take(src[kept])] if kept.any() else []
                if (~kept).any():
                    parts.append(counts_matrix([term_counts(it.key) for it, k in zip(items, kept) if not k]))
                mat = sparse.vstack(parts).tocsr() if parts else counts_matrix([])
                order = np.empty(len(items), np.int64)  # mat rows are [kept..., new...]: back to item order
                order[kept] = np.arange(int(kept.sum()))
                order[~kept] = int(kept.sum()) + np.arange(int((~kept).sum()))
                kw = KeywordIndex(mat[order] if len(items) else mat, self.keyword_kind)
        return ProviderState(items=tuple(items), embeddings=emb, keyword=kw,
                             next_id=max(self._next_id, old.next_id), stats=dict(stats))

    # -- LLM ---------------------------------------------------------------------------------------------
    def _ask(self, system: str, user: str, max_new_tokens: int | None = None) -> str:
        if self.llm is None:
            raise ProviderError(f"{self.name}: writing memories needs an LLM backend (pass llm=...; "
                                "routers.models.make_backend builds one)")
        out = self.llm.generate([[{"role": "system", "content": system}, {"role": "user", "content": user}]],
                                max_new_tokens or self.max_new_tokens)
        if not isinstance(out, (list, tuple)) or len(out) != 1 or not isinstance(out[0], (str, type(None))):
            raise ProviderError(f"{self.name}: LLM backend returned {type(out).__name__} instead of one string")
        self._pending["llm_calls"] += 1
        text = (out[0] or "").strip()
        if not text:
            self._pending["empty_generations"] += 1
        return text

    def _traj_prompt(self, trajectory: Trajectory) -> str:
        return render_trajectory(trajectory, self.max_prompt_words)

    def _limit(self, text: str, max_words: int | None = None) -> str:
        """Enforce a word limit (default: the provider's), counting what was cut."""
        text, dropped = limit_words(text, self.word_limit if max_words is None else max_words)
        if dropped:
            self._pending["truncated"] += 1
            self._pending["words_dropped"] += dropped
        return text

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings needed while writing (dedup/merge); kept so the commit does not encode them twice."""
        texts = list(texts)
        todo = [t for t in dict.fromkeys(texts) if t not in self._pending_emb]
        if todo:
            self._pending_emb.update(zip(todo, self.encoder.encode(todo)))
        return np.stack([self._pending_emb[t] for t in texts]) if texts else np.zeros((0, 0), np.float32)

    # -- scoring, probe, retrieval ------------------------------------------------------------------
    def score_items(self, query_vec: np.ndarray | None, cols: np.ndarray, counts: np.ndarray,
                    state: ProviderState | None = None) -> np.ndarray:
        """Per-item scores (float64): ``wd * cosine + wk * keyword``; the reference ProviderProbe matches."""
        st = state or self._state
        n = len(st.items)
        dense = np.zeros(n)
        if self.uses_dense and st.embeddings is not None and n:
            dense = np.asarray(st.embeddings @ query_vec, dtype=np.float64)
        kw = np.zeros(n)
        if self.uses_keyword and st.keyword is not None and n:
            kw = st.keyword.scores(cols, counts)
        return self.score_dense_weight * dense + self.keyword_weight * kw

    def query(self, goal: str) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        qvec = self.encoder.encode([goal])[0] if self.uses_dense and len(self._state.items) else None
        cols, counts = term_counts(goal) if self.uses_keyword else (np.zeros(0, np.int32), np.zeros(0))
        return qvec, cols, counts

    def snippet(self, item: MemoryItem) -> str:
        """The compact preview of an item shown at Begin."""
        return limit_words(" ".join(item.text.split()), self.snippet_words)[0]

    def preview(self, query_vec: np.ndarray | None, cols: np.ndarray, counts: np.ndarray) -> Preview:
        """Probe with a ready query (the per-provider reference for ``ProviderProbe``)."""
        st = self._state
        if not st.items:
            return Preview(self.name, 0.0, "", 0)
        scores = self.score_items(query_vec, cols, counts, st)
        best = int(np.argmax(scores))
        return Preview(self.name, float(scores[best]), self.snippet(st.items[best]), len(st.items))

    def probe(self, goal: str) -> Preview:
        return self.preview(*self.query(goal))

    def retrieve(self, goal: str) -> Retrieved:
        st = self._state
        if not st.items:
            return Retrieved(self.name, "", [])
        scores = self.score_items(*self.query(goal), state=st)
        chosen = self._select(goal, scores, st.items)
        picked = [st.items[i] for i in chosen]
        text, _ = limit_words(self._render(goal, picked), self.output_limit)
        return Retrieved(self.name, text, [it.item_id for it in picked])

    def _select(self, goal: str, scores: np.ndarray, items: Sequence[MemoryItem]) -> list[int]:
        from routers.memory.index import top_k

        return [int(i) for i in top_k(scores, self.k)[0]]

    def _render(self, goal: str, items: Sequence[MemoryItem]) -> str:
        return "\n\n".join(it.text for it in items)

    # -- persistence ---------------------------------------------------------------------------------
    def save(self, path) -> None:
        """Write ``provider.json`` + ``items.jsonl`` (+ ``embeddings.npy``) into ``path`` atomically."""
        from routers.base import atomic_directory

        st = self._state
        with atomic_directory(path, "provider") as tmp:
            with open(tmp / _ITEMS_FILE, "w", encoding="utf-8") as fh:
                for it in st.items:
                    fh.write(json.dumps(dataclasses.asdict(it), ensure_ascii=False, default=str) + "\n")
            if st.embeddings is not None:
                np.save(tmp / _EMB_FILE, np.asarray(st.embeddings))
            meta = {"format": PROVIDER_FORMAT, "schema_version": PROVIDER_SCHEMA_VERSION, "provider": self.name,
                    "class": type(self).__name__, "params": self.params(), "n_items": len(st.items),
                    "next_id": st.next_id, "stats": dict(st.stats),
                    "embedding_dim": None if st.embeddings is None else int(st.embeddings.shape[1])}
            (tmp / _META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")

    def load(self, path) -> None:
        """Replace the memory with a saved one (validated first; atomic)."""
        from routers.io import read_jsonl

        path = Path(path)
        meta_file = path / _META_FILE
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ProviderError(f"{meta_file}: missing (not a saved {self.name} provider)") from None
        except ValueError as err:
            raise ProviderError(f"{meta_file}: invalid JSON ({err})") from None
        if meta.get("format") != PROVIDER_FORMAT or meta.get("schema_version") != PROVIDER_SCHEMA_VERSION:
            raise ProviderError(f"{meta_file}: not a {PROVIDER_FORMAT} v{PROVIDER_SCHEMA_VERSION} directory")
        if meta.get("provider") != self.name:
            raise ProviderError(f"{meta_file}: saved provider is {meta.get('provider')!r}, not {self.name!r}")
        fields = [f.name for f in dataclasses.fields(MemoryItem)]

        def check(rec):
            if rec["provider"] != self.name:
                raise ValueError(f"item of provider {rec['provider']!r} in a {self.name} store")

        items = [MemoryItem(**{k: rec[k] for k in fields})
                 for rec in read_jsonl(path / _ITEMS_FILE, required=fields, validate=check)]
        emb = None
        if self.uses_dense:
            emb_file = path / _EMB_FILE
            if not emb_file.exists():
                raise ProviderError(f"{emb_file}: missing")
            emb = np.load(emb_file, allow_pickle=False)
            if emb.ndim != 2 or emb.shape[0] != len(items) or not np.isfinite(emb).all():
                raise ProviderError(f"{emb_file}: expected ({len(items)}, dim) finite embeddings, got {emb.shape}")
            if self._encoder is not None and len(items) and self._encoder._dim not in (None, emb.shape[1]):
                raise ProviderError(f"{emb_file}: dim {emb.shape[1]} != encoder dim {self._encoder._dim}")
        self._next_id = int(meta.get("next_id", 0))
        state = self._build_state(items, ProviderState(next_id=self._next_id), Counter(meta.get("stats", {})),
                                  embeddings=emb, normalize=False)
        self._state = state
