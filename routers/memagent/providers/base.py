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

The pieces around it have their own modules (their names stay importable from here): ``text_limits`` (word
limits, LLM answer parsing), ``encoder`` (``TextEncoder``), ``state`` (``ProviderState``, ``ProviderError``)
and ``persistence`` (the saved directory).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Any, Sequence

import numpy as np

from routers.memagent.protocol import Gate, MemoryItem, Preview, Retrieved, Trajectory
from routers.memagent.providers.encoder import TextEncoder, as_encoder, default_encoder  # noqa: F401 (re-exported)
from routers.memagent.providers.keyword import KeywordIndex, counts_matrix, term_counts
from routers.memagent.providers.persistence import (PROVIDER_FORMAT, PROVIDER_SCHEMA_VERSION,  # noqa: F401
                                                    read_state, save_state)
from routers.memagent.providers.state import ProviderError, ProviderState, frozen
from routers.memagent.providers.text_limits import (action_sequence, count_words, limit_sentences,  # noqa: F401
                                                    limit_words, parse_bullets, parse_sections, render_trajectory)

RETRIEVALS = ("dense", "keyword", "hybrid")


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
            emb = frozen(emb)
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
                                "routers.backends.make_backend builds one)")
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

    # -- persistence (routers.memagent.providers.persistence) ---------------------------------------
    def save(self, path) -> None:
        """Write ``provider.json`` + ``items.jsonl`` (+ ``embeddings.npy``) into ``path`` atomically."""
        save_state(path, self._state, self.name, type(self).__name__, self.params())

    def load(self, path) -> None:
        """Replace the memory with a saved one (validated first; atomic)."""
        encoder_dim = self._encoder._dim if self._encoder is not None else None
        items, emb, meta = read_state(path, self.name, self.uses_dense, encoder_dim)
        self._next_id = int(meta.get("next_id", 0))
        state = self._build_state(items, ProviderState(next_id=self._next_id), Counter(meta.get("stats", {})),
                                  embeddings=emb, normalize=False)
        self._state = state
