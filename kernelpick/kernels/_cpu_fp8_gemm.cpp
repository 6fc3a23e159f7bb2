// kernelpick's CPU FP8 GEMM: y = (x quantized per token, or x as is) @ (W_fp8 * scale)^T + bias.
//
// Built by kernelpick/kernels/_cpu_build.py at one ISA level (KP_LEVEL: avx2, avx512 or
// avx512_bf16), which registers the op kernelpick::fp8_gemm_<level>.
//
// Exact FP8 decode: an e4m3fn byte s.eeee.mmm becomes the fp16 bits s.0eeee.mmm0000000 by
// ((b + (b & 0x80)) << 7); fp16 has 3 more exponent bits and a bias 8 larger, so that fp16
// is the FP8 value times 2^-8, for normals and subnormals alike (an e4m3 subnormal m * 2^-9
// lands on the fp16 subnormal m * 2^-17). F16C's vcvtph2ps turns it into fp32 exactly; the
// 2^8 goes into the channel scale. NaN bytes (0x7F, 0xFF) would decode as finite values:
// kernelpick's weights are canonical (no NaN byte), which prepare_weights documents.
//
// Small M (decode) is memory-bound: the kernel reads the FP8 bytes once per block of 4
// output channels and keeps 4 tokens x 4 channels of accumulators in registers. Large M
// is compute-bound: weight panels are decoded once to bf16 or fp32 and handed to torch's
// GEMM (oneDNN / MKL), which is tuned for this CPU.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#define KP_STR2(x) #x
#define KP_STR(x) KP_STR2(x)
#define KP_OP "fp8_gemm_" KP_STR(KP_LEVEL)

namespace {

constexpr float kFp8Max = 448.0f;
// vLLM's per-token quantizer floors the scale at 1 / (fp8_max * 512): an all-zero row does
// not divide by zero (kernelpick.kernels._quantize.SCALE_FLOOR_DIVISOR).
constexpr float kScaleFloor = 1.0f / (448.0f * 512.0f);
// The decoded weight is the FP8 value times 2^-8 (see the top of the file).
constexpr float kDecodeScale = 256.0f;
// Up to this many tokens the dot-product path runs; beyond it, where torch's GEMM is bf16
// and the output too, decoded panels go to torch's GEMM (tuned blocking for large M).
constexpr int64_t kSmallM = 64;
// Rows per panel of the dot-product path, and the most decoded bytes it may take (L2).
constexpr int64_t kPanelRows = 64;
constexpr int64_t kScratchBytes = int64_t(512) << 10;
// Tokens and output channels per register block of the GEMV path.
constexpr int kMB = 4;
constexpr int kNB = 4;
// How far ahead (bytes) the few-token path fetches each weight row.
constexpr int kPrefetch = 2048;
// Bytes of decoded weight per panel on the large-M path: small enough to stay in L3.
constexpr int64_t kPanelBytes = int64_t(4) << 20;

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

// Per-token dynamic quantization of one row: scale = max(amax / 448, floor), then
// clamp(x / scale, -448, 448) rounded to e4m3, written as fp32 values. Same formula and
// the same fp32 operations as kernelpick.kernels._quantize (division, not a reciprocal).
inline float quantize_row(float* v, int64_t k) {
  __m256 amax8 = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  int64_t i = 0;
  // A NaN may drop out of the amax (max_ps returns its second operand when one is NaN),
  // but it passes the clamp below as the second operand into the dot product: as with
  // torch's quantizer, a row holding a NaN gives NaN outputs.
  for (; i + 8 <= k; i += 8) amax8 = _mm256_max_ps(amax8, _mm256_and_ps(_mm256_loadu_ps(v + i), abs_mask));
  float lanes[8];
  _mm256_storeu_ps(lanes, amax8);
  float amax = 0.0f;
  for (float lane : lanes) amax = (lane != lane || lane > amax) ? lane : amax;
  for (; i < k; ++i) {
    const float a = v[i] < 0 ? -v[i] : v[i];
    amax = (a != a || a > amax) ? a : amax;
  }
  float scale = amax / kFp8Max;
  scale = scale < kScaleFloor ? kScaleFloor : scale;  // NaN stays NaN
  const __m256 s8 = _mm256_set1_ps(scale);
  const __m256 lo = _mm256_set1_ps(-kFp8Max), hi = _mm256_set1_ps(kFp8Max);
  i = 0;
  for (; i + 8 <= k; i += 8) {
    // min/max with the constant first: a NaN value (the second operand) passes through.
    __m256 q = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_div_ps(_mm256_loadu_ps(v + i), s8)));
    _mm256_storeu_ps(v + i, round_e4m3(q));
  }
  if (i < k) {
    float tail[8] = {0};
    std::memcpy(tail, v + i, sizeof(float) * (k - i));
    __m256 q = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_div_ps(_mm256_loadu_ps(tail), s8)));
    _mm256_storeu_ps(tail, round_e4m3(q));
    std::memcpy(v + i, tail, sizeof(float) * (k - i));
  }
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

