"""Aligned views (steps <-> overlapping blocks) and the hybrid BM25 + dense retrieval prefix (DESIGN §5)."""

from __future__ import annotations

import random
import string

import numpy as np
import pytest

from routers.memory.retrieval import HybridRetriever, render_context, tokenize
from routers.memory.schema import Episode, Step
from routers.memory.views import AlignedViews

WORDS = ["apple", "river", "mountain", "guitar", "window", "planet", "coffee", "garden", "silver", "rocket",
         "violin", "desert", "forest", "engine", "marble", "pepper", "castle", "bridge", "candle", "falcon"]


def make_episode(n: int = 20, texts: list[str] | None = None, episode_id: str = "ep") -> Episode:
    texts = texts or [f"note about {WORDS[i % len(WORDS)]}" for i in range(n)]
    return Episode(episode_id, [Step(step_id=f"s{i}", index=i, text=t) for i, t in enumerate(texts)])


# -- AlignedViews ------------------------------------------------------------------------------------
def test_blocks_default_8_2():
    views = AlignedViews(make_episode(20), block_size=8, overlap=2)
    assert [(b.block_id, b.start, b.end) for b in views.blocks] == [(0, 0, 8), (1, 6, 14), (2, 12, 20)]
    assert views.blocks[1].step_ids == [f"s{i}" for i in range(6, 14)]
    expected = {}
    for i in range(20):
        expected[f"s{i}"] = ([0] if i < 8 else []) + ([1] if 6 <= i < 14 else []) + ([2] if i >= 12 else [])
    assert views.step_to_blocks == expected
    assert views.step_to_blocks["s7"] == [0, 1] and views.step_to_blocks["s12"] == [1, 2]
    assert views.step_to_blocks["s19"] == [2]


@pytest.mark.parametrize("size, overlap, bounds", [
    (5, 0, [(0, 5), (5, 10), (10, 15), (15, 20)]),
    (7, 3, [(0, 7), (4, 11), (8, 15), (12, 19), (16, 20)]),
    (6, 0, [(0, 6), (6, 12), (12, 18), (18, 20)]),
    (20, 5, [(0, 20)]),
    (30, 29, [(0, 20)]),
    (3, 2, [(i, i + 3) for i in range(18)]),
])
def test_block_boundaries(size, overlap, bounds):
    views = AlignedViews(make_episode(20), block_size=size, overlap=overlap)
    assert [(b.start, b.end) for b in views.blocks] == bounds
    assert [b.block_id for b in views.blocks] == list(range(len(bounds)))
    # every step is covered, and each block's ids match its slice
    assert all(views.step_to_blocks[f"s{i}"] for i in range(20))
    for b in views.blocks:
        assert b.step_ids == [f"s{i}" for i in range(b.start, b.end)]
        assert [s.step_id for s in views.block_steps(b.block_id)] == b.step_ids
    # consecutive blocks share exactly `overlap` steps (except a shorter final block)
    for a, b in zip(views.blocks, views.blocks[1:]):
        assert a.end - b.start == overlap


def test_blocks_for_steps_and_block_steps():
    views = AlignedViews(make_episode(20), block_size=8, overlap=2)
    assert views.blocks_for_steps(["s13", "s0", "s7", "unknown"]) == [0, 1, 2]
    assert views.blocks_for_steps(["s9", "s10"]) == [1]
    assert views.blocks_for_steps([]) == []
    assert [s.index for s in views.block_steps(2)] == list(range(12, 20))
    assert views.steps is views.episode.steps


def test_empty_episode_has_no_blocks():
    views = AlignedViews(Episode("empty", []), block_size=4, overlap=1)
    assert views.blocks == [] and views.step_to_blocks == {}


@pytest.mark.parametrize("size, overlap", [(0, 0), (-1, 0), (4, 4), (4, 5), (4, -1), (1, 1)])
def test_bad_block_params(size, overlap):
    with pytest.raises(ValueError, match="block_size"):
        AlignedViews(make_episode(20), block_size=size, overlap=overlap)


