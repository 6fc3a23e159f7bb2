"""Run a rendered CUDA kernel on the host: a C++20 shim for the few CUDA names the cupy
kernels use, so their indexing, tails and reductions are checked without a GPU.

Each CUDA thread of a block is a host thread; blocks run one after another, so a
``__shared__`` array is a function-local ``static`` that the block's threads share.
``__syncthreads`` is a barrier over the block, ``__shfl_xor_sync`` an exchange through a
per-warp slot array between two barriers over the warp (every lane of a warp must call it,
as on a GPU). ``__CUDA_ARCH__`` stays undefined, so the codecs compile their software
paths: the sm_89+ hardware conversions run only on a GPU (tests/gpu).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kernelpick.core import Dtype
from kernelpick.kernels._cupy_codecs import render_fp8_encode

__all__ = ["CUDA_HOST_SHIM", "NEEDS_CXX20", "build_encode_harness", "build_host_kernel"]

NEEDS_CXX20 = pytest.mark.skipif(
    shutil.which("g++") is None, reason="needs a host C++20 compiler (g++)"
)

CUDA_HOST_SHIM = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

struct kp_dim3 { unsigned x, y, z; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
static thread_local kp_dim3 threadIdx, blockIdx;
static kp_dim3 blockDim, gridDim;
static std::barrier<>* kp_block_barrier;
static std::vector<std::barrier<>*> kp_warp_barriers;
static float kp_shfl_slots[32][32];

static inline void __syncthreads() { kp_block_barrier->arrive_and_wait(); }
static inline float __shfl_xor_sync(unsigned, float v, int offset) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    kp_shfl_slots[warp][lane] = v;
    kp_warp_barriers[warp]->arrive_and_wait();
    const float other = kp_shfl_slots[warp][lane ^ (unsigned)offset];
    kp_warp_barriers[warp]->arrive_and_wait();
    return other;
}
using std::max;
using std::min;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(n)
#define __align__(n) __attribute__((aligned(n)))

/* Runs kernel() once per CUDA thread of grid x block (1-D blocks of whole warps). */
template <class F> void kp_host_launch(kp_dim3 grid, kp_dim3 block, F kernel) {
    blockDim = block;
    gridDim = grid;
    const unsigned threads = block.x, warps = threads / 32u;
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            std::barrier<> whole((std::ptrdiff_t)threads);
            std::vector<std::barrier<>*> per_warp;
            for (unsigned w = 0; w < warps; ++w) per_warp.push_back(new std::barrier<>(32));
            kp_block_barrier = &whole;
            kp_warp_barriers = per_warp;
            std::vector<std::thread> pool;
            for (unsigned t = 0; t < threads; ++t)
                pool.emplace_back([=] {
                    threadIdx = kp_dim3{t, 0, 0};
                    blockIdx = kp_dim3{bx, by, 0};
                    kernel();
                });
            for (auto& thread : pool) thread.join();
            for (auto* barrier : per_warp) delete barrier;
        }
}

/* n bytes of a file into 64-byte-aligned memory (16-byte vector loads need 16). */
static void* kp_read(const char* path, size_t n) {
    void* p = std::aligned_alloc(64, (n + 63) / 64 * 64 + 64);
    FILE* f = std::fopen(path, "rb");
    if (!f || std::fread(p, 1, n, f) != n) { std::perror(path); std::exit(2); }
    std::fclose(f);
    return p;
}
"""


def build_host_kernel(source: str, main: str, directory: Path, name: str) -> Path:
    """``source`` (a rendered kernel) and ``main`` compiled with the shim into an executable.

    No FMA contraction and no strict aliasing: the kernels reinterpret loads as CUDA allows,
    and the host must not fuse what the source keeps apart."""
    path = directory / f"{name}.cpp"
    path.write_text(CUDA_HOST_SHIM + source + main)
    binary = directory / name
    command = ["g++", "-std=c++20", "-O1", "-pthread", "-fno-strict-aliasing"]
    command += ["-ffp-contract=off", "-o", str(binary), str(path)]
    built = subprocess.run(command, capture_output=True, text=True, check=False)
    if built.returncode:
        raise AssertionError(f"g++ failed on {name}:\n{built.stderr[-4000:]}")
    return binary


def build_encode_harness(fp8: Dtype, harness: str, directory: Path, name: str) -> Path:
    """The quantizers' encode helpers (``render_fp8_encode``, host build) and ``harness``
    (a ``main`` feeding them values) compiled into an executable, with no FMA contraction:
    the per-element steps of the fused quantizers, checked value by value."""
    path = directory / f"{name}.cpp"
    head = "#include <cmath>\n#include <cstdio>\n#include <vector>\n"
    path.write_text(head + render_fp8_encode(fp8, device=False) + harness)
    binary = directory / name
    command = ["g++", "-O1", "-ffp-contract=off", "-o", str(binary), str(path)]
    subprocess.run(command, check=True)
    return binary
