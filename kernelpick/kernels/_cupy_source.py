"""CUDA C source of the hand-written kernels, as text templates rendered per specialization.

Pure text: no cupy and no CUDA header. Element types are decoded and encoded with bit
arithmetic in the source itself (bf16, fp16, e4m3fn, e4m3fnuz), so NVRTC needs no include
path and the codecs also compile as host C++ (``KP_HD`` is ``static inline`` there), as the
CPU tests check them against torch on every FP8 byte.
"""

from __future__ import annotations

import attrs

from kernelpick.core import Dtype, InvalidValueError
from kernelpick.kernels._quantize import scale_floor

__all__ = [
    "CODECS",
    "GemvSpec",
    "QuantSpec",
    "render_codecs",
    "render_gemv",
    "render_quant_per_token",
]

# Element storage types: 16-bit floats travel as their bits.
_STORAGE = {Dtype.BFLOAT16: "u16", Dtype.FLOAT16: "u16", Dtype.FLOAT32: "float"}
_LOAD = {Dtype.BFLOAT16: "kp_bf16_to_f32", Dtype.FLOAT16: "kp_f16_to_f32", Dtype.FLOAT32: ""}
_STORE = {Dtype.BFLOAT16: "kp_f32_to_bf16", Dtype.FLOAT16: "kp_f32_to_f16", Dtype.FLOAT32: ""}
_FP8 = {Dtype.FLOAT8_E4M3FN: (7, 0, 0x7E), Dtype.FLOAT8_E4M3FNUZ: (8, 1, 0x7F)}

CODECS = r"""
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

KP_HD float kp_bits_to_f32(u32 u) { union { u32 u; float f; } c; c.u = u; return c.f; }
KP_HD u32 kp_f32_to_bits(float f) { union { u32 u; float f; } c; c.f = f; return c.u; }

KP_HD float kp_bf16_to_f32(u16 b) { return kp_bits_to_f32(((u32)b) << 16); }

KP_HD u16 kp_f32_to_bf16(float f) {
    u32 x = kp_f32_to_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (u16)((x >> 16) | 0x40u);  /* quiet NaN */
    x += 0x7FFFu + ((x >> 16) & 1u);                                    /* round to nearest even */
    return (u16)(x >> 16);
}

KP_HD float kp_f16_to_f32(u16 h) {
    u32 sign = ((u32)(h & 0x8000u)) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (exp == 0) {                                   /* zero or subnormal: man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    if (exp == 31) return kp_bits_to_f32(sign | 0x7F800000u | (man << 13));
    return kp_bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

KP_HD u16 kp_f32_to_f16(float f) {
    u32 x = kp_f32_to_bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return (u16)(sign | 0x7E00u);
    if (ax >= 0x477FF000u) return (u16)(sign | 0x7C00u);  /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                              /* below 2^-14: subnormal or zero */
        float q = kp_bits_to_f32(ax) * 16777216.0f;      /* in units of 2^-24, exact */
        u32 n = (u32)q;
        float r = q - (float)n;
        if (r > 0.5f || (r == 0.5f && (n & 1u))) n++;
        return (u16)(sign | n);
    }
    u32 h = (((ax >> 23) - 112u) << 10) | ((ax & 0x7FFFFFu) >> 13), rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (u16)(sign | h);
}

/* e4m3: bias KP_FP8_BIAS (7 for e4m3fn, 8 for e4m3fnuz). e4m3fn: NaN is S.1111.111 and
   -0 exists; e4m3fnuz: the only NaN is 0x80, so there is no -0. */
KP_HD float kp_fp8_to_f32(u8 b) {
    u32 sign = ((u32)(b & 0x80u)) << 24, exp = (b >> 3) & 0xFu, man = b & 0x7u;
#if KP_FP8_FNUZ
    if (b == 0x80u) return kp_bits_to_f32(0x7FC00000u);
#else
    if ((b & 0x7Fu) == 0x7Fu) return kp_bits_to_f32(sign | 0x7FC00000u);
#endif
    if (exp == 0) {                                   /* subnormal: man * 2^(-bias-2) */
        float f = (float)man * KP_FP8_SUBNORMAL_UNIT;
        return sign ? -f : f;
    }
    return kp_bits_to_f32(sign | ((exp + 127u - KP_FP8_BIAS) << 23) | (man << 20));
}

/* Round to nearest even. Callers clamp to the FP8 range first; KP_FP8_MAX_CODE guards it. */
KP_HD u8 kp_f32_to_fp8(float f) {
    u32 x = kp_f32_to_bits(f), ax = x & 0x7FFFFFFFu;
    u32 sign = (x >> 24) & 0x80u;
    if (ax > 0x7F800000u) return (u8)(KP_FP8_FNUZ ? 0x80u : (sign | 0x7Fu));
    float v = kp_bits_to_f32(ax);
    if (v < KP_FP8_MIN_NORMAL) {                      /* subnormal: units of 2^(-bias-2) */
        float q = v / KP_FP8_SUBNORMAL_UNIT;          /* a power-of-two division: exact */
        u32 n = (u32)q;
        float r = q - (float)n;
        if (r > 0.5f || (r == 0.5f && (n & 1u))) n++;  /* n == 8 is the least normal: right */
        if (KP_FP8_FNUZ && n == 0u) sign = 0u;          /* no -0 in e4m3fnuz */
        return (u8)(sign | n);
    }
    u32 code = ((((ax >> 23) - 127u + KP_FP8_BIAS)) << 3) | ((ax & 0x7FFFFFu) >> 20);
    u32 rem = ax & 0xFFFFFu;
    if (rem > 0x80000u || (rem == 0x80000u && (code & 1u))) code++;
    if (code > KP_FP8_MAX_CODE) code = KP_FP8_MAX_CODE;
    return (u8)(sign | code);
}
"""


