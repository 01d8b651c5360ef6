"""Distributed training on CPU (gloo): two real processes started by ``accelerate launch`` with the shipped
``configs/accelerate/cpu_ddp.yaml`` train exactly what one process trains with the same global batch.

* sufficiency: 2 ranks x batch 4 == 1 process x batch 4 x gradient accumulation 2 (same samples per
  optimizer step; s_0 from rank 0's first batch; per-batch-mean loss scaled by the accumulation);
* retriever without gather: 2 ranks x 3 queries == 1 process x 3 queries x accumulation 2 (each
  micro-batch sees only its own in-batch negatives, on both sides);
* retriever with ``gather_across_devices``: 2 ranks x 3 queries == 1 process x 6 queries: every query
  is contrasted with the other rank's candidates too (cross-process negatives, the loss-level 2-process
  check is ``test_retriever_loss.py::test_gather_across_two_processes_is_exact``).

Dropout is off and the retriever takes every positive/negative (no sampling), so the runs are
deterministic and the trajectories must agree to float precision, not just statistically.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from retriever_helpers import build_tiny_encoder, toy_records
from retriever_helpers import write_jsonl as write_retriever_jsonl
from test_sufficiency_training import base_args, make_records, write_jsonl
from numerics import assert_close_to_scale

REPO = Path(__file__).resolve().parents[1]
CPU_DDP = REPO / "configs" / "accelerate" / "cpu_ddp.yaml"
LOSS_KEYS = ("loss", "grad_norm", "learning_rate", "epoch")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def launch(module: str, argv: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    """``accelerate launch --config_file configs/accelerate/cpu_ddp.yaml -m MODULE ARGV`` (2 processes)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_DDP), "-m", module, *argv]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def loss_rows(history: list[dict], keys=LOSS_KEYS) -> list[dict]:
    return [{k: h[k] for k in keys if k in h} for h in history if "loss" in h]


def assert_same_trajectory(a: list[dict], b: list[dict], rel: float = 1e-4) -> None:
    assert len(a) == len(b) and a, (a, b)
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys(), (ra, rb)
        for k in ra:
            assert ra[k] == pytest.approx(rb[k], rel=rel, abs=1e-7), (k, ra, rb)


# -- sufficiency router ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def suff_train_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("ddp-suff") / "train.jsonl", make_records())


