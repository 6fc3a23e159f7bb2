// FP8 numerics of kernelpick's CPU GEMM: activation loads, per-token e4m3 quantization,
// exact FP8 decode (fp16 bits and F16C; bf16 tables and VBMI), and the vector types the
// dot products run on. Included by _cpu_fp8_gemm.cpp only.
//
// Exact FP8 decode: an e4m3fn byte s.eeee.mmm becomes the fp16 bits s.0eeee.mmm0000000 by
// (sign-extended b << 7) & 0xBFFF (the shift puts the sign in bits 15 and 14, the mask
// clears 14: three instructions, where ((b + (b & 0x80)) << 7) from the zero-extended
// byte takes four); fp16 has 3 more exponent bits and a bias 8 larger, so that fp16
// is the FP8 value times 2^-8, for normals and subnormals alike (an e4m3 subnormal m * 2^-9
// lands on the fp16 subnormal m * 2^-17). F16C's vcvtph2ps turns it into fp32 exactly; the
// 2^8 goes into the channel scale. NaN bytes (0x7F, 0xFF) would decode as finite values:
// kernelpick's weights are canonical (no NaN byte), which prepare_weights documents.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

// Internal linkage: builds of several ISA levels can be loaded into one process.
namespace {

constexpr float kFp8Max = 448.0f;
// vLLM's per-token quantizer floors the scale at 1 / (fp8_max * 512): an all-zero row does
// not divide by zero (kernelpick.kernels._quantize.SCALE_FLOOR_DIVISOR).
constexpr float kScaleFloor = 1.0f / (448.0f * 512.0f);
// The fp16 decode gives the FP8 value times 2^-8 (see the top of the file).
constexpr float kDecodeScale = 256.0f;
// The bits of a sign-extended FP8 byte shifted left by 7 that are its fp16 (all but 14).
constexpr short kFp16Bits = static_cast<short>(0xBFFF);

// ---------------------------------------------------------------------------------------
// Activation loads (8 lanes, AVX2): fp32, bf16 and fp16 rows as fp32.

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {
  __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}
inline __m256 load8(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// fp32 values already clamped to [-448, 448], rounded to the nearest e4m3 value (ties to
// even), kept in fp32. The quantum is 2^(e - 3) for |v| in [2^e, 2^(e+1)), and 2^-9 in the
// subnormal range (e < -6); scaling by a power of two is exact, so one round does it. This
// is what torch's fp32 -> float8_e4m3fn cast gives, without the byte.
inline __m256 round_e4m3(__m256 v) {
  const __m256i biased = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 23),
                                          _mm256_set1_epi32(0xFF));
  const __m256i e = _mm256_max_epi32(biased, _mm256_set1_epi32(127 - 6));
  const __m256 inv_q = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(127 + 127 + 3), e), 23));
  const __m256 q =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(3)), 23));
  const __m256 r = _mm256_round_ps(_mm256_mul_ps(v, inv_q),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_mul_ps(r, q);
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The fp32 values of one row of K elements, through a zero-padded copy for the tail.
template <typename T>
inline void row_to_f32(const T* x, int64_t k, float* out) {
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) _mm256_storeu_ps(out + i, load8(x + i));
  for (; i < k; ++i) out[i] = static_cast<float>(x[i]);
}

// The largest |v| of k fp32 values, NaN if any is NaN (as torch's amax): max_ps returns its
// second operand where either is NaN, so NaN lanes are tracked apart.
inline float row_amax(const float* v, int64_t k) {
  __m256 amax8 = _mm256_setzero_ps(), nan8 = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256 a = _mm256_and_ps(_mm256_loadu_ps(v + i), abs_mask);
    amax8 = _mm256_max_ps(amax8, a);
    nan8 = _mm256_or_ps(nan8, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, amax8);
  float amax = 0.0f;
  for (float lane : lanes) amax = lane > amax ? lane : amax;
  bool nan = _mm256_movemask_ps(nan8) != 0;
  for (; i < k; ++i) {
    const float a = v[i] < 0 ? -v[i] : v[i];
    nan = nan || a != a;
    amax = a > amax ? a : amax;
  }
  return nan ? __builtin_nanf("") : amax;
}

