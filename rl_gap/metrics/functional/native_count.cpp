// rl_gap's fused negative counter (built and loaded by native.py; the eager
// tensor path in counting.py computes the same counts and the tests compare them).
// Plain C ABI, no torch headers, so it builds in about a second; OpenMP threads.
//
// Per block row (one query), in three passes over the row's scores:
// 1. vectorised (AVX-512 or AVX2): every score gets a uniform cell; the scores
//    above the grid's lowest cell are packed (cell, value), and so are the scores
//    >= the query's lowest own positive (its own counts need only those);
// 2. the exact grid position g = #grid values <= s of each packed score from the
//    cell table (one comparison, a scan in the rare cells holding >= 2 values),
//    written to a buffer;
// 3. one histogram increment per packed score.
// Passes 2 and 3 are apart because a load here waits for the addresses of all
// older stores: an increment at a looked-up place right after each lookup chains
// every score on the lookups' latency, while stores to a buffer have their
// addresses from the start and increments from the buffer have them one load
// later. rl_gap_set_isa forces the scalar or AVX2 path (the tests run each).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kDirectOwn = 64;  // rows with more own positives search per score
constexpr int64_t kStrip = 32;      // columns transposed at once (32 x R scores per thread)
constexpr uint32_t kCrowded = 0x80000000u;

// The cell table holds, per uniform cell of the score axis, the number of grid
// values in lower cells (4 bytes: the table stays cache-resident longer), with
// kCrowded set when the cell holds >= 2 values. The grid is padded with +inf, so
// grid[base] is the cell's first value, or a larger one when the cell is empty.
// Monotone score -> cell map; any monotone map is exact because the cell's own
// values are compared exactly. s >= lo gives a cell >= 1 (fl(s - lo) >= 0), so
// cell 0 holds only scores below every grid value. The top is clamped in floating
// point (minss), the bottom as an integer: a floating-point max(x, 0) compiled to
// a branch mispredicted on half the scores (8x slower). -inf -> INT32_MIN -> 0.
template <typename T>
struct CellMap {
  T lo, scale, top;
  int32_t operator()(T s) const {
    const T x = (s - lo) * scale + T(1);
    return std::max(static_cast<int32_t>(std::min(x, top)), int32_t(0));
  }
};

// ---- scalar primitives (and the double path)

// Scores with cell > 0: their index, cell and value, packed; returns how many.
// The scores >= own (all a query's own positives count) go to cand, *num_cand
// of them. (idx may be null: positions not needed.)
template <typename T>
int64_t compact_cells_scalar(const T* row, int64_t n, int64_t offset, const CellMap<T>& map,
                             T own, int32_t* idx, int32_t* cell, T* val, T* cand,
                             int64_t* num_cand) {
  int64_t kept = 0, nc = 0;
  for (int64_t j = 0; j < n; ++j) {  // branch-free: always write, advance if kept
    const int32_t c = map(row[j]);
    if (idx) idx[kept] = static_cast<int32_t>(offset + j);
    cell[kept] = c;
    val[kept] = row[j];
    kept += c > 0;
    cand[nc] = row[j];
    nc += row[j] >= own;
  }
  *num_cand = nc;
  return kept;
}

template <typename T>
int64_t compact_ge_scalar(const T* row, int64_t n, T v, T* val) {
  int64_t kept = 0;
  for (int64_t j = 0; j < n; ++j) {
    val[kept] = row[j];
    kept += row[j] >= v;
  }
  return kept;
}

template <typename T>
int64_t count_ge_scalar(const T* row, int64_t n, T v) {
  int64_t count = 0;
  for (int64_t j = 0; j < n; ++j) count += row[j] >= v;
  return count;
}

// Columns [c0, c0 + width) of the (R, C) block S into rows of out (width x R).
template <typename T>
void transpose_scalar(const T* S, int64_t R, int64_t C, int64_t c0, int64_t width, T* out) {
  for (int64_t i0 = 0; i0 < R; i0 += 8) {  // 8 x 8 tiles: reads and writes stay in cache
    const int64_t i1 = std::min(R, i0 + 8);
    for (int64_t w0 = 0; w0 < width; w0 += 8) {
      const int64_t w1 = std::min(width, w0 + 8);
      for (int64_t w = w0; w < w1; ++w)
        for (int64_t i = i0; i < i1; ++i) out[w * R + i] = S[i * C + c0 + w];
    }
  }
}

#include "native_count_simd.h"

// ---- dispatch: 0 scalar, 1 AVX2, 2 AVX-512 (the best this CPU runs, or lower)

