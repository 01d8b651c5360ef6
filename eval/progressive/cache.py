"""What a cached record is keyed by, and reusing cached questions for new routers.

Question records (``records.jsonl``) are keyed by split, question id and :func:`config_hash`: a hash of the
settings that change a question's paths. Router scores are keyed apart, by the router's identity
(:func:`router_ids`: model spec + a fingerprint of its folder), so a new or retrained router reuses every
cached path and only scores C_f (:func:`score_new_routers`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from eval.progressive.config import BASE, TRAINED, ProgressiveEvalConfig, is_none
from routers.base import ROUTER_CONFIG, RouterConfigError, check_router_dir
from routers.memory.retrieval import render_context
from routers.logs import get_logger
from routers.progressive import PROMPT_VERSION, route_score

log = get_logger(__name__)

RECORD_VERSION = 2  # 2: router scores carry router_id; routers are not in the path hash
HASHED = ("corpus", "corpus_path", "answer_model", "tokenizer", "encoder", "rag_encoder",
          "dense_weight", "top_k", "rag_k", "block_size", "block_overlap", "neighbours", "max_blocks", "model_window",
          "answer_max_new_tokens", "note_max_new_tokens", "aggregate", "aggregate_max_new_tokens", "judge")


def _fingerprint(path) -> list | None:
    """(name, size, mtime) of the files directly inside a local model folder; None for ids and aliases."""
    if is_none(path) or not Path(str(path)).is_dir():
        return None
    return sorted((p.name, p.stat().st_size, int(p.stat().st_mtime)) for p in Path(str(path)).iterdir() if p.is_file())


def _sha(payload) -> str:
    return hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


def config_hash(cfg: ProgressiveEvalConfig) -> str:
    """Hash of everything that changes a question's paths (not the routers, taus, splits or output paths):
    the prefix, fast / slow / RAG / long-context answers and their times. Router scores are keyed apart
    (:func:`router_ids`), so evaluating another router reuses every cached path and only scores C_f."""
    payload = {k: getattr(cfg, k) for k in HASHED}
    if cfg.fusion != "minmax":  # added later: the default leaves every existing cache's hash as it was
        payload["fusion"] = cfg.fusion
    payload.update(prompt_version=PROMPT_VERSION, record_version=RECORD_VERSION)
    # A model retrained into the same folder must not reuse the old records: fingerprint local folders.
    payload["files"] = {k: _fingerprint(getattr(cfg, k)) for k in ("encoder", "answer_model")}
    return _sha(payload)


def base_router_spec(cfg: ProgressiveEvalConfig) -> str | None:
    """The untrained router's model: router_base, else the trained router's base_model, else the answer model."""
    base = cfg.router_base
    if base is None and cfg.router:
        base = check_router_dir(cfg.router, "sufficiency").get("base_model")
        if base is not None and not isinstance(base, str):
            raise RouterConfigError(f"{Path(cfg.router) / ROUTER_CONFIG}: base_model must be a string, got "
                                    f"{base!r:.60} (pass --router_base)")
    if base is None:
        base = cfg.answer_model
    return None if is_none(base) else base


def router_ids(cfg: ProgressiveEvalConfig, names=None) -> dict[str, str]:
    """name -> identity of each router this run scores (model spec + a fingerprint of a local folder).

    ``names`` are the routers actually present (tests inject their own); by default the config's."""
    specs = {BASE: base_router_spec(cfg), TRAINED: None if is_none(cfg.router) else cfg.router}
    if names is None:
        names = [n for n, spec in specs.items() if spec is not None]
    return {n: _sha([n, specs.get(n), _fingerprint(specs.get(n))]) for n in names}


def question_key(split: str, qa_id: str, h: str) -> str:
    """Cache key of one question's record (its paths, under the path hash ``h``)."""
    return f"{split}|{qa_id}|{h}"


def build_key(split: str, episode_id: str, h: str) -> str:
    """Cache key of one episode's index-construction record."""
    return f"build|{split}|{episode_id}|{h}"


def _route_key(split: str, qa_id: str, h: str, rid: str) -> str:
    return f"route|{split}|{qa_id}|{h}|{rid}"


def _cached_score(cache: dict, rec: dict, name: str, rid: str, h: str) -> dict | None:
    """This router's score for a cached question: in the question record when it was computed with it,
    else in a ``route`` record added later; None when neither exists."""
    entry = rec["routers"].get(name)
    if entry is not None and entry.get("router_id") == rid:
        return entry
    return cache.get(_route_key(rec["split"], rec["qa_id"], h, rid))


def with_routers(cache: dict, rec: dict, rids: dict, h: str) -> dict:
    """The question record with exactly this run's routers (a cached record may hold others)."""
    scores = {name: _cached_score(cache, rec, name, rid, h) for name, rid in rids.items()}
    return {**rec, "routers": {n: {"score": e["score"], "seconds": e["seconds"], "router_id": rids[n]}
                               for n, e in scores.items() if e is not None}}


def score_new_routers(selection, cache: dict, writer, models, rids: dict, h: str) -> int:
    """Score C_f with every router that a cached question has no score for; the paths are reused as they are
    (C_f is rebuilt exactly from the cached hit ids). ``models`` is the run's
    :class:`~eval.progressive.execute.LazyModels` (only its routers are loaded). Returns how many scores
    were added."""
    todo = []
    for split, pairs in selection.items():
        for ep, qa in pairs:
            rec = cache.get(question_key(split, qa.qa_id, h))
            if rec is not None:
                todo += [(ep, rec, n, rid) for n, rid in rids.items() if _cached_score(cache, rec, n, rid, h) is None]
    if not todo:
        return 0
    routers = models.load_routers()
    log.info("scoring %d cached question(s) with new router(s); paths reused", len(todo))
    steps = {}  # episode id -> {step id: step}, built once per episode
    for ep, rec, name, rid in todo:
        by_id = steps.setdefault(ep.episode_id, {st.step_id: st for st in ep.steps})
        s, t = route_score(routers[name], rec["question"], render_context([by_id[i] for i in rec["prefix"]["hits"]]))
        route = {"key": _route_key(rec["split"], rec["qa_id"], h, rid), "kind": "route", "split": rec["split"],
                 "qa_id": rec["qa_id"], "router": name, "router_id": rid, "score": s, "seconds": t}
        writer.write(route)
        cache[route["key"]] = route
    return len(todo)
