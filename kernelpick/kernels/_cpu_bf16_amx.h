// The many-token path of kernelpick's CPU GEMM on a CPU with AMX (the avx512_amx build):
// the FP8 weight decoded to bf16 pairs (the VNNI layout of a bf16 B matrix: pack_step16
// and pack_pairs, _cpu_bf16_outer.h) and multiplied on AMX tiles. Up to kTileTokens tokens
// with this file's own tile code, which decodes each 64-deep step of a panel into L1 just
// before its tiles read it; past them by oneDNN's batch-reduce GEMM micro-kernel as torch
// exposes it (at::native::cpublas::brgemm) on panels packed whole. Included by
// _cpu_bf16_outer.h only.
//
// The products are exact as with vdpbf16ps (each e4m3 weight and each bf16-exact activation
// is a bf16 value, and a product of two has at most 16 significant bits), the sums fp32.
// AMX's tdpbf16ps runs 16 x 16 x 32 multiply-adds an instruction: on a 2-core Xeon with
// AMX, torch's bf16 F.linear (the same units) ran N = K = 4096, M = 256 in 3.9-4.8 ms,
// where the outer products of the bf16 build took 40 ms.
#pragma once

#include "_cpu_bf16_outer.h"

#if defined(__AVX512BF16__) && defined(KERNELPICK_AMX)
#include <ATen/native/CPUBlas.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

// Up to kTileTokens tokens the tiles are this file's own (tile_tokens): a panel of 32
// channels is decoded one 64-deep step at a time into B tiles in L1 and multiplied at
// once, for one block of up to 32 tokens, the decode run again for every block. oneDNN's
// brgemm (amx_tokens, past kTileTokens) instead streams each panel, packed whole into L2,
// once per block of tokens, which cost more up to 96 tokens. On the 2-core AMX Xeon
// (fp8_per_channel, N = K = 4096, bf16, one weight, hot), this kernel against brgemm:
// 0.81 / 0.94 / 1.17 / 2.2 / 3.3 / 4.4 ms at M = 8 / 16 / 32 / 64 / 96 / 128 against
// 1.72 / 1.80 / 1.8-2.4 / 3.4 / 4.8 / 4.2. A 16-token block of 64 channels (four sums
// tiles on one activation tile) took 1.13-1.26 ms at M = 8-16.
constexpr int64_t kTileTokens = 96;

// Linux hands out AMX's tile state only to a process that asks for it (arch_prctl
// ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), once; oneDNN asks too.
inline bool amx_permitted() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return granted;
}

// Tiles 0-3 hold the sums of 2 blocks of up to 16 tokens x 2 groups of 16 channels (tile
// 2r + c), tiles 4 and 5 the blocks' activations for one 32-deep half of a step, tiles 6
// and 7 the two groups' 16 pairs of weights for it. The second block's tiles are left out
// when it has no tokens.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  explicit TileConfig(int64_t tokens) {
    const auto first = static_cast<uint8_t>(std::min<int64_t>(16, tokens));
    const auto second = static_cast<uint8_t>(std::max<int64_t>(0, tokens - 16));
    rows[0] = rows[1] = rows[4] = first;
    rows[2] = rows[3] = rows[5] = second;
    rows[6] = rows[7] = 16;
    // A tile with bytes but no rows makes the configuration invalid (a fault on loading it).
    for (int t = 0; t < 8; ++t) colsb[t] = rows[t] ? 64 : 0;
  }
};

// Block scales: K group g's sums of tokens [t0, t0 + tokens) against channels [n0, n0 +
// cols) (``part``, a row of ``cols`` a token, a multiple of 16) scaled by the group's
// activation and weight scales into ``sums``, which group 0 starts.
inline void add_group(const float* part, const KGroups& kg, int64_t t0, int64_t tokens,
                      int64_t n0, int64_t cols, int64_t g, float* sums) {
  for (int64_t t = 0; t < tokens; ++t) {
    const __m512 scale = _mm512_set1_ps(kg.scale(t0 + t, n0, g));
    const float* in = part + t * cols;
    float* out = sums + t * cols;
    for (int64_t c = 0; c < cols; c += 16) {
      const __m512 v = _mm512_loadu_ps(in + c);
      _mm512_storeu_ps(out + c, g == 0 ? _mm512_mul_ps(v, scale)
                                       : _mm512_fmadd_ps(v, scale, _mm512_loadu_ps(out + c)));
    }
  }
}

// fp32 and fp16 activations of weight-only layers take the tiles as bf16 planes from
// kSplitFrom to kSplitTokens tokens; elsewhere the fp32 tiles and panels. On the 2-core AMX
// Xeon (128 x 128 block weights, N = K = 4096, fp32, weights rotated past the LLC), planes
// against the fp32 paths: 1.27 / 1.41 / 1.91 / 2.27 ms at M = 4 / 8 / 12 / 16 against 0.96
// / 1.79 / 2.32 / 3.03; 0.90 of fp32 F.linear's time at M = 64 against 1.34; 12.9 ms at
// M = 96 against 13.6 (three planes, three blocks of tokens: each decode's tiles kept busy).
constexpr int64_t kSplitFrom = 8, kSplitTokens = 64;

