"""The contrastive evidence retriever (Router-Mem, DESIGN §5) as an exported router.

    from routers.retriever import RetrieverRouter
    r = RetrieverRouter.from_pretrained("outputs/retriever_minilm/export")
    r.score("When did Caroline go to the LGBTQ support group?", episode.steps)   # cosine per step
    index = r.build_index(episode.steps)                                        # VectorIndex
    r.retrieve("When did ...", index, k=5)                                      # [(step_id, score), ...]

The export is a plain sentence-transformers folder (``SentenceTransformer(path)`` loads it too, so
does ``HybridRetriever(encoder=path)``) plus ``router_config.json`` (router_type ``"retriever"``),
``calibration.json`` (the cosine ``threshold``, null = none: keep the top-k) and a model card. Exports
written before calibration.json existed keep their threshold in ``router_config.json``; it is still read. Steps are embedded as ``Step.render()`` -- the same text the retrieval prefix indexes.
Embeddings are L2-normalized, so scores are cosine similarities in [-1, 1].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from routers.base import ROUTER_CONFIG, ExportedRouter, RouterConfigError, cast_weights
from routers.memory.index import VectorIndex
from routers.memory.schema import Episode, Step


@dataclass
class RetrieverConfig:
    base_model: str | None = None
    temperature: float = 0.05
    top_k: int = 10
    threshold: float | None = None
    max_seq_length: int | None = None
    step_format: str = "Step.render()"
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.check_values(self.__dict__)

    @staticmethod
    def check_values(values: dict) -> None:
        """ValueError for a value the retriever cannot work with (also run on every ``router_config.json`` read):
        a positive finite temperature, a positive top_k / max_seq_length, a cosine threshold in [-1, 1]."""
        from routers.validation import positive_int, real_number

        if "temperature" in values:
            if real_number(values["temperature"], "temperature", error=ValueError) <= 0:
                raise ValueError(f"temperature must be > 0, got {values['temperature']!r}")
        if "top_k" in values:
            positive_int(values["top_k"], "top_k", error=ValueError)
        if values.get("threshold") is not None:
            real_number(values["threshold"], "threshold", -1.0, 1.0, error=ValueError)
        if values.get("max_seq_length") is not None:
            positive_int(values["max_seq_length"], "max_seq_length", error=ValueError)


def _texts(items: Sequence[Step | str] | Step | str, name: str = "texts") -> list[str]:
    """Rendered texts of one step / string or a sequence of them; anything else is a RouterInputError naming
    the argument and the index (no silent ``str(None)``)."""
    from routers.validation import RouterInputError, sequence_items

    if isinstance(items, (str, Step)):
        items = [items]
    items = sequence_items(items, name, "a list of strings or Steps")
    out = []
    for i, s in enumerate(items):
        if isinstance(s, Step):
            out.append(s.render())
        elif isinstance(s, str):
            out.append(s)
        else:
            raise RouterInputError(f"{name}[{i}] must be a string or a Step, got {type(s).__name__} {s!r:.80}")
    return out


def _optional_k(k, name: str = "k") -> int | None:
    from routers.validation import positive_int

    return None if k is None else positive_int(k, name)


class RetrieverRouter(ExportedRouter):
    """A sentence encoder that ranks memory steps for a query (one embedding per step, cosine)."""

    router_type = "retriever"
    config_cls = RetrieverConfig
    calibration_keys = {"threshold": (-1.0, 1.0, True)}  # a cosine; null = no threshold (top-k only)

    def __init__(self, model, config: RetrieverConfig | None = None, calibration: dict | None = None):
        self.model = model.eval()
        self.config = config or RetrieverConfig()
        self.calibration = calibration or {}
        if self.config.max_seq_length is None:
            self.config.max_seq_length = getattr(model, "max_seq_length", None)

    # -- construction --------------------------------------------------------------------------------
    @classmethod
    def from_encoder(cls, name_or_path: str, device: str | None = None, **config) -> "RetrieverRouter":
        """An untrained retriever straight from an encoder (alias, HF id or path): the baseline."""
        from routers.models import load_encoder

        return cls(load_encoder(name_or_path, device=device), RetrieverConfig(base_model=name_or_path, **config))

    @classmethod
    def _load_weights(cls, path: Path, config: RetrieverConfig, device: str | None = None, dtype=None) -> dict:
        """The sentence-transformers folder in float32, or ``dtype`` (``"auto"``: as stored)."""
        import torch
        from sentence_transformers import SentenceTransformer

        from routers.validation import load_errors

        with load_errors(path, "sentence-transformers model"):
            model = SentenceTransformer(str(path), device=device)
        return {"model": cast_weights(model, dtype or torch.float32)}

    def _check_loaded(self, path: Path, raw: dict) -> None:
        dim = raw.get("embedding_dim")
        if dim is not None and dim != self.dim:
            raise RouterConfigError(f"{path / ROUTER_CONFIG}: embedding_dim is {dim!r:.40} but the model in {path} "
                                    f"embeds into {self.dim} dimensions")

    # -- inference -----------------------------------------------------------------------------------
    def encode(self, texts: Sequence[Step | str] | Step | str, batch_size: int = 64, show_progress_bar: bool = False,
               **kwargs) -> np.ndarray:
        """L2-normalized float32 embeddings (n, dim). Steps are rendered with ``Step.render()``.

        Accepts (and ignores) ``normalize_embeddings``/``convert_to_numpy``, so a router can stand in
        wherever a SentenceTransformer is expected (e.g. ``HybridRetriever(encoder=router)``).
        """
        from routers.validation import positive_int

        kwargs.pop("normalize_embeddings", None)
        kwargs.pop("convert_to_numpy", None)
        texts = _texts(texts)
        batch_size = positive_int(batch_size, "batch_size")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        emb = self.model.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                                show_progress_bar=show_progress_bar, **kwargs)
        return np.asarray(emb, dtype=np.float32)

    @property
    def dim(self) -> int:
        get = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(get())

    def score(self, query: str | Sequence[str], steps: Sequence[Step | str]) -> np.ndarray:
        """Cosine similarity of the query (or each query) with each step: (n_steps,) or (n_queries, n_steps).

        ``query``: a string or a sequence of strings; ``steps``: Steps and / or strings (one, or a sequence)."""
        from routers.validation import text_list

        single = isinstance(query, str)
        queries = [query] if single else text_list(query, "query")
        texts = _texts(steps, "steps")
        q = self.encode(queries)
        s = q @ self.encode(texts).T if texts else np.zeros((len(q), 0), dtype=np.float32)
        return s[0] if single else s

    def build_index(self, memory: Episode | Sequence[Step], batch_size: int = 64) -> VectorIndex:
        """A :class:`VectorIndex` over the steps (ids = step ids, insertion = temporal order)."""
        from routers.validation import RouterInputError, sequence_items, positive_int

        batch_size = positive_int(batch_size, "batch_size")
        steps = (memory.steps if isinstance(memory, Episode)
                 else sequence_items(memory, "memory", "an Episode or a list of Steps"))
        for i, s in enumerate(steps):
            if not isinstance(s, Step):
                raise RouterInputError(f"memory[{i}] must be a Step (it needs a step_id), got "
                                       f"{type(s).__name__} {s!r:.80}")
        index = VectorIndex(dim=self.dim)
        if steps:
            index.add([s.step_id for s in steps], self.encode(steps, batch_size=batch_size))
        return index

    def retrieve(self, query: str, memory: VectorIndex | Episode | Sequence[Step], k: int | None = None) -> list[tuple[str, float]]:
        """Top-k (step_id, cosine) for the query; ties go to the earlier step."""
        from routers.validation import RouterInputError

        if not isinstance(query, str):
            raise RouterInputError(f"query must be a string, got {type(query).__name__} {query!r:.80}")
        k = _optional_k(k)
        index = memory if isinstance(memory, VectorIndex) else self.build_index(memory)
        ids, scores = index.search(self.encode([query])[0], k or self.config.top_k)
        return [(str(i), float(s)) for i, s in zip(ids, scores)]

    def decide(self, scores, threshold: float | None = None, k: int | None = None) -> list[int]:
        """Indices of the steps to keep: by score (desc; ties earlier first), above ``threshold`` when
        one is set (argument or config), at most ``k`` (default ``config.top_k``).

        ``scores``: one score or a 1-D sequence / array / tensor (a NaN score is never kept); ``threshold``: a
        cosine in [-1, 1]; ``k``: a positive integer."""
        from routers.validation import real_number, score_list

        s = np.asarray(score_list(scores, "scores"), dtype=np.float64)
        tau = self.config.threshold if threshold is None else threshold
        if tau is not None:
            tau = real_number(tau, "threshold", -1.0, 1.0)
        k = _optional_k(k)
        order = np.lexsort((np.arange(len(s)), -np.nan_to_num(s, nan=-np.inf)))
        keep = [int(i) for i in order if not np.isnan(s[i]) and (tau is None or s[i] >= tau)]
        return keep[: (k or self.config.top_k)]

    # -- export --------------------------------------------------------------------------------------
    def _description(self) -> dict:
        return {"labels": {"score": "cosine(e(query), e(step)); higher = more likely evidence"},
                "embedding_dim": self.dim, "normalized": True}

    def _save_weights(self, directory: Path) -> None:
        self.model.save_pretrained(str(directory), create_model_card=False)  # the card: model_card()

    def model_card(self, metrics: dict | None = None, training: dict | None = None) -> str:
        return default_model_card(self, metrics=metrics, training=training)


USAGE = """from routers.retriever import RetrieverRouter
r = RetrieverRouter.from_pretrained("path/to/this/dir")
r.retrieve(question, r.build_index(episode.steps), k=5)   # [(step_id, cosine), ...]
# or: SentenceTransformer("path/to/this/dir"); or HybridRetriever(encoder="path/to/this/dir")
# on a corpus it was not trained on: HybridRetriever(encoder="path/to/this/dir", fusion="peak")  (per-query weight)"""


