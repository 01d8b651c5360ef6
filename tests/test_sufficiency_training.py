"""Sufficiency-router training on the tiny random Llama (DESIGN §3, §5, §9): collator, learning,
resume, distillation switches, teacher cache, export."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from train.sufficiency import SufficiencyCollator, SufficiencyDataset, SufficiencyTrainer
from train.sufficiency import main as train_main
from numerics import assert_close_to_scale

NAMES = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi"]
THINGS = ["the red kite", "a garden party", "the museum trip", "her new job", "the old car", "a pottery class",
          "the marathon", "his sister"]
N_SAMPLES = 32


def make_records(n: int = N_SAMPLES, seed: int = 0) -> list[dict]:
    """A learnable toy task: sufficient contexts contain 'the answer is here', insufficient ones do not.

    Both classes have the same number of lines and the same kind of filler, so only the phrase tells them apart.
    """
    rng = random.Random(seed)
    recs = []
    for i in range(n):
        who, what, label = rng.choice(NAMES), rng.choice(THINGS), i % 2
        lines = [f"[D{j}:1] {rng.choice(NAMES)}: I talked about {rng.choice(THINGS)}." for j in range(2)]
        lines.insert(rng.randint(0, 2), f"[D9:{i}] {who}: " + ("the answer is here." if label else "we went for a walk."))
        recs.append({"schema_version": 1, "id": f"s{i}", "question": f"What did {who} say about {what}?",
                     "context": "\n".join(lines), "label": label,
                     "rationale": "The decisive line is present." if label else "The decisive line is missing."})
    return recs


def write_jsonl(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path


def base_args(model_dir: str, train_file: Path, output_dir: Path, *extra: str) -> list[str]:
    return ["--model_name_or_path", model_dir, "--train_file", str(train_file), "--output_dir", str(output_dir),
            "--learning_rate", "5e-3", "--lora_r", "8", "--per_device_train_batch_size", "8",
            "--report_to", "none", "--disable_tqdm", "true", "--dataloader_num_workers", "0", *extra]


def loss_logs(history: list[dict]) -> list[dict]:
    return [h for h in history if "loss" in h]


def auroc(labels, scores) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, [float(s) for s in scores]))


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The tiny model gains nothing from 2 threads, and on 2 cores shared with other jobs the OpenMP
    threads contend and slow every step ~10x: train on one thread, restore afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def records():
    return make_records()


@pytest.fixture(scope="module")
def train_file(tmp_path_factory, records):
    return write_jsonl(tmp_path_factory.mktemp("sufficiency-data") / "train.jsonl", records)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_llama_dir, train_file):
    root = tmp_path_factory.mktemp("sufficiency-train")
    out, export = root / "run", root / "export"
    trainer, info = train_main(base_args(tiny_llama_dir, train_file, out, "--max_steps", "30", "--logging_steps", "5",
                                         "--save_steps", "15", "--export_dir", str(export)))
    return {"trainer": trainer, "info": info, "out": out, "export": export, "root": root}


# -- collator ----------------------------------------------------------------------------------------
def test_collator_exact_tensors():
    feats = [{"idx": 3, "input_ids": [5, 6, 7], "teacher_input_ids": [5, 6, 7, 8, 9], "label": 1},
             {"idx": 0, "input_ids": [1, 2], "teacher_input_ids": [1, 2, 3], "label": 0}]
    batch = SufficiencyCollator(pad_token_id=99)(feats)
    expected = {
        "input_ids": [[5, 6, 7], [99, 1, 2]],
        "attention_mask": [[1, 1, 1], [0, 1, 1]],
        "position_ids": [[0, 1, 2], [0, 0, 1]],
        "teacher_input_ids": [[5, 6, 7, 8, 9], [99, 99, 1, 2, 3]],
        "teacher_attention_mask": [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]],
        "teacher_position_ids": [[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]],
        "labels": [1, 0],
        "sample_idx": [3, 0],
    }
    assert set(batch) == set(expected)
    for key, value in expected.items():
        assert batch[key].dtype == torch.long, key
        assert torch.equal(batch[key], torch.tensor(value)), key


def test_dataset_tokenizes_student_and_teacher_prompts(smollm2_tokenizer, train_file, records):
    from routers.sufficiency import build_prompt

    ds = SufficiencyDataset(str(train_file), smollm2_tokenizer, max_length=768)
    assert len(ds) == len(records) and ds.skipped_too_long == 0
    item, rec = ds[5], records[5]
    assert item["idx"] == 5 and item["label"] == rec["label"]
    assert item["input_ids"] == smollm2_tokenizer.encode(build_prompt(smollm2_tokenizer, rec["question"], rec["context"]),
                                                         add_special_tokens=False)
    teacher_text = smollm2_tokenizer.decode(item["teacher_input_ids"])
    assert rec["rationale"] in teacher_text and rec["rationale"] not in smollm2_tokenizer.decode(item["input_ids"])
    short = SufficiencyDataset(str(train_file), smollm2_tokenizer, max_length=768, max_samples=4)
    assert len(short) == 4
    with pytest.raises(ValueError, match="no usable samples"):
        SufficiencyDataset(str(train_file), smollm2_tokenizer, max_length=10)


# -- training ----------------------------------------------------------------------------------------
def test_training_logs_both_loss_parts_and_lowers_loss(trained):
    trainer, info, out = trained["trainer"], trained["info"], trained["out"]
    assert trainer.state.global_step == 30 and info["steps"] == 30 and info["samples"] == N_SAMPLES
    logs = loss_logs(trainer.state.log_history)
    assert [h["step"] for h in logs] == [5, 10, 15, 20, 25, 30]
    for h in logs:
        assert {"loss_cls", "loss_rep", "s0"} <= set(h)
        assert h["loss"] == pytest.approx(h["loss_cls"] + 0.1 * h["s0"] * h["loss_rep"], rel=0.02)
    assert logs[-1]["loss_cls"] < logs[0]["loss_cls"]
    s0 = json.loads((out / "distill_scale.json").read_text())["s0"]
    assert s0 > 0 and logs[0]["s0"] == pytest.approx(s0, rel=1e-5) and info["s0"] == s0

    resolved = yaml.safe_load((out / "resolved_config.yaml").read_text())
    assert resolved["max_steps"] == 30 and resolved["lora_r"] == 8 and resolved["learning_rate"] == 5e-3
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps"] == 30 and summary["lambda_rep"] == 0.1 and summary["lora"]["r"] == 8
    assert loss_logs(summary["log_history"]) == logs
    assert {p.name for p in out.glob("checkpoint-*")} == {"checkpoint-15", "checkpoint-30"}


def test_lora_weights_changed(trained):
    from safetensors.torch import load_file

    out = trained["out"]
    final = load_file(str(out / "adapter_model.safetensors"))
    mid = load_file(str(out / "checkpoint-15" / "adapter_model.safetensors"))
    b_keys = [k for k in final if "lora_B" in k]
    assert b_keys and len(b_keys) == 2 * 4  # 2 layers x q,k,v,o
    for k in b_keys:  # lora_B starts at zero: every adapter moved away from the identity
        assert final[k].abs().max() > 0, k
    assert any(not torch.equal(final[k], mid[k]) for k in final)  # and kept moving after step 15


def test_trained_router_separates_better_than_base(trained, tiny_llama_dir, records):
    from routers.sufficiency import SufficiencyRouter

    qs, cs, ys = [r["question"] for r in records], [r["context"] for r in records], [r["label"] for r in records]
    trained_router = SufficiencyRouter.from_pretrained(trained["export"], device="cpu")
    base_router = SufficiencyRouter.from_base(tiny_llama_dir, device="cpu")
    s_trained, s_base = trained_router.score(qs, cs), base_router.score(qs, cs)
    assert not torch.isnan(s_trained).any()
    a_trained, a_base = auroc(ys, s_trained), auroc(ys, s_base)
    assert a_trained >= 0.9, (a_trained, a_base)
    assert a_trained > a_base + 0.1, (a_trained, a_base)
    cfg = json.loads((trained["export"] / "router_config.json").read_text())
    assert cfg["router_type"] == "sufficiency" and cfg["base_model"] == tiny_llama_dir


def test_export_cli_reproduces_training_export(trained, tiny_llama_dir, records):
    from routers.sufficiency import SufficiencyRouter
    from train.export import main as export_main

    d2 = trained["root"] / "export-cli"
    export_main(["--checkpoint", str(trained["out"]), "--export_dir", str(d2), "--base_model", tiny_llama_dir])
    assert (d2 / "router_config.json").exists() and (d2 / "calibration.json").exists()
    assert "## Training" in (d2 / "README.md").read_text()
    qs, cs = [r["question"] for r in records], [r["context"] for r in records]
    a = SufficiencyRouter.from_pretrained(trained["export"], device="cpu").score(qs, cs)
    b = SufficiencyRouter.from_pretrained(d2, device="cpu").score(qs, cs)
    torch.testing.assert_close(b, a, atol=1e-5, rtol=0)


def test_resume_continues_from_last_checkpoint(trained, tiny_llama_dir, train_file, monkeypatch):
    out = trained["root"] / "resumed"
    shutil.copytree(trained["out"], out)
    steps = []
    original = SufficiencyTrainer.training_step

    def counting(self, *args, **kwargs):
        steps.append(self.state.global_step)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SufficiencyTrainer, "training_step", counting)
    trainer, info = train_main(base_args(tiny_llama_dir, train_file, out, "--max_steps", "40", "--logging_steps", "5",
                                         "--save_steps", "15"))
    assert info["resumed_from"] == str(out / "checkpoint-30")  # (logged as "resume from ..." by the memroute logger)
    assert steps == list(range(30, 40)), steps  # ten new steps, not forty
    assert trainer.state.global_step == 40 and info["steps"] == 40
    logs = loss_logs(trainer.state.log_history)
    assert [h["step"] for h in logs] == [5, 10, 15, 20, 25, 30, 35, 40]
    assert logs[:6] == loss_logs(trained["trainer"].state.log_history)  # history restored, not recomputed
    assert logs[-1]["s0"] == logs[0]["s0"]  # s0 restored from distill_scale.json


def test_lambda_rep_zero_trains_without_distillation(tiny_llama_dir, train_file, tmp_path):
    out = tmp_path / "no-rep"
    trainer, info = train_main(base_args(tiny_llama_dir, train_file, out, "--max_steps", "2", "--logging_steps", "1",
                                         "--save_steps", "100", "--lambda_rep", "0", "--max_train_samples", "16"))
    logs = loss_logs(trainer.state.log_history)
    assert len(logs) == 2
    for h in logs:
        assert "loss_cls" in h and "loss_rep" not in h and "s0" not in h
        assert h["loss"] == pytest.approx(h["loss_cls"], rel=1e-4)
    assert trainer.teacher_cache == {} and info["s0"] is None and not (out / "distill_scale.json").exists()


def test_teacher_cache_holds_every_sample_after_one_epoch(tiny_llama_dir, train_file, tmp_path):
    out = tmp_path / "cache"
    trainer, info = train_main(base_args(tiny_llama_dir, train_file, out, "--max_steps", "2", "--logging_steps", "1",
                                         "--save_steps", "100", "--max_train_samples", "16"))  # 2 steps x 8 = 1 epoch
    assert info["samples"] == 16 and trainer.state.epoch == pytest.approx(1.0)
    assert set(trainer.teacher_cache) == set(range(16))
    hidden = trainer.model.config.hidden_size
    assert all(v.shape == (hidden,) and v.device.type == "cpu" for v in trainer.teacher_cache.values())
    # each entry owns just its vector, not a view into the batch's whole [batch, seq, hidden] layer output
    assert all(v.untyped_storage().nbytes() == hidden * v.element_size() for v in trainer.teacher_cache.values())
    # Cached states are the frozen teacher's (base model, adapters off): recomputing gives the same.
    ds = trainer.train_dataset
    batch = SufficiencyCollator(trainer.processing_class.pad_token_id)([ds[i] for i in (2, 9, 15)])
    trainer.cache_teacher_states = False
    fresh = trainer.teacher_states(trainer.model, batch)
    cached = torch.stack([trainer.teacher_cache[i] for i in (2, 9, 15)])
    assert_close_to_scale(cached, fresh, rel=1e-5)
    with trainer.model.disable_adapter():
        student_view = trainer.model(**{k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")},
                                     output_hidden_states=True, logits_to_keep=1)
    assert not torch.allclose(student_view.hidden_states[trainer.rep_layer][:, -1, :], cached)  # rationale matters


def test_same_seed_same_adapter(tiny_llama_dir, train_file, tmp_path):
    """LoRA init is seeded from the config, so one config trains one router (and another seed another)."""
    from safetensors.torch import load_file

    def run(name, seed):
        out = tmp_path / name
        train_main(base_args(tiny_llama_dir, train_file, out, "--max_steps", "1", "--save_steps", "100",
                             "--max_train_samples", "8", "--lambda_rep", "0", "--seed", str(seed)))
        return load_file(str(out / "adapter_model.safetensors"))

    a, b, c = run("a", 7), run("b", 7), run("c", 8)
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if "lora_A" in k)


def test_init_adapter_continues_from_saved_lora(trained, tiny_llama_dir, train_file, tmp_path):
    """--init_adapter starts from a previous run's LoRA weights (not a fresh init) and trains them further."""
    from safetensors.torch import load_file

    from train.sufficiency import SufficiencyTrainingConfig, build_model

    source = trained["out"]
    saved = load_file(str(source / "adapter_model.safetensors"))
    cfg = SufficiencyTrainingConfig(model_name_or_path=tiny_llama_dir, output_dir=str(tmp_path / "probe"),
                                    init_adapter=str(source), report_to="none")
    model, _ = build_model(cfg)
    loaded = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert len(loaded) == len(saved)
    for key, value in saved.items():
        match = [v for k, v in loaded.items() if k.replace(".default", "") == key]
        assert match and torch.equal(match[0], value), key
    out = tmp_path / "continued"
    source_cfg = json.loads((source / "adapter_config.json").read_text())
    train_main(base_args(tiny_llama_dir, train_file, out, "--max_steps", "2", "--save_steps", "100",
                         "--lambda_rep", "0", "--init_adapter", str(source), "--lora_r", str(source_cfg["r"] + 5)))
    after = load_file(str(out / "adapter_model.safetensors"))
    assert after.keys() == saved.keys()
    assert any(not torch.equal(after[k], saved[k]) for k in saved)
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["init_adapter"] == str(source)
    # The summary (and the model card) report the adapter that was trained, not the recipe's ignored lora_r.
    assert summary["lora"]["r"] == source_cfg["r"] and summary["lora"]["alpha"] == source_cfg["lora_alpha"]
    assert summary["lora"]["targets"] == sorted(source_cfg["target_modules"])


