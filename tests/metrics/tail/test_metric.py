"""TailExtrapolatedMAP: streaming equals the one-shot prediction; DDP sync; memory bound."""

from __future__ import annotations

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rl_gap.metrics.tail import predict_map
from rl_gap.metrics.tail.metric import TailExtrapolatedMAP


def make_data(seed: int = 0, Q: int = 12, P: int = 30, S: int = 9000, d: int = 16):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(Q, d, generator=g), dim=1)
    owner = torch.randint(0, Q - 1, (P,), generator=g)  # last query has no positive
    p = torch.nn.functional.normalize(q[owner] + 0.4 * torch.randn(P, d, generator=g), dim=1)
    x = torch.nn.functional.normalize(torch.randn(S, d, generator=g), dim=1)
    return q, p, owner, x


def padded_positive_scores(q, p, owner):
    """Plain loop: (Q, m) NaN-padded positive scores."""
    rows = [
        [float(q[i] @ p[j]) for j in range(len(owner)) if int(owner[j]) == i] for i in range(len(q))
    ]
    m = max(len(r) for r in rows)
    return torch.tensor([r + [math.nan] * (m - len(r)) for r in rows], dtype=torch.float64)


@pytest.mark.parametrize("estimator", ["sample", "count", "evt", "tail"])
def test_streaming_equals_one_shot(estimator):
    q, p, owner, x = make_data()
    N = 200_000
    metric = TailExtrapolatedMAP(gallery_size=N, k=50, estimator=estimator, n_boot=200)
    metric.update(queries=q[:5], positives=p[owner < 5], positive_query=owner[owner < 5])
    metric.update(queries=q[5:], positives=p[owner >= 5], positive_query=owner[owner >= 5] - 5)
    for start in range(0, x.shape[0], 1000):
        metric.update(
            distractors=x[start : start + 1000], distractor_ids=torch.arange(start, start + 1000)
        )
    out = metric.compute()
    pos = padded_positive_scores(q, p, owner)
    ref = predict_map(pos.float(), (q @ x.T), gallery_size=N, k=50, estimator=estimator, n_boot=200)
    assert float(out["map"]) == pytest.approx(ref.map, abs=1e-6)
    assert float(out["ci_low"]) <= float(out["map"]) <= float(out["ci_high"])
    est = metric.estimate()
    assert est.n_excluded == 1
    torch.testing.assert_close(est.per_query, ref.per_query, equal_nan=True, atol=1e-6, rtol=0)
    # State is O(Q·(P·T + m)) whatever the sample size.
    assert metric.top.shape == (4, 12, 4000) and int(metric.seen.sum()) == x.shape[0]


def test_scores_interface_and_errors():
    q, p, owner, x = make_data(1, S=5000)
    pos = padded_positive_scores(q, p, owner)
    metric = TailExtrapolatedMAP(gallery_size=50_000, k=20, estimator="count")
    metric.update(positive_scores=pos)
    metric.update(distractor_scores=(q @ x.T).double())
    ref = predict_map(
        pos, (q @ x.T).double(), gallery_size=50_000, k=20, estimator="count", n_boot=1000
    )
    assert float(metric.compute()["map"]) == pytest.approx(ref.map, abs=1e-6)
    with pytest.raises(ValueError, match="before streaming"):
        metric.update(positive_scores=pos)
    with pytest.raises(ValueError, match="NaN"):
        metric.update(distractor_scores=torch.full((12, 3), math.nan))
    with pytest.raises(ValueError, match="distractor_scores must be"):
        metric.update(distractor_scores=torch.zeros(3, 3))
    with pytest.raises(ValueError, match="estimator"):
        TailExtrapolatedMAP(gallery_size=10, estimator="nope")
    with pytest.raises(ValueError, match="k must be"):
        TailExtrapolatedMAP(gallery_size=10, k=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out_path: str, keyed: bool = False) -> None:
    torch.set_num_threads(1)  # two workers on a shared 2-core machine
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        q, p, owner, x = make_data(S=5000)
        metric = TailExtrapolatedMAP(
            gallery_size=200_000, k=50, estimator="evt", n_boot=200, keyed=keyed
        )
        metric.update(queries=q, positives=p, positive_query=owner)  # replicated
        ids = torch.arange(x.shape[0])
        shard = ids % world == rank  # distractors sharded across ranks
        metric.update(distractors=x[shard], distractor_ids=ids[shard])
        out = metric.compute()
        if keyed:  # the synced state merges every rank's scores with their keys
            est = metric.estimate(nested_boot=5)
            out["sample_noise_sd"] = torch.tensor(est.sample_noise_sd)
        if rank == 0:
            torch.save({k: v for k, v in out.items()}, out_path)
        dist.barrier()  # tear down together (a lone teardown can abort gloo)
    finally:
        dist.destroy_process_group()


