"""Router-Mem progressive memory execution (seed 001, Algorithm 1).

    (C_f, H_f) <- R_f(q, M)                      shared retrieval prefix (HybridRetriever)
    if C_f fits the router budget and s(q, C_f) >= tau:
        return A(q, Order(C_f))                  early return: hits restored to temporal order
    B_f <- MapToBlocks(H_f); B_s <- SelectBlocks(B_f, M)    anchors + bounded temporal neighbours
    u_b <- MemAgent(q, b) for b in B_s           in parallel: one batched ``backend.generate`` call
    C_s <- Aggregate(u_b); return A(q, C_s)

Each stage is timed separately (prefix, router, blocks, aggregate, answer) so an evaluation can run both
paths once per question and derive every tau exactly (``eval.progressive``). Nothing the models read is
cut silently: a block larger than the model window is split into pieces (counted), a single step too long
for the window is shortened (counted), and an answer context that does not fit drops its lowest-priority
units (counted).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

from routers.memory.retrieval import HybridRetriever, render_context
from routers.memory.schema import Episode, Step
from routers.memory.views import AlignedViews

PROMPT_VERSION = 1
ANSWER_SYSTEM = ("You answer questions about a long conversation or agent history using only the memory given. "
                 "Reply with a short answer (a few words), no explanation.")
ANSWER_TEMPLATE = "Memory:\n{context}\n\nQuestion: {question}\nShort answer:"
AGENT_SYSTEM = ("You are a memory agent. You read one block of a long memory and report what in it helps answer "
                "a question.")
AGENT_TEMPLATE = ("Memory block (steps {first} to {last}):\n{block}\n\nQuestion: {question}\n\n"
                  "List the facts in this block that help answer the question, citing step ids. "
                  "If nothing in the block is relevant, reply NONE.")
AGGREGATE_SYSTEM = "You merge notes written by memory agents into one consolidated list of facts."
AGGREGATE_TEMPLATE = ("Question: {question}\n\nNotes from memory blocks, in temporal order:\n{notes}\n\n"
                      "Merge these notes into a short list of the facts that help answer the question, "
                      "in temporal order, resolving duplicates and conflicts.")
EMPTY_CONTEXT = "(no memory)"
FAST, SLOW = "fast", "slow"


class BackendError(RuntimeError):
    """An LLM backend kept failing after its retries; the evaluation marks the question failed."""


def generate_with_retries(backend, conversations: list, max_new_tokens: int, max_retries: int = 2,
                          backoff: float = 1.0) -> list[str]:
    """``backend.generate`` retried with exponential backoff; :class:`BackendError` when it keeps failing.

    A backend with its own retries (a ``max_retries`` attribute, e.g. the HTTP client, which also applies
    its request timeout) is not retried again here.
    """
    retries = 0 if getattr(backend, "max_retries", None) is not None else max_retries
    last: Exception | None = None
    for attempt in range(retries + 1):
        try:
            out = list(backend.generate(conversations, max_new_tokens=max_new_tokens))
            if len(out) != len(conversations):
                raise RuntimeError(f"{len(out)} completions for {len(conversations)} conversations")
            return out
        except Exception as err:  # noqa: BLE001 - any backend failure is retried, then reported
            last = err
            if attempt < retries:
                time.sleep(backoff * (2 ** attempt))
    name = getattr(backend, "name", type(backend).__name__)
    raise BackendError(f"{name}: failed after {retries + 1} attempt(s): {last}") from last


# -- token counting ------------------------------------------------------------------------------------
class TokenCounter:
    """Prompt length in tokens, as the answer model sees it (its chat template when a tokenizer is given).

    Without a tokenizer (an HTTP backend whose tokenizer is not available locally) the count is an
    estimate, ceil(characters / 4) per message plus 4; ``approximate`` says so in the outputs.
    """

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer
        self.approximate = tokenizer is None

    def messages(self, messages: Sequence[dict]) -> int:
        if self.tokenizer is None:
            return sum(math.ceil(len(m["content"]) / 4) + 4 for m in messages)
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        else:
            text = "\n\n".join(m["content"] for m in messages)
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def shorten(self, text: str, max_tokens: int) -> str:
        """The first ``max_tokens`` tokens of ``text`` (characters when estimating)."""
        if max_tokens <= 0:
            return ""
        if self.tokenizer is None:
            return text[: 4 * max_tokens]
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return self.tokenizer.decode(ids[:max_tokens], skip_special_tokens=True)


def counter_for(backend, tokenizer=None) -> TokenCounter:
    """Exact counts for a local transformers backend (its tokenizer), else ``tokenizer`` or an estimate."""
    if tokenizer is not None and not isinstance(tokenizer, str):
        return TokenCounter(tokenizer)
    name = tokenizer if isinstance(tokenizer, str) else getattr(backend, "model_name", None)
    if name:
        from transformers import AutoTokenizer

        from routers.models import resolve_causal_lm

        return TokenCounter(AutoTokenizer.from_pretrained(resolve_causal_lm(name)))
    return TokenCounter(None)


# -- prompts -------------------------------------------------------------------------------------------
def answer_messages(question: str, context: str) -> list[dict]:
    return [{"role": "system", "content": ANSWER_SYSTEM},
            {"role": "user", "content": ANSWER_TEMPLATE.format(context=context or EMPTY_CONTEXT, question=question)}]


def agent_messages(question: str, steps: Sequence[Step]) -> list[dict]:
    block = "\n".join(s.render() for s in steps)
    return [{"role": "system", "content": AGENT_SYSTEM},
            {"role": "user", "content": AGENT_TEMPLATE.format(first=steps[0].step_id, last=steps[-1].step_id,
                                                              block=block, question=question)}]


def aggregate_messages(question: str, notes: str) -> list[dict]:
    return [{"role": "system", "content": AGGREGATE_SYSTEM},
            {"role": "user", "content": AGGREGATE_TEMPLATE.format(question=question, notes=notes)}]


def is_empty_note(note: str) -> bool:
    """A memory agent's "nothing relevant here" (``NONE``, ``None.``, an empty reply)."""
    head = note.strip().strip(".:;!*- \"'").lower()
    return not head or head == "none" or head.startswith("none ") or head.startswith("none.")