def test_init_adapter_must_be_a_lora_dir(tiny_llama_dir, tmp_path):
    from train.sufficiency import SufficiencyTrainingConfig, build_model

    cfg = SufficiencyTrainingConfig(model_name_or_path=tiny_llama_dir, output_dir=str(tmp_path / "o"),
                                    init_adapter=str(tmp_path), report_to="none")
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        build_model(cfg)


def test_time_budget_stops_with_checkpoint_and_export(tiny_llama_dir, train_file, tmp_path):
    """A zero-minute budget stops after the first step, saves a resumable checkpoint and still exports."""
    from train.checkpoints import checkpoint_is_complete

    out, export = tmp_path / "run", tmp_path / "export"
    trainer, info = train_main(base_args(tiny_llama_dir, train_file, out, "--max_steps", "20", "--save_steps", "100",
                                         "--max_train_minutes", "0", "--export_dir", str(export)))
    assert info["steps"] == 1 and info["stopped_by_time_budget_at_step"] == 1
    assert checkpoint_is_complete(out / "checkpoint-1")
    assert (export / "router_config.json").is_file()


def test_padding_safe_mask_leaves_the_loss_unchanged(trained):
    """The 4D mask used with sdpa (no empty rows for left-pad queries) gives the same loss as the 2D mask."""
    trainer = trained["trainer"]
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(8)])
    assert int((batch["attention_mask"] == 0).sum()) > 0  # the batch really has left padding
    assert trainer.model.config._attn_implementation == "sdpa"
    losses = {}
    with torch.no_grad():
        for safe in (False, True):
            trainer.args.padding_safe_mask = safe
            losses[safe] = float(trainer.compute_loss(trainer.model, dict(batch)))
    trainer.args.padding_safe_mask = True
    assert losses[True] == pytest.approx(losses[False], abs=1e-5)


