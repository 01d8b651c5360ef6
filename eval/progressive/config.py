"""The ``memroute eval progressive`` options (:class:`ProgressiveEvalConfig`) and the names shared by the
other modules of :mod:`eval.progressive`: the default taus, the two router names and the four paths."""

from __future__ import annotations

from dataclasses import dataclass, field

from routers.memory.retrieval import FUSIONS
from routers.models import DEFAULT_CAUSAL_LM, DEFAULT_ENCODER
from routers.config import ConfigError

TAUS = (0.1, 0.3, 0.5, 0.7, 0.9)
BASE, TRAINED = "base", "trained"
PAPER_TAUS = (0.3, 0.7)  # the tau span of seed 001 Tables 3 and 5
PATHS = ("fast", "slow", "rag", "long_context")


def is_none(spec) -> bool:
    """A model option switched off: None, '', 'none' or 'null' (any case)."""
    return spec is None or str(spec).lower() in ("", "none", "null")


@dataclass
class ProgressiveEvalConfig:
    corpus: str = field(default="locomo", metadata={"help": "Corpus for data_synthesis.corpora.load_corpus."})
    corpus_path: str | None = field(default=None, metadata={"help": "Corpus file/folder (default: bundled LoCoMo)."})
    dev_episodes: list[str] = field(default_factory=lambda: ["conv-26"], metadata={
        "help": "Held-out episodes where tau is chosen."})
    test_episodes: list[str] = field(default_factory=lambda: ["conv-30"], metadata={
        "help": "Held-out episodes where the chosen tau is reported ([] = a dev-only run)."})
    max_questions_per_episode: int | None = field(default=None, metadata={
        "help": "Seeded random sample of questions per episode (None = all)."})
    seed: int = 0
    answer_model: str = field(default=DEFAULT_CAUSAL_LM, metadata={
        "help": "Answer model and memory agent: alias, HF id, local path, or openai:MODEL@URL (vLLM)."})
    tokenizer: str | None = field(default=None, metadata={
        "help": "Tokenizer for window fitting with an HTTP backend (default: estimate 4 chars per token)."})
    router: str | None = field(default=None, metadata={"help": "Trained router export (None: base router only)."})
    router_base: str | None = field(default=None, metadata={
        "help": "Untrained router model; default: the trained router's base_model, else answer_model; 'none' skips."})
    encoder: str = field(default=DEFAULT_ENCODER, metadata={
        "help": "Prefix encoder: alias, path, a `memroute train retriever` export; 'none' = BM25 only."})
    rag_encoder: str = field(default=DEFAULT_ENCODER, metadata={"help": "Dense RAG baseline encoder ('none' = BM25)."})
    dense_weight: float = field(default=0.5, metadata={"help": "Dense share of the hybrid prefix."})
    fusion: str = field(default="minmax", metadata={
        "help": "Prefix mixing: minmax (at dense_weight) or peak (label-free per-query weight, for unseen corpora).",
        "choices": list(FUSIONS)})
    top_k: int = field(default=10, metadata={"help": "Prefix hits."})
    rag_k: int = field(default=5, metadata={"help": "RAG baseline: top-k steps, in rank order."})
    block_size: int = 8
    block_overlap: int = 2
    neighbours: int = field(default=1, metadata={"help": "Temporal neighbour blocks on each side of an anchor."})
    max_blocks: int = field(default=8, metadata={"help": "Bound on the blocks analysed per question."})
    model_window: int = field(default=2048, metadata={"help": "Answer-model window in tokens (prompt + new)."})
    answer_max_new_tokens: int = 16
    note_max_new_tokens: int = 64
    aggregate: str = field(default="concat", metadata={"help": "concat or llm"})
    aggregate_max_new_tokens: int = 128
    judge: str = field(default="none", metadata={
        "help": "AMA-Bench binary judge: none, 'answer' (the answer backend), or a backend spec."})
    score_metric: str = field(default="f1", metadata={"help": "f1 or judge: the 'score' column."})
    taus: list[float] = field(default_factory=lambda: list(TAUS))
    max_score_drop: float = field(default=2.0, metadata={"help": "Dev tau choice: score within this of slow-only."})
    batch_size: int = field(default=8, metadata={"help": "Local generation batch size (memory agents)."})
    http_concurrency: int = field(default=8, metadata={"help": "Concurrent requests to an HTTP backend."})
    http_timeout: float = 60.0
    max_retries: int = 2
    retry_backoff: float = 1.0
    device: str | None = None
    output_dir: str = "results/progressive_locomo"

    def __post_init__(self):
        if self.score_metric not in ("f1", "judge"):
            raise ConfigError(f"score_metric must be 'f1' or 'judge', got {self.score_metric!r}")
        if self.score_metric == "judge" and is_none(self.judge):
            raise ConfigError("score_metric 'judge' needs --judge (e.g. 'answer' or openai:MODEL@URL)")
        if self.aggregate not in ("concat", "llm"):
            raise ConfigError(f"aggregate must be 'concat' or 'llm', got {self.aggregate!r}")
        if [e.lower() for e in self.test_episodes] == ["none"]:  # `--test_episodes none` on the command line
            self.test_episodes = []
        overlap = set(self.dev_episodes) & set(self.test_episodes)
        if overlap:
            raise ConfigError(f"dev_episodes and test_episodes overlap: {sorted(overlap)}")
        if not self.dev_episodes:
            raise ConfigError("give at least one dev episode (test_episodes may be empty for a dev-only run)")
        for name in ("dev_episodes", "test_episodes"):
            ids = getattr(self, name)
            dup = sorted({e for e in ids if ids.count(e) > 1})
            if dup:
                raise ConfigError(f"{name}: {dup} listed more than once")
        # Numeric options, checked when the recipe is read (not after the models load): plain ValueErrors,
        # which parse_config reports as a ConfigError naming the recipe or the command line.
        positive = ("top_k", "rag_k", "block_size", "max_blocks", "model_window", "answer_max_new_tokens",
                    "note_max_new_tokens", "aggregate_max_new_tokens", "batch_size", "http_concurrency")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("neighbours", "max_retries"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.block_overlap < self.block_size:
            raise ValueError(f"block_overlap must be in [0, block_size) = [0, {self.block_size}), "
                             f"got {self.block_overlap}")
        if self.max_questions_per_episode is not None and self.max_questions_per_episode < 1:
            raise ValueError(f"max_questions_per_episode must be >= 1 (got {self.max_questions_per_episode}); "
                             "omit it to evaluate every question")
        if not 0.0 <= self.dense_weight <= 1.0:
            raise ValueError(f"dense_weight must lie in [0, 1], got {self.dense_weight}")
        if not self.taus or any(not 0.0 <= t <= 1.0 for t in self.taus):
            raise ValueError(f"taus must be a non-empty list of thresholds in [0, 1], got {self.taus}")
        for name in ("http_timeout", "retry_backoff", "max_score_drop"):
            v = getattr(self, name)
            if not v >= 0.0 or (name == "http_timeout" and v == 0.0):  # `not >=` also refuses NaN
                raise ValueError(f"{name} must be {'> 0' if name == 'http_timeout' else '>= 0'}, got {v}")

