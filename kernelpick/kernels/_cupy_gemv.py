"""The W8A16 GEMV for small M: CUDA C source per specialization, launch geometry (pure
helpers), and the torch-facing op. It reads each FP8 weight once per pass and never
materializes a 16-bit copy.
"""

from __future__ import annotations

import functools

import attrs
import numpy as np
import torch

from kernelpick.core import Dtype, InvalidValueError
from kernelpick.kernels._cupy_codecs import STORE, render_fp8_decode, storage_type
from kernelpick.kernels._cupy_runtime import HALF_DTYPES, Grid, cuda_device, launch
from kernelpick.kernels._torch import check_tensor, reject

__all__ = [
    "GEMV_CHANNELS_PER_WARP",
    "GEMV_MAX_M",
    "GEMV_M_TILES",
    "GEMV_WARPS",
    "GemvSpec",
    "gemv_launch",
    "gemv_m_tile",
    "gemv_specializations",
    "gemv_vec",
    "render_gemv",
    "w8a16_gemv_cupy",
]

# Up to 16 rows the GEMV reads the FP8 weight at most twice (two passes of 8 rows), and a
# dequantize + cuBLAS GEMM reads it once but writes and reads a 16-bit copy (5 bytes a
# weight). A first estimate: the device check's gemv_crossover cases (benchmarks/gpu_plan.py)
# record the M from which dequantize + cuBLAS wins; this takes that figure once measured.
GEMV_MAX_M = 16
GEMV_M_TILES = (1, 8)  # rows one pass serves: decode (M = 1), and up to 8 rows
GEMV_WARPS = 4
GEMV_CHANNELS_PER_WARP = 2  # each activation value read from shared memory serves two


@attrs.frozen
class GemvSpec:
    """One specialization of the W8A16 GEMV: types, weight bytes per load, rows per pass."""

    in_dtype: Dtype
    out_dtype: Dtype
    fp8: Dtype
    vec: int  # FP8 weights per lane per load: 16 (one 16-byte load), 4 or 1
    m_tile: int  # activation rows served by one pass over the weight
    warps: int = GEMV_WARPS
    channels: int = GEMV_CHANNELS_PER_WARP  # output channels per warp

    @property
    def name(self) -> str:
        return (
            f"kp_w8a16_gemv_{self.in_dtype.value}_{self.out_dtype.value}_{self.fp8.value}"
            f"_v{self.vec}_m{self.m_tile}"
        )

    @property
    def weight_bytes_per_step(self) -> int:
        """FP8 weight bytes one lane consumes per iteration of the kernel's K loop (two loads
        of ``vec`` bytes for each of its channels)."""
        return _STEPS * self.vec * self.channels


_STEPS = 2  # loads of each channel's weights per lane per chunk of K
# (C type, 16-bit values) a lane stages or reads activations in, by vec: as wide as allowed.
_X_UNIT = {16: ("uint4", 8), 4: ("uint2", 4), 1: ("u16", 1)}
_W_UNIT = {16: "uint4", 4: "u32", 1: "u8"}
# Two 16-bit activations of a 32-bit word as fp32: bf16 is the upper half of an fp32.
_X_PAIR = {
    Dtype.BFLOAT16: ("kp_bits_to_f32(v << 16)", "kp_bits_to_f32(v & 0xFFFF0000u)"),
    Dtype.FLOAT16: ("kp_f16_lo(v)", "kp_f16_hi(v)"),
}


