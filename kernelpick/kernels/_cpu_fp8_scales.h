// How kernelpick's CPU GEMM applies scales: the epilogue (per token, per channel or per
// tensor, and the bias), and the scales that change along K (block FP8: 1 x b activation
// groups, b x b weight blocks). Included by _cpu_fp8_dot.h only.
//
// With block scales, output (t, n) is the sum over K-groups g of s(t, n, g) * P(t, n, g):
// P is the dot product of the quantized values over the group's b elements, s is
// a_scale[t][g] * w_scale[n / b][g]. The quantized values stay exact (e4m3 values, exact
// in bf16), so the dot paths keep their arithmetic, vdpbf16ps included; only the scales
// are new. (Scaling the activations by s instead would leave values bf16 cannot hold, and
// the fp32 path is 1.75x slower than the bf16 one on an AVX512-BF16 CPU.)
//
// - Few tokens and panels run one accumulator per output, and at each group boundary
//   multiply it by s(g-1) / s(g), then the sum by s(last) (Horner's scheme). That costs
//   one multiply per group and no register, where a second accumulator per output would
//   spill the 4 x 4 register blocks. Each ratio rounds once in fp32, as a sum does. The
//   running value is sum_{j<=g} s(j) P(j) / s(g), which overflows where the scales of one
//   row differ by about 1e30 (measured), and a combined scale near fp32's subnormals loses
//   bits: groups_in_range sends such calls, far from any real layer, to the fp32 panels,
//   which scale each operand on its own.
// - One token runs four groups at a time, each its own chain, scaled and added per group.
#pragma once

#include <ATen/ATen.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

// Eight fp32 values rounded to bf16, to nearest with ties to even, as at::BFloat16 does
// (a NaN becomes 0x7FC0, as there).
inline __m128i bf16_round8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  rounded = _mm256_castps_si256(_mm256_blendv_ps(
      _mm256_castsi256_ps(rounded), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan));
  const __m256i top = _mm256_srli_epi32(rounded, 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(top), _mm256_extracti128_si256(top, 1));
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
  // Eight values [n, n + 8) of row t: value()'s operations, in the same order.
  __m256 value8(__m256 acc, __m256 xs, int64_t n) const {
    const __m256 ws = per_channel ? _mm256_loadu_ps(w_scale + n) : _mm256_set1_ps(w_scale[0]);
    const __m256 y =
        _mm256_mul_ps(_mm256_mul_ps(acc, xs), _mm256_mul_ps(ws, _mm256_set1_ps(decode_scale)));
    return bias ? _mm256_add_ps(y, _mm256_loadu_ps(bias + n)) : y;
  }
  // One row's values [n0, n0 + count) from acc, into out's dtype: eight at a time (the
  // panels' rows are thousands of values: a scalar loop cost as much as the GEMM on small
  // layers), the rest one by one.
  void store(int64_t t, int64_t n0, int64_t count, const float* acc) const {
    const int64_t base = t * ldo + n0;
    const __m256 xs = _mm256_set1_ps(x_scale ? x_scale[t] : 1.0f);
    int64_t c = 0;
    switch (out_dtype) {
      case at::kFloat: {
        float* o = static_cast<float*>(out) + base;
        for (; c + 8 <= count; c += 8)
          _mm256_storeu_ps(o + c, value8(_mm256_loadu_ps(acc + c), xs, n0 + c));
        for (; c < count; ++c) o[c] = value(acc[c], t, n0 + c);
        break;
      }
      case at::kBFloat16: {
        at::BFloat16* o = static_cast<at::BFloat16*>(out) + base;
        for (; c + 8 <= count; c += 8)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(o + c),
                           bf16_round8(value8(_mm256_loadu_ps(acc + c), xs, n0 + c)));
        for (; c < count; ++c) o[c] = at::BFloat16(value(acc[c], t, n0 + c));
        break;
      }
      default: {
        at::Half* o = static_cast<at::Half*>(out) + base;
        for (; c + 8 <= count; c += 8)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(o + c),
                           _mm256_cvtps_ph(value8(_mm256_loadu_ps(acc + c), xs, n0 + c),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        for (; c < count; ++c) o[c] = at::Half(value(acc[c], t, n0 + c));
        break;
      }
    }
  }
};

// Where the scales that vary along K come from; ``size`` 0 means none do (per-token or
// per-tensor activations with per-channel or per-tensor weights: the epilogue's scales).
struct KGroups {
  int64_t size = 0;               // K elements per group: b, a multiple of every kStep
  int64_t count = 1;              // groups along K: ceil(K / b)
  const float* act = nullptr;     // [M][act_cols] activation scales, or nullptr for 1
  int64_t act_cols = 1;           // count (1 x b groups) or 1 (one scale per token)
  const float* weight = nullptr;  // [ceil(N / b)][count] block scales, or nullptr for 1
  bool active() const { return size > 0; }
  // The weight block of row n, or 0 where weight scales do not vary by block.
  int64_t block_of(int64_t n) const { return weight ? n / size : 0; }
  float scale(int64_t t, int64_t n, int64_t g) const {
    const float a = act ? act[t * act_cols + (act_cols == 1 ? 0 : g)] : 1.0f;
    return weight ? a * weight[block_of(n) * count + g] : a;
  }
};

