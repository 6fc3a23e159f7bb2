// int8 numerics of kernelpick's CPU GEMM (int8_per_channel, W8A8): per-token int8
// quantization of the activations, and the integer dot products the dot paths run on for
// them (_cpu_fp8_dot.h). Included by _cpu_fp8_gemm.cpp only.
//
// The activations are quantized to int8 values and widened to int16 once per call; each
// step sign-extends the int8 weights to int16 (vpmovsxbw) and vpmaddwd multiplies 16 (AVX2)
// or 32 (AVX-512) pairs and adds each two into an int32 lane: twice the multiply-adds of an
// fp32 FMA per instruction, and exact, as torch._int_mm's int32 sums are. Every product is
// at most 128 * 127 = 16256 in magnitude, so a sum of up to kExactIntK of them fits int32;
// a longer K goes to the fp32 panels. No unsigned offset is needed (vpmaddubsw's u8 x s8
// pairs would saturate int16 at 2 * 255 * 127).
//
// With AVX512-VNNI, vpdpbusd multiplies 64 u8 x s8 pairs a step (with AVX-VNNI, 32) and adds each four into an
// int32 lane, with no widening and no saturation. Its first operand is unsigned: the
// weights are read as w + 128 (their sign bit flipped, one vpxord a step), the activations
// stay int8, and each token's sum starts from -128 * (the sum of its activations), which
// the activation rows carry after their values. The int32 lanes wrap (vpdpbusd, not
// vpdpbusds), so the result is the exact sum wherever that sum fits int32 (kExactIntK).
#pragma once

#include "_cpu_fp8_codec.h"

namespace {

constexpr float kInt8Max = 127.0f;
// kernelpick.kernels._quantize.scale_floor for int8: 1 / (127 * 512).
constexpr float kInt8ScaleFloor = 1.0f / (127.0f * 512.0f);

// k fp32 values quantized to int8 values with ``scale``: clamp(v / scale, -127, 127)
// rounded half to even (kernelpick.kernels._quantize clamps, then rounds; the bounds are
// integers, so either order gives the same values).
inline void quantize_with_int8(float* v, int64_t k, float scale) {
  quantize_with(v, k, scale, kInt8Max, [](__m256 q) {
    return _mm256_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  });
}

// Dynamic per-token int8 quantization of one row; its scale, max(amax / 127, floor).
inline float quantize_row_int8(float* v, int64_t k) {
  const float scale = dynamic_scale(row_amax(v, k), kInt8Max, kInt8ScaleFloor);
  quantize_with_int8(v, k, scale);
  return scale;
}

// The longest K whose int32 sums cannot overflow: 131072 * 16256 < 2^31.
constexpr int64_t kExactIntK = int64_t(1) << 17;

// 8 int8 bytes -> 8 fp32 values.
inline __m256 decode8_int8(const uint8_t* w) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w))));
}

// Rows of int8 weights as fp32 values, for the large-M panels.
void decode_rows_f32_int8(const uint8_t* w, int64_t rows, int64_t k, float* out) {
  decode_rows_with(w, rows, k, out, [](const uint8_t* b) { return decode8_int8(b); });
}

inline int32_t hsum8_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

struct I16x16 {  // AVX2: 16 weights a step, int16 pairs into 8 int32 lanes
  using Acc = __m256i;
  using W = __m256i;
  using X = int16_t;
  struct Ctx {};
  static constexpr int kStep = 16;
  // 8 accumulators, 2 weights, 1 activation and vpmaddwd's product before it is added.
  // GCC kept accumulators on the stack at 6 x 2 (9 stack operands in the hot loop) and
  // 5 x 2 (4), none at 4 x 2: one core, N = 256, K = 4096, hot, 585 -> 323 us at M = 16
  // and 2210 -> 1549 us at M = 64 against 5 x 2.
  static constexpr int kTokens = 4, kRows = 2;
  static constexpr bool kKGroups = false;       // int8 scales never vary along K
  static Acc zero() { return _mm256_setzero_si256(); }
  static W weights(const uint8_t* w, const Ctx&) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  }
  static W activations(const X* x) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  }
  static Acc madd(Acc acc, W x, W w) { return _mm256_add_epi32(_mm256_madd_epi16(x, w), acc); }
  static Acc add(Acc a, Acc b) { return _mm256_add_epi32(a, b); }
  // The exact int32 sum, as fp32 (rounded past 2^24, as torch._int_mm's .float() is).
  static float sum(Acc acc) { return static_cast<float>(hsum8_epi32(acc)); }
};