def test_rank_reductions_merge_sharded_states_exactly():
    """Fast check of the DDP reductions: stacked per-rank states merge to the single-process state."""
    q, p, owner, x = make_data(S=5000)
    ids = torch.arange(x.shape[0])
    ranks = []
    for r in range(2):
        m = TailExtrapolatedMAP(gallery_size=200_000, k=50, estimator="evt", n_boot=200)
        m.update(queries=q, positives=p, positive_query=owner)
        m.update(distractors=x[ids % 2 == r], distractor_ids=ids[ids % 2 == r])
        ranks.append(m)
    merged = TailExtrapolatedMAP(gallery_size=200_000, k=50, estimator="evt", n_boot=200)
    for attr, fx in merged._reductions.items():
        setattr(merged, attr, fx(torch.stack([getattr(m, attr) for m in ranks])))
    merged._update_count = 1  # states were set by hand, as a sync would
    single = TailExtrapolatedMAP(gallery_size=200_000, k=50, estimator="evt", n_boot=200)
    single.update(queries=q, positives=p, positive_query=owner)
    single.update(distractors=x, distractor_ids=ids)
    assert torch.equal(merged.seen, single.seen)
    assert torch.equal(torch.sort(merged.top, -1).values, torch.sort(single.top, -1).values)
    assert float(merged.compute()["map"]) == pytest.approx(
        float(single.compute()["map"]), abs=1e-12
    )


@pytest.mark.ddp
@pytest.mark.slow  # process start-up dominates (minutes on a loaded 2-core machine)
@pytest.mark.parametrize("keyed", [False, True])
def test_ddp_two_ranks_equal_one_process(tmp_path, keyed):
    out_path = str(tmp_path / "out.pt")
    mp.spawn(_worker, args=(2, _free_port(), out_path, keyed), nprocs=2, join=True)
    got = torch.load(out_path)
    q, p, owner, x = make_data(S=5000)
    single = TailExtrapolatedMAP(
        gallery_size=200_000, k=50, estimator="evt", n_boot=200, keyed=keyed
    )
    single.update(queries=q, positives=p, positive_query=owner)
    single.update(distractors=x, distractor_ids=torch.arange(x.shape[0]))
    ref = single.compute()
    for key in ("map", "ci_low", "ci_high"):
        assert float(got[key]) == pytest.approx(float(ref[key]), abs=1e-9)
    if keyed:
        sd = single.estimate(nested_boot=5).sample_noise_sd
        assert float(got["sample_noise_sd"]) == pytest.approx(sd, rel=1e-6)


def test_distractor_scores_are_float32_under_bf16_autocast():
    """Streamed distractor embeddings are scored in float32 even inside a bf16 autocast
    region (a bf16 GEMM ties and shifts the scores the hardness counts rank)."""
    q, p, owner, x = make_data(seed=3)
    reference = (q.double() @ x.double().T).sort(1, descending=True).values[:, :4000]
    outs = []
    for autocast in (False, True):
        metric = TailExtrapolatedMAP(gallery_size=100_000, k=50, estimator="count", n_boot=50)
        metric.update(queries=q, positives=p, positive_query=owner)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            metric.update(distractors=x, distractor_ids=torch.arange(x.shape[0]))
        top, seen = metric._state().level(-1)  # the whole sample: (Q, 4000) sorted scores
        assert seen == x.shape[0]
        torch.testing.assert_close(top, reference, rtol=0, atol=1e-6)
        outs.append(float(metric.compute()["map"]))
    assert outs[0] == outs[1]


def test_keyed_metric_merges_ranks_with_their_keys_and_resamples_distractors_jointly():
    q, p, owner, x = make_data(S=5000)
    ids = torch.arange(x.shape[0]) + 7
    ranks = []
    for r in range(2):
        m = TailExtrapolatedMAP(gallery_size=200_000, k=50, estimator="count", keyed=True)
        m.update(queries=q, positives=p, positive_query=owner)
        m.update(distractors=x[ids % 2 == r], distractor_ids=ids[ids % 2 == r])
        ranks.append(m)
    merged = TailExtrapolatedMAP(gallery_size=200_000, k=50, estimator="count", keyed=True)
    for attr, fx in merged._reductions.items():
        setattr(merged, attr, fx(torch.stack([getattr(m, attr) for m in ranks])))
    merged._update_count = 1
    top, keys, _ = merged._state().level_with_keys(-1)
    # Every kept score is the score of the distractor its key names.
    scores = q.double() @ x.double().T
    finite_keys = torch.where(torch.isfinite(top), keys - 7, torch.zeros_like(keys))
    torch.testing.assert_close(
        top[torch.isfinite(top)],
        torch.gather(scores, 1, finite_keys)[torch.isfinite(top)],
        rtol=0,
        atol=1e-5,
    )
    single = TailExtrapolatedMAP(gallery_size=200_000, k=50, estimator="count", keyed=True)
    single.update(queries=q, positives=p, positive_query=owner)
    single.update(distractors=x, distractor_ids=ids)
    # The same kept distractors per query (tied float32 scores may sit in either order).
    other = single._state().level_with_keys(-1)[1]
    assert torch.equal(torch.sort(keys, 1).values, torch.sort(other, 1).values)
    a = merged.predictor().estimate("count", 200_000, n_boot=20, nested_boot=5)
    b = single.predictor().estimate("count", 200_000, n_boot=20, nested_boot=5)
    assert a.nested_ci == b.nested_ci and a.sample_noise_sd == b.sample_noise_sd
    # Without ids the keyed metric draws its own keys, one per distractor.
    anon = TailExtrapolatedMAP(gallery_size=200_000, k=50, estimator="count", keyed=True)
    anon.update(queries=q, positives=p, positive_query=owner)
    anon.update(distractors=x)
    kept = anon._state().level_with_keys(-1)[1]
    assert int((kept >= 0).all()) and kept.unique().numel() <= x.shape[0]
