// kernelpick's CPU FP8 GEMM: y = (x quantized per token, per 1 x b group or per tensor, or x as is)
// @ (W_fp8 * scale)^T + bias, the weight scaled per tensor, per channel or per b x b block.
//
// Built by kernelpick/kernels/_cpu_build.py at one ISA level (KP_LEVEL: avx2, avx512,
// avx512_vnni or avx512_bf16), which registers the op kernelpick::fp8_gemm_<level>. The
// FP8 numerics are in _cpu_fp8_codec.h, the dot-product paths in _cpu_fp8_dot.h, the bf16
// build's outer products in _cpu_bf16_outer.h.
//
// Small M (decode) is memory-bound: the kernel reads each FP8 byte once, decodes it in
// registers and uses it for every token. Large M is compute-bound: with bf16 units, panels
// decoded once per call feed register tiles of outer products; without, weight panels are
// decoded once to fp32 and handed to torch's fp32 GEMM (MKL / oneDNN), tuned for this CPU.

#include "_cpu_fp8_codec.h"
#include "_cpu_fp8_dot.h"
#include "_cpu_int8_codec.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#define KP_STR2(x) #x
#define KP_STR(x) KP_STR2(x)
#define KP_OP "fp8_gemm_" KP_STR(KP_LEVEL)

namespace {

// Past kSmallM tokens, int8 layers with a K shorter than this take the fp32 panels: AVX2
// build, 2 threads, time over fp32 F.linear's, integer tiles against fp32 panels: 0.59 /
// 0.66 against 0.85 / 1.01 at N = K = 4096, M = 128 / 256; even at N = 384, K = 1536;
// 1.2-1.8 against 1.1-1.35 at K = 384, M = 512 (a noisy machine; one run each).
constexpr int64_t kIntPanelsBelowK = 2048;
// Bytes of decoded weight per panel on the large-M path.
constexpr int64_t kPanelBytes = int64_t(4) << 20;

// ---------------------------------------------------------------------------------------
// Activation preparation: fp32 rows (quantized to e4m3 values, or as given), padded to a
// multiple of ``step``; the per-token or per-group scales go to ``scales``.

// A [rows, cols] tensor of ``dtype`` over ``buffer``, grown as needed and kept by the
// calling thread between calls: a fresh allocation of megabytes on every call costs page
// faults (one per 4 KiB), which on a small layer took as long as its GEMM.
at::Tensor kept(std::vector<uint8_t>& buffer, int64_t rows, int64_t cols, at::ScalarType dtype) {
  const size_t bytes = size_t(rows * cols) * at::elementSize(dtype);
  if (buffer.size() < bytes) buffer.resize(bytes);
  return at::from_blob(buffer.data(), {rows, cols}, at::TensorOptions().dtype(dtype));
}

// Activation scale groups along K, as the op's act_group names them: per token (0), per
// 1 x act_group group (> 0), or one scale for the whole tensor (kPerTensor).
constexpr int64_t kPerTensor = -1;

// Calls ``body(r0, r1, row)`` over the rows of x in parallel, row being one fp32 buffer per
// thread of kp values, zeros beyond K; body converts row r with ``to_f32(r, row)``.
template <class Body>
void for_rows(const at::Tensor& x, int64_t kp, const Body& body) {
  const int64_t m = x.size(0), k = x.size(1);
  auto each = [&](auto* src) {
    at::parallel_for(0, m, 1, [&](int64_t r0, int64_t r1) {
      thread_local std::vector<float> row;
      row.assign(kp, 0.0f);
      body(r0, r1, row.data(), [&](int64_t r, float* out) { row_to_f32(src + r * k, k, out); });
    });
  };
  switch (x.scalar_type()) {
    case at::kFloat: each(x.data_ptr<float>()); break;
    case at::kBFloat16: each(x.data_ptr<at::BFloat16>()); break;
    case at::kHalf: each(x.data_ptr<at::Half>()); break;
    default: TORCH_CHECK(false, "kernelpick fp8_gemm: x must be float32, bfloat16 or float16");
  }
}

// The dynamic per-tensor scale of x: one amax over every row (NaN if any value is NaN).
float tensor_scale(const at::Tensor& x) {
  const int64_t m = x.size(0), k = x.size(1);
  std::vector<float> amax(m);
  for_rows(x, k, [&](int64_t r0, int64_t r1, float* row, const auto& to_f32) {
    for (int64_t r = r0; r < r1; ++r) {
      to_f32(r, row);
      amax[r] = row_amax(row, k);
    }
  });
  float all = 0.0f;
  for (float a : amax) all = (a != a || a > all) ? a : all;
  return dynamic_scale(all);
}

// The activations as the kernel reads them: rows of fp32 (``bf16`` false) or of bf16 bits,
// quantized to e4m3 values when ``quantize`` (their scales into ``scales``: [M] per token
// or per tensor, [M][ceil(K / group)] per ``group`` elements), padded with zeros to a
// multiple of ``step``. Per tensor (group kPerTensor) every row is quantized with
// ``fixed``, the tensor's one scale, which every token's entry of ``scales`` holds. With
// ``int8``, per token to int8 values instead (the only grouping int8 weights take).
at::Tensor prepare_rows(const at::Tensor& x, bool quantize, int64_t group, bool bf16,
                        int64_t step, float* scales, float fixed, bool int8 = false) {
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t kp = (k + step - 1) / step * step;
  // A buffer the calling thread keeps (see kept): the result is valid until this thread's
  // next call of prepare_rows, so fp8_gemm reads it before it prepares again.
  thread_local std::vector<uint8_t> memory;
  at::Tensor out = kept(memory, m, kp, bf16 ? at::kBFloat16 : at::kFloat);
  for_rows(x, kp, [&](int64_t r0, int64_t r1, float* row, const auto& to_f32) {
    for (int64_t r = r0; r < r1; ++r) {
      to_f32(r, row);
      if (quantize && group == kPerTensor) {
        quantize_with(row, k, fixed);
        scales[r] = fixed;
      }
      if (quantize && group == 0) scales[r] = int8 ? quantize_row_int8(row, k) : quantize_row(row, k);
      if (quantize && group > 0) {
        const int64_t groups = (k + group - 1) / group;
        for (int64_t g = 0; g < groups; ++g)
          scales[r * groups + g] = quantize_row(row + g * group, std::min(group, k - g * group));
      }
      if (bf16) {
        auto* dst = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()) + r * kp;
        f32_to_bf16_exact(row, kp, dst);
      } else {
        std::memcpy(out.data_ptr<float>() + r * kp, row, sizeof(float) * kp);
      }
    }
  });
  return out;
}