// 8 FP8 bytes -> 8 fp32 values times 2^-8.
inline __m256 decode8(const uint8_t* w) {
  __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w)));
  __m128i h = _mm_slli_epi16(_mm_add_epi16(b, _mm_and_si128(b, _mm_set1_epi16(0x80))), 7);
  return _mm256_cvtph_ps(h);
}

#if defined(__AVX512F__)
// 16 FP8 bytes -> 16 fp32 values times 2^-8.
inline __m512 decode16(const uint8_t* w) {
  __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  __m256i h =
      _mm256_slli_epi16(_mm256_add_epi16(b, _mm256_and_si256(b, _mm256_set1_epi16(0x80))), 7);
  return _mm512_cvtph_ps(h);
}
#endif

// Decode rows of a panel to fp32 or bf16 values times 2^-8, for the large-M path.
void decode_rows_f32(const uint8_t* w, int64_t rows, int64_t k, float* out) {
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

void decode_rows_bf16(const uint8_t* w, int64_t rows, int64_t k, uint16_t* out);

// ---------------------------------------------------------------------------------------
// The GEMV path: per ISA, a vector type, its width along K, decode, load and multiply-add.

struct F32x8 {  // AVX2 + FMA + F16C
  using Acc = __m256;
  using W = __m256;
  using X = float;
  struct Ctx {};
  static constexpr int kStep = 8;
  static Acc zero() { return _mm256_setzero_ps(); }
  static W weights(const uint8_t* w, const Ctx&) { return decode8(w); }
  static W activations(const X* x) { return _mm256_loadu_ps(x); }
  static Acc madd(Acc acc, W x, W w) { return _mm256_fmadd_ps(x, w, acc); }
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

// Decode rows of a panel to their bf16 values, for the large-M path (bf16 builds only).
void decode_rows_bf16(const uint8_t* w, int64_t rows, int64_t k, uint16_t* out) {
#if defined(__AVX512BF16__)
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    const Fp8Tables t = kTables;
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* src = w + r * k;
      uint16_t* dst = out + r * k;
      int64_t i = 0;
      __m512i a, b;
      for (; i + 64 <= k; i += 64) {
        decode64(src + i, t, a, b);
        _mm512_storeu_si512(dst + i, a);
        _mm512_storeu_si512(dst + i + 32, b);
      }
      if (i < k) {
        alignas(64) uint8_t tail[64] = {0};
        alignas(64) uint16_t vals[64];
        std::memcpy(tail, src + i, k - i);
        decode64(tail, t, a, b);
        _mm512_storeu_si512(vals, a);
        _mm512_storeu_si512(vals + 32, b);
        std::memcpy(dst + i, vals, sizeof(uint16_t) * (k - i));
      }
    }
  });
#else
  TORCH_CHECK(false, "kernelpick fp8_gemm: bf16 panels need the avx512_bf16 build");
#endif
}

template <class V>
inline typename V::Ctx context() {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<V, Bf16x64>) return kTables;
#endif
  return {};
}

