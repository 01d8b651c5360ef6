"""Shared pieces of the retriever tests: a tiny random BERT sentence encoder with the real MiniLM
tokenizer, a learnable toy retrieval task, and a worker for the 2-process gather test."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The toy task: each query names a thing from QUERY_WORDS; its positives talk about the matching
# word in ANSWER_WORDS (no word shared with the query), its negatives repeat the query's word. A
# random encoder therefore ranks negatives first; training must learn the mapping.
QUERY_WORDS = ["apple", "river", "mountain", "guitar", "window", "planet", "coffee", "garden",
               "silver", "rocket", "violin", "desert"]
ANSWER_WORDS = ["tiger", "candle", "falcon", "bridge", "castle", "lemon", "ocean", "pencil",
                "hammer", "rabbit", "cloud", "button"]


def build_tiny_encoder(path: Path, seed: int = 0, max_seq_length: int = 64) -> str:
    """A ~1M-parameter random BERT (hidden 32, 2 layers) + mean pooling + Normalize, saved as a
    sentence-transformers folder at ``path``; returns the path."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import AutoTokenizer, BertConfig, BertModel

    from routers.models import minilm_path

    path = Path(path)
    tok = AutoTokenizer.from_pretrained(str(minilm_path()))
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    bert_dir = path.parent / f"{path.name}-bert"
    BertModel(cfg).save_pretrained(bert_dir)
    tok.save_pretrained(bert_dir)
    model = SentenceTransformer(modules=[Transformer(str(bert_dir), max_seq_length=max_seq_length),
                                         Pooling(32, "mean"), Normalize()], device="cpu")
    model.save(str(path))
    return str(path)


def toy_records(n: int = len(QUERY_WORDS)) -> list[dict]:
    recs = []
    for i in range(n):
        q, a = QUERY_WORDS[i], ANSWER_WORDS[i]
        recs.append({
            "schema_version": 1, "id": f"toy/q{i}", "qa_id": f"toy/q{i}", "episode_id": "toy", "source": "toy",
            "split": "train", "category": "toy", "query": f"where is the {q} kept",
            "positives": [f"[p{i}] the {a} is here", f"[w{i}] we saw the {a} there\n[x{i}] nice"],
            "negatives": [f"[n{i}] the {q} is not here", f"[m{i}] a {q} story"],
            "positive_ids": [f"p{i}", f"w{i}"], "negative_ids": [f"n{i}", f"m{i}"],
            "positive_kinds": ["step", "window"], "negative_kinds": ["bm25", "bm25"], "evidence_ids": [f"p{i}"]})
    return recs


def write_jsonl(path: Path, recs: list[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path


def toy_recall_at_1(encode, recs: list[dict]) -> float:
    """Share of toy queries whose top-1 among every record's first positive and negatives is its
    own first positive (the evidence step)."""
    import numpy as np

    memory = [r["positives"][0] for r in recs] + [t for r in recs for t in r["negatives"]]
    m = np.asarray(encode(memory))
    q = np.asarray(encode([r["query"] for r in recs]))
    top = np.argmax(q @ m.T, axis=1)
    return float(np.mean([memory[t] == r["positives"][0] for t, r in zip(top, recs)]))


# -- two-process gather check (torch.multiprocessing.spawn target) -------------------------------------
def gather_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from train.retriever_losses import MultiPositiveInfoNCELoss, pack_labels

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        data = torch.load(Path(out_dir) / "inputs.pt")
        q = data["q"][rank].clone().requires_grad_(True)
        c = data["c"][rank].clone().requires_grad_(True)
        labels = pack_labels(data["relation"][rank], data["keys"][rank])
        loss_fn = MultiPositiveInfoNCELoss(model=None, temperature=0.1, gather_across_devices=True)
        loss = loss_fn.loss_from_embeddings(q, c, labels)
        loss.backward()
        torch.save({"loss": loss.detach(), "q_grad": q.grad, "c_grad": c.grad}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


class BagOfLetters:
    """Deterministic stand-in for a sentence encoder: normalized letter counts (``shift`` rotates them)."""

    def __init__(self, shift: int = 0):
        self.shift = shift

    def encode(self, texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False):
        import string

        import numpy as np

        out = []
        for t in texts:
            v = np.zeros(26)
            for ch in t.lower():
                if ch in string.ascii_lowercase:
                    v[(ord(ch) - 97 + self.shift) % 26] += 1
            out.append(v / (np.linalg.norm(v) or 1.0))
        return np.stack(out)