// The activations quantized per token to int8 values, for V's integer dot products: rows of
// V::X (int16 for vpmaddwd, int8 for vpdpbusd) padded with zeros to a multiple of V::kStep,
// and where V carries a start (CarriesStart) each followed by it, -128 times the sum of
// its values (U8x64 reads the weights as w + 128), then zeros to V::kStartBytes; the
// scales into ``scales``. A row whose scale is not finite (a NaN or an infinity in it)
// gets a NaN scale, so that all its outputs are NaN, as they are where its quantized
// values (NaN) enter an fp32 sum.
template <class V>
at::Tensor quantize_rows_int(const at::Tensor& x, float* scales) {
  using T = typename V::X;
  constexpr bool kStart = CarriesStart<V>::value;
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t kp = (k + V::kStep - 1) / V::kStep * V::kStep;
  int64_t stride = kp;
  if constexpr (kStart) stride += V::kStartBytes / int64_t(sizeof(T));
  thread_local std::vector<uint8_t> memory;  // valid until this thread's next call (kept)
  at::Tensor out = kept(memory, m, stride, sizeof(T) == 1 ? at::kChar : at::kShort);
  T* rows = out.data_ptr<T>();
  for_rows(x, kp, [&](int64_t r0, int64_t r1, float* row, const auto& to_f32) {
    for (int64_t r = r0; r < r1; ++r) {
      to_f32(r, row);
      const float scale = quantize_row_int8(row, k);
      const bool finite = scale - scale == 0.0f;
      scales[r] = finite ? scale : __builtin_nanf("");
      T* dst = rows + r * stride;
      int32_t sum = 0;  // at most 127 * kExactIntK in magnitude
      // Integers in [-127, 127] (zeros beyond K); a non-finite row's values are unused.
      for (int64_t i = 0; i < kp; ++i) {
        dst[i] = finite ? static_cast<T>(row[i]) : 0;
        sum += dst[i];
      }
      if constexpr (kStart) {
        const int32_t start = -128 * sum;
        std::memset(dst + kp, 0, V::kStartBytes);
        std::memcpy(dst + kp, &start, sizeof start);
      }
    }
  });
  return out;
}