// One row of kp fp32 values as ``planes`` rows of bf16 bits ``plane`` apart, whose sum is
// every value exactly: fp32's 24 significant bits are three bf16's 8 (an fp16 value's 11
// fit in two), each plane the top 16 bits of what the ones before it left, a difference
// fp32 holds exactly. Truncated, not rounded, so that no plane overflows to infinity. An
// infinity stays in the first plane, a NaN too (made quiet: the top half of a NaN's bits
// can read as an infinity), with zeros after both. A value under 2^-110 or so may leave
// a remainder AMX flushes as a subnormal, a relative error of 2^-16 at most.
inline void split_planes(const float* row, int64_t kp, int planes, int64_t plane,
                         uint16_t* out) {
  const __m512i top = _mm512_set1_epi32(int(0xFFFF0000u));
  const __m512i exponent = _mm512_set1_epi32(0x7F800000);
  const __m512i quiet = _mm512_set1_epi32(0x00400000);
  for (int64_t i = 0; i < kp; i += 16) {  // kp: a multiple of Bf16x64::kStep
    __m512i rest = _mm512_castps_si512(_mm512_loadu_ps(row + i));
    const __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(rest, exponent), exponent);
    const __mmask16 nan = _mm512_cmp_ps_mask(_mm512_castsi512_ps(rest), _mm512_castsi512_ps(rest),
                                             _CMP_UNORD_Q);
    rest = _mm512_mask_or_epi32(rest, nan, rest, quiet);
    for (int q = 0; q < planes; ++q) {
      const __m512i high = _mm512_and_si512(rest, top);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + q * plane + i),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(high, 16)));
      const __m512 left = _mm512_sub_ps(_mm512_castsi512_ps(rest), _mm512_castsi512_ps(high));
      rest = _mm512_maskz_mov_epi32(__mmask16(~special), _mm512_castps_si512(left));
    }
  }
}

// Tokens [0, m) against every panel of 32 channels, shared out among the threads, 32 tokens
// at a time. With block scales (G) each group's sums leave the tiles and are scaled into
// fp32 sums in memory as they are added. Activations that bf16 does not hold (fp32 or
// fp16, in weight-only layers) come as ``planes`` of bf16 rows ``plane`` apart whose sum is
// each value (split_planes): every plane meets each weight tile while it is loaded.
template <bool G>
void tile_tokens(const uint16_t* x, int64_t m, int64_t kp, const uint8_t* w, int64_t n,
                 int64_t k, const Epilogue& epi, const KGroups& kg, int planes = 1,
                 int64_t plane = 0) {
  constexpr int kCols = 32, kBlock = 32;
  TORCH_CHECK(amx_permitted(), "kernelpick fp8_gemm: Linux did not grant this process AMX tiles");
  const Steps<Bf16x64> steps(k);
  const int64_t panels = (n + kCols - 1) / kCols;
  const int64_t group_steps = G ? kg.size / Bf16x64::kStep : steps.all;
  const int64_t lda = kp * int64_t(sizeof(uint16_t));
  at::parallel_for(0, panels, 1, [&](int64_t b0, int64_t b1) {
    alignas(64) uint32_t b[2][kStepPairs * 16];  // 32 pairs of 16 channels, each group
    alignas(64) float part[kBlock][kCols], sums[kBlock][kCols];
    for (int64_t p = b0; p < b1; ++p) {
      const int64_t n0 = p * kCols, nb = std::min<int64_t>(kCols, n - n0);
      for (int64_t t0 = 0; t0 < m; t0 += kBlock) {
        const int64_t mt = std::min<int64_t>(kBlock, m - t0);
        const bool two = mt > 16;
        const TileConfig config(mt);
        _tile_loadconfig(&config);
        const uint16_t* a = x + t0 * kp;
        for (int64_t s0 = 0, g = 0; s0 < steps.all; s0 += group_steps, ++g) {
          _tile_zero(0);
          _tile_zero(1);
          if (two) {
            _tile_zero(2);
            _tile_zero(3);
          }
          for (int64_t s = s0; s < std::min(steps.all, s0 + group_steps); ++s) {
            pack_step16(w + n0 * k, k, nb, s, steps, b[0], 16);
            pack_step16(w + (n0 + 16) * k, k, nb - 16, s, steps, b[1], 16);
            for (int half = 0; half < 2; ++half) {
              _tile_loadd(6, b[0] + 256 * half, 64);
              _tile_loadd(7, b[1] + 256 * half, 64);
              for (int q = 0; q < planes; ++q) {
                const int64_t at = q * plane + s * Bf16x64::kStep + 32 * half;
                _tile_loadd(4, a + at, lda);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                if (two) {
                  _tile_loadd(5, a + 16 * kp + at, lda);
                  _tile_dpbf16ps(2, 5, 6);
                  _tile_dpbf16ps(3, 5, 7);
                }
              }
            }
          }
          float(*into)[kCols] = G ? part : sums;
          _tile_stored(0, &into[0][0], kCols * 4);
          _tile_stored(1, &into[0][16], kCols * 4);
          if (two) {
            _tile_stored(2, &into[16][0], kCols * 4);
            _tile_stored(3, &into[16][16], kCols * 4);
          }
          if constexpr (G) add_group(&part[0][0], kg, t0, mt, n0, kCols, g, &sums[0][0]);
        }
        for (int64_t t = 0; t < mt; ++t) epi.store(t0 + t, n0, nb, sums[t]);
      }
    }
    _tile_release();
  });
}

