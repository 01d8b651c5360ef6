"""Evaluation during training (train/dev_split.py, train/metrics_hooks.py): the dev split is drawn from training
episodes only, the sufficiency trainer's dev AUROC / AP come from per-sample scores (plain and frozen-prefix path),
best-model selection and early stopping work from the options, the retriever logs its IR evaluator and MemAgent its
eval loss, and gradient accumulation does not change the sufficiency loss."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from numerics import assert_close_to_scale
from test_sufficiency_training import base_args, make_records, write_jsonl

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N_EPISODES = 8


def episode_records(n: int = 48, seed: int = 0, episodes: int = N_EPISODES, prefix: str = "conv") -> list[dict]:
    """The learnable toy task of test_sufficiency_training, spread over ``episodes`` conversations."""
    recs = make_records(n, seed)
    for i, r in enumerate(recs):
        r["episode_id"] = f"{prefix}-{i % episodes}"
        r["id"] = f"{prefix}-{i % episodes}/{r['id']}"
    return recs


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval-during-training")
    return {"root": root, "records": episode_records(),
            "train": write_jsonl(root / "train.jsonl", episode_records()),
            "eval": write_jsonl(root / "eval.jsonl", episode_records(16, seed=5, episodes=2, prefix="heldout"))}


def full_model_scores(model, tokenizer, records) -> torch.Tensor:
    """The router's score, s = p_yes / (p_yes + p_no), from one full forward per sample (no cached states)."""
    from routers.models import left_pad
    from routers.sufficiency import NO_WORDS, YES_WORDS, build_prompt, last_token_logits, sufficiency_score, verbalizer_ids

    yes, no = verbalizer_ids(tokenizer, YES_WORDS), verbalizer_ids(tokenizer, NO_WORDS)
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    out = []
    with torch.no_grad():
        for r in records:
            ids = tokenizer.encode(build_prompt(tokenizer, r["question"], r["context"]), add_special_tokens=False)
            batch = {k: v.to(device) for k, v in left_pad([ids], tokenizer.pad_token_id).items()}
            out.append(sufficiency_score(last_token_logits(model, batch)[0], yes, no)[0].float().cpu())
    model.train(was)
    return torch.stack(out)


def eval_logs(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "eval_auroc" in h]


# -- the dev split ---------------------------------------------------------------------------------------------------
def test_dev_split_is_episode_level_seeded_and_never_held_out():
    from train.dev_split import split_by_episode

    recs = episode_records()
    recs += [{**r, "id": f"t/{r['id']}", "episode_id": "test-conv", "split": "test"} for r in make_records(6, seed=9)]
    draws = set()
    for seed in range(25):
        train, dev, eps = split_by_episode(recs, fraction=0.25, seed=seed)
        assert len(eps) == 2 and "test-conv" not in eps  # round(0.25 * 8 training episodes); never a held-out one
        assert {r["episode_id"] for r in dev} == set(eps)
        assert not {r["episode_id"] for r in train} & set(eps)  # every record of a dev episode leaves training
        assert len(train) + len(dev) == len(recs)
        assert split_by_episode(recs, fraction=0.25, seed=seed)[2] == eps  # seeded
        draws.add(tuple(eps))
    assert len(draws) > 5
    train, dev, eps = split_by_episode(recs, episodes=["conv-3"])
    assert eps == ["conv-3"] and {r["episode_id"] for r in dev} == {"conv-3"} and len(dev) == 6
    with pytest.raises(ValueError, match="not episodes of"):
        split_by_episode(recs, episodes=["conv-99"])
    with pytest.raises(ValueError, match="held out"):
        split_by_episode(recs, episodes=["test-conv"])
    with pytest.raises(ValueError, match="no episode_id"):
        split_by_episode(make_records(8), fraction=0.5)
    with pytest.raises(ValueError, match="at least 2"):
        split_by_episode([r for r in recs if r["episode_id"] in ("conv-0", "test-conv")], fraction=0.5)


def test_eval_file_overlapping_training_episodes_is_refused(data, tiny_llama_dir, tmp_path):
    from train.dev_split import check_disjoint
    from train.sufficiency import main as train_main

    overlap = write_jsonl(tmp_path / "overlap.jsonl", [{**r, "id": f"x{i}"} for i, r in enumerate(data["records"][:4])])
    with pytest.raises(ValueError, match=r"episodes \['conv-0', 'conv-1', 'conv-2', 'conv-3'\] are also in the training"):
        train_main(base_args(tiny_llama_dir, data["train"], tmp_path / "run", "--eval_file", str(overlap)))
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())  # refused before training
    with pytest.raises(ValueError, match="sample ids"):
        check_disjoint([{"id": "a"}], [{"id": "a"}])
    check_disjoint(data["records"], episode_records(4, prefix="heldout"))