# -- HybridRetriever ---------------------------------------------------------------------------------
class BagOfLetters:
    """A deterministic stand-in for a sentence encoder: unit vectors of letter counts."""

    def __init__(self):
        self.calls: list[list[str]] = []

    @staticmethod
    def vector(text: str) -> np.ndarray:
        v = np.zeros(26)
        for ch in text.lower():
            if ch in string.ascii_lowercase:
                v[ord(ch) - 97] += 1
        n = np.linalg.norm(v)
        return v / n if n else v

    def encode(self, texts, batch_size=32, normalize_embeddings=False, convert_to_numpy=True,
               show_progress_bar=False):
        assert normalize_embeddings and convert_to_numpy and not show_progress_bar
        self.calls.append(list(texts))
        return np.stack([self.vector(t) for t in texts])


def test_tokenize_drops_stopwords():
    assert tokenize("What is the Zebra's name, and where did it go in 2023?") == ["zebra", "s", "name", "go", "2023"]


def test_bm25_only_needs_no_encoder():
    ep = make_episode(20)
    r = HybridRetriever(encoder=None, dense_weight=0.0)
    assert r.encoder is None and r.dense_weight == 0.0
    hits = r.retrieve("where is the guitar", ep, k=3)
    assert hits[0].step.step_id == "s3"  # 'guitar'
    assert hits[0].score == pytest.approx(1.0) and hits[0].bm25 > 0 and hits[0].dense == 0.0
    assert all(h.score == 0.0 for h in hits[1:])
    assert [h.step.step_id for h in hits[1:]] == ["s0", "s1"]  # ties broken by temporal order
    assert r.step_embeddings(ep) is None


def test_bm25_ranking_and_k():
    texts = ["the cat sat", "a dog barked at the mailman", "the falcon flew over the castle",
             "castle walls", "falcon", "nothing relevant here"]
    ep = make_episode(texts=texts)
    r = HybridRetriever(dense_weight=0.0)
    hits = r.retrieve("falcon castle", ep, k=10)
    assert len(hits) == len(texts)
    assert hits[0].step.step_id == "s2"  # both terms
    assert {h.step.step_id for h in hits[1:3]} == {"s3", "s4"}
    assert [h.score for h in hits] == sorted([h.score for h in hits], reverse=True)
    assert [h.step.step_id for h in r.retrieve("falcon castle", ep, k=2)] == [h.step.step_id for h in hits[:2]]
    # a query with no content words scores everything 0 and returns temporal order
    assert [h.step.step_id for h in r.retrieve("what is the", ep, k=3)] == ["s0", "s1", "s2"]


def test_empty_episode_retrieval():
    r = HybridRetriever(dense_weight=0.0)
    assert r.retrieve("anything", Episode("e0", []), k=5) == []


def _minmax(x):
    x = np.asarray(x, dtype=np.float64)
    return np.zeros_like(x) if x.max() - x.min() < 1e-12 else (x - x.min()) / (x.max() - x.min())


