// The dot-product paths of kernelpick's CPU GEMM: every output one K-long dot product in
// registers, for one token, a few tokens, or panels of decoded rows; with block scales
// (_cpu_fp8_scales.h) the same products, scaled group by group along K. Included by
// _cpu_fp8_gemm.cpp only.
#pragma once

#include "_cpu_fp8_codec.h"
#include "_cpu_fp8_scales.h"

#include <algorithm>

namespace {

// How far ahead (bytes) the few-token path fetches each weight row.
constexpr int kPrefetch = 2048;
// Up to this many tokens each weight byte is decoded again for every block of V::kTokens
// tokens, as it streams in: with table or fp16 decode that is cheaper than a decoded copy
// read back from L2 (measured 3.5 against 4.4 ms at M = 64, N = K = 4096). Beyond, the
// activations no longer fit in L2 beside the rows, and panels of decoded rows take over
// (on the bf16 build from 17 tokens already: ManyTokens, _cpu_bf16_outer.h).
constexpr int64_t kSmallM = 64;
// Rows per panel of the many-token path, and the most decoded bytes it may take (L2). The
// integer dot products run it past kSmallM tokens (with a long K); the bf16 build's FP8
// layers run their own (ManyTokens, _cpu_bf16_outer.h), the fp32 ones torch's fp32 GEMM.
constexpr int64_t kPanelRows = 64;
constexpr int64_t kScratchBytes = int64_t(512) << 10;

// Step s of a weight row, decoded from its FP8 bytes: ``full`` reads a whole step with no
// bounds test, ``tail`` the row's one partial step (K % kStep bytes, zeros beyond K)
// through a copy. The dot paths call ``tail`` outside their hot loops: a test or a memcpy
// inside one made GCC keep the accumulators on the stack.
template <class V>
inline typename V::W full_step(const uint8_t* row, int64_t s, const typename V::Ctx& ctx) {
  return V::weights(row + s * V::kStep, ctx);
}
template <class V>
typename V::W tail_step(const uint8_t* row, int64_t k, int64_t s, const typename V::Ctx& ctx) {
  alignas(64) uint8_t tail[V::kStep] = {0};
  std::memcpy(tail, row + s * V::kStep, k - s * V::kStep);
  return V::weights(tail, ctx);
}

// K steps of a row: ``full`` whole ones, then one partial step where K % kStep != 0.
template <class V>
struct Steps {
  int64_t full, all;
  explicit Steps(int64_t k) : full(k / V::kStep), all((k + V::kStep - 1) / V::kStep) {}
};

// The value a token's dot products start from: zero, or, for a type whose activation rows
// carry one after their steps' values, that one (U8x64: minus what its unsigned reading of
// the weights adds to every sum of the token).
template <class V, class = void>
struct CarriesStart : std::false_type {};
template <class V>
struct CarriesStart<V, std::void_t<decltype(V::start(nullptr))>> : std::true_type {};
template <class V>
inline typename V::Acc start(const typename V::X* row, const Steps<V>& steps) {
  if constexpr (CarriesStart<V>::value) {
    return V::start(row + steps.all * V::kStep);
  } else {
    return V::zero();
  }
}

// Rows of the weight as the few-token blocks read them (row c of the block, step s),
// decoded as they stream in. NB rows of 4 KiB are NB pages, where hardware prefetchers
// stop, so with ``kAhead`` each row is fetched ahead in software, and near its end the
// start of the same row of the next block (NB rows on), which comes next.
template <class V, int NB, bool kAhead>
struct StreamedRows {
  const uint8_t* w;  // the block's first row; rows are k bytes apart
  int64_t k;
  Steps<V> steps;
  typename V::Ctx ctx;
  typename V::W at(int c, int64_t s) const {
    const uint8_t* row = w + c * k;
    if constexpr (kAhead) {
      const int64_t ahead = s * V::kStep + kPrefetch;
      _mm_prefetch(
          reinterpret_cast<const char*>(row + ahead + (ahead >= k ? (NB - 1) * k : 0)),
          _MM_HINT_T0);
    }
    return full_step<V>(row, s, ctx);
  }
  typename V::W tail(int c, int64_t s) const { return tail_step<V>(w + c * k, k, s, ctx); }
};

// NB rows decoded once into a scratch buffer (whole steps, zeros beyond K), for blocks of
// more than V::kTokens tokens.
template <class V>
struct ScratchRows {
  const typename V::W* scratch;  // [NB][steps.all]
  Steps<V> steps;
  typename V::W at(int c, int64_t s) const { return scratch[c * steps.all + s]; }
  typename V::W tail(int c, int64_t s) const { return at(c, s); }
};

// One K step of a block: NB rows' weights (``weight(c)``), each token's activations loaded
// once and multiplied into its NB accumulators.
template <class V, int MB, int NB, class Weight>
inline void dot_step(typename V::Acc (&acc)[MB][NB], const typename V::X* x, int64_t kp,
                     int64_t s, const Weight& weight) {
  typename V::W wv[NB];
  for (int c = 0; c < NB; ++c) wv[c] = weight(c);
  for (int m = 0; m < MB; ++m) {
    const typename V::W xv = V::activations(x + m * kp + s * V::kStep);
    for (int c = 0; c < NB; ++c) acc[m][c] = V::madd(acc[m][c], xv, wv[c]);
  }
}

// Steps [s0, s1) of one block into its accumulators: the whole steps in the hot loop, the
// partial one (if [s0, s1) holds it) after.
template <class V, int MB, int NB, class Rows>
inline void dot_steps(typename V::Acc (&acc)[MB][NB], const typename V::X* x, int64_t kp,
                      const Rows& rows, int64_t s0, int64_t s1) {
  const int64_t full = std::min(s1, rows.steps.full);
  for (int64_t s = s0; s < full; ++s)
    dot_step<V>(acc, x, kp, s, [&](int c) { return rows.at(c, s); });
  if (s1 > rows.steps.full) {
    const int64_t s = rows.steps.full;
    dot_step<V>(acc, x, kp, s, [&](int c) { return rows.tail(c, s); });
  }
}

// One block: tokens [0, MB) x channels [0, NB) over every K step of ``rows``. ``x`` rows
// are padded to ``kp`` (at least steps.all * kStep) with zeros beyond K. With block scales
// (G, and ``h``), the NB rows lie in one weight block and the sums are scaled group by
// group (Horner). G is a template argument, so the per-token code carries no test of h.
template <class V, int MB, int NB, bool G, class Rows>
inline void dot_block(const typename V::X* x, int64_t kp, const Rows& rows,
                      float* out /* [MB][NB] */, const Horner* h) {
  typename V::Acc acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int c = 0; c < NB; ++c) acc[m][c] = start<V>(x + m * kp, rows.steps);
  const int64_t steps = rows.steps.all;
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

// All m tokens against NB rows, V::kTokens tokens at a time: acc [m][NB].
template <class V, int NB, bool G, class Rows>
inline void dot_tokens(const typename V::X* x, int64_t m, int64_t kp, const Rows& rows,
                       float* acc, const Horner* h) {
  constexpr int MB = V::kTokens;
  static_assert(MB <= 6, "dot_tokens runs the last partial block of up to 5 tokens");
  Horner buffer;
  int64_t t = 0;
  for (; t + MB <= m; t += MB) {
    const Horner* ht = from_token<G>(h, t, buffer);
    dot_block<V, MB, NB, G>(x + t * kp, kp, rows, acc + t * NB, ht);
  }
  const Horner* rest = from_token<G>(h, t, buffer);
  const typename V::X* xt = x + t * kp;
  float* at = acc + t * NB;
  switch (m - t) {
    case 5: dot_block<V, 5, NB, G>(xt, kp, rows, at, rest); break;
    case 4: dot_block<V, 4, NB, G>(xt, kp, rows, at, rest); break;
    case 3: dot_block<V, 3, NB, G>(xt, kp, rows, at, rest); break;
    case 2: dot_block<V, 2, NB, G>(xt, kp, rows, at, rest); break;
    case 1: dot_block<V, 1, NB, G>(xt, kp, rows, at, rest); break;
    default: break;
  }
}

// A panel of rows decoded once into ``scratch`` (sized to stay in L2), then every block of
// V::kTokens tokens (in L1) against every V::kRows rows of it: each weight byte is decoded
// once per call and each activation row read once per panel. With ``h``, the panel lies in
// one weight block.
template <class V, bool G>
void dot_panel(const typename V::X* x, int64_t m, int64_t kp, const uint8_t* w, int64_t k,
               int64_t n0, int64_t rows, std::vector<typename V::W>& scratch,
               const Epilogue& epi, const Horner* h) {
  constexpr int MB = V::kTokens, NB = V::kRows;
  const Steps<V> steps(k);
  const typename V::Ctx ctx = context<V>();
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = w + r * k;
    typename V::W* out = scratch.data() + r * steps.all;
    for (int64_t s = 0; s < steps.full; ++s) out[s] = full_step<V>(row, s, ctx);
    if (steps.all > steps.full) out[steps.full] = tail_step<V>(row, k, steps.full, ctx);
  }
  float acc[MB * NB];
  Horner buffer;
  for (int64_t t = 0; t < m; t += MB) {
    const int64_t mb = std::min<int64_t>(MB, m - t);
    const Horner* ht = from_token<G>(h, t, buffer);
    for (int64_t c = 0; c < rows; c += NB) {
      const int64_t nb = std::min<int64_t>(NB, rows - c);
      const ScratchRows<V> panel{scratch.data() + c * steps.all, steps};
      if (nb == NB) {
        dot_tokens<V, NB, G>(x + t * kp, mb, kp, panel, acc, ht);
      } else {
        for (int64_t j = 0; j < nb; ++j) {
          float one[MB];
          dot_tokens<V, 1, G>(x + t * kp, mb, kp,
                              ScratchRows<V>{panel.scratch + j * steps.all, steps}, one, ht);
          for (int64_t i = 0; i < mb; ++i) acc[i * NB + j] = one[i];
        }
      }
      for (int64_t i = 0; i < mb; ++i) epi.store(t + i, n0 + c, nb, acc + i * NB);
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
void one_token(const typename V::X* x, const uint8_t* w, int64_t n, int64_t k,
               const Epilogue& epi) {
  constexpr int kChains = 8;
  const Steps<V> steps(k);
  at::parallel_for(0, n, 16, [x, w, k, steps, &epi](int64_t r0, int64_t r1) {
    const typename V::Ctx ctx = context<V>();
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = w + r * k;
      typename V::Acc acc[kChains];
      acc[0] = start<V>(x, steps);
      for (int j = 1; j < kChains; ++j) acc[j] = V::zero();
      int64_t s = 0;
      for (; s + kChains <= steps.full; s += kChains)
        for (int j = 0; j < kChains; ++j)
          acc[j] = V::madd(acc[j], V::activations(x + (s + j) * V::kStep),
                           full_step<V>(row, s + j, ctx));
      for (; s < steps.full; ++s)
        acc[0] = V::madd(acc[0], V::activations(x + s * V::kStep), full_step<V>(row, s, ctx));
      if (steps.all > steps.full)  // x is zero-padded to a whole step; the row is not
        acc[1] = V::madd(acc[1], V::activations(x + steps.full * V::kStep),
                         tail_step<V>(row, k, steps.full, ctx));
      for (int j = kChains / 2; j > 0; j /= 2)
        for (int i = 0; i < j; ++i) acc[i] = V::add(acc[i], acc[i + j]);
      const float sum = V::sum(acc[0]);
      epi.store(0, r, 1, &sum);
    }
  });
}

// One token with block scales: as one_token, but the chains are four groups along K side
// by side (four 128-byte runs of the same row), each summed, scaled and added on its own.
// Groups of whole steps run with no bounds test; the last group, which may hold the row's
// partial step, apart.
template <class V>
void one_token_groups(const typename V::X* x, const uint8_t* w, int64_t n, int64_t k,
                      const Epilogue& epi, const KGroups& kg) {
  constexpr int kChains = 4;
  const Steps<V> steps(k);
  const int64_t per = kg.size / V::kStep;
  const int64_t whole = steps.full / per;  // groups with all their steps whole
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
      const uint8_t* row = w + r * k;
      typename V::Acc total[kChains], part[kChains];
      for (int j = 0; j < kChains; ++j) total[j] = V::zero();
      int64_t g = 0;
      for (; g + kChains <= whole; g += kChains) {
        for (int j = 0; j < kChains; ++j) part[j] = V::zero();
        for (int64_t i = 0; i < per; ++i)
          for (int j = 0; j < kChains; ++j) {
            const int64_t s = (g + j) * per + i;
            part[j] =
                V::madd(part[j], V::activations(x + s * V::kStep), full_step<V>(row, s, ctx));
          }
        for (int j = 0; j < kChains; ++j) total[j] = fma_acc(part[j], scale[g + j], total[j]);
      }
      for (; g < kg.count; ++g) {
        part[0] = V::zero();
        for (int64_t s = g * per; s < std::min(steps.all, (g + 1) * per); ++s) {
          const typename V::W wv =
              s < steps.full ? full_step<V>(row, s, ctx) : tail_step<V>(row, k, s, ctx);
          part[0] = V::madd(part[0], V::activations(x + s * V::kStep), wv);
        }
        total[0] = fma_acc(part[0], scale[g], total[0]);
      }
      for (int j = 1; j < kChains; ++j) total[0] = V::add(total[0], total[j]);
      const float sum = V::sum(total[0]);
      epi.store(0, r, 1, &sum);
    }
  });
}