def test_eval_options_conflicts_fail_at_parse_time(tmp_path):
    from routers.config import ConfigError, parse_config
    from train.sufficiency import SufficiencyTrainingConfig, make_parser

    def parse(*extra):
        return parse_config(make_parser(), [SufficiencyTrainingConfig],
                            ["--output_dir", str(tmp_path), "--use_cpu", "true", *extra])

    with pytest.raises(ConfigError, match="eval_strategy steps needs something to evaluate"):
        parse("--eval_strategy", "steps")
    with pytest.raises(ConfigError, match="not both"):
        parse("--dev_fraction", "0.2", "--eval_file", "x.jsonl")
    with pytest.raises(ConfigError, match="dev_fraction must be"):
        parse("--dev_fraction", "1.0")
    with pytest.raises(ConfigError, match="early_stopping_patience needs"):
        parse("--dev_fraction", "0.2", "--eval_strategy", "steps", "--early_stopping_patience", "2")
    (cfg,) = parse("--dev_fraction", "0.2", "--eval_strategy", "steps", "--eval_steps", "5", "--save_steps", "10",
                   "--load_best_model_at_end", "true", "--metric_for_best_model", "eval_auroc",
                   "--early_stopping_patience", "2")
    assert cfg.metric_for_best_model == "eval_auroc" and cfg.greater_is_better is True


# -- the metric hooks ------------------------------------------------------------------------------------------------
def test_compute_metrics_equals_sklearn_and_preprocess_keeps_one_score_per_sample():
    from sklearn.metrics import average_precision_score, roc_auc_score
    from transformers import EvalPrediction

    from routers.sufficiency import sufficiency_score
    from train.metrics_hooks import ScoreFromLogits, binary_metrics

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 40)
    scores = rng.random(40)
    m = binary_metrics(EvalPrediction(predictions=scores, label_ids=labels))
    assert m["auroc"] == roc_auc_score(labels, scores) and m["ap"] == average_precision_score(labels, scores)
    assert m["n"] == 40 and m["positives"] == labels.sum()
    assert math.isnan(binary_metrics(EvalPrediction(predictions=scores, label_ids=np.ones(40)))["auroc"])

    yes, no = [3, 7], [11]
    logits = torch.randn(5, 50)
    pre = ScoreFromLogits(yes, no)
    assert pre(logits, torch.zeros(5)).shape == (5,)
    assert pre(logits[:, None, :], None).shape == (5,)
    assert torch.equal(pre(logits), sufficiency_score(logits, yes, no).float())


def test_eval_loop_scores_equal_full_model_scores_and_hold_no_logits(data, tiny_llama_dir, tmp_path):
    """Plain path: the eval loop's predictions are (n,) router scores, and eval_auroc is sklearn's on them."""
    from sklearn.metrics import roc_auc_score

    from train.sufficiency import main as train_main

    trainer, info = train_main(base_args(tiny_llama_dir, data["train"], tmp_path / "run", "--max_steps", "4",
                                         "--eval_file", str(data["eval"]), "--eval_strategy", "steps",
                                         "--eval_steps", "2", "--save_steps", "100", "--lambda_rep", "0.1"))
    eval_recs = [json.loads(line) for line in data["eval"].read_text().splitlines()]
    logs = eval_logs(trainer)
    assert [h["step"] for h in logs] == [2, 4] and info["eval"]["eval_records"] == 16
    pred = trainer.predict(trainer.eval_dataset)
    assert pred.predictions.shape == (16,)  # one score per sample: no [n, vocab] logits, no hidden states
    full = full_model_scores(trainer.model, trainer.processing_class, eval_recs)
    assert_close_to_scale(torch.as_tensor(pred.predictions), full, rel=1e-4)
    labels = [r["label"] for r in eval_recs]
    assert pred.metrics["test_auroc"] == pytest.approx(roc_auc_score(labels, full.numpy()), abs=1e-12)
    assert logs[-1]["eval_auroc"] == pred.metrics["test_auroc"]
    assert "loss_rep" not in logs[-1] and all("loss_cls" in h for h in trainer.state.log_history if "loss" in h)