def test_hybrid_mixes_lexical_and_dense():
    texts = ["yesterday a zebra walked slowly past our long wooden fence", "arbez",
             "completely unrelated words", "more filler text", "another line"]
    ep = make_episode(texts=texts)
    query = "zebra"
    enc = BagOfLetters()

    lexical = HybridRetriever(encoder=enc, dense_weight=0.0)
    assert lexical.retrieve(query, ep, k=1)[0].step.step_id == "s0"
    dense = HybridRetriever(encoder=enc, dense_weight=1.0)
    assert dense.retrieve(query, ep, k=1)[0].step.step_id == "s1"  # same letters, no shared token

    hybrid = HybridRetriever(encoder=enc, dense_weight=0.5, batch_size=7)
    mixed, lex, dns = hybrid.scores(query, ep)
    exp_dense = np.array([BagOfLetters.vector(s.render()) @ BagOfLetters.vector(query) for s in ep.steps])
    np.testing.assert_allclose(dns, exp_dense, atol=1e-12)
    assert lex[0] > 0 and np.all(lex[1:] == 0)
    np.testing.assert_allclose(mixed, 0.5 * _minmax(lex) + 0.5 * _minmax(exp_dense), atol=1e-12)
    hits = hybrid.retrieve(query, ep, k=5)
    assert {hits[0].step.step_id, hits[1].step.step_id} == {"s0", "s1"}
    assert hits[0].score == pytest.approx(float(mixed.max()))
    # mixing changes the ranking relative to either retriever alone
    assert [h.step.step_id for h in hits] == ["s0", "s1", "s4", "s3", "s2"]
    assert [h.step.step_id for h in lexical.retrieve(query, ep, k=5)] == ["s0", "s1", "s2", "s3", "s4"]
    assert [h.step.step_id for h in dense.retrieve(query, ep, k=5)] == ["s1", "s0", "s4", "s3", "s2"]
    assert hits[1].score == pytest.approx(0.5)  # dense-only winner: 0.5 * 0 + 0.5 * 1

    w = 0.3
    weighted = HybridRetriever(encoder=enc, dense_weight=w)
    mixed_w, _, _ = weighted.scores(query, ep)
    np.testing.assert_allclose(mixed_w, (1 - w) * _minmax(lex) + w * _minmax(exp_dense), atol=1e-12)


def test_peak_weight_exact_values():
    """peak = (max - mean) / std; the dense weight is peak(dense) / (peak(BM25) + peak(dense)), 0.5 if both flat."""
    from routers.memory.retrieval import mix_scores, peak, peak_dense_weight

    lex, dense = np.array([3.0, 0.0, 0.0, 1.0]), np.array([0.2, 0.6, 0.4, 0.4])
    p_lex = (3.0 - 1.0) / np.sqrt(np.mean((lex - 1.0) ** 2))          # 2 / sqrt(1.5)
    p_dense = (0.6 - 0.4) / np.sqrt(np.mean((dense - 0.4) ** 2))      # 0.2 / sqrt(0.02)
    assert peak(lex) == pytest.approx(p_lex, abs=1e-12) and peak(dense) == pytest.approx(p_dense, abs=1e-12)
    w = p_dense / (p_lex + p_dense)
    assert peak_dense_weight(lex, dense) == pytest.approx(w, abs=1e-12)
    np.testing.assert_allclose(mix_scores(lex, dense, 0.5, "peak"), (1 - w) * _minmax(lex) + w * _minmax(dense), atol=1e-12)
    # the weight ignores dense_weight's value, but 0 still means BM25 alone
    np.testing.assert_allclose(mix_scores(lex, dense, 0.9, "peak"), mix_scores(lex, dense, 0.2, "peak"), atol=1e-12)
    np.testing.assert_allclose(mix_scores(lex, dense, 0.0, "peak"), _minmax(lex), atol=1e-12)
    flat = np.zeros(4)
    assert peak(flat) == 0.0 and peak(np.zeros(0)) == 0.0 and peak_dense_weight(flat, flat) == 0.5
    assert peak_dense_weight(flat, dense) == 1.0 and peak_dense_weight(lex, flat) == 0.0
    # scale-free: multiplying either list by a positive constant changes nothing
    assert peak_dense_weight(7 * lex, 0.1 * dense) == pytest.approx(w, abs=1e-12)
    with pytest.raises(ValueError, match="fusion"):
        mix_scores(lex, dense, 0.5, "rrf")
    with pytest.raises(ValueError, match="fusion"):
        HybridRetriever(encoder="none", fusion="max")


