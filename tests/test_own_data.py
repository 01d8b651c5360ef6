"""Your own data in (issue 17): the generic ``episodes`` corpus, ``memroute validate``, held-out splits by id or by
fraction, the synthesis jobs on it (no model: ``encoder none``, no answer model) and the worked converter."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from data_synthesis.corpora import held_out_split, load_corpus, load_locomo, split_episodes
from data_synthesis.episodes_corpus import EpisodesCorpusError, load_episodes, scan
from routers.config import ConfigError
from routers.memory.schema import LoadStats

PLACES = ["Paris", "Oslo", "Lima", "Rome", "Kyoto", "Cairo", "Quito", "Dakar"]


def episode(i: int, n_steps: int = 6, **kw) -> dict:
    steps = [{"step_id": f"s{j}", "index": j, "speaker": "Ann", "text": f"Ann went to {PLACES[(i + j) % 8]} on day {j} "
              f"of trip {i}."} for j in range(n_steps)]
    qa = [{"qa_id": f"e{i}/q0", "question": f"Where did Ann go on day 1 of trip {i}?", "answer": PLACES[(i + 1) % 8],
           "evidence": ["s1"]},
          {"qa_id": f"e{i}/q1", "question": f"Where did Ann go on days 2 and 3 of trip {i}?",
           "answer": f"{PLACES[(i + 2) % 8]} and {PLACES[(i + 3) % 8]}", "evidence": ["s2", "s3"]}]
    return {"episode_id": f"e{i}", "source": "toy", "steps": steps, "qa": qa, **kw}


def write_jsonl(path: Path, lines: list) -> str:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines))
    return str(path)


@pytest.fixture
def corpus(tmp_path) -> str:
    return write_jsonl(tmp_path / "own.jsonl", [episode(i) for i in range(8)])


@pytest.fixture
def validate_log():
    """The validator's log lines (memroute's CLI logger does not propagate to pytest's caplog)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger("memroute.data_synthesis.validate")
    log.addHandler(handler)
    yield records
    log.removeHandler(handler)


# -- bad records: every one, with file:line and field ------------------------------------------------------
def _bad_corpus(tmp_path) -> tuple[str, dict[int, str]]:
    no_text = episode(1)
    del no_text["steps"][2]["text"]
    ghost = episode(3)
    ghost["qa"][1]["evidence"] = ["s2", "s99"]
    decreasing = episode(5)
    decreasing["steps"][3]["index"] = 1
    typo = episode(7)
    typo["questions"] = typo.pop("qa")
    wrong_type = episode(9)
    wrong_type["qa"][0]["evidence"] = "s1"
    reused_qa = episode(10)
    reused_qa["qa"][0]["qa_id"] = "e0/q1"
    lines = [episode(0), no_text, b"", b'{"episode_id": "e2", "steps": [', ghost, episode(0), decreasing,
             b"\xff\xfe not utf-8", typo, b"[1, 2]", wrong_type, reused_qa, episode(11)]
    expected = {2: "step #2: missing field(s) ['text']", 4: "invalid JSON",
                5: "qa #1 ('e3/q1'): field 'evidence': ['s99'] is not a step id",
                6: "duplicate episode_id 'e0' (also at line 1)",
                7: "step #3 ('s3'): decreasing index 1", 8: "not UTF-8", 9: "unknown field(s) ['questions']",
                10: "expected a JSON object", 11: "qa #0: field 'evidence': expected a list",
                12: "qa #0: duplicate qa_id 'e0/q1'"}
    return write_jsonl(tmp_path / "bad.jsonl", lines), expected


def test_every_bad_record_is_reported_with_file_line_and_field(tmp_path):
    path, expected = _bad_corpus(tmp_path)
    result = scan(path)
    got = {int(p.position): p.reason for p in result.problems}
    assert sorted(got) == sorted(expected), result.problems
    for line, reason in expected.items():
        assert reason in got[line], (line, got[line])
    assert all(str(p).startswith(f"{path}:{p.position}: ") for p in result.problems)
    # the good records, including those after the unreadable lines, are all read
    assert [e.episode_id for e in result.episodes] == ["e0", "e11"]


def test_loader_refuses_bad_records_naming_them(tmp_path):
    path, expected = _bad_corpus(tmp_path)
    with pytest.raises(EpisodesCorpusError) as err:
        load_corpus("episodes", path)
    assert len(err.value.problems) == len(expected)
    assert f"{path}:5: qa #1 ('e3/q1'): field 'evidence'" in str(err.value)
    assert f"{path}:12: qa #0: duplicate qa_id" in str(err.value)


def test_validate_command_reports_all_and_exits_2(tmp_path, validate_log):
    from data_synthesis.validate import main

    path, expected = _bad_corpus(tmp_path)
    assert main([path]) == 2
    errors = [r.getMessage() for r in validate_log if r.levelno >= logging.ERROR]
    for line in expected:
        assert any(m.startswith(f"{path}:{line}: ") for m in errors), line
    assert errors[-1].startswith(f"{path}: {len(expected)} bad record(s)")


