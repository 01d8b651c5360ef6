"""A layer-pruned MemAgent router (``keep_layers``): exact pruning, training, both export paths."""

from __future__ import annotations

import pytest

from tests.numerics import assert_close_to_scale
from tests.test_memagent_router import GOALS, PROVIDERS, fake_phase_files, sft_args


def test_keep_decoder_layers_is_the_early_exit_of_the_full_model(tiny_llama_dir, tmp_path, one_torch_thread):
    import torch
    from transformers import AutoModelForCausalLM

    from routers.models import keep_decoder_layers

    full = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    pruned = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    assert keep_decoder_layers(pruned, 1) == 2
    ids = torch.tensor([[1, 5, 9, 42, 7, 3]])
    with torch.inference_mode():
        hidden = full(input_ids=ids, output_hidden_states=True).hidden_states[1]  # after decoder layer 0
        expected = full.lm_head(full.model.norm(hidden))
        got = pruned(input_ids=ids).logits
    assert_close_to_scale(got, expected, rel=1e-5)
    # saved, it is an ordinary one-layer model for any loader
    pruned.save_pretrained(tmp_path / "p")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "p").eval()
    assert again.config.num_hidden_layers == 1 and len(again.model.layers) == 1
    with torch.inference_mode():
        assert torch.equal(again(input_ids=ids).logits, got)


@pytest.mark.parametrize("n", [0, 3, 1.0, True])
def test_keep_decoder_layers_rejects_impossible_counts(tiny_llama_dir, n):
    from transformers import AutoModelForCausalLM

    from routers.models import keep_decoder_layers

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    with pytest.raises(ValueError, match=r"keep_layers must be an integer in \[1, 2\]"):
        keep_decoder_layers(model, n)
    assert len(model.model.layers) == 2  # untouched


def test_keep_decoder_layers_names_a_model_without_layers():
    import torch

    from routers.models import keep_decoder_layers

    with pytest.raises(ValueError, match="Linear has no decoder layer list"):
        keep_decoder_layers(torch.nn.Linear(2, 2), 1)


def test_keep_layers_is_checked_at_parse_time(tmp_path):
    from routers.config import ConfigError, parse_config
    from train.memagent import MemAgentSFTConfig, make_parser

    files = fake_phase_files(tmp_path / "data")
    with pytest.raises(ConfigError, match="keep_layers must be an integer >= 1 or null, got 0"):
        parse_config(make_parser(), [MemAgentSFTConfig], sft_args("smollm2", files, tmp_path / "o", "--keep_layers", "0"))


def test_pruned_lora_router_trains_and_both_exports_keep_its_layers(tiny_llama_dir, tmp_path, one_torch_thread):
    """Without the saved pruned base, ``memroute export`` of the LoRA checkpoint would put the adapter on the
    full-depth base: two layers, other scores."""
    import json

    import torch

    from routers.memagent.router import MemAgentRouter
    from train.export import memagent_main as export_main
    from train.memagent import main

    files = fake_phase_files(tmp_path / "data")
    out = tmp_path / "run"
    trainer, info = main(sft_args(tiny_llama_dir, files, out, "--keep_layers", "1", "--max_steps", "6",
                                  "--learning_rate", "2e-2", "--logging_steps", "1", "--save_steps", "6",
                                  "--per_device_train_batch_size", "2", "--lora_target_modules", "all-linear",
                                  "--export_dir", str(out / "export")))
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert info["layers_kept"] == 1 and losses[-1] < losses[0]
    assert json.loads((out / "pruned_base" / "config.json").read_text())["num_hidden_layers"] == 1
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(out / "pruned_base")
    exported = MemAgentRouter.from_pretrained(out / "export")
    assert len(exported.model.model.layers) == 1
    assert "decoder layers: 1 (the first 1 of the base's, pruned)" in (out / "export" / "README.md").read_text()
    export_main(["--checkpoint", str(out), "--export_dir", str(tmp_path / "exp2")])
    reloaded = MemAgentRouter.from_pretrained(tmp_path / "exp2")
    mine, theirs = exported.model.state_dict(), reloaded.model.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert torch.equal(reloaded.score_begin(GOALS[0], [], PROVIDERS)[1], exported.score_begin(GOALS[0], [], PROVIDERS)[1])
