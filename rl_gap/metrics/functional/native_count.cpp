// rl_gap's fused negative counter (built and loaded by native.py; the eager
// tensor path in counting.py computes the same counts and the tests compare them).
// Plain C ABI, no torch headers, so it builds in about a second; OpenMP threads.
//
// Per block row (one query): every score gets a uniform cell (AVX2); scores above
// the grid's lowest cell are compacted and get their exact grid position
// g = #grid values <= s from the cell table (one comparison, a short scan in the
// rare cells holding >= 2 values) and one histogram increment; the query's own
// positives are counted by direct vectorised comparisons.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kDirectOwn = 64;  // rows with more own positives search per element
constexpr uint32_t kCrowded = 0x80000000u;

// One uniform cell of the score axis: the grid values below it and its first value.
template <typename T>
struct Cell {
  uint32_t base;  // #grid values in lower cells; top bit set: the cell holds >= 2 values
  T first;        // smallest grid value in the cell, +inf if it holds none
};

// Monotone score -> cell map; any monotone map is exact because the cell's own
// values are compared exactly. The top is clamped in floating point (minss) and
// the bottom as an integer: a floating-point max(x, 0) compiles to a branch that
// is mispredicted on half the scores (measured 8x slower). -inf -> INT32_MIN -> 0.
template <typename T>
struct CellMap {
  T lo, scale, top;
  int32_t operator()(T s) const {
    const T x = (s - lo) * scale + T(1);
    return std::max(static_cast<int32_t>(std::min(x, top)), int32_t(0));
  }
};

template <typename T>
void cells_scalar(const T* row, int64_t n, const CellMap<T>& map, int32_t* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = map(row[j]);
}

template <typename T>
int64_t count_ge_scalar(const T* row, int64_t n, T v) {
  int64_t count = 0;
  for (int64_t j = 0; j < n; ++j) count += row[j] >= v;
  return count;
}

// AVX2 twins for float32 (same IEEE operations, so the same cells and counts).
__attribute__((target("avx2"))) void cells_avx2(const float* row, int64_t n,
                                                const CellMap<float>& map, int32_t* out) {
  const __m256 lo = _mm256_set1_ps(map.lo), scale = _mm256_set1_ps(map.scale);
  const __m256 one = _mm256_set1_ps(1.0f), top = _mm256_set1_ps(map.top);
  const __m256i zero = _mm256_setzero_si256();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 x = _mm256_sub_ps(_mm256_loadu_ps(row + j), lo);
    x = _mm256_add_ps(_mm256_mul_ps(x, scale), one);
    const __m256i c = _mm256_cvttps_epi32(_mm256_min_ps(x, top));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), _mm256_max_epi32(c, zero));
  }
  cells_scalar(row + j, n - j, map, out + j);
}

__attribute__((target("avx2"))) int64_t count_ge_avx2(const float* row, int64_t n, float v) {
  const __m256 value = _mm256_set1_ps(v);
  __m256i acc = _mm256_setzero_si256();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 ge = _mm256_cmp_ps(_mm256_loadu_ps(row + j), value, _CMP_GE_OQ);
    acc = _mm256_sub_epi32(acc, _mm256_castps_si256(ge));  // mask lanes are -1
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
  int64_t count = 0;
  for (int k = 0; k < 8; ++k) count += lanes[k];
  return count + count_ge_scalar(row + j, n - j, v);
}

const bool kAvx2 = __builtin_cpu_supports("avx2");

void cells(const float* row, int64_t n, const CellMap<float>& map, int32_t* out) {
  kAvx2 ? cells_avx2(row, n, map, out) : cells_scalar(row, n, map, out);
}
void cells(const double* row, int64_t n, const CellMap<double>& map, int32_t* out) {
  cells_scalar(row, n, map, out);
}
int64_t count_ge(const float* row, int64_t n, float v) {
  return kAvx2 ? count_ge_avx2(row, n, v) : count_ge_scalar(row, n, v);
}
int64_t count_ge(const double* row, int64_t n, double v) { return count_ge_scalar(row, n, v); }

template <typename T>
void build_impl(const T* GR, int64_t G, int64_t num_cells, Cell<T>* table, T* lo_scale) {
  const T lo = GR[0];
  const double span = static_cast<double>(GR[G - 1]) - static_cast<double>(GR[0]);
  T scale = static_cast<T>(span > 0 ? num_cells / span : 1.0);
  if (!std::isfinite(scale) || !(scale > 0)) scale = T(1);
  const CellMap<T> map{lo, scale, static_cast<T>(num_cells + 1)};
  std::vector<int64_t> count(num_cells + 2, 0);
  for (int64_t i = 0; i < G; ++i) ++count[map(GR[i])];
  int64_t base = 0;
  for (int64_t c = 0; c < num_cells + 2; ++c) {
    table[c].base = static_cast<uint32_t>(base) | (count[c] >= 2 ? kCrowded : 0u);
    table[c].first = count[c] > 0 ? GR[base] : std::numeric_limits<T>::infinity();
    base += count[c];
  }
  lo_scale[0] = lo;
  lo_scale[1] = scale;
}