# -- block selection -----------------------------------------------------------------------------------
def select_blocks(views: AlignedViews, hit_ids: Sequence[str], neighbours: int = 1,
                  max_blocks: int | None = 8) -> tuple[list[int], list[int]]:
    """SelectBlocks(MapToBlocks(H_f), M): (anchor blocks, selected blocks), both in temporal order.

    Each hit maps to one anchor, the block holding it nearest the block's centre (with overlapping blocks
    a step can sit in two; the earlier wins a tie), so ten hits never claim twenty blocks. Each anchor
    brings the blocks up to ``neighbours`` positions before and after it. At most ``max_blocks`` are
    kept, by priority: anchors in hit-rank order first, then neighbours by distance (1 before 2), each
    distance in anchor priority order, before then after.
    """
    anchors: list[int] = []
    for sid in hit_ids:
        holders = views.step_to_blocks.get(sid, [])
        if not holders:
            continue
        index = views.episode.step(sid).index
        b = min(holders, key=lambda b: (abs(index - (views.blocks[b].start + views.blocks[b].end - 1) / 2), b))
        if b not in anchors:
            anchors.append(b)
    priority = list(anchors)
    for d in range(1, max(neighbours, 0) + 1):
        for a in anchors:
            for b in (a - d, a + d):
                if 0 <= b < len(views.blocks) and b not in priority:
                    priority.append(b)
    chosen = priority if max_blocks is None else priority[:max_blocks]
    return sorted(anchors), sorted(chosen)


# -- results -------------------------------------------------------------------------------------------
@dataclass
class Prefix:
    context: str
    hits: list[Step]
    scores: list[float]
    seconds: float

    @property
    def hit_ids(self) -> list[str]:
        return [s.step_id for s in self.hits]


