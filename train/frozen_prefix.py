"""Train only the top K decoder layers, on the frozen lower layers' outputs computed once (CPU-efficient path).

Why: a sufficiency router's training cost on CPU is the forward + backward through every layer, every epoch.
With the lower ``L - K`` layers frozen, their output for a sample never changes, so it is computed once (one
partial forward per sample, the cost of about one epoch of inference) and each epoch then runs only K layers
forward and backward: for SmolLM2-135M (30 layers) and K = 4, an epoch costs ~7x less than LoRA on every layer.

How: the decoder's ``layers`` ModuleList is swapped for a slice while the model runs (``layer_slice``), so the
model's own forward (rotary positions, causal / padding mask, final norm, LM head) does the work for any
Llama-style decoder (Llama, Qwen2/3, Mistral, SmolLM2). The bottom slice runs with the final norm disabled
and returns the raw residual stream; the top slice takes it as ``inputs_embeds``. ``check_split`` compares a
split forward with the full one on a real prompt, so a decoder that transforms ``inputs_embeds`` (e.g.
Gemma's embedding scale) is refused instead of trained wrong. The exported router is the whole model, unchanged
in format: the frozen layers are the base model's.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from routers.models import left_pad


def decoder_of(model) -> nn.Module:
    """The module holding ``layers`` (and ``norm``) of a causal LM, through PEFT / DDP wrappers."""
    base = model
    for attr in ("module", "base_model", "model"):  # DDP, then PeftModel -> LoraModel -> the HF model
        inner = getattr(base, attr, None)
        if isinstance(inner, nn.Module) and not hasattr(base, "get_decoder"):
            base = inner
    if hasattr(base, "get_base_model"):
        base = base.get_base_model()
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    if decoder is None or not isinstance(getattr(decoder, "layers", None), nn.ModuleList):
        raise ValueError(f"train_top_layers needs a decoder with a `layers` ModuleList; {type(base).__name__} has none")
    return decoder


def linear_module_names(layer: nn.Module) -> list[str]:
    """The leaf names of a decoder layer's linear modules (what peft's "all-linear" means inside one layer)."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in layer.named_modules() if isinstance(m, nn.Linear)})


def num_layers(model) -> int:
    return len(decoder_of(model).layers)


@contextmanager
def layer_slice(model, start: int, stop: int | None = None, final_norm: bool = True):
    """Run the model with only ``layers[start:stop]`` (and, with ``final_norm=False``, no final norm)."""
    decoder = decoder_of(model)
    layers, norm = decoder.layers, getattr(decoder, "norm", None)
    decoder.layers = nn.ModuleList(list(layers)[start:stop])
    if not final_norm and norm is not None:
        decoder.norm = nn.Identity()
    try:
        yield
    finally:
        decoder.layers = layers
        if norm is not None:
            decoder.norm = norm


def pad_states(states: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Left-pad per-sample hidden states [len_i, hidden] into ``inputs_embeds`` with the mask and positions
    ``left_pad`` gives the token ids, so the top layers see exactly what they see in a full forward."""
    width, hidden = max(s.shape[0] for s in states), states[0].shape[-1]
    embeds = states[0].new_zeros(len(states), width, hidden)
    for i, s in enumerate(states):
        embeds[i, width - s.shape[0]:] = s
    ids = left_pad([[0] * s.shape[0] for s in states], 0)
    return {"inputs_embeds": embeds, "attention_mask": ids["attention_mask"], "position_ids": ids["position_ids"]}


@torch.inference_mode()
def lower_states(model, sequences: list[list[int]], split: int, pad_id: int, batch_size: int = 8,
                 progress: bool = False) -> list[torch.Tensor]:
    """The residual stream after ``layers[:split]`` for each token sequence, unpadded, on the CPU (float32).

    Sequences are run length-sorted so batches pad little; results come back in input order."""
    device = next(model.parameters()).device
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out: list[torch.Tensor | None] = [None] * len(sequences)
    starts = range(0, len(order), batch_size)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=f"caching layers 0-{split - 1}", unit="batch")
    was_training = model.training
    model.eval()
    decoder = decoder_of(model)
    with layer_slice(model, 0, split, final_norm=False):
        for s in starts:
            idx = order[s:s + batch_size]
            batch = {k: v.to(device) for k, v in left_pad([sequences[i] for i in idx], pad_id).items()}
            h = decoder(**batch, use_cache=False).last_hidden_state
            for j, i in enumerate(idx):
                n = len(sequences[i])
                out[i] = h[j, h.shape[1] - n:].float().cpu().clone()
    model.train(was_training)
    return out  # type: ignore[return-value]


def top_logits(model, states: list[torch.Tensor] | dict, split: int, logits_to_keep: int = 1):
    """Last-position logits of the top layers ``layers[split:]`` run on cached lower states."""
    batch = states if isinstance(states, dict) else pad_states(states)
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in batch.items()}
    with layer_slice(model, split):
        out = model(**batch, logits_to_keep=logits_to_keep, use_cache=False)
    return out.logits[:, -1, :]


@torch.inference_mode()
def check_split(model, sequence: list[int], split: int, pad_id: int, rel: float = 1e-3) -> float:
    """Max deviation of the split forward's last logits from the full forward's, relative to their scale;
    raises when the decoder cannot be split (it transforms ``inputs_embeds`` or needs more than the layers)."""
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in left_pad([sequence], pad_id).items()}
    was_training = model.training
    model.eval()
    full = model(**batch, logits_to_keep=1, use_cache=False).logits[:, -1, :].float()
    part = top_logits(model, lower_states(model, [sequence], split, pad_id), split).float()
    model.train(was_training)
    err = ((full - part).abs().max() / full.abs().max().clamp(min=1e-6)).item()
    if not err <= rel:
        raise ValueError(f"train_top_layers: running layers {split}+ on cached states does not reproduce the full "
                         f"forward for this model (relative deviation {err:.3g}); train without train_top_layers")
    return err


def freeze_all_but_top(model, split: int) -> int:
    """Full fine-tuning of the top layers: every parameter frozen except ``layers[split:]`` and the final norm
    (embeddings stay frozen: with tied weights the LM head is the input embedding, which the cache depends on).
    Returns the number of trainable parameters."""
    decoder = decoder_of(model)
    for p in model.parameters():
        p.requires_grad_(False)
    trainable = list(decoder.layers[split:].parameters())
    if getattr(decoder, "norm", None) is not None:
        trainable += list(decoder.norm.parameters())
    for p in trainable:
        p.requires_grad_(True)
    return sum(p.numel() for p in trainable)
