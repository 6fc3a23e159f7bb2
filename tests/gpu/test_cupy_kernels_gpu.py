"""The cupy kernels on a real NVIDIA GPU (``gpu`` marker; skipped without one, and when
cupy is not usable there)."""

from __future__ import annotations

import attrs
import pytest
import torch

import kernelpick as kp
from kernelpick.core import Dtype
from kernelpick.kernels._cupy_gemv import GEMV_MAX_M, w8a16_gemv_cupy
from kernelpick.kernels._cupy_group_quant import quantize_groups_cupy
from kernelpick.kernels._cupy_quant import quantize_per_token_cupy
from kernelpick.kernels._cupy_runtime import cupy_usable
from kernelpick.kernels._quantize import quantize, quantize_per_token
from tests.support.emulation import BOUND, relative_error

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and torch.version.hip is None and cupy_usable()),
        reason="needs an NVIDIA GPU with cupy usable",
    ),
]
FN = Dtype.FLOAT8_E4M3FN


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("m", "k"), [(1, 8192), (7, 4096), (33, 1000), (300, 17), (5, 1)])
def test_fused_quantizer_matches_the_torch_quantizer(dtype: torch.dtype, m: int, k: int) -> None:
    x = (torch.randn(m, k, device=_device()) * 3).to(dtype)
    x[0, :] = 0  # an all-zero row keeps the scale floor
    if k > 3:
        x[-1, 3] = 1e4  # an outlier
    q, scale = quantize_per_token_cupy(x, FN)
    q_ref, scale_ref = quantize_per_token(x, FN)
    torch.testing.assert_close(scale, scale_ref, rtol=0, atol=0)
    # Same formula, IEEE division on both sides: every byte should agree.
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("fp8", [FN, Dtype.FLOAT8_E4M3FNUZ])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("k", [128, 4096, 4224, 200, 7])
@pytest.mark.parametrize("m", [1, 17, 300])
def test_fused_group_quantizer_matches_the_torch_quantizer_byte_for_byte(
    fp8: Dtype, dtype: torch.dtype, k: int, m: int
) -> None:
    x = (torch.randn(m, k, device=_device()) * 3).to(dtype)
    x[0, : min(k, 130)] = 0  # an all-zero group keeps the scale floor
    if m > 2:
        x[1, k // 2] = float("nan")  # that group's scale and every byte NaN
        x[2, 0] = float("inf")  # an infinite scale: finite values 0, inf NaN
        x[-1, ::11] = 1e4  # outliers: most other quotients subnormal
    # Also views whose row stride is not K: 16-byte loads (K - 8) and scalar ones (K - 1).
    for rows in (x, *((x[:, : k - 8], x[:, : k - 1]) if k > 16 else ())):
        q, scale = quantize_groups_cupy(rows, fp8)
        q_ref, scale_ref = quantize(rows, (1, 128), fp8)
        assert scale.stride() == (1, rows.shape[0])
        nan = torch.isnan(scale_ref)
        assert torch.equal(torch.isnan(scale), nan)
        assert torch.equal(scale[~nan].view(torch.int32), scale_ref[~nan].view(torch.int32))
        nan_bytes = torch.isnan(q_ref.float())
        assert torch.equal(torch.isnan(q.float()), nan_bytes)
        assert torch.equal(q.view(torch.uint8)[~nan_bytes], q_ref.view(torch.uint8)[~nan_bytes])


def test_block_fp8_forward_with_the_fused_group_quantizer_matches_torch_ops() -> None:
    from kernelpick.kernels import bind
    from kernelpick.kernels._canonical import quantize_canonical

    caps = kp.probe("cuda")
    config = kp.quant_config("fp8_block", weight_shape=(512, 1024))
    try:
        kernel = bind("cuda_block_scaled_mm", config, caps, _device())
    except kp.KernelpickError as error:
        pytest.skip(f"block FP8 does not run here: {error}")
    assert kernel.fused_quant
    bundle = kernel.prepare_weights(
        *quantize_canonical(torch.randn(512, 1024, device=_device()) * 0.05, config)
    )
    x = torch.randn(33, 1024, device=_device()).to(torch.bfloat16)
    q, scale = kernel.quantize_input(x, bundle)
    q_ref, scale_ref = quantize(x, (1, 128), FN)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(scale, scale_ref)
    # The same GEMM on the torch quantizer's bytes and scales: the very same output.
    unfused = attrs.evolve(kernel, fused_quant=False)
    assert torch.equal(kernel.apply(x, bundle), unfused.apply(x, bundle))


def test_fused_quantizer_runs_on_a_side_stream_and_under_graph_capture() -> None:
    x = torch.randn(64, 4096, device=_device(), dtype=torch.bfloat16)
    expected = quantize_per_token(x, FN)[0].view(torch.uint8)
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    with torch.cuda.stream(side):
        q, _ = quantize_per_token_cupy(x, FN)
    side.synchronize()
    assert torch.equal(q.view(torch.uint8), expected)
    quantize_per_token_cupy(x, FN)  # compiled before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured, _ = quantize_per_token_cupy(x, FN)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.view(torch.uint8), expected)


@pytest.mark.parametrize(
    ("m", "n", "k"), [(1, 4096, 4096), (3, 257, 1000), (16, 33, 8191), (5, 8, 12)]
)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemv_matches_the_fp32_reference(
    m: int, n: int, k: int, bias: bool, per_channel: bool, dtype: torch.dtype
) -> None:
    # K 4096: 16-byte loads (sm_90: the hardware decode); 1000 and 12: 4-byte; 8191: bytes.
    assert m <= GEMV_MAX_M
    device = _device()
    x = torch.randn(m, k, device=device).to(dtype)
    w = torch.randn(n, k, device=device) * 0.05
    if per_channel:
        scale = (w.abs().amax(dim=1, keepdim=True) / 448).clamp(min=1e-12)
    else:
        scale = (w.abs().max() / 448).reshape(())
    weight = (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    b = torch.randn(n, device=device).to(torch.bfloat16) if bias else None
    got = w8a16_gemv_cupy(x, weight, scale, b, torch.bfloat16)
    want = x.float() @ (weight.float() * scale).t()
    if b is not None:
        want += b.float()
    assert relative_error(got, want) <= BOUND["bfloat16"] + 1e-3


def test_the_selected_w8a16_kernel_switches_to_cublas_past_the_gemv_rows() -> None:
    caps = kp.probe("cuda")
    config = kp.quant_config("fp8_weight_only", weight_shape=(512, 1024))
    from kernelpick.kernels import bind
    from kernelpick.kernels._canonical import quantize_canonical

    kernel = bind("cuda_w8a16_cupy", config, caps, _device())
    w = torch.randn(512, 1024, device=_device()) * 0.05
    bundle = kernel.prepare_weights(*quantize_canonical(w, config))
    for m in (1, GEMV_MAX_M, GEMV_MAX_M + 1, 200):
        x = torch.randn(m, 1024, device=_device()).to(torch.bfloat16)
        got = kernel.apply(x, bundle)
        want = x.float() @ (bundle.weight.float() * bundle.scale).t()
        assert relative_error(got, want) <= 4 * BOUND["bfloat16"], m
