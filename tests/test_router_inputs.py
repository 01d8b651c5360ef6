"""Hostile and careless inputs to the three routers (review bad-input-probe.md, defects 7 and 8, plus the
retriever and MemAgent routers): runtime arguments of score / decide, broken exports, and load_router in a
fresh process. Every error must be one clear exception (a ValueError subclass) that names the argument, or the
export file, instead of a silent wrong answer or a library error with no file name."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import make_tiny_llama
from routers.base import ROUTER_SCHEMA_VERSION, RouterConfigError, load_router, router_class
from routers.validation import RouterInputError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

Q, C = "What is Melanie's hobby?", "[D2:1] Melanie: I love painting sunsets."


# -- tiny routers and their exports (module scope: built once) --------------------------------------------------
@pytest.fixture(scope="module")
def suff(smollm2_tokenizer):
    from routers.sufficiency import SufficiencyRouter

    return SufficiencyRouter.from_model(make_tiny_llama(smollm2_tokenizer), smollm2_tokenizer, base_model="tiny")


@pytest.fixture(scope="module")
def memagent(smollm2_tokenizer):
    from routers.memagent.router import MemAgentRouter

    return MemAgentRouter.from_model(make_tiny_llama(smollm2_tokenizer, seed=1), smollm2_tokenizer,
                                     provider_names=["A", "B"])


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    from sentence_transformers import SentenceTransformer

    from retriever_helpers import build_tiny_encoder
    from routers.retriever import RetrieverRouter

    st = build_tiny_encoder(tmp_path_factory.mktemp("tiny-st") / "st")
    return RetrieverRouter(SentenceTransformer(st, device="cpu"))


@pytest.fixture(scope="module")
def exports(tmp_path_factory, suff, memagent, retriever):
    root = tmp_path_factory.mktemp("exports")
    return {"sufficiency": suff.save_pretrained(root / "sufficiency"),
            "memagent": memagent.save_pretrained(root / "memagent"),
            "retriever": retriever.save_pretrained(root / "retriever")}


def _clone(src: Path, dst: Path) -> Path:
    """A copy of an export made of hard links (fast); mutate files only by replacing them (``_write``)."""
    shutil.copytree(src, dst, copy_function=os.link)
    return dst


def _write(file: Path, data: bytes | str) -> None:
    file.unlink(missing_ok=True)  # never write through a hard link into the shared export
    file.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))


def _edit_json(file: Path, **changes) -> None:
    raw = json.loads(file.read_text()) if file.exists() else {}
    for key, value in changes.items():
        if value is _DROP:
            raw.pop(key, None)
        else:
            raw[key] = value
    _write(file, json.dumps(raw))  # NaN / Infinity are written as JSON's non-standard tokens, like a hand edit


_DROP = object()


def _loader(kind: str):
    return router_class(kind).from_pretrained


# -- 1. SufficiencyRouter.score / decide (defect 7) ---------------------------------------------------------------
@pytest.mark.parametrize("questions, contexts, match", [
    ([None], [C], r"questions\[0\] must be a string, got NoneType"),
    ([Q, Q], [C, None], r"contexts\[1\] must be a string, got NoneType"),
    ([1], [2], r"questions\[0\] must be a string, got int"),
    ([b"q"], [b"c"], r"questions\[0\] must be a string, got bytes"),
    ([{"q": 1}], [C], r"questions\[0\] must be a string, got dict"),
    ({"q": 1}, {"c": 1}, r"questions must be a list of strings, got dict"),
    (None, None, r"questions must be a list of strings, got NoneType"),
    (Q, [C, C], r"questions is one string but contexts is list"),
    ([Q], C, r"contexts is one string but questions is list"),
    (Q, None, r"questions is one string but contexts is NoneType"),
    (Q, b"c", r"questions is one string but contexts is bytes"),
    (3.5, C, r"contexts is one string but questions is float"),
])
def test_sufficiency_score_rejects_non_text(suff, questions, contexts, match):
    with pytest.raises(RouterInputError, match=match) as err:
        suff.score(questions, contexts)
    assert isinstance(err.value, TypeError) and isinstance(err.value, ValueError)


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, True, "8", None])
def test_sufficiency_score_rejects_bad_batch_size(suff, batch_size):
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        suff.score([Q], [C], batch_size=batch_size)


def test_sufficiency_score_accepts_strings_tuples_and_arrays(suff):
    one = suff.score(Q, C)
    assert one.shape == (1,) and 0 < float(one[0]) < 1
    torch.testing.assert_close(suff.score((Q,), (C,)), one)
    torch.testing.assert_close(suff.score(np.array([Q]), np.array([C]), batch_size=np.int64(2)), one)
    assert suff.score([], []).shape == (0,)
    with pytest.raises(ValueError, match="2 questions but 1 contexts"):
        suff.score([Q, Q], [C])


def test_sufficiency_decide_takes_one_score(suff):
    s = suff.score([Q, Q], [C, C])
    tau = float(s[0])
    for one in (s[0], float(s[0]), np.float32(s[0]), np.float64(s[0]), np.array(float(s[0]))):
        assert suff.decide(one, threshold=tau) == ["terminate"], type(one)
    assert suff.decide(s, threshold=tau) == ["terminate", "terminate"]
    assert suff.decide(1, threshold=1) == ["terminate"] and suff.decide(0, threshold=0.5) == ["continue"]
    assert suff.decide(float("nan"), threshold=0.0) == ["continue"]  # over budget always continues
    assert suff.decide([], 0.5) == [] and suff.decide(torch.zeros(0), 0.5) == []


@pytest.mark.parametrize("scores, match", [
    (True, "scores must be one score"), ("0.7", "scores must be one score"), (None, "scores must be one score"),
    (torch.zeros(2, 2), r"shape \(2, 2\)"), (np.zeros((1, 3)), r"shape \(1, 3\)"),
    ([0.2, None], r"scores\[1\] must be a real number"), (["0.7"], r"scores\[0\] must be a real number"),
    ([True], r"scores\[0\] must be a real number"), (torch.tensor([True]), r"scores\[0\] must be a real number"),
    ({"a": 0.5}, "scores must be one score"), (1.5, r"scores\[0\] must be a finite number in \[0, 1\]"),
    ([-0.1], r"in \[0, 1\]"), ([float("inf")], r"in \[0, 1\]"),
])
def test_sufficiency_decide_rejects_bad_scores(suff, scores, match):
    with pytest.raises(RouterInputError, match=match):
        suff.decide(scores, threshold=0.5)


@pytest.mark.parametrize("tau", [float("nan"), float("inf"), 1.5, -0.5, "0.5", True, [0.5]])
def test_sufficiency_decide_rejects_bad_threshold(suff, tau):
    with pytest.raises(ValueError, match="threshold must be a"):
        suff.decide([0.2, 0.7], threshold=tau)


def test_sufficiency_bad_threshold_in_the_config(suff, smollm2_tokenizer):
    from routers.sufficiency import SufficiencyConfig, SufficiencyRouter

    with pytest.raises(ValueError, match=r"threshold must be a finite number in \[0, 1\], got 1.5"):
        SufficiencyRouter.from_model(suff.model, smollm2_tokenizer, threshold=1.5)
    with pytest.raises(ValueError, match="max_input_tokens must be a positive integer"):
        SufficiencyConfig([1], [2], max_input_tokens=0)
    with pytest.raises(ValueError, match=r"unknown placeholder \{ctx\}"):
        SufficiencyConfig([1], [2], user_template="{question} {ctx}")
    router = SufficiencyRouter(suff.model, smollm2_tokenizer, SufficiencyConfig([1], [2]))
    router.config.threshold = float("nan")  # changed after construction: decide still refuses it
    with pytest.raises(ValueError, match="threshold must be a finite number"):
        router.decide([0.5])


# -- 2. broken exports, all three routers (defect 8 + section 3 of the review) ---------------------------------------
KINDS = ["sufficiency", "retriever", "memagent"]
THRESHOLD_KEY = {"sufficiency": "threshold", "retriever": "threshold", "memagent": "in_threshold"}


def _break(case: str, d: Path, kind: str) -> str:
    """Apply one breakage to the export ``d``; return the file name the error must mention."""
    cfg, cal, weights = d / "router_config.json", d / "calibration.json", d / "model.safetensors"
    if case == "missing_dir":
        shutil.rmtree(d)
        return "router_config.json: missing"
    if case == "plain_model_dir":
        cfg.unlink()
        return "router_config.json: missing"
    if case == "corrupt_json":
        _write(cfg, cfg.read_text()[:40])
        return "router_config.json: invalid JSON"
    if case == "not_an_object":
        _write(cfg, "[1, 2]")
        return "router_config.json: expected a JSON object"
    if case == "wrong_router_type":
        _edit_json(cfg, router_type="sufficiency" if kind != "sufficiency" else "retriever")
        return "router_config.json: router_type is"
    if case == "schema_newer":
        _edit_json(cfg, schema_version=ROUTER_SCHEMA_VERSION + 98)
        return "router_config.json: schema_version 99 was written by a newer memroute"
    if case == "schema_string":
        _edit_json(cfg, schema_version="banana")
        return "router_config.json: schema_version must be an integer, got 'banana'"
    if case == "schema_float":
        _edit_json(cfg, schema_version=1.0)
        return "router_config.json: schema_version must be an integer"
    if case == "schema_bool":
        _edit_json(cfg, schema_version=True)
        return "router_config.json: schema_version must be an integer"
    if case == "schema_zero":
        _edit_json(cfg, schema_version=0)
        return "router_config.json: schema_version must be >= 1"
    if case == "schema_missing":
        _edit_json(cfg, schema_version=_DROP)
        return "router_config.json: schema_version missing"
    if case == "threshold_nan":
        _edit_json(cfg, **{THRESHOLD_KEY[kind]: float("nan")})
        return f"router_config.json: {THRESHOLD_KEY[kind]} must be a finite number"
    if case == "threshold_7_5":
        _edit_json(cfg, **{THRESHOLD_KEY[kind]: 7.5})
        return f"router_config.json: {THRESHOLD_KEY[kind]} must be a finite number"
    if case == "threshold_negative":
        _edit_json(cfg, **{THRESHOLD_KEY[kind]: -1.5})
        return f"router_config.json: {THRESHOLD_KEY[kind]} must be a finite number"
    if case == "truncated_weights":
        data = weights.read_bytes()
        _write(weights, data[: len(data) // 2])
        return "model.safetensors: unreadable weights file"
    if case == "empty_weights":
        _write(weights, b"")
        return "model.safetensors: unreadable weights file"
    if case == "garbage_weights":
        _write(weights, b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage" + b"\x00" * 64)
        return "model.safetensors: unreadable weights file"
    if case == "missing_weights":
        weights.unlink()
        return f"{d.name}: cannot load the"
    if case == "corrupt_hf_config":
        _write(d / "config.json", "{")
        return f"{d.name}: cannot load the"
    raise AssertionError(case)


CASES = ["missing_dir", "plain_model_dir", "corrupt_json", "not_an_object", "wrong_router_type", "schema_newer",
         "schema_string", "schema_float", "schema_bool", "schema_zero", "schema_missing", "threshold_nan",
         "threshold_7_5", "threshold_negative", "truncated_weights", "empty_weights", "garbage_weights",
         "missing_weights", "corrupt_hf_config"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_broken_export_is_one_clear_error(exports, tmp_path, kind, case):
    d = _clone(exports[kind], tmp_path / f"{kind}-{case}")
    must_name = _break(case, d, kind)
    with pytest.raises(RouterConfigError) as err:
        _loader(kind)(d, device="cpu")
    assert must_name in str(err.value), str(err.value)
    assert str(d.name) in str(err.value)
    if case not in ("wrong_router_type",):  # load_router finds the class itself, then the same checks run
        with pytest.raises(RouterConfigError, match="router_config.json|safetensors|cannot load"):
            load_router(d, device="cpu")


@pytest.mark.parametrize("kind, calibration, match", [
    ("sufficiency", {"threshold": 42}, r"threshold must be a finite number in \[0, 1\], got 42"),
    ("sufficiency", {"threshold": float("nan")}, "threshold must be a finite number"),
    ("sufficiency", {"threshold": -0.5}, "threshold must be a finite number"),
    ("sufficiency", {"threshold": "high"}, "threshold must be a number"),
    ("sufficiency", {"threshold": True}, "threshold must be a number"),
    ("memagent", {"in_threshold": 42}, "in_threshold must be a finite number"),
    ("memagent", {"end_threshold": float("inf")}, "end_threshold must be a finite number"),
    ("memagent", [0.5], "expected a JSON object"),
    ("memagent", "{", "invalid JSON"),
])
def test_bad_calibration_is_one_clear_error(exports, tmp_path, kind, calibration, match):
    d = _clone(exports[kind], tmp_path / kind)
    _write(d / "calibration.json", calibration if isinstance(calibration, str) else json.dumps(calibration))
    with pytest.raises(RouterConfigError, match=f"calibration.json: {match}"):
        _loader(kind)(d, device="cpu")


@pytest.mark.parametrize("kind, changes, match", [
    ("sufficiency", {"max_input_tokens": -5}, "max_input_tokens must be a positive integer, got -5"),
    ("sufficiency", {"max_input_tokens": 0}, "max_input_tokens must be a positive integer"),
    ("sufficiency", {"user_template": "Memory: {context}\nQ: {question} {answer}"},
     r"user_template has unknown placeholder \{answer\}"),
    ("sufficiency", {"user_template": "{question} {}"}, r"unknown placeholder \{\}"),
    ("sufficiency", {"user_template": "{question} {context.upper}"}, r"unknown placeholder \{context.upper\}"),
    ("sufficiency", {"user_template": "{question} {context} {0}"}, r"unknown placeholder \{0\}"),
    ("sufficiency", {"user_template": "{question} {context"}, "user_template is not a valid template"),
    ("sufficiency", {"system_prompt": "Answer {mode}."}, r"system_prompt has unknown placeholder \{mode\}"),
    ("retriever", {"temperature": 0}, "temperature must be > 0"),
    ("retriever", {"temperature": float("nan")}, "temperature must be a finite number"),
    ("retriever", {"top_k": 0}, "top_k must be a positive integer"),
    ("retriever", {"max_seq_length": -1}, "max_seq_length must be a positive integer"),
    ("retriever", {"embedding_dim": 7}, "embedding_dim is 7 but the model"),
    ("memagent", {"max_input_tokens": -5}, "max_input_tokens must be a positive integer"),
    ("memagent", {"max_batch_tokens": 0}, "max_batch_tokens must be a positive integer"),
    ("memagent", {"end_mode": "list"}, r"end_mode must be one of \['per_provider'\]"),
    ("memagent", {"end_threshold": 1.01}, "end_threshold must be a finite number"),
    ("memagent", {"provider_names": "A,B"}, "provider_names"),
])
def test_bad_config_values_are_one_clear_error(exports, tmp_path, kind, changes, match):
    d = _clone(exports[kind], tmp_path / kind)
    _edit_json(d / "router_config.json", **changes)
    with pytest.raises(RouterConfigError, match=f"router_config.json: .*{match}"):
        _loader(kind)(d, device="cpu")


def test_current_and_older_exports_still_load(exports, tmp_path, suff, retriever):
    from routers.retriever import RetrieverRouter
    from routers.sufficiency import SufficiencyRouter

    loaded = SufficiencyRouter.from_pretrained(exports["sufficiency"], device="cpu")
    torch.testing.assert_close(loaded.score(Q, C), suff.score(Q, C), atol=1e-5, rtol=0)
    # an older export: only the fields the first schema required, no calibration.json, literal braces escaped
    d = _clone(exports["sufficiency"], tmp_path / "old")
    cfg = json.loads((d / "router_config.json").read_text())
    keep = {"schema_version", "router_type", "yes_token_ids", "no_token_ids"}
    _write(d / "router_config.json", json.dumps({k: v for k, v in cfg.items() if k in keep}))
    (d / "calibration.json").unlink()
    old = SufficiencyRouter.from_pretrained(d, device="cpu")
    assert old.config.threshold == 0.5 and old.calibration == {}
    _edit_json(d / "router_config.json", user_template="{{json}} {question!r} {context:>5}", threshold=1, schema_version=1)
    assert SufficiencyRouter.from_pretrained(d, device="cpu").config.threshold == 1
    r = RetrieverRouter.from_pretrained(exports["retriever"], device="cpu")
    np.testing.assert_allclose(r.encode(["a b c"]), retriever.encode(["a b c"]), atol=1e-6)
    assert isinstance(load_router(exports["memagent"], device="cpu"), router_class("memagent"))


# -- 3. load_router: unknown or bad types (each type in a fresh process: tests/test_router_contract.py) ----------------
def test_load_router_unknown_or_bad_type(tmp_path):
    d = tmp_path / "x"
    d.mkdir()
    for router_type, match in (("no-such-router", r"unknown router_type 'no-such-router'; known: .*'memagent'"),
                               (["sufficiency"], "router_type must be a string"), (None, "router_type missing")):
        _write(d / "router_config.json", json.dumps({"schema_version": 1, "router_type": router_type}))
        with pytest.raises(RouterConfigError, match=match) as err:
            load_router(d)
        assert "router_config.json" in str(err.value)


# -- 4. retriever runtime inputs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, match", [
    (lambda r: r.score("q", ["a step", None]), r"steps\[1\] must be a string or a Step, got NoneType"),
    (lambda r: r.score("q", [1, 2]), r"steps\[0\] must be a string or a Step, got int"),
    (lambda r: r.score("q", None), "steps must be a list of strings or Steps"),
    (lambda r: r.score(None, ["a"]), "query must be a list of strings, got NoneType"),
    (lambda r: r.score(["q", b"x"], ["a"]), r"query\[1\] must be a string, got bytes"),
    (lambda r: r.encode([{"text": "a"}]), r"texts\[0\] must be a string or a Step, got dict"),
    (lambda r: r.encode(["a"], batch_size=0), "batch_size must be a positive integer"),
    (lambda r: r.retrieve(None, ["a"]), "query must be a string"),
    (lambda r: r.build_index(["a plain string"]), r"memory\[0\] must be a Step"),
    (lambda r: r.decide([0.2, 0.9], k=0), "k must be a positive integer, got 0"),
    (lambda r: r.decide([0.2, 0.9], k=-1), "k must be a positive integer"),
    (lambda r: r.decide([0.2, 0.9], k=1.5), "k must be a positive integer"),
    (lambda r: r.decide([0.2, 0.9], threshold=float("nan")), "threshold must be a finite number"),
    (lambda r: r.decide([0.2, 0.9], threshold=1.5), r"threshold must be a finite number in \[-1, 1\]"),
    (lambda r: r.decide([0.2, 0.9], threshold="0.5"), "threshold must be a number"),
    (lambda r: r.decide(np.zeros((2, 3))), r"shape \(2, 3\)"),
    (lambda r: r.decide(["0.5"]), r"scores\[0\] must be a real number"),
    (lambda r: r.decide(None), "scores must be one score"),
])
def test_retriever_rejects_bad_inputs(retriever, call, match):
    with pytest.raises(RouterInputError, match=match):
        call(retriever)


def test_retriever_good_inputs(retriever):
    from routers.memory.schema import Step

    s = retriever.score("q", ["a", "b", "c"])
    assert s.shape == (3,)
    assert retriever.score(["q", "r"], ("a", "b")).shape == (2, 2)
    assert retriever.score("q", []).shape == (0,)
    assert retriever.decide([0.1, 0.9, 0.5], k=2) == [1, 2]
    assert retriever.decide([0.1, float("nan"), 0.5]) == [2, 0]  # a NaN score is never kept
    assert retriever.decide(np.float32(0.3)) == [0] and retriever.decide(torch.tensor(0.3), threshold=0.5) == []
    steps = [Step(step_id=f"s{i}", index=i, text=t) for i, t in enumerate(["apple", "river", "apple pie"])]
    assert [sid for sid, _ in retriever.retrieve("apple", steps, k=2)][0] in {"s0", "s2"}


# -- 5. MemAgent runtime inputs -------------------------------------------------------------------------------------
class _Provider:
    gate = "all"

    def describe_storage(self):
        return "keeps summaries"

    def describe_retrieval(self):
        return "finds similar tasks"


POOL = {"A": _Provider(), "B": _Provider()}


@pytest.mark.parametrize("call, match", [
    (lambda r: r.score_inject(None, 0, "x"), "goal must be a string, got NoneType"),
    (lambda r: r.score_inject("goal", -1, "x"), "step_index must be a non-negative integer"),
    (lambda r: r.score_inject("goal", "2", "x"), "step_index must be a non-negative integer"),
    (lambda r: r.score_inject("goal", True, "x"), "step_index must be a non-negative integer"),
    (lambda r: r.score_inject("goal", 0, None), "state_summary must be a string"),
    (lambda r: r.score_begin(b"goal", [], POOL), "goal must be a string, got bytes"),
    (lambda r: r.score_begin("goal", [], ["A", "B"]), "providers must be a mapping"),
    (lambda r: r.score_end(None, {1: _Provider()}), "provider names must be non-empty strings"),
    (lambda r: r.decide(torch.tensor(0.5), phase="inn"), "unknown phase 'inn'"),
    (lambda r: r.decide(torch.tensor(0.5), threshold=float("nan"), phase="in"), "threshold must be a finite number"),
    (lambda r: r.decide(torch.tensor(0.5), threshold=1.5, phase="in"), r"in \[0, 1\]"),
    (lambda r: r.decide(torch.tensor(0.5), threshold="0.5", phase="in"), "threshold must be a number"),
    (lambda r: r.decide(torch.tensor([0.5, 0.6]), phase="in"), "takes one score"),
    (lambda r: r.decide(True, phase="in"), "scores must be one score"),
    (lambda r: r.decide(torch.tensor(1.5), phase="in"), r"scores\[0\] must be a finite number in \[0, 1\]"),
    (lambda r: r.decide(torch.tensor([0.5, 0.6]), phase="end", options=["A"]), "2 scores but 1 options"),
    (lambda r: r.decide(torch.tensor([-1.0, -2.0]), phase="begin", options=[None, "A", "B"]), "2 scores but 3 options"),
    (lambda r: r.decide(torch.tensor([-1.0, float("nan")]), phase="begin"), "without NaN"),
    (lambda r: r.decide(torch.zeros(2, 2), phase="end"), r"shape \(2, 2\)"),
])
def test_memagent_rejects_bad_inputs(memagent, call, match):
    with pytest.raises(RouterInputError, match=match):
        call(memagent)


def test_memagent_decide_good_inputs_and_config_thresholds(memagent, smollm2_tokenizer):
    from routers.memagent.router import MemAgentConfig

    assert memagent.decide(np.float32(0.7), threshold=0.5, phase="in") is True
    assert memagent.decide(0.3, phase="in") is False
    assert memagent.decide(torch.tensor([0.2, 0.8]), threshold=0.5, phase="end", options=["A", "B"]) == ["B"]
    assert memagent.decide(torch.tensor([-3.0, -1.0, -1.0]), phase="begin", options=[None, "A", "B"]) == "A"
    assert memagent.decide(None, phase="end") == [] and memagent.decide(None, phase="begin") is None
    with pytest.raises(ValueError, match="in_threshold must be a finite number"):
        MemAgentConfig(in_threshold=1.5)
    with pytest.raises(ValueError, match="end_mode must be one of"):
        MemAgentConfig(end_mode="subset")
    before = memagent.config.in_threshold
    try:
        memagent.config.in_threshold = float("nan")  # changed after construction: inject refuses it
        with pytest.raises(ValueError, match="in_threshold must be a finite number"):
            memagent.inject("goal", 0, "x")
    finally:
        memagent.config.in_threshold = before
    assert math.isfinite(memagent.config.in_threshold)