@dataclass
class AnswerResult:
    answer: str
    seconds: float
    units_dropped: int = 0  # context units left out to fit the window (0 = nothing cut)
    context: str = ""       # the context the answer model read


@dataclass
class SlowResult:
    anchor_blocks: list[int]
    blocks: list[int]
    notes: list[dict]          # {block, piece, first, last, note}, temporal order
    context: str               # C_s
    n_pieces: int              # memory-agent calls (blocks after window splits)
    window_splits: int         # blocks that had to be split to fit the model window
    truncated_steps: int       # single steps longer than the window, shortened (counted, never silent)
    blocks_s: float            # map + select + fit + memory agents
    aggregate_s: float
    answer: AnswerResult

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ProgressiveResult:
    """One query through Algorithm 1."""

    question: str
    answer: str
    path: str                  # "fast" (early return) or "slow" (continuation)
    score: float | None        # router score; None = over the router's input budget (or no router)
    tau: float
    hits: list[str]
    context: str               # what the answer model read (C_f in temporal order, or C_s)
    prefix_s: float
    router_s: float
    blocks_s: float = 0.0
    aggregate_s: float = 0.0
    answer_s: float = 0.0
    slow: SlowResult | None = None

    @property
    def t_mem(self) -> float:
        return self.prefix_s + self.router_s + self.blocks_s + self.aggregate_s

    @property
    def t_e2e(self) -> float:
        return self.t_mem + self.answer_s

    def to_dict(self) -> dict:
        return {**asdict(self), "t_mem": self.t_mem, "t_e2e": self.t_e2e}


@dataclass
class ProgressiveConfig:
    top_k: int = 10                 # prefix hits |H_f|
    block_size: int = 8             # steps per processing block
    block_overlap: int = 2
    neighbours: int = 1             # temporal neighbours on each side of an anchor block
    max_blocks: int = 8             # bound on |B_s|
    model_window: int = 2048        # answer / memory-agent context window in tokens (prompt + new tokens)
    answer_max_new_tokens: int = 16
    note_max_new_tokens: int = 64
    aggregate: str = "concat"       # "concat" (notes in temporal order) or "llm" (one merging call)
    aggregate_max_new_tokens: int = 128
    tau: float = 0.5
    max_retries: int = 2            # for backends without their own retries
    retry_backoff: float = 1.0      # seconds, doubled per retry

    def __post_init__(self):
        if self.aggregate not in ("concat", "llm"):
            raise ValueError(f"aggregate must be 'concat' or 'llm', got {self.aggregate!r}")
        if self.top_k < 1 or self.max_blocks < 1 or self.neighbours < 0:
            raise ValueError("need top_k >= 1, max_blocks >= 1, neighbours >= 0")


