// The dot-product paths of kernelpick's CPU GEMM: every output one K-long dot product in
// registers, for one token, a few tokens, or panels of decoded rows; with block scales
// (_cpu_fp8_scales.h) the same products, scaled group by group along K. Included by
// _cpu_fp8_gemm.cpp only.
#pragma once

#include "_cpu_fp8_codec.h"
#include "_cpu_fp8_scales.h"

#include <algorithm>

namespace {

// Tokens and output channels per register block.
constexpr int kMB = 4;
constexpr int kNB = 4;
// How far ahead (bytes) the few-token path fetches each weight row.
constexpr int kPrefetch = 2048;
// Up to this many tokens each weight byte is decoded again for every block of kMB tokens,
// as it streams in: with table or fp16 decode that is cheaper than a decoded copy read
// back from L2 (measured 3.5 against 4.4 ms at M = 64, N = K = 4096). Beyond, the
// activations no longer fit in L2 beside the rows, and panels of decoded rows take over.
constexpr int64_t kSmallM = 64;
// Rows per panel of the many-token path, and the most decoded bytes it may take (L2). That
// path runs for more than kSmallM tokens where torch's bf16 GEMM would not be exact
// enough, which only an AVX512-BF16 build meets; the other builds hand those to fp32 GEMM.
constexpr int64_t kPanelRows = 64;
constexpr int64_t kScratchBytes = int64_t(512) << 10;

// One weight row, one K step at a time, decoded from the FP8 bytes as they stream in.
template <class V>
struct DecodeRow {
  const uint8_t* row;
  int64_t k;
  typename V::Ctx ctx;
  typename V::W at(int64_t step) const {
    const int64_t i = step * V::kStep;
    if (i + V::kStep <= k) return V::weights(row + i, ctx);
    alignas(64) uint8_t tail[V::kStep] = {0};  // the last, partial step: zeros beyond K
    std::memcpy(tail, row + i, k - i);
    return V::weights(tail, ctx);
  }
};

// One row as dot_tokens reads rows (row index c is always 0), decoded as it streams.
template <class V>
struct StreamedRow {
  const uint8_t* row;
  int64_t k;
  typename V::Ctx ctx;
  typename V::W operator()(int, int64_t step) const { return DecodeRow<V>{row, k, ctx}.at(step); }
};

// NB rows decoded once into a scratch buffer, for blocks of more than kMB tokens.
template <class V>
struct ScratchRows {
  const typename V::W* scratch;  // [NB][steps]
  int64_t steps;
  typename V::W operator()(int c, int64_t step) const { return scratch[c * steps + step]; }
};

// Steps [s0, s1) of one block into its accumulators.
template <class V, int MB, int NB, class Rows>
inline void dot_steps(typename V::Acc (&acc)[MB][NB], const typename V::X* x, int64_t kp,
                      const Rows& rows, int64_t s0, int64_t s1) {
  for (int64_t s = s0; s < s1; ++s) {
    typename V::W wv[NB];
    for (int c = 0; c < NB; ++c) wv[c] = rows(c, s);
    for (int m = 0; m < MB; ++m) {
      const typename V::W xv = V::activations(x + m * kp + s * V::kStep);
      for (int c = 0; c < NB; ++c) acc[m][c] = V::madd(acc[m][c], xv, wv[c]);
    }
  }
}

// One block: tokens [0, MB) x channels [0, NB) over ``steps`` K steps. ``x`` rows are
// padded to ``kp`` (steps * kStep) with zeros beyond K. With block scales (G, and ``h``),
// the NB rows lie in one weight block and the sums are scaled group by group (Horner).
// G is a template argument, so the per-token code carries no test of h.
template <class V, int MB, int NB, bool G, class Rows>
inline void dot_block(const typename V::X* x, int64_t kp, int64_t steps, const Rows& rows,
                      float* out /* [MB][NB] */, const Horner* h) {
  typename V::Acc acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int c = 0; c < NB; ++c) acc[m][c] = V::zero();
  if constexpr (!G) {
    dot_steps<V, MB, NB>(acc, x, kp, rows, 0, steps);
    for (int m = 0; m < MB; ++m)
      for (int c = 0; c < NB; ++c) out[m * NB + c] = V::sum(acc[m][c]);
  } else {
    for (int64_t g = 0, s = 0; s < steps; ++g, s += h->steps) {
      if (g > 0)
        for (int m = 0; m < MB; ++m)
          for (int c = 0; c < NB; ++c)
            acc[m][c] = scale_acc(acc[m][c], h->ratio[m * h->count + g]);
      dot_steps<V, MB, NB>(acc, x, kp, rows, s, std::min(steps, s + h->steps));
    }
    for (int m = 0; m < MB; ++m)
      for (int c = 0; c < NB; ++c) out[m * NB + c] = V::sum(acc[m][c]) * h->last[m];
  }
}

