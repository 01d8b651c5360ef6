"""Hub-native exports (issue 17): model cards with true metadata, exports in the training dtype, portable adapter
configs, ``memroute push`` (upload calls replaced), no HF_HUB_OFFLINE side effects, the FSDP export path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from conftest import make_tiny_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")
REPO = Path(__file__).resolve().parents[1]
QS = ["When did Caroline go to the support group?", "What is Mel's job?"]
CS = ["Caroline went to the LGBTQ support group on 7 May.", "Mel paints."]
SUFF_METRICS = {"task": "sufficiency_eval", "models": {"trained": {"auroc": 0.81, "ap": 0.7, "brier": 0.2, "ece": 0.05}}}


def card_meta(path: Path) -> dict:
    from huggingface_hub import ModelCard

    return ModelCard.load(path / "README.md").data.to_dict()


def weight_dtypes(path: Path) -> set[str]:
    from safetensors import safe_open

    out = set()
    for f in path.glob("*.safetensors"):
        with safe_open(str(f), "pt") as sf:
            out |= {str(sf.get_slice(k).get_dtype()) for k in sf.keys()}
    return out


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory, smollm2_tokenizer):
    """A full-model training output_dir whose run trained with --bf16 true on LoCoMo samples."""
    root = tmp_path_factory.mktemp("bf16-run")
    ckpt = root / "out"
    make_tiny_llama(smollm2_tokenizer).save_pretrained(ckpt)
    smollm2_tokenizer.save_pretrained(ckpt)
    (ckpt / "resolved_config.yaml").write_text(yaml.safe_dump({"bf16": True, "model_name_or_path": str(ckpt)}))
    return ckpt


# -- hub ids -----------------------------------------------------------------------------------------------------
def test_hub_model_id_maps_embedded_and_cache_folders(tmp_path, monkeypatch):
    from routers.cards import hub_model_id
    from routers.models import minilm_path, smollm2_cache_path

    monkeypatch.setenv("MEMROUTE_CACHE", str(tmp_path / "cache"))
    smollm2_cache_path().mkdir(parents=True)
    assert hub_model_id(str(smollm2_cache_path())) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert hub_model_id("smollm2") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert hub_model_id(str(minilm_path())) == "sentence-transformers/all-MiniLM-L6-v2"
    assert hub_model_id("minilm") == "sentence-transformers/all-MiniLM-L6-v2"
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-4B" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    assert hub_model_id(str(snap)) == "Qwen/Qwen3-4B"
    assert hub_model_id("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"
    assert hub_model_id(str(tmp_path)) is None and hub_model_id("./nowhere/x") is None and hub_model_id(None) is None


def test_license_follows_the_training_data(tmp_path):
    from routers.cards import card_license, training_corpora

    synth = tmp_path / "synth"
    synth.mkdir()
    (synth / "resolved_config.yaml").write_text("corpus: hotpotqa\n")
    assert training_corpora("retriever", {"train_file": str(synth / "train.jsonl")}) == ["hotpotqa"]
    assert card_license(["hotpotqa"], None) == "cc-by-sa-4.0"
    assert card_license(["locomo", "hotpotqa"], None) == "cc-by-nc-4.0"
    assert card_license(["textworld"], "HuggingFaceTB/SmolLM2-135M-Instruct") == "apache-2.0"
    assert training_corpora("sufficiency", None) == ["locomo"]
    (synth / "resolved_config.yaml").write_text("corpora: [episodes]\n")  # your own data (retriever synthesis)
    assert training_corpora("retriever", {"train_file": str(synth / "train.jsonl")}) == ["episodes"]
    assert card_license(["episodes"], "HuggingFaceTB/SmolLM2-135M-Instruct") == "other"
    assert training_corpora("retriever", {"train_file": str(tmp_path / "textworld_episodes" / "t.jsonl")}) == ["textworld"]


# -- sufficiency: training dtype, card, reload -------------------------------------------------------------------
def test_export_keeps_the_training_dtype_and_reloads_the_same_scores(bf16_checkpoint, tmp_path):
    from routers.sufficiency import SufficiencyRouter
    from train.export import main as export_main

    router = export_main(["--checkpoint", str(bf16_checkpoint), "--export_dir", str(tmp_path / "bf16")])
    assert router.model.dtype == torch.bfloat16 and weight_dtypes(tmp_path / "bf16") == {"BF16"}
    expected = router.score(QS, CS)
    for dtype in ("auto", torch.bfloat16):  # compared in the export's dtype
        again = SufficiencyRouter.from_pretrained(tmp_path / "bf16", device="cpu", dtype=dtype)
        assert again.model.dtype == torch.bfloat16
        assert torch.equal(again.score(QS, CS), expected)
    fp32 = export_main(["--checkpoint", str(bf16_checkpoint), "--export_dir", str(tmp_path / "fp32"),
                        "--export_dtype", "fp32"])
    assert fp32.model.dtype == torch.float32 and weight_dtypes(tmp_path / "fp32") == {"F32"}
    assert (tmp_path / "fp32" / "model.safetensors").stat().st_size > 1.9 * (tmp_path / "bf16" / "model.safetensors").stat().st_size
    with pytest.raises(ValueError, match="export_dtype must be one of"):
        export_main(["--checkpoint", str(bf16_checkpoint), "--export_dir", str(tmp_path / "x"), "--export_dtype", "int8"])


def test_sufficiency_card_metadata(bf16_checkpoint, tmp_path):
    from train.export import main as export_main

    export_main(["--checkpoint", str(bf16_checkpoint), "--export_dir", str(tmp_path / "e")])
    meta = card_meta(tmp_path / "e")
    assert meta["library_name"] == "transformers" and meta["license"] == "cc-by-nc-4.0"
    assert {"memroute", "sufficiency-router"} <= set(meta["tags"]) and meta["datasets"] == ["adymaharana/locomo"]
    assert "base_model" not in meta  # a local folder with no Hub id: omitted ...
    text = (tmp_path / "e" / "README.md").read_text()
    assert "no known Hugging Face Hub id" in text and str(bf16_checkpoint) not in text.split("---")[1]  # ... and said


def test_card_names_the_embedded_base_by_its_hub_id(smollm2_tokenizer, monkeypatch, tmp_path):
    from routers.models import smollm2_cache_path
    from routers.sufficiency import SufficiencyRouter

    monkeypatch.setenv("MEMROUTE_CACHE", str(tmp_path))
    smollm2_cache_path().mkdir(parents=True)
    router = SufficiencyRouter.from_model(make_tiny_llama(smollm2_tokenizer), smollm2_tokenizer,
                                          base_model=str(smollm2_cache_path()))
    router.save_pretrained(tmp_path / "e")
    meta = card_meta(tmp_path / "e")
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert str(tmp_path) not in (tmp_path / "e" / "README.md").read_text()


def test_eval_results_from_the_exports_own_evaluation(bf16_checkpoint, tmp_path):
    from routers.cards import refresh_card
    from train.export import main as export_main

    export_main(["--checkpoint", str(bf16_checkpoint), "--export_dir", str(tmp_path / "e")])
    assert refresh_card(tmp_path / "e") is None and "model-index" not in card_meta(tmp_path / "e")
    (tmp_path / "e" / "eval_results.json").write_text(json.dumps(SUFF_METRICS))
    refresh_card(tmp_path / "e")
    meta = card_meta(tmp_path / "e")
    metrics = {m["type"]: m["value"] for m in meta["model-index"][0]["results"][0]["metrics"]}
    assert metrics == {"auroc": 0.81, "ap": 0.7, "brier": 0.2, "ece": 0.05}
    assert meta["license"] == "cc-by-nc-4.0" and meta["library_name"] == "transformers"  # the rest is kept


# -- MemAgent adapter: portable base model name ------------------------------------------------------------------
def test_memagent_adapter_export_names_the_base_by_hub_id(smollm2_tokenizer, monkeypatch, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from routers.memagent.router import MemAgentRouter
    from routers.models import smollm2_cache_path

    monkeypatch.setenv("MEMROUTE_CACHE", str(tmp_path / "cache"))
    base_dir = smollm2_cache_path()  # stands in for the SmolLM2 folder converted from the GGUF
    make_tiny_llama(smollm2_tokenizer).save_pretrained(base_dir)
    smollm2_tokenizer.save_pretrained(base_dir)
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base_dir)),
                          LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    router = MemAgentRouter.from_model(peft, smollm2_tokenizer, base_model=str(base_dir), provider_names=["A"])
    router.save_pretrained(tmp_path / "e")
    adapter = json.loads((tmp_path / "e" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    meta = card_meta(tmp_path / "e")
    assert meta["library_name"] == "peft" and meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert meta["license"] == "apache-2.0" and {"memroute", "memagent-router"} <= set(meta["tags"])
    loaded = MemAgentRouter.from_pretrained(tmp_path / "e", device="cpu")  # base from router_config, still loads
    assert hasattr(loaded.model, "peft_config")


# -- retriever: sentence-transformers' card + ours, dtype ---------------------------------------------------------
@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory) -> str:
    from retriever_helpers import build_tiny_encoder

    return build_tiny_encoder(tmp_path_factory.mktemp("tiny-st") / "st")


def test_retriever_card_keeps_sentence_transformers_card(encoder_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    from routers.retriever import RetrieverConfig, RetrieverRouter

    router = RetrieverRouter(SentenceTransformer(encoder_dir, device="cpu"), RetrieverConfig(base_model="minilm"))
    router.save_pretrained(tmp_path / "e", model_card=router.model_card(training={"steps": 5}))
    text = (tmp_path / "e" / "README.md").read_text()
    meta = card_meta(tmp_path / "e")
    assert meta["library_name"] == "sentence-transformers" and meta["license"] == "cc-by-nc-4.0"
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert {"memroute", "retriever-router", "sentence-transformers"} <= set(meta["tags"])
    assert "SentenceTransformer" in text.split("# memroute:")[0]  # sentence-transformers' own card body first
    assert "# memroute: Router-Mem evidence retriever" in text and '"steps": 5' in text


def test_retriever_bf16_export_reloads_the_same_scores(encoder_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    from routers.base import cast_weights
    from routers.retriever import RetrieverRouter

    router = RetrieverRouter(cast_weights(SentenceTransformer(encoder_dir, device="cpu"), torch.bfloat16))
    router.save_pretrained(tmp_path / "e")
    assert weight_dtypes(tmp_path / "e") == {"BF16"}
    again = RetrieverRouter.from_pretrained(tmp_path / "e", device="cpu", dtype="auto")
    assert next(again.model.parameters()).dtype == torch.bfloat16
    assert (again.score(QS[0], CS) == router.score(QS[0], CS)).all()


# -- memroute push -------------------------------------------------------------------------------------------------
class FakeApi:
    def __init__(self):
        self.calls = []

    def create_repo(self, repo_id, **kw):
        self.calls.append(("create_repo", repo_id, kw))
        return SimpleNamespace(repo_id=repo_id)

    def create_branch(self, repo_id, **kw):
        self.calls.append(("create_branch", repo_id, kw))

    def upload_folder(self, **kw):
        self.calls.append(("upload_folder", kw["repo_id"], kw))
        return SimpleNamespace(commit_url=f"https://hf.co/{kw['repo_id']}/commit/1")


@pytest.fixture()
def fake_hub(monkeypatch):
    import huggingface_hub

    api = FakeApi()
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda *a, **k: api)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return api


def test_push_uploads_an_export(bf16_checkpoint, tmp_path, fake_hub):
    from routers.push import main
    from train.export import main as export_main

    export_main(["--checkpoint", str(bf16_checkpoint), "--export_dir", str(tmp_path / "e")])
    (tmp_path / "m.json").write_text(json.dumps(SUFF_METRICS))
    assert main([str(tmp_path / "e"), "me/router", "--private", "--revision", "v1",
                 "--eval_results", str(tmp_path / "m.json")]) == 0
    names = [c[0] for c in fake_hub.calls]
    assert names == ["create_repo", "create_branch", "upload_folder"]
    assert fake_hub.calls[0][2]["private"] is True and fake_hub.calls[0][2]["exist_ok"] is True
    assert fake_hub.calls[1][2]["branch"] == "v1"
    upload = fake_hub.calls[2][2]
    assert upload["folder_path"] == str(tmp_path / "e") and upload["revision"] == "v1"
    assert "sufficiency" in upload["commit_message"]
    assert "model-index" in card_meta(tmp_path / "e")  # the card carries the evaluation before upload


def test_push_refuses_what_is_not_an_export(tmp_path, fake_hub, monkeypatch):
    from routers.base import RouterConfigError
    from routers.push import main

    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "model.safetensors").write_bytes(b"x")
    with pytest.raises(RouterConfigError, match="router_config.json"):
        main([str(tmp_path / "plain"), "me/x"])
    with pytest.raises(FileNotFoundError):
        main([str(tmp_path / "missing"), "me/x"])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "router_config.json").write_text(json.dumps({"schema_version": 1, "router_type": "nope"}))
    with pytest.raises(RouterConfigError, match="unknown router_type"):
        main([str(tmp_path / "bad"), "me/x"])
    assert fake_hub.calls == []


def test_push_says_offline_mode_blocks_it(bf16_checkpoint, tmp_path, fake_hub, monkeypatch):
    from routers.push import main
    from train.export import main as export_main

    export_main(["--checkpoint", str(bf16_checkpoint), "--export_dir", str(tmp_path / "e")])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE"):
        main([str(tmp_path / "e"), "me/x"])
    assert fake_hub.calls == []


# -- HF_HUB_OFFLINE: never a library side effect ------------------------------------------------------------------
def test_library_loaders_leave_the_environment_alone(encoder_dir, tmp_path):
    code = (
        "import os, sys\n"
        "before = dict(os.environ)\n"
        "import routers.models, routers.retriever, routers.sufficiency, routers.memagent.router, routers.cards\n"
        "from routers.retriever import RetrieverRouter\n"
        "r = RetrieverRouter(routers.models.load_encoder(sys.argv[1]))\n"
        "r.save_pretrained(sys.argv[2])\n"
        "RetrieverRouter.from_pretrained(sys.argv[2], device='cpu')\n"
        "import huggingface_hub.constants as c\n"
        "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())\n"
        "assert not c.HF_HUB_OFFLINE\n"
        "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code, encoder_dir, str(tmp_path / "e")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


# -- FSDP: save_model must write full weights, rank 0 exports them ---------------------------------------------------
def test_fsdp_config_writes_full_state_dicts():
    cfg = yaml.safe_load((REPO / "configs" / "accelerate" / "fsdp.yaml").read_text())
    assert cfg["fsdp_config"]["fsdp_state_dict_type"] == "FULL_STATE_DICT"


def _trainer(fsdp: bool, rank0: bool, state_dict_type="StateDictType.FULL_STATE_DICT"):
    events = []
    acc = SimpleNamespace(unwrap_model=lambda m: ("unwrapped", m), wait_for_everyone=lambda: events.append("barrier"),
                          state=SimpleNamespace(fsdp_plugin=SimpleNamespace(state_dict_type=state_dict_type)))
    return SimpleNamespace(accelerator=acc, model="wrapped", is_fsdp_enabled=fsdp,
                           is_world_process_zero=lambda: rank0), events


def test_model_for_export_gathers_before_rank0_writes(monkeypatch):
    import train.export as ex

    loads = []
    monkeypatch.setattr(ex, "load_checkpoint", lambda d, b=None: (loads.append((d, b)) or ("full", "tok", "base")))
    trainer, events = _trainer(fsdp=False, rank0=True)
    assert ex.model_for_export(trainer, "out") == ("unwrapped", "wrapped") and not loads
    assert ex.model_for_export(_trainer(False, rank0=False)[0], "out") is None
    trainer, events = _trainer(fsdp=True, rank0=True)
    assert ex.model_for_export(trainer, "out", "base") == "full" and loads == [("out", "base")] and events == ["barrier"]
    trainer, events = _trainer(fsdp=True, rank0=False)
    assert ex.model_for_export(trainer, "out") is None and events == ["barrier"] and len(loads) == 1
    with pytest.raises(RuntimeError, match="FULL_STATE_DICT"):
        ex.model_for_export(_trainer(True, True, "StateDictType.SHARDED_STATE_DICT")[0], "out")
