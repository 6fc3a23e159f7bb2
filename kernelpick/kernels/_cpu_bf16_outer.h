// The many-token path of kernelpick's CPU GEMM on an AVX512-BF16 CPU: outer products over
// panels of the weight decoded once per call into the layout the register tile reads.
// Included by _cpu_fp8_gemm.cpp only (bf16 builds).
//
// The row-dot tiles (_cpu_fp8_dot.h) read a byte of weight and one of activation per
// multiply-add from L2 for every block of tokens, and sum each output horizontally; past
// 64 tokens they ran at 62% of vdpbf16ps's rate (block FP8, N = K = 4096, M = 256). Here a
// panel of 32 output channels is decoded once to bf16 and laid out pair by pair ([K / 2]
// of 32 bf16 pairs, two vectors), and a tile of 6 tokens x 32 channels keeps its 12
// accumulators in registers: each pair's two weight vectors feed 12 vdpbf16ps, each with
// one token's pair broadcast from memory, and no output needs a horizontal sum.
#pragma once

#include "_cpu_fp8_dot.h"

#if defined(__AVX512BF16__)
namespace {

constexpr int kOuterCols = 32;    // output channels per panel: two vectors of fp32 lanes
constexpr int kOuterTokens = 6;   // tokens per tile: 12 accumulators, 2 weights
constexpr int kStepPairs = Bf16x64::kStep / 2;  // K pairs of one decoded 64-byte step
// pack_pairs transposes two halves of 16 rows, 16 pairs at a time.
static_assert(kOuterCols == 32 && kStepPairs == 32, "pack_pairs lays out 2 x 16 rows x 32 pairs");

// 16 rows of 16 dwords, transposed in registers: r[c] then holds element c of every row
// (row i in lane i).
inline void transpose16x16(__m512i (&r)[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // u[4i + j], 128-bit lane l: rows 4i to 4i + 3 of element 4l + j.
  for (int j = 0; j < 4; ++j) {
    const __m512i low = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44);
    const __m512i high = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
    const __m512i low2 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xEE);
    const __m512i high2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xEE);
    r[j] = _mm512_shuffle_i32x4(low, high, 0x88);
    r[4 + j] = _mm512_shuffle_i32x4(low, high, 0xDD);
    r[8 + j] = _mm512_shuffle_i32x4(low2, high2, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(low2, high2, 0xDD);
  }
}

// Step s of up to 16 rows (FP8, k bytes apart; ``rows`` of them, zeros after), decoded to
// bf16 and laid out pair by pair: ``out[p * ld + c]`` holds row c's pair p of the step (K
// 64s + 2p and 64s + 2p + 1), for its 32 pairs. The rows are decoded into a block in L1,
// then transposed 16 pairs at a time.
inline void pack_step16(const uint8_t* w, int64_t k, int64_t rows, int64_t s,
                        const Steps<Bf16x64>& steps, uint32_t* out, int64_t ld) {
  alignas(64) uint32_t block[16][kStepPairs];  // 16 rows' pairs of one step
  for (int i = 0; i < 16; ++i) {
    Bf16x64::W v{(__m512bh)_mm512_setzero_si512(), (__m512bh)_mm512_setzero_si512()};
    if (i < rows) {
      const uint8_t* src = w + i * k;
      v = s < steps.full ? full_step<Bf16x64>(src, s, kTables)
                         : tail_step<Bf16x64>(src, k, s, kTables);
    }
    _mm512_store_si512(block[i], (__m512i)v.a);
    _mm512_store_si512(block[i] + 16, (__m512i)v.b);
  }
  for (int q = 0; q < 2; ++q) {
    __m512i r[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(block[i] + 16 * q);
    transpose16x16(r);
    for (int j = 0; j < 16; ++j) _mm512_storeu_si512(out + (16 * q + j) * ld, r[j]);
  }
}

// Rows [0, rows) of a panel (FP8, k bytes apart), decoded to bf16 and laid out for the tile:
// ``out[p * ld + c]`` holds row c's pair p (K 2p and 2p + 1), for every pair of the row's
// whole 64-byte steps; zeros for K past k and for rows past ``rows``: the VNNI layout of a
// bf16 B matrix, which AMX reads too (_cpu_bf16_amx.h, ``ld`` its panel's width).
void pack_pairs(const uint8_t* w, int64_t k, int64_t rows, uint32_t* out,
                int64_t ld = kOuterCols) {
  const Steps<Bf16x64> steps(k);
  for (int half = 0; half < 2; ++half)
    for (int64_t s = 0; s < steps.all; ++s)
      pack_step16(w + 16 * half * k, k, rows - 16 * half, s, steps,
                  out + s * kStepPairs * ld + 16 * half, ld);
}

// Pairs [p0, p1) of R tokens (rows of x, kp apart) against a packed panel, into acc.
template <int R>
inline void outer_pairs(__m512 (&acc)[R][2], const uint16_t* x, int64_t kp,
                        const uint32_t* panel, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + p * kOuterCols);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + p * kOuterCols + 16);
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * kp + 2 * p, sizeof pair);
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xb, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xb, w1);
    }
  }
}

