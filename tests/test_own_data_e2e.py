"""Your own data, end to end (issue 17's "done when"): a user with a JSONL of their own conversations runs the
README's commands through ``routers.cli.run``: validate -> synth -> train with a dev split and best-model
selection -> eval on the held-out episodes -> push (HfApi replaced); and the retriever path, synth -> train with
a dev split scored by the IR evaluator. The corpus is a small generic chat corpus written here (no LoCoMo, no
TextWorld), and the base model a tiny random Llama laid out as a Hub-cache snapshot, so the card can name it."""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from routers.cli import run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[1]
BASE_ID = "memroute-test/tiny-llama"  # what the card must name: the snapshot folder's Hub id
N_EPISODES = 10
PETS = ["dog", "cat", "parrot", "rabbit", "turtle", "hamster"]
NAMES = ["Biscuit", "Miso", "Pepper", "Juniper", "Comet", "Noodle", "Maple", "Pixel", "Olive", "Rocket"]
CITIES = ["Lisbon", "Tallinn", "Montreal", "Hanoi", "Nairobi", "Porto", "Osaka", "Bergen", "Quito", "Seville"]
HOBBIES = ["pottery", "bouldering", "chess", "sailing", "baking sourdough", "birdwatching", "salsa dancing"]


def chat_episode(i: int) -> dict:
    """One support-style chat between a user and an assistant: 9 turns over 2 sessions, 3 questions whose
    evidence are turn ids, plus one question without evidence (valid, but unused by the routers)."""
    rng = random.Random(i)
    pet, name, city, hobby = rng.choice(PETS), NAMES[i % len(NAMES)], CITIES[i % len(CITIES)], rng.choice(HOBBIES)
    moved = rng.choice([c for c in CITIES if c != city])
    turns = [("user", f"Hi! I am planning my week and want some help with it."),
             ("user", f"Last spring I adopted a {pet} and named it {name}."),
             ("assistant", "Congratulations! How is the new family member settling in?"),
             ("user", f"Great. By the way I grew up in {city}, so I miss the food there."),
             ("user", f"On weekends I do {hobby} with my sister."),
             ("assistant", "That sounds like a lovely routine."),
             ("user", f"Next month I am moving to {moved} for a new job."),
             ("user", f"I need to find a vet in {moved} for {name}."),
             ("assistant", "I can list vets close to your new place once you have an address.")]
    steps = [{"step_id": f"t{j}", "index": j, "speaker": who, "session": "1" if j < 5 else "2",
              "timestamp": f"2024-0{1 + j // 5}-1{i % 10}", "text": text} for j, (who, text) in enumerate(turns)]
    qa = [{"qa_id": f"chat{i}/pet", "question": f"What is the name of the user's {pet}?", "answer": name,
           "evidence": ["t1"], "category": "single-hop"},
          {"qa_id": f"chat{i}/home", "question": "Which city did the user grow up in?", "answer": city,
           "evidence": ["t3"], "category": "single-hop"},
          {"qa_id": f"chat{i}/move", "question": f"Where must the user find a vet for {name}, and why?",
           "answer": f"{moved}, because of a new job", "evidence": ["t6", "t7"], "category": "multi-hop"},
          {"qa_id": f"chat{i}/open", "question": "What should the user cook tonight?", "answer": "", "evidence": []}]
    return {"schema_version": 1, "episode_id": f"chat-{i}", "source": "my-assistant-logs", "steps": steps, "qa": qa,
            "meta": {"user": f"user-{i}"}}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("own-data") / "my_conversations.jsonl"
    path.write_text("".join(json.dumps(chat_episode(i)) + "\n" for i in range(N_EPISODES)), encoding="utf-8")
    return path


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def card_front_matter(text: str) -> dict:
    assert text.startswith("---\n"), text[:200]
    return yaml.safe_load(text.split("---", 2)[1])