#if defined(KERNELPICK_AMX)
// Activations that bf16 does not hold, as ``planes`` planes of bf16 rows (split_planes in
// _cpu_bf16_amx.h), each [M][kp] with kp a multiple of ``step``, one after the other.
at::Tensor split_rows(const at::Tensor& x, int64_t step, int planes) {
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t kp = (k + step - 1) / step * step;
  thread_local std::vector<uint8_t> memory;  // valid until this thread's next call (kept)
  at::Tensor out = kept(memory, planes * m, kp, at::kBFloat16);
  auto* bits = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  for_rows(x, kp, [&](int64_t r0, int64_t r1, float* row, const auto& to_f32) {
    for (int64_t r = r0; r < r1; ++r) {
      to_f32(r, row);
      split_planes(row, kp, planes, m * kp, bits + r * kp);
    }
  });
  return out;
}
#endif

// ---------------------------------------------------------------------------------------
// The large-M path: decode a panel of weight rows, multiply with torch's GEMM, epilogue.

void panels(const at::Tensor& xc, const uint8_t* w, int64_t n, int64_t k, const Epilogue& epi,
            const KGroups& kg, bool int8 = false) {
  const int64_t rows = std::max<int64_t>(64, kPanelBytes / (k * 4) / 64 * 64);
  const int64_t m = xc.size(0);
  thread_local std::vector<uint8_t> panel_memory, product_memory;
  at::Tensor panel = kept(panel_memory, std::min(rows, n), k, at::kFloat);
  for (int64_t n0 = 0; n0 < n; n0 += rows) {
    const int64_t nb = std::min(rows, n - n0);
    at::Tensor p = panel.narrow(0, 0, nb);
    if (int8) {
      decode_rows_f32_int8(w + n0 * k, nb, k, p.data_ptr<float>());
    } else {
      decode_rows_f32(w + n0 * k, nb, k, p.data_ptr<float>());
      // Block scales go into the decoded values (with the decode's 2^8): fp32 panels only.
      if (kg.weight) scale_weight_blocks(p.data_ptr<float>(), n0, nb, k, kg, kDecodeScale);
    }
    at::Tensor y = kept(product_memory, m, nb, at::kFloat);
    at::mm_out(y, xc, p.t());
    const float* acc = y.data_ptr<float>();
    at::parallel_for(0, m, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) epi.store(t, n0, nb, acc + t * nb);
    });
  }
}

// ---------------------------------------------------------------------------------------

// What the scale arguments say, checked: ``act_group`` (0: per token) and ``weight_block``
// (0: weight_scale per tensor or per channel) are the K extents of the scale groups, each
// a multiple of 64 (of every path's K step and of its 4-row blocks), equal where both.
KGroups scale_groups(const at::Tensor& weight, const at::Tensor& weight_scale, bool quantize_input,
                     int64_t act_group, int64_t weight_block) {
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK((act_group == kPerTensor || (act_group >= 0 && act_group % 64 == 0)) &&
                  weight_block >= 0 && weight_block % 64 == 0,
              "kernelpick fp8_gemm: act_group must be -1 (per tensor), 0 (per token) or a "
              "multiple of 64, weight_block 0 or a multiple of 64");
  TORCH_CHECK(act_group == 0 || quantize_input,
              "kernelpick fp8_gemm: act_group needs quantize_input");
  TORCH_CHECK(act_group <= 0 || weight_block == 0 || act_group == weight_block,
              "kernelpick fp8_gemm: act_group and weight_block must be equal where both are set");
  TORCH_CHECK(weight_scale.scalar_type() == at::kFloat && weight_scale.is_contiguous(),
              "kernelpick fp8_gemm: weight_scale must be contiguous fp32");
  const auto shape = weight_scale.sizes();
  KGroups kg;
  kg.size = act_group > 0 ? act_group : weight_block;
  kg.count = kg.size > 0 ? (k + kg.size - 1) / kg.size : 1;
  if (weight_block > 0) {
    TORCH_CHECK(weight_scale.dim() == 2 && shape[0] == (n + weight_block - 1) / weight_block &&
                    shape[1] == kg.count,
                "kernelpick fp8_gemm: block weight_scale must be [ceil(N / b), ceil(K / b)]");
    kg.weight = weight_scale.data_ptr<float>();
    return kg;
  }
  const bool per_tensor = weight_scale.dim() == 0 || (weight_scale.dim() == 1 && shape[0] == 1);
  const bool per_channel = (weight_scale.dim() == 1 && shape[0] == n) ||
                           (weight_scale.dim() == 2 && shape[0] == n && shape[1] == 1);
  TORCH_CHECK(per_tensor || per_channel,
              "kernelpick fp8_gemm: weight_scale must be of shape [], [1], [N] or [N, 1]");
  return kg;
}

