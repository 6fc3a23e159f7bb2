"""The element codecs of the hand-written CUDA kernels, as CUDA C text.

Pure text: no cupy and no CUDA header. Element types are decoded and encoded with bit
arithmetic in the source itself (bf16, fp16, e4m3fn, e4m3fnuz), so NVRTC needs no include
path and the codecs also compile as host C++ (``KP_HD`` is ``static inline`` there), as the
CPU tests check them against torch on every FP8 byte.
"""

from __future__ import annotations

from kernelpick.core import Dtype, InvalidValueError

__all__ = [
    "CODECS",
    "FP8_DECODE",
    "FP8_ENCODE",
    "LOAD",
    "STORE",
    "render_codecs",
    "render_fp8_decode",
    "render_fp8_encode",
    "storage_type",
]

# Element storage types: 16-bit floats travel as their bits.
_STORAGE = {Dtype.BFLOAT16: "u16", Dtype.FLOAT16: "u16", Dtype.FLOAT32: "float"}
LOAD = {Dtype.BFLOAT16: "kp_bf16_to_f32", Dtype.FLOAT16: "kp_f16_to_f32", Dtype.FLOAT32: ""}
STORE = {Dtype.BFLOAT16: "kp_f32_to_bf16", Dtype.FLOAT16: "kp_f32_to_f16", Dtype.FLOAT32: ""}
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