def test_sufficiency_two_processes_match_one_with_accumulation(tiny_llama_dir, suff_train_file, tmp_path):
    from safetensors.torch import load_file

    from train.sufficiency import main as train_main

    common = ["--max_steps", "6", "--logging_steps", "1", "--save_strategy", "no", "--lora_dropout", "0",
              "--learning_rate", "1e-3"]
    ddp_out, one_out = tmp_path / "ddp", tmp_path / "one"
    # No --use_cpu: several processes and no GPU make it the default (train/distributed.py).
    launch("train.sufficiency", base_args(tiny_llama_dir, suff_train_file, ddp_out, *common,
                                          "--per_device_train_batch_size", "4"))
    _, info = train_main(base_args(tiny_llama_dir, suff_train_file, one_out, *common,
                                   "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2"))
    ddp = json.loads((ddp_out / "train_summary.json").read_text())
    assert ddp["world_size"] == 2 and info["world_size"] == 1 and ddp["steps"] == info["steps"] == 6
    one = json.loads((one_out / "train_summary.json").read_text())
    keys = LOSS_KEYS + ("loss_cls", "loss_rep", "s0")
    a, b = loss_rows(ddp["log_history"], keys), loss_rows(one["log_history"], keys)
    assert [r["epoch"] for r in a] == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5]  # 8 samples per step of 32
    assert_same_trajectory(a, b)
    assert ddp["s0"] == pytest.approx(one["s0"], rel=1e-6)  # rank 0's first batch == first micro-batch
    wa, wb = load_file(str(ddp_out / "adapter_model.safetensors")), load_file(str(one_out / "adapter_model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert_close_to_scale(wa[k], wb[k], rel=1e-4, msg=k)
    assert any(wa[k].abs().max() > 0 for k in wa if "lora_B" in k)  # and it did train


# -- retriever -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def no_dropout_encoder(tmp_path_factory):
    path = Path(build_tiny_encoder(tmp_path_factory.mktemp("ddp-enc") / "st"))
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


@pytest.fixture(scope="module")
def retriever_train_file(tmp_path_factory):
    return write_retriever_jsonl(tmp_path_factory.mktemp("ddp-ret") / "train.jsonl", toy_records())


def retriever_args(model: str, train_file: Path, out: Path, *extra: str) -> list[str]:
    return ["--model_name_or_path", model, "--train_file", str(train_file), "--output_dir", str(out),
            "--learning_rate", "3e-3", "--warmup_steps", "0", "--positives_per_query", "0",
            "--negatives_per_query", "-1", "--temperature", "0.1", "--max_seq_length", "32", "--logging_steps", "1",
            "--max_steps", "4", "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
            "--dataloader_num_workers", "0", "--seed", "0", *extra]


@pytest.mark.parametrize("gather", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_retriever_two_processes_match_one(gather, no_dropout_encoder, retriever_train_file, tmp_path):
    """gather: 2 x 3 queries == 1 x 6 (cross-process negatives); no gather: 2 x 3 == 1 x 3 x accumulation 2."""
    from train.retriever import main as train_main

    ddp_out, one_out = tmp_path / "ddp", tmp_path / "one"
    launch("train.retriever", retriever_args(no_dropout_encoder, retriever_train_file, ddp_out,
                                             "--per_device_train_batch_size", "3",
                                             "--gather_across_devices", str(gather).lower()))
    single = (["--per_device_train_batch_size", "6"] if gather else
              ["--per_device_train_batch_size", "3", "--gradient_accumulation_steps", "2"])
    trainer, info = train_main(retriever_args(no_dropout_encoder, retriever_train_file, one_out, *single))
    ddp = json.loads((ddp_out / "train_summary.json").read_text())
    assert ddp["world_size"] == 2 and info["world_size"] == 1
    a, b = loss_rows(ddp["log_history"]), loss_rows(trainer.state.log_history)
    assert [r["epoch"] for r in a] == [0.5, 1.0, 1.5, 2.0]  # 6 of the 12 queries per step
    assert_same_trajectory(a, b)
    if gather:  # each query saw 6 queries' candidates (not 3): a harder first-step loss than without gather
        assert a[0]["loss"] > 3.0
    else:
        assert a[0]["loss"] < 2.6

    from sentence_transformers import SentenceTransformer

    texts = ["where is the apple kept", "the tiger is here", "a river story"]
    ea = SentenceTransformer(str(ddp_out), device="cpu").encode(texts, convert_to_tensor=True)
    eb = SentenceTransformer(str(one_out), device="cpu").encode(texts, convert_to_tensor=True)
    assert_close_to_scale(ea, eb, rel=1e-4)


# -- launch-time checks (no processes) -----------------------------------------------------------------
def test_cpu_ddp_defaults_and_world_size_check(monkeypatch):
    from train.distributed import check_world_size, cpu_ddp_defaults, launched_world_size
    from train.sufficiency import SufficiencyTrainingConfig, make_parser

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert launched_world_size() == 1
    parser = make_parser()
    cpu_ddp_defaults(parser)
    assert parser.get_default("use_cpu") is False
    check_world_size(SimpleNamespace(world_size=1))

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert launched_world_size() == 2
    parser = make_parser()
    cpu_ddp_defaults(parser)
    assert parser.get_default("use_cpu") is (not torch.cuda.is_available())
    check_world_size(SimpleNamespace(world_size=2))
    with pytest.raises(RuntimeError, match="--use_cpu true"):
        check_world_size(SimpleNamespace(world_size=1))
    assert SufficiencyTrainingConfig.__dataclass_fields__["attn_implementation"].default == "auto"


def test_attn_implementation(tiny_llama_dir, tmp_path):
    from train.distributed import resolve_attn_implementation
    from train.sufficiency import SufficiencyTrainingConfig, build_model

    assert resolve_attn_implementation(None) is None and resolve_attn_implementation("none") is None
    assert resolve_attn_implementation("eager") == "eager"
    if not torch.cuda.is_available():
        assert resolve_attn_implementation("auto") is None  # CPU: the transformers default (sdpa)
    cfg = SufficiencyTrainingConfig(output_dir=str(tmp_path), report_to="none", model_name_or_path=tiny_llama_dir,
                                    attn_implementation="eager", use_cpu=True)
    model, _ = build_model(cfg)
    assert model.base_model.model.config._attn_implementation == "eager"


def test_accelerate_configs_parse():
    """Every shipped accelerate config loads with accelerate's own config class."""
    from accelerate.commands.config.config_args import load_config_from_file

    names = {p.name for p in CPU_DDP.parent.glob("*.yaml")}
    assert names >= {"cpu.yaml", "cpu_ddp.yaml", "ddp.yaml", "fsdp.yaml"}
    for name in sorted(names):
        cfg = load_config_from_file(str(CPU_DDP.parent / name))
        assert cfg.compute_environment.value == "LOCAL_MACHINE", name
    cpu_ddp = load_config_from_file(str(CPU_DDP))
    # The multi-GPU (torchrun) launcher is the one that starts several local processes.
    assert cpu_ddp.distributed_type.value == "MULTI_GPU" and cpu_ddp.num_processes == 2 and not cpu_ddp.use_cpu
    assert load_config_from_file(str(CPU_DDP.parent / "fsdp.yaml")).distributed_type.value == "FSDP"


def test_env_reports_what_a_distributed_bug_report_needs():
    from eval.env import collect

    info = collect()
    assert {"torch", "transformers", "accelerate", "peft"} <= set(info["versions"])
    assert info["distributed"]["available"] is True and info["distributed"]["gloo"] is True
    assert info["distributed"]["launched_world_size"] == 1
    assert isinstance(info["devices"]["bf16_native"], bool) and info["devices"]["cuda"] == torch.cuda.is_available()
    assert isinstance(info["attention"]["flash_attn_installed"], bool)
    assert set(info["embedded_models"]) == {"smollm2_gguf", "minilm", "smollm2_converted"}
    assert Path(info["cache_dir"]).is_dir()
