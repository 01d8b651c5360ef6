"""The dense memory index (routers/memory/index.py) and its benchmark's shape (never its timings)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from routers.memory.index import VectorIndex, l2_normalize, top_k


def brute_force(emb: np.ndarray, ids: list[str], q: np.ndarray, k: int):
    """Reference: normalize, score every row, sort by (-score, insertion order)."""
    e = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    qn = q / np.linalg.norm(q)
    scores = [(-float(np.dot(row, qn)), i) for i, row in enumerate(e)]
    scores.sort()
    return [ids[i] for _, i in scores[:k]], [-s for s, _ in scores[:k]]


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((500, 16)).astype(np.float32)
    emb[100] = emb[7] * 3.0  # same direction as row 7: an exact tie after normalization
    return emb, [f"s{i}" for i in range(500)], rng.standard_normal((20, 16)).astype(np.float32)


def test_exact_search_matches_brute_force(data):
    emb, ids, queries = data
    index = VectorIndex.from_embeddings(ids, emb)
    assert len(index) == 500 and index.dim == 16
    np.testing.assert_allclose(np.linalg.norm(index.embeddings, axis=1), 1.0, rtol=1e-6)
    found, scores = index.search(queries, k=10)
    assert found.shape == scores.shape == (20, 10)
    for q, f, s in zip(queries, found, scores):
        ref_ids, ref_scores = brute_force(emb, ids, q, 10)
        assert list(f) == ref_ids
        np.testing.assert_allclose(s, ref_scores, rtol=1e-5, atol=1e-6)
    # the tie: querying with row 7 returns s7 before s100 (insertion order), both at cosine 1
    f, s = index.search(emb[7], k=2)
    assert list(f) == ["s7", "s100"] and s[0] == pytest.approx(1.0, abs=1e-5) and s[0] == s[1]


def test_top_k_tie_breaking():
    s = np.array([[0.5, 0.9, 0.5, 0.9, 0.1, 0.5]])
    assert top_k(s, 3).tolist() == [[1, 3, 0]]
    assert top_k(s, 4).tolist() == [[1, 3, 0, 2]]
    assert top_k(s, 10).tolist() == [[1, 3, 0, 2, 5, 4]]
    assert top_k(s, 0).shape == (1, 0)


def test_incremental_add_equals_one_add(data):
    emb, ids, queries = data
    once = VectorIndex.from_embeddings(ids, emb)
    inc = VectorIndex()
    for start in (0, 1, 70, 333):
        end = {0: 1, 1: 70, 70: 333, 333: 500}[start]
        inc.add(ids[start:end], emb[start:end])
    inc.add([], np.zeros((0, 16)))
    assert inc.ids == ids and len(inc) == 500
    np.testing.assert_array_equal(inc.embeddings, once.embeddings)
    for a, b in zip(inc.search(queries, 7), once.search(queries, 7)):
        np.testing.assert_array_equal(a, b)
    # new rows are searchable right away
    inc.add(["new"], queries[0] * 5)
    assert inc.search(queries[0], 1)[0][0] == "new" and "new" in inc
    np.testing.assert_allclose(inc.get("new"), l2_normalize(queries[0][None])[0], rtol=1e-6)


def test_save_load_round_trip(data, tmp_path):
    emb, ids, queries = data
    index = VectorIndex.from_embeddings(ids, emb)
    path = index.save(tmp_path / "idx")
    assert {p.name for p in path.iterdir()} == {"embeddings.npy", "ids.json", "index.json"}
    meta = json.loads((path / "index.json").read_text())
    assert meta["count"] == 500 and meta["dim"] == 16 and meta["format"] == "memroute.vector_index"
    loaded = VectorIndex.load(path)
    assert loaded.ids == ids
    np.testing.assert_array_equal(loaded.embeddings, index.embeddings)
    for a, b in zip(loaded.search(queries, 10), index.search(queries, 10)):
        np.testing.assert_array_equal(a, b)
    loaded.add(["x"], emb[:1])  # a loaded index keeps growing
    assert len(loaded) == 501
    mm = VectorIndex.load(path, mmap=True)
    np.testing.assert_array_equal(mm.search(queries, 3)[0], index.search(queries, 3)[0])
    # saving again replaces atomically; no temporary directories are left behind
    loaded.save(path)
    assert len(VectorIndex.load(path)) == 501
    assert [p.name for p in tmp_path.iterdir()] == ["idx"]


def test_failed_save_keeps_the_previous_index(data, tmp_path, monkeypatch):
    emb, ids, _ = data
    VectorIndex.from_embeddings(ids[:5], emb[:5]).save(tmp_path / "idx")
    big = VectorIndex.from_embeddings(ids, emb)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(np, "save", boom)
    with pytest.raises(OSError):
        big.save(tmp_path / "idx")
    monkeypatch.undo()
    assert len(VectorIndex.load(tmp_path / "idx")) == 5
    assert [p.name for p in tmp_path.iterdir()] == ["idx"]


def test_bad_inputs(data, tmp_path):
    emb, ids, _ = data
    index = VectorIndex.from_embeddings(ids[:3], emb[:3])
    with pytest.raises(ValueError, match="duplicate"):
        index.add(["s0"], emb[:1])
    with pytest.raises(ValueError, match="duplicate"):
        index.add(["a", "a"], emb[:2])
    with pytest.raises(ValueError, match="dim"):
        index.add(["z"], np.zeros((1, 8)))
    with pytest.raises(ValueError, match="shape"):
        index.add(["z", "y"], emb[:1])
    with pytest.raises(ValueError, match="NaN"):
        index.add(["z"], np.full((1, 16), np.nan))
    with pytest.raises(ValueError, match="query dim"):
        index.search(np.zeros(8), 1)
    assert len(index) == 3  # failed adds change nothing
    empty = VectorIndex(dim=16)
    f, s = empty.search(emb[:2], 5)
    assert f.shape == (2, 0) and s.shape == (2, 0)
    f, s = index.search(emb[0], 50)  # k > size
    assert len(f) == 3
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "index.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a memroute vector index"):
        VectorIndex.load(tmp_path / "junk")
    with pytest.raises(ValueError):
        VectorIndex(backend="annoy")


def test_faiss_backend_agrees(data):
    pytest.importorskip("faiss")
    emb, ids, queries = data
    a = VectorIndex.from_embeddings(ids, emb, backend="faiss")
    b = VectorIndex.from_embeddings(ids, emb)
    np.testing.assert_array_equal(a.search(queries, 10)[0], b.search(queries, 10)[0])


def test_index_benchmark_layout():
    """The index benchmark's result on a small memory: same figure layout as eval/bench.py (no timing asserts)."""
    from eval.bench.retrieval import bench_index_latency, python_brute_force

    res = bench_index_latency(n_steps=300, dim=16, n_queries=2, seed=1)
    assert res["benchmark"] == "index_latency" and res["index"]["steps"] == 300
    assert res["query_latency"]["results_agree"] == "2/2"
    assert {f["name"] for f in res["figures"]} == {"query_latency_p50", "query_latency_p50_vs_budget", "index_add_time"}
    for f in res["figures"]:
        assert f["value"] > 0 and f["baseline"] > 0
        expected = f["value"] / f["baseline"] if f["ratio_definition"] == "value/baseline" else f["baseline"] / f["value"]
        assert math.isclose(f["ratio"], expected, rel_tol=1e-12)
        assert isinstance(f["meets_target"], bool)
    budget = next(f for f in res["figures"] if f["name"] == "query_latency_p50_vs_budget")
    assert budget["baseline"] == 0.005
    assert isinstance(res["meets_target"], bool) and res["target"]
    assert res["indexing"]["vectors_per_s"] > 0
    # the Python baseline is a correct brute force
    rng = np.random.default_rng(3)
    emb = rng.standard_normal((50, 8))
    q = rng.standard_normal(8)
    ids = [str(i) for i in range(50)]
    got, _ = python_brute_force(l2_normalize(emb).tolist(), ids, q.tolist(), 5)
    assert got == brute_force(emb, ids, q, 5)[0]