const float kOne = 1.0f;

// ``input_scale``: the static per-tensor activation scale (act_group kPerTensor), or none.
at::Tensor fp8_gemm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_scale,
                    const std::optional<at::Tensor>& bias, bool quantize_input,
                    at::ScalarType out_dtype, int64_t act_group, int64_t weight_block,
                    const std::optional<at::Tensor>& input_scale) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "kernelpick fp8_gemm: x [M, K] and weight [N, K]");
  const bool int8 = weight.scalar_type() == at::kChar;
  TORCH_CHECK(weight.scalar_type() == at::kFloat8_e4m3fn || int8,
              "kernelpick fp8_gemm: weight must be float8_e4m3fn or int8");
  TORCH_CHECK(!int8 || (quantize_input && act_group == 0 && weight_block == 0),
              "kernelpick fp8_gemm: int8 weights take per-token int8 activations and "
              "per-tensor or per-channel weight scales");
  TORCH_CHECK(weight.is_contiguous(), "kernelpick fp8_gemm: weight must be contiguous [N, K]");
  TORCH_CHECK(x.size(1) == weight.size(1), "kernelpick fp8_gemm: x and weight disagree on K");
  TORCH_CHECK(weight.size(1) > 0, "kernelpick fp8_gemm: K must be at least 1");
  KGroups kg = scale_groups(weight, weight_scale, quantize_input, act_group, weight_block);
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kBFloat16 || out_dtype == at::kHalf,
              "kernelpick fp8_gemm: out_dtype must be float32, bfloat16 or float16");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  at::Tensor out = at::empty({m, n}, x.options().dtype(out_dtype));
  if (m == 0 || n == 0) return out;
  TORCH_CHECK(!input_scale.has_value() || act_group == kPerTensor,
              "kernelpick fp8_gemm: input_scale needs act_group -1 (per tensor)");
  at::Tensor xs = x.contiguous();
  float fixed = 0.0f;  // the per-tensor scale, static or of this x
  if (quantize_input && act_group == kPerTensor) {
    if (input_scale.has_value()) {
      TORCH_CHECK(input_scale->numel() == 1 && input_scale->scalar_type() == at::kFloat,
                  "kernelpick fp8_gemm: input_scale must be one fp32 value");
      fixed = input_scale->item<float>();
    } else {
      fixed = tensor_scale(xs);
    }
  }
  at::Tensor bias_f32;
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == n, "kernelpick fp8_gemm: bias must have N values");
    bias_f32 = bias->to(at::kFloat).contiguous();
  }
  const int64_t act_cols = act_group > 0 ? kg.count : 1;
  at::Tensor x_scale =
      at::empty({quantize_input ? m * act_cols : 0}, x.options().dtype(at::kFloat));
  float* scales = quantize_input ? x_scale.data_ptr<float>() : nullptr;
  const auto* w = reinterpret_cast<const uint8_t*>(weight.data_ptr());
  // With scales that vary along K (kg active), the activation's scales are all in kg (and
  // the weight's too, for blocks); the epilogue keeps a per-channel weight scale.
  const bool grouped = kg.active();
  if (grouped) kg.act = scales, kg.act_cols = act_cols;
  Epilogue epi{grouped ? nullptr : scales, kg.weight ? &kOne : weight_scale.data_ptr<float>(),
               !kg.weight && weight_scale.numel() != 1,
               bias.has_value() ? bias_f32.data_ptr<float>() : nullptr, out.data_ptr(), out_dtype,
               n, kDecodeScale};
  const bool large = m > kSmallM;
  if (int8) {
    // Exact integer dot products (_cpu_int8_codec.h) up to kSmallM tokens, and past them
    // where K is long enough to pay for each output's horizontal sum; otherwise, and for a
    // K whose int32 sums could overflow, fp32 panels (int8 values and their products are
    // exact in fp32) into torch's fp32 GEMM. No power of two to fold back.
    epi.decode_scale = 1.0f;
    if (k <= kExactIntK && (!large || k >= kIntPanelsBelowK)) {
#if defined(__AVX512VNNI__)
      using V = U8x64;
#elif defined(__AVX512BW__)
      using V = I16x32;
#elif defined(__AVXVNNI__)
      using V = U8x32;
#else
      using V = I16x16;
#endif
      at::Tensor xi = quantize_rows_int<V>(xs, scales);
      gemv<V, V>(xi.data_ptr<V::X>(), m, xi.size(1), w, n, k, epi, kg);
    } else {
      at::Tensor f32 = prepare_rows(xs, true, 0, false, 1, scales, 0.0f, true);
      panels(f32, w, n, k, epi, kg, true);
    }
    return out;
  }
  // bf16 arithmetic holds the FP8 products exactly where the activations are bf16-exact
  // too (quantized to e4m3, or bf16 to begin with).
  const bool bf16_exact = quantize_input || x.scalar_type() == at::kBFloat16;
  // With bf16 units every such layer runs vdpbf16ps, at any M: the products exact, the sums
  // in fp32, one rounding at the end. torch's bf16 GEMM on decoded panels, which this build
  // took past 64 tokens for a bf16 output, rounds the sums to bf16 before the scales, and
  // measured slower than the outer products (fp8_per_channel, N = K = 4096, bf16, 2
  // threads, over bf16 F.linear: 1.09-1.20 against 0.97-1.07 at M = 65-1024). Scales that
  // vary along K are applied group by group; scales too far apart or too small for that
  // (groups_in_range) go to the fp32 panels below instead.
