// AVX2 and AVX-512 twins of native_count.cpp's scalar packing, counting and
// transposes for float32: the same IEEE operations, so the same cells and counts
// (the tests compare every path with the eager one). Included by native_count.cpp
// inside its namespace, after the scalar primitives the tails fall back to.
#pragma once

// ---- AVX2 twins for float32 (the same IEEE operations: same cells and counts)

// Lane permutation that packs the lanes selected by an 8-bit mask to the front.
struct CompactLut {
  alignas(32) int32_t lanes[256][8];
  CompactLut() {
    for (int mask = 0; mask < 256; ++mask) {
      int k = 0;
      for (int lane = 0; lane < 8; ++lane)
        if (mask >> lane & 1) lanes[mask][k++] = lane;
      for (; k < 8; ++k) lanes[mask][k] = 0;
    }
  }
};
const CompactLut kLut;

// Loads of a few chunks come before their packed stores (whose addresses depend on
// the data): see the top of native_count.cpp for why that order matters.
constexpr int kChunks = 4;

__attribute__((target("avx2,popcnt"))) int64_t compact_cells_avx2(
    const float* row, int64_t n, const CellMap<float>& map, float own, int32_t* idx,
    int32_t* cell, float* val, float* cand, int64_t* num_cand) {
  const __m256 lo = _mm256_set1_ps(map.lo), scale = _mm256_set1_ps(map.scale);
  const __m256 one = _mm256_set1_ps(1.0f), top = _mm256_set1_ps(map.top);
  const __m256 own_min = _mm256_set1_ps(own);
  const __m256i zero = _mm256_setzero_si256(), lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  int64_t kept = 0, nc = 0, j = 0;
  for (; j + 8 * kChunks <= n; j += 8 * kChunks) {
    __m256 s[kChunks];
    __m256i c[kChunks];
    int mask[kChunks], above[kChunks];
    for (int u = 0; u < kChunks; ++u) {
      s[u] = _mm256_loadu_ps(row + j + 8 * u);
      const __m256 x = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(s[u], lo), scale), one);
      c[u] = _mm256_max_epi32(_mm256_cvttps_epi32(_mm256_min_ps(x, top)), zero);
      mask[u] = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(c[u], zero)));
      above[u] = _mm256_movemask_ps(_mm256_cmp_ps(s[u], own_min, _CMP_GE_OQ));
    }
    for (int u = 0; u < kChunks; ++u) {
      const __m256i perm =
          _mm256_load_si256(reinterpret_cast<const __m256i*>(kLut.lanes[mask[u]]));
      const __m256i at =
          _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(j + 8 * u)), lane);
      if (idx)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + kept),
                            _mm256_permutevar8x32_epi32(at, perm));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(cell + kept),
                          _mm256_permutevar8x32_epi32(c[u], perm));
      _mm256_storeu_ps(val + kept, _mm256_permutevar8x32_ps(s[u], perm));
      kept += _mm_popcnt_u32(static_cast<unsigned>(mask[u]));
      const __m256i up =
          _mm256_load_si256(reinterpret_cast<const __m256i*>(kLut.lanes[above[u]]));
      _mm256_storeu_ps(cand + nc, _mm256_permutevar8x32_ps(s[u], up));
      nc += _mm_popcnt_u32(static_cast<unsigned>(above[u]));
    }
  }
  int64_t tail = 0;
  kept += compact_cells_scalar(row + j, n - j, j, map, own, idx ? idx + kept : nullptr,
                               cell + kept, val + kept, cand + nc, &tail);
  *num_cand = nc + tail;
  return kept;
}