def sentence_transformers_card(model, base_id: str | None) -> str | None:
    """The card sentence-transformers generates for ``model`` (no Hub look-ups), or None when it cannot."""
    from routers.logs import get_logger

    try:
        try:
            from sentence_transformers.base.model_card import generate_model_card  # sentence-transformers >= 6
        except ImportError:
            from sentence_transformers.model_card import generate_model_card
        data = model.model_card_data
        data.local_files_only = True  # no model_info / dataset_info calls from a library card
        data.base_model = base_id
        return generate_model_card(model)
    except Exception as err:  # noqa: BLE001 - the card is documentation; the export must not fail over it
        get_logger(__name__).warning("sentence-transformers model card skipped: %s", err)
        return None


def default_model_card(router: RetrieverRouter, metrics: dict | None = None, training: dict | None = None) -> str:
    """sentence-transformers' own card with memroute's metadata merged in and a memroute section appended."""
    from routers import cards

    cfg = router.config
    title = "Router-Mem evidence retriever"
    description = "\n".join([
        "A sentence encoder fine-tuned with multi-positive InfoNCE on evidence labels: for a question about",
        "an agent's memory (ordered steps), the evidence steps (and windows containing them) are pulled",
        "towards the question, semantically related non-evidence steps are pushed away. It is the dense",
        "half of the Router-Mem fast retrieval prefix."])
    details = [f"- embedding dim {router.dim}, L2-normalized; steps embedded as `{cfg.step_format}`",
               f"- max sequence length {cfg.max_seq_length}; training temperature T = {cfg.temperature}"]
    tags = ("router-mem", "memory-retrieval", "contrastive")
    st_card = sentence_transformers_card(router.model, cards.hub_model_id(cfg.base_model))
    if st_card is None:
        return cards.build_card("retriever", title=title, description=description, usage=USAGE, details=details,
                                base_model=cfg.base_model, training=training, metrics=metrics,
                                library_name="sentence-transformers", extra_tags=tags)
    from routers.base import model_card_json_sections

    section = "\n".join([f"# memroute: {title}", "", description, "", "```python", USAGE, "```", "", *details,
                         *model_card_json_sections(training, metrics), "", "## Data and licenses", "",
                         cards.data_text(cards.training_corpora("retriever", training),
                                         cards.hub_model_id(cfg.base_model))])
    return cards.merge_card(st_card, "retriever", section, cfg.base_model, training, metrics, extra_tags=tags)
