"""Sharded loss calls: ``loss_fn(sim_rows, rel_rows, valid_rows, sharded=True)``.

Contract (docs/definitions.md, "Sharded losses"): under an initialised
process group each rank passes its consecutive block of rows of the global
(B, M) matrix (rank order; ragged blocks allowed); every rank gets the loss
one process would compute on the whole matrix, and backward gives this
rank's rows of that process's gradient. Loss parameters (InfoNCE's scale,
SigLIP's scale and bias) get per-rank gradients that sum over ranks to the
single-process gradient.

How each family is sharded (what crosses ranks per step):
- per-row losses (mSAP, SoftBin, BlackBox, SupAP; InfoNCE rows; SigLIP): each
  row is complete on its rank; only the partial sums and the number of rows
  with a positive are all-reduced (a few scalars);
- InfoNCE columns (``symmetric=True``): the column log-sum-exp, from an
  all-reduced (M,) max and (M,) sum of exponentials, and the (M,) positive
  counts per column;
- gSAP: ``rl_gap.losses.sharding.gsap`` (fast kernel: grid moments, O(G);
  exact sweep: the positives, O(P)); the global surrogates:
  ``rl_gap.losses.sharding.global_surrogates``; global negative dropping:
  ``rl_gap.losses.sharding.drop`` (a distributed radix select, ties in global
  flat order).
Per-query losses with ``symmetric=True`` other than InfoNCE rank every column
as its own list across all ranks' rows; they are not sharded (a clear error;
``supports_sharding`` says so, and the modules then keep the replicated path).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from rl_gap import dist as shard_comm
from rl_gap.losses.common import (
    check_batch,
    compute_dtype,
    drop_lowest_negatives,
    num_dropped,
    zero_loss,
)
from rl_gap.losses.sharding.drop import sharded_drop_mask

_HANDLERS: dict[str, Callable[..., torch.Tensor]] = {}


def _handler(name: str):
    def decorator(fn):
        _HANDLERS[name] = fn
        return fn

    return decorator


def _find_handler(module: nn.Module) -> Callable[..., torch.Tensor] | None:
    for cls in type(module).__mro__:
        if cls.__name__ in _HANDLERS:
            return _HANDLERS[cls.__name__]
    return None


def _is(module: nn.Module, class_name: str) -> bool:
    """``isinstance`` by class name: the loss modules import the registry, which routes here."""
    return any(cls.__name__ == class_name for cls in type(module).__mro__)


def supports_sharding(module: nn.Module) -> str | None:
    """None when ``module`` can be called with ``sharded=True``, else the reason it cannot."""
    if _find_handler(module) is None:
        return f"{type(module).__name__} has no sharded implementation"
    if getattr(module, "symmetric", False) and not _is(module, "InfoNCELoss"):
        return (
            f"{type(module).__name__}(symmetric=True) ranks every column as its own list over "
            "all ranks' rows, which is not sharded; use symmetric=False or the replicated "
            "loss (shard_loss: false)"
        )
    return None


def _checked(module, sim, rel, valid):
    """``check_batch`` on every rank, raising on every rank if any rank's input is bad.

    (A bad input on one rank must not leave the others waiting in a collective.)
    """
    error: Exception | None = None
    try:
        sim, rel, valid = check_batch(sim, rel, valid)
        reason = supports_sharding(module)
        if reason is not None:
            error = ValueError(f"sharded=True: {reason}")
    except ValueError as err:
        error = err
    flag = torch.tensor([0 if error is None else 1], dtype=torch.int64, device=sim.device)
    bad = int(shard_comm.all_reduce(flag))
    if error is not None:
        raise error
    if bad:
        raise ValueError(f"sharded loss: the inputs of {bad} other rank(s) were rejected")
    return sim, rel, valid


def sharded_forward(
    module: nn.Module, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor | None
) -> torch.Tensor:
    """The sharded call of a registered loss (what ``loss_fn(..., sharded=True)`` runs)."""
    shard_comm.require_group()
    handler = _find_handler(module)
    sim, rel, valid = _checked(module, sim, rel, valid)
    return handler(module, sim, rel, valid)


def _agree(check: Callable[[], None], device: torch.device) -> None:
    """Run a local input check; if it fails on any rank, raise on every rank."""
    error: Exception | None = None
    try:
        check()
    except ValueError as err:
        error = err
    flag = torch.tensor([0 if error is None else 1], dtype=torch.int64, device=device)
    bad = int(shard_comm.all_reduce(flag))
    if error is not None:
        raise error
    if bad:
        raise ValueError(f"sharded loss: the inputs of {bad} other rank(s) were rejected")


def _no_positive(module, sim, rel, valid) -> bool:
    local = int(torch.count_nonzero(rel & valid))
    return shard_comm.global_count(local, sim.device) == 0


def _mean_over_ranks(partial: torch.Tensor, count: int) -> torch.Tensor:
    return shard_comm.reduce_partials(partial) / count


# --------------------------------------------------------------------------- per row
def _row_mean(sim, rel, valid, per_rows: Callable[..., torch.Tensor], neg_drop: float):
    """Mean over the global rows with a valid positive of ``per_rows`` (a (R,) surrogate)."""
    has_pos = (rel & valid).any(1)
    count = shard_comm.global_count(int(torch.count_nonzero(has_pos)), sim.device)
    valid = drop_lowest_negatives(sim, rel, valid, neg_drop)
    if bool(has_pos.any()):
        partial = per_rows(sim, rel, valid, has_pos).sum()
    else:
        partial = sim.sum().to(compute_dtype(sim.dtype)) * 0.0
    return _mean_over_ranks(partial, count)


@_handler("MeanSmoothAPLoss")
def _msap(module, sim, rel, valid):
    from rl_gap.losses.smoothed_ap import smoothed_ap_rows

    if _no_positive(module, sim, rel, valid):
        return zero_loss(sim, module, "batch has no valid positive pair")

    def per_rows(s, r, v, has_pos):
        return smoothed_ap_rows(s, r, v, module.temperature, module.chunk_size)[has_pos]

    return 1.0 - _row_mean(sim, rel, valid, per_rows, module.neg_drop)


@_handler("APSurrogateLoss")
def _ap_surrogate(module, sim, rel, valid):
    if _no_positive(module, sim, rel, valid):
        return zero_loss(sim, module, "batch has no valid positive pair")
    sim = sim.to(compute_dtype(sim.dtype))
    _agree(lambda: module.check_scores(sim, valid), sim.device)
    if module.global_ranking:
        return 1.0 - _global_surrogate(module, sim, rel, valid)

    def per_rows(s, r, v, has_pos):
        s, r, v = s[has_pos], r[has_pos], v[has_pos]
        return module.list_ap(s, r & v, v)

    return 1.0 - _row_mean(sim, rel, valid, per_rows, module.neg_drop)


@_handler("_RoadmapMixin")
def _roadmap(module, sim, rel, valid):
    """ROADMAP: the SupAP term as above, plus the calibration term's two global non-zero means."""
    ap_term = _ap_surrogate(module, sim, rel, valid)
    s = sim.to(compute_dtype(sim.dtype))
    positive, negative = rel & valid, ~rel & valid
    calib = s.sum() * 0.0
    for hinge in (
        (module.pos_margin - s).clamp(min=0) * positive,
        (s - module.neg_margin).clamp(min=0) * negative,
    ):
        count = shard_comm.global_count(int(torch.count_nonzero(hinge)), sim.device)
        calib = calib + shard_comm.reduce_partials(hinge.sum()) / max(count, 1)
    return ap_term + module.calibration_weight * calib.to(ap_term.dtype)


