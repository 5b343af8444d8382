"""Benchmark the exact retrieval metric engine on this machine.

Part 1 (materialised scores, 10^6 and 10^7 pairs): our full suite
(``evaluate_scores``: gAP, mAP, R@k, R@P90, F1g, F1q) vs scikit-learn
``average_precision_score`` (flattened gAP alone, and gAP + per-row mAP) and
torchmetrics ``BinaryAveragePrecision`` / ``RetrievalMAP``.

Part 2 (from embeddings, d = 128): our suite (``evaluate_embeddings``,
leave-one-out, no ceiling) vs the bare blocked similarity GEMM at 10^8 and
~10^9 pairs. Leave-one-out on one tensor scores each unordered pair once (the
engine's symmetric path); the same problem with the database passed as a
separate tensor shows the cost when there is no symmetry to use.

Part 3 (``--layouts``): the engine over the bare GEMM for the two layouts, at
10k x 10k and d = 128 / 512: separate query and database sets (distinct
embeddings of the same classes, no self pairs) and leave-one-out on one set,
each repeated (``--repeat``) and reported as the median ratio of one run.

Times are wall seconds; "peak" is the extra resident memory (RSS sampled every
2 ms) above the level before the call. Ratios within one run are what to read:
the machine is shared and timings drift.

    .venv/bin/python benchmarks/bench_metrics.py            # everything (~10+ min)
    .venv/bin/python benchmarks/bench_metrics.py --quick    # 10^6 / 10^7 / 10^8 only
    .venv/bin/python benchmarks/bench_metrics.py --layouts --skip-scores --skip-embeddings
"""

from __future__ import annotations

import argparse
import gc
import os
import threading
import time

import numpy as np
import torch


class PeakRSS:
    """Peak resident memory above the starting level, sampled in a thread."""

    def __enter__(self):
        gc.collect()
        self.base = self.peak = self._rss()
        self._stop = False
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        self.start = time.perf_counter()
        return self

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _watch(self):
        while not self._stop:
            self.peak = max(self.peak, self._rss())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start
        self._stop = True
        self._thread.join()
        self.peak = max(self.peak, self._rss())
        self.extra_mb = (self.peak - self.base) / 2**20


def measure(fn):
    with PeakRSS() as m:
        value = fn()
    return value, m.seconds, m.extra_mb