def test_full_finetune_with_separate_teacher(tiny_llama_dir, train_file, tmp_path):
    """use_lora false + teacher_model_name_or_path: the teacher sits beside the student (the Trainer only moves the
    student), stays frozen, and the student's own weights change."""
    from routers.models import load_causal_lm

    out = tmp_path / "full"
    trainer, info = train_main(base_args(tiny_llama_dir, train_file, out, "--max_steps", "2", "--logging_steps", "1",
                                         "--save_steps", "100", "--max_train_samples", "16", "--use_lora", "false",
                                         "--learning_rate", "1e-3", "--teacher_model_name_or_path", tiny_llama_dir))
    teacher = trainer.teacher_model
    assert teacher is not None and not hasattr(trainer.model, "disable_adapter")
    assert next(teacher.parameters()).device == next(trainer.model.parameters()).device == trainer.args.device
    assert not any(p.requires_grad for p in teacher.parameters())
    logs = loss_logs(trainer.state.log_history)
    assert len(logs) == 2 and all("loss_rep" in h for h in logs)
    base, _ = load_causal_lm(tiny_llama_dir)
    for (name, p0), p1 in zip(base.named_parameters(), teacher.parameters()):
        torch.testing.assert_close(p0, p1.cpu(), msg=f"teacher weight {name} moved")
    changed = [n for (n, p0), p1 in zip(base.named_parameters(), trainer.model.parameters())
               if not torch.equal(p0, p1.detach().cpu())]
    assert len(changed) > len(list(base.parameters())) // 2
