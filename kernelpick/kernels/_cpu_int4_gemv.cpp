// kernelpick's CPU int4 weight-only GEMM for bf16 activations: y = x @ W^T in fp32, W the
// layer's int4 values as compressed-tensors' pack-quantized bytes hold them (u = q + 8 a
// nibble; value k of a row in the low nibble of byte k / 2 when k is even, the high one
// when odd), each 32 values of K along a row with one fp32 scale and one zero point z.
//
// Built at every ISA level with the rest of the CPU kernels (_cpu_build.py); it registers
// kernelpick::int4_gemm_<level> only where AVX512-BF16 is on: the products run on
// vdpbf16ps, exact (a bf16 activation times q - z, which bf16 holds exactly; vdpbf16ps
// reads subnormal activations as zero), summed in fp32 over each group before its scale
// (so activations near fp32's largest can overflow a group's sum).
//
// Decode reads each weight byte once per block of tokens: the nibbles of 32 bytes widen to
// words (low nibbles: even k, high: odd k), take their shift 7 - z, and become the bf16
// value q - z by one vpermw of a 32-entry table. The activations are split per 64 values
// into their even and odd halves once per call, so both halves meet their weights in the
// order the decode leaves them.

#if defined(__AVX512BF16__)

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

#define KP_STR2(x) #x
#define KP_STR(x) KP_STR2(x)
#define KP_INT4_OP "int4_gemm_" KP_STR(KP_LEVEL)

namespace {

constexpr int64_t kBlock = 64;   // values of K a step decodes (32 bytes)
constexpr int64_t kTokens = 8;   // tokens that share one decode of a block

// bf16 bits of i - 15 for i = 0..31: a nibble u read with its shift 7 - z (z the zero
// point) is entry u + 7 - z, the value u - 8 - z = q - z, in -15..15. Symmetric layers
// read u itself, from the table of i - 8 (``first`` -8).
__m512i value_table(int first) {
  alignas(64) uint16_t table[32];
  for (int i = 0; i < 32; ++i) {
    const float value = float(i + first);
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    table[i] = uint16_t(bits >> 16);  // exact: small integers are bf16 values
  }
  return _mm512_load_si512(table);
}

constexpr int kShiftedFirst = -15;
constexpr int kSymmetricFirst = -8;

// x [m, k] bf16 into [m, kp] bf16: each 64 values as their 32 even then 32 odd ones, zeros
// past K (their weights are any nibble: a zero activation adds nothing).
void split_rows(const uint16_t* x, int64_t m, int64_t k, int64_t kp, uint16_t* out) {
  at::parallel_for(0, m, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint16_t* row = x + r * k;
      uint16_t* dst = out + r * kp;
      for (int64_t b = 0; b < kp; b += kBlock) {
        for (int64_t j = 0; j < kBlock / 2; ++j) {
          const int64_t even = b + 2 * j;
          dst[b + j] = even < k ? row[even] : 0;
          dst[b + kBlock / 2 + j] = even + 1 < k ? row[even + 1] : 0;
        }
      }
    }
  });
}

// The bf16 weights of one block of 64 values: even k (low nibbles) and odd k (high ones).
struct Decoded {
  __m512bh even, odd;
};

// ``shift`` (Shifted only): each word's 7 - z (words 0-15 hold k 0..31 of the block,
// 16-31 k 32..63).
template <bool Shifted>
inline Decoded decode(const uint8_t* bytes, __m512i table, __m512i low, __m512i shift) {
  const __m512i words =
      _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes)));
  __m512i even = _mm512_and_si512(words, low);
  __m512i odd = _mm512_srli_epi16(words, 4);
  if constexpr (Shifted) {
    even = _mm512_add_epi16(even, shift);
    odd = _mm512_add_epi16(odd, shift);
  }
  return {(__m512bh)_mm512_permutexvar_epi16(even, table),
          (__m512bh)_mm512_permutexvar_epi16(odd, table)};
}