def test_peak_fusion_moves_the_weight_to_the_retriever_that_is_sure():
    """An id the question names and one step repeats: BM25's top stands far out, the dense list is flat, and the
    per-query weight goes to BM25, so that step wins where the fixed 0.5 picks the dense favourite; the mirror case
    (a paraphrase: flat BM25, one dense step far out) moves the weight to the dense encoder."""
    from routers.memory.retrieval import mix_scores, peak_dense_weight

    def top(x):
        return int(np.lexsort((np.arange(len(x)), -x))[0])

    lex = np.array([4.0, 2.0, 0, 0, 0, 0, 0, 0])
    dense = np.array([0.0, 1.0, 0.9, 0.85, 0.8, 0.85, 0.9, 0.8])
    assert top(mix_scores(lex, dense, 0.5)) == 1 and top(mix_scores(lex, dense, 0.5, "peak")) == 0
    assert peak_dense_weight(lex, dense) < 0.3
    lex2, dense2 = np.array([0.0, 1.0, 0.9, 0.85, 0.8, 0.85, 0.9, 0.8]), np.array([4.0, 2.0, 0, 0, 0, 0, 0, 0])
    assert top(mix_scores(lex2, dense2, 0.5)) == 1 and top(mix_scores(lex2, dense2, 0.5, "peak")) == 0
    assert peak_dense_weight(lex2, dense2) > 0.7


def test_hybrid_retriever_peak_fusion_scores():
    enc = BagOfLetters()
    ep = make_episode(texts=["order w7 shipped to the warehouse", "a reversed drow line", "filler words one",
                             "filler words two", "filler words three"])
    from routers.memory.retrieval import peak_dense_weight

    peaked = HybridRetriever(encoder=enc, dense_weight=0.5, fusion="peak")
    mixed, lex, dense = peaked.scores("w7 warehouse", ep)
    w = peak_dense_weight(lex, dense)
    assert 0 < w < 0.5  # one BM25 hit stands out more than the letter-count cosines do
    np.testing.assert_allclose(mixed, (1 - w) * _minmax(lex) + w * _minmax(dense), atol=1e-12)


def test_step_embeddings_cached_per_episode():
    enc = BagOfLetters()
    r = HybridRetriever(encoder=enc, dense_weight=0.5)
    ep = make_episode(6)
    r.retrieve("apple", ep)
    r.retrieve("river", ep)
    step_calls = [c for c in enc.calls if len(c) == 6]
    assert len(step_calls) == 1 and step_calls[0] == [s.render() for s in ep.steps]
    assert len(enc.calls) == 3  # one step encoding + one per query
    emb = r.step_embeddings(ep)
    assert emb.shape == (6, 26)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0)
    # a precomputed query embedding is used instead of encoding the query
    q = BagOfLetters.vector("apple")
    m1, _, _ = r.scores("apple", ep, query_embedding=q)
    assert len(enc.calls) == 3
    m2, _, _ = r.scores("apple", ep)
    np.testing.assert_allclose(m1, m2)


# -- render_context ----------------------------------------------------------------------------------
def test_render_context_restores_temporal_order():
    ep = Episode("e", [Step("D1:1", 0, "hi", speaker="Ann", timestamp="t0"),
                       Step("D1:2", 1, "hello", speaker="Bob", timestamp="t0"),
                       Step("D2:1", 2, "later"),
                       Step("D2:2", 3, "bye", speaker="Ann")])
    shuffled = [ep.steps[3], ep.steps[0], ep.steps[2]]
    assert render_context(shuffled) == "[D1:1] (t0) Ann: hi\n[D2:1] later\n[D2:2] Ann: bye"
    steps = list(make_episode(20).steps)
    random.Random(0).shuffle(steps)
    assert render_context(steps).splitlines() == [s.render() for s in make_episode(20).steps]
    assert render_context([]) == ""


def test_render_context_of_retrieved_hits():
    ep = make_episode(20)
    hits = HybridRetriever(dense_weight=0.0).retrieve("falcon apple rocket", ep, k=3)
    assert render_context([h.step for h in hits]) == "[s0] note about apple\n[s9] note about rocket\n[s19] note about falcon"