// The epilogue: y[t, n] = acc * x_scale[t] * (w_scale[n] * decode_scale) + bias[n], in
// out's dtype.
struct Epilogue {
  const float* x_scale;  // [M], or nullptr for 1
  const float* w_scale;  // [N] or [1]
  bool per_channel;
  const float* bias;     // [N] fp32, or nullptr
  void* out;             // [M, N], contiguous
  at::ScalarType out_dtype;
  int64_t ldo;
  float decode_scale;    // what the decoded weight is short of: 2^8 (fp16 decode) or 1
  float value(float acc, int64_t t, int64_t n) const {
    float y = acc * (x_scale ? x_scale[t] : 1.0f) * (w_scale[per_channel ? n : 0] * decode_scale);
    return bias ? y + bias[n] : y;
  }
  // One row's values [n0, n0 + count) from acc (stride ``step``), into out's dtype.
  void store(int64_t t, int64_t n0, int64_t count, const float* acc, int64_t step) const {
    const int64_t base = t * ldo + n0;
    switch (out_dtype) {
      case at::kFloat: {
        float* o = static_cast<float*>(out) + base;
        for (int64_t c = 0; c < count; ++c) o[c] = value(acc[c * step], t, n0 + c);
        break;
      }
      case at::kBFloat16: {
        at::BFloat16* o = static_cast<at::BFloat16*>(out) + base;
        for (int64_t c = 0; c < count; ++c) o[c] = at::BFloat16(value(acc[c * step], t, n0 + c));
        break;
      }
      default: {
        at::Half* o = static_cast<at::Half*>(out) + base;
        for (int64_t c = 0; c < count; ++c) o[c] = at::Half(value(acc[c * step], t, n0 + c));
        break;
      }
    }
  }
};

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

// One block: tokens [0, MB) x channels [0, NB) over ``steps`` K steps. ``x`` rows are
// padded to ``kp`` (steps * kStep) with zeros beyond K.
template <class V, int MB, int NB, class Rows>
inline void dot_block(const typename V::X* x, int64_t kp, int64_t steps, const Rows& rows,
                      float* out /* [MB][NB] */) {
  typename V::Acc acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int c = 0; c < NB; ++c) acc[m][c] = V::zero();
  for (int64_t s = 0; s < steps; ++s) {
    typename V::W wv[NB];
    for (int c = 0; c < NB; ++c) wv[c] = rows(c, s);
    for (int m = 0; m < MB; ++m) {
      const typename V::W xv = V::activations(x + m * kp + s * V::kStep);
      for (int c = 0; c < NB; ++c) acc[m][c] = V::madd(acc[m][c], xv, wv[c]);
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int c = 0; c < NB; ++c) out[m * NB + c] = V::sum(acc[m][c]);
}

// All m tokens against NB rows, kMB tokens at a time: acc [m][NB].
template <class V, int NB, class Rows>
inline void dot_tokens(const typename V::X* x, int64_t m, int64_t kp, const Rows& rows,
                       float* acc) {
  const int64_t steps = kp / V::kStep;
  int64_t t = 0;
  for (; t + kMB <= m; t += kMB) dot_block<V, kMB, NB>(x + t * kp, kp, steps, rows, acc + t * NB);
  switch (m - t) {
    case 3: dot_block<V, 3, NB>(x + t * kp, kp, steps, rows, acc + t * NB); break;
    case 2: dot_block<V, 2, NB>(x + t * kp, kp, steps, rows, acc + t * NB); break;
    case 1: dot_block<V, 1, NB>(x + t * kp, kp, steps, rows, acc + t * NB); break;
    default: break;
  }
}

// A panel of rows decoded once into ``scratch`` (sized to stay in L2), then every block of
// kMB tokens (in L1) against every kNB rows of it: each weight byte is decoded once per
// call and each activation row read once per panel.
template <class V>
void dot_panel(const typename V::X* x, int64_t m, int64_t kp, const uint8_t* w, int64_t k,
               int64_t n0, int64_t rows, std::vector<typename V::W>& scratch,
               const Epilogue& epi) {
  const int64_t steps = kp / V::kStep;
  const typename V::Ctx ctx = context<V>();
  for (int64_t r = 0; r < rows; ++r) {
    const DecodeRow<V> row{w + r * k, k, ctx};
    for (int64_t s = 0; s < steps; ++s) scratch[r * steps + s] = row.at(s);
  }
  float acc[kMB * kNB];
  for (int64_t t = 0; t < m; t += kMB) {
    const int64_t mb = std::min<int64_t>(kMB, m - t);
    for (int64_t c = 0; c < rows; c += kNB) {
      const int64_t nb = std::min<int64_t>(kNB, rows - c);
      const ScratchRows<V> panel{scratch.data() + c * steps, steps};
      if (nb == kNB) {
        dot_tokens<V, kNB>(x + t * kp, mb, kp, panel, acc);
      } else {
        for (int64_t j = 0; j < nb; ++j) {
          float one[kMB];
          dot_tokens<V, 1>(x + t * kp, mb, kp, ScratchRows<V>{panel.scratch + j * steps, steps}, one);
          for (int64_t i = 0; i < mb; ++i) acc[i * kNB + j] = one[i];
        }
      }
      for (int64_t i = 0; i < mb; ++i) epi.store(t + i, n0 + c, nb, acc + i * kNB, 1);
    }
  }
}

