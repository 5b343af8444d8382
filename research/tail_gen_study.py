"""Point predictions of candidate estimators on the generated worlds (``research.tail_gen``).

For every world of a split half this runs each candidate once and saves the
truth (the pool's realized mAP@k), each candidate's per-query AP@k and its
time, so candidates are compared offline (``research.tail_gen_table``).
Candidates are the registered estimators and settings of them
(``CANDIDATES``); ``--interval`` adds the default estimator's full estimate
(interval, flags) for the coverage and flag figures.

    PYTHONPATH=. OMP_NUM_THREADS=1 python -m research.tail_gen_study --split design \\
        --out /tmp/tailgen/design.pt --candidates count,evt,evt_support,tail
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from research.tail_gen import cached, parse_key, split_keys
from research.tail_pools import sorted_pool_counts
from rl_gap.metrics.tail import TailPredictor, get_estimator, state_from_scores
from rl_gap.metrics.tail.bayes import DEFAULT_BAYES
from rl_gap.metrics.tail.hardness import DEFAULT_CONFIG, sample_excesses
from rl_gap.metrics.tail.rank_law import ap_at_k_from_counts, ap_at_k_from_hardness


def _registered(name: str, **bayes):
    def run(pred: TailPredictor, n: int) -> torch.Tensor:
        cfg = dataclasses.replace(DEFAULT_BAYES, **bayes) if bayes else None
        return pred.per_query(name, n, bayes=cfg)

    return run


def _tail_at_sample_rule(factor: float, **bayes):
    """``tail`` with its threshold at ``factor`` × the sample-size rule's exceedances."""

    def run(pred: TailPredictor, n: int) -> torch.Tensor:
        n_exc = max(10, int(round(factor * sample_excesses(pred.sample_size))))
        cfg = dataclasses.replace(DEFAULT_BAYES, n_excess=n_exc, **bayes)
        return pred.per_query("tail", n, bayes=cfg)

    return run


def _tail_supported(factor: float, **bayes):
    """``tail`` at the sample-size rule, its shape support following the declared range
    (ξ ≤ 0 for bounded scores)."""

    def run(pred: TailPredictor, n: int) -> torch.Tensor:
        n_exc = max(10, int(round(factor * sample_excesses(pred.sample_size))))
        xi_max = 0.0 if pred.config.score_range is not None else DEFAULT_BAYES.xi_max
        # The grid is of midpoints: a tiny positive edge keeps ξ ≤ 0 without ξ = 0 exactly.
        cfg = dataclasses.replace(DEFAULT_BAYES, n_excess=n_exc, xi_max=xi_max or 1e-6, **bayes)
        return pred.per_query("tail", n, bayes=cfg)

    return run


def _evt_support_with(**config):
    def run(pred: TailPredictor, n: int) -> torch.Tensor:
        top, size = pred.level(-1)
        cfg = dataclasses.replace(pred.config, **config)
        evt_support = get_estimator("evt_support")
        x, _, _ = evt_support.estimate_hardness(pred.pos_sorted, pred.valid, top, size, None, cfg)
        return ap_at_k_from_hardness(pred.j, pred.valid, x, n, pred.k, "plugin")

    return run


def _pooled_plugin(factor: float, mode: str):
    """Plug-in GPD at the sample-size rule with the shape from the pooled (empirical-Bayes)
    posterior: its mode (``"map"``) or the posterior-mean hardness (``"mean"``)."""

    def run(pred: TailPredictor, n: int) -> torch.Tensor:
        from rl_gap.metrics.tail.bayes import gpd_posterior
        from rl_gap.metrics.tail.gpd import gpd_survival
        from rl_gap.metrics.tail.hardness import clip_to_range, sample_counts

        top, size = pred.level(-1)
        rng = pred.config.score_range
        pos = clip_to_range(pred.pos_sorted, rng, "positives")
        top = clip_to_range(top, rng, "sample")
        n_exc = max(10, int(round(factor * sample_excesses(size))))
        xi_max = 1e-6 if rng is not None else 0.5
        cfg = dataclasses.replace(DEFAULT_BAYES, n_excess=n_exc, xi_max=xi_max, bias_replicates=0)
        post = gpd_posterior(top, size, None, cfg)
        y = (pos.double() - post.threshold.unsqueeze(1)).clamp_min(0.0)
        if mode == "map":
            g = post.weight.argmax(1, keepdim=True)
            sigma, xi = post.sigma.gather(1, g), post.xi[g]
            x_tail = post.zeta.unsqueeze(1) * gpd_survival(y, sigma, xi)
        else:
            surv = gpd_survival(y.unsqueeze(-1), post.sigma.unsqueeze(1), post.xi.view(1, 1, -1))
            x_tail = post.zeta.unsqueeze(1) * (surv * post.weight.unsqueeze(1)).sum(-1)
        counts, _ = sample_counts(pos, pred.valid, top)
        above = pos >= post.threshold.unsqueeze(1)
        use = pred.valid & (counts < 5) & post.ok.unsqueeze(1) & above
        x = torch.where(use, x_tail, counts / size)
        return ap_at_k_from_hardness(pred.j, pred.valid, x, n, pred.k, "plugin")

    return run


