"""Multi-positive InfoNCE for the evidence retriever (Router-Mem, DESIGN §5), sentence-transformers style.

For a query q with positive set P(q) and candidate set C (every text embedded in the batch: all
queries' positives and mined hard negatives, plus, when gathering, every other process's
candidates), with L2-normalized embeddings e(.) and s(q, c) = e(q)·e(c) / T:

    L(q) = -(1/|P(q)|) * sum_{p in P(q)} log( exp(s(q,p)) / ( exp(s(q,p)) + sum_{n in N(q)} exp(s(q,n)) ) )

    N(q) = C  minus  P(q)  minus  F(q)

and the batch loss is the mean of L(q) over the queries that have at least one positive.

Exactly what is masked:

* **Other positives of the same query are not negatives.** The denominator of the term for p holds
  p itself and the negatives N(q), never another positive p' of q (with several evidence steps a
  question would otherwise push its own evidence apart). With ``other_positives_in_denominator=True``
  the denominator is the plain softmax over all of C (the textbook multi-positive form
  ``-1/|P| sum_p log softmax(s(q, .))_p``); the default is False.
* **False negatives F(q)** (``false_negative_mask``, or label code -1) are removed from every
  denominator of q: e.g. a candidate whose text equals one of q's positives but sits in another
  query's slot. The collator (:class:`train.retriever.MultiPositiveCollator`) deduplicates texts, so a
  text that is a positive of q is a single column marked positive for q, whichever query brought it.
* Candidates gathered from other processes are negatives for q unless their key (a hash of the
  text) equals the key of one of q's positives, in which case they are in F(q).

Two entry points:

* :func:`multi_positive_infonce` -- the pure function on embeddings and masks;
* :class:`MultiPositiveInfoNCELoss` -- an ``nn.Module`` that takes the ``SentenceTransformer`` in
  ``__init__`` (like ``MultipleNegativesRankingLoss``) and is called by ``SentenceTransformerTrainer`` as
  ``loss(sentence_features, labels)`` with ``sentence_features = [queries, candidates, ...]`` and ``labels``
  the packed relation matrix built by the collator (see :func:`pack_labels`). ``mini_batch_size`` turns
  on GradCache-style caching through sentence-transformers' ``CachedLossMixin`` (embed without grad
  in mini-batches -> loss and gradients w.r.t. the embeddings -> re-embed each mini-batch with grad,
  replaying its RNG state, and backpropagate the cached gradients); the gradients are the same as
  without caching. ``gather_across_devices`` all-gathers candidates across processes
  (``torch.distributed``; padded to the largest local candidate count).
"""

from __future__ import annotations

import warnings
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

try:  # sentence-transformers >= 5.x keeps the GradCache machinery here
    from sentence_transformers.base.losses.gradcache import CachedLossMixin
except ImportError:  # pragma: no cover - older layouts: a cached loss is then unavailable
    CachedLossMixin = object

POSITIVE, NEGATIVE, IGNORE = 1, 0, -1


def multi_positive_infonce(q_emb: Tensor, cand_emb: Tensor, pos_mask: Tensor, temperature: float = 0.05,
                           false_negative_mask: Tensor | None = None, normalize: bool = True,
                           other_positives_in_denominator: bool = False, reduction: str = "mean") -> Tensor:
    """Multi-positive InfoNCE with an explicit positive mask (see the module docstring for the masking).

    Args:
        q_emb: (B, d) query embeddings.
        cand_emb: (C, d) candidate embeddings.
        pos_mask: (B, C) bool, True where candidate c is a positive of query b.
        temperature: T; logits are cosine / T (T = 0.05 <=> sentence-transformers ``scale=20``).
        false_negative_mask: (B, C) bool, True where c must not be a negative of b (ignored where
            ``pos_mask`` is True: a positive stays a positive).
        normalize: L2-normalize both sides first (set False if they already are).
        other_positives_in_denominator: plain softmax over all candidates instead of per-positive
            denominators.
        reduction: "mean" over queries with >= 1 positive, "sum", or "none" (per-query, NaN where no
            positive).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    pos_mask = pos_mask.bool()
    if pos_mask.shape != (q_emb.shape[0], cand_emb.shape[0]):
        raise ValueError(f"pos_mask must be {(q_emb.shape[0], cand_emb.shape[0])}, got {tuple(pos_mask.shape)}")
    if normalize:
        q_emb, cand_emb = F.normalize(q_emb, dim=-1), F.normalize(cand_emb, dim=-1)
    sim = q_emb @ cand_emb.T
    logits = (sim.float() if sim.dtype in (torch.float16, torch.bfloat16) else sim) / temperature  # fp32+ softmax
    excluded = false_negative_mask.bool() & ~pos_mask if false_negative_mask is not None else torch.zeros_like(pos_mask)
    if other_positives_in_denominator:
        log_z = torch.logsumexp(logits.masked_fill(excluded, float("-inf")), dim=1, keepdim=True)
        log_prob = logits - log_z
    else:
        neg_mask = ~pos_mask & ~excluded
        lse_neg = torch.logsumexp(logits.masked_fill(~neg_mask, float("-inf")), dim=1, keepdim=True)
        # denominator of the term for p: exp(s(q,p)) + sum_n exp(s(q,n)); logaddexp handles "no negatives"
        log_prob = logits - torch.logaddexp(logits, lse_neg)
    n_pos = pos_mask.sum(dim=1)
    per_query = -torch.where(pos_mask, log_prob, torch.zeros_like(log_prob)).sum(dim=1) / n_pos.clamp(min=1)
    has_pos = n_pos > 0
    if reduction == "none":
        return per_query.masked_fill(~has_pos, float("nan"))
    if reduction == "sum":
        return per_query[has_pos].sum()
    if reduction != "mean":
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not has_pos.any():
        return logits.sum() * 0.0  # keeps the graph (and DDP) intact on a batch without positives
    return per_query[has_pos].mean()


# -- label packing ---------------------------------------------------------------------------------
def pack_labels(relation: Tensor, candidate_keys: Tensor) -> Tensor:
    """One int64 tensor the trainer can carry as ``label``: rows [:B] the (B, C) relation codes
    (1 positive, 0 negative, -1 excluded), row B the candidates' int64 keys (hash of the text)."""
    if relation.shape[1] != candidate_keys.shape[0]:
        raise ValueError("relation and candidate_keys disagree on the number of candidates")
    return torch.cat([relation.long(), candidate_keys.long().view(1, -1)], dim=0)


