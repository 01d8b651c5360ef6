"""The frozen-prefix training path (train/frozen_prefix.py, ``--train_top_layers K``): the split forward equals the
full one, only the top layers train, and training on cached states learns and exports a normal router."""

from __future__ import annotations

import pytest
import torch

from numerics import assert_close_to_scale
from routers.models import left_pad
from test_sufficiency_training import auroc, base_args, make_records, write_jsonl
from train.frozen_prefix import (check_split, decoder_of, freeze_all_but_top, layer_slice, lower_states, pad_states,
                                 top_logits)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_llama(tokenizer, layers: int = 4, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def llama4(smollm2_tokenizer):
    return make_llama(smollm2_tokenizer)


@pytest.fixture(scope="module")
def llama4_dir(tmp_path_factory, smollm2_tokenizer, llama4):
    path = tmp_path_factory.mktemp("llama4")
    llama4.save_pretrained(path)
    smollm2_tokenizer.save_pretrained(path)
    return str(path)


SEQS = [[5, 17, 99, 4, 8, 23, 42], [7, 7, 300], [11, 12, 13, 14, 15]]


@pytest.mark.parametrize("split", [0, 1, 3, 4])
def test_split_forward_equals_the_full_forward(llama4, split):
    full = llama4(**left_pad(SEQS, 0), logits_to_keep=1).logits[:, -1]
    states = lower_states(llama4, SEQS, split, pad_id=0, batch_size=2)
    assert [s.shape for s in states] == [torch.Size([len(q), 64]) for q in SEQS]  # unpadded, input order
    with torch.no_grad():
        part = top_logits(llama4, states, split)
    assert_close_to_scale(part, full, rel=1e-5)
    assert check_split(llama4, SEQS[0], split, pad_id=0) <= 1e-5
    assert len(decoder_of(llama4).layers) == 4  # the slice is undone


def test_pad_states_matches_left_pad():
    states = [torch.ones(3, 2), 2 * torch.ones(1, 2)]
    batch = pad_states(states)
    ids = left_pad([[1, 2, 3], [4]], 0)
    assert torch.equal(batch["attention_mask"], ids["attention_mask"])
    assert torch.equal(batch["position_ids"], ids["position_ids"])
    assert batch["inputs_embeds"].tolist() == [[[1, 1]] * 3, [[0, 0], [0, 0], [2, 2]]]


def test_a_decoder_that_rescales_its_inputs_is_refused(llama4, monkeypatch):
    decoder = decoder_of(llama4)
    original = decoder.forward

    def scaled(*args, inputs_embeds=None, **kwargs):  # Gemma-style: embeddings are multiplied by sqrt(hidden)
        return original(*args, inputs_embeds=None if inputs_embeds is None else inputs_embeds * 8.0, **kwargs)

    monkeypatch.setattr(decoder, "forward", scaled)
    with pytest.raises(ValueError, match="does not reproduce the full forward"):
        check_split(llama4, SEQS[0], 2, pad_id=0)


def test_layer_slice_is_undone_after_an_error(llama4):
    with pytest.raises(RuntimeError):
        with layer_slice(llama4, 2, final_norm=False):
            assert len(decoder_of(llama4).layers) == 2
            raise RuntimeError("boom")
    assert len(decoder_of(llama4).layers) == 4
    assert not isinstance(decoder_of(llama4).norm, torch.nn.Identity)


def test_full_finetuning_trains_only_the_top_layers(smollm2_tokenizer):
    model = make_llama(smollm2_tokenizer)
    n = freeze_all_but_top(model, 3)
    names = {name for name, p in model.named_parameters() if p.requires_grad}
    assert names and all(name.startswith(("model.layers.3.", "model.norm.")) for name in names)
    assert n == sum(p.numel() for p in model.model.layers[3].parameters()) + model.model.norm.weight.numel()


def test_options_conflicts_fail_at_parse_time(tmp_path):
    from routers.config import ConfigError
    from train.sufficiency import make_parser
    from routers.config import parse_config
    from train.sufficiency import SufficiencyTrainingConfig

    def parse(*extra):
        return parse_config(make_parser(), [SufficiencyTrainingConfig],
                            ["--output_dir", str(tmp_path), "--use_cpu", "true", *extra])

    with pytest.raises(ConfigError, match="train_top_layers needs lambda_rep 0"):
        parse("--train_top_layers", "2", "--lambda_rep", "0.1")
    with pytest.raises(ConfigError, match="train_top_layers must be an integer >= 1"):
        parse("--train_top_layers", "0", "--lambda_rep", "0")
    with pytest.raises(ConfigError, match="init_adapter"):
        parse("--train_top_layers", "2", "--lambda_rep", "0", "--init_adapter", str(tmp_path))
    (cfg,) = parse("--train_top_layers", "2", "--lambda_rep", "0")
    assert cfg.train_top_layers == 2


@pytest.mark.parametrize("use_lora", ["true", "false"])
def test_training_on_cached_states_learns_and_exports_a_normal_router(llama4_dir, tmp_path, use_lora):
    from routers.sufficiency import SufficiencyRouter
    from train.sufficiency import main as train_main

    records = make_records(32)
    train_file = write_jsonl(tmp_path / "train.jsonl", records)
    out, export = tmp_path / "run", tmp_path / "export"
    extra = ("--lora_target_modules", "all-linear") if use_lora == "true" else ("--learning_rate", "2e-3")
    trainer, info = train_main(base_args(llama4_dir, train_file, out, "--max_steps", "30", "--logging_steps", "5",
                                         "--save_steps", "100", "--lambda_rep", "0", "--train_top_layers", "2",
                                         "--use_lora", use_lora, "--export_dir", str(export), *extra))
    frozen = info["frozen_prefix"]
    assert frozen["split"] == 2 and frozen["trained_layers"] == 2 and frozen["split_check_deviation"] <= 1e-5
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[-1] < losses[0]
    base = SufficiencyRouter.from_base(llama4_dir, device="cpu")
    router = SufficiencyRouter.from_pretrained(export, device="cpu")
    # The frozen layers are the base model's, bit for bit; the top ones changed.
    for i in range(4):
        a, b = base.model.model.layers[i].state_dict(), router.model.model.layers[i].state_dict()
        same = all(torch.equal(a[k], b[k]) for k in a)
        assert same == (i < 2), i
    qs, cs, ys = [r["question"] for r in records], [r["context"] for r in records], [r["label"] for r in records]
    a_trained, a_base = auroc(ys, router.score(qs, cs)), auroc(ys, base.score(qs, cs))
    assert a_trained >= 0.8 and a_trained > a_base + 0.15, (a_trained, a_base)


def test_activation_checkpointing_gives_the_same_updates_on_cached_states(llama4_dir, tmp_path):
    """The memory knob for long batches (activations of the trained layers dominate: batch x length x K layers):
    with ``--activation_checkpointing true`` the top layers recompute their activations in backward, and the
    LoRA weights after two steps on cached lower states are those of the plain run (not zero gradients: the
    cached ``inputs_embeds`` do not require grad, which a reentrant checkpoint would silently drop)."""
    from train.sufficiency import main as train_main

    train_file = write_jsonl(tmp_path / "train.jsonl", make_records(16))
    weights = {}
    for ckpt in ("false", "true"):
        trainer, _ = train_main(base_args(llama4_dir, train_file, tmp_path / ckpt, "--max_steps", "2",
                                          "--save_strategy", "no", "--lambda_rep", "0", "--train_top_layers", "2",
                                          "--lora_target_modules", "all-linear", "--lora_dropout", "0",
                                          "--activation_checkpointing", ckpt, "--use_cpu", "true", "--seed", "0"))
        assert decoder_of(trainer.model).gradient_checkpointing is (ckpt == "true")   # on in the layers run
        weights[ckpt] = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    lora_b = [n for n in weights["false"] if "lora_B" in n]
    assert lora_b and all(weights["false"][n].abs().sum() > 0 for n in lora_b)   # B starts at 0: it trained
    for n, w in weights["false"].items():
        assert_close_to_scale(weights["true"][n], w, rel=1e-5, msg=n)


@pytest.mark.slow  # ~15 s: the benchmark script end to end (the training paths themselves are tested above)
def test_training_paths_benchmark_writes_json_and_plot(llama4_dir, tmp_path):
    import json

    from eval.bench.training_paths import main

    train_file = write_jsonl(tmp_path / "train.jsonl", make_records(16, seed=1))
    eval_file = write_jsonl(tmp_path / "eval.jsonl", make_records(12, seed=2))
    report = main(["--train_file", str(train_file), "--eval_file", str(eval_file), "--model_name_or_path", llama4_dir,
                   "--output_dir", str(tmp_path / "bench")])
    on_disk = json.loads((tmp_path / "bench" / "training_paths.json").read_text())
    assert on_disk["results"].keys() == {"frozen_prefix", "lora_all_layers"} == report["results"].keys()
    for r in on_disk["results"].values():
        assert r["train_wall_s"] > 0 and r["steps"] > 0 and r["n_eval"] == 12
        assert set(r["trained"]) == {"auroc", "ap", "ece"} and r["base"]["auroc"] is not None
    assert on_disk["results"]["lora_all_layers"]["vs_baseline"] == {"wall_ratio": 1.0, "auroc_delta": 0.0}
    assert on_disk["results"]["frozen_prefix"]["frozen_prefix"]["trained_layers"] == 4 - 0  # 4-layer model: all 4
    assert "versions" in on_disk and on_disk["machine"]["device"] == "cpu"
    assert (tmp_path / "bench" / "training_paths.png").stat().st_size > 0
