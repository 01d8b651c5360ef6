"""Fuzzed loaders: for every record type the package reads, any input -- valid, subtly wrong or garbage --
either loads into well-typed records or raises one clear error that names the file; never a KeyError,
TypeError or AttributeError from deep inside.

Inputs are built from valid records whose fields are each sometimes replaced by an arbitrary JSON value
or dropped, mixed with garbage lines (random text, truncated JSON, invalid UTF-8).
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from data_synthesis.corpora import CorpusError
from routers.io import RecordError
from eval.sufficiency import SufficiencyEvalConfig
from routers.base import RouterConfigError
from routers.config import ConfigError

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
CLEAR = (RecordError, CorpusError, ConfigError, RouterConfigError)

scalars = (st.none() | st.booleans() | st.integers(-10 ** 20, 10 ** 20) | st.floats(allow_nan=True)
           | st.text(max_size=12))
json_values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=3)
                           | st.dictionaries(st.text(max_size=6), kids, max_size=3), max_leaves=6)


def maybe(valid):
    """Mostly the valid value, sometimes any JSON value."""
    return st.one_of(valid, valid, valid, json_values)


@st.composite
def record(draw, fields: dict, bad_one_in: int = 3):
    """A valid record, or (one time in ``bad_one_in``) one with a field or two replaced by any JSON value or dropped."""
    rec = {name: draw(strat) for name, strat in fields.items()}
    if draw(st.integers(1, bad_one_in)) == 1:
        for name in draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=2, unique=True)):
            if draw(st.booleans()):
                del rec[name]
            else:
                rec[name] = draw(json_values)
    return rec


@st.composite
def jsonl_text(draw, rec_strategy, max_records: int = 4) -> bytes:
    lines = []
    for rec in draw(st.lists(rec_strategy, min_size=0, max_size=max_records)):
        kind = draw(st.integers(0, 24))
        line = json.dumps(rec, ensure_ascii=False)
        if kind == 0:
            line = line[: draw(st.integers(0, max(0, len(line) - 1)))]  # truncated
        elif kind == 1:
            line = draw(st.text(max_size=20))
        elif kind == 2:
            line = json.dumps(draw(json_values))
        lines.append(line.encode("utf-8"))
    if draw(st.integers(0, 20)) == 0:
        lines.append(b"\xff\xfe bad bytes")
    return b"\n".join(lines) + (b"\n" if draw(st.booleans()) else b"")


def _clear(err: BaseException, path: Path) -> None:
    """A clear error: one of ours (or a ValueError/FileNotFoundError) whose message names the file."""
    assert isinstance(err, CLEAR + (ValueError, FileNotFoundError)), f"{type(err).__name__}: {err}"
    assert type(err) not in (KeyError, TypeError, AttributeError, IndexError, UnicodeDecodeError)
    assert path.name in str(err), f"the error does not name {path.name}: {err}"


OUTCOMES: dict[str, Counter] = defaultdict(Counter)


def load_or_clear_error(load, path: Path):
    try:
        out = load(path)
    except Exception as err:  # noqa: BLE001 - the point of the test: classify what came out
        _clear(err, path)
        OUTCOMES[path.name]["error"] += 1
        return None
    OUTCOMES[path.name]["loaded"] += 1
    return out


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def _write(fuzz_dir: Path, name: str, data: bytes | str) -> Path:
    path = fuzz_dir / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=16)

# -- sufficiency samples (data_synthesis/sufficiency.py RECORD_FIELDS; train + eval readers) ----------------
SUFF = {"schema_version": st.just(1), "id": words, "qa_id": words, "episode_id": words, "question": words,
        "answer": words, "context": words, "label": st.sampled_from([0, 1]),
        "variant": st.sampled_from(["positive", "partial", "none"]), "rationale": words}


@FUZZ
@given(data=jsonl_text(record(SUFF)))
def test_fuzz_sufficiency_samples(data, fuzz_dir, smollm2_tokenizer):
    from eval.sufficiency import load_eval_records
    from train.sufficiency import SufficiencyDataset

    path = _write(fuzz_dir, "sufficiency.jsonl", data)
    ds = load_or_clear_error(lambda p: SufficiencyDataset(str(p), smollm2_tokenizer, max_length=10_000), path)
    if ds is not None:
        assert all(item["label"] in (0, 1) and isinstance(item["input_ids"], list) for item in ds.items)
    recs = load_or_clear_error(load_eval_records, path)
    if recs is not None:
        assert all(isinstance(r["question"], str) and isinstance(r["context"], str) and r["label"] in (0, 1)
                   and not isinstance(r["label"], bool) for r in recs)
        assert len({r["id"] for r in recs}) == len(recs)


# -- retriever samples (data_synthesis/retriever.py) ---------------------------------------------------------
texts = st.lists(words, min_size=1, max_size=3)
RETR = {"schema_version": st.just(1), "id": words, "qa_id": words, "episode_id": words, "query": words,
        "positives": st.just(["p1 text", "p2 text"]), "negatives": st.just(["n text"]),
        "positive_ids": st.just(["p1", "p2"]), "negative_ids": st.just(["n"]),
        "positive_kinds": st.just(["step", "window"])}


VALID_RETRIEVER_LINE = json.dumps({"schema_version": 1, "id": "r1", "qa_id": "q1", "episode_id": "e1", "query": "where?",
                                   "positives": ["p1 text", "p2 text"], "negatives": ["n text"],
                                   "positive_ids": ["p1", "p2"], "negative_ids": ["n"],
                                   "positive_kinds": ["step", "window"]}) + "\n"


@FUZZ
@given(data=jsonl_text(record(RETR)))
@example(data=VALID_RETRIEVER_LINE)  # a file that loads, always: the random draws alone loaded 0-2 of 60 files
def test_fuzz_retriever_samples(data, fuzz_dir):
    from data_synthesis.retriever_records import read_retriever_records

    path = _write(fuzz_dir, "retriever.jsonl", data)
    recs = load_or_clear_error(read_retriever_records, path)
    if recs is not None:
        for r in recs:
            assert r["query"].strip() and r["positives"] and all(isinstance(t, str) for t in r["positives"])
            assert len(r["positives"]) == len(r["positive_ids"])


# -- LoCoMo and HotpotQA JSON (data_synthesis/corpora.py) ----------------------------------------------------
dia_ids = st.sampled_from(["D1:1", "D1:2", "D1:3", "D2:1"])
turn = record({"speaker": words, "dia_id": dia_ids, "text": words, "blip_caption": words}, bad_one_in=10)
qa = record({"question": words, "answer": words, "evidence": st.lists(dia_ids, max_size=3),
             "category": st.integers(1, 5)}, bad_one_in=10)
conversation = record({"speaker_a": words, "speaker_b": words, "session_1": st.lists(turn, max_size=3),
                       "session_1_date_time": words, "session_2": st.lists(turn, max_size=2)}, bad_one_in=10)
locomo_doc = st.lists(record({"sample_id": words, "conversation": conversation, "qa": st.lists(qa, max_size=3)},
                             bad_one_in=10), max_size=3)


@settings(parent=FUZZ, max_examples=100)
@given(doc=maybe(locomo_doc), garbage=st.integers(0, 15))
def test_fuzz_locomo(doc, garbage, fuzz_dir):
    from data_synthesis.corpora import load_locomo

    text = json.dumps(doc)
    path = _write(fuzz_dir, "locomo.json", text[: len(text) // 2] if garbage == 0 else text)
    episodes = load_or_clear_error(load_locomo, path)
    for ep in episodes or []:
        ids = [s.step_id for s in ep.steps]
        assert len(ids) == len(set(ids)) and all(isinstance(s.text, str) for s in ep.steps)
        for q in ep.qa:
            assert isinstance(q.question, str) and q.evidence and all(ep.has_step(e) for e in q.evidence)


sentences = st.lists(words, min_size=1, max_size=3)
hotpot_item = record({"_id": words, "question": words, "answer": words, "type": words,
                      "context": st.just([["A", ["a0.", "a1."]], ["B", ["b0."]]]),
                      "supporting_facts": st.lists(st.tuples(st.sampled_from(["A", "B", "C"]), st.integers(0, 2)),
                                                   max_size=2)})


@FUZZ
@given(doc=maybe(st.lists(hotpot_item, max_size=3)), context=maybe(st.lists(st.tuples(words, sentences), max_size=2)))
def test_fuzz_hotpotqa(doc, context, fuzz_dir):
    from data_synthesis.corpora import load_hotpotqa

    if isinstance(doc, list) and doc and isinstance(doc[0], dict):
        doc[0]["context"] = context
    path = _write(fuzz_dir, "hotpot.json", json.dumps(doc))
    for ep in load_or_clear_error(load_hotpotqa, path) or []:
        ids = [s.step_id for s in ep.steps]
        assert len(ids) == len(set(ids))
        for q in ep.qa:
            assert all(ep.has_step(e) for e in q.evidence)


# -- YAML recipes (routers/config.py) ---------------------------------------------------------------------------
def _recipe_strategy(cls, extra_keys=()):
    from routers.validation import field_types

    names = sorted(set(field_types(cls)) | set(extra_keys))
    return st.dictionaries(st.sampled_from(names) | st.text(max_size=8), json_values | st.text(max_size=10),
                           max_size=4)


def _parse(cls, make_parser, path: Path, *argv: str):
    from routers.config import parse_config

    return parse_config(make_parser(), [cls], [str(path), *argv])


@FUZZ
@given(values=_recipe_strategy(SufficiencyEvalConfig),
       raw=st.one_of(st.none(), st.text(max_size=40)))
def test_fuzz_yaml_eval_recipes(values, raw, fuzz_dir):
    from eval.retrieval import RetrievalEvalConfig
    from eval.retrieval import make_parser as retrieval_parser
    from eval.sufficiency import SufficiencyEvalConfig, make_parser

    path = _write(fuzz_dir, "recipe.yaml", raw if raw is not None else yaml.safe_dump(values))
    for cls, parser in ((SufficiencyEvalConfig, make_parser), (RetrievalEvalConfig, retrieval_parser)):
        cfg = load_or_clear_error(lambda p: _parse(cls, parser, p), path)
        if cfg is not None:
            from routers.validation import field_types, type_error

            for name, tp in field_types(cls).items():  # what loads is well typed
                assert type_error(getattr(cfg[0], name), tp) is None, (name, getattr(cfg[0], name))


TRAIN_KEYS = ("learning_rate", "max_steps", "per_device_train_batch_size", "bf16", "lr_scheduler_type", "seed",
              "logging_steps", "gradient_accumulation_steps", "report_to", "lora_r", "lora_target_modules",
              "lambda_rep", "s0", "rep_layer", "max_length", "resume", "attn_implementation", "use_lora")


@settings(parent=FUZZ, max_examples=40)
@given(values=st.dictionaries(st.sampled_from(TRAIN_KEYS), json_values | st.text(max_size=10), max_size=3))
def test_fuzz_yaml_training_recipe(values, fuzz_dir):
    from train.sufficiency import SufficiencyTrainingConfig, make_parser

    path = _write(fuzz_dir, "train.yaml", yaml.safe_dump(values))
    cfg = load_or_clear_error(lambda p: _parse(SufficiencyTrainingConfig, make_parser, p, "--output_dir",
                                               str(fuzz_dir / "o"), "--report_to", "none"), path)
    if cfg is not None:
        c = cfg[0]
        assert isinstance(c.learning_rate, float) and isinstance(c.max_steps, int)
        assert isinstance(c.lora_target_modules, list) and all(isinstance(m, str) for m in c.lora_target_modules)


def test_yaml_recipe_edge_cases(fuzz_dir):
    from eval.sufficiency import SufficiencyEvalConfig, make_parser

    for text, match in (("batch_size: abc\n", "batch_size"), ("taus: [0.1, x]\n", "taus"), ("- a\n- b\n", "mapping"),
                        ("a: [\n", "invalid YAML"), ("batch_size: [1]\n", "expected an integer")):
        with pytest.raises(ConfigError, match=match):
            _parse(SufficiencyEvalConfig, make_parser, _write(fuzz_dir, "edge.yaml", text))
    with pytest.raises(ConfigError, match="edge.yaml"):
        _parse(SufficiencyEvalConfig, make_parser, _write(fuzz_dir, "edge.yaml", b"batch_size: \xff\n"))
    cfg = _parse(SufficiencyEvalConfig, make_parser, _write(fuzz_dir, "edge.yaml", "batch_size: '4'\ntaus: [0.5]\n"))
    assert cfg[0].batch_size == 4 and cfg[0].taus == [0.5]  # argparse converts string scalars, as before


# -- router_config.json / calibration.json of exported routers ------------------------------------------------
SUFF_CFG = {"schema_version": st.just(1), "router_type": st.just("sufficiency"),
            "yes_token_ids": st.just([9805, 10407]), "no_token_ids": st.just([787]), "threshold": st.floats(0, 1),
            "max_input_tokens": st.integers(1, 4096), "system_prompt": words, "user_template": words,
            "base_model": words}
RETR_CFG = {"schema_version": st.just(1), "router_type": st.just("retriever"), "base_model": words,
            "temperature": st.floats(0.01, 1), "top_k": st.integers(1, 20), "threshold": st.none(),
            "max_seq_length": st.integers(8, 512), "extra": st.just({})}


@FUZZ
@given(suff=maybe(record(SUFF_CFG)), retr=maybe(record(RETR_CFG)), cal=maybe(record({"threshold": st.floats(0, 1)})),
       truncate=st.integers(0, 10))
def test_fuzz_router_configs(suff, retr, cal, truncate, fuzz_dir):
    from routers.base import read_calibration, read_router_config
    from routers.retriever import RetrieverConfig
    from routers.sufficiency import SufficiencyConfig

    for name, raw, rtype, cls in (("suff", suff, "sufficiency", SufficiencyConfig),
                                  ("retr", retr, "retriever", RetrieverConfig)):
        d = fuzz_dir / f"router-{name}"
        d.mkdir(exist_ok=True)
        text = json.dumps(raw)
        _write(d, "router_config.json", text[: len(text) // 2] if truncate == 0 else text)
        _write(d, "calibration.json", json.dumps(cal))
        got = load_or_clear_error(lambda p: read_router_config(p.parent, rtype, cls), d / "router_config.json")
        if got is not None:
            cls(**{k: got[k] for k in cls.__dataclass_fields__ if k in got})  # the config builds
        cal_got = load_or_clear_error(lambda p: read_calibration(p.parent), d / "calibration.json")
        if cal_got is not None and "threshold" in cal_got:
            assert math.isfinite(float(cal_got["threshold"])) or math.isinf(cal_got["threshold"])


def test_router_from_pretrained_errors_name_the_file(tmp_path, tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from routers.base import load_router
    from routers.retriever import RetrieverRouter
    from routers.sufficiency import SufficiencyRouter

    export = tmp_path / "router"
    SufficiencyRouter.from_model(AutoModelForCausalLM.from_pretrained(tiny_llama_dir),
                                 AutoTokenizer.from_pretrained(tiny_llama_dir)).save_pretrained(export)
    good = json.loads((export / "router_config.json").read_text())
    cases = [({**good, "yes_token_ids": "9805"}, "yes_token_ids"), ({**good, "yes_token_ids": [10 ** 9]}, "vocabulary"),
             ({k: v for k, v in good.items() if k != "no_token_ids"}, "missing field"), ([good], "JSON object"),
             ({**good, "max_input_tokens": "long"}, "max_input_tokens"), ({**good, "no_token_ids": []}, "empty")]
    for raw, match in cases:
        (export / "router_config.json").write_text(json.dumps(raw))
        with pytest.raises(RouterConfigError, match=match) as err:
            SufficiencyRouter.from_pretrained(export, device="cpu")
        assert "router_config.json" in str(err.value)
    (export / "router_config.json").write_text("{")
    for load in (lambda: SufficiencyRouter.from_pretrained(export), lambda: load_router(export),
                 lambda: RetrieverRouter.from_pretrained(export)):
        with pytest.raises(RouterConfigError, match="router_config.json: invalid JSON"):
            load()
    (export / "router_config.json").write_text(json.dumps(good))
    (export / "calibration.json").write_text('{"threshold": "high"}')
    with pytest.raises(RouterConfigError, match="calibration.json: threshold"):
        SufficiencyRouter.from_pretrained(export)
    with pytest.raises(RouterConfigError, match="missing"):
        load_router(tmp_path)


# -- eval outputs read back: scores.jsonl (memroute calibrate) and the result caches -------------------------
SCORE_ROW = {"id": words, "label": st.sampled_from([0, 1]), "trained": st.floats(0, 1), "variant": words}


@FUZZ
@given(data=jsonl_text(record(SCORE_ROW), max_records=5))
def test_fuzz_calibrate_reads_scores(data, fuzz_dir):
    from eval.sufficiency import calibrate_main

    path = _write(fuzz_dir, "scores.jsonl", data)
    out = fuzz_dir / "cal.json"
    cal = load_or_clear_error(lambda p: calibrate_main(["--scores", str(p), "--output", str(out),
                                                        "--target_precision", "0.5", "--min_calibration_samples", "2",
                                                        "--min_calibration_per_class", "1"]), path)
    if cal is not None:
        assert json.loads(out.read_text())["threshold"] == cal["threshold"]


@FUZZ
@given(scores=jsonl_text(record({"key": words, "score": st.floats(0, 1) | st.none()})),
       ranks=jsonl_text(record({"key": words, "top10": st.lists(words, max_size=3)})))
def test_fuzz_result_caches(scores, ranks, fuzz_dir):
    from eval.score_cache import ResultCache, ranking_field, score_field

    for name, data, field, check in (("score_cache.jsonl", scores, "score", score_field),
                                     ("ranking_cache.jsonl", ranks, "top10", ranking_field)):
        path = _write(fuzz_dir, name, data)
        cache = load_or_clear_error(lambda p: ResultCache(p, required=(field,), validate=check), path)
        if cache is not None:
            cache.close()
            for rec in cache._records.values():
                check(rec)


# -- record types added by the TextWorld / MemAgent / progressive work ------------------------------------------
STEP = record({"step_id": st.sampled_from(["s0", "s1", "s2"]), "index": st.integers(0, 3), "text": words})
TW_EPISODE = {"schema_version": st.just(1), "episode_id": words, "source": st.just("textworld"),
              "steps": st.lists(STEP, min_size=1, max_size=3),
              "qa": st.lists(record({"qa_id": words, "question": words, "answer": words,
                                     "evidence": st.lists(st.sampled_from(["s0", "s1", "s9"]), max_size=2)}), max_size=2)}


@FUZZ
@given(data=jsonl_text(record(TW_EPISODE), max_records=3))
def test_fuzz_textworld_episodes(data, fuzz_dir):
    from data_synthesis.textworld_episodes import load_textworld

    path = _write(fuzz_dir, "episodes.jsonl", data)
    for ep in load_or_clear_error(load_textworld, path) or []:
        assert isinstance(ep.episode_id, str) and all(isinstance(s.text, str) for s in ep.steps)
        for q in ep.qa:
            assert q.evidence and all(ep.has_step(e) for e in q.evidence)


EXPLORATION = {"id": words, "task_id": words, "begin_provider": words | st.none(),
               "in_policy": st.sampled_from(["always", "never"]), "success": st.booleans(), "steps": st.just(1),
               "trajectory": st.just({"task": "t", "steps": [{"action": "go"}]})}


@FUZZ
@given(data=jsonl_text(record(EXPLORATION)))
def test_fuzz_memagent_exploration_records(data, fuzz_dir):
    from data_synthesis.memagent import load_exploration

    path = _write(fuzz_dir, "exploration.jsonl", data)
    for rec in load_or_clear_error(load_exploration, path) or []:
        assert isinstance(rec["success"], bool) and len(rec["trajectory"]["steps"]) == rec["steps"]


PHASE_ROW = {"prompt": st.just([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]),
             "completion": st.just([{"role": "assistant", "content": "yes"}]), "phase": st.just("in"),
             "reward": st.floats(0, 1)}


@FUZZ
@given(data=jsonl_text(record(PHASE_ROW)))
def test_fuzz_memagent_training_rows(data, fuzz_dir):
    from train.memagent import phase_rows

    path = _write(fuzz_dir, "in.jsonl", data)
    got = load_or_clear_error(lambda p: phase_rows(str(p), "in"), path)
    if got is not None:
        rows, stats = got
        assert stats.get("records", 0) >= len(rows) and all(r["phase"] == "in" for r in rows)


def test_fuzz_inputs_were_not_vacuous():
    """Each fuzzed loader (that ran in this session) saw inputs that load and inputs that are refused."""
    if not OUTCOMES:
        pytest.skip("no fuzz test ran before this one")
    for name, seen in OUTCOMES.items():
        assert seen["loaded"] > 0 and seen["error"] > 0, (name, dict(seen))
