// Optional CPU accelerator for the O(M) passes of the fast smoothed-AP kernel
// (rl_gap/losses/fast_sap/binning.py holds the reference torch implementation).
//
// Plain C ABI (no torch headers), loaded with ctypes by rl_gap/losses/fast_sap/native.py.
// Each function does in ONE pass over the scores what the torch path does in
// ~15 chunked elementwise passes plus scatters/gathers:
//
//   cell = clamp(floor(s / h_f - lo / h_f), -1, G_f)   (-1 also for invalid items)
//   row  = cell + 1,  t = clamp((s - (cell h_f + lo + h_f / 2)) / h_f, -1, 1)
//
// in the binning dtype T (float when the plan says float32 binning is exact),
// with the same operations in the same order as the torch path, so cells and
// offsets are bit-identical. Compiled with -ffp-contract=off (no FMA fusion).
//
// Why per-thread (and, for small tables, per-lane) moment tables: a store to a
// different cache line costs ~3 ns here whatever we do, but back-to-back
// additions into the same row form a load-add-store dependency chain; spreading
// consecutive items over `copies` replicas of the table breaks the chain.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <omp.h>

namespace {

// Runs body(tid, nth) on `threads` OpenMP threads. Loaded into a process that
// has imported torch, libgomp.so.1 resolves to torch's own copy: the library
// shares torch's worker pool (a second pool of std::threads would fight torch's
// spin-waiting workers for the cores).
template <typename F>
void parallel(int threads, F body) {
#pragma omp parallel num_threads(threads)
  body(omp_get_thread_num(), omp_get_num_threads());
}

template <typename T>
struct Grid {
  T inv_h, lo_cells, h_fine, first_centre, top;  // top = G_f (as T)
};

// Rows in the fine tables and offsets t (fine units) of a block of scores.
// Branch-free and vectorisable: `row` is int32 (G_f < 2^23), and
// floor(clamp(x, -1, top)) == clamp(floor(x), -1, top) for integer bounds, so
// clamping first keeps the integer conversion in range.
template <typename T, bool HasValid>
inline void bin_block(const T* __restrict s, const uint8_t* __restrict valid, int64_t len,
                      const Grid<T>& g, int32_t* __restrict row, T* __restrict t) {
  const T inv_h = g.inv_h, lo_cells = g.lo_cells, h_fine = g.h_fine;
  const T first_centre = g.first_centre, top = g.top;
  for (int64_t j = 0; j < len; ++j) {
    T x = s[j] * inv_h - lo_cells;
    // Written as maxps/minps patterns (a > b ? a : b): no blend sequences.
    x = x > T(-1) ? x : T(-1);
    x = x < top ? x : top;
    int32_t r = static_cast<int32_t>(x) + 1;
    r -= static_cast<T>(r - 1) > x ? 1 : 0;
    // Invalid items go to the sink row 0 (cell -1); a mask, not a branch.
    if (HasValid) r &= -static_cast<int32_t>(valid[j] != 0);
    const T centre = static_cast<T>(r - 1) * h_fine + first_centre;
    T off = (s[j] - centre) * inv_h;
    off = off > T(-1) ? off : T(-1);
    off = off < T(1) ? off : T(1);
    row[j] = r;
    t[j] = off;
  }
}

constexpr int64_t kBlock = 512;

// Splits the items evenly over the threads and hands each thread its items in
// blocks of kBlock, binned: body(tid, start, len, row, off).
template <typename T, typename Body>
void for_binned_blocks(const T* scores, const uint8_t* valid, int64_t n, Grid<T> g,
                       int threads, Body body) {
  parallel(threads, [&](int tid, int nth) {
    const int64_t per = (n + nth - 1) / nth;
    const int64_t begin = std::min(n, per * tid), end = std::min(n, begin + per);
    alignas(64) int32_t row[kBlock];
    alignas(64) T off[kBlock];
    for (int64_t start = begin; start < end; start += kBlock) {
      const int64_t len = std::min(kBlock, end - start);
      if (valid == nullptr) {
        bin_block<T, false>(scores + start, nullptr, len, g, row, off);
      } else {
        bin_block<T, true>(scores + start, valid + start, len, g, row, off);
      }
      body(tid, start, len, row, off);
    }
  });
}

template <typename T, int Order>
void moments(const T* scores, const uint8_t* valid, int64_t n, Grid<T> g, int64_t rows,
             int64_t width, int copies, double* tables, int threads) {
  const int64_t table_size = rows * width;
  for_binned_blocks(scores, valid, n, g, threads,
                    [&](int tid, int64_t, int64_t len, const int32_t* row, const T* off) {
    double* own = tables + static_cast<int64_t>(tid) * copies * table_size;
    for (int64_t j = 0; j < len; ++j) {
      // Row 0 (below the window, invalid or dropped) is never read: skipping it avoids
      // a chain of dependent additions into one row when most items land there
      // (negative dropping at rate 0.95 sends 95% of the pairs to it).
      if (row[j] == 0) continue;
      double* dst = own + (j & (copies - 1)) * table_size + row[j] * width;
      const double t = static_cast<double>(off[j]);
      // Same products as the torch path: t^k = t^(k-1) * t.
      double p[Order + 1];
      p[0] = 1.0;
      p[1] = t;
      for (int k = 2; k <= Order; ++k) p[k] = p[k - 1] * t;
      for (int k = 0; k <= Order; ++k) dst[k] += p[k];
    }
  });
}

template <typename T, int Order>
void evaluate(const T* scores, const uint8_t* valid, int64_t n, Grid<T> g, int64_t width,
              const T* table, T* out, int threads) {
  for_binned_blocks(scores, valid, n, g, threads,
                    [&](int, int64_t start, int64_t len, const int32_t* row, const T* off) {
    for (int64_t j = 0; j < len; ++j) {
      const T* c = table + static_cast<int64_t>(row[j]) * width;
      const T t = off[j];
      // Horner exactly as the torch path: c[o-1] + c[o] t, then c[k] + r t.
      T r = c[Order - 1] + c[Order] * t;
      for (int k = Order - 2; k >= 0; --k) r = c[k] + r * t;
      out[start + j] = r;
    }
  });
}

template <typename T>
void moments_any(const T* scores, const uint8_t* valid, int64_t n, const double* grid, int order,
                 int64_t rows, int64_t width, int copies, double* tables, int threads) {
  const Grid<T> g{static_cast<T>(grid[0]), static_cast<T>(grid[1]), static_cast<T>(grid[2]),
                  static_cast<T>(grid[3]), static_cast<T>(grid[4])};
  switch (order) {
    case 3: return moments<T, 3>(scores, valid, n, g, rows, width, copies, tables, threads);
    case 4: return moments<T, 4>(scores, valid, n, g, rows, width, copies, tables, threads);
    case 5: return moments<T, 5>(scores, valid, n, g, rows, width, copies, tables, threads);
    case 6: return moments<T, 6>(scores, valid, n, g, rows, width, copies, tables, threads);
    case 7: return moments<T, 7>(scores, valid, n, g, rows, width, copies, tables, threads);
    default: return;
  }
}

template <typename T>
void evaluate_any(const T* scores, const uint8_t* valid, int64_t n, const double* grid,
                  int order, int64_t width, const T* table, T* out, int threads) {
  const Grid<T> g{static_cast<T>(grid[0]), static_cast<T>(grid[1]), static_cast<T>(grid[2]),
                  static_cast<T>(grid[3]), static_cast<T>(grid[4])};
  switch (order) {
    case 3: return evaluate<T, 3>(scores, valid, n, g, width, table, out, threads);
    case 4: return evaluate<T, 4>(scores, valid, n, g, width, table, out, threads);
    case 5: return evaluate<T, 5>(scores, valid, n, g, width, table, out, threads);
    case 6: return evaluate<T, 6>(scores, valid, n, g, width, table, out, threads);
    case 7: return evaluate<T, 7>(scores, valid, n, g, width, table, out, threads);
    default: return;
  }
}

#include "native_drop.h"

}  // namespace