// The shifts of block b, one per 32 values of a row's ``shifts`` (none when symmetric).
template <bool Shifted>
inline __m512i block_shift(const int16_t* shifts, int64_t b) {
  if constexpr (!Shifted) return _mm512_setzero_si512();
  return _mm512_mask_blend_epi16(__mmask32(0xFFFF0000u), _mm512_set1_epi16(shifts[2 * b]),
                                 _mm512_set1_epi16(shifts[2 * b + 1]));
}

inline __m512 dot(const Decoded& w, const uint16_t* xb, __m512 sum) {
  const __m512bh xe = (__m512bh)_mm512_loadu_si512(xb);
  const __m512bh xo = (__m512bh)_mm512_loadu_si512(xb + kBlock / 2);
  return _mm512_dpbf16_ps(_mm512_dpbf16_ps(sum, w.even, xe), w.odd, xo);
}

// Rows [n0, n1) for tokens [t0, t0 + Count): out[t, n] = the sum over K of x times the
// weight, each 32 values' partial sum scaled by its scale. A dpbf16 lane sums the pairs of
// words 2i and 2i + 1, so lanes 0-7 hold k 0..31 of a block and lanes 8-15 k 32..63.
// ``span``: blocks that share one scale (a group of 64 x span values), or 0 where the two
// halves of a block may have scales of their own (groups of 32).
template <int Count, bool Shifted>
void rows(const uint16_t* xs, int64_t kp, const uint8_t* w, const float* half_scales,
          const int16_t* half_shifts, int64_t n0, int64_t n1, int64_t t0, float* out, int64_t n,
          int64_t span) {
  const __m512i table = value_table(Shifted ? kShiftedFirst : kSymmetricFirst);
  const __m512i low = _mm512_set1_epi16(0x0F);
  const int64_t blocks = kp / kBlock;
  for (int64_t row = n0; row < n1; ++row) {
    const uint8_t* bytes = w + row * (kp / 2);
    const float* scales = half_scales + row * (2 * blocks);
    const int16_t* shifts = half_shifts == nullptr ? nullptr : half_shifts + row * (2 * blocks);
    const uint16_t* x0 = xs + t0 * kp;
    __m512 acc[Count];
    for (int t = 0; t < Count; ++t) acc[t] = _mm512_setzero_ps();
    if (span > 0) {  // whole groups of blocks: their sums in fp32, then one scale each
      for (int64_t g0 = 0; g0 < blocks; g0 += span) {
        const int64_t g1 = std::min(g0 + span, blocks);
        __m512 part[Count];
        for (int t = 0; t < Count; ++t) part[t] = _mm512_setzero_ps();
        for (int64_t b = g0; b < g1; ++b) {
          const Decoded d =
              decode<Shifted>(bytes + b * (kBlock / 2), table, low, block_shift<Shifted>(shifts, b));
          for (int t = 0; t < Count; ++t) part[t] = dot(d, x0 + t * kp + b * kBlock, part[t]);
        }
        const __m512 scale = _mm512_set1_ps(scales[2 * g0]);
        for (int t = 0; t < Count; ++t) acc[t] = _mm512_fmadd_ps(part[t], scale, acc[t]);
      }
    } else {
      for (int64_t b = 0; b < blocks; ++b) {
        const Decoded d =
            decode<Shifted>(bytes + b * (kBlock / 2), table, low, block_shift<Shifted>(shifts, b));
        const __m512 scale = _mm512_mask_blend_ps(
            __mmask16(0xFF00), _mm512_set1_ps(scales[2 * b]), _mm512_set1_ps(scales[2 * b + 1]));
        for (int t = 0; t < Count; ++t) {
          const __m512 part = dot(d, x0 + t * kp + b * kBlock, _mm512_setzero_ps());
          acc[t] = _mm512_fmadd_ps(part, scale, acc[t]);
        }
      }
    }
    for (int t = 0; t < Count; ++t) out[(t0 + t) * n + row] = _mm512_reduce_add_ps(acc[t]);
  }
}

