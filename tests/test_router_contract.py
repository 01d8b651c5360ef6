"""The one contract of the three exported routers (review house.md, problem 3): every router is an
ExportedRouter, the string registry loads each export type in a fresh process, one export path and one
resume rule serve all three trainers, and exports written before the contract existed still load."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_tiny_llama
from routers.base import ROUTERS, ExportedRouter, RouterConfigError, load_router, router_class

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[1]
KINDS = ["sufficiency", "retriever", "memagent"]
CLASSES = {"sufficiency": "SufficiencyRouter", "retriever": "RetrieverRouter", "memagent": "MemAgentRouter"}

# What save_pretrained wrote before ExportedRouter (memroute 1cd8624): the files of each export and the keys of its
# router_config.json. The new code writes exactly the same, plus calibration.json for the retriever (whose
# threshold lived only in router_config.json). Weights and tokenizer files are the libraries' own.
LEGACY_FILES = {
    "sufficiency": {"README.md", "calibration.json", "chat_template.jinja", "config.json", "generation_config.json",
                    "model.safetensors", "router_config.json", "tokenizer.json", "tokenizer_config.json"},
    "memagent": {"README.md", "calibration.json", "chat_template.jinja", "config.json", "generation_config.json",
                 "model.safetensors", "router_config.json", "tokenizer.json", "tokenizer_config.json"},
    "retriever": {"1_Pooling/config.json", "2_Normalize/config.json", "README.md", "config.json",
                  "config_sentence_transformers.json", "model.safetensors", "modules.json", "router_config.json",
                  "sentence_bert_config.json", "tokenizer.json", "tokenizer_config.json"},
}
LEGACY_CONFIG_KEYS = {
    "sufficiency": ["schema_version", "router_type", "labels", "yes_token_ids", "no_token_ids", "threshold",
                    "max_input_tokens", "system_prompt", "user_template", "base_model", "library_versions",
                    "git_revision"],
    "memagent": ["schema_version", "router_type", "labels", "decision", "in_threshold", "end_threshold",
                 "max_input_tokens", "max_batch_tokens", "end_mode", "provider_names", "base_model", "prompts",
                 "completions", "library_versions", "git_revision"],
    "retriever": ["schema_version", "router_type", "labels", "embedding_dim", "normalized", "base_model",
                  "temperature", "top_k", "threshold", "max_seq_length", "step_format", "extra", "library_versions",
                  "git_revision"],
}
# A retriever router_config.json as the old code wrote it (threshold inside, no calibration.json), for a 32-dim encoder.
LEGACY_RETRIEVER_CONFIG = {
    "schema_version": 1, "router_type": "retriever",
    "labels": {"score": "cosine(e(query), e(step)); higher = more likely evidence"},
    "embedding_dim": 32, "normalized": True, "base_model": "tiny-bert", "temperature": 0.05, "top_k": 3,
    "threshold": 0.25, "max_seq_length": 64, "step_format": "Step.render()", "extra": {},
    "library_versions": {"python": "3.11"}, "git_revision": None,
}


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory) -> str:
    from retriever_helpers import build_tiny_encoder

    return build_tiny_encoder(tmp_path_factory.mktemp("tiny-st") / "st")


@pytest.fixture(scope="module")
def routers(smollm2_tokenizer, encoder_dir):
    from sentence_transformers import SentenceTransformer

    from routers.memagent.router import MemAgentRouter
    from routers.retriever import RetrieverRouter
    from routers.sufficiency import SufficiencyRouter

    return {"sufficiency": SufficiencyRouter.from_model(make_tiny_llama(smollm2_tokenizer), smollm2_tokenizer,
                                                        base_model="tiny"),
            "retriever": RetrieverRouter(SentenceTransformer(encoder_dir, device="cpu")),
            "memagent": MemAgentRouter.from_model(make_tiny_llama(smollm2_tokenizer, seed=1), smollm2_tokenizer,
                                                  provider_names=["A", "B"])}


@pytest.fixture(scope="module")
def exports(tmp_path_factory, routers) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("contract-exports")
    return {kind: router.save_pretrained(root / kind) for kind, router in routers.items()}


def _files(path: Path) -> set[str]:
    return {f.relative_to(path).as_posix() for f in path.rglob("*") if f.is_file()}


# -- one base class, one registry ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_every_router_is_an_exported_router(kind):
    cls = router_class(kind)
    assert issubclass(cls, ExportedRouter) and cls.__name__ == CLASSES[kind]
    assert cls.router_type == kind and ROUTERS[kind].endswith(f":{CLASSES[kind]}")
    assert cls.config_cls.__dataclass_fields__  # a dataclass: router_config.json's fields
    for hook in ("_load_weights", "_save_weights", "model_card"):
        assert getattr(cls, hook) is not getattr(ExportedRouter, hook), f"{cls.__name__} must implement {hook}"


def test_registry_is_strings_and_the_decorator_is_gone():
    import routers.base as base

    assert set(ROUTERS) == set(KINDS) | {"mesa_selector"} and all(isinstance(v, str) for v in ROUTERS.values())
    for gone in ("_REGISTRY", "register_router", "ROUTER_MODULES", "Router"):
        assert not hasattr(base, gone), gone


@pytest.mark.parametrize("kind", KINDS)
def test_load_router_each_type_in_a_fresh_process(exports, kind):
    """Only the registry string is needed: the router's module is imported by load_router, and no other router's."""
    code = ("import sys\n"
            "from routers.base import load_router\n"
            "mods = ('routers.sufficiency', 'routers.retriever', 'routers.memagent.router')\n"
            "assert not [m for m in mods if m in sys.modules]\n"
            "r = load_router(sys.argv[1], device='cpu')\n"
            "print(type(r).__name__, r.router_type, sorted(m for m in mods if m in sys.modules))\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code, str(exports[kind])], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    module = ROUTERS[kind].split(":")[0]
    assert proc.stdout.strip().splitlines()[-1] == f"{CLASSES[kind]} {kind} ['{module}']"


def test_models_no_longer_imports_sufficiency():
    """The routers/models.py <-> routers/sufficiency.py loop is gone; the old import path still works."""
    tree = ast.parse((REPO / "routers" / "models.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "routers.sufficiency" not in imported
    import routers.models as models
    import routers.sufficiency as suff

    assert suff.left_pad is models.left_pad and suff.padding_safe_mask is models.padding_safe_mask


# -- the export format: unchanged, and older exports load ----------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_export_files_are_the_legacy_ones(exports, kind):
    new = {"calibration.json"} if kind == "retriever" else set()
    assert _files(exports[kind]) == LEGACY_FILES[kind] | new
    assert list(json.loads((exports[kind] / "router_config.json").read_text())) == LEGACY_CONFIG_KEYS[kind]
    assert (exports[kind] / "README.md").read_text().startswith("---\n")


@pytest.mark.parametrize("kind", KINDS)
def test_legacy_export_loads(exports, routers, tmp_path, kind):
    """An export in the old layout (the retriever without calibration.json) loads with the same config."""
    d = shutil.copytree(exports[kind], tmp_path / kind)
    if kind == "retriever":
        (d / "calibration.json").unlink()
    assert _files(d) == LEGACY_FILES[kind]
    loaded = load_router(d, device="cpu")
    assert type(loaded) is type(routers[kind]) and loaded.config == routers[kind].config


def test_legacy_retriever_threshold_in_router_config_is_honoured(encoder_dir, tmp_path):
    from routers.retriever import RetrieverRouter

    d = shutil.copytree(encoder_dir, tmp_path / "legacy")
    (d / "router_config.json").write_text(json.dumps(LEGACY_RETRIEVER_CONFIG))
    assert not (d / "calibration.json").exists()
    r = RetrieverRouter.from_pretrained(d, device="cpu")
    assert r.config.threshold == 0.25 and r.config.top_k == 3 and r.calibration == {}
    assert r.decide([0.1, 0.9, 0.3, 0.25, 0.2]) == [1, 2, 3]
    again = r.save_pretrained(tmp_path / "resaved")  # re-saving writes the threshold to calibration.json too
    assert json.loads((again / "calibration.json").read_text()) == {"threshold": 0.25}
    assert json.loads((again / "router_config.json").read_text())["threshold"] == 0.25
    assert RetrieverRouter.from_pretrained(again, device="cpu").config.threshold == 0.25


def test_retriever_calibration_overrides_router_config(exports, tmp_path):
    from routers.retriever import RetrieverRouter

    d = shutil.copytree(exports["retriever"], tmp_path / "r")
    assert json.loads((d / "calibration.json").read_text()) == {"threshold": None}
    cfg = json.loads((d / "router_config.json").read_text())
    (d / "router_config.json").write_text(json.dumps({**cfg, "threshold": 0.5}))
    (d / "calibration.json").write_text(json.dumps({"threshold": -0.2, "note": "cosine"}))
    r = RetrieverRouter.from_pretrained(d, device="cpu")
    assert r.config.threshold == pytest.approx(-0.2) and r.calibration["note"] == "cosine"
    (d / "calibration.json").write_text(json.dumps({"threshold": None}))
    assert RetrieverRouter.from_pretrained(d, device="cpu").config.threshold is None  # null: no threshold
    for bad, match in ((1.5, r"threshold must be a finite number in \[-1, 1\], got 1.5"),
                       ("high", "threshold must be a number")):
        (d / "calibration.json").write_text(json.dumps({"threshold": bad}))
        with pytest.raises(RouterConfigError, match=f"calibration.json: {match}"):
            RetrieverRouter.from_pretrained(d, device="cpu")


@pytest.mark.parametrize("kind, calibration", [("sufficiency", {"threshold": 0.7}),
                                               ("retriever", {"threshold": 0.4}),
                                               ("memagent", {"in_threshold": 0.6, "end_threshold": 0.2})])
def test_save_with_calibration_round_trips(routers, tmp_path, kind, calibration):
    path = routers[kind].save_pretrained(tmp_path / kind, calibration=calibration)
    loaded = load_router(path, device="cpu")
    assert loaded.calibration == calibration
    for key, value in calibration.items():
        assert getattr(loaded.config, key) == pytest.approx(value)


# -- one export path, one resume rule -------------------------------------------------------------------------------
def test_one_export_path_and_one_resume_rule():
    import train.export
    import train.memagent
    import train.retriever
    import train.sufficiency
    from routers.cli import JOBS
    from train.checkpoints import resolve_resume, training_summary

    assert set(train.export.EXPORTS) == set(ROUTERS) - {"mesa_selector"} == set(JOBS["export"])  # train mesa exports itself
    for module in (train.sufficiency, train.retriever, train.memagent):
        assert module.resolve_resume is resolve_resume
    for module in (train.export, train.sufficiency, train.retriever, train.memagent):  # no copy of the reader
        assert '!= "log_history"' not in Path(module.__file__).read_text(), module.__name__
    assert train.export.training_summary is training_summary


def test_training_summary_drops_log_history(tmp_path):
    from train.checkpoints import training_summary

    assert training_summary(tmp_path) is None
    (tmp_path / "train_summary.json").write_text(json.dumps({"steps": 3, "log_history": [{"loss": 1.0}]}))
    assert training_summary(tmp_path) == {"steps": 3}
    (tmp_path / "train_summary.json").write_text("[1]")
    with pytest.raises(ValueError, match="train_summary.json: expected a JSON object"):
        training_summary(tmp_path)


def test_resolve_resume_skips_a_half_written_checkpoint(tmp_path):
    from types import SimpleNamespace

    from train.checkpoints import resolve_resume

    out = tmp_path / "run"
    good = out / "checkpoint-2"
    good.mkdir(parents=True)
    (good / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    (out / "checkpoint-4").mkdir()  # killed while saving: no trainer_state.json
    cfg = SimpleNamespace(resume="auto", resume_from_checkpoint=None, output_dir=str(out))
    assert resolve_resume(cfg) == str(good)
    assert resolve_resume(SimpleNamespace(resume="never", resume_from_checkpoint=None, output_dir=str(out))) is None
    with pytest.raises(FileNotFoundError, match="resume_from_checkpoint .*directory does not exist"):
        resolve_resume(SimpleNamespace(resume="auto", resume_from_checkpoint=str(tmp_path / "nope"),
                                       output_dir=str(out)))