extern "C" {

// Keep mask of the list without its floor(rate N + 1e-9) lowest negatives (ties: lower flat
// index dropped first); valid may be null. Returns the number of dropped negatives; when it is
// 0, `keep` is left untouched.
int64_t rl_gap_fast_drop_f32(const float* scores, const uint8_t* positive, const uint8_t* valid,
                             int64_t n, double rate, uint8_t* keep, int threads) {
  return drop_lowest<float>(scores, positive, valid, n, rate, keep, threads);
}

int64_t rl_gap_fast_drop_f64(const double* scores, const uint8_t* positive, const uint8_t* valid,
                             int64_t n, double rate, uint8_t* keep, int threads) {
  return drop_lowest<double>(scores, positive, valid, n, rate, keep, threads);
}

// One digit pass of the radix select (digit [shift, shift + 16) of the order-preserving key;
// the higher digits must equal `prefix`; on the top digit prefix is ignored): counts is
// (65536,) and receives this list's histogram. Used by the sharded selection, which
// all-reduces the histograms between passes.
void rl_gap_fast_drop_histogram_f32(const float* scores, const uint8_t* positive,
                                    const uint8_t* valid, int64_t n, int shift, uint64_t prefix,
                                    uint64_t* counts, int threads) {
  digit_histogram<float>(scores, positive, valid, n, shift, prefix, counts, threads);
}

void rl_gap_fast_drop_histogram_f64(const double* scores, const uint8_t* positive,
                                    const uint8_t* valid, int64_t n, int shift, uint64_t prefix,
                                    uint64_t* counts, int threads) {
  digit_histogram<double>(scores, positive, valid, n, shift, prefix, counts, threads);
}

// keep = valid && (positive || key >= cut), minus the first `ties_to_drop` negatives keyed
// exactly cut (flat order); returns how many negatives tie at cut.
int64_t rl_gap_fast_drop_mark_f32(const float* scores, const uint8_t* positive,
                                  const uint8_t* valid, int64_t n, uint64_t cut,
                                  int64_t ties_to_drop, uint8_t* keep, int threads) {
  return mark_kept<float>(scores, positive, valid, n, cut, ties_to_drop, keep, threads);
}

int64_t rl_gap_fast_drop_mark_f64(const double* scores, const uint8_t* positive,
                                  const uint8_t* valid, int64_t n, uint64_t cut,
                                  int64_t ties_to_drop, uint8_t* keep, int threads) {
  return mark_kept<double>(scores, positive, valid, n, cut, ties_to_drop, keep, threads);
}

// Fine-expansion orders the library is instantiated for (the plan's FINE_ORDERS).
int rl_gap_sap_passes_supports(int order) { return order >= 3 && order <= 7; }

// Indices i (ascending) with positive[i] && valid[i] (valid may be null), at most
// `capacity` written; returns the total count. Scans 8 mask bytes per step:
// positives are sparse, so almost every step is one load and one test.
int64_t rl_gap_fast_select(const uint8_t* positive, const uint8_t* valid, int64_t n,
                           int64_t* out, int64_t capacity) {
  int64_t count = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word, mask = ~uint64_t(0);
    std::memcpy(&word, positive + i, 8);
    if (valid != nullptr) std::memcpy(&mask, valid + i, 8);
    if ((word & mask) == 0) continue;
    for (int64_t j = i; j < i + 8; ++j) {
      if (positive[j] && (valid == nullptr || valid[j])) {
        if (count < capacity) out[count] = j;
        ++count;
      }
    }
  }
  for (; i < n; ++i) {
    if (positive[i] && (valid == nullptr || valid[i])) {
      if (count < capacity) out[count] = i;
      ++count;
    }
  }
  return count;
}

void rl_gap_fast_moments_f32(const float* scores, const uint8_t* valid, int64_t n,
                             const double* grid, int order, int64_t rows, int64_t width,
                             int copies, double* tables, int threads) {
  moments_any<float>(scores, valid, n, grid, order, rows, width, copies, tables, threads);
}

void rl_gap_fast_moments_f64(const double* scores, const uint8_t* valid, int64_t n,
                             const double* grid, int order, int64_t rows, int64_t width,
                             int copies, double* tables, int threads) {
  moments_any<double>(scores, valid, n, grid, order, rows, width, copies, tables, threads);
}

void rl_gap_fast_evaluate_f32(const float* scores, const uint8_t* valid, int64_t n,
                              const double* grid, int order, int64_t width, const float* table,
                              float* out, int threads) {
  evaluate_any<float>(scores, valid, n, grid, order, width, table, out, threads);
}

void rl_gap_fast_evaluate_f64(const double* scores, const uint8_t* valid, int64_t n,
                              const double* grid, int order, int64_t width, const double* table,
                              double* out, int threads) {
  evaluate_any<double>(scores, valid, n, grid, order, width, table, out, threads);
}

}  // extern "C"