class RecordingHub:
    """Stands in for ``huggingface_hub.HfApi``: records the calls, and what the uploaded folder held at upload."""

    def __init__(self):
        self.calls, self.uploaded = [], {}

    def create_repo(self, repo_id, **kw):
        self.calls.append(("create_repo", repo_id, kw))
        return SimpleNamespace(repo_id=repo_id)

    def create_branch(self, repo_id, **kw):
        self.calls.append(("create_branch", repo_id, kw))

    def upload_folder(self, **kw):
        self.calls.append(("upload_folder", kw["repo_id"], kw))
        folder = Path(kw["folder_path"])
        self.uploaded = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        return SimpleNamespace(commit_url=f"https://huggingface.co/{kw['repo_id']}/commit/0")


# -- validate, synth sufficiency -------------------------------------------------------------------------------
def test_validate_and_synth_on_own_conversations(corpus, tmp_path, memroute_log):
    assert run(["validate", str(corpus)]) == 0
    summary = [r.getMessage() for r in memroute_log.records if r.name == "memroute.data_synthesis.validate"]
    assert summary == [f"{corpus}: OK: {N_EPISODES} episodes, {9 * N_EPISODES} steps, {4 * N_EPISODES} questions, "
                       f"{3 * N_EPISODES} with evidence"]
    bad = tmp_path / "bad.jsonl"
    broken = {**chat_episode(N_EPISODES), "qa": [{**chat_episode(N_EPISODES)["qa"][0], "evidence": ["t99"]}]}
    bad.write_text(corpus.read_text() + json.dumps(broken) + "\n" + json.dumps(chat_episode(4)) + "\n")
    assert run(["validate", str(bad)]) == 2  # the unknown evidence turn and the repeated episode, both reported
    errors = [r.getMessage() for r in memroute_log.records if r.levelno >= logging.ERROR]
    assert errors == [f"{bad}:{N_EPISODES + 1}: qa #0 ('chat{N_EPISODES}/pet'): field 'evidence': ['t99'] is not a step "
                      "id of the episode", f"{bad}:{N_EPISODES + 2}: duplicate episode_id 'chat-4' (also at line 5)",
                      f"{bad}: 2 bad record(s); {N_EPISODES} good episode(s)"]