// All m tokens against NB rows, kMB tokens at a time: acc [m][NB].
template <class V, int NB, bool G, class Rows>
inline void dot_tokens(const typename V::X* x, int64_t m, int64_t kp, const Rows& rows,
                       float* acc, const Horner* h) {
  const int64_t steps = kp / V::kStep;
  Horner buffer;
  int64_t t = 0;
  for (; t + kMB <= m; t += kMB) {
    const Horner* ht = from_token<G>(h, t, buffer);
    dot_block<V, kMB, NB, G>(x + t * kp, kp, steps, rows, acc + t * NB, ht);
  }
  const Horner* rest = from_token<G>(h, t, buffer);
  switch (m - t) {
    case 3: dot_block<V, 3, NB, G>(x + t * kp, kp, steps, rows, acc + t * NB, rest); break;
    case 2: dot_block<V, 2, NB, G>(x + t * kp, kp, steps, rows, acc + t * NB, rest); break;
    case 1: dot_block<V, 1, NB, G>(x + t * kp, kp, steps, rows, acc + t * NB, rest); break;
    default: break;
  }
}

// A panel of rows decoded once into ``scratch`` (sized to stay in L2), then every block of
// kMB tokens (in L1) against every kNB rows of it: each weight byte is decoded once per
// call and each activation row read once per panel. With ``h``, the panel lies in one
// weight block.
template <class V, bool G>
void dot_panel(const typename V::X* x, int64_t m, int64_t kp, const uint8_t* w, int64_t k,
               int64_t n0, int64_t rows, std::vector<typename V::W>& scratch,
               const Epilogue& epi, const Horner* h) {
  const int64_t steps = kp / V::kStep;
  const typename V::Ctx ctx = context<V>();
  for (int64_t r = 0; r < rows; ++r) {
    const DecodeRow<V> row{w + r * k, k, ctx};
    for (int64_t s = 0; s < steps; ++s) scratch[r * steps + s] = row.at(s);
  }
  float acc[kMB * kNB];
  Horner buffer;
  for (int64_t t = 0; t < m; t += kMB) {
    const int64_t mb = std::min<int64_t>(kMB, m - t);
    const Horner* ht = from_token<G>(h, t, buffer);
    for (int64_t c = 0; c < rows; c += kNB) {
      const int64_t nb = std::min<int64_t>(kNB, rows - c);
      const ScratchRows<V> panel{scratch.data() + c * steps, steps};
      if (nb == kNB) {
        dot_tokens<V, kNB, G>(x + t * kp, mb, kp, panel, acc, ht);
      } else {
        for (int64_t j = 0; j < nb; ++j) {
          float one[kMB];
          dot_tokens<V, 1, G>(x + t * kp, mb, kp,
                              ScratchRows<V>{panel.scratch + j * steps, steps}, one, ht);
          for (int64_t i = 0; i < mb; ++i) acc[i * kNB + j] = one[i];
        }
      }
      for (int64_t i = 0; i < mb; ++i) epi.store(t + i, n0 + c, nb, acc + i * kNB);
    }
  }
}

