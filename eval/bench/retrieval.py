"""``index_latency``: the dense memory index (``routers.memory.index.VectorIndex``) at 10k steps.

    memroute bench --which index_latency [--n_samples 50]

* **Query latency**: top-10 search, one query at a time, over a memory of ``INDEX_STEPS`` = 10,000
  L2-normalized 384-d vectors (all-MiniLM-L6-v2's size), against a brute-force pure-Python loop over
  the same vectors (Python lists; a dot product per stored step, then a sort). Targets: p50 <= 5 ms
  (reported as the figure ``query_latency_p50_vs_budget`` whose baseline is the 5 ms budget) and a
  speedup >= 10 over the loop.
* **Indexing throughput**: ``VectorIndex.add`` of the 10k vectors in batches of ``ADD_BATCH`` (vectors/s),
  against building the loop baseline's normalized Python lists.

The vectors are random (seeded) unit vectors: search cost does not depend on what they encode, and
the benchmark then needs no encoder. The timed call is ``index.search(query, k)`` including query
normalization and id lookup. The top-10 of both methods is compared (``results_agree``).
Figures use :func:`eval.bench.common.figure`, so the result has the same layout as every other benchmark.
"""

from __future__ import annotations

import operator
import time

import numpy as np

from eval.bench.common import figure, summarize, with_target
from routers.logs import get_logger
from routers.memory.index import VectorIndex

log = get_logger(__name__)

INDEX_STEPS = 10_000
DIM = 384
TOP_K = 10
ADD_BATCH = 256
LATENCY_BUDGET_S = 0.005


def python_normalize(rows: list[list[float]]) -> list[list[float]]:
    out = []
    for row in rows:
        norm = sum(x * x for x in row) ** 0.5 or 1.0
        out.append([x / norm for x in row])
    return out


def python_brute_force(vectors: list[list[float]], ids: list[str], query: list[float], k: int = TOP_K):
    """The baseline: a Python loop over every stored vector, then a sort (ties: earlier first)."""
    norm = sum(x * x for x in query) ** 0.5 or 1.0
    q = [x / norm for x in query]
    scored = []
    for i, v in enumerate(vectors):
        scored.append((-sum(map(operator.mul, v, q)), i))
    scored.sort()
    return [ids[i] for _, i in scored[:k]], [-s for s, _ in scored[:k]]


def bench_index_latency(cfg=None, records=None, device: str = "cpu", n_steps: int | None = None,
                        dim: int | None = None, n_queries: int | None = None, seed: int | None = None) -> dict:
    """Run the benchmark; ``cfg`` is a ``BenchConfig`` (``n_samples`` = queries timed on the Python
    baseline, ``seed``); the keyword arguments override it. ``records`` and ``device`` are unused."""
    n_steps = n_steps or getattr(cfg, "index_steps", INDEX_STEPS)
    dim = dim or DIM
    n_base = max(1, n_queries or getattr(cfg, "n_samples", 16))
    n_index = max(200, n_base)
    seed = seed if seed is not None else getattr(cfg, "seed", 0)
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n_steps, dim)).astype(np.float32)
    queries = rng.standard_normal((n_index + 1, dim)).astype(np.float32)
    ids = [f"s{i}" for i in range(n_steps)]

    # indexing throughput
    t0 = time.perf_counter()
    index = VectorIndex(dim=dim)
    for start in range(0, n_steps, ADD_BATCH):
        index.add(ids[start:start + ADD_BATCH], vectors[start:start + ADD_BATCH])
    add_s = time.perf_counter() - t0
    raw_lists = vectors.tolist()
    t0 = time.perf_counter()
    py_vectors = python_normalize(raw_lists)
    py_build_s = time.perf_counter() - t0

    # query latency: index
    index.search(queries[-1], TOP_K)  # warmup
    idx_times = []
    for q in queries[:n_index]:
        t0 = time.perf_counter()
        index.search(q, TOP_K)
        idx_times.append(time.perf_counter() - t0)
    # query latency: pure-Python loop (fewer queries: each takes ~0.1-0.5 s)
    q_lists = queries[:n_base].tolist()
    python_brute_force(py_vectors, ids, queries[-1].tolist())  # warmup
    py_times, agree = [], 0
    for q, ql in zip(queries[:n_base], q_lists):
        t0 = time.perf_counter()
        py_ids, _ = python_brute_force(py_vectors, ids, ql)
        py_times.append(time.perf_counter() - t0)
        agree += list(map(str, index.search(q, TOP_K)[0])) == py_ids
        log.info("index_latency python baseline %d/%d", len(py_times), n_base)
    ix, py = summarize(idx_times), summarize(py_times)
    for s in (ix, py):
        s.pop("all_s")
    throughput = n_steps / add_s if add_s > 0 else None
    result = {
        "benchmark": "index_latency",
        "description": f"Top-{TOP_K} search over a {n_steps}-step memory ({dim}-d, L2-normalized): VectorIndex "
                       "(numpy) vs a brute-force pure-Python loop; indexing throughput of VectorIndex.add.",
        "index": {"steps": n_steps, "dim": dim, "k": TOP_K, "backend": index.backend, "dtype": "float32",
                  "vectors": "random unit vectors (seeded)"},
        "query_latency": {"index": {**ix, "queries": n_index}, "python_loop": {**py, "queries": n_base},
                          "results_agree": f"{agree}/{n_base}", "budget_s": LATENCY_BUDGET_S,
                          "meets_budget": bool(ix["p50_s"] <= LATENCY_BUDGET_S)},
        "indexing": {"add_batch": ADD_BATCH, "index_add_s": add_s, "vectors_per_s": throughput,
                     "python_build_s": py_build_s,
                     "python_vectors_per_s": n_steps / py_build_s if py_build_s > 0 else None},
        "timing_includes": "search: query normalization + inner products + top-k + id lookup; "
                           "add: normalization + copy into the growable buffer",
        "figures": [
            figure("query_latency_p50", "s", ix["p50_s"], py["p50_s"], "baseline/value", (">=", 10.0),
                   "median seconds per top-10 query; baseline = pure-Python brute-force loop; ratio = speedup"),
            figure("query_latency_p50_vs_budget", "s", ix["p50_s"], LATENCY_BUDGET_S, "value/baseline", ("<=", 1.0),
                   "median seconds per query against the 5 ms budget (baseline = budget)"),
            figure("index_add_time", "s", add_s, py_build_s, "baseline/value", (">=", 10.0),
                   f"seconds to add {n_steps} vectors (VectorIndex.add, batches of {ADD_BATCH}); baseline = "
                   "normalizing them into the loop baseline's Python lists; ratio = speedup"),
        ],
    }
    return with_target(result)