// A few tokens (2 to kSmallM): V::kRows rows at a time, each block of V::kTokens tokens
// against them from registers (the tile fits the register file: kTokens x kRows
// accumulators, kRows decoded weights and one activation), the bytes decoded again for
// each token block (from L1).
template <class V, bool G>
void few_tokens(const typename V::X* x, int64_t m, int64_t kp, const uint8_t* w, int64_t n,
                int64_t k, const Epilogue& epi, const KGroups& kg) {
  constexpr int NB = V::kRows;
  const int64_t blocks = (n + NB - 1) / NB;
  const Steps<V> steps(k);
  GroupTables tables(kg, m);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    const typename V::Ctx ctx = context<V>();
    float acc[kSmallM * NB];
    GroupTable table = tables.mine();
    Horner buffer;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * NB;
      const int64_t nb = std::min<int64_t>(NB, n - n0);
      // NB divides the block size: the NB rows lie in one weight block.
      const Horner* h = nullptr;
      if constexpr (G) h = horner(kg, m, n0, V::kStep, table, buffer);
      if (nb == NB) {
        const StreamedRows<V, NB, true> rows{w + n0 * k, k, steps, ctx};
        dot_tokens<V, NB, G>(x, m, kp, rows, acc, h);
      } else {
        for (int64_t c = 0; c < nb; ++c) {
          float one[kSmallM];
          const StreamedRows<V, 1, false> row{w + (n0 + c) * k, k, steps, ctx};
          dot_tokens<V, 1, G>(x, m, kp, row, one, h);
          for (int64_t t = 0; t < m; ++t) acc[t * NB + c] = one[t];
        }
      }
      for (int64_t t = 0; t < m; ++t) epi.store(t, n0, nb, acc + t * NB);
    }
  });
}