def test_validate_command_one_line_summary(corpus, validate_log, tmp_path):
    from data_synthesis.validate import main

    no_evidence = episode(8)
    no_evidence["qa"][0]["evidence"] = []
    path = write_jsonl(tmp_path / "c.jsonl", [episode(i) for i in range(3)] + [no_evidence])
    assert main([path]) == 0
    assert [r.getMessage() for r in validate_log] == [
        f"{path}: OK: 4 episodes, 24 steps, 8 questions, 7 with evidence"]
    stats = LoadStats()
    eps = load_episodes(path, stats=stats)  # the question without evidence is dropped and counted
    assert stats.skipped_no_evidence == 1 and sum(len(e.qa) for e in eps) == 7


def test_missing_index_is_the_list_position_and_other_formats(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    recs = [episode(i) for i in range(3)]
    for s in recs[0]["steps"]:
        del s["index"]
    assert [s.index for s in load_episodes(write_jsonl(tmp_path / "a.jsonl", recs))[0].steps] == list(range(6))
    as_list = tmp_path / "a.json"
    as_list.write_text(json.dumps(recs))
    assert [e.episode_id for e in load_corpus("episodes", str(as_list))] == ["e0", "e1", "e2"]
    recs[1]["qa"][0]["evidence"] = ["nope"]
    as_list.write_text(json.dumps(recs))
    assert [str(p) for p in scan(str(as_list)).problems] == [
        f"{as_list}:item 1: qa #0 ('e1/q0'): field 'evidence': ['nope'] is not a step id of the episode"]
    pq.write_table(pa.Table.from_pylist(recs), tmp_path / "a.parquet")  # Arrow fills absent fields with null
    result = scan(str(tmp_path / "a.parquet"))
    assert [(p.position, "field 'evidence'" in p.reason) for p in result.problems] == [("row 1", True)]
    assert [e.episode_id for e in result.episodes] == ["e0", "e2"]


def test_missing_file_and_offline_hub_id(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        load_corpus("episodes", str(tmp_path / "nope.jsonl"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EpisodesCorpusError, match="cannot be fetched as a Hugging Face Hub dataset id while offline"):
        load_corpus("episodes", "someone/their-episodes")
    with pytest.raises(ValueError, match="needs corpus_path"):
        load_corpus("episodes", None)


# -- held-out split: by ids or by a seeded fraction of whole episodes ----------------------------------------
def test_fraction_split_is_deterministic_and_episode_level(corpus):
    eps = load_corpus("episodes", corpus)
    train, held = held_out_split(eps, eval_fraction=0.25, seed=3)
    assert len(held) == 2 and len(train) == 6
    assert not {e.episode_id for e in train} & {e.episode_id for e in held}
    assert {q.qa_id for e in held for q in e.qa} == {f"{e.episode_id}/q{i}" for e in held for i in (0, 1)}
    again = held_out_split(list(reversed(load_corpus("episodes", corpus))), eval_fraction=0.25, seed=3)
    assert {e.episode_id for e in again[1]} == {e.episode_id for e in held}  # input order does not matter
    assert len({frozenset(e.episode_id for e in held_out_split(eps, eval_fraction=0.25, seed=s)[1])
                for s in range(8)}) > 1  # the seed matters
    assert held_out_split(eps)[1] == split_episodes(eps, 0.2, 0)[1]  # neither given: 0.2
    assert [e.episode_id for e in held_out_split(eps, eval_episodes=["e5"])[1]] == ["e5"]


@pytest.mark.parametrize("kw,match", [
    (dict(eval_episodes=["e1"], eval_fraction=0.2), "not both"),
    (dict(eval_episodes=["e1", "zz"]), r"eval_episodes \['zz'\] are not episodes"),
    (dict(eval_fraction=1.0), r"eval_fraction must be in \(0, 1\)"),
    (dict(eval_fraction=0.99), "the train split would have no episodes"),
    (dict(eval_episodes=[f"e{i}" for i in range(8)]), "the train split would have no episodes"),
])
def test_split_errors(corpus, kw, match):
    with pytest.raises(ValueError, match=match):
        held_out_split(load_corpus("episodes", corpus), **kw)


# -- the jobs on it ------------------------------------------------------------------------------------------
SYNTH = ["--corpus", "episodes", "--encoder", "none", "--answer_models", "none"]


def test_synth_sufficiency_end_to_end(corpus, tmp_path):
    from data_synthesis.sufficiency import main
    from routers.io import read_jsonl

    out = tmp_path / "suff"
    stats = main(["--output_dir", str(out), "--corpus_path", corpus, *SYNTH, "--eval_fraction", "0.25",
                  "--split_seed", "3"])
    manifest = json.loads((out / "manifest.json").read_text())
    _, held = held_out_split(load_corpus("episodes", corpus), eval_fraction=0.25, seed=3)
    assert sorted(manifest["eval_episodes"]) == sorted(e.episode_id for e in held)
    assert stats["train"]["samples"] == 6 * 2 * 2 and stats["eval"]["samples"] == 2 * 2 * 2
    train = list(read_jsonl(out / "train.jsonl"))
    evals = list(read_jsonl(out / "eval.jsonl"))
    assert {r["episode_id"] for r in evals} == set(manifest["eval_episodes"])
    assert not {r["episode_id"] for r in train} & set(manifest["eval_episodes"])
    assert {r["source"] for r in train} == {"toy"} and {r["label"] for r in train} == {0, 1}
    # the same split and records from a second run
    main(["--output_dir", str(tmp_path / "again"), "--corpus_path", corpus, *SYNTH, "--eval_fraction", "0.25",
          "--split_seed", "3"])
    assert (tmp_path / "again" / "eval.jsonl").read_text() == (out / "eval.jsonl").read_text()


def test_synth_sufficiency_refuses_both_split_options_and_bad_records(corpus, tmp_path):
    from data_synthesis.sufficiency import main

    with pytest.raises(ConfigError, match="eval_episodes or eval_fraction, not both"):
        main(["--output_dir", str(tmp_path / "o"), "--corpus_path", corpus, *SYNTH, "--eval_fraction", "0.25",
              "--eval_episodes", "e1"])
    path, _ = _bad_corpus(tmp_path)
    with pytest.raises(EpisodesCorpusError, match=r"bad\.jsonl:2: step #2: missing field"):
        main(["--output_dir", str(tmp_path / "o"), "--corpus_path", path, *SYNTH])
    assert not (tmp_path / "o" / "train.jsonl").exists()


def test_synth_retriever_and_eval_retrieval_on_own_data(corpus, tmp_path):
    from data_synthesis.retriever import RetrieverSynthConfig, RetrieverSynthesizer
    from eval.retrieval import RetrievalEvalConfig, _load_episodes

    cfg = RetrieverSynthConfig(output_dir=str(tmp_path / "ret"), corpora=["episodes"], episodes_path=corpus,
                               episodes_eval_episodes=["e2", "e6"], encoder="none")
    stats = RetrieverSynthesizer(cfg).run(progress=False)
    assert stats["train"]["records"] == 12 and stats["eval"]["records"] == 4
    assert stats["eval"]["episodes"] == ["e2", "e6"] and stats["train"]["by_source"] == {"toy": 12}
    with pytest.raises(ValueError, match="set episodes_path"):
        RetrieverSynthConfig(corpora=["episodes"])
    ecfg = RetrievalEvalConfig(corpus="episodes", corpus_path=corpus, eval_episodes=["e2", "e6"], systems=["bm25"],
                               output_dir=str(tmp_path / "ev"))
    episodes, _ = _load_episodes(ecfg)
    assert [e.episode_id for e in episodes] == ["e2", "e6"]


# -- the worked converter ------------------------------------------------------------------------------------
def test_converter_inline_fixture(tmp_path):
    from data_synthesis.examples.convert_sessions import main

    conv = [{"sample_id": "c1", "conversation": {
        "speaker_a": "Ann", "speaker_b": "Bo", "session_2_date_time": "2 May", "session_1_date_time": "1 May",
        "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "I moved to Oslo."},
                      {"speaker": "Bo", "dia_id": "D1:2", "text": "Nice!", "blip_caption": "a fjord"}],
        "session_2": [{"speaker": "Ann", "dia_id": "D2:1", "text": "Now I live in Lima."}]},
        "qa": [{"question": "Where did Ann move first?", "answer": "Oslo", "evidence": ["D1:1"], "category": 4},
               {"question": "Where does Ann live?", "answer": "Lima", "evidence": ["D2:01; D1:1"], "category": 2},
               {"question": "What pet?", "adversarial_answer": "a cat", "evidence": ["D1:2"], "category": 5},
               {"question": "No evidence?", "answer": "x", "evidence": []}]}]
    src = tmp_path / "conv.json"
    src.write_text(json.dumps(conv))
    main([str(src), str(tmp_path / "out.jsonl")])
    (ep,) = load_corpus("episodes", str(tmp_path / "out.jsonl"))
    assert [(s.step_id, s.index, s.session, s.timestamp) for s in ep.steps] == [
        ("D1:1", 0, "1", "1 May"), ("D1:2", 1, "1", "1 May"), ("D2:1", 2, "2", "2 May")]
    assert ep.steps[1].text == "Nice! [shares a photo: a fjord]"
    assert [(q.qa_id, q.evidence, q.category) for q in ep.qa] == [
        ("c1/q0", ["D1:1"], "single-hop"), ("c1/q1", ["D2:1", "D1:1"], "temporal")]
    assert ep.to_dict() == load_locomo(src)[0].to_dict()


def test_converted_locomo_round_trips_to_the_native_loader(tmp_path):
    from data_synthesis.corpora import bundled_locomo_path
    from data_synthesis.examples.convert_sessions import main

    assert main([str(bundled_locomo_path()), str(tmp_path / "locomo.jsonl")]) == 0
    converted = [e.to_dict() for e in load_corpus("episodes", str(tmp_path / "locomo.jsonl"))]
    native = [e.to_dict() for e in load_locomo()]
    assert len(native) == 10 and converted == native