def _kept_flat(sim, rel, valid, neg_drop):
    """This rank's part of the flattened valid list after global negative dropping."""
    scores, positive = sim[valid], rel[valid]
    if neg_drop > 0:
        keep = sharded_drop_mask(scores, positive, None, neg_drop)
        scores, positive = scores[keep], positive[keep]
    return scores, positive


def _global_surrogate(module, sim, rel, valid) -> torch.Tensor:
    from rl_gap.losses.sharding import global_surrogates as sharded_global

    scores, positive = _kept_flat(sim, rel, valid, module.neg_drop)
    if _is(module, "SoftBinAPLoss"):
        return sharded_global.sharded_softbin_ap(
            scores, positive, module.num_bins, module.sim_range
        )
    if _is(module, "BlackBoxAPLoss"):
        return sharded_global.sharded_blackbox_ap(
            scores, positive, module.lambda_val, module.margin
        )
    if _is(module, "SupAPLoss"):
        params = (module.temperature, module.rho, module.offset, module.margin, module.start)
        return sharded_global.sharded_supap(scores, positive, params, module.chunk_size)
    raise ValueError(f"{type(module).__name__}: no sharded global ranking")


# ------------------------------------------------------------------------------ gSAP
@_handler("GlobalSmoothAPLoss")
def _gsap(module, sim, rel, valid):
    from rl_gap.losses.fast_sap import kernel as fast_rank
    from rl_gap.losses.sharding import gsap as sharded_gsap

    local_pos = int(torch.count_nonzero(rel & valid))
    counts = torch.tensor(
        [local_pos, int(torch.count_nonzero(valid))], dtype=torch.int64, device=sim.device
    )
    num_pos, num_valid = (int(c) for c in shard_comm.all_reduce(counts))
    if num_pos == 0:
        return zero_loss(sim, module, "batch has no valid positive pair")
    impl = module.impl
    if impl == "auto":
        num_kept = num_valid - num_dropped(num_valid - num_pos, module.neg_drop)
        impl = module.select_impl(num_pos, num_kept)
    if impl == "fast":
        try:
            sap = sharded_gsap.sharded_smoothed_ap_fast(
                sim.reshape(-1),
                rel.reshape(-1),
                module.temperature,
                tolerance=module.tolerance,
                valid=valid.reshape(-1),
                neg_drop=module.neg_drop,
            )
            return 1.0 - sap
        except fast_rank.PlanError as error:
            if module.impl == "fast":
                raise
            module._warn_fallback(error)
    scores, positive = _kept_flat(sim, rel, valid, module.neg_drop)
    scores = scores.to(compute_dtype(sim.dtype))
    return 1.0 - sharded_gsap.sharded_smoothed_ap_exact(
        scores, positive, module.temperature, module.chunk_size
    )


