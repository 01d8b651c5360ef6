"""The evaluation commands against hostile and careless input (review bad-input-probe.md, defects 3, 9, 10):
each case is one clear error naming the file / option, or a refusal that is printed and recorded -- never a
raw traceback, a silent empty result or a calibration written into a router from data that cannot carry one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from routers.io import OutputLock, OutputLockedError, RecordError
from routers import cli
from routers.base import RouterConfigError
from routers.config import ConfigError, parse_config

ORIGINAL_CALIBRATION = {"threshold": 0.5}  # what save_pretrained writes


# -- fixtures --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def router_template(tiny_llama_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from routers.sufficiency import SufficiencyRouter

    export = tmp_path_factory.mktemp("bad-input-router") / "router"
    SufficiencyRouter.from_model(AutoModelForCausalLM.from_pretrained(tiny_llama_dir),
                                 AutoTokenizer.from_pretrained(tiny_llama_dir), max_input_tokens=256,
                                 base_model=tiny_llama_dir).save_pretrained(export)
    assert json.loads((export / "calibration.json").read_text()) == ORIGINAL_CALIBRATION
    return export


@pytest.fixture()
def router(router_template, tmp_path):
    """A fresh copy per test: a test that writes into it cannot leak into another."""
    import shutil

    return Path(shutil.copytree(router_template, tmp_path / "router"))


def samples(n_pos: int, n_neg: int) -> list[dict]:
    out = []
    for i in range(n_pos + n_neg):
        label = int(i < n_pos)
        out.append({"id": f"e{i}", "question": f"Where did Alice move? ({i})", "label": label,
                    "context": f"Alice moved to Paris in {2000 + i}." if label else f"Bob likes tea ({i}).",
                    "variant": "positive" if label else "none"})
    return out


def write_jsonl(path: Path, recs) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def eval_suff(router, data, out, *extra):
    from eval.sufficiency import main

    return main(["--router", str(router), "--base_model", "none", "--data", str(data), "--output_dir", str(out),
                 "--batch_size", "8", *extra])


def cal_of(router) -> dict:
    return json.loads((Path(router) / "calibration.json").read_text())


# -- defect 3: calibration is opt-in into the router, and refused on data that cannot carry it -----------
def test_eval_does_not_write_calibration_into_the_router_by_default(router, tmp_path, capsys):
    data = write_jsonl(tmp_path / "eval.jsonl", samples(12, 12))
    m = eval_suff(router, data, tmp_path / "out")
    assert cal_of(router) == ORIGINAL_CALIBRATION  # the deployed tau is untouched
    assert m["calibration"] is not None and m["calibration_skipped"] is None
    assert m["calibration_written_to_router"] is False
    assert json.loads((tmp_path / "out" / "calibration.json").read_text())["threshold"] == m["calibration"]["threshold"]
    assert "not written into the router" in capsys.readouterr().out


def test_eval_writes_calibration_into_the_router_only_when_asked(router, tmp_path):
    data = write_jsonl(tmp_path / "eval.jsonl", samples(12, 12))
    m = eval_suff(router, data, tmp_path / "out", "--write_calibration_to_router", "true")
    assert m["calibration_written_to_router"] is True and cal_of(router) == m["calibration"]


def test_eval_refuses_a_one_class_calibration_and_says_so(router, tmp_path, capsys, memroute_log):
    data = write_jsonl(tmp_path / "single.jsonl", samples(24, 0))  # the probe's ev_single_class, larger
    out = tmp_path / "out"
    out.mkdir()
    (out / "calibration.json").write_text('{"threshold": 0.1}')  # stale, from an earlier run
    m = eval_suff(router, data, out, "--write_calibration_to_router", "true")
    assert cal_of(router) == ORIGINAL_CALIBRATION
    assert m["calibration"] is None and m["calibration_written_to_router"] is False
    assert "one class" in m["calibration_skipped"] and "24 positive and 0 negative" in m["calibration_skipped"]
    assert not (out / "calibration.json").exists() and m["files"]["calibration"] is None
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["calibration_skipped"] == m["calibration_skipped"]
    captured = capsys.readouterr()
    assert "calibration skipped: only one class" in captured.out
    warnings = [r.getMessage() for r in memroute_log.records if r.levelname == "WARNING"]
    assert any("NOTHING was written" in m and str(router) in m for m in warnings), warnings


def test_eval_refuses_calibration_from_too_few_samples(router, tmp_path):
    data = write_jsonl(tmp_path / "small.jsonl", samples(4, 4))
    m = eval_suff(router, data, tmp_path / "out", "--write_calibration_to_router", "true")
    assert m["calibration"] is None and "too few samples" in m["calibration_skipped"]
    assert "at least 20" in m["calibration_skipped"] and cal_of(router) == ORIGINAL_CALIBRATION
    data = write_jsonl(tmp_path / "skewed.jsonl", samples(20, 3))
    m = eval_suff(router, data, tmp_path / "out2", "--write_calibration_to_router", "true")
    assert "too few of one class" in m["calibration_skipped"] and cal_of(router) == ORIGINAL_CALIBRATION
    # the minimums are options: a user who knows better can lower them
    m = eval_suff(router, data, tmp_path / "out3", "--write_calibration_to_router", "true",
                  "--min_calibration_per_class", "3")
    assert m["calibration"] is not None and cal_of(router) == m["calibration"]


def test_write_calibration_to_router_needs_a_router(tmp_path, tiny_llama_dir):
    from eval.sufficiency import main

    data = write_jsonl(tmp_path / "eval.jsonl", samples(12, 12))
    with pytest.raises(ConfigError, match="needs --router"):
        main(["--base_model", tiny_llama_dir, "--data", str(data), "--output_dir", str(tmp_path / "o"),
              "--write_calibration_to_router", "true"])


def scores_file(path: Path, n_pos: int, n_neg: int, field: str = "trained") -> Path:
    rows = [{"id": f"s{i}", "label": int(i < n_pos), field: (0.6 + i / 200 if i < n_pos else 0.4 - i / 200)}
            for i in range(n_pos + n_neg)]
    return write_jsonl(path, rows)


def test_calibrate_refuses_one_class_or_too_few_and_writes_nothing(tmp_path):
    from eval.sufficiency import calibrate_main

    out = tmp_path / "calibration.json"
    for (n_pos, n_neg), match in (((10, 0), "only one class"), ((0, 25), "only one class"),
                                  ((5, 5), "too few samples"), ((30, 2), "too few of one class")):
        scores = scores_file(tmp_path / "scores.jsonl", n_pos, n_neg)
        with pytest.raises(ValueError, match=match) as err:
            calibrate_main(["--scores", str(scores), "--output", str(out)])
        assert "scores.jsonl" in str(err.value) and "nothing written" in str(err.value)
        assert not out.exists()
    scores = scores_file(tmp_path / "scores.jsonl", 5, 5)
    cal = calibrate_main(["--scores", str(scores), "--output", str(out), "--min_calibration_samples", "10"])
    assert json.loads(out.read_text())["threshold"] == cal["threshold"]
    # over-budget (null) scores do not count towards the minimum
    rows = [{"id": f"s{i}", "label": i % 2, "trained": None if i >= 6 else 0.5} for i in range(30)]
    with pytest.raises(ValueError, match=r"3 positive and 3 negative in-budget samples \(24 over budget\)"):
        calibrate_main(["--scores", str(write_jsonl(tmp_path / "nulls.jsonl", rows)), "--output", str(out)])
    rows = [{"id": f"s{i}", "label": i % 2, "trained": None} for i in range(30)]
    with pytest.raises(ValueError, match="no in-budget scores: all 30 samples are over"):
        calibrate_main(["--scores", str(write_jsonl(tmp_path / "nulls.jsonl", rows)), "--output", str(out)])


def test_calibrate_bad_paths_and_options(tmp_path):
    from eval.sufficiency import calibrate_main

    scores = scores_file(tmp_path / "scores.jsonl", 12, 12)
    with pytest.raises(ConfigError, match="is a directory"):
        calibrate_main(["--scores", str(scores), "--output", str(tmp_path)])  # a router dir, not a file
    with pytest.raises(FileNotFoundError, match="--scores .*missing.jsonl: file not found"):
        calibrate_main(["--scores", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "c.json")])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        calibrate_main(["--scores", str(scores), "--output", str(tmp_path / "no" / "dir" / "c.json")])
    for flag, value in (("--target_precision", "1.5"), ("--target_early_termination", "-0.1"),
                        ("--target_precision", "nan"), ("--min_calibration_per_class", "0"),
                        ("--min_calibration_samples", "1")):
        with pytest.raises(ConfigError, match=flag.lstrip("-")):
            calibrate_main(["--scores", str(scores), "--output", str(tmp_path / "c.json"), flag, value])
    assert not (tmp_path / "c.json").exists()


# -- defect 9: a broken or missing router export is one error naming it; prog names ------------------------
def test_eval_corrupt_router_config_names_the_file(tmp_path):
    from eval.sufficiency import main

    bad = tmp_path / "corrupt_cfg"
    bad.mkdir()
    (bad / "router_config.json").write_text('{"router_type": "sufficiency", "base_mo')
    data = write_jsonl(tmp_path / "eval.jsonl", samples(3, 3))
    with pytest.raises(RouterConfigError, match=r"corrupt_cfg/router_config.json: invalid JSON"):
        main(["--data", str(data), "--router", str(bad), "--output_dir", str(tmp_path / "o")])  # default base_model
    (bad / "router_config.json").write_text('{"router_type": "retriever", "base_model": "x"}')
    with pytest.raises(RouterConfigError, match="expected 'sufficiency'"):
        main(["--data", str(data), "--router", str(bad), "--output_dir", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()  # refused before any output


def test_eval_missing_router_dir_is_one_line(tmp_path, capsys):
    data = write_jsonl(tmp_path / "eval.jsonl", samples(3, 3))
    missing = tmp_path / "nonexistent"
    rc = cli.main(["eval", "sufficiency", "--data", str(data), "--router", str(missing),
                   "--output_dir", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and f"--router {missing}: no such directory" in err and "Traceback" not in err


def test_eval_parsers_show_the_memroute_command():
    from eval import memagent, progressive, retrieval, sufficiency

    assert sufficiency.make_parser().prog == "memroute eval sufficiency"
    assert sufficiency.make_calibrate_parser().prog == "memroute calibrate"
    assert retrieval.make_parser().prog == "memroute eval retrieval"
    assert progressive.make_parser().prog == "memroute eval progressive"
    assert memagent.make_parser().prog == "memroute eval memagent"
    assert "memroute eval sufficiency" in sufficiency.make_parser().format_usage()


# -- defect 10: degenerate options and inputs fail, with the option / file named -----------------------------
def test_eval_sufficiency_bad_numeric_options_fail_when_parsed(tmp_path):
    from eval.sufficiency import SufficiencyEvalConfig, load_eval_records, make_parser

    for flag, value in (("--max_samples", "0"), ("--max_samples", "-3"), ("--batch_size", "0"),
                        ("--target_precision", "1.5"), ("--target_early_termination", "2"),
                        ("--min_calibration_per_class", "0")):
        with pytest.raises(ConfigError, match=flag.lstrip("-")):
            parse_config(make_parser(), [SufficiencyEvalConfig], ["--data", "x.jsonl", flag, value])
    with pytest.raises(ConfigError, match=r"taus must lie in \[0, 1\]"):
        parse_config(make_parser(), [SufficiencyEvalConfig], ["--taus", "0.5", "1.5"])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("max_samples: 0\n")
    with pytest.raises(ConfigError, match="recipe.yaml.*max_samples"):
        parse_config(make_parser(), [SufficiencyEvalConfig], [str(recipe)])
    data = write_jsonl(tmp_path / "eval.jsonl", samples(2, 2))
    with pytest.raises(ValueError, match="max_samples"):
        load_eval_records(data, 0)
    assert len(load_eval_records(data, 1)) == 1


def test_eval_sufficiency_bad_data_files(tmp_path, router_template):
    from eval.sufficiency import main

    base = ["--router", str(router_template), "--base_model", "none", "--output_dir", str(tmp_path / "o")]
    (tmp_path / "empty.jsonl").write_text("\n\n")
    for data, err, match in ((tmp_path / "empty.jsonl", ValueError, "empty.jsonl: no samples"),
                             (tmp_path, ValueError, "is a directory"),
                             (tmp_path / "missing.jsonl", FileNotFoundError, "missing.jsonl: sample file not found")):
        with pytest.raises(err, match=match):
            main([*base, "--data", str(data)])
    bad = samples(2, 2)
    bad[1]["label"] = True
    bad[2]["question"] = "  "
    with pytest.raises(RecordError, match=r"bad.jsonl:2: label must be 0 or 1"):
        main([*base, "--data", str(write_jsonl(tmp_path / "bad.jsonl", bad))])
    assert not (tmp_path / "o").exists()


def test_eval_sufficiency_output_dir_is_locked(router, tmp_path):
    data = write_jsonl(tmp_path / "eval.jsonl", samples(12, 12))
    out = tmp_path / "out"
    with OutputLock(out):
        with pytest.raises(OutputLockedError, match="another memroute run"):
            eval_suff(router, data, out, "--write_calibration_to_router", "true")
    assert not (out / "score_cache.jsonl").exists() and cal_of(router) == ORIGINAL_CALIBRATION


# -- eval retrieval ------------------------------------------------------------------------------------------
def textworld_corpus(tmp_path) -> Path:
    """g1 has a question; g2 has steps and no question."""
    from routers.memory.schema import QA, Episode, Step

    eps = [Episode("g1", [Step("s1", 0, "you open the fridge"), Step("s2", 1, "you take the red apple")],
                   [QA("g1/q0", "What did you take?", "the red apple", ["s2"])]),
           Episode("g2", [Step("s1", 0, "you walk north")], [])]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(e.to_dict()) + "\n" for e in eps))
    return path


def test_retrieval_bad_options(tmp_path):
    from eval.retrieval import RetrievalEvalConfig, make_parser

    for kw, match in (({"ks": [0]}, "ks"), ({"ks": [5, 20]}, "ks"), ({"ks": []}, "ks"), ({"dense_weight": 1.5}, "dense_weight"),
                      ({"max_queries": 0}, "max_queries"), ({"max_queries": -2}, "max_queries"),
                      ({"batch_size": 0}, "batch_size"), ({"eval_episodes": []}, "eval_episodes is empty")):
        with pytest.raises(ValueError, match=match):
            RetrievalEvalConfig(**kw)
    with pytest.raises(ConfigError, match="command line: .*ks must be cutoffs in 1..10"):
        parse_config(make_parser(), [RetrievalEvalConfig], ["--ks", "1", "-5"])
    (cfg,) = parse_config(make_parser(), [RetrievalEvalConfig], ["--eval_episodes", "all"])
    assert cfg.eval_episodes is None


def test_retrieval_empty_question_selection(tmp_path):
    from retriever_helpers import BagOfLetters

    from eval.retrieval import RetrievalEvalConfig, run

    corpus = textworld_corpus(tmp_path)
    enc = {"base": BagOfLetters()}
    with pytest.raises(ValueError, match=r"\['g2'\] hold no questions"):
        run(RetrievalEvalConfig(corpus="textworld", corpus_path=str(corpus), eval_episodes=["g2"], systems=["bm25"],
                                output_dir=str(tmp_path / "o")), encoders=enc)
    with pytest.raises(ValueError, match=r"\['nosuch'\] not found in textworld .*corpus.jsonl .*'g1', 'g2'"):
        run(RetrievalEvalConfig(corpus="textworld", corpus_path=str(corpus), eval_episodes=["nosuch"],
                                output_dir=str(tmp_path / "o")), encoders=enc)
    assert not (tmp_path / "o").exists()
    report = run(RetrievalEvalConfig(corpus="textworld", corpus_path=str(corpus), eval_episodes=["g1", "g2"],
                                     systems=["bm25"], output_dir=str(tmp_path / "o")), encoders=enc)
    assert report["data"]["questions"] == 1 and (tmp_path / "o" / "resolved_config.yaml").exists()


def test_retrieval_output_dir_is_locked(tmp_path):
    from retriever_helpers import BagOfLetters

    from eval.retrieval import RetrievalEvalConfig, run

    out = tmp_path / "o"
    cfg = RetrievalEvalConfig(corpus="textworld", corpus_path=str(textworld_corpus(tmp_path)), eval_episodes=None,
                              systems=["bm25", "base"], output_dir=str(out))
    with OutputLock(out):
        with pytest.raises(OutputLockedError):
            run(cfg, encoders={"base": BagOfLetters()})
    assert not (out / "ranking_cache.jsonl").exists()


# -- eval progressive ------------------------------------------------------------------------------------------
def _prog_cfg(tmp_path, **kw):
    from eval.progressive import ProgressiveEvalConfig

    base = dict(corpus="textworld", corpus_path=str(textworld_corpus(tmp_path)), dev_episodes=["g1"],
                test_episodes=["none"], encoder="none", rag_encoder="none", output_dir=str(tmp_path / "out"),
                max_retries=0, retry_backoff=0.0)
    return ProgressiveEvalConfig(**{**base, **kw})


def test_progressive_bad_numeric_options(tmp_path):
    from eval.progressive import ProgressiveEvalConfig, make_parser

    cases = (({"top_k": 0}, "top_k"), ({"rag_k": -1}, "rag_k"), ({"block_overlap": 8}, "block_overlap"),
             ({"block_size": 0}, "block_size"), ({"max_questions_per_episode": 0}, "max_questions_per_episode"),
             ({"max_questions_per_episode": -1}, "max_questions_per_episode"), ({"taus": [0.5, 1.5]}, "taus"),
             ({"taus": []}, "taus"), ({"dense_weight": -0.1}, "dense_weight"), ({"http_timeout": 0.0}, "http_timeout"),
             ({"max_retries": -1}, "max_retries"), ({"neighbours": -1}, "neighbours"),
             ({"model_window": 0}, "model_window"), ({"max_score_drop": float("nan")}, "max_score_drop"),
             ({"dev_episodes": ["g1", "g1"]}, "listed more than once"))
    for kw, match in cases:
        with pytest.raises(ValueError, match=match):
            _prog_cfg(tmp_path, **kw)
    with pytest.raises(ConfigError, match="command line: .*top_k must be >= 1"):
        parse_config(make_parser(), [ProgressiveEvalConfig], ["--top_k", "-3"])


def test_progressive_router_export_errors_name_it(tmp_path):
    from eval import progressive as ev

    bad = tmp_path / "corrupt"
    bad.mkdir()
    (bad / "router_config.json").write_text("{")
    with pytest.raises(RouterConfigError, match="corrupt/router_config.json: invalid JSON"):
        ev.base_router_spec(_prog_cfg(tmp_path, router=str(bad)))
    with pytest.raises(FileNotFoundError, match="--router .*nowhere: no such directory"):
        ev.run(_prog_cfg(tmp_path, router=str(tmp_path / "nowhere")), backend=object(), routers={})
    assert not (tmp_path / "out").exists()


def test_progressive_empty_question_selection(tmp_path):
    from data_synthesis.corpora import load_corpus
    from eval import progressive as ev

    cfg = _prog_cfg(tmp_path, dev_episodes=["g2"])
    episodes = load_corpus(cfg.corpus, cfg.corpus_path)
    with pytest.raises(ValueError, match=r"dev_episodes \['g2'\] .* hold no questions"):
        ev.select_questions(cfg, episodes)
    with pytest.raises(ValueError, match=r"test_episodes \['g2'\] .* hold no questions"):
        ev.select_questions(_prog_cfg(tmp_path, test_episodes=["g2"]), episodes)
    with pytest.raises(ValueError, match=r"\['nosuch'\] not in corpus"):
        ev.run(_prog_cfg(tmp_path, dev_episodes=["nosuch"]), backend=object(), routers={})


def test_progressive_output_dir_is_locked(tmp_path):
    from eval import progressive as ev

    cfg = _prog_cfg(tmp_path)
    with OutputLock(cfg.output_dir):
        with pytest.raises(OutputLockedError):
            ev.run(cfg, backend=object(), routers={})  # refused before any model or backend is touched
    assert not (Path(cfg.output_dir) / "records.jsonl").exists()


# -- eval memagent ---------------------------------------------------------------------------------------------
def exploration_dir(tmp_path, records) -> Path:
    d = tmp_path / "explore"
    (d / "heldout").mkdir(parents=True)
    write_jsonl(d / "heldout" / "exploration.jsonl", records)
    return d


def _outcome(task, provider, success, steps=3, policy="never"):
    return {"task_id": task, "begin_provider": provider, "in_policy": policy, "success": success, "steps": steps}


def test_memagent_bad_options():
    from eval.memagent import MemAgentEvalConfig, make_parser

    for kw, match in (({"max_tasks": 0}, "max_tasks"), ({"max_tasks": -1}, "max_tasks"),
                      ({"providers": []}, "providers is empty"), ({"exploration_dir": ""}, "exploration_dir"),
                      ({"router_dtype": "fp8"}, "router_dtype"), ({"routed_in_policy": "always"}, "routed_in_policy"),
                      ({"routed_in_every": 0}, "routed_in_every")):
        with pytest.raises(ValueError, match=match):
            MemAgentEvalConfig(**kw)
    with pytest.raises(ConfigError, match="max_tasks must be >= 1"):
        parse_config(make_parser(), [MemAgentEvalConfig], ["--max_tasks", "0"])


def test_memagent_missing_inputs_and_incomplete_records(tmp_path):
    from eval.memagent import main

    out = ["--output_dir", str(tmp_path / "o"), "--router", "none"]
    with pytest.raises(FileNotFoundError, match="exploration_dir .*nowhere: no such directory"):
        main(["--exploration_dir", str(tmp_path / "nowhere"), *out])
    d = exploration_dir(tmp_path, [_outcome("t1", None, False), _outcome("t2", "kw", True)])
    with pytest.raises(FileNotFoundError, match="--router .*no_router: no such directory"):
        main(["--exploration_dir", str(d), "--output_dir", str(tmp_path / "o"), "--router", str(tmp_path / "no_router")])
    with pytest.raises(ValueError, match=r"exploration.jsonl: no task has in_policy='never' records for all 2 options"):
        main(["--exploration_dir", str(d), *out])
    write_jsonl(d / "heldout" / "exploration.jsonl", [{**_outcome("t1", None, False), "in_policy": ["never"]}])
    with pytest.raises(RecordError, match="exploration.jsonl:1: in_policy must be a non-empty string"):
        main(["--exploration_dir", str(d), *out])


def test_memagent_max_tasks_and_lock(tmp_path):
    from eval.memagent import main

    recs = [_outcome(t, p, s) for t in ("t1", "t2", "t3") for p, s in ((None, False), ("kw", t != "t2"))]
    d = exploration_dir(tmp_path, recs)
    out = tmp_path / "o"
    m = main(["--exploration_dir", str(d), "--output_dir", str(out), "--router", "none", "--max_tasks", "2"])
    assert m["tasks"] == 2
    with OutputLock(out):
        with pytest.raises(OutputLockedError):
            main(["--exploration_dir", str(d), "--output_dir", str(out), "--router", "none"])


def test_memagent_corrupt_exploration_config_names_the_file(tmp_path):
    from eval.memagent import exploration_config

    d = tmp_path / "x"
    d.mkdir()
    (d / "resolved_config.yaml").write_text("providers: [\n")
    with pytest.raises(ConfigError, match="resolved_config.yaml: invalid YAML"):
        exploration_config(d)
    (d / "resolved_config.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="resolved_config.yaml: a recipe must be a mapping"):
        exploration_config(d)
    (d / "resolved_config.yaml").unlink()
    (d / "manifest.json").write_text('{"fingerprint": ')
    with pytest.raises(ConfigError, match="manifest.json: not valid JSON"):
        exploration_config(d)
    (d / "manifest.json").write_text('{"fingerprint": [1]}')
    with pytest.raises(ConfigError, match="manifest.json: fingerprint must be a JSON object"):
        exploration_config(d)
    (d / "manifest.json").write_text("[]")
    with pytest.raises(ConfigError, match="manifest.json: expected a JSON object"):
        exploration_config(d)