def render_gemv(spec: GemvSpec) -> str:
    """``y[m, n] = scale[n] * sum_k x[m, k] * fp8(w[n, k]) (+ bias[n])``, a warp per
    ``channels`` output channels, ``m_tile`` rows a pass.

    K is walked in chunks of ``32 * vec * 2``: each lane loads its weights for the chunk,
    then the block stages the chunk's activations in shared memory (both loads in flight at
    once), then each lane decodes its weights (``FP8_DECODE``: in hardware on sm_89+
    e4m3fn) and accumulates in fp32. The FP8 weight is read once per pass and never
    materialized in 16 bits.
    """
    if storage_type(spec.in_dtype, "W8A16 input dtype") != "u16":
        raise InvalidValueError("W8A16 input dtype", spec.in_dtype.value, "bfloat16 or float16")
    out_storage = storage_type(spec.out_dtype, "W8A16 output dtype")
    if (
        spec.vec not in _W_UNIT
        or spec.m_tile not in GEMV_M_TILES
        or not 1 <= spec.warps <= 32
        or not 1 <= spec.channels <= 8
    ):
        expected = f"vec 1/4/16, m_tile in {GEMV_M_TILES}, warps 1..32, channels 1..8"
        raise InvalidValueError("GEMV spec", spec, expected)
    x_unit, x_per_unit = _X_UNIT[spec.vec]
    x_lo, x_hi = _X_PAIR[spec.in_dtype]
    return f"""{render_fp8_decode(spec.fp8)}
#define KP_VEC {spec.vec}
#define KP_M_TILE {spec.m_tile}
#define KP_WARPS {spec.warps}
#define KP_CPW {spec.channels}
#define KP_STEPS {_STEPS}
#define KP_KC (32 * KP_VEC * KP_STEPS)
#define KP_X_PER_UNIT {x_per_unit}
#define KP_X_UNITS (KP_KC / KP_X_PER_UNIT)
#define KP_THREADS (32 * KP_WARPS)
#define KP_STAGE ((KP_M_TILE * KP_X_UNITS + KP_THREADS - 1) / KP_THREADS)
typedef u16 in_t;
typedef {out_storage} out_t;
#define KP_STORE {STORE[spec.out_dtype]}
typedef {_W_UNIT[spec.vec]} w_unit;
typedef {x_unit} x_unit;

KP_HD float kp_x_lo(u32 v) {{ return {x_lo}; }}
KP_HD float kp_x_hi(u32 v) {{ return {x_hi}; }}

/* Word i of a lane's weight load (a lone byte is word 0). */
KP_HD u32 kp_w_word(const uint4& v, int i) {{ return (&v.x)[i]; }}
KP_HD u32 kp_w_word(u32 v, int) {{ return v; }}
KP_HD u32 kp_w_word(u8 v, int) {{ return (u32)v; }}

/* VEC weights of one load as fp32 values / KP_FP8_DECODE_FOLD, in K order. */
KP_HD void kp_decode(w_unit v, float* out) {{
#pragma unroll
    for (int i = 0; i < (KP_VEC + 3) / 4; ++i) {{
        u32 h2[2];
        kp_fp8x4_split(kp_w_word(v, i), h2[0], h2[1]);
#pragma unroll
        for (int word = 0; word < 2; ++word) {{
            const int lo = 4 * i + KP_FP8_LANE(word, 0), hi = 4 * i + KP_FP8_LANE(word, 1);
            if (lo < KP_VEC) out[lo] = kp_f16_lo(h2[word]);
            if (hi < KP_VEC) out[hi] = kp_f16_hi(h2[word]);
        }}
    }}
}}

/* VEC activations from shared memory as fp32, in K order. */
KP_HD void kp_load_x(const in_t* xs, float* out) {{
#if KP_VEC == 1
    out[0] = kp_x_lo((u32)xs[0]);
#else
    const u32* words = reinterpret_cast<const u32*>(xs);
#pragma unroll
    for (int i = 0; i < KP_VEC / 2; ++i) {{
        const u32 v = words[i];
        out[2 * i] = kp_x_lo(v);
        out[2 * i + 1] = kp_x_hi(v);
    }}
#endif
}}

extern "C" __global__ void __launch_bounds__(KP_THREADS) {spec.name}(
    const in_t* __restrict__ x, const u8* __restrict__ w, const float* __restrict__ scale,
    int scale_per_channel, const float* __restrict__ bias, int has_bias,
    out_t* __restrict__ y, int M, int N, int K)
{{
    __shared__ __align__(16) in_t xs[KP_M_TILE][KP_KC];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n0 = (blockIdx.x * KP_WARPS + warp) * KP_CPW;
    const int m0 = blockIdx.y * KP_M_TILE;
    const int rows = min(KP_M_TILE, M - m0);
    const in_t* xt = x + (long long)m0 * K;
    /* A channel past N reads channel N - 1 and stores nothing: every warp stays in the
       block's barriers. */
    const u8* wr[KP_CPW];
#pragma unroll
    for (int c = 0; c < KP_CPW; ++c) wr[c] = w + (long long)min(n0 + c, N - 1) * K;
    float acc[KP_M_TILE][KP_CPW][2];
#pragma unroll
    for (int t = 0; t < KP_M_TILE; ++t)
#pragma unroll
        for (int c = 0; c < KP_CPW; ++c) acc[t][c][0] = acc[t][c][1] = 0.0f;
#pragma unroll 1
    for (int k0 = 0; k0 < K; k0 += KP_KC) {{
        w_unit wv[KP_STEPS][KP_CPW];
#pragma unroll
        for (int s = 0; s < KP_STEPS; ++s) {{
            const int k = k0 + (s * 32 + lane) * KP_VEC;  /* K % KP_VEC == 0: all or none */
#pragma unroll
            for (int c = 0; c < KP_CPW; ++c)
                wv[s][c] = k < K ? *reinterpret_cast<const w_unit*>(wr[c] + k) : w_unit();
        }}
        __syncthreads();  /* the last chunk's activations are read */
#pragma unroll
        for (int i = 0; i < KP_STAGE; ++i) {{
            /* Unit u of the tile is row u / KP_X_UNITS, element e of the chunk; zeros past
               M and K. x has fewer than 2^31 elements (the host checks), so offsets fit. */
            const int u = threadIdx.x + i * KP_THREADS;
            const int t = u / KP_X_UNITS, e = (u % KP_X_UNITS) * KP_X_PER_UNIT;
            if (KP_STAGE * KP_THREADS == KP_M_TILE * KP_X_UNITS || u < KP_M_TILE * KP_X_UNITS) {{
                x_unit v = x_unit();
                if (t < rows && k0 + e < K)
                    v = *reinterpret_cast<const x_unit*>(xt + t * K + k0 + e);
                reinterpret_cast<x_unit*>(&xs[0][0])[u] = v;
            }}
        }}
        __syncthreads();
#pragma unroll
        for (int s = 0; s < KP_STEPS; ++s) {{
            const int e = (s * 32 + lane) * KP_VEC;
            float wf[KP_CPW][KP_VEC];
#pragma unroll
            for (int c = 0; c < KP_CPW; ++c) kp_decode(wv[s][c], wf[c]);
#pragma unroll
            for (int t = 0; t < KP_M_TILE; ++t) {{
                if (t >= rows) break;
                float xf[KP_VEC];
                kp_load_x(&xs[t][e], xf);
#pragma unroll
                for (int c = 0; c < KP_CPW; ++c)
#pragma unroll
                    for (int j = 0; j < KP_VEC; ++j)
                        acc[t][c][j & 1] = fmaf(xf[j], wf[c][j], acc[t][c][j & 1]);
            }}
        }}
    }}
#pragma unroll
    for (int c = 0; c < KP_CPW; ++c) {{
        const int n = min(n0 + c, N - 1);  /* the row read; stored only if n0 + c < N */
        const float s = scale[scale_per_channel ? n : 0];
        const float b = has_bias ? bias[n] : 0.0f;
#pragma unroll
        for (int t = 0; t < KP_M_TILE; ++t) {{
            if (t >= rows) break;
            float v = acc[t][c][0] + acc[t][c][1];
#pragma unroll
            for (int offset = 16; offset > 0; offset >>= 1)
                v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
            /* The fold first: v * fold is the sum the exact decode gives, and a scale near
               fp32's top times the fold would overflow on its own. */
            if (lane == 0 && n0 + c < N)
                y[(long long)(m0 + t) * N + n] = KP_STORE(v * KP_FP8_DECODE_FOLD * s + b);
        }}
    }}
}}
"""