def _fp8_defines(fp8: Dtype) -> str:
    if fp8 not in _FP8:
        raise InvalidValueError("FP8 format", fp8.value, "float8_e4m3fn or float8_e4m3fnuz")
    bias, fnuz, max_code = _FP8[fp8]
    return (
        f"#define KP_FP8_BIAS {bias}u\n#define KP_FP8_FNUZ {fnuz}\n"
        f"#define KP_FP8_MAX_CODE 0x{max_code:X}u\n"
        f"#define KP_FP8_SUBNORMAL_UNIT {2.0 ** (-bias - 2)!r}f\n"
        f"#define KP_FP8_MIN_NORMAL {2.0 ** (1 - bias)!r}f\n"
    )


def render_codecs(fp8: Dtype, *, device: bool = True) -> str:
    """The codec functions for ``fp8``, for NVRTC (``device``) or a host C++ compiler."""
    qualifier = "__device__ __forceinline__" if device else "static inline"
    return f"#define KP_HD {qualifier}\n{_fp8_defines(fp8)}{CODECS}"


def _elementwise(dtype: Dtype, what: str) -> str:
    if dtype not in _STORAGE:
        raise InvalidValueError(what, dtype.value, "bfloat16, float16 or float32")
    return _STORAGE[dtype]


@attrs.frozen
class QuantSpec:
    """One specialization of the per-token quantizer."""

    in_dtype: Dtype
    fp8: Dtype
    vec: int  # elements per load: 8 (16-byte loads of 16-bit input) or 1

    @property
    def name(self) -> str:
        return f"kp_quant_per_token_{self.in_dtype.value}_{self.fp8.value}_v{self.vec}"