// The dynamic scale of values whose largest magnitude is ``amax``: max(amax / qmax, floor)
// (e4m3 by default), NaN for a NaN amax, inf for an infinite one
// (kernelpick.kernels._quantize's formula).
inline float dynamic_scale(float amax, float qmax = kFp8Max, float floor = kScaleFloor) {
  const float scale = amax / qmax;
  return scale < floor ? floor : scale;  // NaN stays NaN
}

// k fp32 values quantized with ``scale``: clamp(v / scale, -qmax, qmax), then ``round``
// (to e4m3 values, or to integers for int8), kept as fp32 values. The same fp32 operations
// as kernelpick.kernels._quantize (a division, not a reciprocal), so the same values.
template <class Round>
inline void quantize_with(float* v, int64_t k, float scale, float qmax, Round round) {
  const __m256 s8 = _mm256_set1_ps(scale);
  const __m256 lo = _mm256_set1_ps(-qmax), hi = _mm256_set1_ps(qmax);
  // min/max with the constant first: a NaN value (the second operand) passes through.
  auto one = [&](const float* in) {
    return round(_mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_div_ps(_mm256_loadu_ps(in), s8))));
  };
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) _mm256_storeu_ps(v + i, one(v + i));
  if (i < k) {
    float tail[8] = {0};
    std::memcpy(tail, v + i, sizeof(float) * (k - i));
    _mm256_storeu_ps(tail, one(tail));
    std::memcpy(v + i, tail, sizeof(float) * (k - i));
  }
}

// k fp32 values quantized to e4m3 values with ``scale``.
inline void quantize_with(float* v, int64_t k, float scale) {
  quantize_with(v, k, scale, kFp8Max, [](__m256 q) { return round_e4m3(q); });
}

// Dynamic quantization of one group of k values (a token's row, or 1 x b of it): its scale
// from its own amax, returned.
inline float quantize_row(float* v, int64_t k) {
  const float scale = dynamic_scale(row_amax(v, k));
  quantize_with(v, k, scale);
  return scale;
}

// fp32 -> bf16 bits by truncation: exact for e4m3 values (3 mantissa bits) and bf16 inputs.
inline void f32_to_bf16_exact(const float* v, int64_t k, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256i top = _mm256_srli_epi32(_mm256_castps_si256(_mm256_loadu_ps(v + i)), 16);
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(top), _mm256_extracti128_si256(top, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), packed);
  }
  for (; i < k; ++i) {
    uint32_t bits;
    std::memcpy(&bits, v + i, 4);
    out[i] = static_cast<uint16_t>(bits >> 16);
  }
}

// ---------------------------------------------------------------------------------------
// FP8 decode.

// The fp16 bits of 8 or 16 FP8 bytes (see the top of the file).
inline __m128i fp16_bits8(const uint8_t* w) {
  const __m128i b = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w)));
  return _mm_and_si128(_mm_slli_epi16(b, 7), _mm_set1_epi16(kFp16Bits));
}
inline __m256i fp16_bits16(const uint8_t* w) {
  const __m256i b =
      _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  return _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16(kFp16Bits));
}

// 8 FP8 bytes -> 8 fp32 values times 2^-8.
inline __m256 decode8(const uint8_t* w) { return _mm256_cvtph_ps(fp16_bits8(w)); }

#if defined(__AVX512F__)
// 16 FP8 bytes -> 16 fp32 values times 2^-8.
inline __m512 decode16(const uint8_t* w) { return _mm512_cvtph_ps(fp16_bits16(w)); }
#endif

// Decode rows of a panel to fp32 values, for the large-M path: ``decode8`` turns 8 weight
// bytes into 8 fp32 values (FP8 times 2^-8 here; int8 in _cpu_int8_codec.h); a row's last
// partial 8 go through a zero-padded copy.
template <class Decode8>
void decode_rows_with(const uint8_t* w, int64_t rows, int64_t k, float* out, Decode8 decode8) {
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* src = w + r * k;
      float* dst = out + r * k;
      int64_t i = 0;
      for (; i + 8 <= k; i += 8) _mm256_storeu_ps(dst + i, decode8(src + i));
      if (i < k) {
        uint8_t tail[8] = {0};
        float vals[8];
        std::memcpy(tail, src + i, k - i);
        _mm256_storeu_ps(vals, decode8(tail));
        std::memcpy(dst + i, vals, sizeof(float) * (k - i));
      }
    }
  });
}