def gemv_specializations() -> tuple[GemvSpec, ...]:
    """Every specialization ``w8a16_gemv_cupy`` can launch."""
    return tuple(
        GemvSpec(x, out, fp8, vec, m_tile)
        for fp8 in (Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ)
        for x in (Dtype.BFLOAT16, Dtype.FLOAT16)
        for out in (Dtype.BFLOAT16, Dtype.FLOAT16, Dtype.FLOAT32)
        for vec in (16, 4, 1)
        for m_tile in GEMV_M_TILES
    )


_gemv_source = functools.lru_cache(maxsize=128)(render_gemv)


def gemv_vec(k: int, x_address: int, w_address: int) -> int:
    """FP8 weights per lane per step: 16 (16-byte loads), 4, or 1 for any K."""
    if k % 16 == 0 and x_address % 16 == 0 and w_address % 16 == 0:
        return 16
    if k % 4 == 0 and x_address % 8 == 0 and w_address % 4 == 0:
        return 4
    return 1


def gemv_m_tile(m: int) -> int:
    """Rows one pass serves: 1 for decode (its accumulators alone in registers), else 8."""
    return GEMV_M_TILES[0] if m <= GEMV_M_TILES[0] else GEMV_M_TILES[-1]


def gemv_launch(m: int, n: int, spec: GemvSpec) -> Grid:
    """``spec.channels`` output channels a warp, ``spec.warps`` warps a block, and
    ``spec.m_tile`` rows a pass (blocks along y)."""
    per_block = spec.warps * spec.channels
    return Grid((-(-n // per_block), -(-m // spec.m_tile), 1), (32 * spec.warps, 1, 1))


def w8a16_gemv_cupy(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``x [M, K] @ (weight [N, K] * scale).T + bias`` with FP8 weights decoded in-kernel.

    ``scale`` is fp32, one per output channel (``[N, 1]``/``[N]``) or one value.
    """
    # Shapes and extents first (on any device, so they are checked without a GPU), then
    # the device.
    check_tensor("x", x, dtypes=HALF_DTYPES, shape=(None, None))
    m, k = x.shape
    check_tensor(
        "weight", weight, dtypes=(torch.float8_e4m3fn, torch.float8_e4m3fnuz),
        shape=(None, k), device=x.device,
    )  # fmt: skip
    n = weight.shape[0]
    check_tensor("weight scale", scale, dtypes=(torch.float32,), device=x.device)
    if tuple(scale.shape) not in {(), (1,), (n,), (n, 1)}:
        expected = f"one value ([] or [1]), or one per output channel ([{n}] or [{n}, 1])"
        raise reject("weight scale", scale, expected)
    # 32-bit offsets stage x and walk K (a chunk past K must not wrap), and grid.y counts
    # passes of m_tile rows.
    most_m = 65535 * GEMV_M_TILES[-1]
    if m * k >= 2**31 or k >= 2**31 - 1024 or m > most_m:
        expected = f"fewer than 2^31 elements, K below 2^31 - 1024, M at most {most_m}"
        raise reject("x", x, expected)
    if not x.is_contiguous() or not weight.is_contiguous():
        bad = ("x", x) if not x.is_contiguous() else ("weight", weight)
        raise reject(*bad, "a contiguous tensor")
    device = cuda_device("x", x)
    if bias is not None:
        check_tensor("bias", bias, shape=(n,), device=device)
        bias = bias.to(torch.float32).contiguous()
    y = torch.empty((m, n), dtype=out_dtype, device=device)
    if m == 0 or n == 0:
        return y
    vec = gemv_vec(k, x.data_ptr(), weight.data_ptr())
    fp8 = Dtype.parse(weight.dtype)
    spec = GemvSpec(Dtype.parse(x.dtype), Dtype.parse(out_dtype), fp8, vec, gemv_m_tile(m))
    args = (
        x, weight, scale.contiguous(), np.int32(scale.numel() == n),
        bias, np.int32(bias is not None), y, np.int32(m), np.int32(n), np.int32(k),
    )  # fmt: skip
    launch(spec.name, _gemv_source(spec), gemv_launch(m, n, spec), args, device)
    return y