def unpack_labels(labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(pos_mask, false_negative_mask, candidate_keys) from :func:`pack_labels`'s tensor."""
    relation, keys = labels[:-1], labels[-1]
    return relation == POSITIVE, relation == IGNORE, keys


# -- distributed gather ----------------------------------------------------------------------------
def _dist_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def gather_candidates(emb: Tensor, keys: Tensor, with_grad: bool = True) -> tuple[Tensor, Tensor, int]:
    """All-gather candidate embeddings and keys across processes (variable counts, padded).

    Returns (embeddings of all ranks, keys of all ranks, offset of this rank's block). The local
    block is the original tensor (its gradient path is preserved); with ``with_grad`` the other
    ranks' blocks also carry gradients back to their owners (``torch.distributed.nn.all_gather``),
    which is what makes the loss exact under DDP gradient averaging. Not initialized -> identity.
    """
    if not _dist_ready():
        return emb, keys, 0
    dist = torch.distributed
    world, rank = dist.get_world_size(), dist.get_rank()
    size = torch.tensor([emb.shape[0]], device=emb.device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    sizes = [int(s.item()) for s in sizes]
    width = max(sizes)
    pad = width - emb.shape[0]
    emb_p = F.pad(emb, (0, 0, 0, pad))
    keys_p = F.pad(keys, (0, pad))
    if with_grad:
        from torch.distributed.nn.functional import all_gather as all_gather_grad

        with warnings.catch_warnings():  # deprecated in favour of a private API; still the autograd-aware gather
            warnings.simplefilter("ignore", FutureWarning)
            parts = list(all_gather_grad(emb_p))
    else:
        parts = [torch.zeros_like(emb_p) for _ in range(world)]
        dist.all_gather(parts, emb_p.detach().contiguous())
    parts[rank] = emb_p  # the local slot keeps the local autograd graph
    key_parts = [torch.zeros_like(keys_p) for _ in range(world)]
    dist.all_gather(key_parts, keys_p.contiguous())
    all_emb = torch.cat([p[:n] for p, n in zip(parts, sizes)], dim=0)
    all_keys = torch.cat([k[:n] for k, n in zip(key_parts, sizes)], dim=0)
    return all_emb, all_keys, sum(sizes[:rank])


def extend_masks_for_gather(pos_mask: Tensor, fn_mask: Tensor, keys: Tensor, all_keys: Tensor,
                            offset: int) -> tuple[Tensor, Tensor]:
    """Masks over the gathered candidates: the local block keeps its codes; a remote candidate is a
    false negative of q when its key equals one of q's positive keys, else a negative."""
    b, c_local = pos_mask.shape
    c_all = all_keys.shape[0]
    pos_keys = [set(keys[row].tolist()) for row in pos_mask]
    remote_fn = torch.tensor([[int(k) in pk for k in all_keys.tolist()] for pk in pos_keys],
                             dtype=torch.bool, device=pos_mask.device).view(b, c_all)
    pos_all = torch.zeros(b, c_all, dtype=torch.bool, device=pos_mask.device)
    fn_all = remote_fn.clone()
    pos_all[:, offset:offset + c_local] = pos_mask
    fn_all[:, offset:offset + c_local] = fn_mask
    return pos_all, fn_all


class MultiPositiveInfoNCELoss(CachedLossMixin, nn.Module):
    """Multi-positive InfoNCE over [queries, candidates] columns (see the module docstring).

    Args:
        model: the ``SentenceTransformer`` being trained.
        temperature: T (default 0.05).
        mini_batch_size: ``None`` = plain forward/backward; an int = GradCache-style caching with
            mini-batches of this many texts (same gradients, bounded activation memory).
        gather_across_devices: all-gather candidates across processes (DDP), so every query sees
            every process's candidates as negatives (false negatives masked by text key).
        gather_with_grad: let gradients flow back to the other processes' candidates (exact DDP
            gradients); False keeps only the local block's gradients (cheaper).
        other_positives_in_denominator: see :func:`multi_positive_infonce`.

    Inputs (from :class:`train.retriever.MultiPositiveCollator`): ``sentence_features`` =
    ``[query features (B rows), candidate features (C rows), ...]`` -- the candidate columns after the
    first are concatenated in order (the collator tokenizes length-sorted chunks separately);
    ``labels`` = ``pack_labels(...)``, shape (B + 1, C).

    Example::

        from sentence_transformers import SentenceTransformer
        model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
        loss = MultiPositiveInfoNCELoss(model, temperature=0.05, mini_batch_size=64)
    """

    def __init__(self, model, temperature: float = 0.05, mini_batch_size: int | None = None,
                 gather_across_devices: bool = False, gather_with_grad: bool = True,
                 other_positives_in_denominator: bool = False, show_progress_bar: bool = False):
        nn.Module.__init__(self)
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if mini_batch_size is not None and mini_batch_size < 1:
            raise ValueError("mini_batch_size must be >= 1 or None")
        if mini_batch_size is not None and CachedLossMixin is object:
            raise ImportError("GradCache caching needs sentence-transformers with base.losses.gradcache")
        self.model = model
        self.temperature = float(temperature)
        self.mini_batch_size = mini_batch_size
        self.mini_batch_num_tokens = None
        self.show_progress_bar = show_progress_bar
        self.gather_across_devices = gather_across_devices
        self.gather_with_grad = gather_with_grad
        self.other_positives_in_denominator = other_positives_in_denominator

    @property
    def uses_gradient_cache(self) -> bool:  # read by sentence-transformers wrappers (Matryoshka, ...)
        return self.mini_batch_size is not None

    @property
    def scale(self) -> float:
        return 1.0 / self.temperature

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor) -> Tensor:
        sentence_features = list(sentence_features)
        if len(sentence_features) < 2:
            raise ValueError(f"expected [queries, candidates, ...] features, got {len(sentence_features)} column(s)")
        if labels is None:
            raise ValueError("labels (the packed relation matrix) are required")
        if self.mini_batch_size is not None:
            return self.forward_cached(sentence_features, labels)
        q = self.model(sentence_features[0])["sentence_embedding"]
        c = torch.cat([self.model(f)["sentence_embedding"] for f in sentence_features[1:]])
        return self.loss_from_embeddings(q, c, labels)

    def loss_from_embeddings(self, q: Tensor, c: Tensor, labels: Tensor) -> Tensor:
        pos_mask, fn_mask, keys = unpack_labels(labels.to(q.device))
        if self.gather_across_devices and _dist_ready():
            c, all_keys, offset = gather_candidates(c, keys, with_grad=self.gather_with_grad)
            pos_mask, fn_mask = extend_masks_for_gather(pos_mask, fn_mask, keys, all_keys, offset)
        return multi_positive_infonce(q, c, pos_mask, self.temperature, fn_mask,
                                      other_positives_in_denominator=self.other_positives_in_denominator)

    # CachedLossMixin hook: reps = [[query mini-batch embeddings], [candidate mini-batch embeddings], ...]
    def calculate_loss(self, reps: list[list[Tensor]], labels: Tensor | None = None, *,
                       with_backward: bool = False) -> Tensor:
        q, c = torch.cat(reps[0]), torch.cat([r for column in reps[1:] for r in column])
        loss = self.loss_from_embeddings(q, c, labels)
        if with_backward:
            loss.backward()
            loss = loss.detach()
        return loss

    def get_config_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "mini_batch_size": self.mini_batch_size,
                "gather_across_devices": self.gather_across_devices, "gather_with_grad": self.gather_with_grad,
                "other_positives_in_denominator": self.other_positives_in_denominator}

    @property
    def citation(self) -> str:
        return ("@inproceedings{khosla2020supcon, title={Supervised Contrastive Learning}, author={Khosla, "
                "Prannay and others}, booktitle={NeurIPS}, year={2020}}")
