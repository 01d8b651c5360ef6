"""The per-task-type routing report: grouping, baseline rows per type, routed Begin choices, the plots."""

from __future__ import annotations

from types import SimpleNamespace

from eval.memagent_by_type import by_task_type, success_vs_tokens_plot, task_type, write_type_report


def _rec(success, steps=5, tokens=0):
    return {"success": success, "steps": steps, "injected_tokens": tokens}


def test_task_types_of_the_worlds_suite_and_presets():
    t = lambda **meta: SimpleNamespace(meta=meta)  # noqa: E731
    assert task_type(t(family="fetch", sibling="w0-fetch-a")) == "fetch (seen world)"
    assert task_type(t(family="fetch", sibling=None)) == "fetch (unseen world)"
    assert task_type(t(family="moved", sibling="w0-fetch-a")) == "moved"
    assert task_type(t(settings={"recipe": 1, "go": 6})) == "go=6,recipe=1"
    assert task_type(SimpleNamespace(meta={})) == "all"


def test_by_task_type_splits_rows_and_routed_choices(tmp_path):
    options = [None, "memp"]
    table = {"a": {None: _rec(False), "memp": _rec(True, 4, 100)},     # memory needed
             "b": {None: _rec(False), "memp": _rec(True, 4, 100)},
             "c": {None: _rec(True, 2), "memp": _rec(False, 6, 100)}}   # memory misleads
    types = {"a": "fetch (seen world)", "b": "fetch (seen world)", "c": "moved"}
    runs = [{"task_id": "a", "begin_provider": "memp", "success": True, "steps": 4, "injected_tokens": 100,
             "in_queries": 1, "in_decisions": 4},
            {"task_id": "b", "begin_provider": None, "success": False, "steps": 6, "injected_tokens": 0,
             "in_queries": 0, "in_decisions": 6},
            {"task_id": "c", "begin_provider": None, "success": True, "steps": 2, "injected_tokens": 0,
             "in_queries": 0, "in_decisions": 0}]
    rep = by_task_type(table, options, ["a", "b", "c"], types, runs, {"trained": {"a": "memp", "b": "memp", "c": "None"}})
    fetch, moved = rep["fetch (seen world)"], rep["moved"]
    assert fetch["n"] == 2 and moved["n"] == 1
    assert fetch["baselines"]["None"]["success_rate"] == 0.0 and fetch["baselines"]["memp"]["success_rate"] == 1.0
    assert moved["baselines"]["oracle"]["success_rate"] == 1.0 and moved["baselines"]["memp"]["success_rate"] == 0.0
    assert fetch["routed"]["success_rate"] == 0.5 and fetch["routed"]["begin_choices"] == {"memp": 1, "None": 1}
    assert fetch["routed"]["in_query_rate"] == 0.1 and moved["routed"]["in_query_rate"] is None
    assert fetch["begin_offline_trained"] == {"memp": 2} and moved["begin_offline_trained"] == {"None": 1}
    metrics = {"baselines": {"None": fetch["baselines"]["None"]}, "routed": fetch["routed"], "by_task_type": rep}
    paths = write_type_report(metrics, tmp_path)
    assert len(paths) == 3 and all(p.endswith(".png") for p in paths)
    assert (tmp_path / "success_vs_tokens.png").read_bytes()[:4] == b"\x89PNG"
    assert success_vs_tokens_plot({"x": {"success_rate": None}}, tmp_path / "empty.png").exists()
