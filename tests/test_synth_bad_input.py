"""Hostile and careless input to the synthesis jobs and corpus loaders (review: bad-input-probe.md, defects
4, 5, 6, 9, 10, 11): each must fail with one clear error naming the file / option / record, before anything
is written, or do the right thing -- never exit 0 with a silently wrong result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from routers.io import OutputLock, OutputLockedError, RecordError
from routers.memory.schema import QA, Episode, Step
from routers.config import ConfigError

SYNTH = ["--corpus", "textworld", "--encoder", "none", "--answer_models", "none", "--eval_fraction", "0.25"]
PLACES = ["Paris", "Oslo", "Lima", "Rome", "Kyoto", "Cairo", "Quito", "Dakar"]


def episode(i: int, n_steps: int = 6, qa: list[dict] | None = None, **kw) -> dict:
    steps = [{"step_id": f"s{j}", "index": j, "text": f"Ann went to {PLACES[(i + j) % 8]} on day {j} of trip {i}."}
             for j in range(n_steps)]
    if qa is None:
        qa = [{"qa_id": f"e{i}/q0", "question": f"Where did Ann go on day 1 of trip {i}?",
               "answer": PLACES[(i + 1) % 8], "evidence": ["s1"]},
              {"qa_id": f"e{i}/q1", "question": f"Where did Ann go on days 2 and 3 of trip {i}?",
               "answer": f"{PLACES[(i + 2) % 8]} and {PLACES[(i + 3) % 8]}", "evidence": ["s2", "s3"]}]
    return {"schema_version": 1, "episode_id": f"e{i}", "source": "toy", "steps": steps, "qa": qa, **kw}


def write_corpus(path: Path, episodes: list[dict], compact: bool = False) -> str:
    sep = (",", ":") if compact else None
    path.write_text("".join(json.dumps(e, separators=sep) + "\n" for e in episodes), encoding="utf-8")
    return str(path)


@pytest.fixture
def corpus(tmp_path) -> str:
    return write_corpus(tmp_path / "corpus.jsonl", [episode(i) for i in range(4)])


def synth(out, corpus_path, *extra):
    from data_synthesis.sufficiency import main

    base = SYNTH[:-2] if "--eval_episodes" in extra else SYNTH  # held out by ids or by a fraction, not both
    return main(["--output_dir", str(out), "--corpus_path", corpus_path, *base, *extra])


def records(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


# -- defect 4: one run per output directory -------------------------------------------------------------------
def _locked_main(out: Path, run):
    with OutputLock(out):
        with pytest.raises(OutputLockedError, match="another memroute run"):
            run()
    assert sorted(p.name for p in out.iterdir()) == [".memroute.lock"]  # nothing written


def test_synth_sufficiency_refuses_a_locked_output_dir(tmp_path, corpus):
    out = tmp_path / "out"
    _locked_main(out, lambda: synth(out, corpus))


def test_synth_retriever_refuses_a_locked_output_dir(tmp_path):
    from data_synthesis.retriever import main

    out = tmp_path / "out"
    _locked_main(out, lambda: main(["--output_dir", str(out), "--corpora", "locomo", "--encoder", "none"]))


def test_synth_textworld_refuses_a_locked_output_dir(tmp_path):
    from data_synthesis.textworld_corpus import main

    out = tmp_path / "out"
    _locked_main(out, lambda: main(["--output_dir", str(out), "--n_games", "1"]))


def test_forced_exploration_refuses_a_locked_output_dir(tmp_path):
    from data_synthesis.memagent import main

    out = tmp_path / "out"
    _locked_main(out, lambda: main(["--output_dir", str(out), "--agent", "random", "--providers", "awm"]))


def test_synth_mix_refuses_a_locked_output_folder(tmp_path):
    from data_synthesis.mix import main

    src = tmp_path / "src.jsonl"
    src.write_text(json.dumps({"id": "a", "question": "q", "context": "c", "label": 1}) + "\n")
    out = tmp_path / "mix"
    _locked_main(out, lambda: main(["--output", str(out / "train.jsonl"), "--sources", str(src)]))


def test_synthesizer_run_holds_the_lock_too(tmp_path, corpus):
    from data_synthesis.sufficiency import SufficiencySynthConfig, SufficiencySynthesizer

    cfg = SufficiencySynthConfig(output_dir=str(tmp_path / "out"), corpus="textworld", corpus_path=corpus,
                                 encoder="none", answer_models=["none"], eval_fraction=0.25)
    with OutputLock(cfg.output_dir), pytest.raises(OutputLockedError):
        SufficiencySynthesizer(cfg).run(progress=False)


# -- defect 5: duplicate ids in a corpus ------------------------------------------------------------------------
def _load(path):
    from data_synthesis.textworld_episodes import load_textworld

    return load_textworld(path)


def test_duplicate_qa_id_in_one_episode_is_an_error(tmp_path):
    ep = episode(1)
    ep["qa"][1]["qa_id"] = ep["qa"][0]["qa_id"]
    path = write_corpus(tmp_path / "dup_qa.jsonl", [episode(0), ep])
    with pytest.raises(RecordError, match=r"dup_qa\.jsonl:2: qa #1: duplicate qa_id 'e1/q0'"):
        _load(path)


def test_duplicate_qa_id_across_episodes_is_an_error(tmp_path):
    ep = episode(2)
    ep["qa"][0]["qa_id"] = "e0/q1"
    path = write_corpus(tmp_path / "dup_qa2.jsonl", [episode(0), episode(1), ep])
    with pytest.raises(RecordError, match=r"dup_qa2\.jsonl:3: qa #0: duplicate qa_id 'e0/q1' .*episode 'e0'"):
        _load(path)
    # and through the synth command: an error, not fewer samples
    with pytest.raises(RecordError, match="duplicate qa_id"):
        synth(tmp_path / "out", path)


def test_duplicate_episode_id_in_compact_json_names_the_real_line(tmp_path):
    path = write_corpus(tmp_path / "compact.jsonl", [episode(0), episode(1), episode(0)], compact=True)
    with pytest.raises(RecordError, match=r"compact\.jsonl:3: duplicate episode_id 'e0'"):
        _load(path)


def test_string_schema_version_is_a_clear_error(tmp_path):
    path = write_corpus(tmp_path / "schema.jsonl", [episode(0), episode(1, schema_version="1")])
    with pytest.raises(RecordError, match=r"schema\.jsonl:2: schema_version must be an integer, got '1'"):
        _load(path)


def test_retriever_record_string_schema_version(tmp_path):
    from data_synthesis.retriever_records import read_retriever_records

    rec = {"schema_version": "1", "id": "a", "qa_id": "a", "episode_id": "e", "query": "q?", "positives": ["p"],
           "negatives": [], "positive_ids": ["p1"], "negative_ids": []}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(RecordError, match=r"r\.jsonl:1: schema_version must be an integer"):
        read_retriever_records(path)


@pytest.mark.parametrize("indexes,kind", [([0, 1, 1, 2], "duplicate"), ([0, 2, 1, 3], "decreasing")])
def test_step_index_must_increase(tmp_path, indexes, kind):
    ep = episode(0, n_steps=4)
    for s, i in zip(ep["steps"], indexes):
        s["index"] = i
    path = write_corpus(tmp_path / "idx.jsonl", [ep])
    with pytest.raises(RecordError, match=rf"idx\.jsonl:1: step #2 \('s2'\): {kind} index"):
        _load(path)


def test_locomo_duplicate_sample_id(tmp_path):
    from data_synthesis.corpora import load_locomo

    conv = {"sample_id": "c1", "conversation": {"session_1": [{"dia_id": "D1:1", "speaker": "A", "text": "hi"}]},
            "qa": [{"question": "q?", "answer": "a", "evidence": ["D1:1"], "category": 1}]}
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([conv, {**conv}]))
    with pytest.raises(ValueError, match=r"locomo\.json: conversation #1 \(c1\): duplicate sample_id 'c1'"):
        load_locomo(path)


def test_hotpotqa_duplicate_id(tmp_path):
    from data_synthesis.corpora import load_hotpotqa

    item = {"_id": "x1", "question": "q?", "answer": "a", "context": [["T", ["s0."]]], "supporting_facts": [["T", 0]]}
    path = tmp_path / "h.json"
    path.write_text(json.dumps([item, {**item, "question": "other?"}]))
    with pytest.raises(ValueError, match=r"h\.json: item #1: duplicate _id 'x1'"):
        load_hotpotqa(path)


# -- defect 6: a rerun with other data settings ---------------------------------------------------------------
def test_sufficiency_rerun_with_other_settings_is_refused_then_resume_never_starts_over(tmp_path, corpus):
    out = tmp_path / "out"
    synth(out, corpus, "--distractors_min", "1", "--distractors_max", "2", "--max_qa_per_episode", "1")
    before = (out / "train.jsonl").read_text()
    with pytest.raises(ConfigError, match=r"distractors_max: 2 -> 0.*distractors_min: 1 -> 0.*max_qa_per_episode"):
        synth(out, corpus, "--distractors_min", "0", "--distractors_max", "0")
    assert (out / "train.jsonl").read_text() == before  # untouched
    synth(out, corpus, "--distractors_min", "1", "--distractors_max", "2", "--max_qa_per_episode", "1")  # same: resumes
    assert (out / "train.jsonl").read_text() == before
    stats = synth(out, corpus, "--distractors_min", "0", "--distractors_max", "0", "--resume", "never")
    recs = records(out / "train.jsonl")
    assert len(recs) == stats["train"]["samples"] == 3 * 2 * 2  # every question now, nothing left from run 1
    for r in recs:
        if r["label"] == 1:  # positives: evidence only, no distractor
            assert r["context_step_ids"] == sorted(r["evidence_ids"], key=lambda s: int(s[1:]))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["distractors_max"] == 0
    with pytest.raises(ConfigError, match="resume must be one of"):
        synth(out, corpus, "--resume", "true")


def test_sufficiency_run_from_before_an_option_existed_resumes_with_its_old_behaviour(tmp_path, corpus):
    """A fingerprint written before ``refill_match_length`` existed ran as ``false``: that resumes; ``true`` is refused."""
    from routers.config import FINGERPRINT_FILE

    out = tmp_path / "out"
    synth(out, corpus, "--max_qa_per_episode", "1", "--refill_match_length", "false")
    fp_path = out / FINGERPRINT_FILE
    fp = json.loads(fp_path.read_text())
    del fp["refill_match_length"]
    fp_path.write_text(json.dumps(fp))
    before = (out / "train.jsonl").read_text()
    with pytest.raises(ConfigError, match=r"refill_match_length: False -> True"):
        synth(out, corpus, "--max_qa_per_episode", "1")
    synth(out, corpus, "--max_qa_per_episode", "1", "--refill_match_length", "false")
    assert (out / "train.jsonl").read_text() == before


def test_retriever_rerun_with_other_settings_is_refused(tmp_path):
    from data_synthesis.retriever import main

    out = tmp_path / "out"
    base = ["--output_dir", str(out), "--corpora", "locomo", "--encoder", "none", "--max_qa_per_episode", "1"]
    main(base)
    n = len(records(out / "train.jsonl"))
    with pytest.raises(ConfigError, match=r"bm25_negatives: 6 -> 1"):
        main([*base, "--bm25_negatives", "1"])
    main([*base, "--bm25_negatives", "1", "--resume", "never"])
    recs = records(out / "train.jsonl")
    assert len(recs) == n and all(r["negative_kinds"].count("bm25") <= 1 for r in recs)


# -- defects 9/10: bad options fail at parse time; empty results are errors -------------------------------------
@pytest.mark.parametrize("flags,match", [
    (["--distractors_min", "6", "--distractors_max", "2"], r"distractors_min \(6\) > distractors_max \(2\)"),
    (["--distractors_min", "-1"], "distractors_min must be >= 0"),
    (["--eval_fraction", "1.5"], r"eval_fraction must be in \(0, 1\)"),
    (["--eval_fraction", "-0.5"], r"eval_fraction must be in \(0, 1\)"),
    (["--eval_fraction", "0"], r"eval_fraction must be in \(0, 1\)"),
    (["--qa_chunk", "0"], "qa_chunk must be >= 1"),
    (["--max_qa_per_episode", "0"], "max_qa_per_episode must be >= 1"),
    (["--hard_pool", "0"], "hard_pool must be >= 1"),
    (["--positive_hard_fraction", "1.5"], r"positive_hard_fraction must be in \[0, 1\]"),
    (["--answer_f1_threshold", "nan"], r"answer_f1_threshold must be in \[0, 1\]"),
    (["--intervention_samples", "false"], "no sample would be made"),
    (["--prefix_top_k", "0"], "prefix_top_k values must be integers >= 1"),
    (["--corpus", "textwrld"], "unknown corpus 'textwrld'"),
])
def test_sufficiency_bad_options_fail_at_parse_time(tmp_path, corpus, flags, match):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=match):
        synth(out, corpus, *flags)
    assert not out.exists()


def test_empty_eval_episodes_in_a_recipe(tmp_path, corpus):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("eval_episodes: []\n")
    with pytest.raises(ConfigError, match="eval_episodes is an empty list"):
        synth(tmp_path / "out", corpus, "--config", str(recipe))


def test_unknown_eval_episodes_are_named(tmp_path, corpus):
    with pytest.raises(ValueError, match=r"eval_episodes \['nosuch'\] are not episodes"):
        synth(tmp_path / "out", corpus, "--eval_episodes", "e1", "nosuch")
    assert not (tmp_path / "out" / "train.jsonl").exists()


@pytest.mark.parametrize("case,match", [
    ("empty", "no episodes"),
    ("all_unknown", "no usable question"),
    ("one_episode", "only 1 episode"),
    ("eval_no_qa", "eval split would have 0 samples"),
])
def test_empty_results_are_errors(tmp_path, case, match):
    eps = [episode(i) for i in range(4)]
    extra = []
    if case == "empty":
        eps = []
    elif case == "all_unknown":
        for e in eps:
            for q in e["qa"]:
                q["evidence"] = ["s999"]
    elif case == "one_episode":
        eps = eps[:1]
    else:
        eps[3]["qa"] = []
        extra = ["--eval_episodes", "e3"]
    path = write_corpus(tmp_path / f"{case}.jsonl", eps)
    with pytest.raises(ValueError, match=match):
        synth(tmp_path / "out", path, *extra)
    assert not (tmp_path / "out" / "train.jsonl").exists()


def test_samples_the_trainer_would_refuse_are_skipped_and_counted(tmp_path):
    from data_synthesis.sufficiency_samples import read_samples

    lone = episode(4, n_steps=1, qa=[{"qa_id": "e4/q0", "question": "Where on day 0?", "answer": "Dakar",
                                      "evidence": ["s0"]}])
    path = write_corpus(tmp_path / "c.jsonl", [episode(i) for i in range(3)] + [lone])
    stats = synth(tmp_path / "out", path, "--eval_episodes", "e0")
    assert stats["this_run"]["skipped_empty_context"] == 1  # the "none" negative of e4 would have no context
    read_samples(tmp_path / "out" / "train.jsonl")  # every record passes the trainer's check


def test_cli_prints_one_line_and_exits_2(tmp_path, corpus, capsys):
    from routers import cli

    rc = cli.main(["synth", "sufficiency", "--output_dir", str(tmp_path / "o"), "--corpus_path", corpus, *SYNTH,
                   "--distractors_min", "6", "--distractors_max", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "distractors_min (6) > distractors_max (2)" in err[0] and "Traceback" not in "\n".join(err)


# -- synth mix -------------------------------------------------------------------------------------------------
def _samples(path: Path, ids, label=1) -> str:
    path.write_text("".join(json.dumps({"id": i, "question": "q", "context": "c", "label": label}) + "\n"
                            for i in ids), encoding="utf-8")
    return str(path)


def test_mix_empty_source_is_an_error(tmp_path):
    from data_synthesis.mix import main

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"empty\.jsonl: no samples"):
        main(["--output", str(tmp_path / "m.jsonl"), "--sources", str(empty)])
    assert not (tmp_path / "m.jsonl").exists()


def test_mix_duplicate_ids_in_one_file_are_an_error(tmp_path):
    from data_synthesis.mix import main

    src = _samples(tmp_path / "dup.jsonl", ["a", "b", "a"])
    with pytest.raises(RecordError, match=r"dup\.jsonl:3: duplicate id 'a'"):
        main(["--output", str(tmp_path / "m.jsonl"), "--sources", src])
    bool_label = tmp_path / "bool.jsonl"
    bool_label.write_text(json.dumps({"id": "a", "question": "q", "context": "c", "label": True}) + "\n")
    with pytest.raises(RecordError, match="label must be 0 or 1"):
        main(["--output", str(tmp_path / "m.jsonl"), "--sources", str(bool_label)])


def test_mix_output_that_is_a_source_is_refused(tmp_path):
    from data_synthesis.mix import main

    src = _samples(tmp_path / "train.jsonl", [f"x{i}" for i in range(10)])
    before = Path(src).read_text()
    with pytest.raises(ValueError, match="is also the output"):
        main(["--output", str(tmp_path / "." / "train.jsonl"), "--sources", f"{src}:n=5"])
    assert Path(src).read_text() == before


def test_mix_paths_with_colons(tmp_path):
    from data_synthesis.mix import main, parse_source

    assert parse_source("C:/data/x.jsonl") == ("C:/data/x.jsonl", None, None)
    assert parse_source("/data/a:b.jsonl:n=3:per_label=2") == ("/data/a:b.jsonl", 3, 2)
    with pytest.raises(ValueError, match="options are"):
        parse_source("x.jsonl:k=3")
    with pytest.raises(ValueError, match="given twice"):
        parse_source("x.jsonl:n=3:n=4")
    d = tmp_path / "run:1"
    d.mkdir()
    src = _samples(d / "a:b.jsonl", ["a", "b", "c"])
    m = main(["--output", str(tmp_path / "m.jsonl"), "--sources", f"{src}:n=2"])
    assert m["samples"] == 2


# -- retriever / textworld / forced-exploration configs -----------------------------------------------------------
@pytest.mark.parametrize("kw,match", [
    ({"window_size": 0}, "window_size must be >= 1"),
    ({"bm25_negatives": -1}, "bm25_negatives must be >= 0"),
    ({"hard_pool": 0}, "hard_pool must be >= 1"),
    ({"max_positives": 0}, "max_positives must be >= 1"),
    ({"max_qa_per_episode": 0}, "max_qa_per_episode must be >= 1"),
    ({"textworld_eval_fraction": 1.0}, r"textworld_eval_fraction must be in \[0, 1\)"),
    ({"hotpotqa_eval_fraction": -0.1}, r"hotpotqa_eval_fraction must be in \[0, 1\)"),
    ({"corpora": ["locomo", "locomo"]}, "each corpus once"),
    ({"corpora": ["lcomo"]}, "unknown"),
    ({"resume": "yes"}, "resume must be one of"),
])
def test_retriever_bad_options(kw, match):
    from data_synthesis.retriever import RetrieverSynthConfig

    with pytest.raises(ValueError, match=match):
        RetrieverSynthConfig(**kw)


def test_retriever_empty_corpus_is_an_error(tmp_path):
    from data_synthesis.retriever import main

    empty = tmp_path / "episodes.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"corpus textworld .*no episodes"):
        main(["--output_dir", str(tmp_path / "out"), "--corpora", "textworld", "--textworld_path", str(empty),
              "--encoder", "none"])
    unknown = write_corpus(tmp_path / "unk.jsonl", [{**episode(i), "qa": [{"qa_id": f"q{i}", "question": "?",
                                                                            "answer": "a", "evidence": ["zz"]}]}
                                                     for i in range(3)])
    with pytest.raises(ValueError, match="train split would have 0 records"):
        main(["--output_dir", str(tmp_path / "out"), "--corpora", "textworld", "--textworld_path", unknown,
              "--encoder", "none"])
    assert not (tmp_path / "out" / "train.jsonl").exists()


def test_retriever_windows_use_list_positions_not_index_values(tmp_path):
    from data_synthesis.retriever import RetrieverSynthConfig
    from data_synthesis.retriever_records import build_record
    from routers.memory.retrieval import HybridRetriever

    steps = [Step(f"s{j}", 100 + 10 * j, f"text number {j} about kites") for j in range(6)]
    qa = QA("q", "what about kites number 3?", "x", ["s3"])
    ep = Episode("e", steps, [qa])
    cfg = RetrieverSynthConfig(output_dir=str(tmp_path), corpora=["locomo"], encoder="none", window_size=3)
    _, lex, _ = HybridRetriever(dense_weight=0.0).scores(qa.question, ep)
    rec = build_record(ep, qa, cfg, "train", lex, None)
    assert rec["positive_ids"] == ["s3", "s2~s4"]  # the window around s3, not one clipped to the episode's end


@pytest.mark.parametrize("kw,match", [
    ({"noise_prob": 1.5}, r"noise_prob must be in \[0, 1\]"),
    ({"n_games": -1}, "n_games must be >= 0"),
    ({"questions_per_type": 0}, "questions_per_type must be >= 1"),
    ({"max_steps": 0, "min_steps": 0}, "max_steps must be >= 1"),
    ({"resume": "true"}, "resume must be one of"),
])
def test_textworld_bad_options(kw, match):
    from data_synthesis.textworld_corpus import TextWorldCorpusConfig

    with pytest.raises(ValueError, match=match):
        TextWorldCorpusConfig(**kw)


def test_textworld_rerun_with_other_settings_is_refused(tmp_path):
    from data_synthesis.textworld_corpus import main

    out = tmp_path / "tw"
    main(["--output_dir", str(out), "--n_games", "0"])
    (out / "episodes.jsonl").write_text(json.dumps(episode(0)) + "\n")  # as if a game had been written
    with pytest.raises(ConfigError, match=r"noise_prob: 0\.7 -> 0\.2"):
        main(["--output_dir", str(out), "--n_games", "0", "--noise_prob", "0.2"])
    main(["--output_dir", str(out), "--n_games", "0", "--noise_prob", "0.2", "--resume", "never"])
    assert (out / "episodes.jsonl").read_text() == ""  # started over


@pytest.mark.parametrize("kw,match", [
    ({"max_steps": 0}, "max_steps must be >= 1"),
    ({"num_workers": 0}, "num_workers must be >= 1"),
    ({"begin_min_reward": 2.0}, r"begin_min_reward must be in \[0, 1\]"),
    ({"n_train": 0}, "n_train must be >= 1 when splits includes 'train'"),
    ({"splits": []}, "splits is empty"),
    ({"providers": ["awm", "awm"]}, "given more than once"),
    ({"providers": [], "include_no_memory": False}, "no Begin option"),
    ({"length_norm": "max"}, "length_norm"),
    ({"game_presets": []}, "game_presets is empty"),
])
def test_forced_exploration_bad_options(kw, match):
    from data_synthesis.memagent import ForcedExplorationConfig

    with pytest.raises(ValueError, match=match):
        ForcedExplorationConfig(**kw)


def test_forced_exploration_corrupt_manifest_names_the_file(tmp_path):
    from data_synthesis.memagent import ForcedExplorationConfig, ForcedExplorer

    (tmp_path / "manifest.json").write_text("{not json")
    explorer = ForcedExplorer.__new__(ForcedExplorer)
    explorer.cfg, explorer.out, explorer.providers = ForcedExplorationConfig(output_dir=str(tmp_path)), tmp_path, {}
    with pytest.raises(ValueError, match=r"manifest\.json: unreadable manifest"):
        explorer.check_manifest()