#if defined(__AVX512BW__)
struct I16x32 {  // AVX-512BW: 32 weights a step, int16 pairs into 16 int32 lanes
  using Acc = __m512i;
  using W = __m512i;
  using X = int16_t;
  struct Ctx {};
  static constexpr int kStep = 32;
  // 16 accumulators, 4 weights, 1 activation, 1 product: 6 x 4 kept accumulators on the
  // stack (32 stack operands in the hot loop, against 3); hot, one core, N = 256,
  // K = 4096: 330-400 -> 266-286 us at M = 16.
  static constexpr int kTokens = 4, kRows = 4;
  static constexpr bool kKGroups = false;
  static Acc zero() { return _mm512_setzero_si512(); }
  static W weights(const uint8_t* w, const Ctx&) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  }
  static W activations(const X* x) { return _mm512_loadu_si512(x); }
  static Acc madd(Acc acc, W x, W w) { return _mm512_add_epi32(_mm512_madd_epi16(x, w), acc); }
  static Acc add(Acc a, Acc b) { return _mm512_add_epi32(a, b); }
  static float sum(Acc acc) { return static_cast<float>(_mm512_reduce_add_epi32(acc)); }
};
#endif

#if defined(__AVXVNNI__) && !defined(__AVX512VNNI__)
struct U8x32 {  // AVX-VNNI: 32 weights a step, u8 x s8 quadruples into 8 int32 lanes
  // U8x64's numerics (see there and the top of this file) on 256-bit registers, for the
  // CPUs with AVX-VNNI and no AVX-512 (Alder Lake to Arrow Lake, Lunar Lake).
  using Acc = __m256i;
  using W = __m256i;
  using X = int8_t;
  struct Ctx {};
  static constexpr int kStep = 32;
  static constexpr int kStartBytes = 32;
  // 8 accumulators, 2 weights, 1 activation and the sign-bit constant, as I16x16's tile.
  static constexpr int kTokens = 4, kRows = 2;
  static constexpr bool kKGroups = false;
  static Acc zero() { return _mm256_setzero_si256(); }
  static Acc start(const X* after) {
    int32_t value;
    std::memcpy(&value, after, sizeof value);
    return _mm256_setr_epi32(value, 0, 0, 0, 0, 0, 0, 0);
  }
  static W weights(const uint8_t* w, const Ctx&) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
  static W activations(const X* x) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  }
  // In asm, as U8x64's, with the VEX encoding (ymm0-15) that AVX-VNNI has ({vex}, its
  // braces escaped from asm's dialect syntax).
  static Acc madd(Acc acc, W x, W w) {
    asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(w), "x"(x));  // acc += w (u8) . x (s8)
    return acc;
  }
  static Acc add(Acc a, Acc b) { return _mm256_add_epi32(a, b); }
  static float sum(Acc acc) { return static_cast<float>(hsum8_epi32(acc)); }
};
#endif

#if defined(__AVX512VNNI__)
// The sum of an int32 vector's lanes, wrapping as vpdpbusd does: the intrinsics add as
// unsigned lanes, where _mm512_reduce_add_epi32 (GCC) adds signed ones, whose overflow C++
// leaves undefined (the lanes of a sum that fits int32 may overflow on their own).
inline int32_t hsum16_epi32(__m512i v) {
  const __m256i half = _mm512_extracti64x4_epi64(v, 1);
  return hsum8_epi32(_mm256_add_epi32(_mm512_castsi512_si256(v), half));
}

struct U8x64 {  // AVX512-VNNI: 64 weights a step, u8 x s8 quadruples into 16 int32 lanes
  using Acc = __m512i;
  using W = __m512i;
  using X = int8_t;
  struct Ctx {};
  static constexpr int kStep = 64;
  // Bytes after a row's kStep-whole values: its start (one int32), then zeros.
  static constexpr int kStartBytes = 64;
  // 16 accumulators, 4 weights, 1 activation. 6 x 4 measured the same (2 threads,
  // N = K = 4096, time over torch._int_mm's, two alternating runs each: 0.32 / 0.64-0.74 /
  // 0.79-0.93 at M = 16 / 64 / 128 against 0.29-0.33 / 0.68-0.76 / 0.90).
  static constexpr int kTokens = 4, kRows = 4;
  static constexpr bool kKGroups = false;
  static Acc zero() { return _mm512_setzero_si512(); }
  // The sum a token's dot products start from (in lane 0, the others zero), held after its
  // row's values.
  static Acc start(const X* after) {
    int32_t value;
    std::memcpy(&value, after, sizeof value);
    return _mm512_maskz_set1_epi32(1, value);
  }
  static W weights(const uint8_t* w, const Ctx&) {
    return _mm512_xor_si512(_mm512_loadu_si512(w), _mm512_set1_epi8(static_cast<char>(0x80)));
  }
  static W activations(const X* x) { return _mm512_loadu_si512(x); }
  // In asm, so that each accumulator stays in its register: through the intrinsic GCC 12
  // copied every accumulator to another register and back around each vpdpbusd, and
  // stored two to the stack each step (70 instructions for a 4 x 4 step's 16, against 43).
  // On the AVX-512-BF16 EPYC (Zen 4) both ran in the same time: its renamer absorbs copies.
  static Acc madd(Acc acc, W x, W w) {
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));  // acc += w (u8) . x (s8)
    return acc;
  }
  static Acc add(Acc a, Acc b) { return _mm512_add_epi32(a, b); }
  static float sum(Acc acc) { return static_cast<float>(hsum16_epi32(acc)); }
};
#endif

}  // namespace
