"""Multi-positive InfoNCE (train/retriever_losses.py): hand-computed values, masking, GradCache
equivalence, label packing, and the cross-process gather (DESIGN §5)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from retriever_helpers import build_tiny_encoder, gather_worker, toy_records
from train.retriever import MultiPositiveCollator, features_from_batch, text_key
from train.retriever_losses import (IGNORE, NEGATIVE, POSITIVE, MultiPositiveInfoNCELoss, extend_masks_for_gather,
                                    multi_positive_infonce, pack_labels, unpack_labels)
from numerics import assert_close_to_scale


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def hand_loss(q, c, pos, excluded, T, other_pos_in_denominator=False):
    """Scalar-by-scalar reference: per query, average over its positives of -log(e^{s_p} / (e^{s_p} + sum_neg e^{s_n}))."""
    def cos(a, b):
        return sum(x * y for x, y in zip(a, b)) / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))

    per_query = []
    for i, qi in enumerate(q):
        s = [cos(qi, cj) / T for cj in c]
        positives = [j for j in range(len(c)) if pos[i][j]]
        if not positives:
            continue
        terms = []
        for p in positives:
            if other_pos_in_denominator:
                denom = sum(math.exp(s[j]) for j in range(len(c)) if pos[i][j] or not excluded[i][j])
            else:
                denom = math.exp(s[p]) + sum(math.exp(s[j]) for j in range(len(c)) if not pos[i][j] and not excluded[i][j])
            terms.append(-math.log(math.exp(s[p]) / denom))
        per_query.append(sum(terms) / len(terms))
    return sum(per_query) / len(per_query)


Q = [[1.0, 0.0], [0.0, 2.0]]  # the second query is not unit-length: the loss normalizes
C = [[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [-1.0, 0.0], [0.8, 0.6]]
POS = [[1, 1, 0, 0, 0], [0, 0, 1, 0, 0]]
NONE = [[0] * 5, [0] * 5]


def _t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


def test_single_pair_closed_form():
    # q = c0, c1 orthogonal, T = 1: L = -log(e / (e + 1)) = log(1 + 1/e)
    loss = multi_positive_infonce(_t([[1.0, 0.0]]), _t([[1.0, 0.0], [0.0, 1.0]]), _t([[1, 0]]).bool(), temperature=1.0)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-7)
    assert loss.item() == pytest.approx(0.31326168751822286, abs=1e-7)


@pytest.mark.parametrize("T", [0.05, 0.5, 1.0])
def test_loss_equals_hand_computed_value(T):
    loss = multi_positive_infonce(_t(Q, torch.float64), _t(C, torch.float64), _t(POS).bool(), temperature=T)
    assert loss.item() == pytest.approx(hand_loss(Q, C, POS, NONE, T), rel=1e-9)
    plain = multi_positive_infonce(_t(Q, torch.float64), _t(C, torch.float64), _t(POS).bool(), temperature=T,
                                   other_positives_in_denominator=True)
    assert plain.item() == pytest.approx(hand_loss(Q, C, POS, NONE, T, True), rel=1e-9)
    # with other positives in the denominator it is the textbook -1/|P| sum log softmax
    logits = F.normalize(_t(Q, torch.float64), dim=-1) @ F.normalize(_t(C, torch.float64), dim=-1).T / T
    lsm = torch.log_softmax(logits, dim=1)
    ref = (-(lsm[0, 0] + lsm[0, 1]) / 2 - lsm[1, 2]) / 2
    assert plain.item() == pytest.approx(ref.item(), rel=1e-9)


def test_other_positives_are_not_negatives():
    """Query 0 has two positives: each term's denominator holds itself and the negatives only."""
    T = 0.5
    loss = multi_positive_infonce(_t(Q[:1], torch.float64), _t(C, torch.float64), _t(POS[:1]).bool(), temperature=T)
    s = [sum(a * b for a, b in zip(Q[0], c)) / math.hypot(*c) / T for c in C]
    negs = math.exp(s[2]) + math.exp(s[3]) + math.exp(s[4])
    expected = -(math.log(math.exp(s[0]) / (math.exp(s[0]) + negs)) + math.log(math.exp(s[1]) / (math.exp(s[1]) + negs))) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_false_negative_mask_is_exact():
    """Masking candidate j for query i == deleting j from i's candidates; j gets no gradient from i."""
    T = 0.1
    q = _t(Q, torch.float64)
    c = _t(C, torch.float64).requires_grad_(True)
    fn = torch.zeros(2, 5, dtype=torch.bool)
    fn[0, 4] = True  # c4 is (say) the same text as one of query 0's positives
    masked = multi_positive_infonce(q[:1], c, _t(POS[:1]).bool(), T, false_negative_mask=fn[:1])
    deleted = multi_positive_infonce(q[:1], c[:4], _t([POS[0][:4]]).bool(), T)
    assert masked.item() == pytest.approx(deleted.item(), rel=1e-12)
    masked.backward()
    assert torch.equal(c.grad[4], torch.zeros(2, dtype=torch.float64))
    assert masked.item() == pytest.approx(hand_loss(Q[:1], C, POS[:1], [[0, 0, 0, 0, 1]], T), rel=1e-9)
    # a mask over a positive is ignored: a positive stays a positive
    both = multi_positive_infonce(q, c.detach(), _t(POS).bool(), T, false_negative_mask=_t(POS).bool())
    assert both.item() == pytest.approx(multi_positive_infonce(q, c.detach(), _t(POS).bool(), T).item(), rel=1e-12)


