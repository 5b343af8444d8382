"""Boundaries of guarded comparisons: each case sits exactly on the line a mutant would move.

- R@P: a threshold whose precision *equals* the level qualifies (``>=``, not ``>``).
- Resume check: a training key present on one side only is a difference.
- Tail count rule: a positive reached by exactly ``min_count`` sampled
  distractors is counted (x = K/S); only fewer fall back to the tail fit.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from rl_gap.metrics.functional import evaluate_embeddings, recall_at_precision
from rl_gap.metrics.tail import predict_map
from rl_gap.run_config import config_mismatch
from rl_gap.training_cli import run_lightning_cli


# ------------------------------------------------------------------ R@P at the level
def _brute_recall_at_precision(scores, rel, level):
    """Largest recall over every threshold t (precision of {s >= t} >= level), float64 loops."""
    pairs = list(zip(scores, rel, strict=True))
    total = sum(r for _, r in pairs)
    best = 0.0
    for t in sorted({s for s, _ in pairs}):
        kept = [r for s, r in pairs if s >= t]
        tp = sum(kept)
        if tp / len(kept) >= level:
            best = max(best, tp / total)
    return best


CASES = [
    # precision exactly 1/2 at the positive's threshold (the case)
    ([0.9, 0.95], [True, False], 0.5),
    # nine positives under one negative: precision exactly 9/10 at the lowest positive
    ([0.95, *[0.1 * i for i in range(1, 10)]], [False, *[True] * 9], 0.9),
    # precision exactly 3/4 with a tie group at the threshold
    ([0.8, 0.5, 0.5, 0.5, 0.2], [True, False, True, True, False], 0.75),
]


@pytest.mark.parametrize("scores, rel, level", CASES)
def test_recall_at_precision_counts_a_threshold_exactly_at_the_level(scores, rel, level):
    expected = _brute_recall_at_precision(scores, rel, level)
    assert expected == 1.0  # every case reaches full recall only at precision == level
    got = recall_at_precision(
        torch.tensor([scores], dtype=torch.float64), torch.tensor([rel]), precision=level
    )
    assert float(got) == expected


@pytest.mark.parametrize("scores, rel, level", CASES)
def test_engine_recall_at_precision_counts_a_threshold_exactly_at_the_level(scores, rel, level):
    # one query q = [1] against 1-d database items: the similarity is the item itself
    queries = torch.ones(1, 1, dtype=torch.float64)
    database = torch.tensor(scores, dtype=torch.float64).unsqueeze(1)
    labels = torch.tensor([1 if r else 2 for r in rel])
    out = evaluate_embeddings(queries, database, torch.tensor([1]), labels, precisions=(level,))
    key = "r@p" + ("50" if level == 0.5 else "90" if level == 0.9 else "75")
    assert out[key] == _brute_recall_at_precision(scores, rel, level) == 1.0


# ------------------------------------------------------------ one-sided resume keys
@pytest.mark.parametrize(
    "saved, current",
    [
        ({"lr": 0.1}, {"lr": 0.1, "model.neg_drop": 0.5}),
        ({"lr": 0.1, "model.neg_drop": 0.5}, {"lr": 0.1}),
        ({}, {"model.neg_drop": None}),  # present with a None value still differs from absent
    ],
)
def test_a_key_on_one_side_only_is_a_mismatch(saved, current):
    diff = config_mismatch(saved, current)
    assert diff is not None
    (key,) = set(saved) ^ set(current)
    assert diff.strip().startswith(f"{key}:")
    assert config_mismatch(current, saved) is not None


RECIPE = "recipes/demo/mnist_gsap.yaml"


def _argv(run_dir, *extra):
    return [
        "--config", RECIPE, "--output_dir", str(run_dir), "--run_name", "one_sided",
        "--wandb", "off", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
        "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
        "--data.init_args.eval_batch_size", "100", "--model.init_args.eval_plots", "false",
        "--model.init_args.backbone_kwargs", "{width: 8}", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("side", ["checkpoint_lacks_a_key", "checkpoint_has_an_extra_key"])
def test_resume_refuses_a_checkpoint_whose_config_differs_by_a_one_sided_key(run_dir, capsys, side):
    first = run_lightning_cli(["fit", *_argv(run_dir)])
    assert first.trainer.global_step == 2
    path = run_dir / "one_sided" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    config = ckpt["rl_gap"]["config"]
    if side == "checkpoint_lacks_a_key":
        key = "model.init_args.lr"
        assert key in config
        del config[key]
    else:
        key = "model.init_args.an_option_this_version_lacks"
        assert key not in config
        config[key] = 0.5
    torch.save(ckpt, path)
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", *_argv(run_dir, "--ckpt_path", "last")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "refusing to resume" in err and f"{key}:" in err


# -------------------------------------------------------- the tail count rule boundary
S, N, K_AT = 20_000, 1_000_000, 1000
MIN_COUNT = 5


def _world():
    """4 queries x 20,000 N(0,1) sample scores; positives at the 4th, 5th and 51st largest."""
    gen = torch.Generator().manual_seed(0)
    sample = torch.randn(4, S, generator=gen, dtype=torch.float64)
    top = sample.sort(dim=1, descending=True).values
    ranks = [MIN_COUNT - 1, MIN_COUNT, 51]  # sampled distractors >= the positive (ties count)
    pos = torch.stack([top[:, r - 1] for r in ranks], dim=1)
    return pos, sample, ranks


def _brute_counts(pos, sample):
    return torch.tensor(
        [[int((sample[q] >= s).sum()) for s in pos[q]] for q in range(pos.shape[0])]
    )


def _evt_survival(s, fit, q):
    """The paper's x = ζ (1 + ξ (s − u)/σ)^(−1/ξ), 0 beyond the endpoint (App. B)."""
    u, sigma, xi, zeta = (float(getattr(fit, a)[q]) for a in ("threshold", "sigma", "xi", "zeta"))
    base = 1.0 + xi * (s - u) / sigma
    return 0.0 if base <= 0 else zeta * base ** (-1.0 / xi)


@pytest.mark.parametrize("estimator", ["evt", "tail"])
def test_a_positive_reached_exactly_min_count_times_is_counted(estimator):
    pos, sample, ranks = _world()
    counts = _brute_counts(pos, sample)
    assert counts.tolist() == [ranks] * 4
    est = predict_map(pos, sample, gallery_size=N, k=K_AT, estimator=estimator, n_boot=10)
    assert est.hardness.shape == (4, 3)
    for q, (j, c) in itertools.product(range(4), enumerate(ranks)):
        x = float(est.hardness[q, j])
        if c >= MIN_COUNT:
            assert x == c / S, (q, c)  # counted: x = K/S exactly
        else:
            assert x != c / S  # fewer than min_count: taken from the tail
            if estimator == "evt":
                assert x == pytest.approx(_evt_survival(float(pos[q, j]), est.fit, q), rel=1e-9)