// One token (decode): rows one after another, so each thread reads the weight as one
// sequential stream, as a memory-bound reduction does (the hardware prefetchers follow it),
// each byte decoded once. The full steps of a row run with no bounds test, the row's one
// partial step (K % kStep) apart after them, and the pointers are the lambda's own copies:
// a test or a memcpy in the hot loop made GCC keep the accumulators on the stack (AVX2:
// 112 stack operands in this function, 4.4-4.7 GB/s a core against 8-11 streamed).
// kChains accumulators hide the multiply-add latency; eight fit AVX2's sixteen registers
// beside a step's operands.
template <class V>
void one_token(const typename V::X* x, int64_t kp, const uint8_t* w, int64_t n, int64_t k,
               const Epilogue& epi) {
  constexpr int kChains = 8;
  const int64_t full = k / V::kStep;
  const bool partial = kp / V::kStep > full;
  at::parallel_for(0, n, 16, [x, w, k, full, partial, &epi](int64_t r0, int64_t r1) {
    const typename V::Ctx ctx = context<V>();
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = w + r * k;
      typename V::Acc acc[kChains];
      for (int j = 0; j < kChains; ++j) acc[j] = V::zero();
      int64_t s = 0;
      for (; s + kChains <= full; s += kChains)
        for (int j = 0; j < kChains; ++j) {
          const int64_t i = (s + j) * V::kStep;
          acc[j] = V::madd(acc[j], V::activations(x + i), V::weights(row + i, ctx));
        }
      for (; s < full; ++s) {
        const int64_t i = s * V::kStep;
        acc[0] = V::madd(acc[0], V::activations(x + i), V::weights(row + i, ctx));
      }
      if (partial)  // x is zero-padded to kp; the row's tail is read through a copy
        acc[1] = V::madd(acc[1], V::activations(x + full * V::kStep),
                         DecodeRow<V>{row, k, ctx}.at(full));
      for (int j = kChains / 2; j > 0; j /= 2)
        for (int i = 0; i < j; ++i) acc[i] = V::add(acc[i], acc[i + j]);
      const float sum = V::sum(acc[0]);
      epi.store(0, r, 1, &sum);
    }
  });
}

// One token with block scales: as one_token, but the chains are four groups along K side
// by side (four 128-byte runs of the same row), each summed, scaled and added on its own.
template <class V>
void one_token_groups(const typename V::X* x, int64_t kp, const uint8_t* w, int64_t n,
                      int64_t k, const Epilogue& epi, const KGroups& kg) {
  constexpr int kChains = 4;
  const int64_t steps = kp / V::kStep, per = kg.size / V::kStep;
  const int64_t full = steps / per;  // groups with all their steps (the last may be short)
  GroupTables tables(kg, 1);  // its ratio memory holds the scales of the current block
  at::parallel_for(0, n, 16, [&](int64_t r0, int64_t r1) {
    const typename V::Ctx ctx = context<V>();
    float* scale = tables.mine().ratio;
    int64_t block = -1;
    for (int64_t r = r0; r < r1; ++r) {
      if (kg.block_of(r) != block) {
        block = kg.block_of(r);
        for (int64_t g = 0; g < kg.count; ++g) scale[g] = kg.scale(0, r, g);
      }
      const DecodeRow<V> row{w + r * k, k, ctx};
      typename V::Acc total[kChains], part[kChains];
      for (int j = 0; j < kChains; ++j) total[j] = V::zero();
      int64_t g = 0;
      for (; g + kChains <= full; g += kChains) {
        for (int j = 0; j < kChains; ++j) part[j] = V::zero();
        for (int64_t i = 0; i < per; ++i)
          for (int j = 0; j < kChains; ++j) {
            const int64_t s = (g + j) * per + i;
            part[j] = V::madd(part[j], V::activations(x + s * V::kStep), row.at(s));
          }
        for (int j = 0; j < kChains; ++j) total[j] = fma_acc(part[j], scale[g + j], total[j]);
      }
      for (; g < kg.count; ++g) {
        part[0] = V::zero();
        for (int64_t s = g * per; s < std::min(steps, (g + 1) * per); ++s)
          part[0] = V::madd(part[0], V::activations(x + s * V::kStep), row.at(s));
        total[0] = fma_acc(part[0], scale[g], total[0]);
      }
      for (int j = 1; j < kChains; ++j) total[0] = V::add(total[0], total[j]);
      const float sum = V::sum(total[0]);
      epi.store(0, r, 1, &sum);
    }
  });
}

// A few tokens (2 to kSmallM): kNB rows at a time, each block of kMB tokens against them
// from registers, the bytes decoded again for each token block (from L1). kNB rows of
// 4 KiB are kNB pages, where hardware prefetchers stop, so the rows are fetched ahead in
// software, and near the end of a row the start of the same row of the next block (kNB
// rows on), which comes next.
template <class V>
struct PrefetchedRows {
  const uint8_t* w;  // the block's first row; rows are k bytes apart
  int64_t k;
  typename V::Ctx ctx;
  typename V::W operator()(int c, int64_t step) const {
    const uint8_t* row = w + c * k;
    const int64_t i = step * V::kStep;
    const int64_t ahead = i + kPrefetch;
    _mm_prefetch(reinterpret_cast<const char*>(row + ahead + (ahead >= k ? (kNB - 1) * k : 0)),
                 _MM_HINT_T0);
    return DecodeRow<V>{row, k, ctx}.at(step);
  }
};

