"""The quickstart's CPU savings keep their meaning: bf16 scoring is asked for and cached apart from fp32 scores,
the lower-layer cache follows the training's autocast, and the quickstart hands its dropout and dtype through."""

from __future__ import annotations

import pytest
import torch

from routers.config import ConfigError
from test_crash_resume import tiny_router  # noqa: F401 (the fixture: a tiny exported sufficiency router)
from test_sufficiency_training import make_records, write_jsonl


def test_eval_dtype_loads_both_models_in_it_and_never_reuses_float32_scores(tiny_router, tiny_llama_dir, tmp_path):
    from eval.sufficiency import main as eval_main

    recs = make_records(8, seed=3)
    for r in recs:
        r["variant"] = "positive" if r["label"] else "none"
    data = write_jsonl(tmp_path / "eval.jsonl", recs)
    opts = ["--router", str(tiny_router), "--base_model", tiny_llama_dir, "--data", str(data),
            "--output_dir", str(tmp_path / "out"), "--no_write_calibration_to_router", "--batch_size", "4"]
    fp32 = eval_main(opts)["models"]
    bf16 = eval_main([*opts, "--dtype", "bfloat16"])["models"]
    for name in ("base", "trained"):
        assert fp32[name]["dtype"] == "float32" and bf16[name]["dtype"] == "bfloat16"
        assert bf16[name]["timing"]["scored"] == 8 and bf16[name]["timing"]["from_cache"] == 0
        assert bf16[name]["model_identity"] != fp32[name]["model_identity"]
    again = eval_main([*opts, "--dtype", "bfloat16"])["models"]
    assert again["trained"]["timing"]["from_cache"] == 8  # the bf16 scores are cached under their own identity
    with pytest.raises(ConfigError, match="dtype must be"):
        eval_main([*opts, "--dtype", "int8"])


def test_lower_layer_cache_runs_under_the_trainings_autocast(tiny_llama_dir):
    from routers.models import load_causal_lm
    from train.sufficiency_data import cache_lower_layers

    model, tok = load_causal_lm(tiny_llama_dir)

    class Items:
        def __init__(self):
            self.items = [{"input_ids": tok.encode(f"sample {i} " * (3 + i))} for i in range(3)]

    fp32, bf16 = Items(), Items()
    cache_lower_layers(model, [fp32], 1, "cpu", tok.pad_token_id)
    cache_lower_layers(model, [bf16], 1, "cpu", tok.pad_token_id, autocast_dtype=torch.bfloat16)
    for a, b in zip(fp32.items, bf16.items):
        assert a["lower_states"].dtype == b["lower_states"].dtype == torch.float32  # stored as float32 either way
        assert a["lower_states"].shape == b["lower_states"].shape
        assert not torch.equal(a["lower_states"], b["lower_states"])  # bf16 matmuls ran
        torch.testing.assert_close(a["lower_states"], b["lower_states"], rtol=0.1, atol=0.1)


def test_quickstart_hands_dropout_and_eval_dtype_to_the_stages(monkeypatch, tmp_path):
    from eval import quickstart
    from train import sufficiency as train_sufficiency

    seen = {}

    class Stop(Exception):
        pass

    def fake_train(argv):
        seen["train"] = argv
        raise Stop

    monkeypatch.setattr(quickstart.SufficiencySynthesizer, "run", lambda self: {"train": {}, "eval": {}})
    monkeypatch.setattr(train_sufficiency, "main", fake_train)
    with pytest.raises(Stop):
        quickstart.main(["--output_dir", str(tmp_path), "--lora_dropout", "0.1", "--bf16", "false"])
    argv = seen["train"]
    assert argv[argv.index("--lora_dropout") + 1] == "0.1"
    assert argv[argv.index("--train_top_layers") + 1] == "24"
    assert quickstart.QuickstartConfig().lora_dropout == 0.0 and quickstart.QuickstartConfig().eval_dtype == "auto"