def render_quant_per_token(spec: QuantSpec) -> str:
    """Dynamic per-token quantization, one block per row: amax, scale, clamp, cast.

    The formula of ``kernels._quantize`` (docs/design.md#quantization-numerics):
    scale = max(amax / fp8_max, scale_floor(fp8)); values are clamped to the FP8 range
    before the cast and NaN stays NaN.
    """
    storage = _elementwise(spec.in_dtype, "quantizer input dtype")
    if spec.vec not in (1, 8) or (spec.vec == 8 and storage != "u16"):
        raise InvalidValueError("vec", spec.vec, "8 (16-bit input) or 1")
    qmax = spec.fp8.quant_max
    load = _LOAD[spec.in_dtype]
    return f"""{render_codecs(spec.fp8)}
#define KP_QMAX {qmax!r}f
#define KP_FLOOR {scale_floor(spec.fp8)!r}f
#define KP_VEC {spec.vec}
typedef {storage} in_t;

__device__ __forceinline__ float kp_warp_max(float v) {{
    for (int offset = 16; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
    return v;
}}

__device__ __forceinline__ u8 kp_quant(float v, float scale) {{
    float q = v / scale;
    if (q == q) q = fminf(fmaxf(q, -KP_QMAX), KP_QMAX);  /* clamp, but keep NaN as NaN */
    return kp_f32_to_fp8(q);
}}

extern "C" __global__ void {spec.name}(
    const in_t* __restrict__ x, u8* __restrict__ q, float* __restrict__ scales,
    int rows, int cols, long long x_row_stride)
{{
    __shared__ float warp_max[32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const in_t* xr = x + (long long)row * x_row_stride;
    u8* qr = q + (long long)row * cols;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float amax = 0.0f;
#if KP_VEC == 8
    const int vecs = cols / 8;
    for (int i = threadIdx.x; i < vecs; i += blockDim.x) {{
        uint4 packed = reinterpret_cast<const uint4*>(xr)[i];
        const u16* h = reinterpret_cast<const u16*>(&packed);
        for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf({load}(h[j])));
    }}
#else
    for (int i = threadIdx.x; i < cols; i += blockDim.x) amax = fmaxf(amax, fabsf({load}(xr[i])));
#endif
    amax = kp_warp_max(amax);
    if (lane == 0) warp_max[warp] = amax;
    __syncthreads();
    if (warp == 0) {{
        amax = lane < (int)(blockDim.x >> 5) ? warp_max[lane] : 0.0f;
        amax = kp_warp_max(amax);
        if (lane == 0) warp_max[0] = amax;
    }}
    __syncthreads();
    const float scale = fmaxf(warp_max[0] / KP_QMAX, KP_FLOOR);
    if (threadIdx.x == 0) scales[row] = scale;
#if KP_VEC == 8
    for (int i = threadIdx.x; i < vecs; i += blockDim.x) {{
        uint4 packed = reinterpret_cast<const uint4*>(xr)[i];
        const u16* h = reinterpret_cast<const u16*>(&packed);
        uint2 out;
        u8* o = reinterpret_cast<u8*>(&out);
        for (int j = 0; j < 8; ++j) o[j] = kp_quant({load}(h[j]), scale);
        reinterpret_cast<uint2*>(qr)[i] = out;
    }}
#else
    for (int i = threadIdx.x; i < cols; i += blockDim.x) qr[i] = kp_quant({load}(xr[i]), scale);
#endif
}}
"""


@attrs.frozen
class GemvSpec:
    """One specialization of the W8A16 GEMV: types, weight bytes per load, rows per pass."""

    in_dtype: Dtype
    out_dtype: Dtype
    fp8: Dtype
    vec: int  # FP8 weights per lane per step: 16 (one 16-byte load), 4 or 1
    m_tile: int  # activation rows served by one pass over the weight
    warps: int  # output channels per block, one warp each

    @property
    def name(self) -> str:
        return (
            f"kp_w8a16_gemv_{self.in_dtype.value}_{self.out_dtype.value}_{self.fp8.value}"
            f"_v{self.vec}_m{self.m_tile}"
        )