int detect_isa() {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("popcnt")) return 0;
  return __builtin_cpu_supports("avx512f") ? 2 : 1;
}
const int kBestIsa = detect_isa();
int g_isa = kBestIsa;

int64_t compact_cells(const float* row, int64_t n, const CellMap<float>& map, float own,
                      int32_t* idx, int32_t* cell, float* val, float* cand, int64_t* num_cand) {
  if (g_isa >= 2) return compact_cells_avx512(row, n, map, own, idx, cell, val, cand, num_cand);
  if (g_isa == 1) return compact_cells_avx2(row, n, map, own, idx, cell, val, cand, num_cand);
  return compact_cells_scalar(row, n, 0, map, own, idx, cell, val, cand, num_cand);
}
int64_t compact_cells(const double* row, int64_t n, const CellMap<double>& map, double own,
                      int32_t* idx, int32_t* cell, double* val, double* cand,
                      int64_t* num_cand) {
  return compact_cells_scalar(row, n, 0, map, own, idx, cell, val, cand, num_cand);
}
int64_t compact_ge(const float* row, int64_t n, float v, float* val) {
  if (g_isa >= 2) return compact_ge_avx512(row, n, v, val);
  return g_isa == 1 ? compact_ge_avx2(row, n, v, val) : compact_ge_scalar(row, n, v, val);
}
int64_t compact_ge(const double* row, int64_t n, double v, double* val) {
  return compact_ge_scalar(row, n, v, val);
}
int64_t count_ge(const float* row, int64_t n, float v) {
  return g_isa >= 1 ? count_ge_avx2(row, n, v) : count_ge_scalar(row, n, v);
}
int64_t count_ge(const double* row, int64_t n, double v) { return count_ge_scalar(row, n, v); }
void transpose(const float* S, int64_t R, int64_t C, int64_t c0, int64_t width, float* out) {
  g_isa >= 1 ? transpose_avx2(S, R, C, c0, width, out)
             : transpose_scalar(S, R, C, c0, width, out);
}
void transpose(const double* S, int64_t R, int64_t C, int64_t c0, int64_t width, double* out) {
  transpose_scalar(S, R, C, c0, width, out);
}

// ---- the counter

template <typename T>
void build_impl(const T* GR, int64_t G, int64_t num_cells, uint32_t* table, T* lo_scale) {
  const T lo = GR[0];
  const double span = static_cast<double>(GR[G - 1]) - static_cast<double>(GR[0]);
  T scale = static_cast<T>(span > 0 ? num_cells / span : 1.0);
  if (!std::isfinite(scale) || !(scale > 0)) scale = T(1);
  const CellMap<T> map{lo, scale, static_cast<T>(num_cells + 1)};
  std::vector<int64_t> count(num_cells + 2, 0);
  for (int64_t i = 0; i < G; ++i) ++count[map(GR[i])];
  int64_t base = 0;
  for (int64_t c = 0; c < num_cells + 2; ++c) {
    table[c] = static_cast<uint32_t>(base) | (count[c] >= 2 ? kCrowded : 0u);
    base += count[c];
  }
  lo_scale[0] = lo;
  lo_scale[1] = scale;
}

template <typename T>
struct Problem {
  CellMap<T> map;
  const uint32_t* table;
  const T* GR;  // grid (G ascending distinct values, then +inf)
  int64_t G;
  const int64_t* QG;  // query -> group
  int64_t* TH;        // (threads, gwidth) int64 global histograms
  int64_t gwidth;
  const int64_t *OI, *OO;  // own distinct positives (grid positions), CSR by query
  int64_t* RH;             // per-query own bins
  const int64_t* BL;       // grid position -> bootstrap bin
  int64_t* BH;             // (Q, boot_width) bootstrap histograms
  int64_t boot_width;
  int32_t global_weight;  // 0: per-query counts only; 2: the block stands for its transpose too
  int64_t mirror_start;   // >= 0: each score also counts for column query mirror_start + j
};

// Per-thread buffers for rows of n scores (+16: vector stores past the packed end).
template <typename T>
struct Scratch {
  std::vector<int32_t> local, idx, cell, gpos, g, busy;
  std::vector<T> val, cand;
  Scratch(int64_t gwidth, int64_t n)
      : local(gwidth, 0), idx(n + 16), cell(n + 16), gpos(n), g(n + 16), busy(n + 16),
        val(n + 16), cand(n + 16) {}
};

