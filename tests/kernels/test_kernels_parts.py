"""The device-specific parts of the kernels, checked on the CPU: fnuz, layout, alignment,
bias placement, and the input checks that run before anything is launched."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch

import kernelpick as kp
from kernelpick.core import Dtype
from kernelpick.kernels import LAUNCHES, bind
from kernelpick.kernels._base import KernelBase
from kernelpick.kernels._canonical import quantize_canonical
from kernelpick.kernels._fnuz import as_fnuz
from kernelpick.kernels._quantize import quantize, quantize_in_chunks, quantize_per_token
from tests.support.emulation import BOUND, emulated, on_cpu, relative_error

CPU = torch.device("cpu")


def _bound(kernel: str, scheme: str, n: int = 32, k: int = 64, **kwargs: Any) -> KernelBase:
    device = {"cpu": "cpu", "cuda": "h100", "rocm": "mi300x"}[kernel.split("_")[0]]
    config = kp.quant_config(scheme, weight_shape=(n, k), **kwargs)
    caps = attrs.evolve(kp.device_profile(device), libraries=frozenset())  # torch-op quantizer
    return on_cpu(kernel, config, caps)


def _weights(impl: KernelBase) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = impl.config.weight_shape
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0))
    return quantize_canonical(w, impl.config)


def test_as_fnuz_reads_every_canonical_byte_as_the_same_value_without_a_copy() -> None:
    canonical = [b for b in range(256) if b not in (0x7F, 0x80, 0xFF)]  # no NaN, no -0
    weight = torch.tensor(canonical, dtype=torch.uint8).view(torch.float8_e4m3fn)
    scale = torch.tensor(0.75)
    fnuz, doubled, input_scale = as_fnuz(weight, scale, torch.tensor(0.5))
    assert fnuz.dtype == torch.float8_e4m3fnuz
    assert fnuz.data_ptr() == weight.data_ptr()
    assert input_scale is not None
    assert float(input_scale) == 1.0
    assert torch.equal(fnuz.float() * doubled, weight.float() * scale)


def test_rocm_gfx942_reads_the_canonical_weight_as_fnuz_with_range_224() -> None:
    impl = _bound("rocm_rowwise_scaled_mm", "fp8_per_channel")
    fp8_weight, scale = _weights(impl)
    assert fp8_weight.dtype == torch.float8_e4m3fn  # stored canonical, whatever the device
    bundle = impl.prepare_weights(fp8_weight, scale)
    assert bundle.weight.dtype == torch.float8_e4m3fnuz
    assert bundle.weight.data_ptr() == fp8_weight.data_ptr()
    assert float(bundle.weight.float().abs().max()) == 224.0
    assert torch.equal(bundle.scale, scale * 2)
    q, _ = quantize_per_token(torch.randn(4, 64) * 1e4, Dtype.FLOAT8_E4M3FNUZ)
    assert not bool(torch.isnan(q.float()).any())
    assert float(q.float().abs().max()) <= 224.0


def test_mi355x_quantizes_into_ocp_e4m3fn() -> None:
    config = kp.quant_config("fp8_per_channel", weight_shape=(32, 64))
    caps = kp.device_profile("mi355x")
    impl = LAUNCHES["rocm_rowwise_scaled_mm"].kernel(
        kp.default_catalog().kernel("rocm_rowwise_scaled_mm"), config, caps, CPU
    )
    assert impl.prepare_weights(*_weights(impl)).weight.dtype == torch.float8_e4m3fn


@pytest.mark.parametrize(
    "kernel", ["cpu_rowwise_scaled_mm", "cuda_channelwise_unfused", "rocm_rowwise_scaled_mm"]
)
def test_scaled_mm_reads_the_weight_as_a_column_major_view_without_copying(kernel: str) -> None:
    impl = _bound(kernel, "fp8_per_channel")
    fp8_weight, scale = _weights(impl)
    bundle = impl.prepare_weights(fp8_weight, scale)
    assert bundle.weight.shape == (64, 32)  # [K, N]
    assert bundle.weight.stride() == (1, 64)  # column-major
    assert bundle.weight.data_ptr() == fp8_weight.data_ptr()
    assert bundle.scale.shape == (32, 1)


@pytest.mark.parametrize("kernel", ["cuda_w8a16_torch", "cpu_dequant_reference"])
def test_dequantizing_kernels_keep_the_weight_as_stored(kernel: str) -> None:
    scheme = "fp8_weight_only" if "w8a16" in kernel else "fp8_per_channel"
    impl = _bound(kernel, scheme)
    fp8_weight, scale = _weights(impl)
    assert impl.prepare_weights(fp8_weight, scale).weight is fp8_weight


@pytest.mark.parametrize(
    "kernel", ["cuda_rowwise_scaled_mm", "rocm_tensorwise_scaled_mm", "cpu_rowwise_scaled_mm"]
)
def test_gpu_and_cpu_scaled_mm_refuse_unaligned_weights(kernel: str) -> None:
    scheme = "fp8_per_tensor" if "tensorwise" in kernel else "fp8_per_channel"
    impl = _bound(kernel, scheme, n=40, k=64)
    fp8_weight, scale = _weights(impl)
    with pytest.raises(kp.KernelInputError, match=r"weight: got shape \[40, 64\]") as info:
        impl.prepare_weights(fp8_weight, scale)
    assert "multiples of 16" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_reference_kernels_take_unaligned_weights() -> None:
    impl = _bound("cpu_dequant_reference", "fp8_per_channel", n=40, k=60)
    bundle = impl.prepare_weights(*_weights(impl))
    assert impl.apply(torch.randn(3, 60, dtype=torch.bfloat16), bundle).shape == (3, 40)


@pytest.mark.parametrize(("out", "fused"), [("float32", False), ("bfloat16", True)])
def test_cuda_adds_the_bias_after_the_op_where_cublaslt_refuses_it(
    monkeypatch: pytest.MonkeyPatch, out: str, fused: bool
) -> None:
    seen: list[torch.Tensor | None] = []
    real = torch._scaled_mm

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(kwargs.get("bias"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", spy)
    impl = _bound("cuda_tensorwise_scaled_mm", "fp8_per_tensor", out_dtype=out)
    x = torch.randn(4, 64).to(getattr(torch, out))
    bias = torch.randn(32).to(getattr(torch, out))
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    fp8_weight, scale = quantize_canonical(w, impl.config)
    got = impl.apply(x, impl.prepare_weights(fp8_weight, scale), bias)
    assert (seen[0] is not None) is fused
    want = emulated(x, w, impl.config, impl.fp8_format, bias=bias).out
    assert relative_error(got, want) <= BOUND[out]


def test_output_keeps_the_leading_dimensions_and_an_empty_batch_works() -> None:
    impl = _bound("cpu_rowwise_scaled_mm", "fp8_per_channel")
    bundle = impl.prepare_weights(*_weights(impl))
    assert impl.apply(torch.randn(2, 3, 5, 64, dtype=torch.bfloat16), bundle).shape == (2, 3, 5, 32)
    empty = impl.apply(torch.randn(0, 64, dtype=torch.bfloat16), bundle)
    assert (empty.shape, empty.dtype) == ((0, 32), torch.bfloat16)


def _bad_call(case: str) -> Any:
    """Run one bad call against a row-wise CPU kernel; return what it returned."""
    impl = _bound("cpu_rowwise_scaled_mm", "fp8_per_channel")
    fp8_weight, scale = _weights(impl)
    bundle = impl.prepare_weights(fp8_weight, scale)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    calls: dict[str, Any] = {
        "x dtype": lambda: impl.apply(x.float(), bundle),
        "x width": lambda: impl.apply(x[:, :63], bundle),
        "bias shape": lambda: impl.apply(x, bundle, torch.zeros(31)),
        "meta x": lambda: impl.apply(x.to("meta"), bundle),
        "weight dtype": lambda: impl.prepare_weights(fp8_weight.to(torch.bfloat16), scale),
        "weight shape": lambda: impl.prepare_weights(fp8_weight.t(), scale),
        "weight layout": lambda: impl.prepare_weights(fp8_weight.t().contiguous().t(), scale),
        "meta weight": lambda: impl.prepare_weights(fp8_weight.to("meta"), scale),
        "sparse x": lambda: impl.apply(x.float().to_sparse().bfloat16(), bundle),
        "scale shape": lambda: impl.prepare_weights(fp8_weight, scale[:16]),
        "scale dtype": lambda: impl.prepare_weights(fp8_weight, scale.bfloat16()),
        "unwanted input_scale": lambda: impl.prepare_weights(fp8_weight, scale, torch.ones(())),
        "cast bundle": lambda: impl.apply(x, bundle._replace(weight=bundle.weight.bfloat16())),
    }
    return calls[case]()


BAD_INPUTS = [
    ("x dtype", "x: got shape [4, 64], dtype float32", "dtype bfloat16"),
    ("x width", "x: got shape [4, 63]", "last dimension K=64"),
    ("bias shape", "bias: got shape [31]", "shape [32]"),
    ("meta x", "x: got shape [4, 64], dtype bfloat16, device meta", "not on the meta device"),
    ("weight dtype", "weight: got shape [32, 64], dtype bfloat16", "float8_e4m3fn"),
    ("weight shape", "weight: got shape [64, 32]", "shape [32, 64]"),
    ("weight layout", "weight: got shape [32, 64]", "contiguous row-major"),
    ("meta weight", "weight: got shape [32, 64], dtype float8_e4m3fn, device meta", "meta"),
    ("sparse x", "x: got shape [4, 64]", "dense (strided)"),
    ("scale shape", "weight_scale: got shape [16, 1]", "shape [32, 1]"),
    ("scale dtype", "weight_scale: got shape [32, 1], dtype bfloat16", "dtype float32"),
    ("unwanted input_scale", "input_scale: got shape []", "None"),
    ("cast bundle", "bundle.weight: got shape [64, 32], dtype bfloat16", "float8_e4m3fn"),
]


@pytest.mark.parametrize(("case", "prefix", "expected"), BAD_INPUTS)
def test_bad_inputs_are_refused_before_launch_naming_the_tensor(
    case: str, prefix: str, expected: str
) -> None:
    with pytest.raises(kp.KernelInputError) as info:
        _bad_call(case)
    assert str(info.value).startswith(prefix)
    assert expected in info.value.expected


def test_a_static_config_needs_its_input_scale() -> None:
    impl = _bound("cpu_tensorwise_scaled_mm", "fp8_per_tensor_static")
    fp8_weight, scale = _weights(impl)
    with pytest.raises(kp.KernelInputError, match=r"input_scale: .*static"):
        impl.prepare_weights(fp8_weight, scale)
    bundle = impl.prepare_weights(fp8_weight, scale.reshape(1), torch.tensor([0.01]))
    assert bundle.scale.shape == ()
    assert bundle.input_scale is not None


def test_bind_checks_id_platform_and_device() -> None:
    config = kp.quant_config("fp8_per_channel", weight_shape=(32, 64))
    with pytest.raises(kp.UnknownNameError, match="cuda_w8a16_cupy") as info:
        bind("marlin", config, kp.device_profile("h100"))  # the message lists the real ids
    assert info.value.value == "marlin"
    with pytest.raises(kp.InvalidValueError, match="a cuda device, since cuda_rowwise"):
        bind("cuda_rowwise_scaled_mm", config, kp.device_profile("h100"), "cpu")
    with pytest.raises(kp.InvalidValueError, match="a cpu device for cpu_rowwise_scaled_mm"):
        bind("cpu_rowwise_scaled_mm", config, kp.device_profile("h100"))


def test_group_quantization_round_trips_any_group_shape() -> None:
    w = torch.randn(300, 200, generator=torch.Generator().manual_seed(1))
    for group in [(1, -1), (-1, -1), (128, 128), (1, 64), (-1, 32)]:
        whole, whole_scale = quantize(w, group, Dtype.FLOAT8_E4M3FN)
        chunked, chunked_scale = quantize_in_chunks(w, group, Dtype.FLOAT8_E4M3FN, chunk_rows=64)
        assert torch.equal(whole.view(torch.uint8), chunked.view(torch.uint8)), group
        assert torch.equal(whole_scale, chunked_scale), group


# --- quantize_weights: values, autograd ---------------------------------------------------


def test_quantize_weights_keeps_no_autograd_history() -> None:
    # An nn.Linear's weight requires grad; the bundle must not hold its graph (and with it
    # fp32 copies of the weight).
    impl = _bound("cpu_rowwise_scaled_mm", "fp8_per_channel")
    linear = torch.nn.Linear(64, 32, bias=False)
    assert linear.weight.requires_grad
    bundle = impl.quantize_weights(linear.weight)
    assert not bundle.weight.requires_grad
    assert bundle.weight.grad_fn is None
    assert not bundle.scale.requires_grad
    out = impl.apply(torch.randn(2, 64, dtype=torch.bfloat16), bundle)
    assert not out.requires_grad


@pytest.mark.parametrize("scheme", ["fp8_per_tensor", "fp8_per_channel", "fp8_weight_only"])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_quantize_weights_refuses_a_non_finite_weight(scheme: str, bad: float) -> None:
    kernel = {
        "fp8_per_tensor": "cpu_tensorwise_scaled_mm",
        "fp8_weight_only": "cpu_w8a16_reference",
    }
    impl = _bound(kernel.get(scheme, "cpu_rowwise_scaled_mm"), scheme)
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    w[7, 9] = bad
    with pytest.raises(kp.KernelInputError, match="row 7 has NaN or Inf"):
        impl.quantize_weights(w)


@pytest.mark.parametrize("value", [0.0, -0.02, float("nan"), float("inf")])
def test_quantize_weights_refuses_a_static_input_scale_that_is_not_positive_and_finite(
    value: float,
) -> None:
    impl = _bound("cpu_tensorwise_scaled_mm", "fp8_per_tensor_static")
    with pytest.raises(kp.KernelInputError, match="input_scale") as info:
        impl.quantize_weights(torch.randn(32, 64), torch.tensor(value))
    assert "positive, finite" in info.value.expected
    assert impl.quantize_weights(torch.randn(32, 64), torch.tensor(0.01)).input_scale is not None


# --- apply: the bundle's layout ------------------------------------------------------------


def test_apply_refuses_a_bundle_another_family_prepared_even_on_a_square_layer() -> None:
    # The same bytes, [N, K] as stored against the [K, N] transpose _scaled_mm reads: every
    # dtype and extent matches on a square layer, and the product would be x @ W.
    scaled_mm = _bound("cpu_tensorwise_scaled_mm", "fp8_per_tensor", n=64, k=64)
    reference = _bound("cpu_dequant_reference", "fp8_per_tensor", n=64, k=64)
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    row_major, column_major = reference.quantize_weights(w), scaled_mm.quantize_weights(w)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with pytest.raises(kp.KernelInputError, match=r"bundle\.weight") as info:
        scaled_mm.apply(x, row_major)
    assert "strides (1, 64)" in info.value.expected
    with pytest.raises(kp.KernelInputError, match=r"bundle\.weight") as info:
        reference.apply(x, column_major)
    assert "strides (64, 1)" in info.value.expected
    # Their own bundles run.
    assert scaled_mm.apply(x, column_major).shape == reference.apply(x, row_major).shape


def test_apply_refuses_a_bundle_whose_scale_has_another_shape() -> None:
    per_tensor = _bound("cpu_dequant_reference", "fp8_per_tensor")
    per_channel = _bound("cpu_dequant_reference", "fp8_per_channel")
    bundle = per_channel.quantize_weights(torch.randn(32, 64))
    with pytest.raises(kp.KernelInputError, match=r"bundle.scale: got shape \[32, 1\]"):
        per_tensor.apply(torch.randn(4, 64, dtype=torch.bfloat16), bundle)


def test_apply_accepts_any_stride_on_an_extent_of_one() -> None:
    impl = _bound("cpu_dequant_reference", "fp8_per_channel", n=1, k=64)
    bundle = impl.quantize_weights(torch.randn(1, 64))
    odd = torch.empty((5, 64), dtype=bundle.weight.dtype)[:1]
    odd.copy_(bundle.weight)
    restrided = bundle._replace(weight=odd.as_strided((1, 64), (999, 1)))
    x = torch.ones(2, 64, dtype=torch.bfloat16)
    assert torch.equal(impl.apply(x, restrided), impl.apply(x, bundle))


# --- canonical bytes ------------------------------------------------------------------------


def _tiny_negatives() -> torch.Tensor:
    # Each row's amax is 1, so -1e-6 quantizes to -0 (byte 0x80) unless it is made +0.
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(5)).clamp(-1, 1)
    w[:, 0] = 1.0
    w[:, 1::2] = -1e-6
    return w


@pytest.mark.parametrize("scheme", ["fp8_weight_only", "fp8_per_tensor", "fp8_per_channel"])
def test_quantize_weights_writes_canonical_bytes_so_fnuz_reads_no_nan(scheme: str) -> None:
    # MI300X (gfx942) rereads the bytes as e4m3fnuz, where -0 (0x80) is NaN.
    kernel = "rocm_w8a16_torch" if scheme == "fp8_weight_only" else "rocm_channelwise_unfused"
    if scheme == "fp8_per_tensor":
        kernel = "rocm_tensorwise_scaled_mm"
    impl = _bound(kernel, scheme)
    assert impl.fp8_format is Dtype.FLOAT8_E4M3FNUZ
    w = _tiny_negatives()
    assert int((w.to(torch.float8_e4m3fn).view(torch.uint8) == 0x80).sum()) > 0  # -0 is real
    bundle = impl.quantize_weights(w)
    assert int((bundle.weight.contiguous().view(torch.uint8) == 0x80).sum()) == 0
    assert not bool(bundle.weight.float().isnan().any())


def test_canonicalize_fp8_is_exported_and_makes_a_weight_of_ones_own_safe_on_fnuz() -> None:
    from kernelpick.kernels import canonicalize_fp8_

    impl = _bound("rocm_w8a16_torch", "fp8_weight_only")
    w = _tiny_negatives()
    scale = w.abs().amax(dim=1, keepdim=True) / 448
    fp8 = (w / scale).to(torch.float8_e4m3fn)  # a plain cast: holds -0
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    assert bool(impl.apply(x, impl.prepare_weights(fp8, scale)).isnan().any())  # the precondition
    canonicalize_fp8_("weight", fp8)
    assert not bool(impl.apply(x, impl.prepare_weights(fp8, scale)).isnan().any())