// Whether every combined scale of tokens [0, m) is at least 2^-100 and, within one row
// of output, within 2^64 of the others: then Horner's running value stays below 2^64 times
// a group's products (at most 2^25 each), and no scale has lost bits. A NaN scale (a NaN
// activation) passes: its row is NaN on every path.
inline bool groups_in_range(const KGroups& kg, int64_t m, int64_t n) {
  constexpr float kLeast = 0x1p-100f, kSpread = 0x1p64f;
  const int64_t blocks = kg.weight ? (n + kg.size - 1) / kg.size : 1;
  for (int64_t t = 0; t < m; ++t)
    for (int64_t b = 0; b < blocks; ++b) {
      float lo = kg.scale(t, b * kg.size, 0), hi = lo;
      for (int64_t g = 1; g < kg.count; ++g) {
        const float s = kg.scale(t, b * kg.size, g);
        lo = std::min(lo, s);
        hi = std::max(hi, s);
      }
      if (lo < kLeast || hi > lo * kSpread) return false;
    }
  return true;
}

// An accumulator times a scalar, and plus another times a scalar, at either vector width.
inline __m256 scale_acc(__m256 acc, float r) { return _mm256_mul_ps(acc, _mm256_set1_ps(r)); }
inline __m256 fma_acc(__m256 part, float s, __m256 acc) {
  return _mm256_fmadd_ps(part, _mm256_set1_ps(s), acc);
}
#if defined(__AVX512F__)
inline __m512 scale_acc(__m512 acc, float r) { return _mm512_mul_ps(acc, _mm512_set1_ps(r)); }
inline __m512 fma_acc(__m512 part, float s, __m512 acc) {
  return _mm512_fmadd_ps(part, _mm512_set1_ps(s), acc);
}
#endif

// Horner's factors of tokens [0, m) against the rows of one weight block, for one thread,
// refilled only when the thread moves on to another block. A view of GroupTables' memory,
// with no destructor: a table owning its memory inside the parallel loops' bodies made
// them 1.25x slower at M = 16 on the per-token path, where it was not even used, and 1.7x
// on the block one (measured, AVX512-BF16 build).
struct GroupTable {
  float* ratio = nullptr;  // [m][count]: s(g - 1) / s(g), for g >= 1
  float* last = nullptr;   // [m]: s(count - 1)
  int64_t block = -1;

  void fill(const KGroups& kg, int64_t m, int64_t n) {
    const int64_t b = kg.block_of(n);
    if (b == block) return;
    block = b;
    for (int64_t t = 0; t < m; ++t) {
      float before = kg.scale(t, n, 0);
      for (int64_t g = 1; g < kg.count; ++g) {
        const float s = kg.scale(t, n, g);
        ratio[t * kg.count + g] = before / s;
        before = s;
      }
      last[t] = before;
    }
  }
};

// The memory of one GroupTable per thread for tokens [0, m), allocated before the parallel
// region (and freed after it); none without block scales.
struct GroupTables {
  int64_t tokens, count, each;
  std::vector<float> memory;
  GroupTables(const KGroups& kg, int64_t m)
      : tokens(m), count(kg.count), each(kg.active() ? m * (kg.count + 1) : 0),
        memory(each * at::get_num_threads()) {}
  // The calling thread's table, inside the parallel region.
  GroupTable mine() {
    if (each == 0) return {};
    float* base = memory.data() + at::get_thread_num() * each;
    return {base, base + tokens * count};
  }
};

// What a register block needs of the table: its tokens' rows of it, and the group width.
struct Horner {
  const float* ratio;  // [tokens][count], the block's first token
  const float* last;   // [tokens]
  int64_t count;
  int64_t steps;       // K steps per group
  Horner at(int64_t t) const { return {ratio + t * count, last + t, count, steps}; }
};

// With block scales (G), ``h`` from token t on, in ``buffer``; else nullptr.
template <bool G>
inline const Horner* from_token(const Horner* h, int64_t t, Horner& buffer) {
  if constexpr (G) {
    buffer = h->at(t);
    return &buffer;
  } else {
    return nullptr;
  }
}

// The Horner factors of tokens [0, m) for the weight block of row n (``h`` holds them),
// or nullptr without block scales.
inline const Horner* horner(const KGroups& kg, int64_t m, int64_t n, int64_t step,
                            GroupTable& table, Horner& h) {
  if (!kg.active()) return nullptr;
  table.fill(kg, m, n);
  h = {table.ratio, table.last, kg.count, kg.size / step};
  return &h;
}

// The activations of tokens [0, m), scaled per group in place: quantized values times
// their scales, for the paths that hand fp32 rows to torch's GEMM.
inline void scale_activation_groups(float* x, int64_t m, int64_t kp, int64_t k,
                                    const KGroups& kg) {
  at::parallel_for(0, m, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t g = 0; g < kg.count; ++g) {
        const float a = kg.act[t * kg.act_cols + (kg.act_cols == 1 ? 0 : g)];
        const int64_t end = std::min(k, (g + 1) * kg.size);
        for (int64_t i = g * kg.size; i < end; ++i) x[t * kp + i] *= a;
      }
  });
}

// Decoded fp32 weight rows [n0, n0 + rows) times their block scales (and ``extra``, the
// decode's 2^8), in place: the rows torch's GEMM then reads hold the weight's values.
inline void scale_weight_blocks(float* w, int64_t n0, int64_t rows, int64_t k, const KGroups& kg,
                                float extra) {
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* scales = kg.weight + kg.block_of(n0 + r) * kg.count;
      for (int64_t g = 0; g < kg.count; ++g) {
        const float s = scales[g] * extra;
        const int64_t end = std::min(k, (g + 1) * kg.size);
        for (int64_t i = g * kg.size; i < end; ++i) w[r * k + i] *= s;
      }
    }
  });
}

}  // namespace
