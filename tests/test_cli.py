"""The ``memroute`` dispatcher and the launch paths (DESIGN §1, §9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from routers import cli
from routers.config import ConfigError

REPO = Path(__file__).resolve().parents[1]
COMMANDS = ("synth", "train", "export", "eval", "calibrate", "env", "quickstart", "bench")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1"}  # one thread: the tiny model does not need two shared cores


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["help"], []])
def test_help_lists_commands(argv, capsys):
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: memroute")
    for cmd in COMMANDS:
        assert f"\n  {cmd} " in out, cmd
    assert "train sufficiency" in out and "accelerate launch" in out


def test_unknown_command_and_target_return_2(capsys):
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'" in err and "usage: memroute" in err
    assert cli.main(["train"]) == 2
    assert f"choose a target from {sorted(cli.JOBS['train'])}" in capsys.readouterr().err
    assert cli.main(["train", "mesa"]) == 2
    assert cli.main(["export", "--help-me"]) == 2


def test_unknown_yaml_key_is_an_error(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model_name_or_path": "smollm2", "lerning_rate": 1e-3, "max_steps": 3}))
    with pytest.raises(ConfigError) as err:
        cli.run(["train", "sufficiency", str(recipe), "--output_dir", str(tmp_path / "out")])
    msg = str(err.value)
    assert "lerning_rate" in msg and str(recipe) in msg and "learning_rate" in msg  # names it, suggests a fix
    assert not (tmp_path / "out").exists()  # rejected before anything ran
    with pytest.raises(ConfigError, match="lerning_rate"):
        cli.run(["train", "sufficiency", "--config", str(recipe)])
    synth = tmp_path / "synth.yaml"
    synth.write_text(yaml.safe_dump({"encoder": "none", "max_qa_per_episod": 2}))
    with pytest.raises(ConfigError, match="max_qa_per_episod"):
        cli.run(["synth", "sufficiency", str(synth)])


def test_unknown_flag_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="--max_stepz"):
        cli.run(["train", "sufficiency", "--output_dir", str(tmp_path / "o"), "--max_stepz", "3"])


def test_env_subprocess_prints_versions_json():
    proc = subprocess.run([sys.executable, "-m", "routers.cli", "env"], cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads(proc.stdout)
    versions = info["versions"]
    import torch
    import transformers

    assert versions["torch"] == torch.__version__ and versions["transformers"] == transformers.__version__
    assert "python" in versions and "peft" in versions
    assert {"platform", "devices", "embedded_models", "cache_dir"} <= set(info)
    assert info["env"]["HF_HUB_OFFLINE"] == "1"


def test_accelerate_launch_cpu_trains(tmp_path, tiny_llama_dir):
    accelerate = Path(sys.executable).parent / "accelerate"
    assert accelerate.exists(), accelerate
    train_file = tmp_path / "train.jsonl"
    recs = [{"id": f"r{i}", "question": f"What did person {i} bring?", "label": i % 2,
             "context": f"[D1:{i}] P{i}: " + ("I brought the cake." if i % 2 else "Nice weather today."),
             "rationale": "present" if i % 2 else "missing"} for i in range(8)]
    train_file.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "run"
    cmd = [str(accelerate), "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "train.sufficiency",
           "--model_name_or_path", tiny_llama_dir, "--train_file", str(train_file), "--output_dir", str(out),
           "--max_steps", "2", "--save_steps", "100", "--per_device_train_batch_size", "4", "--logging_steps", "1",
           "--report_to", "none"]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps"] == 2 and summary["samples"] == 8
    assert any("loss_cls" in h for h in summary["log_history"])
    assert (out / "adapter_model.safetensors").exists() and (out / "resolved_config.yaml").exists()
