"""Hostile / careless input to the trainers, the export commands and the LLM backends
(reviews/bad-input-probe.md defects 1, 6, 9, 11, 13): every case fails in seconds, before a model loads,
with one message naming the file or option -- or, for the HTTP backend, warns without leaking the key.

Model loading is replaced by a stub that raises :class:`ModelLoaded`: a test that reaches it has let the
bad input through to the (slow) model load."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from retriever_helpers import toy_records
from retriever_helpers import write_jsonl as write_retriever_jsonl
from routers.base import ExportTargetError
from test_sufficiency_training import make_records
from test_sufficiency_training import write_jsonl as write_sufficiency_jsonl
from routers.config import ConfigError


class ModelLoaded(Exception):
    """Raised by the stubbed model loaders: the command got as far as loading a model."""


def _refuse_to_load(*args, **kwargs):
    raise ModelLoaded(f"model load reached with {args!r:.120}")


@pytest.fixture
def no_model_load(monkeypatch):
    import routers.models
    import train.export
    import train.retriever

    monkeypatch.setattr(routers.models, "load_causal_lm", _refuse_to_load)
    monkeypatch.setattr(routers.models, "load_encoder", _refuse_to_load)
    monkeypatch.setattr(train.retriever, "load_model", _refuse_to_load)
    monkeypatch.setattr(train.export, "load_checkpoint", _refuse_to_load)


def fake_checkpoint(output_dir: Path, step: int = 2) -> Path:
    """A complete-looking checkpoint-N (trainer_state.json names its step), enough for auto-resume to pick it."""
    ckpt = output_dir / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return ckpt


def adapter_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/nowhere/base"}))
    (path / "adapter_model.safetensors").write_bytes(b"precious")
    return path


# -- sufficiency trainer -------------------------------------------------------------------------------
@pytest.fixture
def suff_file(tmp_path):
    return write_sufficiency_jsonl(tmp_path / "train.jsonl", make_records(8))


def suff_args(train_file, out, *extra) -> list[str]:
    return ["--model_name_or_path", "tiny-model-never-loaded", "--train_file", str(train_file),
            "--output_dir", str(out), "--report_to", "none", "--max_steps", "2", *extra]


def test_sufficiency_export_dir_equal_to_output_dir_is_refused_before_loading(no_model_load, suff_file, tmp_path):
    from train.sufficiency import main

    out = adapter_dir(tmp_path / "run")
    fake_checkpoint(out)
    for export in (out, tmp_path):  # the output_dir itself, or a directory containing it
        with pytest.raises(ExportTargetError, match="refusing to export here"):
            main(suff_args(suff_file, out, "--export_dir", str(export)))
    assert (out / "adapter_model.safetensors").read_bytes() == b"precious" and (out / "checkpoint-2").is_dir()


def test_sufficiency_export_dir_containing_init_adapter_is_refused(no_model_load, suff_file, tmp_path):
    from train.sufficiency import main

    adapter = adapter_dir(tmp_path / "prev" / "adapter")
    with pytest.raises(ExportTargetError, match="refusing to export here"):
        main(suff_args(suff_file, tmp_path / "run", "--init_adapter", str(adapter),
                       "--export_dir", str(tmp_path / "prev")))


@pytest.mark.parametrize("case", ["missing", "duplicate_id", "label_true", "empty_context", "empty_file"])
def test_sufficiency_bad_data_fails_before_the_model_loads(no_model_load, tmp_path, case):
    from routers.io import RecordError
    from train.sufficiency import main

    recs = make_records(6)
    path = tmp_path / f"{case}.jsonl"
    if case == "duplicate_id":
        recs[4]["id"] = recs[1]["id"]
    elif case == "label_true":
        recs[2]["label"] = True
    elif case == "empty_context":
        recs[3]["context"] = "  "
    elif case == "empty_file":
        recs = []
    if case != "missing":
        write_sufficiency_jsonl(path, recs)
    expected = {"missing": (FileNotFoundError, "not found"), "duplicate_id": (RecordError, "duplicate id"),
                "label_true": (RecordError, "label must be 0 or 1"), "empty_context": (RecordError, "context is empty"),
                "empty_file": (ValueError, "no samples")}[case]
    with pytest.raises(expected[0], match=expected[1]) as err:
        main(suff_args(path, tmp_path / "run", "--lambda_rep", "0"))
    assert str(path) in str(err.value)


@pytest.mark.parametrize("flags, message", [
    (["--use_lora", "false", "--lambda_rep", "0.1"], "needs use_lora"),
    (["--use_lora", "false", "--init_adapter", "x"], "init_adapter needs use_lora"),
    (["--per_device_train_batch_size", "0"], "per_device_train_batch_size"),
    (["--per_device_train_batch_size", "-4"], "per_device_train_batch_size"),
    (["--gradient_accumulation_steps", "0"], "gradient_accumulation_steps"),
    (["--learning_rate", "-1"], "learning_rate"),
    (["--learning_rate", "nan"], "learning_rate"),
    (["--max_length", "0"], "max_length"),
    (["--lora_r", "0"], "lora_r"),
    (["--lora_dropout", "1.5"], "lora_dropout"),
    (["--lambda_rep", "-0.1"], "lambda_rep"),
    (["--threshold", "1.5"], "threshold"),
    (["--max_train_samples", "0"], "max_train_samples"),
    (["--max_train_minutes", "-1"], "max_train_minutes"),
    (["--resume", "true"], "resume must be one of"),
])
def test_sufficiency_option_conflicts_fail_at_parse_time(flags, message):
    from routers.config import parse_config
    from train.sufficiency import SufficiencyTrainingConfig, make_parser

    with pytest.raises(ConfigError, match=message):
        parse_config(make_parser(), [SufficiencyTrainingConfig], ["--report_to", "none", *flags])


def test_sufficiency_resume_with_changed_settings_is_refused(no_model_load, suff_file, tmp_path):
    from train.sufficiency import main

    out = tmp_path / "run"
    fake_checkpoint(out)
    with pytest.raises(ModelLoaded):  # first (resumed) run records its settings, then goes on to load
        main(suff_args(suff_file, out, "--learning_rate", "1e-3"))
    other = write_sufficiency_jsonl(tmp_path / "other.jsonl", make_records(8, seed=1))
    with pytest.raises(ConfigError) as err:
        main(suff_args(other, out, "--learning_rate", "0.5"))
    assert "learning_rate" in str(err.value) and "train_file" in str(err.value) and "--resume never" in str(err.value)
    assert not (out / "resolved_config.yaml").exists()  # provenance not rewritten
    with pytest.raises(ModelLoaded):  # the same settings resume; a longer run (max_steps) is allowed
        main(suff_args(suff_file, out, "--learning_rate", "1e-3", "--max_steps", "9", "--logging_steps", "3"))
    with pytest.raises(ModelLoaded):  # --resume never starts over
        main(suff_args(other, out, "--learning_rate", "0.5", "--resume", "never"))


def test_sufficiency_train_file_edited_between_runs_is_refused(no_model_load, suff_file, tmp_path):
    from train.sufficiency import main

    out = tmp_path / "run"
    fake_checkpoint(out)
    with pytest.raises(ModelLoaded):
        main(suff_args(suff_file, out))
    write_sufficiency_jsonl(suff_file, make_records(10))  # same path, new content
    with pytest.raises(ConfigError, match="train_file_sha256"):
        main(suff_args(suff_file, out))


def test_missing_local_model_dir_is_named(suff_file, tmp_path):
    from train.sufficiency import main

    with pytest.raises(FileNotFoundError, match="model_name_or_path .*does not exist"):
        main(["--model_name_or_path", str(tmp_path / "no-model"), "--train_file", str(suff_file),
              "--output_dir", str(tmp_path / "o"), "--report_to", "none", "--lambda_rep", "0"])


# -- sufficiency export --------------------------------------------------------------------------------
def test_export_missing_checkpoint_says_it_does_not_exist(tmp_path, capsys):
    from routers import cli
    from train.export import main

    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError, match="checkpoint .*directory does not exist"):
        main(["--checkpoint", str(missing), "--export_dir", str(tmp_path / "e")])
    capsys.readouterr()
    assert cli.main(["export", "sufficiency", "--checkpoint", str(missing), "--export_dir", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err
    first = err.strip().splitlines()[0]
    assert "does not exist" in first and str(missing) in first and "Repo id" not in err and "Traceback" not in err


@pytest.mark.parametrize("kind, module", [("sufficiency", "train.export:main"),
                                          ("memagent", "train.export:memagent_main")])
def test_export_into_the_checkpoint_is_refused_before_loading(no_model_load, tmp_path, kind, module):
    import importlib

    mod, fn = module.split(":")
    main = getattr(importlib.import_module(mod), fn)
    ckpt = adapter_dir(tmp_path / "run" / "checkpoint-4")
    for export in (ckpt, ckpt.parent):
        with pytest.raises(ExportTargetError, match="refusing to export here"):
            main(["--checkpoint", str(ckpt), "--export_dir", str(export)])
    assert (ckpt / "adapter_model.safetensors").read_bytes() == b"precious"


def test_export_checkpoint_without_weights_config_is_named(tmp_path):
    from train.export import main

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        main(["--checkpoint", str(tmp_path / "notes"), "--export_dir", str(tmp_path / "e")])


@pytest.mark.parametrize("flags", [["--threshold", "1.5"], ["--max_input_tokens", "0"], ["--threshold", "nan"]])
def test_export_bad_numbers_fail_at_parse_time(tmp_path, flags):
    from train.export import main

    with pytest.raises(ConfigError):
        main(["--checkpoint", str(tmp_path), "--export_dir", str(tmp_path / "e"), *flags])


def test_export_corrupt_train_summary_is_named(no_model_load, tmp_path):
    from train.export import main

    ckpt = adapter_dir(tmp_path / "run")
    (ckpt / "train_summary.json").write_text("{not json")
    with pytest.raises(ValueError, match="train_summary.json"):
        main(["--checkpoint", str(ckpt), "--export_dir", str(tmp_path / "e")])


# -- retriever trainer and export ----------------------------------------------------------------------
@pytest.fixture
def retr_file(tmp_path):
    return write_retriever_jsonl(tmp_path / "retr.jsonl", toy_records(4))


def retr_args(train_file, out, *extra) -> list[str]:
    return ["--model_name_or_path", "encoder-never-loaded", "--train_file", str(train_file), "--output_dir",
            str(out), "--report_to", "none", "--max_steps", "2", "--per_device_train_batch_size", "2", *extra]


def test_retriever_export_dir_equal_to_output_dir_is_refused(no_model_load, retr_file, tmp_path):
    from train.retriever import main

    out = tmp_path / "run"
    ckpt = fake_checkpoint(out)
    for export in (out, tmp_path):
        with pytest.raises(ExportTargetError, match="refusing to export here"):
            main(retr_args(retr_file, out, "--export_dir", str(export)))
    assert ckpt.is_dir()


@pytest.mark.parametrize("case", ["missing", "directory", "empty", "kinds_mismatch"])
def test_retriever_bad_data_fails_before_the_encoder_loads(no_model_load, tmp_path, case):
    from train.retriever import main

    path = tmp_path / "data.jsonl"
    if case == "directory":
        path.mkdir()
    elif case == "empty":
        path.write_text("\n")
    elif case == "kinds_mismatch":
        recs = toy_records(3)
        recs[1]["positive_kinds"] = ["step", "window", "window"]
        write_retriever_jsonl(path, recs)
    expected = {"missing": (FileNotFoundError, "train_file .*not found"), "directory": (ValueError, "is a directory"),
                "empty": (ValueError, "no retriever records"), "kinds_mismatch": (ValueError, "positive_kinds")}[case]
    with pytest.raises(expected[0], match=expected[1]) as err:
        main(retr_args(path, tmp_path / "run"))
    assert str(path) in str(err.value)


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "0"], "temperature"),
    (["--temperature", "-0.05"], "temperature"),
    (["--per_device_train_batch_size", "0"], "per_device_train_batch_size"),
    (["--learning_rate", "-3e-5"], "learning_rate"),
    (["--max_train_samples", "0"], "max_train_samples"),
    (["--mini_batch_size", "0"], "mini_batch_size"),
    (["--candidate_chunk_size", "-1"], "candidate_chunk_size"),
    (["--max_seq_length", "-5"], "max_seq_length"),
    (["--resume", "true"], "resume must be one of"),
])
def test_retriever_bad_options_fail_at_parse_time(flags, message):
    from routers.config import parse_config
    from train.retriever import RetrieverTrainingConfig, make_parser

    with pytest.raises(ConfigError, match=message):
        parse_config(make_parser(), [RetrieverTrainingConfig], ["--report_to", "none", *flags])


def test_retriever_resume_with_changed_settings_is_refused(no_model_load, retr_file, tmp_path):
    from train.retriever import main

    out = tmp_path / "run"
    fake_checkpoint(out)
    with pytest.raises(ModelLoaded):
        main(retr_args(retr_file, out))
    with pytest.raises(ConfigError, match="temperature"):
        main(retr_args(retr_file, out, "--temperature", "0.5"))
    with pytest.raises(ModelLoaded):  # GradCache and a longer run do not change what is learnt
        main(retr_args(retr_file, out, "--mini_batch_size", "4", "--max_steps", "8"))


def test_retriever_export_checks_run_before_loading(no_model_load, tmp_path):
    from train.export import retriever_main as export_main

    with pytest.raises(FileNotFoundError, match="checkpoint .*does not exist"):
        export_main(["--checkpoint", str(tmp_path / "missing"), "--export_dir", str(tmp_path / "e")])
    ckpt = tmp_path / "run" / "checkpoint-3"
    ckpt.mkdir(parents=True)
    (ckpt / "modules.json").write_text("[]")
    for export in (ckpt, ckpt.parent):
        with pytest.raises(ExportTargetError, match="refusing to export here"):
            export_main(["--checkpoint", str(ckpt), "--export_dir", str(export)])
    with pytest.raises(ConfigError, match="temperature"):
        export_main(["--checkpoint", str(ckpt), "--export_dir", str(tmp_path / "e"), "--temperature", "0"])
    (ckpt.parent / "resolved_config.yaml").write_text("temperature: [unclosed")
    with pytest.raises(ConfigError, match="resolved_config.yaml"):
        export_main(["--checkpoint", str(ckpt), "--export_dir", str(tmp_path / "e")])
    (ckpt.parent / "resolved_config.yaml").write_text("temperature: -1\n")
    with pytest.raises(ValueError, match="temperature"):
        export_main(["--checkpoint", str(ckpt), "--export_dir", str(tmp_path / "e")])


# -- MemAgent SFT --------------------------------------------------------------------------------------
@pytest.fixture
def phase_files(tmp_path):
    from test_memagent_router import fake_phase_files

    return fake_phase_files(tmp_path / "data")


def sft_args(files, out, *extra) -> list[str]:
    return ["--model_name_or_path", "llm-never-loaded", "--begin_file", files["begin"], "--in_file", files["in"],
            "--end_file", files["end"], "--output_dir", str(out), "--use_cpu", "true", "--report_to", "none",
            "--max_steps", "2", *extra]


def test_memagent_export_dir_equal_to_output_dir_is_refused(no_model_load, phase_files, tmp_path):
    from train.memagent import main

    out = adapter_dir(tmp_path / "run")
    for export in (out, tmp_path):
        with pytest.raises(ExportTargetError, match="refusing to export here"):
            main(sft_args(phase_files, out, "--export_dir", str(export)))
    assert (out / "adapter_model.safetensors").read_bytes() == b"precious"


@pytest.mark.parametrize("case", ["missing_begin", "empty_end", "all_below_min_reward", "bad_record"])
def test_memagent_bad_data_fails_before_the_model_loads(no_model_load, phase_files, tmp_path, case):
    from routers.io import RecordError
    from train.memagent import main

    extra = []
    if case == "missing_begin":
        phase_files = {**phase_files, "begin": str(tmp_path / "nope.jsonl")}
        expected, culprit = (FileNotFoundError, "begin_file .*not found"), phase_files["begin"]
    elif case == "empty_end":
        Path(phase_files["end"]).write_text("")
        expected, culprit = (ValueError, "end_file .*no records"), phase_files["end"]
    elif case == "all_below_min_reward":
        extra = ["--min_reward", "0.9"]  # every In record has reward 0.8
        expected, culprit = (ValueError, "in_file .*all 8 records dropped"), phase_files["in"]
    else:
        lines = Path(phase_files["in"]).read_text().splitlines()
        lines[1] = lines[1].replace('"phase": "in"', '"phase": "end"')
        Path(phase_files["in"]).write_text("\n".join(lines) + "\n")
        expected, culprit = (RecordError, "in.jsonl:2"), phase_files["in"]
    with pytest.raises(expected[0], match=expected[1]) as err:
        main(sft_args(phase_files, tmp_path / "run", *extra))
    assert culprit in str(err.value)


@pytest.mark.parametrize("flags, message", [
    (["--begin_file", "none", "--in_file", "none", "--end_file", "none"], "nothing to train on"),
    (["--per_device_train_batch_size", "0"], "per_device_train_batch_size"),
    (["--learning_rate", "-1"], "learning_rate"),
    (["--max_length", "0"], "max_length"),
    (["--lora_r", "0"], "lora_r"),
    (["--max_end_samples", "-1"], "max_end_samples"),
    (["--in_threshold", "2"], "in_threshold"),
    (["--router_max_input_tokens", "0"], "router_max_input_tokens"),
    (["--resume", "true"], "resume must be one of"),
])
def test_memagent_bad_options_fail_at_parse_time(flags, message):
    from routers.config import parse_config
    from train.memagent import MemAgentSFTConfig, make_parser

    with pytest.raises(ConfigError, match=message):
        parse_config(make_parser(), [MemAgentSFTConfig], ["--use_cpu", "true", "--report_to", "none", *flags])


def test_memagent_resume_with_changed_settings_is_refused(no_model_load, phase_files, tmp_path):
    from train.memagent import main

    out = tmp_path / "run"
    fake_checkpoint(out)
    with pytest.raises(ModelLoaded):
        main(sft_args(phase_files, out))
    with pytest.raises(ConfigError, match="lora_r.*min_reward|min_reward.*lora_r"):
        main(sft_args(phase_files, out, "--lora_r", "4", "--min_reward", "0.5"))


def test_memagent_incomplete_checkpoint_is_not_resumed(no_model_load, phase_files, tmp_path):
    """A checkpoint killed while saving (no trainer_state.json) is skipped, as in the other trainers."""
    from train.memagent import MemAgentSFTConfig, resolve_resume

    out = tmp_path / "run"
    good = fake_checkpoint(out, 2)
    (out / "checkpoint-4").mkdir()
    cfg = MemAgentSFTConfig(output_dir=str(out), use_cpu=True, report_to="none")
    assert resolve_resume(cfg) == str(good)


def test_memagent_export_missing_checkpoint(tmp_path):
    from train.export import memagent_main as export_main

    with pytest.raises(FileNotFoundError, match="checkpoint .*does not exist"):
        export_main(["--checkpoint", str(tmp_path / "missing"), "--export_dir", str(tmp_path / "e")])


# -- LLM backends (routers/models.py) ------------------------------------------------------------------
SECRET = "sk-test-SECRET-0123456789"


def test_openai_backend_warns_once_for_plain_http_and_never_leaks_the_key(monkeypatch, capsys, memroute_log):
    import urllib.error
    import urllib.request

    import routers.backends as models

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setattr(models, "_warned_hosts", set(), raising=False)
    sent = []

    def fake_urlopen(req, timeout=None):
        sent.append(req.get_header("Authorization"))
        raise urllib.error.URLError(f"echo {req.get_header('Authorization')}")

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    backend = models.OpenAICompatibleBackend(model="m", base_url="http://llm.example.com:8000/v1", max_retries=0,
                                             backoff=0)
    assert SECRET not in repr(backend) and SECRET not in str(backend)
    for _ in range(2):
        with pytest.raises(RuntimeError) as err:
            backend.generate([[{"role": "user", "content": "hi"}]])
        assert SECRET not in str(err.value) and "***" in str(err.value)
    assert sent == [f"Bearer {SECRET}"] * 2  # the key is still sent (the user asked for it) ...
    warned = memroute_log.text  # ... with one logged warning, and nothing anywhere shows the key
    assert warned.count("plain http") == 1 and "llm.example.com" in warned and SECRET not in warned
    assert SECRET not in capsys.readouterr().err


@pytest.mark.parametrize("url, key, warns", [
    ("http://localhost:8000/v1", SECRET, False), ("http://127.0.0.1:8000/v1", SECRET, False),
    ("http://[::1]:8000/v1", SECRET, False), ("https://api.example.com/v1", SECRET, False),
    ("http://gpu-box.internal/v1", None, False), ("http://gpu-box.internal/v1", SECRET, True),
])
def test_openai_backend_warning_only_for_a_key_over_plain_http_to_a_remote_host(monkeypatch, memroute_log, url, key,
                                                                                 warns):
    import urllib.error
    import urllib.request

    import routers.backends as models

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setattr(models, "_warned_hosts", set(), raising=False)
    monkeypatch.setattr(urllib.request, "urlopen", lambda req, timeout=None: (_ for _ in ()).throw(
        urllib.error.URLError("down")))
    backend = models.OpenAICompatibleBackend(model="m", base_url=url, api_key=key, max_retries=0, backoff=0)
    with pytest.raises(RuntimeError):
        backend.generate([[{"role": "user", "content": "hi"}]])
    assert ("plain http" in memroute_log.text) == warns


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://host/v1", "localhost:8000/v1"])
def test_openai_backend_refuses_non_http_urls(url):
    from routers.backends import make_backend

    with pytest.raises(ValueError, match="http"):
        make_backend(f"openai:m@{url}")


def test_openai_backend_name_hides_url_credentials():
    from routers.backends import make_backend

    b = make_backend("openai:m@https://user:pw123@host.example:8443/v1")
    assert "pw123" not in b.name and "pw123" not in repr(b).replace(b.base_url, "") and b.name.endswith(
        "@https://***@host.example:8443/v1")


def test_load_encoder_leaves_the_process_environment_alone(monkeypatch):
    """Library code never sets HF_HUB_OFFLINE (only CLI entry points do): the caller's setting, or none, is what
    the loader sees and what stays afterwards."""
    import sentence_transformers

    import routers.models as models

    seen = {}

    class FakeST:
        def __init__(self, path, device=None):
            seen["offline"] = os.environ.get("HF_HUB_OFFLINE")

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", FakeST)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    models.load_encoder("some/encoder")
    assert seen["offline"] is None and "HF_HUB_OFFLINE" not in os.environ
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # a user's own setting is kept
    models.load_encoder("some/encoder")
    assert seen["offline"] == "0" and os.environ["HF_HUB_OFFLINE"] == "0"


def test_load_causal_lm_names_a_missing_local_dir(tmp_path):
    from routers.models import load_causal_lm

    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_causal_lm(str(tmp_path / "gone"))
