"""Exact smoothed AP of one flat ranked list, chunked, with an analytic backward.

Smoothed AP (Brown et al., *Smooth-AP*, ECCV 2020; the gSAP paper §3.3 applies
it to the flattened similarity matrix): for a positive i,

    R_P(i) = 1 + sum_{j in P, j != i} σ((s_j − s_i)/τ)
    R_A(i) = R_P(i) + sum_{j in A \\ P} σ((s_j − s_i)/τ)
    SAP    = mean_{i in P} R_P(i) / R_A(i)

This costs P × M sigmoid evaluations (P positives, M items). A plain autograd
graph would keep several P × M tensors alive for backward; here the work runs
in chunks of positives and the gradient is accumulated analytically *during*
the forward pass (one sweep, nothing recomputed), so the extra memory is
O(chunk × M + M) whatever P is. The gradient of SAP w.r.t. the scores is
stored (O(M)) and scaled by the upstream gradient in backward.

Gradient. With f_i = R_P(i)/R_A(i) and R_N(i) = R_A(i) − R_P(i),
∂f_i/∂R_P(i) = R_N(i)/R_A(i)² and ∂f_i/∂R_N(i) = −R_P(i)/R_A(i)². Every
comparison (i, j) adds c_ij·σ'(d_ij)/τ to ∂SAP/∂s_j and subtracts it from
∂SAP/∂s_i, where d_ij = (s_j − s_i)/τ and c_ij is the positive or negative
coefficient of row i over P. The self-comparison j = i (σ(0) = 1/2) enters
both with opposite signs and cancels, so R_P is computed as
``1/2 + sum_{j in P} σ(d_ij)`` without masking the diagonal.

Precision: the gradient is accumulated with matmuls *in the forward pass*, so
the two public functions (the only callers of the sweeps) are
wrapped by ``full_precision`` (autocast off, half inputs widened): under
``bf16-mixed`` autocast those matmuls would otherwise run in bf16.
"""

from __future__ import annotations

import torch

from rl_gap.losses.common import compute_dtype, full_precision, sweep_with_gradient

# Elements of one (chunk × M) comparison block: 2^24 float32 = 64 MiB, the
# exact sweep's only large temporary.
DEFAULT_BLOCK_ELEMENTS = 1 << 24


