"""Shared offline fixtures: the real SmolLM2 tokenizer and a tiny random Llama saved to disk."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from routers.models import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def make_tiny_llama(tokenizer, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, smollm2_tokenizer):
    """A ~3M-parameter random Llama + the real SmolLM2 tokenizer, usable wherever a model path goes."""
    path = tmp_path_factory.mktemp("tiny-llama")
    make_tiny_llama(smollm2_tokenizer).save_pretrained(path)
    smollm2_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def locomo_episodes():
    from data_synthesis.corpora import load_locomo

    return load_locomo()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Pin torch to one thread for a module: on shared 2-core machines oversubscription costs 10x."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def memroute_log(caplog):
    """``caplog`` for memroute's loggers. A CLI entry point (``setup_cli_logging``) stops the ``memroute`` logger
    propagating to the root logger caplog listens on, so caplog's handler is attached to ``memroute`` itself
    (propagation off meanwhile: each record is captured once), at INFO."""
    import logging

    logger = logging.getLogger("memroute")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
        logger.setLevel(level)
        logger.propagate = propagate