void decode_rows_f32(const uint8_t* w, int64_t rows, int64_t k, float* out) {
  decode_rows_with(w, rows, k, out, [](const uint8_t* b) { return decode8(b); });
}

// ---------------------------------------------------------------------------------------
// The GEMV path: per ISA, a vector type, its width along K, decode, load and multiply-add.

// Each type's kTokens x kRows is the few-token register tile (_cpu_fp8_dot.h): that many
// accumulators, kRows decoded weight steps and one activation step must fit the register
// file (AVX2: 16 ymm; AVX-512: 32 zmm), or GCC keeps accumulators on the stack.

struct F32x8 {  // AVX2 + FMA + F16C, 8 weights a step: the few-token tile, 6 x 2
  using Acc = __m256;
  using W = __m256;
  using X = float;
  struct Ctx {};
  static constexpr int kStep = 8;
  // 12 accumulators, 2 weights, 1 activation: one decode of 8 bytes feeds 6 multiply-adds
  // (the 4 x 4 tile of 16-weight steps it replaced needed 26 registers and kept 10
  // accumulators on the stack; 42-46% of the FMA peak, against about 100% now).
  static constexpr int kTokens = 6, kRows = 2;
  static constexpr bool kKGroups = true;  // block scales, applied group by group
  static Acc zero() { return _mm256_setzero_ps(); }
  static W weights(const uint8_t* w, const Ctx&) { return decode8(w); }
  static W activations(const X* x) { return _mm256_loadu_ps(x); }
  static Acc madd(Acc acc, W x, W w) { return _mm256_fmadd_ps(x, w, acc); }
  static Acc add(Acc a, Acc b) { return _mm256_add_ps(a, b); }
  static float sum(Acc acc) { return hsum8(acc); }
};

struct F32x8Wide {  // AVX2, 16 weights a step, for one token: one widening and one shift
  using Acc = __m256;
  struct W {
    __m256 a, b;
  };
  using X = float;
  struct Ctx {};
  static constexpr int kStep = 16;
  static constexpr bool kKGroups = true;
  static Acc zero() { return _mm256_setzero_ps(); }
  static W weights(const uint8_t* w, const Ctx&) {
    const __m256i h = fp16_bits16(w);
    return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)),
            _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
  }
  static W activations(const X* x) { return {_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)}; }
  static Acc madd(Acc acc, W x, W w) {
    return _mm256_fmadd_ps(x.b, w.b, _mm256_fmadd_ps(x.a, w.a, acc));
  }
  static Acc add(Acc a, Acc b) { return _mm256_add_ps(a, b); }
  static float sum(Acc acc) { return hsum8(acc); }
};

#if defined(__AVX512F__)
struct F32x16 {  // AVX-512F
  using Acc = __m512;
  using W = __m512;
  using X = float;
  struct Ctx {};
  static constexpr int kStep = 16;
  static constexpr int kTokens = 6, kRows = 4;  // 24 accumulators, 4 weights, 1 activation
  static constexpr bool kKGroups = true;  // block scales, applied group by group
  static Acc zero() { return _mm512_setzero_ps(); }
  static W weights(const uint8_t* w, const Ctx&) { return decode16(w); }
  static W activations(const X* x) { return _mm512_loadu_ps(x); }
  static Acc madd(Acc acc, W x, W w) { return _mm512_fmadd_ps(x, w, acc); }
  static Acc add(Acc a, Acc b) { return _mm512_add_ps(a, b); }
  static float sum(Acc acc) { return _mm512_reduce_add_ps(acc); }
};
#endif

