// kernelpick's CPU int4 weight-only GEMM for bf16 activations: y = x @ W^T in fp32, W the
// layer's int4 values as compressed-tensors' pack-quantized bytes hold them (u = q + 8 a
// nibble; value k of a row in the low nibble of byte k / 2 when k is even, the high one
// when odd), each group of K along a row (32 values or a multiple of 64, or the row) with
// one fp32 scale and one zero point z.
//
// Built at every ISA level with the rest of the CPU kernels (_cpu_build.py); it registers
// kernelpick::int4_gemm_<level> only where AVX512-BF16 is on: the products run on
// vdpbf16ps, exact (a bf16 activation times q - z, which bf16 holds exactly; vdpbf16ps
// reads subnormal activations as zero), summed in fp32 over each group before its scale
// (so activations near fp32's largest can overflow a group's sum).
//
// Decode reads each weight byte from memory once, and once from cache per block of eight
// tokens: the nibbles of 32 bytes widen to
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

inline __m512 dot(const Decoded& w, const uint16_t* xb, __m512 sum) {
  const __m512bh xe = (__m512bh)_mm512_loadu_si512(xb);
  const __m512bh xo = (__m512bh)_mm512_loadu_si512(xb + kBlock / 2);
  return _mm512_dpbf16_ps(_mm512_dpbf16_ps(sum, w.even, xe), w.odd, xo);
}

// The words' shifts of one block whose halves (k 0..31 in words 0-15, 32..63 in 16-31)
// have shifts ``a`` and ``b``.
inline __m512i halves(int16_t a, int16_t b) {
  return _mm512_mask_blend_epi16(__mmask32(0xFFFF0000u), _mm512_set1_epi16(a),
                                 _mm512_set1_epi16(b));
}

// Rows [row0, row0 + R) for tokens [t0, t0 + Count): out[t, n] = the sum over K of x times
// the weight, each group's partial sum in fp32 times its scale. A dpbf16 lane sums the
// pairs of words 2i and 2i + 1, so lanes 0-7 hold k 0..31 of a block and lanes 8-15 k
// 32..63. ``span``: blocks of 64 that share one scale and shift (a row has kp / (64 span)
// of each), or 0 for groups of 32 (a row has kp / 32). The R rows' chains of dpbf16 are
// independent, and each activation load serves all R (tile_rows says how many).
template <int Count, int R, bool Shifted>
void tile(const uint16_t* xs, int64_t kp, const uint8_t* w, const float* scales,
          const int16_t* shifts, int64_t row0, int64_t t0, float* out, int64_t n, int64_t span) {
  const __m512i table = value_table(Shifted ? kShiftedFirst : kSymmetricFirst);
  const __m512i low = _mm512_set1_epi16(0x0F);
  const int64_t blocks = kp / kBlock;
  const int64_t per_row = span > 0 ? blocks / span : 2 * blocks;  // scales (and shifts)
  const uint16_t* x0 = xs + t0 * kp;
  const uint8_t* bytes[R];
  const float* scale_row[R];
  const int16_t* shift_row[R];
  for (int r = 0; r < R; ++r) {
    bytes[r] = w + (row0 + r) * (kp / 2);
    scale_row[r] = scales + (row0 + r) * per_row;
    shift_row[r] = Shifted ? shifts + (row0 + r) * per_row : nullptr;
  }
  __m512 acc[R][Count];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < Count; ++t) acc[r][t] = _mm512_setzero_ps();
  if (span > 0) {  // whole groups of blocks: their sums in fp32, then one scale each
    for (int64_t g = 0; g < per_row; ++g) {
      __m512i shift[R];
      for (int r = 0; r < R; ++r)
        shift[r] = Shifted ? _mm512_set1_epi16(shift_row[r][g]) : _mm512_setzero_si512();
      __m512 part[R][Count];
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < Count; ++t) part[r][t] = _mm512_setzero_ps();
      for (int64_t b = g * span; b < (g + 1) * span; ++b) {
        Decoded d[R];
        for (int r = 0; r < R; ++r)
          d[r] = decode<Shifted>(bytes[r] + b * (kBlock / 2), table, low, shift[r]);
        for (int t = 0; t < Count; ++t)
          for (int r = 0; r < R; ++r) part[r][t] = dot(d[r], x0 + t * kp + b * kBlock, part[r][t]);
      }
      for (int r = 0; r < R; ++r) {
        const __m512 scale = _mm512_set1_ps(scale_row[r][g]);
        for (int t = 0; t < Count; ++t) acc[r][t] = _mm512_fmadd_ps(part[r][t], scale, acc[r][t]);
      }
    }
  } else {  // groups of 32: a block's halves have a scale and shift each
    for (int64_t b = 0; b < blocks; ++b) {
      Decoded d[R];
      __m512 scale[R];
      for (int r = 0; r < R; ++r) {
        const __m512i shift =
            Shifted ? halves(shift_row[r][2 * b], shift_row[r][2 * b + 1]) : _mm512_setzero_si512();
        d[r] = decode<Shifted>(bytes[r] + b * (kBlock / 2), table, low, shift);
        scale[r] = _mm512_mask_blend_ps(__mmask16(0xFF00), _mm512_set1_ps(scale_row[r][2 * b]),
                                        _mm512_set1_ps(scale_row[r][2 * b + 1]));
      }
      for (int t = 0; t < Count; ++t)
        for (int r = 0; r < R; ++r) {
          const __m512 part = dot(d[r], x0 + t * kp + b * kBlock, _mm512_setzero_ps());
          acc[r][t] = _mm512_fmadd_ps(part, scale[r], acc[r][t]);
        }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < Count; ++t) out[(t0 + t) * n + row0 + r] = _mm512_reduce_add_ps(acc[r][t]);
}

