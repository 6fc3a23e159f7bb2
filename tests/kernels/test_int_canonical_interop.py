"""The canonical integer layout is compressed-tensors' pack-quantized one, bit for bit:
checked against the real package's packers and its own quantize/dequantize."""

from __future__ import annotations

import pytest
import torch
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

import kernelpick as kp
from kernelpick.kernels import (
    dequantize_int,
    pack_int,
    pack_zero_points,
    quantize_int,
    unpack_zero_points,
)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(("n", "k"), [(32, 64), (30, 75), (7, 13)])
def test_weights_and_zero_points_pack_as_compressed_tensors_packs_them(
    bits: int, n: int, k: int
) -> None:
    generator = torch.Generator().manual_seed(n * k + bits)
    low, high = -(1 << (bits - 1)), 1 << (bits - 1)
    q = torch.randint(low, high, (n, k), generator=generator, dtype=torch.int8)
    assert torch.equal(pack_int(q, bits), pack_to_int32(q, bits))
    zero = torch.randint(low, high, (n, 3), generator=generator, dtype=torch.int8)
    packed = pack_zero_points(zero, bits)
    assert torch.equal(packed, pack_to_int32(zero, bits, packed_dim=0))
    assert torch.equal(unpack_zero_points(packed, bits, n), zero)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize(("scheme", "bits"), [("int4_weight_only", 4), ("int8_weight_only", 8)])
def test_the_quantizer_matches_compressed_tensors_fake_quantization(
    scheme: str, bits: int, symmetric: bool
) -> None:
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    config = kp.quant_config(
        scheme, weight_shape=(16, 256), group_size=64, symmetric=symmetric, out_dtype="float32"
    )
    w = torch.randn(16, 256, generator=torch.Generator().manual_seed(bits))
    packed, scale, zero = quantize_int(w, config)
    args = QuantizationArgs(
        num_bits=bits, type="int", symmetric=symmetric, strategy="group", group_size=64
    )
    grouped = w.view(16, 4, 64)
    their_scale, their_zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
    torch.testing.assert_close(scale, their_scale, rtol=1e-6, atol=0)
    if zero is not None:
        assert torch.equal(zero.to(torch.int32), their_zero.to(torch.int32))
    theirs = fake_quantize(w, their_scale, their_zero, args)
    torch.testing.assert_close(
        dequantize_int(packed, scale, zero, config), theirs, rtol=1e-6, atol=1e-7
    )