// R tokens against a packed panel: out [R][32]. With block scales (G, ``h`` from the
// tile's first token), the panel lies in one weight block and the sums are scaled group by
// group (Horner, h->steps pairs a group), as dot_block does.
template <int R, bool G>
inline void outer_tile(const uint16_t* x, int64_t kp, const uint32_t* panel, int64_t pairs,
                       const Horner* h, float* out) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  if constexpr (!G) {
    outer_pairs<R>(acc, x, kp, panel, 0, pairs);
    for (int r = 0; r < R; ++r) {
      _mm512_storeu_ps(out + r * kOuterCols, acc[r][0]);
      _mm512_storeu_ps(out + r * kOuterCols + 16, acc[r][1]);
    }
  } else {
    for (int64_t g = 0, p = 0; p < pairs; ++g, p += h->steps) {
      if (g > 0)
        for (int r = 0; r < R; ++r)
          for (int j = 0; j < 2; ++j) acc[r][j] = scale_acc(acc[r][j], h->ratio[r * h->count + g]);
      outer_pairs<R>(acc, x, kp, panel, p, std::min(pairs, p + h->steps));
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 2; ++j)
        _mm512_storeu_ps(out + r * kOuterCols + 16 * j, scale_acc(acc[r][j], h->last[r]));
  }
}

// All m tokens against every panel of 32 rows, the panels shared out among the threads:
// each decoded and packed once per call into memory its thread keeps (256 KiB at K = 4096,
// in L2), then every tile of tokens against it.
template <bool G>
void outer_tokens(const uint16_t* x, int64_t m, int64_t kp, const uint8_t* w, int64_t n,
                  int64_t k, const Epilogue& epi, const KGroups& kg) {
  const int64_t pairs = (k + 1) / 2;
  const int64_t panels = (n + kOuterCols - 1) / kOuterCols;
  GroupTables tables(kg, m);
  at::parallel_for(0, panels, 1, [&](int64_t b0, int64_t b1) {
    // Kept per thread between calls (a fresh 256 KiB each call would cost page faults).
    thread_local std::vector<uint32_t> packed;
    const size_t size = size_t(Steps<Bf16x64>(k).all * kStepPairs * kOuterCols);
    if (packed.size() < size) packed.resize(size);
    GroupTable table = tables.mine();
    Horner buffer, first;
    alignas(64) float out[kOuterTokens * kOuterCols];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kOuterCols;
      const int64_t nb = std::min<int64_t>(kOuterCols, n - n0);
      pack_pairs(w + n0 * k, k, nb, packed.data());
      // kOuterCols divides the block size: the panel lies in one weight block.
      const Horner* h = nullptr;
      if constexpr (G) h = horner(kg, m, n0, 2, table, first);
      int64_t t = 0;
      for (; t + kOuterTokens <= m; t += kOuterTokens) {
        const Horner* ht = from_token<G>(h, t, buffer);
        outer_tile<kOuterTokens, G>(x + t * kp, kp, packed.data(), pairs, ht, out);
        for (int r = 0; r < kOuterTokens; ++r) epi.store(t + r, n0, nb, out + r * kOuterCols);
      }
      const Horner* ht = from_token<G>(h, t, buffer);
      const uint16_t* xt = x + t * kp;
      switch (m - t) {
        case 5: outer_tile<5, G>(xt, kp, packed.data(), pairs, ht, out); break;
        case 4: outer_tile<4, G>(xt, kp, packed.data(), pairs, ht, out); break;
        case 3: outer_tile<3, G>(xt, kp, packed.data(), pairs, ht, out); break;
        case 2: outer_tile<2, G>(xt, kp, packed.data(), pairs, ht, out); break;
        case 1: outer_tile<1, G>(xt, kp, packed.data(), pairs, ht, out); break;
        default: break;
      }
      for (int64_t r = 0; t + r < m; ++r) epi.store(t + r, n0, nb, out + r * kOuterCols);
    }
  });
}

// The bf16 build's many-token path (see ManyTokens in _cpu_fp8_dot.h), from 17 tokens:
// N = K = 4096, 2 threads, bf16, time over bf16 F.linear's, the 4 x 4 row-dot tile
// against this one: fp8_per_channel 0.62 / 0.88 at M = 16, 1.03-1.63 / 0.89-0.95 at 24,
// 0.95-1.12 / 0.97 at 32, 1.02-1.18 / 0.92-0.93 at 48; fp8_block 0.83 / 0.84 at 16,
// 0.96-1.24 / 0.90-0.91 at 24, 1.10 / 0.92-1.01 at 32, 1.31 / 1.02 at 64 (a noisy machine).
// With AMX (the avx512_amx level) the weights go to AMX tiles instead, from kAmxFrom tokens
// (_cpu_bf16_amx.h, included at the end of this header). On the 2-core AMX Xeon
// (fp8_per_channel, N = K = 4096, bf16, one weight, hot), the few-token tile against AMX's:
// 0.62 / 0.75-0.79 / 0.90-0.96 / 1.46-1.52 ms at M = 2 / 3 / 4 / 6 against 0.75 /
// 0.72-0.78 / 0.72-0.74 / 0.72-0.75.
#if defined(KERNELPICK_AMX)
constexpr int64_t kAmxFrom = 4;
template <bool G>
void amx_tokens(const uint16_t* x, int64_t m, int64_t kp, const uint8_t* w, int64_t n,
                int64_t k, const Epilogue& epi, const KGroups& kg);
#endif
template <bool G>
struct ManyTokens<Bf16x64, G> {
#if defined(KERNELPICK_AMX)
  static constexpr int64_t kFrom = kAmxFrom;
#else
  static constexpr int64_t kFrom = 17;
#endif
  static void run(const uint16_t* x, int64_t m, int64_t kp, const uint8_t* w, int64_t n,
                  int64_t k, const Epilogue& epi, const KGroups& kg) {
#if defined(KERNELPICK_AMX)
    amx_tokens<G>(x, m, kp, w, n, k, epi, kg);
#else
    outer_tokens<G>(x, m, kp, w, n, k, epi, kg);
#endif
  }
};

}  // namespace
#endif

#include "_cpu_bf16_amx.h"
