"""Real SmolLM2-135M / MiniLM checks (slow: run with ``pytest -m slow``)."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_router():
    from routers.sufficiency import SufficiencyRouter

    return SufficiencyRouter.from_base("HuggingFaceTB/SmolLM2-135M-Instruct", device="cpu")


def test_smollm2_converts_and_scores(smollm2_router):
    cfg = smollm2_router.config
    # DESIGN §3 token ids, derived from the tokenizer by the router.
    assert {10407, 9805, 10539, 9230} <= set(cfg.yes_token_ids)
    assert {4607, 787, 5230, 2838} <= set(cfg.no_token_ids)
    s = smollm2_router.score(["When did Caroline go to the LGBTQ support group?"] * 2,
                             ["[D1:3] Caroline: I went to a LGBTQ support group yesterday.", "[D1:4] Melanie: Nice!"])
    assert s.shape == (2,) and torch.all((s > 0) & (s < 1))


def test_smollm2_export_reload_exact(smollm2_router, tmp_path):
    from routers.sufficiency import SufficiencyRouter

    q = ["What did Melanie paint?", "Where did Caroline move from?"]
    c = ["[D1:12] Melanie: I painted a sunrise last year.", "[D3:1] Caroline: Sweden is home."]
    before = smollm2_router.score(q, c)
    smollm2_router.save_pretrained(tmp_path / "r")
    after = SufficiencyRouter.from_pretrained(tmp_path / "r", device="cpu").score(q, c)
    assert torch.equal(before, after)
    assert json.loads((tmp_path / "r" / "router_config.json").read_text())["router_type"] == "sufficiency"


def test_minilm_hybrid_retrieval_finds_evidence(locomo_episodes):
    from routers.memory.retrieval import HybridRetriever

    ep = locomo_episodes[0]
    qa = next(q for q in ep.qa if q.question.startswith("When did Caroline go to the LGBTQ support group"))
    hits = HybridRetriever().retrieve(qa.question, ep, k=10)
    assert qa.evidence[0] in [h.step.step_id for h in hits]


def test_smollm2_lora_training_steps(tmp_path, locomo_episodes):
    """Three real LoRA steps with distillation on real LoCoMo samples: losses finite, adapters move."""
    from data_synthesis.sufficiency import SufficiencySynthConfig, SufficiencySynthesizer
    from train import sufficiency as ts

    data = tmp_path / "data"
    SufficiencySynthesizer(SufficiencySynthConfig(output_dir=str(data), max_qa_per_episode=1, max_eval_qa_per_episode=1,
                                                  answer_models=["none"]), answer_backends=[]).run(progress=False)
    trainer, info = ts.main(["--model_name_or_path", "HuggingFaceTB/SmolLM2-135M-Instruct",
                             "--train_file", str(data / "train.jsonl"), "--output_dir", str(tmp_path / "out"),
                             "--max_steps", "3", "--per_device_train_batch_size", "2", "--logging_steps", "1",
                             "--save_steps", "100", "--bf16", "true"])
    logs = [h for h in trainer.state.log_history if "loss_cls" in h]
    assert logs and all(torch.isfinite(torch.tensor(h["loss_cls"])) for h in logs)
    assert "loss_rep" in logs[0]
    lora_b = [p for n, p in trainer.model.named_parameters() if "lora_B" in n]
    assert any(p.abs().sum() > 0 for p in lora_b)