def test_edge_cases():
    q, c = torch.randn(3, 4), torch.randn(5, 4)
    pos = torch.zeros(3, 5, dtype=torch.bool)
    pos[0, 1] = True
    per_q = multi_positive_infonce(q, c, pos, reduction="none")
    assert torch.isfinite(per_q[0]) and torch.isnan(per_q[1:]).all()
    assert multi_positive_infonce(q, c, pos).item() == pytest.approx(per_q[0].item(), rel=1e-6)
    # no negatives at all: log(e^s / e^s) = 0, and the gradient is finite (zero)
    cc = c[:1].clone().requires_grad_(True)
    loss = multi_positive_infonce(q[:1], cc, torch.ones(1, 1, dtype=torch.bool))
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(cc.grad).all()
    # no positive anywhere: zero loss that still backpropagates
    z = multi_positive_infonce(q, c.requires_grad_(True), torch.zeros(3, 5, dtype=torch.bool))
    z.backward()
    assert z.item() == 0.0
    with pytest.raises(ValueError):
        multi_positive_infonce(q, c, torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError):
        multi_positive_infonce(q, c, pos, temperature=0.0)


def test_pack_unpack_labels():
    rel = torch.tensor([[1, 0, -1], [0, 1, 0]])
    keys = torch.tensor([11, 22, 33])
    packed = pack_labels(rel, keys)
    assert packed.shape == (3, 3)
    pos, fn, k = unpack_labels(packed)
    assert pos.tolist() == [[True, False, False], [False, True, False]]
    assert fn.tolist() == [[False, False, True], [False, False, False]]
    assert k.tolist() == [11, 22, 33]


def test_collator_dedups_and_masks_false_negatives():
    recs = [
        {"query": "q0", "positives": ["A", "B", "C"], "negatives": ["X", "Y"], "positive_kinds": ["step", "window", "window"]},
        {"query": "q1", "positives": ["X"], "negatives": ["A", "Z", "B"], "positive_kinds": ["step"]},
        {"query": "q2", "positives": ["A"], "negatives": [], "positive_kinds": ["step"]},
    ]
    coll = MultiPositiveCollator(preprocess_fn=None, positives_per_query=1, negatives_per_query=-1, seed=0)
    queries, texts, labels = coll.build(recs)
    assert queries == ["q0", "q1", "q2"] and len(texts) == len(set(texts))
    pos, fn, keys = unpack_labels(labels)
    col = {t: j for j, t in enumerate(texts)}
    assert keys.tolist() == [text_key(t) for t in texts]
    # q0 samples its one step positive "A"; B/C (if present as candidates) are masked, never negatives
    assert pos[0].nonzero().flatten().tolist() == [col["A"]]
    for t in ("B",):
        assert labels[0, col[t]].item() == IGNORE
    # X is q1's positive and q0's mined negative
    assert labels[1, col["X"]].item() == POSITIVE and labels[0, col["X"]].item() == NEGATIVE
    # A is a positive of q0 and q2 and q1's negative: one column, positive for both, negative for q1
    assert labels[2, col["A"]].item() == POSITIVE and labels[1, col["A"]].item() == NEGATIVE
    assert "Z" in col and labels[2, col["Z"]].item() == NEGATIVE  # in-batch negative for q2
    # every positive is sampled when positives_per_query <= 0
    _, texts_all, labels_all = MultiPositiveCollator(preprocess_fn=None, positives_per_query=0).build(recs[:1])
    assert unpack_labels(labels_all)[0].sum().item() == 3
    # negatives are subsampled without replacement
    _, texts_n, _ = MultiPositiveCollator(preprocess_fn=None, positives_per_query=1, negatives_per_query=1).build(recs[1:2])
    assert len(texts_n) == 2


