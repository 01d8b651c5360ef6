"""Per-question execution: which questions run, the models they run on (built lazily), and one question's
paths (prefix, router scores, fast, slow, RAG, long context), each stage timed.

Nothing here derives a row or writes an output but the cache records (:func:`run_missing`).
"""

from __future__ import annotations

import time

from tqdm.auto import tqdm

from data_synthesis.corpora import sample_qa
from eval.judge import judge_answers
from eval.progressive.cache import RECORD_VERSION, base_router_spec, build_key, question_key
from eval.progressive.config import BASE, PATHS, TRAINED, ProgressiveEvalConfig, is_none
from routers.text import token_f1
from routers.memory.retrieval import HybridRetriever, render_context
from routers.backends import TransformersBackend, make_backend
from routers.logs import get_logger
from routers.models import resolve_causal_lm
from routers.progressive import (ProgressiveConfig, ProgressiveExecutor, answer_messages, counter_for,
                                 generate_with_retries)
from routers.sufficiency import SufficiencyRouter

log = get_logger(__name__)


def select_questions(cfg: ProgressiveEvalConfig, episodes) -> dict[str, list[tuple]]:
    """{"dev": [(episode, qa)], "test": [...]}: a seeded sample of each listed episode's questions."""
    by_id = {e.episode_id: e for e in episodes}
    missing = [e for e in cfg.dev_episodes + cfg.test_episodes if e not in by_id]
    if missing:
        raise ValueError(f"episodes {missing} not in corpus {cfg.corpus!r} (it has {sorted(by_id)[:12]}"
                         f"{' ...' if len(by_id) > 12 else ''})")
    out = {}
    for split, ids in (("dev", cfg.dev_episodes), ("test", cfg.test_episodes)):
        cap = cfg.max_questions_per_episode
        out[split] = [(by_id[e], qa) for e in ids for qa in sample_qa(by_id[e], cap, cfg.seed)]
    if not out["dev"]:
        raise ValueError(f"dev_episodes {cfg.dev_episodes} of corpus {cfg.corpus!r} hold no questions: nothing "
                         "to choose tau on")
    if cfg.test_episodes and not out["test"]:
        raise ValueError(f"test_episodes {cfg.test_episodes} of corpus {cfg.corpus!r} hold no questions "
                         "(use --test_episodes none for a dev-only run)")
    return out


# -- one question ------------------------------------------------------------------------------------------
def _scored(path: dict, gold: str) -> dict:
    path["f1"] = token_f1(path["answer"], gold)
    return path


def question_record(executor, routers: dict, rag_retriever, episode, qa, cfg: ProgressiveEvalConfig,
                    judge_generate=None) -> dict:
    """Run both paths and the baselines for one question; every stage timed. Raises on backend failure."""
    question, gold = qa.question, qa.answer
    pre = executor.prefix(question, episode)
    scores = {}
    for name, router in routers.items():
        s, t = executor.route(question, pre.context, router)
        scores[name] = {"score": s, "seconds": t}
    fast = executor.fast(question, pre)
    slow = executor.slow(question, episode, pre)

    t0 = time.perf_counter()
    rag_hits = rag_retriever.retrieve(question, episode, cfg.rag_k)
    rag_s = time.perf_counter() - t0
    rag = executor.answer(question, lambda kept: "\n".join(s.render() for s in kept), [h.step for h in rag_hits])

    t0 = time.perf_counter()
    newest_first = list(reversed(episode.steps))
    _, kept = executor.fit(lambda ks: answer_messages(question, render_context(ks)), newest_first,
                           executor.config.answer_max_new_tokens)
    long_steps = newest_first[:kept]
    long_s = time.perf_counter() - t0
    long = executor.answer(question, render_context, long_steps)

    rec = {
        "prefix": {"hits": pre.hit_ids, "seconds": pre.seconds},
        "routers": scores,
        "fast": _scored({"answer": fast.answer, "seconds": fast.seconds, "units_dropped": fast.units_dropped}, gold),
        "slow": _scored({"anchor_blocks": slow.anchor_blocks, "blocks": slow.blocks, "notes": slow.notes,
                         "n_pieces": slow.n_pieces, "window_splits": slow.window_splits,
                         "truncated_steps": slow.truncated_steps, "blocks_s": slow.blocks_s,
                         "aggregate_s": slow.aggregate_s, "answer": slow.answer.answer,
                         "seconds": slow.answer.seconds, "units_dropped": slow.answer.units_dropped}, gold),
        "rag": _scored({"hits": [h.step.step_id for h in rag_hits], "retrieve_s": rag_s, "answer": rag.answer,
                        "seconds": rag.seconds, "units_dropped": rag.units_dropped}, gold),
        "long_context": _scored({"build_s": long_s, "steps_kept": len(long_steps),
                                 "steps_dropped": len(episode.steps) - len(long_steps),
                                 "answer": long.answer, "seconds": long.seconds}, gold),
    }
    if judge_generate is not None:
        verdicts, replies = judge_answers(judge_generate, [(question, gold, rec[p]["answer"]) for p in PATHS])
        for p, v, r in zip(PATHS, verdicts, replies):
            rec[p]["judge"], rec[p]["judge_reply"] = v, r
    return rec