// Pass 2: the grid positions g[k] of `kept` packed scores. Stores go to a buffer
// (addresses known up front), so no lookup waits on an earlier one; crowded cells
// are listed and scanned after.
template <typename T>
void lookup(const Problem<T>& p, const int32_t* cell, const T* val, int64_t kept, int32_t* g,
            int32_t* busy) {
  int64_t num_busy = 0;
  for (int64_t k = 0; k < kept; ++k) {
    const uint32_t t = p.table[cell[k]];
    const uint32_t base = t & ~kCrowded;
    g[k] = static_cast<int32_t>(base + (val[k] >= p.GR[base]));
    busy[num_busy] = static_cast<int32_t>(k);
    num_busy += t >> 31;
  }
  for (int64_t i = 0; i < num_busy; ++i) {
    const int64_t k = busy[i];
    while (g[k] < p.G && p.GR[g[k]] <= val[k]) ++g[k];
  }
}

// Pass 3: global histogram increments of the packed scores (bin 0, rounding at
// lo, is never read). A mirrored pair (column query j, this row) has the same
// score: one increment of 2 when both queries share a group (the usual case).
template <typename T>
void increment(const Problem<T>& p, int64_t q, const int32_t* g, const int32_t* idx,
               int64_t kept, int32_t* local) {
  const int64_t row_group = p.QG[q] * (p.G + 1);
  if (p.mirror_start < 0) {
    int32_t* hist = local + row_group;
    const int32_t w = p.global_weight;
    for (int64_t k = 0; k < kept; ++k) hist[g[k]] += w;
    return;
  }
  const int64_t* column_group = p.QG + p.mirror_start;
  for (int64_t k = 0; k < kept; ++k) {
    const int64_t cg = column_group[idx[k]] * (p.G + 1);
    if (cg == row_group) {
      local[row_group + g[k]] += 2;
    } else {
      ++local[row_group + g[k]];
      ++local[cg + g[k]];
    }
  }
}

// Counts one row: the negatives of query q (n scores; excluded pairs hold -inf).
template <typename T>
void count_row(const Problem<T>& p, const T* row, int64_t n, int64_t q, Scratch<T>& scratch) {
  const int64_t* own = p.OI + p.OO[q];
  const int64_t m = p.OO[q + 1] - p.OO[q];
  const bool need_g = p.boot_width > 0 || m > kDirectOwn;  // g of every score
  const T own_min = m > 0 ? p.GR[own[0]] : static_cast<T>(INFINITY);
  int32_t* gp = scratch.gpos.data();
  T* cand = scratch.cand.data();
  int64_t candidates = 0;  // cand[0, candidates) holds every score >= own_min
  if (p.global_weight > 0 || need_g) {
    // Positions are needed for g per score and for the mirrored queries' groups.
    const bool mirror = p.global_weight > 0 && p.mirror_start >= 0;
    int32_t* idx = need_g || mirror ? scratch.idx.data() : nullptr;
    int32_t* g = scratch.g.data();
    const int64_t kept = compact_cells(row, n, p.map, own_min, idx, scratch.cell.data(),
                                       scratch.val.data(), cand, &candidates);
    lookup(p, scratch.cell.data(), scratch.val.data(), kept, g, scratch.busy.data());
    if (need_g) {
      std::fill(gp, gp + n, 0);
      for (int64_t k = 0; k < kept; ++k) gp[idx[k]] = g[k];
    }
    if (p.global_weight > 0) increment(p, q, g, idx, kept, scratch.local.data());
  } else if (m > 0) {
    candidates = compact_ge(row, n, own_min, cand);
  }
  if (p.boot_width > 0) {
    int64_t* b_row = p.BH + q * p.boot_width;
    for (int64_t j = 0; j < n; ++j) ++b_row[p.BL[gp[j]]];
  }
  // The query's own distinct positives: bin k = negatives >= exactly k of them.
  if (m == 0) return;
  int64_t* h_row = p.RH + p.OO[q] + q;
  if (m <= kDirectOwn) {
    int64_t above[kDirectOwn];
    for (int64_t t = 0; t < m; ++t) above[t] = count_ge(cand, candidates, p.GR[own[t]]);
    for (int64_t t = 0; t + 1 < m; ++t) h_row[t + 1] += above[t] - above[t + 1];
    h_row[m] += above[m - 1];
    return;
  }
  const int64_t own_lowest = own[0];  // grid position
  for (int64_t j = 0; j < n; ++j) {
    const int64_t g = gp[j];
    if (g <= own_lowest) continue;
    int64_t a = 0, b = m;  // #own positions < g
    while (a < b) {
      const int64_t mid = (a + b) >> 1;
      if (own[mid] < g) a = mid + 1; else b = mid;
    }
    ++h_row[a];
  }
}