def test_frozen_prefix_eval_scores_equal_the_full_model(data, smollm2_tokenizer, tmp_path):
    """--train_top_layers: eval samples run the top layers on cached states; scores = the full model's."""
    from sklearn.metrics import roc_auc_score

    from test_frozen_prefix import make_llama
    from train.sufficiency import main as train_main

    model_dir = tmp_path / "llama4"
    make_llama(smollm2_tokenizer).save_pretrained(model_dir)
    smollm2_tokenizer.save_pretrained(model_dir)
    trainer, info = train_main(base_args(str(model_dir), data["train"], tmp_path / "run", "--max_steps", "4",
                                         "--lambda_rep", "0", "--train_top_layers", "2", "--dev_fraction", "0.25",
                                         "--eval_strategy", "steps", "--eval_steps", "4", "--save_steps", "100"))
    dev_eps = info["eval"]["dev_episodes"]
    dev = [r for r in data["records"] if r["episode_id"] in dev_eps]
    assert len(dev_eps) == 2 and info["samples"] == len(data["records"]) - len(dev) == info["eval"]["eval_samples"] * 3
    assert all("lower_states" in it for it in trainer.eval_dataset.items)
    pred = trainer.predict(trainer.eval_dataset)
    full = full_model_scores(trainer.model, trainer.processing_class, dev)
    assert pred.predictions.shape == (len(dev),)
    assert_close_to_scale(torch.as_tensor(pred.predictions), full, rel=1e-4)
    assert eval_logs(trainer)[-1]["eval_auroc"] == pytest.approx(roc_auc_score([r["label"] for r in dev], full), abs=1e-6)


# -- best model, early stopping ------------------------------------------------------------------------------------
def lora_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}


def test_best_checkpoint_has_the_best_eval_metric_and_is_exported(data, tiny_llama_dir, tmp_path):
    """metric eval_auroc with greater_is_better false picks the *lowest* dev AUROC, so the best checkpoint is not
    the last one: the final (and exported) model must be that checkpoint's, not the last step's."""
    from routers.base import load_router
    from train.sufficiency import main as train_main

    out, export = tmp_path / "run", tmp_path / "export"
    trainer, info = train_main(base_args(tiny_llama_dir, data["train"], out, "--max_steps", "12", "--lambda_rep", "0",
                                         "--dev_episodes", "conv-1", "conv-6", "--eval_strategy", "steps",
                                         "--eval_steps", "3", "--save_steps", "3", "--save_total_limit", "10",
                                         "--load_best_model_at_end", "true", "--metric_for_best_model", "eval_auroc",
                                         "--greater_is_better", "false", "--export_dir", str(export)))
    logs = eval_logs(trainer)
    assert [h["step"] for h in logs] == [3, 6, 9, 12]
    best_step, best = None, None
    for h in logs:  # the Trainer's rule: a strictly better value replaces the best
        if best is None or h["eval_auroc"] < best:
            best_step, best = h["step"], h["eval_auroc"]
    assert best_step != 12, "precondition: the toy task must make the last checkpoint not the best one"
    assert trainer.state.best_model_checkpoint == str(out / f"checkpoint-{best_step}")
    assert info["eval"]["best_metric"] == best and info["eval"]["best_model_checkpoint"].endswith(f"-{best_step}")
    dev = [r for r in data["records"] if r["episode_id"] in ("conv-1", "conv-6")]
    tokenizer = trainer.processing_class

    def checkpoint_scores(step):
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_llama_dir), str(out / f"checkpoint-{step}"))
        return full_model_scores(model, tokenizer, dev)

    best_scores, last_scores = checkpoint_scores(best_step), checkpoint_scores(12)
    exported = load_router(str(export)).score([r["question"] for r in dev], [r["context"] for r in dev])
    assert_close_to_scale(exported, best_scores, rel=1e-4)  # the export is the best checkpoint ...
    assert_close_to_scale(full_model_scores(trainer.model, tokenizer, dev), best_scores, rel=1e-4)
    assert (exported - last_scores).abs().max() > 1e-3  # ... not the last one


def test_early_stopping_stops(data, tiny_llama_dir, tmp_path):
    from train.sufficiency import main as train_main

    trainer, info = train_main(base_args(tiny_llama_dir, data["train"], tmp_path / "run", "--max_steps", "40",
                                         "--lambda_rep", "0", "--dev_fraction", "0.25", "--eval_strategy", "steps",
                                         "--eval_steps", "2", "--save_steps", "2", "--load_best_model_at_end", "true",
                                         "--metric_for_best_model", "eval_loss", "--early_stopping_patience", "2",
                                         "--early_stopping_threshold", "100"))  # no eval can improve by 100
    assert info["steps"] == 6 and len([h for h in trainer.state.log_history if "eval_loss" in h]) == 3  # the first eval sets the best, two more do not
    losses = [h for h in trainer.state.log_history if "eval_loss" in h]
    best = min(losses, key=lambda h: (h["eval_loss"], h["step"]))  # the threshold applies to stopping, not to "best"
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best['step']}")