@pytest.fixture(scope="module")
def synth(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "sufficiency"
    assert run(["synth", "sufficiency", str(REPO / "configs/sufficiency/synth/own_data.yaml"), "--output_dir", str(out),
                "--corpus", "episodes", "--corpus_path", str(corpus), "--eval_fraction", "0.2",
                "--encoder", "none", "--answer_models", "none"]) == 0
    return out


def test_synth_holds_out_whole_episodes(synth):
    manifest = json.loads((synth / "manifest.json").read_text())
    train, held = read_jsonl(synth / "train.jsonl"), read_jsonl(synth / "eval.jsonl")
    assert len(manifest["eval_episodes"]) == 2 and {r["episode_id"] for r in held} == set(manifest["eval_episodes"])
    assert len({r["episode_id"] for r in train}) == N_EPISODES - 2
    assert not {r["episode_id"] for r in train} & set(manifest["eval_episodes"])
    # 3 questions with evidence per episode, a sufficient and an insufficient context each; the open question is not used
    assert len(train) == (N_EPISODES - 2) * 3 * 2 and len(held) == 2 * 3 * 2
    assert {r["label"] for r in train} == {0, 1} and {r["source"] for r in train} == {"my-assistant-logs"}
    assert not any("/open" in r["id"] for r in train + held)


# -- train with a dev split, best checkpoint exported; eval; push ---------------------------------------------
@pytest.fixture(scope="module")
def base_snapshot(tiny_llama_dir, tmp_path_factory) -> str:
    """The tiny model where the Hub cache would keep ``memroute-test/tiny-llama``."""
    snap = tmp_path_factory.mktemp("hub") / "models--memroute-test--tiny-llama" / "snapshots" / "0123abc"
    shutil.copytree(tiny_llama_dir, snap)
    return str(snap)


def test_own_data_train_eval_push(synth, base_snapshot, tmp_path, memroute_log, monkeypatch):
    from peft import PeftModel
    from sklearn.metrics import roc_auc_score
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import huggingface_hub
    from numerics import assert_close_to_scale
    from routers.base import load_router
    from test_eval_during_training import full_model_scores

    out, export, ev = tmp_path / "run", tmp_path / "router", tmp_path / "eval"
    assert run(["train", "sufficiency", "--model_name_or_path", base_snapshot, "--train_file", str(synth / "train.jsonl"),
                "--output_dir", str(out), "--export_dir", str(export), "--dev_fraction", "0.25",
                "--eval_strategy", "steps", "--eval_steps", "2", "--save_steps", "2",
                "--load_best_model_at_end", "true", "--metric_for_best_model", "eval_auroc", "--max_steps", "8",
                "--per_device_train_batch_size", "8", "--learning_rate", "2e-2", "--lora_r", "8",
                "--report_to", "none", "--disable_tqdm", "true", "--dataloader_num_workers", "0"]) == 0
    summary = json.loads((out / "train_summary.json").read_text())
    held = summary["eval"]
    assert len(held["dev_episodes"]) == 2  # round(0.25 * 8 training episodes), drawn from the training file only
    dev = [r for r in read_jsonl(synth / "train.jsonl") if r["episode_id"] in held["dev_episodes"]]
    assert held["dev_records"] == len(dev) == 12 and summary["samples"] == 48 - 12
    evals = [h for h in summary["log_history"] if "eval_auroc" in h]
    assert [h["step"] for h in evals] == [2, 4, 6, 8]  # eval_auroc at every eval step
    assert all(0.0 <= h["eval_auroc"] <= 1.0 and h["eval_n"] == 12 for h in evals)
    best = None
    for h in evals:  # the Trainer's rule: a strictly greater AUROC replaces the best
        best = h if best is None or h["eval_auroc"] > best["eval_auroc"] else best
    assert held["best_model_checkpoint"] == str(out / f"checkpoint-{best['step']}")
    assert held["best_metric"] == best["eval_auroc"]
    assert best["step"] != 8, "precondition: at this learning rate the dev AUROC peaks before the last step"

    # the export is the best checkpoint, and its dev AUROC is the logged one
    tokenizer = AutoTokenizer.from_pretrained(base_snapshot)

    def checkpoint_scores(step):
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_snapshot), str(out / f"checkpoint-{step}"))
        return full_model_scores(model, tokenizer, dev)

    router = load_router(str(export))
    exported = router.score([r["question"] for r in dev], [r["context"] for r in dev])
    assert_close_to_scale(exported, checkpoint_scores(best["step"]), rel=1e-4)
    assert (exported - checkpoint_scores(8)).abs().max() > 1e-3  # not the last step's model
    assert roc_auc_score([r["label"] for r in dev], exported.numpy()) == pytest.approx(best["eval_auroc"], abs=1e-6)

    # eval sufficiency on the held-out episodes (base = the router's base_model)
    assert run(["eval", "sufficiency", "--router", str(export), "--data", str(synth / "eval.jsonl"),
                "--output_dir", str(ev)]) == 0
    metrics = json.loads((ev / "metrics.json").read_text())
    rows = read_jsonl(ev / "scores.jsonl")
    assert metrics["n_samples"] == len(rows) == 12 and metrics["resolved_base_model"] == base_snapshot
    for name in ("base", "trained"):
        want = roc_auc_score([r["label"] for r in rows], [r[name] for r in rows])
        assert metrics["models"][name]["auroc"] == pytest.approx(want, abs=1e-12), name
    assert any(r.getMessage() == "scoring 12 samples with the trained router" for r in memroute_log.records)

    # push: refused while offline, then one upload whose card names the base by Hub id and holds the eval results
    hub = RecordingHub()
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda *a, **k: hub)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE is set"):
        run(["push", str(export), "me/own-data-router", "--eval_results", str(ev / "metrics.json")])
    assert hub.calls == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert run(["push", str(export), "me/own-data-router", "--eval_results", str(ev / "metrics.json")]) == 0
    assert [c[0] for c in hub.calls] == ["create_repo", "upload_folder"]
    assert hub.calls[1][2]["folder_path"] == str(export)
    assert {"README.md", "router_config.json", "model.safetensors", "calibration.json"} <= set(hub.uploaded)
    card = hub.uploaded["README.md"].decode()
    meta = card_front_matter(card)
    assert meta["base_model"] == BASE_ID
    assert meta["license"] == "other" and "datasets" not in meta  # the user's data, not LoCoMo's licence
    assert "your own Episode corpus" in card and "LoCoMo" not in card
    (result,) = meta["model-index"]
    got = {m["type"]: m["value"] for r in result["results"] for m in r["metrics"]}
    assert got == pytest.approx({k: metrics["models"]["trained"][k] for k in ("auroc", "ap", "brier", "ece")})
    assert result["results"][0]["dataset"]["name"] == "own data sufficiency (held-out)"