def render_gemv(spec: GemvSpec) -> str:
    """``y[m, n] = scale[n] * sum_k x[m, k] * fp8(w[n, k]) (+ bias[n])``, one warp per n.

    The FP8 weight is read once per ``m_tile`` rows and never materialized in 16 bits.
    """
    storage = _elementwise(spec.in_dtype, "W8A16 input dtype")
    out_storage = _elementwise(spec.out_dtype, "W8A16 output dtype")
    if storage != "u16":
        raise InvalidValueError("W8A16 input dtype", spec.in_dtype.value, "bfloat16 or float16")
    if spec.vec not in (1, 4, 16) or not 1 <= spec.m_tile <= 16 or not 1 <= spec.warps <= 32:
        raise InvalidValueError("GEMV spec", spec, "vec 1/4/16, m_tile 1..16, warps 1..32")
    load, store = _LOAD[spec.in_dtype], _STORE[spec.out_dtype]
    # Activations load as wide as the weights (16 bf16 are two 16-byte loads) into vector
    # registers, then read as 16-bit lanes: a u16 array cast to uint4* would be misaligned.
    x_load = {
        16: "            uint4 xv[2];\n"
        "            xv[0] = reinterpret_cast<const uint4*>(xr)[0];\n"
        "            xv[1] = reinterpret_cast<const uint4*>(xr)[1];",
        4: "            uint2 xv[1];\n            xv[0] = reinterpret_cast<const uint2*>(xr)[0];",
        1: "            in_t xv[1];\n            xv[0] = xr[0];",
    }[spec.vec]
    weight_load = {
        16: "uint4 wp = *reinterpret_cast<const uint4*>(wr + k);",
        4: "u32 wp = *reinterpret_cast<const u32*>(wr + k);",
        1: "u8 wp = wr[k];",
    }[spec.vec]
    return f"""{render_codecs(spec.fp8)}
#define KP_VEC {spec.vec}
#define KP_M_TILE {spec.m_tile}
#define KP_WARPS {spec.warps}
typedef u16 in_t;
typedef {out_storage} out_t;

extern "C" __global__ void {spec.name}(
    const in_t* __restrict__ x, const u8* __restrict__ w, const float* __restrict__ scale,
    int scale_per_channel, const float* __restrict__ bias, int has_bias,
    out_t* __restrict__ y, int M, int N, int K)
{{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = blockIdx.x * KP_WARPS + warp;
    const int m0 = blockIdx.y * KP_M_TILE;
    if (n >= N) return;
    const u8* wr = w + (long long)n * K;
    float acc[KP_M_TILE];
    for (int t = 0; t < KP_M_TILE; ++t) acc[t] = 0.0f;
    for (int k = lane * KP_VEC; k < K; k += 32 * KP_VEC) {{
        {weight_load}
        const u8* wb = reinterpret_cast<const u8*>(&wp);
        float wf[KP_VEC];
        for (int j = 0; j < KP_VEC; ++j) wf[j] = kp_fp8_to_f32(wb[j]);
        for (int t = 0; t < KP_M_TILE; ++t) {{
            if (m0 + t >= M) break;
            const in_t* xr = x + (long long)(m0 + t) * K + k;
{x_load}
            const in_t* xh = reinterpret_cast<const in_t*>(xv);
            float sum = 0.0f;
            for (int j = 0; j < KP_VEC; ++j) sum += {load}(xh[j]) * wf[j];
            acc[t] += sum;
        }}
    }}
    const float s = scale[scale_per_channel ? n : 0];
    const float b = has_bias ? bias[n] : 0.0f;
    for (int t = 0; t < KP_M_TILE; ++t) {{
        float v = acc[t];
        for (int offset = 16; offset > 0; offset >>= 1)
            v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
        if (lane == 0 && m0 + t < M) y[(long long)(m0 + t) * N + n] = {store}(v * s + b);
    }}
}}
"""