__attribute__((target("avx2,popcnt"))) int64_t compact_ge_avx2(const float* row, int64_t n,
                                                               float v, float* val) {
  const __m256 value = _mm256_set1_ps(v);
  int64_t kept = 0, j = 0;
  for (; j + 8 * kChunks <= n; j += 8 * kChunks) {
    __m256 s[kChunks];
    int mask[kChunks];
    for (int u = 0; u < kChunks; ++u) {
      s[u] = _mm256_loadu_ps(row + j + 8 * u);
      mask[u] = _mm256_movemask_ps(_mm256_cmp_ps(s[u], value, _CMP_GE_OQ));
    }
    for (int u = 0; u < kChunks; ++u) {
      const __m256i perm =
          _mm256_load_si256(reinterpret_cast<const __m256i*>(kLut.lanes[mask[u]]));
      _mm256_storeu_ps(val + kept, _mm256_permutevar8x32_ps(s[u], perm));
      kept += _mm_popcnt_u32(static_cast<unsigned>(mask[u]));
    }
  }
  return kept + compact_ge_scalar(row + j, n - j, v, val + kept);
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

__attribute__((target("avx2"))) void transpose_avx2(const float* S, int64_t R, int64_t C,
                                                    int64_t c0, int64_t width, float* out) {
  const int64_t full_rows = R / 8 * 8, full_cols = width / 8 * 8;
  for (int64_t i0 = 0; i0 < full_rows; i0 += 8) {
    for (int64_t w0 = 0; w0 < full_cols; w0 += 8) {
      const float* src = S + i0 * C + c0 + w0;
      __m256 r[8], t[8];
      for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(src + k * C);
      for (int k = 0; k < 8; k += 2) {
        t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
        t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
      }
      for (int k = 0; k < 8; k += 4) {
        r[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
      }
      float* dst = out + w0 * R + i0;
      for (int k = 0; k < 4; ++k) {
        _mm256_storeu_ps(dst + k * R, _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
        _mm256_storeu_ps(dst + (k + 4) * R, _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
      }
    }
  }
  // Ragged edges: the last rows of every column, the last columns of the full rows.
  for (int64_t w = 0; w < width; ++w)
    for (int64_t i = full_rows; i < R; ++i) out[w * R + i] = S[i * C + c0 + w];
  for (int64_t w = full_cols; w < width; ++w)
    for (int64_t i = 0; i < full_rows; ++i) out[w * R + i] = S[i * C + c0 + w];
}

// ---- AVX-512 (float32): 16 scores per step, packed with vpcompress

// A row's tail (n - j < 16 lanes) is read with a masked load, the rest without:
// a masked load costs ~5x a plain one on this CPU (Zen 5).
__attribute__((target("avx512f"))) inline __m512 load_avx512(const float* row, int64_t j,
                                                             int64_t n, __mmask16* in) {
  if (n - j >= 16) {
    *in = 0xFFFF;
    return _mm512_loadu_ps(row + j);
  }
  *in = static_cast<__mmask16>((1u << (n - j)) - 1);
  return _mm512_maskz_loadu_ps(*in, row + j);
}

// compact_cells_scalar's packing, 16 scores a step (buffers of n + 16).
__attribute__((target("avx512f,popcnt"))) int64_t compact_cells_avx512(
    const float* row, int64_t n, const CellMap<float>& map, float own, int32_t* idx,
    int32_t* cell, float* val, float* cand, int64_t* num_cand) {
  const __m512 lo = _mm512_set1_ps(map.lo), scale = _mm512_set1_ps(map.scale);
  const __m512 one = _mm512_set1_ps(1.0f), top = _mm512_set1_ps(map.top);
  const __m512 own_min = _mm512_set1_ps(own);
  const __m512i zero = _mm512_setzero_si512();
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t kept = 0, nc = 0;
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 in;
    const __m512 s = load_avx512(row, j, n, &in);
    const __m512 x = _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(s, lo), scale), one);
    const __m512i c = _mm512_max_epi32(_mm512_cvttps_epi32(_mm512_min_ps(x, top)), zero);
    const __mmask16 k = _mm512_mask_cmpgt_epi32_mask(in, c, zero);
    const __mmask16 above = _mm512_mask_cmp_ps_mask(in, s, own_min, _CMP_GE_OQ);
    _mm512_storeu_si512(cell + kept, _mm512_maskz_compress_epi32(k, c));
    _mm512_storeu_ps(val + kept, _mm512_maskz_compress_ps(k, s));
    if (idx) {
      const __m512i at = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(j)), lane);
      _mm512_storeu_si512(idx + kept, _mm512_maskz_compress_epi32(k, at));
    }
    kept += _mm_popcnt_u32(k);
    _mm512_storeu_ps(cand + nc, _mm512_maskz_compress_ps(above, s));
    nc += _mm_popcnt_u32(above);
  }
  *num_cand = nc;
  return kept;
}

__attribute__((target("avx512f,popcnt"))) int64_t compact_ge_avx512(const float* row,
                                                                   int64_t n, float v,
                                                                   float* val) {
  const __m512 value = _mm512_set1_ps(v);
  int64_t kept = 0;
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 in;
    const __m512 s = load_avx512(row, j, n, &in);
    const __mmask16 above = _mm512_mask_cmp_ps_mask(in, s, value, _CMP_GE_OQ);
    _mm512_storeu_ps(val + kept, _mm512_maskz_compress_ps(above, s));
    kept += _mm_popcnt_u32(above);
  }
  return kept;
}