// Rows a tile takes together at ``Count`` tokens: from two tokens on, the products bound
// the step, and a tile shares each activation load across its rows and overlaps their
// chains (measured on Zen 4: four rows at two tokens, two from three to eight). One token
// is bound by memory instead, and reads fastest one row at a time: a row's bytes follow
// the last row's as one stream (two or four rows: 0.42-0.45 of fp16 F.linear, one: 0.30).
constexpr int tile_rows(int count) { return count == 1 ? 1 : count == 2 ? 4 : 2; }

// Rows [n0, n1) for tokens [t0, t0 + Count), in tiles of tile_rows(Count) then one by one.
template <int Count, bool Shifted>
void rows(const uint16_t* xs, int64_t kp, const uint8_t* w, const float* scales,
          const int16_t* shifts, int64_t n0, int64_t n1, int64_t t0, float* out, int64_t n,
          int64_t span) {
  constexpr int R = tile_rows(Count);
  int64_t row = n0;
  for (; row + R <= n1; row += R)
    tile<Count, R, Shifted>(xs, kp, w, scales, shifts, row, t0, out, n, span);
  for (; row < n1; ++row) tile<Count, 1, Shifted>(xs, kp, w, scales, shifts, row, t0, out, n, span);
}

using RowsFn = void (*)(const uint16_t*, int64_t, const uint8_t*, const float*,
                        const int16_t*, int64_t, int64_t, int64_t, float*, int64_t, int64_t);
constexpr RowsFn kRows[2][kTokens] = {
    {rows<1, false>, rows<2, false>, rows<3, false>, rows<4, false>, rows<5, false>,
     rows<6, false>, rows<7, false>, rows<8, false>},
    {rows<1, true>, rows<2, true>, rows<3, true>, rows<4, true>, rows<5, true>, rows<6, true>,
     rows<7, true>, rows<8, true>}};

// Rows a thread takes through every block of tokens before the next: their bytes (16 rows
// of a 4096-deep layer are 32 KiB) stay in cache while each block of tokens reads them.
constexpr int64_t kRowChunk = 16;

// x [M, K] bf16; weight [N, Kp / 2] uint8 (Kp: K padded to a multiple of 64); span:
// blocks of 64 that share one scale and shift (0: groups of 32); scales [N, S] fp32 and
// shifts [N, S] int16, each group's scale and 7 - z (None: symmetric), S = Kp / (64 span),
// or Kp / 32 for span 0. Returns [M, N] fp32.
at::Tensor int4_gemm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                     const std::optional<at::Tensor>& shifts, int64_t span) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(),
              "int4_gemm: x must be a contiguous [M, K] bf16 tensor");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kByte && weight.is_contiguous(),
              "int4_gemm: weight must be a contiguous [N, Kp / 2] uint8 tensor");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0), kp = weight.size(1) * 2;
  TORCH_CHECK(kp % kBlock == 0 && k <= kp,
              "int4_gemm: the weight's K must be x's padded to a multiple of 64");
  TORCH_CHECK(span == 0 || (span > 0 && (kp / kBlock) % span == 0),
              "int4_gemm: span must be 0 or a count of blocks that divides the row's");
  const int64_t per_row = span > 0 ? kp / kBlock / span : kp / 32;
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.dim() == 2 &&
                  scales.size(0) == n && scales.size(1) == per_row,
              "int4_gemm: scales must be a contiguous [N, S] fp32 tensor, S = Kp / (64 span) "
              "(Kp / 32 for span 0)");
  if (shifts.has_value()) {
    const at::Tensor& h = *shifts;
    TORCH_CHECK(h.scalar_type() == at::kShort && h.is_contiguous() && h.dim() == 2 &&
                    h.size(0) == n && h.size(1) == per_row,
                "int4_gemm: shifts must be a contiguous int16 tensor shaped as scales");
  }
  at::Tensor out = at::empty({m, n}, x.options().dtype(at::kFloat));
  if (m == 0 || n == 0) return out;
  at::Tensor xs = at::empty({m, kp}, x.options());
  auto* split = reinterpret_cast<uint16_t*>(xs.data_ptr<at::BFloat16>());
  split_rows(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), m, k, kp, split);
  const uint8_t* w = weight.data_ptr<uint8_t>();
  const float* sc = scales.data_ptr<float>();
  const int16_t* sh = shifts.has_value() ? shifts->data_ptr<int16_t>() : nullptr;
  float* o = out.data_ptr<float>();
  // Rows in parallel; each thread streams its rows' bytes from memory once.
  at::parallel_for(0, n, kRowChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t c0 = n0; c0 < n1; c0 += kRowChunk) {
      const int64_t c1 = std::min(c0 + kRowChunk, n1);
      for (int64_t t0 = 0; t0 < m; t0 += kTokens) {
        const int64_t count = std::min<int64_t>(kTokens, m - t0);
        kRows[sh != nullptr][count - 1](split, kp, w, sc, sh, c0, c1, t0, o, n, span);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kernelpick, m) {
  m.def(KP_INT4_OP "(Tensor x, Tensor weight, Tensor scales, Tensor? shifts, int span) "
                   "-> Tensor");
}

TORCH_LIBRARY_IMPL(kernelpick, CPU, m) { m.impl(KP_INT4_OP, &int4_gemm); }

#endif  // __AVX512BF16__