// 32-bit counts per call (a call adds < 2^31 per bin), flushed into the thread's
// 64-bit histogram: half the cache footprint of 64-bit bins.
template <typename T>
void flush(const Problem<T>& p, Scratch<T>& scratch) {
  if (p.global_weight == 0) return;
  int64_t* out = p.TH + omp_get_thread_num() * p.gwidth;
  for (int64_t i = 0; i < p.gwidth; ++i) out[i] += scratch.local[i];
}

// Rows of the (R, C) block are queries first_query, first_query + 1, ...
template <typename T>
void count_rows(const Problem<T>& p, const T* S, int64_t R, int64_t C, int64_t first_query,
                int num_threads) {
#pragma omp parallel num_threads(num_threads)
  {
    Scratch<T> scratch(p.global_weight > 0 ? p.gwidth : 0, C);
#pragma omp for schedule(dynamic, 16)
    for (int64_t r = 0; r < R; ++r) {
      // The hardware prefetcher falls behind the row stream between the lookups
      // (measured ~6% of the kernel): fetch the next row while this one is counted.
      if (r + 1 < R) {
        const char* next = reinterpret_cast<const char*>(S + (r + 1) * C);
        for (int64_t b = 0; b < C * static_cast<int64_t>(sizeof(T)); b += 64)
          _mm_prefetch(next + b, _MM_HINT_T0);
      }
      count_row(p, S + r * C, C, first_query + r, scratch);
    }
    flush(p, scratch);
  }
}

// Columns of the (R, C) block are the queries: strips of columns are transposed
// into a thread buffer in 8 x 8 tiles (a cache line written per 8 scores, not per
// score) and counted as rows.
template <typename T>
void count_columns(const Problem<T>& p, const T* S, int64_t R, int64_t C, int64_t first_query,
                   int num_threads) {
  const int64_t strips = (C + kStrip - 1) / kStrip;
#pragma omp parallel num_threads(num_threads)
  {
    Scratch<T> scratch(p.global_weight > 0 ? p.gwidth : 0, R);
    std::vector<T> buffer(kStrip * R);
#pragma omp for schedule(dynamic, 16)
    for (int64_t strip = 0; strip < strips; ++strip) {
      const int64_t c0 = strip * kStrip, width = std::min(kStrip, C - c0);
      transpose(S, R, C, c0, width, buffer.data());
      for (int64_t w = 0; w < width; ++w)
        count_row(p, buffer.data() + w * R, R, first_query + c0 + w, scratch);
    }
    flush(p, scratch);
  }
}

}  // namespace

#define RL_GAP_EXPORT(SUFFIX, T)                                                               \
  extern "C" void rl_gap_build_##SUFFIX(const T* GR, int64_t G, int64_t num_cells, void* table, \
                                        T* lo_scale) {                                          \
    build_impl<T>(GR, G, num_cells, static_cast<uint32_t*>(table), lo_scale);                  \
  }                                                                                             \
  extern "C" void rl_gap_count_##SUFFIX(                                                        \
      const T* S, int64_t R, int64_t C, int32_t transposed, const T* lo_scale,                 \
      int64_t num_cells, const void* table, const T* GR, int64_t G, const int64_t* QG,          \
      int64_t* TH, int64_t gwidth, int64_t first_query, const int64_t* OI, const int64_t* OO,   \
      int64_t* RH, const int64_t* BL, int64_t* BH, int64_t boot_width, int32_t global_weight,   \
      int64_t mirror_start, int num_threads) {                                                  \
    const Problem<T> p{{lo_scale[0], lo_scale[1], static_cast<T>(num_cells + 1)},              \
                       static_cast<const uint32_t*>(table), GR, G, QG, TH, gwidth, OI, OO,     \
                       RH,                                                                      \
                       BL, BH, boot_width, global_weight, mirror_start};                        \
    if (transposed)                                                                             \
      count_columns(p, S, R, C, first_query, num_threads);                                      \
    else                                                                                        \
      count_rows(p, S, R, C, first_query, num_threads);                                         \
  }
RL_GAP_EXPORT(f32, float)
RL_GAP_EXPORT(f64, double)

// Forces the scalar (0) or AVX2 (1) path, or the AVX-512 one (2) where the CPU has
// it; < 0: the best available. Returns the level now in use (the tests run each).
extern "C" int rl_gap_set_isa(int level) {
  g_isa = level < 0 ? kBestIsa : std::min(level, kBestIsa);
  return g_isa;
}