#if defined(__AVX512BF16__)
  if (bf16_exact) {
    at::Tensor xb = prepare_rows(xs, quantize_input, act_group, true, Bf16x64::kStep, scales, fixed);
    if (!grouped || groups_in_range(kg, m, n)) {
      epi.decode_scale = 1.0f;
      gemv<Bf16x64, Bf16x64>(reinterpret_cast<const uint16_t*>(xb.data_ptr<at::BFloat16>()), m,
                    xb.size(1), w, n, k, epi, kg);
      return out;
    }
  }
#endif
#if defined(KERNELPICK_AMX)
  // fp32 or fp16 activations (weight-only layers) on the tiles too, where their decode is
  // shared: each value split exactly into bf16 planes, three for fp32, two for fp16.
  if (!bf16_exact && m >= kSplitFrom && m <= kSplitTokens) {
    const int planes = x.scalar_type() == at::kHalf ? 2 : 3;
    at::Tensor xb = split_rows(xs, Bf16x64::kStep, planes);
    const auto* bits = reinterpret_cast<const uint16_t*>(xb.data_ptr<at::BFloat16>());
    const int64_t kp = xb.size(1);
    epi.decode_scale = 1.0f;
    if (grouped) {
      tile_tokens<true>(bits, m, kp, w, n, k, epi, kg, planes, m * kp);
    } else {
      tile_tokens<false>(bits, m, kp, w, n, k, epi, kg, planes, m * kp);
    }
    return out;
  }
#endif
  if (!large) {
#if defined(__AVX512F__)
    using One = F32x16;
    using Few = F32x16;
#else
    using One = F32x8Wide;
    using Few = F32x8;
#endif
    at::Tensor f32 = prepare_rows(xs, quantize_input, act_group, false, One::kStep, scales, fixed);
    if (!grouped || groups_in_range(kg, m, n)) {
      gemv<One, Few>(f32.data_ptr<float>(), m, f32.size(1), w, n, k, epi, kg);
      return out;
    }
  }
  // Large M: fp32 panels decoded into torch's fp32 GEMM, which is fast on every x86 CPU.
  // Scales that vary along K go into the operands first: the activations are scaled to
  // their values, and for blocks so are the decoded weight panels.
  if (kg.weight) epi.decode_scale = 1.0f;
  at::Tensor xc = prepare_rows(xs, quantize_input, act_group, false, 1, scales, fixed);
  if (grouped && quantize_input) scale_activation_groups(xc.data_ptr<float>(), m, k, k, kg);
  panels(xc, w, n, k, epi, kg);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kernelpick, m) {
  m.def(KP_OP "(Tensor x, Tensor weight, Tensor weight_scale, Tensor? bias, bool quantize_input, "
              "ScalarType out_dtype, int act_group, int weight_block, Tensor? input_scale) "
              "-> Tensor");
}

TORCH_LIBRARY_IMPL(kernelpick, CPU, m) { m.impl(KP_OP, &fp8_gemm); }
