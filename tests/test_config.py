"""YAML recipes + CLI overrides for dataclass configs, strict about unknown keys (DESIGN §9)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from transformers import TrainingArguments

from routers.config import (ConfigError, check_keys, config_to_dict, load_yaml, make_arg_parser, parse_config,
                          save_resolved_config)


@dataclasses.dataclass
class RecipeArgs:
    model: str = "smollm2"
    block_size: int = 8
    lambda_rep: float = 0.5
    use_rationale: bool = False
    tags: list[str] = dataclasses.field(default_factory=lambda: ["a"])


TYPES = [RecipeArgs, TrainingArguments]


def parse(argv):
    return parse_config(make_arg_parser(TYPES), TYPES, argv)


@pytest.fixture()
def recipe(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "model": "from-yaml", "block_size": 16, "use_rationale": True,
        "output_dir": str(tmp_path / "out"), "learning_rate": 1e-3, "max_steps": 5, "seed": 7,
    }))
    return path


def test_defaults_without_config(tmp_path):
    args, ta = parse(["--output_dir", str(tmp_path / "o")])
    assert args == RecipeArgs()
    assert ta.output_dir == str(tmp_path / "o") and ta.learning_rate == TrainingArguments(output_dir="x").learning_rate


def test_yaml_then_cli_precedence(recipe, tmp_path):
    args, ta = parse([str(recipe), "--block_size", "32", "--learning_rate", "2e-4", "--tags", "x", "y"])
    # CLI beats YAML beats dataclass default
    assert args.block_size == 32 and ta.learning_rate == pytest.approx(2e-4)
    assert args.model == "from-yaml" and args.use_rationale is True
    assert ta.max_steps == 5 and ta.seed == 7 and ta.output_dir == str(tmp_path / "out")
    assert args.lambda_rep == 0.5 and args.tags == ["x", "y"]
    assert isinstance(args.block_size, int)


def test_yaml_only(recipe):
    args, ta = parse([str(recipe)])
    assert (args.model, args.block_size, args.use_rationale, args.lambda_rep) == ("from-yaml", 16, True, 0.5)
    assert ta.learning_rate == pytest.approx(1e-3) and ta.max_steps == 5


def test_yaml_string_scientific_notation_is_converted(tmp_path):
    # PyYAML reads `1e-3` (no dot) as a *string*; it must still end up a float
    path = tmp_path / "sci.yaml"
    path.write_text(f"learning_rate: 1e-3\nlambda_rep: 2e-1\noutput_dir: {tmp_path}\n")
    assert yaml.safe_load(path.read_text())["learning_rate"] == "1e-3"
    args, ta = parse([str(path)])
    assert ta.learning_rate == pytest.approx(1e-3) and isinstance(ta.learning_rate, float)
    assert args.lambda_rep == pytest.approx(0.2) and isinstance(args.lambda_rep, float)


def test_config_flag_equivalent_to_positional(recipe):
    a1, t1 = parse([str(recipe), "--max_steps", "9"])
    a2, t2 = parse(["--max_steps", "9", "--config", str(recipe)])
    assert a1 == a2 and t1.to_dict() == t2.to_dict()
    assert t2.max_steps == 9 and a2.block_size == 16


def test_unknown_yaml_key(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("block_sise: 4\nlearning_rat: 0.1\nmodel: m\n")
    with pytest.raises(ConfigError) as info:
        parse([str(path)])
    msg = str(info.value)
    assert str(path) in msg
    assert "block_sise" in msg and "learning_rat" in msg
    assert "block_size" in msg and "learning_rate" in msg  # close-match hints
    assert "'model'" not in msg.split("did you mean")[0]  # only unknown keys are reported


def test_unknown_cli_flag(recipe):
    with pytest.raises(ConfigError, match=r"unknown command-line option\(s\): \['--bogus_flag', '3'\]"):
        parse([str(recipe), "--bogus_flag", "3"])
    with pytest.raises(ConfigError, match="unknown command-line"):
        parse(["--output_dir", "o", "stray_positional"])


def test_bad_yaml_files(tmp_path):
    not_mapping = tmp_path / "list.yaml"
    not_mapping.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match=r"list\.yaml: a recipe must be a mapping"):
        parse([str(not_mapping)])
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: invalid YAML"):
        load_yaml(broken)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_yaml(empty) == {}


def test_check_keys_ignores_non_init_fields():
    with pytest.raises(ConfigError, match="src"):
        check_keys(["model", "nope"], [RecipeArgs], "src")
    check_keys(["model", "block_size", "output_dir"], TYPES, "src")  # no error


def test_save_resolved_config_round_trips(recipe, tmp_path):
    args, ta = parse([str(recipe), "--block_size", "24", "--tags", "p", "q"])
    out = save_resolved_config(tmp_path / "run", args, ta)
    assert out == tmp_path / "run" / "resolved_config.yaml"
    assert sorted(p.name for p in out.parent.iterdir()) == ["resolved_config.yaml"]  # atomic, no temp files
    data = yaml.safe_load(out.read_text())
    assert data == config_to_dict(args, ta)
    assert data["block_size"] == 24 and data["model"] == "from-yaml" and data["tags"] == ["p", "q"]
    assert data["learning_rate"] == pytest.approx(1e-3) and data["max_steps"] == 5
    # the resolved file is itself a valid recipe that reproduces the same configuration
    args2, ta2 = parse([str(out)])
    assert args2 == args
    assert ta2.to_dict() == ta.to_dict()
    assert config_to_dict(args2, ta2) == data


def test_resolved_config_does_not_inject_redacted_tokens(recipe, tmp_path):
    args, ta = parse([str(recipe)])
    out = save_resolved_config(tmp_path / "run", args, ta)
    _, ta2 = parse([str(out)])
    assert ta2.hub_token == ta.hub_token is None


@pytest.mark.parametrize("recipe", ["configs/sufficiency/train/smollm2.yaml", "configs/sufficiency/train/smollm2_gpu.yaml",
                                    "configs/sufficiency/train/smollm2_prefix.yaml"])
def test_shipped_sufficiency_recipes_parse(recipe):
    """Every key of a shipped recipe is a real field (a typo there would only surface on a cluster)."""
    from train.sufficiency import SufficiencyTrainingConfig, make_parser

    root = Path(__file__).resolve().parents[1]
    (cfg,) = parse_config(make_parser(), [SufficiencyTrainingConfig], [str(root / recipe), "--use_cpu", "true",
                                                                      "--bf16", "false"])
    assert cfg.model_name_or_path == "HuggingFaceTB/SmolLM2-135M-Instruct" and cfg.router_max_input_tokens == 1024
    if recipe.endswith("_gpu.yaml"):
        assert (cfg.lora_r, cfg.max_length, cfg.per_device_train_batch_size, cfg.num_train_epochs) == (64, 1024, 16, 2)
    if recipe.endswith("_prefix.yaml"):
        assert cfg.init_adapter == "outputs/sufficiency_router_gpu" and cfg.train_file.endswith("sufficiency_mix/train.jsonl")


def test_shipped_prefix_synthesis_recipe_parses():
    from data_synthesis.sufficiency import SufficiencySynthConfig, make_parser

    root = Path(__file__).resolve().parents[1]
    (cfg,) = parse_config(make_parser(), [SufficiencySynthConfig], [str(root / "configs/sufficiency/synth/locomo_prefix.yaml")])
    assert cfg.prefix_top_k == [3, 5, 8, 10] and cfg.intervention_samples is False
    assert cfg.eval_episodes == ["conv-26", "conv-30"]


def test_cli_null_clears_an_optional_recipe_value(tmp_path):
    """``--field null`` sets an optional field to None over the recipe (argparse alone read the string 'null',
    so the documented ``--eval_episodes null --eval_fraction 0.2`` kept the recipe's episodes and failed)."""
    from data_synthesis.sufficiency import SufficiencySynthConfig

    path = tmp_path / "synth.yaml"
    path.write_text("eval_episodes: [conv-26]\nmax_qa_per_episode: 5\noutput_dir: out\n")
    types = [SufficiencySynthConfig]
    (cfg,) = parse_config(make_arg_parser(types), types, [str(path), "--eval_episodes", "null",
                                                          "--eval_fraction", "0.2", "--max_qa_per_episode=null"])
    assert cfg.eval_episodes is None and cfg.eval_fraction == 0.2 and cfg.max_qa_per_episode is None
    # a non-optional field keeps argparse's reading, and the word in a list value is just a word
    args, _ = parse(["--model", "null", "--tags", "a", "null", "--output_dir", str(tmp_path / "o")])
    assert args.model == "null" and args.tags == ["a", "null"]