# -- gradient accumulation -----------------------------------------------------------------------------------------
def test_grad_accumulation_2x2_equals_batch_4(data, tiny_llama_dir, tmp_path):
    from train.sufficiency import main as train_main

    def run(name, batch, accumulation):
        trainer, _ = train_main(base_args(tiny_llama_dir, data["train"], tmp_path / name, "--max_steps", "1",
                                          "--lambda_rep", "0", "--lora_dropout", "0", "--optim", "sgd",
                                          "--learning_rate", "0.5", "--logging_steps", "1", "--save_steps", "100",
                                          "--per_device_train_batch_size", str(batch),
                                          "--gradient_accumulation_steps", str(accumulation)))
        assert trainer.model_accepts_loss_kwargs is False
        loss = next(h["loss"] for h in trainer.state.log_history if "loss" in h)
        return loss, lora_state(trainer.model)

    loss4, w4 = run("b4", 4, 1)
    loss22, w22 = run("b2x2", 2, 2)
    assert loss22 == pytest.approx(loss4, rel=1e-5)
    for k in w4:
        assert_close_to_scale(w22[k], w4[k], rel=1e-5, msg=k)


# -- report_to -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("installed", [True, False])
def test_report_to_tensorboard_falls_back_when_not_installed(monkeypatch, memroute_log, installed):
    from types import SimpleNamespace

    import transformers.integrations

    from train.dev_split import resolve_report_to

    monkeypatch.setattr(transformers.integrations, "is_tensorboard_available", lambda: installed)
    cfg = SimpleNamespace(report_to=["tensorboard"])
    resolve_report_to(cfg)
    assert cfg.report_to == (["tensorboard"] if installed else [])
    assert ("tensorboard is not installed" in memroute_log.text) == (not installed)


# -- retriever and MemAgent ----------------------------------------------------------------------------------------
def test_retriever_dev_split_logs_ir_metrics_and_selects_the_best(tmp_path_factory):
    from retriever_helpers import build_tiny_encoder, toy_records
    from retriever_helpers import write_jsonl as write_retriever
    from train.retriever import main as train_main

    root = tmp_path_factory.mktemp("retriever-eval")
    recs = toy_records()
    for i, r in enumerate(recs):
        r["episode_id"] = f"ep{i % 4}"
    train_file = write_retriever(root / "train.jsonl", recs)
    out = root / "run"
    trainer, info = train_main([
        "--model_name_or_path", build_tiny_encoder(root / "st"), "--train_file", str(train_file), "--output_dir", str(out),
        "--per_device_train_batch_size", "6", "--learning_rate", "3e-3", "--max_seq_length", "32", "--temperature", "0.1",
        "--report_to", "none", "--disable_tqdm", "true", "--dataloader_num_workers", "0", "--seed", "0",
        "--max_steps", "6", "--logging_steps", "3", "--dev_fraction", "0.25", "--eval_strategy", "steps",
        "--eval_steps", "3", "--save_steps", "3", "--load_best_model_at_end", "true"])
    dev_eps = info["eval"]["dev_episodes"]
    assert len(dev_eps) == 1 and info["queries"] == 9 and info["eval"]["dev_queries"] == 3
    assert not set(trainer.train_dataset["query"]) & {r["query"] for r in recs if r["episode_id"] in dev_eps}
    logs = [h for h in trainer.state.log_history if "eval_dev_cosine_ndcg@10" in h]
    assert [h["step"] for h in logs] == [3, 6]
    for key in ("eval_dev_cosine_recall@1", "eval_dev_cosine_recall@5", "eval_dev_cosine_mrr@10"):
        assert all(0.0 <= h[key] <= 1.0 for h in logs), key
    assert trainer.args.metric_for_best_model == "eval_dev_cosine_ndcg@10" and trainer.args.greater_is_better
    best = max(logs, key=lambda h: (h["eval_dev_cosine_ndcg@10"], -h["step"]))
    assert trainer.state.best_model_checkpoint == str(out / f"checkpoint-{best['step']}")


def test_memagent_dev_split_reports_eval_loss(tiny_llama_dir, tmp_path):
    from test_memagent_router import fake_phase_files, sft_args
    from train.memagent import main

    files = fake_phase_files(tmp_path / "data", n_tasks=4)
    trainer, info = main(sft_args(tiny_llama_dir, files, tmp_path / "run", "--max_steps", "2", "--logging_steps", "1",
                                  "--per_device_train_batch_size", "2", "--dev_fraction", "0.25", "--report_to", "none",
                                  "--eval_strategy", "steps", "--eval_steps", "2", "--save_steps", "2"))
    held = info["eval"]
    assert len(held["dev_episodes"]) == 1 and held["dev_samples"] == len(trainer.eval_dataset)
    # one task of four: its Begin record and both In records leave training, every phase file contributes
    assert held["phases"]["begin"]["samples"] == 1 and info["phases"]["begin"]["samples"] == 3
    assert held["phases"]["in"]["samples"] == 2 and info["phases"]["in"]["samples"] == 6
    assert info["samples"] == len(trainer.train_dataset)
    logs = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert len(logs) == 1 and math.isfinite(logs[0]["eval_loss"]) and logs[0]["step"] == 2
