// The many-token path of kernelpick's CPU GEMM on a CPU with AMX (the avx512_amx build):
// the FP8 weight decoded once per call, panel by panel, into the VNNI layout of a bf16 B
// matrix (pack_pairs, _cpu_bf16_outer.h), and multiplied on AMX tiles by oneDNN's batch-
// reduce GEMM micro-kernel as torch exposes it (at::native::cpublas::brgemm: bf16 x bf16,
// fp32 sums). Included by _cpu_bf16_outer.h only.
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

namespace {

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
        pack_pairs(w + (n0 + c) * k, k, std::min<int64_t>(kOuterCols, nb - c), kTables,
                   packed.data() + c, cols);
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
            for (int64_t t = 0; t < mt; ++t) {
              const __m512 s = _mm512_set1_ps(kg.scale(t0 + t, n0, g));
              float* out = sums.data() + t * cols;
              const float* in = part.data() + t * cols;
              for (int64_t c = 0; c < cols; c += 16) {
                const __m512 v = _mm512_loadu_ps(in + c);
                _mm512_storeu_ps(out + c, g == 0 ? _mm512_mul_ps(v, s)
                                                 : _mm512_fmadd_ps(v, s, _mm512_loadu_ps(out + c)));
              }
            }
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
