// Negative dropping for native_sap_passes.cpp: the radix select of the k-th smallest
// negative and the keep mask (the single-process drop, and the histogram and marking
// passes the sharded select in rl_gap/losses/sharding/drop.py runs between its
// all-reduces). Included by native_sap_passes.cpp inside its namespace, after its
// parallel() helper.
#pragma once

// ---- Negative dropping: keep mask of the list without its floor(rate N) lowest negatives ----
//
// The dropped set is the first k = floor(rate N + 1e-9) negatives (valid, not positive) in
// ascending (score, flat index) order, exactly as rl_gap.losses.common.drop_lowest_negatives
// selects them (a stable argsort), found without sorting:
//   1. radix select of the k-th smallest score over order-preserving integer keys, 16 bits
//      per pass (2 passes for float, 4 for double): per-thread histograms of the next digit
//      of the negatives that share the prefix found so far;
//   2. one pass writing keep = valid && (positive || key >= v) and counting, per thread,
//      the negatives tied at v (the first few positions recorded);
//   3. the first `rank` tied negatives in flat order (rank = k − #{key < v}) are unmarked.
// Keys: -0.0 is mapped to +0.0 (x + 0 in round-to-nearest), so the two zeros tie, as they
// do under IEEE comparison; NaN never reaches here (the callers reject it).

inline uint32_t sort_key(float x) {
  x = x + 0.0f;
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

inline uint64_t sort_key(double x) {
  x = x + 0.0;
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x8000000000000000ull) ? ~u : (u | 0x8000000000000000ull);
}

constexpr int kDigitBits = 16;
constexpr int64_t kBins = int64_t(1) << kDigitBits;
constexpr int kTieRecords = 64;

inline bool is_negative(const uint8_t* positive, const uint8_t* valid, int64_t j) {
  return !positive[j] && (valid == nullptr || valid[j]);
}

// One digit pass of the radix select: counts[b] (kBins) = this list's negatives whose key
// has digit b at [shift, shift + 16) and whose digits above it equal `prefix` (every
// negative on the first pass). Per-thread histograms, summed into counts.
template <typename T>
void digit_histogram(const T* s, const uint8_t* positive, const uint8_t* valid, int64_t n,
                     int shift, uint64_t prefix, uint64_t* counts, int threads) {
  using Key = decltype(sort_key(T(0)));
  constexpr int kKeyBits = 8 * sizeof(Key);
  const bool first = shift == kKeyBits - kDigitBits;
  const int prefix_shift = first ? 0 : shift + kDigitBits;
  const Key want = static_cast<Key>(prefix);
  std::vector<uint64_t> hist(static_cast<size_t>(threads) * kBins, 0);
  int used = 1;
  parallel(threads, [&](int tid, int nth) {
    if (tid == 0) used = nth;
    uint64_t* own = hist.data() + static_cast<int64_t>(tid) * kBins;
    const int64_t per = (n + nth - 1) / nth;
    const int64_t begin = std::min(n, per * tid), end = std::min(n, begin + per);
    for (int64_t j = begin; j < end; ++j) {
      if (!is_negative(positive, valid, j)) continue;
      const Key key = sort_key(s[j]);
      if (!first && (key >> prefix_shift) != want) continue;
      ++own[(key >> shift) & (kBins - 1)];
    }
  });
  std::fill(counts, counts + kBins, 0);
  for (int t = 0; t < used; ++t) {
    const uint64_t* own = hist.data() + static_cast<int64_t>(t) * kBins;
    for (int64_t b = 0; b < kBins; ++b) counts[b] += own[b];
  }
}

// The marking pass: keep = valid && (positive || key >= cut), then the first `ties_to_drop`
// negatives with key == cut in flat order are dropped as well. Returns how many negatives
// tie at cut.
template <typename T>
int64_t mark_kept(const T* s, const uint8_t* positive, const uint8_t* valid, int64_t n,
                  uint64_t cut_key, int64_t ties_to_drop, uint8_t* keep, int threads) {
  using Key = decltype(sort_key(T(0)));
  const Key cut = static_cast<Key>(cut_key);
  std::vector<int64_t> begins(threads + 1, n), tie_count(threads, 0);
  std::vector<int64_t> ties(static_cast<size_t>(threads) * kTieRecords);
  int used = 1;
  parallel(threads, [&](int tid, int nth) {
    const int64_t per = (n + nth - 1) / nth;
    const int64_t begin = std::min(n, per * tid), end = std::min(n, begin + per);
    if (tid == 0) used = nth;
    begins[tid] = begin;
    int64_t found = 0;
    int64_t* record = ties.data() + static_cast<int64_t>(tid) * kTieRecords;
    for (int64_t j = begin; j < end; ++j) {
      const bool ok = valid == nullptr || valid[j];
      const Key key = sort_key(s[j]);
      keep[j] = ok && (positive[j] || key >= cut);
      if (ok && !positive[j] && key == cut) {
        if (found < kTieRecords) record[found] = j;
        ++found;
      }
    }
    tie_count[tid] = found;
  });
  int64_t tied = 0;
  for (int t = 0; t < used; ++t) tied += tie_count[t];
  int64_t rank = ties_to_drop;
  for (int t = 0; t < used && rank > 0; ++t) {
    const int64_t quota = std::min(rank, tie_count[t]);
    rank -= quota;
    if (quota <= kTieRecords) {
      const int64_t* record = ties.data() + static_cast<int64_t>(t) * kTieRecords;
      for (int64_t q = 0; q < quota; ++q) keep[record[q]] = 0;
      continue;
    }
    int64_t left = quota;  // many ties: rescan this thread's part in flat order
    const int64_t end = t + 1 < used ? begins[t + 1] : n;
    for (int64_t j = begins[t]; j < end && left > 0; ++j) {
      if (is_negative(positive, valid, j) && sort_key(s[j]) == cut) {
        keep[j] = 0;
        --left;
      }
    }
  }
  return tied;
}

template <typename T>
int64_t drop_lowest(const T* s, const uint8_t* positive, const uint8_t* valid, int64_t n,
                    double rate, uint8_t* keep, int threads) {
  using Key = decltype(sort_key(T(0)));
  constexpr int kKeyBits = 8 * sizeof(Key);
  std::vector<uint64_t> counts(kBins);
  uint64_t prefix = 0;
  int64_t k = 0, rank = 0;
  for (int shift = kKeyBits - kDigitBits; shift >= 0; shift -= kDigitBits) {
    digit_histogram(s, positive, valid, n, shift, prefix, counts.data(), threads);
    if (shift == kKeyBits - kDigitBits) {
      uint64_t total = 0;
      for (int64_t b = 0; b < kBins; ++b) total += counts[b];
      // Same double operations as common.num_dropped: floor(N * rate + 1e-9).
      const double product = static_cast<double>(total) * rate;
      k = static_cast<int64_t>(std::floor(product + 1e-9));
      if (k <= 0) return 0;
      rank = k;  // 1-based rank of the last dropped negative
    }
    int64_t bin = 0;
    while (static_cast<int64_t>(counts[bin]) < rank) rank -= counts[bin++];
    prefix = (prefix << kDigitBits) | static_cast<uint64_t>(bin);
  }
  // prefix: key of the k-th smallest negative; rank: how many negatives tied at it are dropped.
  mark_kept(s, positive, valid, n, prefix, rank, keep, threads);
  return k;
}
