"""Every shipped recipe (``configs/<router>/<stage>/<variant>.yaml``) parses with its job's parser.

A recipe key that no config field knows would only surface when someone runs the job (often on a cluster);
here each recipe is parsed exactly as the job's ``main`` parses it (``parse_config(make_parser(), types,
[recipe])``), which builds the dataclasses and loads neither models nor data. ``configs/accelerate/`` holds
accelerate launcher configs, not recipes (``tests/test_distributed.py`` checks those).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from routers.config import load_yaml, parse_config

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
NOT_RECIPES = ("accelerate",)

# <router>/<stage> (the recipe's folder under configs/) -> the module whose make_parser() / main() runs it.
# A new recipe folder must be added here (test_every_recipe_is_mapped).
JOBS = {
    "sufficiency/synth": "data_synthesis.sufficiency",
    "sufficiency/train": "train.sufficiency",
    "sufficiency/eval": "eval.sufficiency",
    "retriever/synth": "data_synthesis.retriever",
    "retriever/train": "train.retriever",
    "retriever/eval": "eval.retrieval",
    "progressive/eval": "eval.progressive",
    "textworld/synth": "data_synthesis.textworld_corpus",
    "memagent/synth": "data_synthesis.memagent",
    "memagent/train": "train.memagent",
    "memagent/eval": "eval.memagent",
    "mesa/synth": "data_synthesis.mesa",
    "mesa/train": "train.mesa",
    "mesa/eval": "eval.mesa",
    "automem/train": "train.automem",
    "automem/eval": "eval.automem",
    ".": "eval.quickstart",  # configs/quickstart.yaml: the quickstart's embedded defaults, written out
}

# Keys a recipe may keep even when they equal the default: what a reader wants to see without opening the
# dataclass (models, data, outputs, the optimisation budget, the corpus).
HEADLINE = {
    "model_name_or_path", "answer_model", "answer_models", "agent_model", "provider_llm", "judge", "encoder",
    "trained_encoder", "base_encoder", "router", "train_file", "begin_file", "in_file", "end_file", "data",
    "exploration_dir", "games_dir", "hotpotqa_path", "output_dir", "export_dir", "learning_rate",
    "per_device_train_batch_size", "num_train_epochs", "max_steps", "corpus", "corpora", "eval_episodes",
    "dev_episodes", "test_episodes", "n_games", "n_train", "n_heldout", "providers", "recipe", "take", "go",
    "questions_per_type", "target_precision", "seed",
}


def _recipes() -> list[str]:
    return sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.yaml")
                  if p.relative_to(CONFIGS).parts[0] not in NOT_RECIPES)


def _job(recipe: str) -> str:
    return str(Path(recipe).parent.as_posix())


# a recipe whose job differs from its folder's: `synth mix` recipes live beside the synthesis they mix
BY_FILE = {"sufficiency/synth/mix_all.yaml": "data_synthesis.mix",
           "sufficiency/synth/mix_cpu.yaml": "data_synthesis.mix",
           "sufficiency/synth/mix_matched.yaml": "data_synthesis.mix",
           "sufficiency/synth/mix_default.yaml": "data_synthesis.mix",
           "sufficiency/synth/mix_default_large.yaml": "data_synthesis.mix",
           "sufficiency/synth/mix_default_full.yaml": "data_synthesis.mix"}


def _parser(recipe: str):
    return importlib.import_module(BY_FILE.get(recipe) or JOBS[_job(recipe)]).make_parser()


def test_every_recipe_is_mapped():
    recipes = _recipes()
    assert len(recipes) >= 16, recipes
    unmapped = [r for r in recipes if _job(r) not in JOBS]
    assert not unmapped, f"recipes with no job in tests/test_recipes.py JOBS: {unmapped}"
    unused = sorted(set(JOBS) - {_job(r) for r in recipes})
    assert not unused, f"JOBS entries with no recipe left: {unused}"


@pytest.fixture
def no_model_loads(monkeypatch):
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("parsing a recipe must not load a model or tokenizer")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(refuse))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", classmethod(refuse))


@pytest.mark.parametrize("recipe", _recipes())
def test_recipe_parses_with_its_job(recipe, no_model_loads):
    path = CONFIGS / recipe
    parser = _parser(recipe)
    types = list(parser.dataclass_types)
    fields = {f for t in types for f in t.__dataclass_fields__}
    values = load_yaml(path)
    assert values, f"{recipe} is empty"
    assert not set(values) - fields, f"{recipe}: unknown keys {sorted(set(values) - fields)}"
    # bf16 recipes are GPU recipes; TrainingArguments refuses bf16 on a machine without one unless use_cpu
    extra = ["--use_cpu", "true"] if "use_cpu" in fields else []
    cfgs = parse_config(parser, types, [str(path), *extra])
    assert len(cfgs) == len(types)
    for key, value in values.items():  # the recipe's values are what the job runs with
        got = next(getattr(c, key) for c in cfgs if hasattr(c, key))
        assert got == value, (recipe, key, got, value)


@pytest.mark.parametrize("recipe", _recipes())
def test_recipe_has_header_and_no_restated_defaults(recipe):
    """A comment header that names the recipe's own path (its command), and no key restating a default unless it
    is a headline knob; configs/quickstart.yaml writes out the quickstart's embedded defaults on purpose."""
    text = (CONFIGS / recipe).read_text(encoding="utf-8")
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert text.startswith("#") and any(f"configs/{recipe}" in line for line in header), \
        f"{recipe}: the comment header must show the command that runs configs/{recipe}"
    if recipe == "quickstart.yaml":
        return
    defaults = vars(_parser(recipe).parse_known_args([])[0])
    restated = [k for k, v in load_yaml(CONFIGS / recipe).items() if k not in HEADLINE and defaults.get(k) == v]
    assert not restated, f"{recipe}: keys equal to the default (remove them, or add to HEADLINE): {restated}"