def scores_problem(num_q: int, num_d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    dim = 32
    classes = max(2, num_d // 20)
    qc = torch.randint(0, classes, (num_q,), generator=g)
    dc = torch.randint(0, classes, (num_d,), generator=g)
    centers = torch.nn.functional.normalize(torch.randn(classes, dim, generator=g), dim=1)
    q = torch.nn.functional.normalize(
        centers[qc] + 0.9 * torch.randn(num_q, dim, generator=g), dim=1
    )
    d = torch.nn.functional.normalize(
        centers[dc] + 0.9 * torch.randn(num_d, dim, generator=g), dim=1
    )
    return q @ d.T, qc[:, None] == dc[None]


def part_scores(sizes):
    print("\n== materialised scores: our full suite vs scikit-learn / torchmetrics ==")
    print(f"{'pairs':>8} {'method':<44} {'seconds':>8} {'peak MB':>8} {'ours x faster':>13}  value")
    for num_q, num_d in sizes:
        _scores_case(num_q, num_d)


def _scores_case(num_q: int, num_d: int) -> None:
    from sklearn.metrics import average_precision_score
    from torchmetrics.classification import BinaryAveragePrecision
    from torchmetrics.retrieval import RetrievalMAP

    from rl_gap.metrics.functional import evaluate_scores

    scores, rel = scores_problem(num_q, num_d)
    s_np, r_np = scores.numpy(), rel.numpy()
    pairs = num_q * num_d
    ours, t_ours, m_ours = measure(lambda: evaluate_scores(scores, rel, ceiling=False))
    rows = [("ours: evaluate_scores (gAP,mAP,R@k,R@P90,F1)", t_ours, m_ours, ours["gap"])]
    v, t, m = measure(lambda: average_precision_score(r_np.ravel(), s_np.ravel()))
    rows.append(("sklearn average_precision_score (gAP)", t, m, v))

    def sk_both():
        per_row = [average_precision_score(r_np[i], s_np[i]) for i in range(num_q) if r_np[i].any()]
        return average_precision_score(r_np.ravel(), s_np.ravel()), float(np.mean(per_row))

    (g_sk, m_sk), t, m = measure(sk_both)
    rows.append(("sklearn gAP + per-row mAP", t, m, g_sk))
    assert abs(g_sk - ours["gap"]) < 1e-9 and abs(m_sk - ours["map"]) < 1e-9

    def tm_binary():
        metric = BinaryAveragePrecision(thresholds=None)
        metric.update(scores.ravel(), rel.ravel().long())
        return float(metric.compute())

    v, t, m = measure(tm_binary)
    rows.append(("torchmetrics BinaryAveragePrecision (gAP)", t, m, v))

    def tm_retrieval():
        metric = RetrievalMAP()
        idx = torch.arange(num_q)[:, None].expand(num_q, num_d)
        metric.update(scores.ravel(), rel.ravel(), indexes=idx.ravel())
        return float(metric.compute())

    v, t, m = measure(tm_retrieval)
    rows.append(("torchmetrics RetrievalMAP (mAP)", t, m, v))
    for name, t, m, v in rows:
        print(f"{pairs:>8.0e} {name:<44} {t:>8.2f} {m:>8.0f} {t / t_ours:>13.2f}  {v:.6f}")


def part_embeddings(sizes, block: int):
    from rl_gap.metrics.functional import native

    print("\n== from embeddings (d=128, leave-one-out): our suite vs the bare blocked GEMM ==")
    print(f"native kernel: {'loaded' if native.native_library() is not None else 'unavailable'}")
    print(f"{'pairs':>8} {'method':<44} {'seconds':>8} {'peak MB':>8} {'x GEMM':>8}")
    for n in sizes:
        _embeddings_case(n, block)


def _embeddings_case(n: int, block: int) -> None:
    from rl_gap.metrics.functional import evaluate_embeddings

    g = torch.Generator().manual_seed(1)
    classes = n // 8
    labels = torch.randint(0, classes, (n,), generator=g)
    centers = torch.randn(classes, 128, generator=g)
    x = torch.nn.functional.normalize(
        centers[labels] + 1.2 * torch.randn(n, 128, generator=g), dim=1
    )

    def gemm():
        total = 0.0
        for r in range(0, n, block):
            q = x[r : r + block]
            for c in range(0, n, block):
                total += float((q @ x[c : c + block].T)[0, 0])
        return total

    _, t_gemm, m_gemm = measure(gemm)
    out, t_ours, m_ours = measure(
        lambda: evaluate_embeddings(
            x, x, labels, labels, exclude_self=True, ceiling=False, block_size=block
        )
    )
    # The same problem with the database as a separate tensor: no symmetry to use,
    # every block is scored and counted (the cost of separate query/database sets).
    database = x.clone()
    out_plain, t_plain, m_plain = measure(
        lambda: evaluate_embeddings(
            x, database, labels, labels, exclude_self=True, ceiling=False, block_size=block
        )
    )
    rows = [
        ("bare GEMM (blocked, same blocks)", t_gemm, m_gemm),
        ("ours: evaluate_embeddings (full suite)", t_ours, m_ours),
        ("ours, database as a separate tensor", t_plain, m_plain),
    ]
    for name, t, m in rows:
        print(f"{n * n:>8.0e} {name:<44} {t:>8.2f} {m:>8.0f} {t / t_gemm:>8.2f}")
    print(
        f"         gap={out['gap']:.4f} map={out['map']:.4f} r@1={out['r@1']:.4f} "
        f"r@p90={out['r@p90']:.4f} (separate tensor: gap={out_plain['gap']:.4f})"
    )


def layout_problem(n: int, dim: int, noise: float, seed: int = 1):
    """2n embeddings of n // 8 classes (a moderately hard problem: gAP ~0.5 at d = 128):
    the first n are the queries, the last n the separate database."""
    g = torch.Generator().manual_seed(seed)
    classes = n // 8
    labels = torch.randint(0, classes, (2 * n,), generator=g)
    centers = torch.randn(classes, dim, generator=g)
    spread = noise * (dim / 128) ** 0.25  # about as hard at d = 512 as at 128
    x = torch.nn.functional.normalize(
        centers[labels] + spread * torch.randn(2 * n, dim, generator=g), dim=1
    )
    return x[:n].contiguous(), x[n:].contiguous(), labels[:n], labels[n:]


def part_layouts(n: int, dims, noise: float, repeat: int, block: int) -> None:

    print(f"\n== engine / bare GEMM, {n} x {n}: separate sets vs leave-one-out ==")
    print(f"{'dim':>4} {'layout':<22} {'GEMM s':>7} {'engine s':>8} {'median x GEMM':>13}  runs")
    for dim in dims:
        _layout_case(dim, *layout_problem(n, dim, noise), repeat, block)


def _layout_case(dim, q, d, ql, dl, repeat: int, block: int) -> None:
    from rl_gap.metrics.functional import evaluate_embeddings

    def gemm(a, b):
        total = 0.0
        for r in range(0, a.shape[0], block):
            for c in range(0, b.shape[0], block):
                total += float((a[r : r + block] @ b[c : c + block].T)[0, 0])
        return total

    layouts = {
        "query != database": (
            lambda: gemm(q, d),
            lambda: evaluate_embeddings(q, d, ql, dl, ceiling=False, block_size=block),
        ),
        "leave-one-out": (
            lambda: gemm(q, q),
            lambda: evaluate_embeddings(
                q, q, ql, ql, exclude_self=True, ceiling=False, block_size=block
            ),
        ),
    }
    for name, (bare, engine) in layouts.items():
        ratios, t_bare, t_engine = [], [], []
        for _ in range(repeat):  # alternate, so drift hits both alike
            _, tb, _ = measure(bare)
            out, te, _ = measure(engine)
            ratios.append(te / tb)
            t_bare.append(tb)
            t_engine.append(te)
        runs = " ".join(f"{r:.2f}" for r in ratios)
        print(
            f"{dim:>4} {name:<22} {np.median(t_bare):>7.2f} {np.median(t_engine):>8.2f} "
            f"{np.median(ratios):>13.2f}  {runs}  (gap={out['gap']:.3f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="skip the 10^9-pair run")
    parser.add_argument("--skip-scores", action="store_true")
    parser.add_argument("--block", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-embeddings", action="store_true")
    parser.add_argument("--layouts", action="store_true", help="both layouts, d = 128 / 512")
    parser.add_argument("--layout-size", type=int, default=10_000)
    parser.add_argument("--noise", type=float, default=1.5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    if not args.skip_scores:
        part_scores([(1000, 1000), (1000, 10000)])
    if not args.skip_embeddings:
        part_embeddings([10_000] if args.quick else [10_000, 32_768], args.block)
    if args.layouts:
        part_layouts(args.layout_size, (128, 512), args.noise, args.repeat, args.block)


if __name__ == "__main__":
    main()