def test_gather_masks_remote_duplicates():
    pos = torch.tensor([[True, False], [False, True]])
    fn = torch.tensor([[False, False], [False, False]])
    keys = torch.tensor([5, 6])
    all_keys = torch.tensor([9, 5, 5, 6, 7])  # rank 0 had [9, 5]; we are rank 1 at offset 2
    p, f = extend_masks_for_gather(pos, fn, keys, all_keys, offset=2)
    assert p.tolist() == [[False, False, True, False, False], [False, False, False, True, False]]
    assert f.tolist() == [[False, True, False, False, False], [False, False, False, False, False]]


# -- the module on a real (tiny) sentence-transformers model --------------------------------------------
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from sentence_transformers import SentenceTransformer

    path = build_tiny_encoder(tmp_path_factory.mktemp("tiny-st") / "st")
    return SentenceTransformer(path, device="cpu")


def _features(model, n=6, seed=0, chunk=5):
    coll = MultiPositiveCollator(preprocess_fn=model.preprocess, positives_per_query=2, negatives_per_query=2,
                                 candidate_chunk_size=chunk, seed=seed)
    return features_from_batch(coll(toy_records()[:n]))


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_module_matches_pure_function(tiny_model):
    tiny_model.eval()
    features, labels = _features(tiny_model)
    loss = MultiPositiveInfoNCELoss(tiny_model, temperature=0.05)([dict(f) for f in features], labels)
    with torch.no_grad():
        q = tiny_model(dict(features[0]))["sentence_embedding"]
        c = tiny_model(dict(features[1]))["sentence_embedding"]
        c = torch.cat([c] + [tiny_model(dict(f))["sentence_embedding"] for f in features[2:]])
    assert len(features) == 1 + math.ceil(c.shape[0] / 5)  # query column + length-sorted candidate chunks
    pos, fn, _ = unpack_labels(labels)
    assert loss.item() == pytest.approx(multi_positive_infonce(q, c, pos, 0.05, fn).item(), rel=1e-5)
    # one candidate column (no chunking) gives the same loss
    one_col, labels1 = _features(tiny_model, chunk=None)
    assert len(one_col) == 2
    loss1 = MultiPositiveInfoNCELoss(tiny_model, temperature=0.05)([dict(f) for f in one_col], labels1)
    assert loss1.item() == pytest.approx(loss.item(), rel=1e-4)
    with pytest.raises(ValueError):
        MultiPositiveInfoNCELoss(tiny_model)(features[:1], labels)