class ProgressiveExecutor:
    """Runs Algorithm 1; the stages are also public so an evaluation can run both paths once.

    ``retriever``: a :class:`HybridRetriever`; ``backend``: an LLM backend (``generate``) used as the answer
    model A and the memory agent; ``router``: anything with ``score(questions, contexts) -> tensor`` (a
    ``SufficiencyRouter``; NaN = over budget); ``counter``: a :class:`TokenCounter` for window fitting.
    """

    def __init__(self, retriever: HybridRetriever, backend, router=None, config: ProgressiveConfig | None = None,
                 counter: TokenCounter | None = None):
        self.retriever = retriever
        self.backend = backend
        self.router = router
        self.config = config or ProgressiveConfig()
        self.counter = counter if counter is not None else counter_for(backend)
        self.backend_calls = 0
        self._views: dict[str, AlignedViews] = {}

    # -- building --------------------------------------------------------------------------------------
    def views(self, episode: Episode) -> AlignedViews:
        if episode.episode_id not in self._views:
            self._views[episode.episode_id] = AlignedViews(episode, self.config.block_size, self.config.block_overlap)
        return self._views[episode.episode_id]

    def build(self, episode: Episode) -> float:
        """Construct the retrieval index and the aligned views of an episode; returns T_build (seconds)."""
        t0 = time.perf_counter()
        self.retriever.step_embeddings(episode)
        self.views(episode)
        return time.perf_counter() - t0

    # -- LLM calls -------------------------------------------------------------------------------------
    def generate(self, conversations: list[list[dict]], max_new_tokens: int) -> list[str]:
        """One backend call for all conversations (batched / concurrent inside the backend), with retries."""
        if not conversations:
            return []
        self.backend_calls += 1
        return generate_with_retries(self.backend, conversations, max_new_tokens, self.config.max_retries,
                                     self.config.retry_backoff)

    def _budget(self, max_new_tokens: int) -> int:
        return self.config.model_window - max_new_tokens

    def fit(self, build: Callable[[list], list[dict]], units: Sequence, max_new_tokens: int) -> tuple[list[dict], int]:
        """The longest priority prefix of ``units`` whose prompt fits the window: (messages, units kept).

        ``units`` are in priority order (most important first); ``build(kept)`` renders the prompt (in
        temporal order). Prompt length grows with the units kept, so a binary search finds the cut.
        """
        budget = self._budget(max_new_tokens)
        units = list(units)
        full = build(units)
        if self.counter.messages(full) <= budget:
            return full, len(units)
        lo, hi = 0, len(units)  # build(units[:lo]) fits, build(units[:hi]) does not
        if self.counter.messages(build([])) > budget:
            raise ValueError(f"the question alone exceeds the model window ({self.config.model_window} tokens)")
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.counter.messages(build(units[:mid])) <= budget:
                lo = mid
            else:
                hi = mid
        return build(units[:lo]), lo

    def answer(self, question: str, build_units: Callable[[list], str], units: Sequence) -> AnswerResult:
        """A(q, C): fit the context to the window, then one generate call (timed together)."""
        t0 = time.perf_counter()
        units = list(units)
        messages, kept = self.fit(lambda ks: answer_messages(question, build_units(ks)), units,
                                  self.config.answer_max_new_tokens)
        (text,) = self.generate([messages], self.config.answer_max_new_tokens)
        return AnswerResult(text, time.perf_counter() - t0, len(units) - kept, build_units(units[:kept]))

    # -- stages ----------------------------------------------------------------------------------------
    def prefix(self, question: str, episode: Episode) -> Prefix:
        """R_f(q, M) -> (C_f, H_f); C_f lists the hits in temporal order."""
        t0 = time.perf_counter()
        hits = self.retriever.retrieve(question, episode, self.config.top_k)
        steps = [h.step for h in hits]
        context = render_context(steps)
        return Prefix(context, steps, [h.score for h in hits], time.perf_counter() - t0)

    def route(self, question: str, context: str, router=None) -> tuple[float | None, float]:
        """s(q, C_f) and its time; None when the context exceeds the router's input budget."""
        return route_score(router if router is not None else self.router, question, context)

    def fast(self, question: str, prefix: Prefix) -> AnswerResult:
        """Early return: A(q, Order(C_f)); over-long contexts drop the lowest-ranked hits first."""
        return self.answer(question, lambda kept: render_context(kept), prefix.hits)

    def _pieces(self, question: str, steps: list[Step]) -> tuple[list[list[Step]], int]:
        """Split a block into consecutive pieces whose memory-agent prompt fits the window.

        Returns (pieces, steps shortened). A step too long on its own is cut to fit (and counted).
        """
        budget = self._budget(self.config.note_max_new_tokens)
        if self.counter.messages(agent_messages(question, steps)) <= budget:
            return [steps], 0
        pieces: list[list[Step]] = []
        current: list[Step] = []
        shortened = 0
        for step in steps:
            if current and self.counter.messages(agent_messages(question, current + [step])) <= budget:
                current.append(step)
                continue
            if current:
                pieces.append(current)
            if self.counter.messages(agent_messages(question, [step])) > budget:
                overhead = self.counter.messages(agent_messages(question, [_with_text(step, "")]))
                text = step.text
                allowed = budget - overhead - 4
                while True:  # token counts of decoded text can drift by a token or two: shrink until it fits
                    cut = _with_text(step, self.counter.shorten(text, allowed) + " [...]")
                    if allowed <= 0 or self.counter.messages(agent_messages(question, [cut])) <= budget:
                        break
                    allowed -= max(1, allowed // 10)
                if self.counter.messages(agent_messages(question, [cut])) > budget:
                    raise ValueError(f"step {step.step_id}: even an empty step does not fit the model window")
                step, shortened = cut, shortened + 1
            current = [step]
        if current:
            pieces.append(current)
        return pieces, shortened

    def slow(self, question: str, episode: Episode, prefix: Prefix) -> SlowResult:
        """Continuation: anchors + neighbours -> memory agents (one batched call) -> aggregate -> answer."""
        cfg = self.config
        t0 = time.perf_counter()
        views = self.views(episode)
        anchors, blocks = select_blocks(views, prefix.hit_ids, cfg.neighbours, cfg.max_blocks)
        jobs: list[tuple[int, int, list[Step]]] = []
        splits = shortened = 0
        for b in blocks:
            pieces, cut = self._pieces(question, views.block_steps(b))
            splits += len(pieces) > 1
            shortened += cut
            jobs.extend((b, i, p) for i, p in enumerate(pieces))
        outputs = self.generate([agent_messages(question, p) for _, _, p in jobs], cfg.note_max_new_tokens)
        notes = [{"block": b, "piece": i, "first": p[0].step_id, "last": p[-1].step_id, "note": o}
                 for (b, i, p), o in zip(jobs, outputs)]
        t1 = time.perf_counter()
        kept = [n for n in notes if not is_empty_note(n["note"])]
        if cfg.aggregate == "llm" and kept:
            messages, _ = self.fit(lambda ks: aggregate_messages(question, _render_notes(ks)), kept,
                                   cfg.aggregate_max_new_tokens)
            (merged,) = self.generate([messages], cfg.aggregate_max_new_tokens)
            units = [{"block": -1, "piece": 0, "first": kept[0]["first"], "last": kept[-1]["last"], "note": merged}]
        else:
            units = kept
        t2 = time.perf_counter()
        # Priority for fitting the answer context: notes of anchor blocks first, then neighbours.
        anchor_set = set(anchors)
        by_priority = sorted(units, key=lambda u: (u["block"] not in anchor_set, u["block"], u["piece"]))
        ans = self.answer(question, lambda ks: _render_notes(sorted(ks, key=lambda u: (u["block"], u["piece"]))),
                          by_priority)
        return SlowResult(anchors, blocks, notes, ans.context, len(jobs), splits, shortened, t1 - t0, t2 - t1, ans)

    def run(self, question: str, episode: Episode, tau: float | None = None) -> ProgressiveResult:
        """Algorithm 1 for one query. Without a router every query continues (the slow endpoint)."""
        tau = self.config.tau if tau is None else tau
        pre = self.prefix(question, episode)
        score, router_s = self.route(question, pre.context)
        if score is not None and score >= tau:
            ans = self.fast(question, pre)
            return ProgressiveResult(question, ans.answer, FAST, score, tau, pre.hit_ids, ans.context,
                                     pre.seconds, router_s, answer_s=ans.seconds)
        slow = self.slow(question, episode, pre)
        return ProgressiveResult(question, slow.answer.answer, SLOW, score, tau, pre.hit_ids, slow.context,
                                 pre.seconds, router_s, slow.blocks_s, slow.aggregate_s, slow.answer.seconds, slow)


def _with_text(step: Step, text: str) -> Step:
    return Step(step.step_id, step.index, text, step.speaker, step.timestamp, step.session, dict(step.meta))


def route_score(router, question: str, context: str) -> tuple[float | None, float]:
    """s(q, C_f) from one router and its time; None when the context exceeds its input budget."""
    if router is None:
        return None, 0.0
    t0 = time.perf_counter()
    score = float(router.score([question], [context])[0])
    return (None if math.isnan(score) else score), time.perf_counter() - t0


def _render_notes(notes: Sequence[dict]) -> str:
    return "\n".join(f"[{n['first']} .. {n['last']}] {n['note']}" for n in notes)