// One token (decode): rows one after another, so each thread reads the weight as one
// sequential stream, as a memory-bound reduction does (the hardware prefetchers follow it),
// each byte decoded once; kChains accumulators hide the multiply-add latency.
template <class V>
void one_token(const typename V::X* x, int64_t kp, const uint8_t* w, int64_t n, int64_t k,
               const Epilogue& epi) {
  constexpr int kChains = 4;
  const int64_t steps = kp / V::kStep;
  at::parallel_for(0, n, 16, [&](int64_t r0, int64_t r1) {
    const typename V::Ctx ctx = context<V>();
    for (int64_t r = r0; r < r1; ++r) {
      const DecodeRow<V> row{w + r * k, k, ctx};
      typename V::Acc acc[kChains];
      for (int j = 0; j < kChains; ++j) acc[j] = V::zero();
      int64_t s = 0;
      for (; s + kChains <= steps; s += kChains)
        for (int j = 0; j < kChains; ++j)
          acc[j] = V::madd(acc[j], V::activations(x + (s + j) * V::kStep), row.at(s + j));
      for (; s < steps; ++s) acc[0] = V::madd(acc[0], V::activations(x + s * V::kStep), row.at(s));
      for (int j = 1; j < kChains; ++j) acc[0] = V::add(acc[0], acc[j]);
      const float sum = V::sum(acc[0]);
      epi.store(0, r, 1, &sum, 1);
    }
  });
}

// A few tokens (2 to kMB): kNB rows at a time, each weight byte decoded once and used by
// every token from registers. kNB rows of 4 KiB are kNB pages, where hardware prefetchers
// stop, so the rows are fetched ahead in software, and near the end of a row the start of
// the same row of the next block (kNB rows on), which comes next.
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

template <class V>
void few_tokens(const typename V::X* x, int64_t m, int64_t kp, const uint8_t* w, int64_t n,
                int64_t k, const Epilogue& epi) {
  const int64_t blocks = (n + kNB - 1) / kNB;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    const typename V::Ctx ctx = context<V>();
    float acc[kMB * kNB];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kNB;
      const int64_t nb = std::min<int64_t>(kNB, n - n0);
      if (nb == kNB) {
        dot_tokens<V, kNB>(x, m, kp, PrefetchedRows<V>{w + n0 * k, k, ctx}, acc);
      } else {
        for (int64_t c = 0; c < nb; ++c) {
          float one[kMB];
          dot_tokens<V, 1>(x, m, kp, StreamedRow<V>{w + (n0 + c) * k, k, ctx}, one);
          for (int64_t t = 0; t < m; ++t) acc[t * kNB + c] = one[t];
        }
      }
      for (int64_t t = 0; t < m; ++t) epi.store(t, n0, nb, acc + t * kNB, 1);
    }
  });
}

// The dot-product path: every output is one K-long dot product in registers.
template <class V>
void gemv(const typename V::X* x, int64_t m, int64_t kp, const uint8_t* w, int64_t n, int64_t k,
          const Epilogue& epi) {
  if (m == 1) {
    one_token<V>(x, kp, w, n, k, epi);
    return;
  }
  if (m <= kMB) {
    few_tokens<V>(x, m, kp, w, n, k, epi);
    return;
  }
  const int64_t steps = kp / V::kStep;
  const int64_t fit = kScratchBytes / (steps * int64_t(sizeof(typename V::W)));
  const int64_t rows = std::max<int64_t>(kNB, std::min<int64_t>(kPanelRows, fit / kNB * kNB));
  const int64_t panels = (n + rows - 1) / rows;
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    // Kept per thread between calls: a fresh 512 KiB each call would cost page faults.
    thread_local std::vector<typename V::W> scratch;
    if (scratch.size() < size_t(rows * steps)) scratch.resize(rows * steps);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * rows;
      dot_panel<V>(x, m, kp, w + n0 * k, k, n0, std::min(rows, n - n0), scratch, epi);
    }
  });
}