// Output channels per panel: two of pack_pairs' 32 side by side (512 KiB of bf16 pairs at
// K = 4096, in L2). A power of two up to 128 divides every block size, so with block
// scales a panel lies in one weight block. Tokens per multiply: 32. On the 2-core AMX
// Xeon (fp8_per_channel, N = K = 4096, bf16, one weight, hot), 16 / 32 / 64 / 128 tokens
// took 4.1 / 3.4 / 3.5 / 3.4 ms at M = 64 and 104 / 85 / 85 / 82 at M = 2048; panels of
// 32 or 128 channels were slower than 64 in the rotated benchmark (1.07-1.61 against
// 0.72-0.76 of bf16 F.linear at M = 64). Neither a padded row stride for the activations
// nor K split into 256- or 512-long calls was faster.
constexpr int64_t kAmxCols = 2 * kOuterCols;
constexpr int64_t kAmxTokens = 32;
static_assert(kAmxCols % kOuterCols == 0 && 128 % kAmxCols == 0, "a panel is whole packs in a block");

// Tokens [0, m) against every panel of kAmxCols rows, the panels shared out among the
// threads: each decoded and packed once per call into memory its thread keeps, then every
// block of tokens against it. With block scales (G) each K group is multiplied on its own
// and its sums scaled by the group's activation and weight scales as they are added.
template <bool G>
void amx_tokens(const uint16_t* x, int64_t m, int64_t kp, const uint8_t* w, int64_t n,
                int64_t k, const Epilogue& epi, const KGroups& kg) {
  if (m <= kTileTokens) return tile_tokens<G>(x, m, kp, w, n, k, epi, kg);
  // K as the packs and the rows hold it: whole steps, zeros past k on both sides.
  const int64_t kk = Steps<Bf16x64>(k).all * Bf16x64::kStep;
  const int64_t panels = (n + kAmxCols - 1) / kAmxCols;
  at::parallel_for(0, panels, 1, [&](int64_t b0, int64_t b1) {
    // Kept per thread between calls (fresh ones each call would cost page faults).
    thread_local std::vector<uint32_t> packed;
    thread_local std::vector<float> sums, part;
    const size_t size = size_t(kk / 2 * kAmxCols), tile = size_t(kAmxTokens * kAmxCols);
    if (packed.size() < size) packed.resize(size);
    if (sums.size() < tile) sums.resize(tile), part.resize(tile);
    const auto* b = reinterpret_cast<const at::BFloat16*>(packed.data());
    for (int64_t p = b0; p < b1; ++p) {
      const int64_t n0 = p * kAmxCols;
      const int64_t nb = std::min<int64_t>(kAmxCols, n - n0);
      const int64_t cols = (nb + kOuterCols - 1) / kOuterCols * kOuterCols;
      for (int64_t c = 0; c < cols; c += kOuterCols)
        pack_pairs(w + (n0 + c) * k, k, std::min<int64_t>(kOuterCols, nb - c), packed.data() + c,
                   cols);
      for (int64_t t0 = 0; t0 < m; t0 += kAmxTokens) {
        const int64_t mt = std::min(kAmxTokens, m - t0);
        const auto* a = reinterpret_cast<const at::BFloat16*>(x + t0 * kp);
        if constexpr (!G) {
          at::native::cpublas::brgemm(mt, cols, kk, kp, cols, cols, false, a, b, sums.data());
        } else {
          for (int64_t g = 0; g < kg.count; ++g) {
            const int64_t k0 = g * kg.size, len = std::min(kg.size, kk - k0);
            at::native::cpublas::brgemm(mt, cols, len, kp, cols, cols, false, a + k0,
                                        b + k0 * cols, part.data());
            add_group(part.data(), kg, t0, mt, n0, cols, g, sums.data());
          }
        }
        for (int64_t t = 0; t < mt; ++t) epi.store(t0 + t, n0, nb, sums.data() + t * cols);
      }
    }
    // The tile configuration is the thread's until released.
    at::native::cpublas::brgemm_release();
  });
}

}  // namespace
#endif