# -- the retriever path ----------------------------------------------------------------------------------------
def test_own_data_retriever_with_dev_ir_metrics(corpus, tmp_path):
    from sentence_transformers import SentenceTransformer

    from retriever_helpers import build_tiny_encoder
    from train.retriever_eval import ir_evaluator

    data, out, export = tmp_path / "ret", tmp_path / "run", tmp_path / "export"
    assert run(["synth", "retriever", "--output_dir", str(data), "--corpora", "episodes", "--episodes_path", str(corpus),
                "--episodes_eval_fraction", "0.2", "--encoder", "none"]) == 0
    train = read_jsonl(data / "train.jsonl")
    assert len({r["episode_id"] for r in train}) == N_EPISODES - 2 and len(train) == (N_EPISODES - 2) * 3
    assert all(r["positives"] and r["negatives"] for r in train)
    assert run(["train", "retriever", "--model_name_or_path", build_tiny_encoder(tmp_path / "st"),
                "--train_file", str(data / "train.jsonl"), "--output_dir", str(out), "--export_dir", str(export),
                "--per_device_train_batch_size", "6", "--learning_rate", "3e-3", "--max_seq_length", "48",
                "--report_to", "none", "--disable_tqdm", "true", "--dataloader_num_workers", "0", "--seed", "0",
                "--max_steps", "4", "--dev_fraction", "0.25", "--eval_strategy", "steps", "--eval_steps", "2",
                "--save_steps", "2", "--load_best_model_at_end", "true"]) == 0
    summary = json.loads((out / "train_summary.json").read_text())
    held = summary["eval"]
    dev = [r for r in train if r["episode_id"] in held["dev_episodes"]]
    assert len(held["dev_episodes"]) == 2 and held["dev_queries"] == len(dev) == 6 and summary["queries"] == 18
    logs = [h for h in summary["log_history"] if "eval_dev_cosine_ndcg@10" in h]
    assert [h["step"] for h in logs] == [2, 4]
    for key in ("eval_dev_cosine_recall@1", "eval_dev_cosine_recall@5", "eval_dev_cosine_mrr@10"):
        assert all(0.0 <= h[key] <= 1.0 for h in logs), key
    best = max(logs, key=lambda h: (h["eval_dev_cosine_ndcg@10"], -h["step"]))
    assert held["best_model_checkpoint"] == str(out / f"checkpoint-{best['step']}")
    # the exported encoder is the best checkpoint: at the training truncation (48 tokens) the evaluator gives it the
    # logged best score; the export itself keeps the base encoder's own budget for inference (issue 21)
    exported = SentenceTransformer(str(export), device="cpu")
    assert exported.max_seq_length == SentenceTransformer(build_tiny_encoder(tmp_path / "st2")).max_seq_length != 48
    exported.max_seq_length = 48
    rescored = ir_evaluator(dev)(exported)
    assert rescored["dev_cosine_ndcg@10"] == pytest.approx(best["eval_dev_cosine_ndcg@10"], abs=1e-6)
    meta = card_front_matter((export / "README.md").read_text(encoding="utf-8"))
    assert meta["license"] == "other" and "datasets" not in meta  # trained on the user's data, not LoCoMo
