"""The cupy kernels, checked without a GPU: the source compiles (nvcc, every
specialization), the element codecs match torch on every FP8 byte (compiled as host C++),
launch geometry, input checks, the fallback to torch ops, and lazy import.

The kernels' results on a device are tests/gpu/test_cupy_kernels_gpu.py.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import pytest
import torch

import kernelpick as kp
from kernelpick.core import Dtype
from kernelpick.kernels import LAUNCHES
from kernelpick.kernels._cupy_codecs import render_codecs
from kernelpick.kernels._cupy_gemv import (
    GemvSpec,
    gemv_launch,
    gemv_m_tile,
    gemv_specializations,
    gemv_vec,
    render_gemv,
    w8a16_gemv_cupy,
)
from kernelpick.kernels._cupy_group_quant import group_quant_specializations, render_quant_groups
from kernelpick.kernels._cupy_quant import (
    quant_launch,
    quant_specializations,
    quant_vec,
    quantize_per_token_cupy,
    render_quant_per_token,
)
from kernelpick.kernels._cupy_runtime import cupy_usable

BF16, FP16, FP32 = Dtype.BFLOAT16, Dtype.FLOAT16, Dtype.FLOAT32
FN, FNUZ = Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ
ROOT = Path(__file__).resolve().parents[2]


def _specializations() -> list[tuple[str, str]]:
    quant = [(spec.name, render_quant_per_token(spec)) for spec in quant_specializations()]
    groups = [(spec.name, render_quant_groups(spec)) for spec in group_quant_specializations()]
    return quant + groups + [(spec.name, render_gemv(spec)) for spec in gemv_specializations()]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
def test_every_specialization_compiles_for_turing_through_hopper(tmp_path: Path) -> None:
    def compile_one(item: tuple[int, tuple[str, str]]) -> str:
        index, (name, source) = item
        path = tmp_path / f"k{index}.cu"
        path.write_text(source)
        # One nvcc run per kernel builds both: the software codecs (sm_75) and the
        # hardware conversions of sm_89+ (sm_90).
        command = ["nvcc", "--fatbin", "-o", str(path) + ".fatbin", str(path)]
        for arch in ("75", "90"):
            command += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        return f"{name}:\n{result.stderr}" if result.returncode or result.stderr else ""

    with ThreadPoolExecutor(max_workers=2) as pool:
        failures = [e for e in pool.map(compile_one, enumerate(_specializations())) if e]
    assert not failures, "\n".join(failures)


HARNESS = r"""
#include <cstdio>
#include <cstdlib>
int main(int argc, char** argv) {
    for (int b = 0; b < 256; ++b) printf("%08x\n", kp_f32_to_bits(kp_fp8_to_f32((u8)b)));
    unsigned int bits;
    while (scanf("%x", &bits) == 1) {
        float f = kp_bits_to_f32(bits);
        printf("%02x %04x %04x %08x %08x\n", kp_f32_to_fp8(f), kp_f32_to_bf16(f), kp_f32_to_f16(f),
               kp_f32_to_bits(kp_bf16_to_f32((u16)(bits & 0xFFFF))),
               kp_f32_to_bits(kp_f16_to_f32((u16)(bits & 0xFFFF))));
    }
    return 0;
}
"""


def _probe_values() -> torch.Tensor:
    """Values that matter to a codec: every e4m3fn and e4m3fnuz value and the midpoints
    between neighbours (round-half-even ties), subnormals, zeros, and random fp32 numbers."""
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values = torch.cat(
        [every.view(torch.float8_e4m3fn).float(), every.view(torch.float8_e4m3fnuz).float()]
    )
    values = torch.sort(values[torch.isfinite(values)]).values
    midpoints = (values[1:] + values[:-1]) / 2
    randoms = torch.randn(4000, generator=torch.Generator().manual_seed(0)) * 100
    tiny = torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 2.0**-8
    specials = torch.tensor([0.0, -0.0, 448.0, -448.0, 240.0, 224.0, 65504.0, 65520.0, 1e-40])
    return torch.cat([values, midpoints, randoms, tiny, specials])


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("fp8", [FN, FNUZ])
def test_the_kernel_codecs_match_torch_on_every_byte_and_tie(fp8: Dtype, tmp_path: Path) -> None:
    source = tmp_path / "codecs.cpp"
    source.write_text(render_codecs(fp8, device=False) + HARNESS)
    binary = tmp_path / "codecs"
    subprocess.run(["g++", "-O1", "-o", str(binary), str(source)], check=True)
    values = _probe_values()
    fp8_torch = getattr(torch, fp8.value)
    # Callers clamp before encoding, so the codec is checked on the clamped values.
    clamped = values.clamp(-fp8.quant_max, fp8.quant_max)
    stdin = "\n".join(f"{struct.unpack('<I', struct.pack('<f', float(v)))[0]:08x}" for v in clamped)
    lines = subprocess.run([str(binary)], input=stdin, capture_output=True, text=True, check=True)
    output = lines.stdout.split("\n")
    decoded = torch.tensor([int(h, 16) for h in output[:256]], dtype=torch.int64).to(torch.int32)
    want = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8_torch).float()
    got = decoded.view(torch.float32)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))  # -0 included
    rows = [line.split() for line in output[256:] if line]
    fp8_bytes = torch.tensor([int(r[0], 16) for r in rows], dtype=torch.int32).to(torch.uint8)
    assert torch.equal(fp8_bytes, clamped.to(fp8_torch).view(torch.uint8))
    bf16_bits = torch.tensor([int(r[1], 16) for r in rows], dtype=torch.int32)
    assert torch.equal(
        bf16_bits, clamped.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    )
    f16_bits = torch.tensor([int(r[2], 16) for r in rows], dtype=torch.int32)
    assert torch.equal(
        f16_bits, clamped.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    )


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")
def test_the_16_bit_decoders_match_torch_on_every_pattern(tmp_path: Path) -> None:
    source = tmp_path / "codecs.cpp"
    source.write_text(render_codecs(FN, device=False) + HARNESS)
    binary = tmp_path / "codecs"
    subprocess.run(["g++", "-O1", "-o", str(binary), str(source)], check=True)
    patterns = range(0, 65536, 7)  # a stride that visits subnormals, normals, inf and NaN
    stdin = "\n".join(f"{p:08x}" for p in patterns)
    run = subprocess.run([str(binary)], input=stdin, capture_output=True, text=True, check=True)
    rows = [line.split() for line in run.stdout.split("\n")[256:] if line]
    bits = torch.tensor(list(patterns), dtype=torch.int32).to(torch.int16)
    for column, dtype in ((3, torch.bfloat16), (4, torch.float16)):
        got = torch.tensor([int(r[column], 16) for r in rows], dtype=torch.int64).to(torch.int32)
        want = bits.view(dtype).float()
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got.view(torch.float32)), nan)
        assert torch.equal(got[~nan], want[~nan].view(torch.int32))


def test_launch_geometry_comes_from_pure_helpers() -> None:
    assert quant_launch(rows=3, cols=8192, vec=8) == kp_launch((3, 1, 1), (256, 1, 1))
    assert quant_launch(rows=1, cols=40, vec=1) == kp_launch((1, 1, 1), (64, 1, 1))
    assert quant_launch(rows=5, cols=1, vec=1).block == (32, 1, 1)
    decode = GemvSpec(BF16, BF16, FN, 16, gemv_m_tile(1))
    assert gemv_launch(1, 8192, decode) == kp_launch((1024, 1, 1), (128, 1, 1))  # 8 a block
    assert gemv_launch(17, 5, GemvSpec(BF16, BF16, FN, 16, gemv_m_tile(17))) == kp_launch(
        (1, 3, 1), (128, 1, 1)
    )
    assert [gemv_m_tile(m) for m in (1, 2, 8, 9, 16)] == [1, 8, 8, 8, 8]
    assert quant_vec(torch.bfloat16, 4096, 4096, 256) == 8
    assert quant_vec(torch.bfloat16, 4095, 4095, 256) == 1
    assert quant_vec(torch.float32, 4096, 4096, 256) == 1
    assert quant_vec(torch.float16, 4096, 4096, 8) == 1  # a misaligned row start
    assert gemv_vec(4096, 256, 512) == 16
    assert gemv_vec(4100, 256, 512) == 4
    assert gemv_vec(4097, 256, 512) == 1
    assert gemv_vec(4096, 8, 512) == 4


def kp_launch(grid: tuple[int, int, int], block: tuple[int, int, int]) -> object:
    from kernelpick.kernels._cupy_runtime import Grid

    return Grid(grid, block)


def test_inputs_are_checked_before_any_launch() -> None:
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    weight = torch.zeros(32, 64).to(torch.float8_e4m3fn)
    with pytest.raises(kp.KernelInputError, match=r"x: .*device cpu; expected a CUDA tensor"):
        quantize_per_token_cupy(x, FN)
    with pytest.raises(kp.KernelInputError, match=r"x: .*dtype int32"):
        quantize_per_token_cupy(torch.zeros(4, 64, dtype=torch.int32), FN)
    with pytest.raises(kp.KernelInputError, match=r"x: got shape \[4\]"):
        quantize_per_token_cupy(torch.zeros(4, dtype=torch.bfloat16), FN)
    with pytest.raises(kp.KernelInputError, match=r"x: .*dtype float32"):
        w8a16_gemv_cupy(x.float(), weight, torch.ones(32, 1), None, torch.bfloat16)
    with pytest.raises(kp.KernelInputError, match="expected a CUDA tensor"):
        w8a16_gemv_cupy(x, weight, torch.ones(32, 1), None, torch.bfloat16)
    # 32 scales of a [2, 16] block grid are not 32 per-channel ones.
    with pytest.raises(kp.KernelInputError, match=r"weight scale: .*\[32\] or \[32, 1\]"):
        w8a16_gemv_cupy(x, weight, torch.ones(2, 16), None, torch.bfloat16)
    # The kernel's 32-bit offsets and grid.y bound what it takes (expanded: no memory).
    for m, k in ((1, 2**31 - 1024), (2**16, 2**15), (65535 * 8 + 1, 1)):
        big = torch.zeros((), dtype=torch.bfloat16).expand(m, k)
        w = torch.zeros((), dtype=torch.float8_e4m3fn).expand(4, k)
        with pytest.raises(kp.KernelInputError, match="fewer than 2\\^31 elements"):
            w8a16_gemv_cupy(big, w, torch.ones(()), None, torch.bfloat16)
    assert "cupy" not in sys.modules or not cupy_usable()


def test_without_cupy_the_cuda_kernels_quantize_with_torch_ops() -> None:
    config = kp.quant_config("fp8_per_channel", weight_shape=(64, 64))
    h100 = kp.device_profile("h100")
    launch = LAUNCHES["cuda_rowwise_scaled_mm"]
    spec = kp.default_catalog().kernel("cuda_rowwise_scaled_mm")
    cpu = torch.device("cpu")
    with_cupy = launch.kernel(spec, config, h100, cpu)
    without = launch.kernel(spec, config, attrs.evolve(h100, libraries=frozenset()), cpu)
    assert with_cupy.fused_quant
    assert not without.fused_quant
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    q, scale = without.quantize_input(x, without.prepare_weights(*_weights(config)))
    assert (q.dtype, scale.shape) == (torch.float8_e4m3fn, (3, 1))
    # The tensor-wise kernel has no per-token activations, so it never asks for cupy.
    assert not LAUNCHES["cuda_tensorwise_scaled_mm"].fused_quant


def _weights(config: kp.QuantConfig) -> tuple[torch.Tensor, torch.Tensor]:
    from kernelpick.kernels._quantize import quantize_per_token

    return quantize_per_token(torch.randn(config.weight_shape), FN)


def test_with_cupy_installed_and_no_gpu_it_is_unusable_and_never_imported_early() -> None:
    code = textwrap.dedent(
        """
        import importlib.util, sys
        import kernelpick as kp
        import kernelpick.adapters, kernelpick.integration, kernelpick.cli
        caps = kp.probe()
        installed = importlib.util.find_spec("cupy") is not None
        print("cupy" in sys.modules, "cupy" in caps.libraries, installed)
        from kernelpick.kernels._cupy_runtime import cupy_usable
        print(cupy_usable())
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.split("\n")[:2]
    imported, in_caps, installed = first.split()
    assert (imported, in_caps) == ("False", "False")
    if installed == "True" and not torch.cuda.is_available():
        assert second == "False"


def test_each_layout_is_a_view_of_the_canonical_weight_with_the_same_values() -> None:
    from kernelpick.kernels._canonical import dequantize_weight

    for kernel, scheme, device in (
        ("cuda_rowwise_scaled_mm", "fp8_per_channel", "h100"),
        ("cuda_w8a16_cupy", "fp8_weight_only", "h100"),
        ("rocm_rowwise_scaled_mm", "fp8_per_channel", "mi300x"),
    ):
        config = kp.quant_config(scheme, weight_shape=(48, 32))
        caps = attrs.evolve(kp.device_profile(device), libraries=frozenset())
        bound = LAUNCHES[kernel].kernel(
            kp.default_catalog().kernel(kernel), config, caps, torch.device("cpu")
        )
        weight, scale = _weights(config)
        bundle = bound.prepare_weights(weight, scale)
        assert bundle.weight.data_ptr() == weight.data_ptr(), kernel
        stored = bundle.weight if bundle.weight.shape == (48, 32) else bundle.weight.t()
        values = stored.float() * bundle.scale
        assert torch.equal(values, dequantize_weight(weight, scale, config)), kernel
