"""The torch quantizers on NaN and inf (issue 26, item 2; docs/design.md#quantization-numerics).

The rule for every path: a group holding a NaN gets a NaN scale and every byte of it is
NaN; a group whose amax is inf gets an inf scale, its finite values become +-0 and its
infinities NaN (inf / inf); other groups are unaffected. Checked for ``quantize_per_token``,
``quantize_per_tensor``, ``quantize(x, (1, 128), fp8)`` and ``quantize_in_chunks``, for
e4m3fn and e4m3fnuz. A layer refuses a NaN or inf weight before it is quantized
(``check_finite``). The fused cupy quantizer's math on such rows is
tests/kernels/test_cupy_quant.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import kernelpick as kp
from kernelpick.core import Dtype
from kernelpick.kernels import bind
from kernelpick.kernels._quantize import (
    quantize,
    quantize_in_chunks,
    quantize_per_tensor,
    quantize_per_token,
)

FN, FNUZ = Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ
NAN, INF = float("nan"), float("inf")
Quantizer = Callable[[torch.Tensor, Dtype], tuple[torch.Tensor, torch.Tensor]]
ROWWISE: dict[str, Quantizer] = {
    "per token": quantize_per_token,
    "per channel in chunks": lambda x, fp8: quantize_in_chunks(x, (1, -1), fp8, chunk_rows=2),
    "1x128 groups": lambda x, fp8: quantize(x, (1, 128), fp8),
    "1x128 groups in chunks": lambda x, fp8: quantize_in_chunks(x, (1, 128), fp8, chunk_rows=2),
}


def _rows(dtype: torch.dtype) -> torch.Tensor:
    """Rows 0 and 4 finite; 1 has a NaN, 2 +inf, 3 -inf and +inf; 5 an inf and a NaN.
    Each special sits in the first 128 columns, so the second 1x128 group stays finite."""
    x = torch.randn(6, 256, generator=torch.Generator().manual_seed(2)) * 3
    x[1, 5], x[2, 7], x[3, 0], x[3, 100], x[5, 1], x[5, 2] = NAN, INF, -INF, INF, INF, NAN
    x[2, 9] = x[3, 1] = -0.0
    return x.to(dtype)


def _assert_rule(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
    """Per group (here: ``x`` and its expanded ``scale`` element by element)."""
    values, x = q.float(), x.float()
    nan_group, inf_group = torch.isnan(scale), torch.isinf(scale)
    assert torch.equal(torch.isnan(values), nan_group | (inf_group & torch.isinf(x)))
    assert (scale[inf_group] == INF).all()  # an amax is |x|: +inf, never -inf
    finite_in_inf = inf_group & torch.isfinite(x)
    assert (values[finite_in_inf] == 0).all()
    if q.dtype == torch.float8_e4m3fn:  # e4m3fnuz has no -0
        assert torch.equal(values[finite_in_inf].signbit(), x[finite_in_inf].signbit())
    ordinary = ~nan_group & ~inf_group
    assert torch.isfinite(values[ordinary]).all()


@pytest.mark.parametrize("fp8", [FN, FNUZ], ids=lambda d: d.value)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(ROWWISE))
def test_a_nan_or_inf_group_and_only_it_gets_a_non_finite_scale(
    fp8: Dtype, dtype: torch.dtype, name: str
) -> None:
    x = _rows(dtype)
    q, scale = ROWWISE[name](x, fp8)
    expanded = scale.repeat_interleave(256 // scale.shape[1], dim=1)
    _assert_rule(x, q, expanded)
    nan_rows, inf_rows = torch.isnan(scale[:, 0]), torch.isinf(scale[:, 0])
    assert nan_rows.tolist() == [False, True, False, False, False, True]
    assert inf_rows.tolist() == [False, False, True, True, False, False]
    assert torch.isfinite(scale[:, 1:]).all()  # the other 1x128 group of every row
    # Finite rows are quantized as if alone: the rule leaves them untouched.
    for row in (0, 4):
        alone_q, alone_scale = ROWWISE[name](x[row : row + 1], fp8)
        assert torch.equal(alone_scale, scale[row : row + 1])
        assert torch.equal(alone_q.view(torch.uint8), q[row : row + 1].view(torch.uint8))


@pytest.mark.parametrize("fp8", [FN, FNUZ], ids=lambda d: d.value)
@pytest.mark.parametrize("special", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
def test_per_tensor_one_special_value_decides_the_whole_tensor(fp8: Dtype, special: float) -> None:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    x[2, 10], x[0, 3] = special, -0.0
    q, scale = quantize_per_tensor(x, fp8)
    assert scale.shape == ()
    assert bool(torch.isnan(scale)) if special != special else float(scale) == INF
    _assert_rule(x, q, scale.expand_as(x))
    assert int(torch.isnan(q.float()).sum()) == (x.numel() if special != special else 1)


@pytest.mark.parametrize("special", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
def test_a_layer_refuses_a_non_finite_weight_before_quantizing(special: float) -> None:
    config = kp.quant_config("fp8_per_channel", weight_shape=(32, 64), out_dtype="float32")
    kernel = bind("cpu_dequant_reference", config, kp.device_profile("cpu"))
    weight = torch.randn(32, 64)
    weight[17, 5] = special
    with pytest.raises(kp.KernelInputError, match=r"row 17 has NaN or Inf"):
        kernel.quantize_weights(weight)