@pytest.mark.parametrize("mini_batch_size", [1, 3, 64])
def test_cached_and_plain_give_the_same_gradients(tiny_model, mini_batch_size):
    tiny_model.eval()  # dropout off: both paths see the same function
    features, labels = _features(tiny_model, n=8)
    tiny_model.zero_grad(set_to_none=True)
    plain = MultiPositiveInfoNCELoss(tiny_model, temperature=0.05)
    loss_plain = plain([dict(f) for f in features], labels)
    loss_plain.backward()
    g_plain = _grads(tiny_model)
    tiny_model.zero_grad(set_to_none=True)
    cached = MultiPositiveInfoNCELoss(tiny_model, temperature=0.05, mini_batch_size=mini_batch_size)
    assert cached.uses_gradient_cache and not plain.uses_gradient_cache
    loss_cached = cached([dict(f) for f in features], labels)
    loss_cached.backward()
    g_cached = _grads(tiny_model)
    torch.testing.assert_close(loss_cached, loss_plain, rtol=1e-5, atol=1e-6)
    assert g_plain.keys() == g_cached.keys() and len(g_plain) > 10
    # Relative to the whole gradient's scale, not elementwise (CPU-dependent summation order) nor per tensor
    # (the key-bias gradients are exactly zero in exact arithmetic: pure rounding noise in both paths).
    scale = max(g.abs().max().item() for g in g_plain.values())
    for name in g_plain:
        assert_close_to_scale(g_cached[name], g_plain[name], rel=5e-5, msg=name, scale=scale)
    assert any(g.abs().sum() > 0 for g in g_plain.values())
    tiny_model.zero_grad(set_to_none=True)


def test_cached_without_grad_returns_the_loss(tiny_model):
    tiny_model.eval()
    features, labels = _features(tiny_model)
    with torch.no_grad():
        a = MultiPositiveInfoNCELoss(tiny_model, mini_batch_size=2)([dict(f) for f in features], labels)
        b = MultiPositiveInfoNCELoss(tiny_model)([dict(f) for f in features], labels)
    assert a.item() == pytest.approx(b.item(), rel=1e-5)


def test_gather_single_process_group_is_identity(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        q, c = torch.randn(3, 8), torch.randn(7, 8)
        rel = torch.zeros(3, 7, dtype=torch.long)
        rel[0, 0] = rel[1, 2] = rel[2, 5] = POSITIVE
        rel[0, 3] = IGNORE
        labels = pack_labels(rel, torch.arange(7))
        a = MultiPositiveInfoNCELoss(None, gather_across_devices=True).loss_from_embeddings(q, c, labels)
        b = MultiPositiveInfoNCELoss(None).loss_from_embeddings(q, c, labels)
        assert a.item() == pytest.approx(b.item(), rel=1e-6)
    finally:
        dist.destroy_process_group()


def test_gather_across_two_processes_is_exact(tmp_path):
    """Two gloo ranks with different candidate counts and a text shared across ranks: each rank's loss
    and gradients equal the single-process computation over all candidates (remote duplicate masked)."""
    import torch.multiprocessing as mp

    torch.manual_seed(0)
    q = [torch.randn(2, 6), torch.randn(2, 6)]
    c = [torch.randn(3, 6), torch.randn(4, 6)]
    keys = [torch.tensor([10, 11, 12]), torch.tensor([20, 11, 22, 23])]  # key 11 lives on both ranks
    relation = [torch.tensor([[1, 0, 0], [0, 1, 0]]), torch.tensor([[1, 0, 0, 0], [0, 0, 1, 1]])]
    torch.save({"q": q, "c": c, "keys": keys, "relation": relation}, tmp_path / "inputs.pt")
    # fork: the children reuse this process's imports (spawn would re-import torch + transformers)
    mp.start_processes(gather_worker, args=(2, str(tmp_path / "pg"), str(tmp_path)), nprocs=2, join=True,
                       start_method="fork")
    out = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]

    c_all = torch.cat(c).clone().requires_grad_(True)
    all_keys = torch.cat(keys)
    total = 0
    q_grads = []
    for r, offset in ((0, 0), (1, 3)):
        qr = q[r].clone().requires_grad_(True)
        pos_local = relation[r] == 1
        p, f = extend_masks_for_gather(pos_local, torch.zeros_like(pos_local), keys[r], all_keys, offset)
        loss = multi_positive_infonce(qr, c_all, p, 0.1, f)
        assert out[r]["loss"].item() == pytest.approx(loss.item(), rel=1e-5)
        total = total + loss
        q_grads.append(qr)
    # rank 0's query 1 has positive key 11 locally; rank 1's copy of key 11 must be masked for it
    assert f is not None
    total.backward()
    for r, (lo, hi) in ((0, (0, 3)), (1, (3, 7))):
        assert_close_to_scale(out[r]["c_grad"], c_all.grad[lo:hi], rel=1e-5)
        assert_close_to_scale(out[r]["q_grad"], q_grads[r].grad, rel=1e-5)
