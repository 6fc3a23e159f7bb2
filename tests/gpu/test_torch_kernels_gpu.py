"""Every torch GPU kernel against the fp32 emulation, on the real device (``gpu`` marker).

Skipped where torch sees no GPU (tests/conftest.py). On a CUDA machine it runs the cuda_*
kernels, on a ROCm machine the rocm_* ones; a kernel the device cannot run (row-wise on an
A100, say) is skipped with the selector's own reasons.
"""

from __future__ import annotations

import pytest
import torch

import kernelpick as kp
from kernelpick.core import evaluate
from kernelpick.kernels import LAUNCHES, bind
from kernelpick.kernels._canonical import quantize_canonical
from tests.support.emulation import BOUND, emulated, relative_error

pytestmark = pytest.mark.gpu

SCHEMES = {
    "rowwise_scaled_mm": ("fp8_per_channel",),
    "block_scaled_mm": ("fp8_block",),
    "mxfp8_scaled_mm": ("mxfp8",),
    "tensorwise_scaled_mm": ("fp8_per_tensor", "fp8_per_tensor_static"),
    "channelwise_unfused": ("fp8_per_channel",),
    "int8_int_mm": ("int8_per_channel",),
    "int8_int_mm_padded": ("int8_per_channel",),
    "w8a16_torch": ("fp8_weight_only", "fp8_per_tensor", "fp8_block", "mxfp8"),
}
CASES = [(family, scheme) for family, schemes in SCHEMES.items() for scheme in schemes]


@pytest.mark.parametrize(("family", "scheme"), CASES)
@pytest.mark.parametrize("m", [1, 17, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_gpu_kernel_matches_the_fp32_emulation(
    family: str, scheme: str, m: int, bias: bool
) -> None:
    caps = kp.probe("cuda")
    kernel = f"{caps.platform}_{family}"
    if kernel not in LAUNCHES:  # block FP8, MXFP8 and int8 have CUDA rows only
        pytest.skip(f"no {kernel} in the launch table")
    n, k = 1024, 2048
    # Each call passes m rows: int8's rule (M > 16 on a GPU) turns m=1 down, and the
    # refusal itself is test_int8_refuses_a_decode_call_by_name's.
    config = kp.quant_config(scheme, weight_shape=(n, k), bias=bias, min_tokens=m)
    verdict = next(v for v in evaluate(caps, config) if v.kernel == kernel)
    if not verdict.ok:
        pytest.skip("; ".join(r.render() for r in verdict.reasons))
    device = torch.device("cuda", torch.cuda.current_device())
    generator = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=generator).to(torch.bfloat16)
    w = torch.randn(n, k, generator=generator) * 0.05
    b = torch.randn(n, generator=generator).to(torch.bfloat16) if bias else None
    input_scale = (x.float().abs().max() / 448.0).reshape(())  # a checkpoint's: for e4m3fn
    static = config.activation is not None and config.activation.scale.static
    impl = bind(kernel, config, caps, device)
    fp8_weight, scale = quantize_canonical(w.to(device), config)
    bundle = impl.prepare_weights(fp8_weight, scale, input_scale.to(device) if static else None)
    got = impl.apply(x.to(device), bundle, None if b is None else b.to(device)).cpu()
    weight_only = verdict.kind is kp.KernelKind.W8A16
    want = emulated(
        x, w, config, caps.fp8_format, bias=b,
        input_scale=input_scale if static else None, weight_only=weight_only,
    ).out  # fmt: skip
    # GPU GEMMs accumulate in their own order (and W8A16 in bf16): a few bf16 units.
    assert relative_error(got, want) <= 4 * BOUND["bfloat16"]


_INT8 = kp.quant_config("int8_per_channel", weight_shape=(64, 128), min_tokens=17)


def test_int8_refuses_a_decode_call_by_name() -> None:
    caps = kp.probe("cuda")
    if "cuda_int8_int_mm" not in {v.kernel for v in evaluate(caps, _INT8) if v.ok}:
        pytest.skip("cuda_int8_int_mm does not run here")
    device = torch.device("cuda", torch.cuda.current_device())
    impl = bind("cuda_int8_int_mm", _INT8, caps, device)
    bundle = impl.quantize_weights(torch.randn(64, 128, device=device))
    x = torch.randn(1, 128, device=device).to(torch.bfloat16)
    with pytest.raises(kp.KernelInputError, match=r"M > 16, got M=1"):
        impl.apply(x, bundle)
    assert impl.apply(torch.cat([x] * 17), bundle).shape == (17, 64)