// Many tokens (more than kSmallM): panels of rows decoded once each (dot_panel), the
// panels shared out among the threads.
template <class V, bool G>
void many_tokens(const typename V::X* x, int64_t m, int64_t kp, const uint8_t* w, int64_t n,
                 int64_t k, const Epilogue& epi, const KGroups& kg) {
  constexpr int NB = V::kRows;
  const int64_t steps = Steps<V>(k).all;
  const int64_t fit = kScratchBytes / (steps * int64_t(sizeof(typename V::W)));
  int64_t rows = std::max<int64_t>(NB, std::min<int64_t>(kPanelRows, fit / NB * NB));
  // With block scales a panel must not straddle two weight blocks: a power of two up to
  // kPanelRows (64) divides the block size.
  while (G && (rows & (rows - 1))) rows -= NB;
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

// The many-token path of a vector type, and the batch size from which it runs: panels of
// rows decoded once each (many_tokens) past kSmallM tokens, unless a type's own path
// specializes it (the bf16 build's outer products, _cpu_bf16_outer.h, which the end of
// this header includes, so that no file can instantiate gemv without it).
template <class V, bool G>
struct ManyTokens {
  static constexpr int64_t kFrom = kSmallM + 1;
  static void run(const typename V::X* x, int64_t m, int64_t kp, const uint8_t* w, int64_t n,
                  int64_t k, const Epilogue& epi, const KGroups& kg) {
    many_tokens<V, G>(x, m, kp, w, n, k, epi, kg);
  }
};

// The dot-product paths: every output is one K-long dot product in registers, One's for
// one token and Few's for more (the vector type whose register tile suits each). ``x``
// rows are ``kp`` apart, zero-padded to a whole number of either type's steps, and after
// those hold the start of each token's sums where the type carries one (CarriesStart).
// ``kg``: the scales that vary along K, if any (its size a multiple of 64, so of every
// kStep and kRows), which only the floating-point types take (kKGroups).
template <class One, class Few>
void gemv(const typename One::X* x, int64_t m, int64_t kp, const uint8_t* w, int64_t n,
          int64_t k, const Epilogue& epi, const KGroups& kg) {
  static_assert(std::is_same_v<typename One::X, typename Few::X>, "one activation layout");
  if constexpr (One::kKGroups && Few::kKGroups) {
    if (kg.active()) {
      if (m == 1) {
        one_token_groups<One>(x, w, n, k, epi, kg);
      } else if (m < ManyTokens<Few, true>::kFrom) {
        few_tokens<Few, true>(x, m, kp, w, n, k, epi, kg);
      } else {
        ManyTokens<Few, true>::run(x, m, kp, w, n, k, epi, kg);
      }
      return;
    }
  } else {
    TORCH_CHECK(!kg.active(), "kernelpick fp8_gemm: integer dot products take no K groups");
  }
  if (m == 1) {
    one_token<One>(x, w, n, k, epi);
  } else if (m < ManyTokens<Few, false>::kFrom) {
    few_tokens<Few, false>(x, m, kp, w, n, k, epi, kg);
  } else {
    ManyTokens<Few, false>::run(x, m, kp, w, n, k, epi, kg);
  }
}

}  // namespace

// The specializations of ManyTokens (see there).
#include "_cpu_bf16_outer.h"