def _mean_only(name: str):
    """A curve fit (``single_x``, ``powerlaw``, ``loguniform``): its mean for every query."""

    def run(pred: TailPredictor, n: int) -> torch.Tensor:
        value = pred.estimate(name, n, n_boot=0, diagnose=False).map
        return torch.full((pred.pos_sorted.shape[0],), value, dtype=torch.float64)

    return run


CANDIDATES = {
    "sample": _registered("sample"),
    "count": _registered("count"),
    "evt": _registered("evt"),
    "evt_support": _registered("evt_support"),
    "tail_pooled": _registered("tail_pooled"),
    "single_x": _mean_only("single_x"),
    "powerlaw": _mean_only("powerlaw"),
    "loguniform": _mean_only("loguniform"),
    "tail": _registered("tail"),
    "tail-nb": _registered("tail", bias_replicates=0),
    "tail-nb@50": _registered("tail", bias_replicates=0, n_excess=50),
    "tail-nb@S": _tail_at_sample_rule(1.0, bias_replicates=0),
    "tail-nb@2S": _tail_at_sample_rule(2.0, bias_replicates=0),
    "tail-nb@4S": _tail_at_sample_rule(4.0, bias_replicates=0),
    "tail@2S": _tail_at_sample_rule(2.0),
    "tail-nb-flat": _registered("tail", bias_replicates=0, prior="flat"),
    "tail-nb@S-sup": _tail_supported(1.0, bias_replicates=0),
    "tail-nb@2S-sup": _tail_supported(2.0, bias_replicates=0),
    "evt_support-xi.5": _evt_support_with(xi_min=-0.5),
    "map@S": _pooled_plugin(1.0, "map"),
    "map@2S": _pooled_plugin(2.0, "map"),
    "map@4S": _pooled_plugin(4.0, "map"),
    "mean@S": _pooled_plugin(1.0, "mean"),
    "mean@2S": _pooled_plugin(2.0, "mean"),
}


def predictor_for(data: dict, seed: int = 0) -> TailPredictor:
    spec = data["spec"]
    rng = data["score_range"]
    config = dataclasses.replace(DEFAULT_CONFIG, score_range=None if rng is None else tuple(rng))
    state = state_from_scores(data["sample"], max(spec["k"], 4000), seed=seed)
    return TailPredictor(data["pos_scores"], state, spec["k"], config, seed=seed)


def truth_per_query(pred: TailPredictor, data: dict) -> torch.Tensor:
    counts = torch.where(pred.valid, sorted_pool_counts(data), torch.zeros_like(pred.j))
    return ap_at_k_from_counts(pred.j, pred.valid, counts, pred.k)


def run_world(key: str, cache: str, names: list[str]) -> dict:
    data = cached(key, cache)
    spec = data["spec"]
    pred = predictor_for(data)
    truth = truth_per_query(pred, data)
    ok = pred.query_ok
    row = {
        "key": key,
        "family": parse_key(key)[0],
        "S": spec["S"],
        "N": spec["N"],
        "k": spec["k"],
        "bounded": data["score_range"] is not None,
        "truth": float(truth[ok].mean()),
        "truth_pq": truth,
        "query_ok": ok,
        "per_query": {},
        "map": {},
        "seconds": {},
    }
    for name in names:
        t0 = time.perf_counter()
        pq = CANDIDATES[name](pred, spec["N"])
        row["seconds"][name] = time.perf_counter() - t0
        row["per_query"][name] = pq
        row["map"][name] = float(pq[ok].mean())
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", default="/tmp/tailgen")
    p.add_argument("--split", choices=("design", "held_out"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--candidates", default=",".join(CANDIDATES))
    p.add_argument("--keys", default=None, help="comma-separated world keys (default: the split)")
    args = p.parse_args(argv)
    names = args.candidates.split(",")
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise SystemExit(f"unknown candidates {unknown}; known: {', '.join(CANDIDATES)}")
    keys = args.keys.split(",") if args.keys else split_keys(args.split)
    rows = []
    for key in keys:
        row = run_world(key, args.cache, names)
        rows.append(row)
        errs = "  ".join(f"{n} {row['map'][n] - row['truth']:+.3f}" for n in names)
        print(f"{key:>22} truth {row['truth']:.3f}  {errs}", flush=True)
        torch.save(rows, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