// ---------------------------------------------------------------------------------------
// Activation preparation: fp32 rows (quantized to e4m3 values, or as given), padded to a
// multiple of ``step``; the per-token scales go to ``scales``.

// The activations as the kernel reads them: rows of fp32 (``bf16`` false) or of bf16 bits,
// quantized to e4m3 values when ``quantize`` (their scales into ``scales``), padded with
// zeros to a multiple of ``step``. Each row goes through one fp32 row buffer per thread.
at::Tensor prepare_rows(const at::Tensor& x, bool quantize, bool bf16, int64_t step,
                        float* scales) {
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t kp = (k + step - 1) / step * step;
  at::Tensor out = at::empty({m, kp}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  auto rows = [&](auto* src) {
    at::parallel_for(0, m, 1, [&](int64_t r0, int64_t r1) {
      thread_local std::vector<float> row;
      row.assign(kp, 0.0f);
      for (int64_t r = r0; r < r1; ++r) {
        row_to_f32(src + r * k, k, row.data());
        if (quantize) scales[r] = quantize_row(row.data(), k);
        if (bf16) {
          auto* dst = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()) + r * kp;
          f32_to_bf16_exact(row.data(), kp, dst);
        } else {
          std::memcpy(out.data_ptr<float>() + r * kp, row.data(), sizeof(float) * kp);
        }
      }
    });
  };
  switch (x.scalar_type()) {
    case at::kFloat: rows(x.data_ptr<float>()); break;
    case at::kBFloat16: rows(x.data_ptr<at::BFloat16>()); break;
    case at::kHalf: rows(x.data_ptr<at::Half>()); break;
    default: TORCH_CHECK(false, "kernelpick fp8_gemm: x must be float32, bfloat16 or float16");
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// The large-M path: decode a panel of weight rows, multiply with torch's GEMM, epilogue.

void panels(const at::Tensor& xc, const uint8_t* w, int64_t n, int64_t k, bool bf16,
            const Epilogue& epi) {
  const int64_t elem = bf16 ? 2 : 4;
  const int64_t rows = std::max<int64_t>(64, kPanelBytes / (k * elem) / 64 * 64);
  const int64_t m = xc.size(0);
  at::Tensor panel = at::empty({std::min(rows, n), k}, xc.options());
  for (int64_t n0 = 0; n0 < n; n0 += rows) {
    const int64_t nb = std::min(rows, n - n0);
    at::Tensor p = panel.narrow(0, 0, nb);
    if (bf16) {
      decode_rows_bf16(w + n0 * k, nb, k, reinterpret_cast<uint16_t*>(p.data_ptr<at::BFloat16>()));
    } else {
      decode_rows_f32(w + n0 * k, nb, k, p.data_ptr<float>());
    }
    at::Tensor y = at::mm(xc, p.t());
    if (bf16) y = y.to(at::kFloat);
    const float* acc = y.data_ptr<float>();
    at::parallel_for(0, m, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) epi.store(t, n0, nb, acc + t * nb, 1);
    });
  }
}

// ---------------------------------------------------------------------------------------

bool bf16_compute_available() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

