"""Chat token ids exactly as TRL's SFTTrainer sees them, shared by the MemAgent router and its In-decision cache
(one module, so neither imports the other)."""

from __future__ import annotations

from typing import Sequence


def chat_ids(tokenizer, messages: Sequence[dict], add_generation_prompt: bool = False) -> list[int]:
    """Token ids of a chat exactly as TRL's SFTTrainer tokenizes it (``apply_chat_template``, no extra BOS)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the MemAgent router needs a tokenizer with a chat template")
    out = tokenizer.apply_chat_template(list(messages), tokenize=True, return_dict=True,
                                        add_generation_prompt=add_generation_prompt)
    return list(out["input_ids"])


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def shared_prefix_length(sequences: Sequence[Sequence[int]], starts: Sequence[int]) -> int:
    """Tokens every candidate sequence shares before the first completion starts (the prompt a KV cache holds)."""
    shared = min(len(sequences[0]), *starts)
    for s in sequences[1:]:
        shared = min(shared, common_prefix_length(sequences[0], s))
    return shared


def encode_candidates(tokenizer, prompt: Sequence[dict], completions: Sequence[str]) -> list[tuple[list[int], int]]:
    """(prompt+completion ids, index where the completion starts) per completion, as in SFT training."""
    prompt_ids = chat_ids(tokenizer, prompt, add_generation_prompt=True)
    out = []
    for c in completions:
        full = chat_ids(tokenizer, [*prompt, {"role": "assistant", "content": c}])
        start = common_prefix_length(prompt_ids, full)
        if start >= len(full):
            raise ValueError(f"completion {c!r} adds no tokens to the prompt")
        out.append((full, start))
    return out