def auto_chunk_size(num_items: int, block_elements: int = DEFAULT_BLOCK_ELEMENTS) -> int:
    """Rows (positives) per chunk so that a chunk × ``num_items`` block stays bounded."""
    return max(1, block_elements // max(1, num_items))


def _sap_sweep(
    pos_scores: torch.Tensor,
    neg_scores: torch.Tensor,
    temperature: float,
    chunk_size: int,
    with_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One chunked sweep over the positives.

    Args:
        pos_scores: (P,) scores of the positives.
        neg_scores: (N,) scores of the negatives.
        temperature: τ > 0.
        chunk_size: positives per chunk.
        with_grad: also accumulate ∂SAP/∂scores.

    Returns:
        (SAP 0-d, ∂SAP/∂pos_scores (P,) or None, ∂SAP/∂neg_scores (N,) or None).
    """
    num_pos = pos_scores.numel()
    inv_tau = 1.0 / temperature
    # Positives first, then negatives: the sums over P and over A \ P are two
    # contiguous slices of each row. (torch's pairwise ``sum``, not a GEMV with
    # an indicator: BLAS accumulation over millions of float32 terms lost
    # ~1e-5 relative accuracy.)
    scaled_items = torch.cat([pos_scores, neg_scores]) * inv_tau
    num_items = scaled_items.numel()
    total = scaled_items.new_zeros(())
    grad = scaled_items.new_zeros(num_items) if with_grad else None
    # One block reused by every chunk: no per-chunk allocation (fresh large
    # allocations are page-faulted in again each time), and every step below is
    # a single in-place pass or a reduction over it.
    block = scaled_items.new_empty(min(chunk_size, num_pos), num_items)
    for start in range(0, num_pos, chunk_size):
        anchors = scaled_items[start : min(start + chunk_size, num_pos)]
        sig = block[: anchors.numel()]
        torch.sub(scaled_items.unsqueeze(0), anchors.unsqueeze(1), out=sig)
        sig.sigmoid_()  # σ((s_j − s_i)/τ), (c, M)
        rank_pos = sig[:, :num_pos].sum(1).add_(0.5)  # 1 + sum over j in P, j != i
        rank_neg = sig[:, num_pos:].sum(1)
        rank_all = rank_pos + rank_neg
        total = total + (rank_pos / rank_all).sum()
        if not with_grad:
            continue
        inv_sq = rank_all.pow(-2) * (inv_tau / num_pos)
        coef_pos = rank_neg * inv_sq  # ∂(mean f)/∂R_P(i), times 1/τ
        coef_neg = -rank_pos * inv_sq  # ∂(mean f)/∂R_N(i), times 1/τ
        deriv = sig.addcmul_(sig, sig, value=-1.0)  # σ' = σ − σ², in place
        grad[:num_pos] += coef_pos @ deriv[:, :num_pos]
        grad[num_pos:] += coef_neg @ deriv[:, num_pos:]
        row = coef_pos * deriv[:, :num_pos].sum(1) + coef_neg * deriv[:, num_pos:].sum(1)
        grad[start : start + anchors.numel()] -= row
    sap = total / num_pos
    if not with_grad:
        return sap, None, None
    return sap, grad[:num_pos], grad[num_pos:]


def _exact_sweep(
    scores: torch.Tensor,
    positive: torch.Tensor,
    temperature: float,
    chunk_size: int,
    with_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``_sap_sweep`` of one (M,) list in the compute dtype; the value in ``scores.dtype``."""
    work = scores.to(compute_dtype(scores.dtype))
    sap, grad_pos, grad_neg = _sap_sweep(
        work[positive], work[~positive], temperature, chunk_size, with_grad
    )
    if not with_grad:
        return sap.to(scores.dtype), None
    grad = torch.empty_like(work)
    grad[positive] = grad_pos
    grad[~positive] = grad_neg
    return sap.to(scores.dtype), grad


@full_precision
def smoothed_ap_exact(
    scores: torch.Tensor,
    positive: torch.Tensor,
    temperature: float,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Smoothed AP of one ranked list, exact (all P × M sigmoid comparisons).

    Args:
        scores: (M,) float scores; float16/bfloat16 are computed in float32.
        positive: (M,) bool, True for the relevant items; needs ≥ 1 True.
        temperature: sigmoid temperature τ > 0.
        chunk_size: positives per chunk (peak extra memory one chunk × M
            block plus O(M) vectors); ``None`` picks one for a ~2^24-element block.

    Returns:
        0-d tensor, the smoothed AP in [0, 1], differentiable w.r.t. ``scores``
        (first order only), in ``scores.dtype``.
    """
    if scores.dim() != 1 or positive.shape != scores.shape:
        raise ValueError(
            f"smoothed_ap_exact expects 1-D scores and a positive mask of the same shape, "
            f"got {tuple(scores.shape)} and {tuple(positive.shape)}"
        )
    if positive.dtype != torch.bool:
        raise ValueError(f"positive must be a bool tensor, got {positive.dtype}")
    if not torch.is_floating_point(scores):
        raise ValueError(f"scores must be a floating tensor, got {scores.dtype}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    num_pos = int(positive.sum())
    if num_pos == 0:
        raise ValueError("smoothed AP needs at least one positive item")
    if chunk_size is None:
        chunk_size = auto_chunk_size(scores.numel())
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return sweep_with_gradient(_exact_sweep, scores, positive, float(temperature), int(chunk_size))


def _rows_sweep(
    scores: torch.Tensor,
    positive: torch.Tensor,
    negative: torch.Tensor,
    temperature: float,
    chunk_size: int | None,
    with_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-row smoothed AP, rows in chunks so that chunk × K × D stays bounded.

    Args:
        scores: (R, D) scores, every row with ≥ 1 positive (half precision computed in float32).
        positive: (R, D) bool, relevant and valid.
        negative: (R, D) bool, non-relevant and valid.
        temperature: τ > 0.
        chunk_size: rows per chunk; None bounds rows × K × D by DEFAULT_BLOCK_ELEMENTS
            (K = most positives in a row).
        with_grad: also return ∂SAP_r/∂scores[r, :] (R, D) (Jacobian is row-diagonal).
    """
    scores = scores.to(compute_dtype(scores.dtype))
    num_rows, width = scores.shape
    inv_tau = 1.0 / temperature
    pos_f = positive.to(scores.dtype)
    neg_f = negative.to(scores.dtype)
    num_pos = positive.sum(1)
    max_pos = int(num_pos.max())
    rows_per_chunk = chunk_size or max(1, DEFAULT_BLOCK_ELEMENTS // max(1, max_pos * width))
    sap = scores.new_zeros(num_rows)
    grad = scores.new_zeros(scores.shape) if with_grad else None
    for start in range(0, num_rows, rows_per_chunk):
        rows = slice(start, min(start + rows_per_chunk, num_rows))
        s = scores[rows] * inv_tau
        k = int(num_pos[rows].max())
        # Column indices of each row's positives first (stable), padded to k.
        order = torch.argsort((~positive[rows]).to(torch.int8), dim=1, stable=True)[:, :k]
        anchor_ok = torch.arange(k, device=s.device).unsqueeze(0) < num_pos[rows].unsqueeze(1)
        anchors = s.gather(1, order)  # (c, k)
        sig = (s.unsqueeze(1) - anchors.unsqueeze(2)).sigmoid_()  # (c, k, D)
        p_col = pos_f[rows].unsqueeze(2)  # (c, D, 1)
        n_col = neg_f[rows].unsqueeze(2)
        rank_pos = torch.bmm(sig, p_col).squeeze(2).add_(0.5)  # 1 + sum over j != i
        rank_neg = torch.bmm(sig, n_col).squeeze(2)
        rank_all = rank_pos + rank_neg
        weight = anchor_ok.to(s.dtype) / num_pos[rows].unsqueeze(1).to(s.dtype)  # (c, k)
        sap[rows] = (rank_pos / rank_all * weight).sum(1)
        if not with_grad:
            continue
        inv_sq = rank_all.pow(-2) * weight * inv_tau
        coef_pos = (rank_neg * inv_sq).unsqueeze(1)  # (c, 1, k)
        coef_neg = (-rank_pos * inv_sq).unsqueeze(1)
        deriv = sig.addcmul_(sig, sig, value=-1.0)  # σ' = σ − σ², in place
        col = torch.bmm(coef_pos, deriv).squeeze(1) * pos_f[rows]
        col += torch.bmm(coef_neg, deriv).squeeze(1) * neg_f[rows]
        anchor = coef_pos.squeeze(1) * torch.bmm(deriv, p_col).squeeze(2)
        anchor += coef_neg.squeeze(1) * torch.bmm(deriv, n_col).squeeze(2)
        col.scatter_add_(1, order, -anchor)  # padded anchors have zero coefficients
        grad[rows] = col
    return sap, grad


@full_precision
def smoothed_ap_rows(
    scores: torch.Tensor,
    positive: torch.Tensor,
    valid: torch.Tensor,
    temperature: float,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Smoothed AP of every row of a score matrix, each row its own ranked list (Smooth-AP).

    Peak extra memory is one chunk × K × D block (K = most positives in a
    row) plus O(R · D), not the O(R · K · D) of a one-shot broadcast
    (Smooth-AP's reference code, Smooth_AP #12).

    Args:
        scores: (R, D) float scores; float16/bfloat16 are computed in float32.
        positive: (R, D) bool relevance; only pairs also ``valid`` count.
        valid: (R, D) bool, False = item absent from that row's list.
        temperature: τ > 0.
        chunk_size: rows per chunk; None picks one for ~2^24-element blocks.

    Returns:
        (R,) smoothed AP per row in the compute dtype; rows with no valid
        positive are 0 and receive no gradient (mask them out).
    """
    if scores.dim() != 2 or positive.shape != scores.shape or valid.shape != scores.shape:
        raise ValueError(
            f"smoothed_ap_rows expects (R, D) scores/positive/valid, got {tuple(scores.shape)}, "
            f"{tuple(positive.shape)}, {tuple(valid.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size is not None and int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    pos = positive & valid
    has_pos = pos.any(1)
    out_dtype = compute_dtype(scores.dtype)
    result = scores.new_zeros(scores.shape[0], dtype=out_dtype)
    if not bool(has_pos.any()):
        return result + scores.sum().to(out_dtype) * 0.0
    rows = has_pos.nonzero().squeeze(1)
    neg = valid & ~positive
    sap = sweep_with_gradient(
        _rows_sweep, scores[rows], pos[rows], neg[rows], float(temperature), chunk_size
    )
    return result.index_put((rows,), sap)