template <typename T>
void count_impl(const T* S, int64_t R, int64_t C, const T* lo_scale, int64_t num_cells,
                const Cell<T>* table, const T* GR, int64_t G, const int64_t* QG, int64_t* TH,
                int64_t gwidth, int64_t row_start, const int64_t* OI, const int64_t* OO,
                int64_t* RH, const int64_t* BL, int64_t* BH, int64_t boot_width,
                int32_t global_weight, int num_threads) {
  const CellMap<T> map{lo_scale[0], lo_scale[1], static_cast<T>(num_cells + 1)};
#pragma omp parallel num_threads(num_threads)
  {
    // 32-bit counts per call (a block holds < 2^30 pairs), flushed into this
    // thread's 64-bit histogram at the end: half the cache footprint.
    std::vector<int32_t> local(global_weight > 0 ? gwidth : 0, 0);
    std::vector<int32_t> cell_of(C), above_lo(C), gpos(C);
    int32_t* gp = gpos.data();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t q = row_start + r;
      const T* row = S + r * C;
      const int64_t* own = OI + OO[q];
      const int64_t m = OO[q + 1] - OO[q];
      // g = #grid values <= s is needed per element for the global histogram,
      // the bootstrap and long own lists; short own lists compare directly.
      const bool per_element = global_weight > 0 || boot_width > 0 || m > kDirectOwn;
      if (per_element) {
        cells(row, C, map, cell_of.data());
        // Scores in cell 0 lie below every grid value (g = 0, counted nowhere):
        // compact the others (branch-free) so only they pay for the lookup and
        // the histogram increment (a scattered store costs ~3 ns here).
        int64_t n = 0;
        for (int64_t j = 0; j < C; ++j) {
          above_lo[n] = static_cast<int32_t>(j);
          n += cell_of[j] > 0;
        }
        if (boot_width > 0 || m > kDirectOwn) std::fill(gp, gp + C, 0);
        int32_t* hist = global_weight > 0 ? local.data() + QG[q] * (G + 1) : nullptr;
        for (int64_t k = 0; k < n; ++k) {
          const int64_t j = above_lo[k];
          const T s = row[j];
          const Cell<T>& cell = table[cell_of[j]];
          int64_t g = static_cast<int64_t>(cell.base & ~kCrowded) + (s >= cell.first);
          if (__builtin_expect((cell.base & kCrowded) != 0, 0)) {
            while (g < G && GR[g] <= s) ++g;
          }
          gp[j] = static_cast<int32_t>(g);
          if (hist) hist[g] += global_weight;  // bin 0 (rounding at lo) is never read
        }
      }
      if (boot_width > 0) {
        int64_t* b_row = BH + q * boot_width;
        for (int64_t j = 0; j < C; ++j) ++b_row[BL[gp[j]]];
      }
      // This query's own distinct positives: bin k = negatives >= exactly k of them.
      if (m == 0) continue;
      int64_t* h_row = RH + OO[q] + q;
      if (m <= kDirectOwn) {
        int64_t above[kDirectOwn];
        for (int64_t t = 0; t < m; ++t) above[t] = count_ge(row, C, GR[own[t]]);
        for (int64_t t = 0; t + 1 < m; ++t) h_row[t + 1] += above[t] - above[t + 1];
        h_row[m] += above[m - 1];
      } else {
        const int64_t own_min = own[0];
        for (int64_t j = 0; j < C; ++j) {
          const int64_t g = gp[j];
          if (g <= own_min) continue;
          int64_t a = 0, b = m;  // #own positions < g
          while (a < b) {
            const int64_t mid = (a + b) >> 1;
            if (own[mid] < g) a = mid + 1; else b = mid;
          }
          ++h_row[a];
        }
      }
    }
    if (global_weight > 0) {
      int64_t* out = TH + omp_get_thread_num() * gwidth;
      for (int64_t i = 0; i < gwidth; ++i) out[i] += local[i];
    }
  }
}

}  // namespace

extern "C" int64_t rl_gap_cell_bytes(int is_double) {
  return is_double ? sizeof(Cell<double>) : sizeof(Cell<float>);
}

#define RL_GAP_EXPORT(SUFFIX, T)                                                               \
  extern "C" void rl_gap_build_##SUFFIX(const T* GR, int64_t G, int64_t num_cells, void* table, \
                                        T* lo_scale) {                                          \
    build_impl<T>(GR, G, num_cells, static_cast<Cell<T>*>(table), lo_scale);                   \
  }                                                                                             \
  extern "C" void rl_gap_count_##SUFFIX(                                                        \
      const T* S, int64_t R, int64_t C, const T* lo_scale, int64_t num_cells, const void* table, \
      const T* GR, int64_t G, const int64_t* QG, int64_t* TH, int64_t gwidth, int64_t row_start, \
      const int64_t* OI, const int64_t* OO, int64_t* RH, const int64_t* BL, int64_t* BH,        \
      int64_t boot_width, int32_t global_weight, int num_threads) {                             \
    count_impl<T>(S, R, C, lo_scale, num_cells, static_cast<const Cell<T>*>(table), GR, G, QG,  \
                  TH, gwidth, row_start, OI, OO, RH, BL, BH, boot_width, global_weight,         \
                  num_threads);                                                                 \
  }
RL_GAP_EXPORT(f32, float)
RL_GAP_EXPORT(f64, double)
