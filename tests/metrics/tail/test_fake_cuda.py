"""TailExtrapolatedMAP on (fake) CUDA: inputs and/or metric on the device equal the CPU run."""

from __future__ import annotations

import pytest
import torch

from rl_gap.metrics.tail.metric import TailExtrapolatedMAP


def make_data(seed: int = 0, Q: int = 10, P: int = 25, S: int = 6000, d: int = 16):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(Q, d, generator=g), dim=1)
    owner = torch.randint(0, Q - 1, (P,), generator=g)  # last query has no positive
    p = torch.nn.functional.normalize(q[owner] + 0.4 * torch.randn(P, d, generator=g), dim=1)
    x = torch.nn.functional.normalize(torch.randn(S, d, generator=g), dim=1)
    return q, p, owner, x


def run(metric_device, input_device, with_ids, keyed=False, estimator="evt", scores=False):
    q, p, owner, x = make_data()
    metric = TailExtrapolatedMAP(
        gallery_size=100_000, k=30, estimator=estimator, n_boot=100, keyed=keyed
    ).to(metric_device)
    to = lambda t: t.to(input_device)  # noqa: E731
    if scores:
        pos = torch.full((q.shape[0], 8), float("nan"), dtype=torch.float64)
        for i in range(q.shape[0]):
            mine = (q[i] @ p[owner == i].T).double()
            pos[i, : mine.numel()] = mine
        metric.update(positive_scores=to(pos))
    else:
        metric.update(
            queries=to(q[:4]), positives=to(p[owner < 4]), positive_query=to(owner[owner < 4])
        )
        metric.update(
            queries=to(q[4:]), positives=to(p[owner >= 4]), positive_query=to(owner[owner >= 4] - 4)
        )
    for start in range(0, x.shape[0], 1500):
        block = x[start : start + 1500]
        ids = torch.arange(start, start + block.shape[0]) if with_ids else None
        if scores:
            metric.update(
                distractor_scores=to(q @ block.T), distractor_ids=None if ids is None else to(ids)
            )
        else:
            metric.update(distractors=to(block), distractor_ids=None if ids is None else to(ids))
    for name in ("top", "seen", "pos_scores"):
        assert getattr(metric, name).device.type == torch.device(metric_device).type, name
    out = metric.compute()
    return {k: float(v) for k, v in out.items()}, metric


CASES = [
    ("cuda", "cuda", True),
    ("cuda", "cuda", False),
    ("cuda", "cpu", True),  # CPU inputs, metric on the device: state stays on the device
    ("cpu", "cuda", False),  # device inputs, metric on the CPU
]


@pytest.mark.parametrize(("metric_device", "input_device", "with_ids"), CASES)
def test_tail_metric_on_cuda_equals_cpu(fake_cuda, metric_device, input_device, with_ids):
    ref, _ = run("cpu", "cpu", with_ids)
    out, metric = run(metric_device, input_device, with_ids)
    assert out == pytest.approx(ref, abs=1e-9)
    assert 0.0 < ref["map"] < 1.0


@pytest.mark.parametrize("estimator", ["tail", "count"])
def test_tail_metric_keyed_and_scores_on_cuda(fake_cuda, estimator):
    ref, _ = run("cpu", "cpu", True, keyed=True, estimator=estimator)
    out, metric = run("cuda", "cuda", True, keyed=True, estimator=estimator)
    assert out == pytest.approx(ref, abs=1e-9)
    est = metric.estimate(nested_boot=20)
    assert est.per_query.device.type in ("cpu", "cuda")
    ref_s, _ = run("cpu", "cpu", False, estimator=estimator, scores=True)
    out_s, _ = run("cuda", "cuda", False, estimator=estimator, scores=True)
    assert out_s == pytest.approx(ref_s, abs=1e-9)


def test_predict_map_on_cuda_scores(fake_cuda):
    from rl_gap.metrics.tail import predict_map
    from rl_gap.metrics.tail.intervals import bootstrap_ci

    q, p, owner, x = make_data()
    pos = torch.full((q.shape[0], 8), float("nan"))
    for i in range(q.shape[0]):
        mine = q[i] @ p[owner == i].T
        pos[i, : mine.numel()] = mine
    kwargs = {"gallery_size": 50_000, "k": 20, "estimator": "evt", "n_boot": 50}
    ref = predict_map(pos, q @ x.T, **kwargs)
    out = predict_map(pos.to("cuda"), (q @ x.T).to("cuda"), **kwargs)
    assert out.map == pytest.approx(ref.map, abs=1e-9) and out.ci == pytest.approx(ref.ci)
    per_query = torch.tensor([0.1, 0.5, float("nan"), 0.9], device="cuda")
    lo, hi = bootstrap_ci(per_query, 200, generator=torch.Generator().manual_seed(0))
    assert 0.1 <= lo <= hi <= 0.9


def test_stream_scores_from_host_blocks_into_a_device_state(fake_cuda):
    from rl_gap.metrics.tail.sampling import NestedTopK, stream_scores

    q, _, _, x = make_data()
    states = {}
    for device in ("cpu", "cuda"):
        state = NestedTopK(q.shape[0], 50, keyed=True, device=device)
        stream_scores(q.to(device), x.numpy(), state, block_size=1000)  # an array, read blockwise
        assert state.top.device.type == device
        states[device] = state
    for index in range(len(states["cpu"].fractions)):
        top, keys, size = states["cuda"].level_with_keys(index)
        ref_top, ref_keys, ref_size = states["cpu"].level_with_keys(index)
        assert size == ref_size
        assert torch.equal(top.cpu(), ref_top) and torch.equal(keys.cpu(), ref_keys)