# -- the models, built only when needed --------------------------------------------------------------------
def _make_backend(spec: str, cfg: ProgressiveEvalConfig):
    if spec.startswith("openai:"):
        return make_backend(spec, timeout=cfg.http_timeout, max_retries=cfg.max_retries, backoff=cfg.retry_backoff,
                            concurrency=cfg.http_concurrency)
    return make_backend(spec, batch_size=cfg.batch_size, device=cfg.device, max_input_tokens=cfg.model_window)


def _load_routers(cfg: ProgressiveEvalConfig, backend) -> dict:
    """Base (untrained) and trained sufficiency routers; the base shares the answer model when it is the same."""
    base = base_router_spec(cfg)
    routers = {}
    if base is not None:
        if isinstance(backend, TransformersBackend) and resolve_causal_lm(backend.model_name) == resolve_causal_lm(
                base):
            model, tok = backend._load()  # no public accessor for the backend's loaded model (see routers.models)
            routers[BASE] = SufficiencyRouter.from_model(model, tok, base_model=base)
        elif str(base).startswith("openai:"):
            raise ValueError("the router needs local weights (next-token probabilities): set --router_base to a "
                             "model name or path, or 'none'")
        else:
            routers[BASE] = SufficiencyRouter.from_base(base, device=cfg.device)
    if cfg.router:
        routers[TRAINED] = SufficiencyRouter.from_pretrained(cfg.router, device=cfg.device)
    return routers


def _executor_config(cfg: ProgressiveEvalConfig) -> ProgressiveConfig:
    return ProgressiveConfig(top_k=cfg.top_k, block_size=cfg.block_size, block_overlap=cfg.block_overlap,
                             neighbours=cfg.neighbours, max_blocks=cfg.max_blocks, model_window=cfg.model_window,
                             answer_max_new_tokens=cfg.answer_max_new_tokens,
                             note_max_new_tokens=cfg.note_max_new_tokens, aggregate=cfg.aggregate,
                             aggregate_max_new_tokens=cfg.aggregate_max_new_tokens, max_retries=cfg.max_retries,
                             retry_backoff=cfg.retry_backoff)