using RowsFn = void (*)(const uint16_t*, int64_t, const uint8_t*, const float*,
                        const int16_t*, int64_t, int64_t, int64_t, float*, int64_t, int64_t);
constexpr RowsFn kRows[2][kTokens] = {
    {rows<1, false>, rows<2, false>, rows<3, false>, rows<4, false>, rows<5, false>,
     rows<6, false>, rows<7, false>, rows<8, false>},
    {rows<1, true>, rows<2, true>, rows<3, true>, rows<4, true>, rows<5, true>, rows<6, true>,
     rows<7, true>, rows<8, true>}};

// x [M, K] bf16; weight [N, Kp / 2] uint8 (Kp: K padded to a multiple of 64); half_scales
// [N, Kp / 32] fp32, the scale of each 32 values of a row; half_shifts [N, Kp / 32] int16,
// each 32 values' 7 - z (None: symmetric); span: blocks of 64 that share one scale and
// shift (0: the halves of a block may differ). Returns [M, N] fp32.
at::Tensor int4_gemm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& half_scales,
                     const std::optional<at::Tensor>& half_shifts, int64_t span) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(),
              "int4_gemm: x must be a contiguous [M, K] bf16 tensor");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kByte && weight.is_contiguous(),
              "int4_gemm: weight must be a contiguous [N, Kp / 2] uint8 tensor");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0), kp = weight.size(1) * 2;
  TORCH_CHECK(kp % kBlock == 0 && k <= kp,
              "int4_gemm: the weight's K must be x's padded to a multiple of 64");
  TORCH_CHECK(half_scales.scalar_type() == at::kFloat && half_scales.is_contiguous() &&
                  half_scales.dim() == 2 && half_scales.size(0) == n &&
                  half_scales.size(1) == kp / 32,
              "int4_gemm: half_scales must be a contiguous [N, Kp / 32] fp32 tensor");
  TORCH_CHECK(span >= 0, "int4_gemm: span must be 0 or a count of blocks");
  if (half_shifts.has_value()) {
    const at::Tensor& h = *half_shifts;
    TORCH_CHECK(h.scalar_type() == at::kShort && h.is_contiguous() && h.dim() == 2 &&
                    h.size(0) == n && h.size(1) == kp / 32,
                "int4_gemm: half_shifts must be a contiguous [N, Kp / 32] int16 tensor");
  }
  at::Tensor out = at::empty({m, n}, x.options().dtype(at::kFloat));
  if (m == 0 || n == 0) return out;
  at::Tensor xs = at::empty({m, kp}, x.options());
  auto* split = reinterpret_cast<uint16_t*>(xs.data_ptr<at::BFloat16>());
  split_rows(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), m, k, kp, split);
  const uint8_t* w = weight.data_ptr<uint8_t>();
  const float* hs = half_scales.data_ptr<float>();
  const int16_t* sh = half_shifts.has_value() ? half_shifts->data_ptr<int16_t>() : nullptr;
  float* o = out.data_ptr<float>();
  // Rows in parallel: each thread streams its rows' bytes once per block of tokens.
  at::parallel_for(0, n, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t t0 = 0; t0 < m; t0 += kTokens) {
      const int64_t count = std::min<int64_t>(kTokens, m - t0);
      kRows[sh != nullptr][count - 1](split, kp, w, hs, sh, n0, n1, t0, o, n, span);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kernelpick, m) {
  m.def(KP_INT4_OP "(Tensor x, Tensor weight, Tensor half_scales, Tensor? half_shifts, int span) "
                   "-> Tensor");
}

TORCH_LIBRARY_IMPL(kernelpick, CPU, m) { m.impl(KP_INT4_OP, &int4_gemm); }

#endif  // __AVX512BF16__