# --------------------------------------------------------------------------- InfoNCE
def _infonce_rows(logits, rel, valid):
    """(sum over rows with a positive of the row loss, that row count) on this rank."""
    masked = logits.masked_fill(~valid, torch.finfo(logits.dtype).min)
    log_prob = torch.log_softmax(masked, dim=1)
    positive = rel & valid
    num_pos = positive.sum(1)
    per_row = -log_prob.masked_fill(~positive, 0.0).sum(1) / num_pos.clamp(min=1)
    return per_row[num_pos > 0].sum(), int(torch.count_nonzero(num_pos))


def _infonce_columns(logits, rel, valid):
    """This rank's partial of the global column-direction loss.

    Column c's loss is ``LSE_c − mean_{q in P_c} logit_qc`` with the
    log-sum-exp over every rank's rows: its (M,) max (no gradient, LSE is
    shift-invariant) and sum of exponentials are all-reduced. The LSE terms are
    the same on every rank and enter rank 0's partial only.
    """
    finfo_min = torch.finfo(logits.dtype).min
    masked = logits.masked_fill(~valid, finfo_min)
    col_max = shard_comm.all_reduce(masked.detach().amax(0).contiguous(), "max")
    sum_exp = shard_comm.reduce_statistic(torch.exp(masked - col_max).sum(0))
    lse = sum_exp.log() + col_max
    positive = rel & valid
    pos_count = shard_comm.all_reduce(positive.sum(0).to(torch.int64))
    has_pos = pos_count > 0
    num_cols = int(torch.count_nonzero(has_pos))
    pos_sum = logits.masked_fill(~positive, 0.0).sum(0)
    local = -(pos_sum / pos_count.clamp(min=1).to(logits.dtype))[has_pos].sum()
    return local + shard_comm.first_rank_only(lse[has_pos].sum()), num_cols


@_handler("InfoNCELoss")
def _infonce(module, sim, rel, valid):
    if _no_positive(module, sim, rel, valid):
        return zero_loss(sim, module, "batch has no valid positive pair")
    logits = sim.to(compute_dtype(sim.dtype)) * module.logit_scale()
    row_sum, local_rows = _infonce_rows(logits, rel, valid)
    loss = _mean_over_ranks(row_sum, shard_comm.global_count(local_rows, sim.device))
    if module.symmetric:
        col_partial, num_cols = _infonce_columns(logits, rel, valid)
        loss = 0.5 * (loss + _mean_over_ranks(col_partial, num_cols))
    return loss


# ---------------------------------------------------------------------------- SigLIP
@_handler("SigLIPLoss")
def _siglip(module, sim, rel, valid):
    dtype = compute_dtype(sim.dtype)
    logits = sim.to(dtype) * module.scale().to(dtype) + module.bias.to(dtype)
    sign = rel.to(dtype) * 2.0 - 1.0
    partial = -(F.logsigmoid(sign * logits) * valid.to(dtype)).sum()
    rows = shard_comm.global_count(sim.shape[0], sim.device)
    return _mean_over_ranks(partial, rows)


def warn_replicated(reason: str) -> None:
    """One warning that a module keeps the replicated loss (every rank the whole matrix)."""
    warnings.warn(
        f"shard_loss=auto: {reason}; every rank computes the whole loss instead", stacklevel=3
    )
