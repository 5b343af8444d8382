"""Fused CPU kernel for ``NegativeCounter.add`` (optional, built on first use).

Per negative score it does, in one pass and without temporaries: the uniform
grid cell, the exact refinement inside an occupied cell (binary search in that
cell's few grid values), and the increments of the global (per group)
histogram, the query's own-positive histogram and the bootstrap histogram. Scores below
the lowest positive are skipped (they are >= no grid value). Rows are split
across ATen's intra-op threads; each thread owns a private global histogram
(per-query histograms are disjoint by construction).

The eager tensor path in ``counting.py`` computes the same counts (tests
compare both); this kernel only exists because eager ops cost ~10 passes over
every block, several times the GEMM (DESIGN §6). Disable with
``RL_GAP_NATIVE=0`` (``=1`` forces it; default: used when already built or
for problems of >= 2^27 pairs); if the build fails the eager path is used.
"""

from __future__ import annotations

import os
import threading
import warnings

__all__ = ["native_kernel", "native_enabled", "is_built", "should_use"]

_SOURCE = r"""
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

template <typename scalar_t, typename base_t>
static void count_impl(
    const torch::Tensor& scores, double lo_d, double scale_d, int64_t num_cells,
    const torch::Tensor& bounds, const torch::Tensor& grid, const torch::Tensor& query_group,
    torch::Tensor& thread_hists, int64_t row_start, const torch::Tensor& own_index,
    const torch::Tensor& own_offsets, torch::Tensor& row_hist, const torch::Tensor& boot_lut,
    torch::Tensor& boot_hist, int64_t boot_width) {
  const int64_t R = scores.size(0), C = scores.size(1);
  const int64_t G = grid.size(0);
  const scalar_t* S = scores.data_ptr<scalar_t>();
  const scalar_t lo = static_cast<scalar_t>(lo_d);
  const scalar_t scale = static_cast<scalar_t>(scale_d);
  const scalar_t top = static_cast<scalar_t>(num_cells);
  const base_t* B = bounds.data_ptr<base_t>();
  const scalar_t* GR = grid.data_ptr<scalar_t>();
  const int64_t* QG = query_group.data_ptr<int64_t>();
  const int64_t* OI = own_index.data_ptr<int64_t>();
  const int64_t* OO = own_offsets.data_ptr<int64_t>();
  int64_t* RH = row_hist.data_ptr<int64_t>();
  const int64_t threads = thread_hists.size(0);
  const int64_t gwidth = thread_hists.size(1);
  int64_t* TH = thread_hists.data_ptr<int64_t>();
  const bool boot = boot_width > 0;
  const int64_t* BL = boot ? boot_lut.data_ptr<int64_t>() : nullptr;
  int64_t* BH = boot ? boot_hist.data_ptr<int64_t>() : nullptr;
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    int64_t* gh = TH + (at::get_thread_num() % threads) * gwidth;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t q = row_start + r;
      const scalar_t* row = S + r * C;
      int64_t* g_row = gh + QG[q] * (G + 1);
      // Own distinct positives (ascending grid positions) and this row's bins.
      const int64_t* own = OI + OO[q];
      const int64_t m = OO[q + 1] - OO[q];
      int64_t* h_row = RH + OO[q] + q;
      const int64_t own_min = m > 0 ? own[0] : G + 1;
      int64_t* b_row = boot ? BH + q * boot_width : nullptr;
      for (int64_t j = 0; j < C; ++j) {
        const scalar_t s = row[j];
        if (!(s >= lo)) continue;  // below every grid value (or -inf): counts nowhere
        scalar_t x = (s - lo) * scale;
        x = x > top ? top : x;
        // x >= 0 here, so truncation == floor (no libm call); same cell as GridLookup.cell.
        const int64_t cell = static_cast<int64_t>(x) + 1;
        int64_t g = static_cast<int64_t>(B[cell]);
        const int64_t end = static_cast<int64_t>(B[cell + 1]);
        while (g < end && GR[g] <= s) ++g;  // exact count of grid values <= s
        if (g == 0) continue;
        ++g_row[g];
        if (b_row) ++b_row[BL[g]];
        if (g > own_min) {
          // #own positions < g: linear for few positives, binary search otherwise.
          int64_t k;
          if (m <= 16) {
            k = 1;
            while (k < m && own[k] < g) ++k;
          } else {
            int64_t a = 0, b = m;
            while (a < b) {
              const int64_t mid = (a + b) >> 1;
              if (own[mid] < g) a = mid + 1; else b = mid;
            }
            k = a;
          }
          ++h_row[k];
        }
      }
    }
  });
}

void count_block(torch::Tensor scores, double lo, double scale, int64_t num_cells,
                 torch::Tensor bounds, torch::Tensor grid, torch::Tensor query_group,
                 torch::Tensor thread_hists, int64_t row_start, torch::Tensor own_index,
                 torch::Tensor own_offsets, torch::Tensor row_hist, torch::Tensor boot_lut,
                 torch::Tensor boot_hist, int64_t boot_width) {
  AT_DISPATCH_FLOATING_TYPES(scores.scalar_type(), "count_block", [&] {
    if (bounds.scalar_type() == at::kInt)
      count_impl<scalar_t, int32_t>(scores, lo, scale, num_cells, bounds, grid, query_group,
                                    thread_hists, row_start, own_index, own_offsets, row_hist,
                                    boot_lut, boot_hist, boot_width);
    else
      count_impl<scalar_t, int64_t>(scores, lo, scale, num_cells, bounds, grid, query_group,
                                    thread_hists, row_start, own_index, own_offsets, row_hist,
                                    boot_lut, boot_hist, boot_width);
  });
}
"""

_lock = threading.Lock()
_module = None
_failed = False


_NAME = "rl_gap_count_block_v3"
AUTO_BUILD_PAIRS = 1 << 27  # problems this large pay for a one-time build (~1-3 min)


def native_enabled() -> bool:
    """Whether the fused kernel may be used (``RL_GAP_NATIVE`` not ``0``, no failed build)."""
    return os.environ.get("RL_GAP_NATIVE", "auto") != "0" and not _failed


def is_built() -> bool:
    """Whether the kernel is loaded or sits compiled in torch's extension cache."""
    if _module is not None:
        return True
    try:
        from torch.utils.cpp_extension import _get_build_directory

        folder = _get_build_directory(_NAME, verbose=False)
    except Exception:  # noqa: BLE001
        return False
    return os.path.exists(os.path.join(folder, f"{_NAME}.so"))


def should_use(total_pairs: int) -> bool:
    """Policy: ``RL_GAP_NATIVE=1`` always, ``0`` never; by default when already built or
    when the problem has >= ``AUTO_BUILD_PAIRS`` pairs (so small runs and tests never
    wait for a compiler)."""
    mode = os.environ.get("RL_GAP_NATIVE", "auto")
    if mode == "0" or _failed:
        return False
    return mode == "1" or is_built() or total_pairs >= AUTO_BUILD_PAIRS


def native_kernel():
    """The compiled module (built once per machine into torch's extension cache), or None."""
    global _module, _failed
    if not native_enabled():
        return None
    with _lock:
        if _module is None and not _failed:
            try:
                from torch.utils.cpp_extension import load_inline

                _module = load_inline(
                    name=_NAME,
                    cpp_sources=[_SOURCE],
                    functions=["count_block"],
                    extra_cflags=["-O3"],
                    verbose=False,
                )
            except Exception as error:  # noqa: BLE001 - any build problem -> eager path
                _failed = True
                warnings.warn(
                    f"rl_gap native kernel unavailable ({error}); using eager ops", stacklevel=2
                )
    return _module