class LazyModels:
    """Backends, routers and retrievers, built only when some question is not cached yet."""

    def __init__(self, cfg: ProgressiveEvalConfig, backend=None, routers=None, retriever=None, rag_retriever=None,
                 judge=None, counter=None):
        self.cfg = cfg
        self._given = dict(backend=backend, routers=routers, retriever=retriever, rag_retriever=rag_retriever,
                           judge=judge, counter=counter)
        self.executor = None
        self.routers = None
        self.rag_shares_index = False

    def load_routers(self) -> dict:
        """Only the routers (to score cached questions for a new router), or those of :meth:`load`."""
        if self.routers is None:
            given = self._given["routers"]
            self.routers = given if given is not None else _load_routers(self.cfg, None)
        return self.routers

    def build_rag(self, episode):
        """The RAG index; with the prefix's encoder it is the prefix index itself (same BM25 and embeddings,
        only the mixing weight differs), so nothing is encoded twice."""
        if self.rag_shares_index:
            # HybridRetriever has no public way to share a built index (see routers.memory.retrieval)
            built = self.executor.retriever._index.get(episode.episode_id)
            if built is not None:
                self.rag._index.setdefault(episode.episode_id, built)
        self.rag.step_embeddings(episode)

    def _rag_retriever(self, retriever):
        cfg, given = self.cfg, self._given["rag_retriever"]
        if given is not None:
            return given
        if is_none(cfg.rag_encoder):
            return HybridRetriever(encoder="none", dense_weight=0.0)
        if cfg.rag_encoder == cfg.encoder and retriever.encoder is not None:
            rag = HybridRetriever(encoder=retriever.encoder, dense_weight=1.0)
            self.rag_shares_index = True
            return rag
        return HybridRetriever(encoder=cfg.rag_encoder, dense_weight=1.0)

    def load(self):
        if self.executor is not None:
            return self
        cfg, g = self.cfg, self._given
        backend = g["backend"] if g["backend"] is not None else _make_backend(cfg.answer_model, cfg)
        retriever = g["retriever"] or HybridRetriever(encoder=cfg.encoder, dense_weight=cfg.dense_weight,
                                                         fusion=cfg.fusion)
        rag = self._rag_retriever(retriever)
        if self.routers is None:
            self.routers = g["routers"] if g["routers"] is not None else _load_routers(cfg, backend)
        counter = g["counter"] or counter_for(backend, cfg.tokenizer)
        self.executor = ProgressiveExecutor(retriever, backend, None, _executor_config(cfg), counter)
        self.rag = rag
        judge = g["judge"]
        if judge is None and not is_none(cfg.judge):
            judge = backend if cfg.judge == "answer" else _make_backend(cfg.judge, cfg)
        self.judge_generate = None
        if judge is not None:
            self.judge_generate = lambda convs, n: generate_with_retries(judge, convs, n, cfg.max_retries,
                                                                         cfg.retry_backoff)
        return self


# -- every question missing from the cache -----------------------------------------------------------------
def _write_build(writer, cache: dict, models: LazyModels, split: str, ep, h: str) -> None:
    """The episode's index-construction record (prefix and RAG build times), once per split and episode."""
    ex = models.executor
    bkey = build_key(split, ep.episode_id, h)
    if bkey in writer:
        return
    t_prefix = ex.build(ep)
    t0 = time.perf_counter()
    models.build_rag(ep)
    rag_s = t_prefix if models.rag_shares_index else time.perf_counter() - t0
    rec = {"key": bkey, "kind": "build", "split": split, "episode_id": ep.episode_id,
           "prefix_build_s": t_prefix, "rag_build_s": rag_s, "rag_shares_prefix_index":
           models.rag_shares_index, "n_steps": len(ep.steps), "n_blocks": len(ex.views(ep).blocks)}
    writer.write(rec)
    cache[bkey] = rec


def run_missing(cfg: ProgressiveEvalConfig, selection, h: str, rids: dict, models: LazyModels, writer,
                cache: dict, failures: dict[str, list[dict]]) -> int:
    """Run every selected question not in the cache, appending build and question records to ``writer`` (and
    ``cache``); a failing question goes to ``failures[split]`` and the run goes on. Returns how many ran."""
    computed = 0
    todo = [(split, ep, qa) for split, pairs in selection.items() for ep, qa in pairs
            if question_key(split, qa.qa_id, h) not in writer]
    if todo:
        models.load()
        log.info("%d question(s) to run, %d cached", len(todo), sum(len(p) for p in selection.values()) - len(todo))
    for split, ep, qa in tqdm(todo, desc="progressive eval", unit="q", disable=not todo):
        ex = models.executor
        _write_build(writer, cache, models, split, ep, h)
        ex.build(ep)
        models.build_rag(ep)
        key = question_key(split, qa.qa_id, h)
        try:
            body = question_record(ex, models.routers, models.rag, ep, qa, cfg, models.judge_generate)
        except Exception as err:  # noqa: BLE001 - a failed question is counted and the run goes on
            failures[split].append({"split": split, "qa_id": qa.qa_id, "episode_id": ep.episode_id,
                                    "error": f"{type(err).__name__}: {err}"})
            log.warning("%s failed: %s: %s", qa.qa_id, type(err).__name__, err)
            continue
        for name, entry in body["routers"].items():
            entry["router_id"] = rids.get(name)
        rec = {"key": key, "kind": "question", "record_version": RECORD_VERSION, "config_hash": h, "split": split,
               "episode_id": ep.episode_id, "qa_id": qa.qa_id, "category": qa.category, "question": qa.question,
               "gold": qa.answer, "empty_memory": not ep.steps, **body}
        writer.write(rec)
        cache[key] = rec
        computed += 1
    return computed