template <class V, bool G>
void few_tokens(const typename V::X* x, int64_t m, int64_t kp, const uint8_t* w, int64_t n,
                int64_t k, const Epilogue& epi, const KGroups& kg) {
  const int64_t blocks = (n + kNB - 1) / kNB;
  GroupTables tables(kg, m);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    const typename V::Ctx ctx = context<V>();
    float acc[kSmallM * kNB];
    GroupTable table = tables.mine();
    Horner buffer;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kNB;
      const int64_t nb = std::min<int64_t>(kNB, n - n0);
      // kNB divides the block size: the kNB rows lie in one weight block.
      const Horner* h = nullptr;
      if constexpr (G) h = horner(kg, m, n0, V::kStep, table, buffer);
      if (nb == kNB) {
        dot_tokens<V, kNB, G>(x, m, kp, PrefetchedRows<V>{w + n0 * k, k, ctx}, acc, h);
      } else {
        for (int64_t c = 0; c < nb; ++c) {
          float one[kSmallM];
          dot_tokens<V, 1, G>(x, m, kp, StreamedRow<V>{w + (n0 + c) * k, k, ctx}, one, h);
          for (int64_t t = 0; t < m; ++t) acc[t * kNB + c] = one[t];
        }
      }
      for (int64_t t = 0; t < m; ++t) epi.store(t, n0, nb, acc + t * kNB);
    }
  });
}

// Many tokens (more than kSmallM): panels of rows decoded once each (dot_panel), the
// panels shared out among the threads.
template <class V, bool G>
void many_tokens(const typename V::X* x, int64_t m, int64_t kp, const uint8_t* w, int64_t n,
                 int64_t k, const Epilogue& epi, const KGroups& kg) {
  const int64_t steps = kp / V::kStep;
  const int64_t fit = kScratchBytes / (steps * int64_t(sizeof(typename V::W)));
  int64_t rows = std::max<int64_t>(kNB, std::min<int64_t>(kPanelRows, fit / kNB * kNB));
  // With block scales a panel must not straddle two weight blocks: a power of two up to
  // kPanelRows (64) divides the block size.
  while (G && (rows & (rows - 1))) rows -= kNB;
  const int64_t panels = (n + rows - 1) / rows;
  GroupTables tables(kg, m);
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    // Kept per thread between calls: a fresh 512 KiB each call would cost page faults.
    thread_local std::vector<typename V::W> scratch;
    if (scratch.size() < size_t(rows * steps)) scratch.resize(rows * steps);
    GroupTable table = tables.mine();
    Horner buffer;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * rows;
      const Horner* h = nullptr;
      if constexpr (G) h = horner(kg, m, n0, V::kStep, table, buffer);
      dot_panel<V, G>(x, m, kp, w + n0 * k, k, n0, std::min(rows, n - n0), scratch, epi, h);
    }
  });
}

// The dot-product path: every output is one K-long dot product in registers. ``kg``: the
// scales that vary along K, if any (its size a multiple of 64, so of kStep and of kNB).
template <class V>
void gemv(const typename V::X* x, int64_t m, int64_t kp, const uint8_t* w, int64_t n, int64_t k,
          const Epilogue& epi, const KGroups& kg) {
  const bool grouped = kg.active();
  if (m == 1) {
    if (grouped) {
      one_token_groups<V>(x, kp, w, n, k, epi, kg);
    } else {
      one_token<V>(x, kp, w, n, k, epi);
    }
  } else if (m <= kSmallM) {
    if (grouped) {
      few_tokens<V, true>(x, m, kp, w, n, k, epi, kg);
    } else {
      few_tokens<V, false>(x, m, kp, w, n, k, epi, kg);
    }
  } else if (grouped) {
    many_tokens<V, true>(x, m, kp, w, n, k, epi, kg);
  } else {
    many_tokens<V, false>(x, m, kp, w, n, k, epi, kg);
  }
}

}  // namespace
