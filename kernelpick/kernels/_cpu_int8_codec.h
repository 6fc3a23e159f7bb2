// int8 numerics of kernelpick's CPU GEMM (int8_per_channel, W8A8): per-token int8
// quantization of the activations and the exact decode of int8 weights, for the same dot
// paths as FP8 (_cpu_fp8_dot.h). Included by _cpu_fp8_gemm.cpp only.
//
// An int8 value is exact in fp32, and so is the product of two (|p| <= 127^2 < 2^24): the
// dot paths sum them in fp32 as they sum FP8 products, and the weight decodes with no
// power of two to fold back (decode scale 1). Sums past 2^24 round as any fp32 sum does,
// where torch._int_mm would sum in int32; the numerics tests bound both alike.
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

// 8 int8 bytes -> 8 fp32 values.
inline __m256 decode8_int8(const uint8_t* w) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w))));
}

// Rows of int8 weights as fp32 values, for the large-M panels.
void decode_rows_f32_int8(const uint8_t* w, int64_t rows, int64_t k, float* out) {
  decode_rows_with(w, rows, k, out, [](const uint8_t* b) { return decode8_int8(b); });
}

struct I8x8 : F32x8 {  // AVX2: 8 int8 weights a step, sign-extended and converted
  static W weights(const uint8_t* w, const Ctx&) { return decode8_int8(w); }
};

struct I8x8Wide : F32x8Wide {  // AVX2, 16 a step, for one token
  static W weights(const uint8_t* w, const Ctx&) {
    return {decode8_int8(w), decode8_int8(w + 8)};
  }
};

#if defined(__AVX512F__)
struct I8x16 : F32x16 {  // AVX-512F
  static W weights(const uint8_t* w, const Ctx&) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))));
  }
};
#endif

}  // namespace