#ifdef __CUDA_ARCH__
/* fp16 -> fp32 is exact: the hardware conversion, one instruction (HADD2.F32). */
KP_HD float kp_f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
#else
KP_HD float kp_f16_to_f32(u16 h) {
    u32 sign = ((u32)(h & 0x8000u)) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (exp == 0) {                                   /* zero or subnormal: man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    if (exp == 31) return kp_bits_to_f32(sign | 0x7F800000u | (man << 13));
    return kp_bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}
#endif

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


def storage_type(dtype: Dtype, what: str) -> str:
    """The C type an element of ``dtype`` travels as (16-bit floats as their bits)."""
    if dtype not in _STORAGE:
        raise InvalidValueError(what, dtype.value, "bfloat16, float16 or float32")
    return _STORAGE[dtype]


# ---- FP8 decode for the GEMV: two bytes a 32-bit op, branch-free (issue 26, item 7) ----
# Not part of CODECS: it is rendered by ``render_fp8_decode`` after it, so it adds nothing
# to kernels that do not decode FP8 in bulk.
FP8_DECODE = r"""
/* The four FP8 bytes of w as two f16x2 words a and b, worth value / KP_FP8_DECODE_FOLD;
   KP_FP8_LANE(word, half) is the byte (0..3) that lane `half` (0 low, 1 high) of word a (0)
   or b (1) holds. On sm_89+ e4m3fn, the hardware conversion: exact (fold 1), two bytes an
   instruction, a = bytes 0 and 1, b = bytes 2 and 3 (the upper input byte goes to the upper
   lane); it keeps NaN. Otherwise fp16 bits: the fp8 exponent and mantissa move under fp16's
   (bias 15) and the sign to bit 15, subnormals included, so each value is scaled by 2^-8
   (e4m3fn, bias 7) or 2^-7 (e4m3fnuz, bias 8), and the caller multiplies the final sum by
   KP_FP8_DECODE_FOLD, exactly; one shift and mask serves two lanes, so a = bytes 0 and 2,
   b = bytes 1 and 3. No NaN survives that path (0x7F reads 480, 0x80 in e4m3fnuz -0): the
   layer's accept step refuses NaN bytes (check_fp8_finite) and makes -0 canonical (+0)
   before a weight reaches a kernel. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !KP_FP8_FNUZ
#define KP_FP8_HW_DECODE 1
#define KP_FP8_DECODE_FOLD 1.0f
#define KP_FP8_LANE(word, half) (2 * (word) + (half))
KP_HD void kp_fp8x4_split(u32 w, u32& a, u32& b) {
    asm("{ .reg .b16 lo, hi;\n\t mov.b32 {lo, hi}, %2;\n\t"
        " cvt.rn.f16x2.e4m3x2 %0, lo;\n\t cvt.rn.f16x2.e4m3x2 %1, hi; }"
        : "=r"(a), "=r"(b) : "r"(w));
}
#else
#define KP_FP8_HW_DECODE 0
#define KP_FP8_DECODE_FOLD KP_FP8_F16_FOLD
#define KP_FP8_LANE(word, half) ((word) + 2 * (half))
KP_HD void kp_fp8x4_split(u32 w, u32& a, u32& b) {
    a = ((w << 7) & 0x3F803F80u) | ((w << 8) & 0x80008000u);
    b = ((w >> 1) & 0x3F803F80u) | (w & 0x80008000u);
}
#endif
#ifdef __CUDA_ARCH__
/* The halves of a 32-bit register are named, not shifted out: ptxas reads either one. */
KP_HD float kp_f16_lo(u32 h2) {
    float f;
    asm("{ .reg .b16 lo, hi;\n\t mov.b32 {lo, hi}, %1;\n\t cvt.f32.f16 %0, lo; }"
        : "=f"(f) : "r"(h2));
    return f;
}
KP_HD float kp_f16_hi(u32 h2) {
    float f;
    asm("{ .reg .b16 lo, hi;\n\t mov.b32 {lo, hi}, %1;\n\t cvt.f32.f16 %0, hi; }"
        : "=f"(f) : "r"(h2));
    return f;
}
#else
KP_HD float kp_f16_lo(u32 h2) { return kp_f16_to_f32((u16)h2); }
KP_HD float kp_f16_hi(u32 h2) { return kp_f16_to_f32((u16)(h2 >> 16)); }
#endif
"""


def render_fp8_decode(fp8: Dtype, *, device: bool = True) -> str:
    """The codecs and the bulk FP8 decode for ``fp8`` (NVRTC, or host C++ where the
    software path is the one compiled)."""
    fold = 2.0 ** (15 - _FP8[fp8][0]) if fp8 in _FP8 else 0.0  # fp16's bias less fp8's
    return f"{render_codecs(fp8, device=device)}#define KP_FP8_F16_FOLD {fold!r}f\n{FP8_DECODE}"


# ---- FP8 encode for the per-token quantizer (issue 26, items 2 and 8) ----
# Not part of CODECS: rendered by ``render_fp8_encode`` after it, for the quantizer only.
FP8_ENCODE = r"""
/* max that propagates NaN from either side, as torch's amax does (fmaxf drops it). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
KP_HD float kp_nanmax(float a, float b) {
    float m; asm("max.NaN.f32 %0, %1, %2;" : "=f"(m) : "f"(a), "f"(b)); return m;
}
#else
KP_HD float kp_nanmax(float a, float b) { return a != a ? a : (b != b ? b : fmaxf(a, b)); }
#endif

/* A row's scale, max(amax / qmax, floor): the one IEEE division of the row. NaN stays NaN
   and an infinite amax gives an infinite scale, as in torch. */
KP_HD float kp_row_scale(float amax) { return kp_nanmax(amax / KP_QMAX, KP_FLOOR); }

/* Per row: r = 1 / scale, correctly rounded (the row's second and last division). */
KP_HD float kp_recip(float scale) { return 1.0f / scale; }

/* v / scale, correctly rounded from the reciprocal (Markstein): q0 = v*r, then one
   correction with the exact residual. A zero q0 is kept as it is: the correction would
   turn -0 into +0 (and 0 * inf into NaN for an infinite scale, where x / inf is +-0).
   Checked against v / scale, byte for byte, on the host. */
KP_HD float kp_div_by_scale(float v, float r, float s) {
    const float q0 = v * r;
    const float q = fmaf(fmaf(-q0, s, v), r, q0);
    return q0 == 0.0f ? q0 : q;
}

/* Clamp to +-KP_QMAX, then round to nearest even; NaN stays NaN (0x7F with its sign for
   e4m3fn, 0x80 for e4m3fnuz). Two values, first in the low byte. On sm_89+ e4m3fn, the
   hardware conversion: satfinite is the clamp (KP_QMAX is e4m3fn's largest value). */
KP_HD u16 kp_quant2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !KP_FP8_FNUZ
    u16 d; asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
    return d;
#else
    if (lo == lo) lo = fminf(fmaxf(lo, -KP_QMAX), KP_QMAX);
    if (hi == hi) hi = fminf(fmaxf(hi, -KP_QMAX), KP_QMAX);
    return (u16)(kp_f32_to_fp8(lo) | ((u32)kp_f32_to_fp8(hi) << 8));
#endif
}
"""


def render_fp8_encode(fp8: Dtype, *, device: bool = True) -> str:
    """The codecs and the quantizer's encode for ``fp8`` (NVRTC, or host C++ where the
    software path is the one compiled)."""
    from kernelpick.kernels._quantize import scale_floor  # here: no import cycle at load

    defines = f"#define KP_QMAX {fp8.quant_max!r}f\n#define KP_FLOOR {scale_floor(fp8)!r}f\n"
    return f"{render_codecs(fp8, device=device)}{defines}{FP8_ENCODE}"