#if defined(__AVX512BF16__)
// 64 FP8 bytes -> their 64 bf16 values in two vectors (elements 0-31, 32-63), by
// table lookup (AVX512-VBMI): vpermi2b indexes 128 entries by the low 7 bits, ignoring the
// sign bit, once for each byte of the bf16; the sign is OR-ed in. The tables are the bf16
// of every e4m3fn magnitude, built from the exact fp16 decode; 0x7F (NaN) stays NaN. These
// are the values themselves (decode scale 1), not times 2^-8 as the fp16 decode gives.
struct Fp8Tables {
  __m512i hi0, hi1, lo0, lo1, order;
  Fp8Tables() {
    alignas(64) uint8_t hi[128], lo[128], perm[64];
    for (int i = 0; i < 128; ++i) {
      uint8_t byte[8] = {static_cast<uint8_t>(i)};
      float v[8];
      _mm256_storeu_ps(v, decode8(byte));
      // The true value (times 2^8, exact): bf16 has fp32's exponent range, so even
      // products with small activations stay clear of the denormals vdpbf16ps flushes.
      const float value = v[0] * kDecodeScale;
      uint32_t bits;
      std::memcpy(&bits, &value, 4);
      if (i == 0x7F) bits = 0x7FC00000u;
      hi[i] = static_cast<uint8_t>(bits >> 24);
      lo[i] = static_cast<uint8_t>(bits >> 16);
    }
    // unpacklo/hi interleave within 128-bit lanes: lane j of the first vector must come
    // from input bytes 8j..8j+7, of the second from 32+8j..32+8j+7.
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 8; ++i) {
        perm[16 * j + i] = static_cast<uint8_t>(8 * j + i);
        perm[16 * j + 8 + i] = static_cast<uint8_t>(32 + 8 * j + i);
      }
    hi0 = _mm512_loadu_si512(hi);
    hi1 = _mm512_loadu_si512(hi + 64);
    lo0 = _mm512_loadu_si512(lo);
    lo1 = _mm512_loadu_si512(lo + 64);
    order = _mm512_loadu_si512(perm);
  }
};


// Built when the library loads, which happens only on a CPU with this build's ISA.
const Fp8Tables kTables;

inline void decode64(const uint8_t* w, const Fp8Tables& t, __m512i& first, __m512i& second) {
  const __m512i v = _mm512_permutexvar_epi8(t.order, _mm512_loadu_si512(w));
  __m512i hi = _mm512_permutex2var_epi8(t.hi0, v, t.hi1);
  const __m512i lo = _mm512_permutex2var_epi8(t.lo0, v, t.lo1);
  hi = _mm512_ternarylogic_epi32(hi, v, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);
  first = _mm512_unpacklo_epi8(lo, hi);
  second = _mm512_unpackhi_epi8(lo, hi);
}

struct Bf16x64 {  // AVX512-BF16 + VBMI: vdpbf16ps multiplies pairs of bf16, adds in fp32
  using Acc = __m512;
  struct W {
    __m512bh a, b;
  };
  using X = uint16_t;
  using Ctx = Fp8Tables;
  static constexpr int kStep = 64;
  // 16 accumulators, 4 weights and 1 activation of two vectors each: 26 of 32 registers.
  static constexpr int kTokens = 4, kRows = 4;
  static constexpr bool kKGroups = true;  // block scales, applied group by group
  static Acc zero() { return _mm512_setzero_ps(); }
  static W weights(const uint8_t* w, const Ctx& t) {
    __m512i a, b;
    decode64(w, t, a, b);
    return {(__m512bh)a, (__m512bh)b};
  }
  static W activations(const X* x) {
    return {(__m512bh)_mm512_loadu_si512(x), (__m512bh)_mm512_loadu_si512(x + 32)};
  }
  // The FP8 values and the activations are exact in bf16, so the products are exact in fp32.
  static Acc madd(Acc acc, W x, W w) {
    return _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc, x.a, w.a), x.b, w.b);
  }
  static Acc add(Acc a, Acc b) { return _mm512_add_ps(a, b); }
  static float sum(Acc acc) { return _mm512_reduce_add_ps(acc); }
};
#endif

template <class V>
inline typename V::Ctx context() {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<V, Bf16x64>) return kTables;
#endif
  return {};
}

}  // namespace