at::Tensor fp8_gemm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_scale,
                    const std::optional<at::Tensor>& bias, bool quantize_input,
                    at::ScalarType out_dtype) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "kernelpick fp8_gemm: x [M, K] and weight [N, K]");
  TORCH_CHECK(weight.scalar_type() == at::kFloat8_e4m3fn, "kernelpick fp8_gemm: weight must be float8_e4m3fn");
  TORCH_CHECK(weight.is_contiguous(), "kernelpick fp8_gemm: weight must be contiguous [N, K]");
  TORCH_CHECK(x.size(1) == weight.size(1), "kernelpick fp8_gemm: x and weight disagree on K");
  TORCH_CHECK(weight.size(1) > 0, "kernelpick fp8_gemm: K must be at least 1");
  const auto scale_shape = weight_scale.sizes();
  const bool per_tensor = weight_scale.dim() == 0 || (weight_scale.dim() == 1 && scale_shape[0] == 1);
  const bool per_channel = (weight_scale.dim() == 1 && scale_shape[0] == weight.size(0)) ||
                           (weight_scale.dim() == 2 && scale_shape[0] == weight.size(0) && scale_shape[1] == 1);
  TORCH_CHECK(weight_scale.scalar_type() == at::kFloat && weight_scale.is_contiguous() &&
                  (per_tensor || per_channel),
              "kernelpick fp8_gemm: weight_scale must be fp32 of shape [], [1], [N] or [N, 1]");
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kBFloat16 || out_dtype == at::kHalf,
              "kernelpick fp8_gemm: out_dtype must be float32, bfloat16 or float16");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  at::Tensor out = at::empty({m, n}, x.options().dtype(out_dtype));
  if (m == 0 || n == 0) return out;
  at::Tensor xs = x.contiguous();
  at::Tensor bias_f32;
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == n, "kernelpick fp8_gemm: bias must have N values");
    bias_f32 = bias->to(at::kFloat).contiguous();
  }
  at::Tensor x_scale = at::empty({quantize_input ? m : 0}, x.options().dtype(at::kFloat));
  const auto* w = reinterpret_cast<const uint8_t*>(weight.data_ptr());
  Epilogue epi{quantize_input ? x_scale.data_ptr<float>() : nullptr, weight_scale.data_ptr<float>(),
               weight_scale.numel() != 1, bias.has_value() ? bias_f32.data_ptr<float>() : nullptr,
               out.data_ptr(), out_dtype, n, kDecodeScale};
  float* scales = quantize_input ? x_scale.data_ptr<float>() : nullptr;
  // bf16 arithmetic holds the FP8 products exactly where the activations are bf16-exact
  // too (quantized to e4m3, or bf16 to begin with).
  const bool bf16_exact = quantize_input || x.scalar_type() == at::kBFloat16;
  // torch's bf16 GEMM writes bf16, rounding the sums before the scales are applied: fine
  // for a bf16 output (two roundings), not for fp32 or fp16, which stay on the exact path.
  // Nor with a bias: added after that rounding, it could cancel the digits that are left.
  const bool large = m > kSmallM;
  const bool vendor_bf16 = large && out_dtype == at::kBFloat16 && !bias.has_value();
#if defined(__AVX512BF16__)
  if (bf16_exact && !vendor_bf16) {
    epi.decode_scale = 1.0f;
    at::Tensor xb = prepare_rows(xs, quantize_input, true, Bf16x64::kStep, scales);
    const int64_t kp = xb.size(1);
    gemv<Bf16x64>(reinterpret_cast<const uint16_t*>(xb.data_ptr<at::BFloat16>()), m, kp, w, n, k, epi);
    return out;
  }
#endif
  if (!large) {
#if defined(__AVX512F__)
    using V = F32x16;
#else
    using V = F32x8;
#endif
    at::Tensor f32 = prepare_rows(xs, quantize_input, false, V::kStep, scales);
    gemv<V>(f32.data_ptr<float>(), m, f32.size(1), w, n, k, epi);
    return out;
  }
  // Large M: decoded panels into torch's GEMM, in bf16 where the CPU has bf16 units and
  // the output is bf16, otherwise in fp32, whose GEMM is fast on every x86 CPU.
  const bool bf16 = bf16_compute_available() && bf16_exact && vendor_bf16;
  if (bf16) epi.decode_scale = 1.0f;
  at::Tensor xc;
  if (!quantize_input && bf16) {
    xc = xs;
  } else {
    xc = prepare_rows(xs, quantize_input, bf16, 1, scales);
  }
  panels(xc, w, n, k, bf16, epi);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kernelpick, m) {
  m.def(KP_OP "(Tensor x, Tensor weight, Tensor weight_scale, Tensor? bias, bool quantize_input, "
              "ScalarType out_dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(kernelpick, CPU, m) { m.impl(KP_OP, &fp8_gemm); }
