"""The integer weight-only families (W4A16, W8A16) against the float64 emulation of the
pack-quantized format: every CPU row, odd shapes, every group size, zero points,
act-order, every input dtype, bias; and the canonical tensors they refuse."""

from __future__ import annotations

import itertools

import pytest
import torch

import kernelpick as kp
from kernelpick.kernels import LAUNCHES, IntWeightOnly, bind, pack_int, quantize_int, unpack_int
from tests.support.int_emulation import emulated_int_weight

CPU = kp.probe("cpu")
INTEGER_ROWS = sorted(
    k for k in LAUNCHES if k.startswith("cpu") and issubclass(LAUNCHES[k].family, IntWeightOnly)
)
# Relative error bound per input dtype: the kernels' sums are fp32, their inputs rounded.
TOLERANCE = {"float32": 2e-5, "bfloat16": 2e-2, "float16": 4e-3}
SHAPES = [(48, 256), (32, 512), (33, 75), (16, 96)]
CASES = [
    (scheme, group, symmetric, act_order)
    for scheme, group in [("int4_weight_only", g) for g in (32, 64, 128, 256, -1)]
    + [("int8_weight_only", g) for g in (-1, 32, 128)]
    for symmetric, act_order in itertools.product((True, False), (False, True))
    if not (act_order and group == -1)  # one group per channel has no order to permute
]


def _config(
    scheme: str, shape: tuple[int, int], group: int, symmetric: bool, act_order: bool, dtype: str
) -> kp.QuantConfig | None:
    try:
        return kp.quant_config(
            scheme, weight_shape=shape, group_size=group, symmetric=symmetric,
            act_order=act_order, out_dtype=dtype, bias=True,
        )  # fmt: skip
    except kp.InvalidValueError:  # act-order with one group per channel: refused by name
        return None


def _g_idx(k: int, depth: int, generator: torch.Generator) -> torch.Tensor:
    # GPTQ's act-order: columns visited in a random order, depth to a group.
    visit = torch.randperm(k, generator=generator)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[visit] = (torch.arange(k) // depth).to(torch.int32)
    return g_idx


def test_every_integer_row_is_in_the_table() -> None:
    assert INTEGER_ROWS == [
        "cpu_int4_gemm", "cpu_int4pack_mm", "cpu_int8pack_mm", "cpu_wna16_reference"
    ]  # fmt: skip


@pytest.mark.parametrize("kernel", INTEGER_ROWS)
@pytest.mark.parametrize(("scheme", "group", "symmetric", "act_order"), CASES)
def test_each_kernel_matches_the_float64_emulation(
    kernel: str, scheme: str, group: int, symmetric: bool, act_order: bool
) -> None:
    ran = 0
    for (n, k), dtype in itertools.product(SHAPES, TOLERANCE):
        config = _config(scheme, (n, k), group, symmetric, act_order, dtype)
        if config is None:
            continue
        decision = kp.choose(CPU, config, kp.Policy(force=kernel))
        if not isinstance(decision, kp.Selected):
            continue
        generator = torch.Generator().manual_seed(n * 1000 + k)
        w = torch.randn(n, k, generator=generator)
        packed, scale, zero = quantize_int(w, config)
        depth = config.weight_block[1]
        g_idx = _g_idx(k, depth, generator) if act_order else None
        impl = bind(decision, config, CPU)
        bundle = impl.prepare_weights(packed, scale, zero_point=zero, g_idx=g_idx)
        for m in (1, 5):
            x = torch.randn(m, k, generator=generator).to(getattr(torch, dtype))
            bias = torch.randn(n, generator=generator).to(getattr(torch, dtype))
            got = impl.apply(x, bundle, bias)
            assert got.dtype == getattr(torch, dtype)
            assert got.shape == (m, n)
            weight = emulated_int_weight(
                packed, scale, zero, g_idx, config.weight.dtype.bits, k, depth if depth < k else -1
            )
            want = x.double() @ weight.t() + bias.double()
            error = float((got.double() - want).abs().max() / want.abs().max())
            assert error <= TOLERANCE[dtype], (kernel, n, k, dtype, m, error)
        ran += 1
    if kernel == "cpu_wna16_reference":
        assert ran, "the reference serves every integer config"


def test_the_quantizer_is_compressed_tensors_round_to_nearest() -> None:
    config = kp.quant_config("int4_weight_only", weight_shape=(2, 32), group_size=32)
    w = torch.zeros(2, 32)
    w[0, 0], w[0, 1] = 7.5, -7.5  # absmax / 7.5: scale 1; 7.5 clamps to 7, -7.5 to -8
    w[1, 2] = 0.25
    packed, scale, zero = quantize_int(w, config)
    assert zero is None
    assert torch.equal(scale[:, 0], torch.tensor([1.0, 0.25 / 7.5]))
    q = unpack_int(packed, 4, 32)
    assert (q[0, 0].item(), q[0, 1].item(), q[1, 2].item()) == (7, -8, 8 - 1)
    asym = kp.quant_config("int4_weight_only", weight_shape=(1, 32), group_size=32, symmetric=False)
    w = torch.linspace(-1.0, 14.0, 32).unsqueeze(0)
    packed, scale, zero = quantize_int(w, asym)
    assert zero is not None
    assert zero.item() == -7
    assert unpack_int(packed, 4, 32).min().item() == -8


@pytest.mark.parametrize("bits", [4, 8])
def test_packing_is_little_endian_offset_binary(bits: int) -> None:
    generator = torch.Generator().manual_seed(bits)
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    q = torch.randint(low, high + 1, (7, 37), generator=generator, dtype=torch.int8)
    packed = pack_int(q, bits)
    assert packed.dtype == torch.int32
    assert packed.shape == (7, -(-37 * bits // 32))
    assert torch.equal(unpack_int(packed, bits, 37), q)
    first = int(packed[0, 0]) & 0xFFFFFFFF
    assert first & ((1 << bits) - 1) == int(q[0, 0]) + (1 << (bits - 1))


def _reference(**changes: object) -> tuple[IntWeightOnly, dict[str, torch.Tensor | None]]:
    config = kp.quant_config(
        "int4_weight_only", weight_shape=(16, 64), group_size=32, symmetric=False, act_order=True
    )
    impl = bind("cpu_wna16_reference", config, CPU)
    assert isinstance(impl, IntWeightOnly)
    packed, scale, zero = quantize_int(torch.randn(16, 64), config)
    tensors: dict[str, torch.Tensor | None] = {
        "weight": packed, "weight_scale": scale, "zero_point": zero,
        "g_idx": _g_idx(64, 32, torch.Generator().manual_seed(0)),
    }  # fmt: skip
    tensors.update(changes)  # type: ignore[arg-type]
    return impl, tensors


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"zero_point": None}, "zero_point"),
        ({"g_idx": None}, "g_idx"),
        ({"zero_point": torch.full((16, 2), 8, dtype=torch.int8)}, "zero_point"),
        ({"g_idx": torch.zeros(64, dtype=torch.int32)}, "g_idx"),  # one group of 64
        ({"g_idx": torch.arange(64, dtype=torch.int32) % 3}, "g_idx"),
        ({"weight_scale": torch.zeros(16, 2)}, "weight_scale"),
        ({"weight": torch.zeros(16, 7, dtype=torch.int32)}, "weight"),
    ],
)
def test_a_tensor_that_could_be_read_two_ways_is_refused_by_name(
    change: dict[str, object], named: str
) -> None:
    impl, tensors = _reference(**change)
    with pytest.raises(kp.KernelInputError) as info:
        impl.prepare_weights(
            tensors["weight"], tensors["weight_scale"],  # type: ignore[arg-type]
            zero_point=tensors["zero_point"], g_idx=tensors["g_idx"],
        )  # fmt: skip
    assert info.value.tensor == named


def test_an_fp8_kernel_refuses_zero_points_and_g_idx() -> None:
    config = kp.quant_config("fp8_weight_only", weight_shape=(16, 64), out_dtype="float32")
    impl = bind("cpu_w8a16_reference", config, CPU)
    weight = torch.zeros(16, 64).to(torch.float8_e4m3fn)
    with pytest.raises(kp.KernelInputError, match="zero_point"):
        impl.prepare_weights(
            weight, torch.ones(16, 1), zero_point=torch.zeros(16, 1, dtype=torch.int8)
        )


def test_a_bundle_from_another_integer_family_is_refused() -> None:
    # bf16: torch's CPU int4 op serves bf16 layers only (TORCH_CPU_INT_INPUT).
    config = kp.quant_config(
        "int4_weight_only", weight_shape=(32, 64), group_size=32, out_dtype="bfloat16"
    )
    reference = bind("cpu_wna16_reference", config, CPU)
    tinygemm = bind("cpu_int4pack_mm", config, CPU)
    bundle = reference.quantize_weights(torch.randn(32, 64))
    with pytest.raises(kp.KernelInputError, match="bundle"):
        tinygemm.apply(torch.randn(2, 64, dtype=torch.bfloat16), bundle)


def test_a_bundle_of_another_grouping_with_as_many_groups_is_refused() -> None:
    # K = 256 in groups of 128 or of 200: two scales a row either way.
    def config(group: int) -> kp.QuantConfig:
        return kp.quant_config(
            "int4_weight_only", weight_shape=(32, 256), group_size=group, out_dtype="float32"
        )

    bundle = bind("cpu_wna16_reference", config(128), CPU).quantize_weights(torch.randn(32, 256))
    with pytest.raises(kp.KernelInputError, match=r"bundle\.scale"):
        bind("cpu_wna16_reference", config(200), CPU).apply(torch.randn(2, 256), bundle)


def test_a_tinygemm_bundle_of_another_shape_is_refused_before_torch_sees_it() -> None:
    def config(k: int, group: int) -> kp.QuantConfig:
        return kp.quant_config(
            "int4_weight_only", weight_shape=(32, k), group_size=group, out_dtype="bfloat16"
        )

    bundle = bind("cpu_int4pack_mm", config(256, 128), CPU).quantize_weights(torch.randn(32, 256))
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    with pytest.raises(kp.KernelInputError, match=r"bundle\.weight"):
        bind("cpu_int4pack_mm", config(128, 64), CPU).apply(x, bundle)


@pytest.mark.parametrize(
    ("kernel", "config"),
    [
        # Built without bind: the family and its row's layout rules still refuse.
        (
            "cpu_int8pack_mm",
            kp.quant_config("int8_weight_only", weight_shape=(32, 256), symmetric=False),
        ),
        (
            "cpu_int4pack_mm",
            kp.quant_config("int8_weight_only", weight_shape=(32, 256), group_size=128),
        ),
        ("cpu_wna16_reference", kp.quant_config("fp8_weight_only", weight_shape=(32, 256))),
        ("cpu_w8a16_reference", kp.quant_config("int4_weight_only", weight_shape=(32, 256))),
    ],
)
def test_a_family_built_without_bind_refuses_a_layer_it_would_misread(
    kernel: str, config: kp.QuantConfig
) -> None:
    spec = kp.default_catalog().kernel(kernel)
    with pytest.raises(kp.InvalidValueError, match="config"):
        LAUNCHES[kernel].kernel(spec, config, CPU, torch.device("cpu"))


@pytest.mark.parametrize(
    ("group", "symmetric"), [(32, False), (128, True), (64, False), (-1, True)]
)
def test_the_cpu_int4_kernel_is_exact_to_fp32_on_bf16_activations(
    group: int, symmetric: bool
) -> None:
    # bf16 activations times q - z are exact on vdpbf16ps: only fp32 summation remains.
    # N = 43 leaves rows past every tile of rows, at every count of tokens the op tiles by.
    n, k = 43, 300
    config = kp.quant_config(
        "int4_weight_only", weight_shape=(n, k), group_size=group, symmetric=symmetric,
        input_dtype="bfloat16", out_dtype="float32",
    )  # fmt: skip
    decision = kp.choose(CPU, config, kp.Policy(force="cpu_int4_gemm"))
    if not isinstance(decision, kp.Selected):
        pytest.skip(f"this CPU has no AVX512-BF16: {decision.reasons[0]}")
    generator = torch.Generator().manual_seed(7)
    packed, scale, zero = quantize_int(torch.randn(n, k, generator=generator), config)
    impl = bind(decision, config, CPU)
    bundle = impl.prepare_weights(packed, scale, zero_point=zero)
    weight = emulated_int_weight(packed, scale, zero, None, 4, k, config.weight_block[1])
    for m in (1, 2, 3, 4, 5, 7, 8, 9, 20):
        x = torch.randn(m, k, generator=generator).bfloat16()
        want = x.double() @ weight.t()
        got = impl.apply(x, bundle).double()
        assert float((got - want).abs().max() / want.abs().max()) < 1e-6, m


def test_the_cpu_int4_kernel_is_turned_down_without_avx512_bf16() -> None:
    config = kp.quant_config("int4_weight_only", weight_shape=(64, 256))
    avx2 = kp.device_profile("cpu")  # AVX2, FMA, F16C
    decision = kp.choose(avx2, config, kp.Policy(force="cpu_int4_gemm"))
    assert isinstance(decision, kp.Rejected)
    assert any("avx512_bf16" in str(reason) for reason in decision.reasons)


def _cpu_int4(group: int, symmetric: bool) -> tuple[IntWeightOnly, kp.QuantConfig]:
    config = kp.quant_config(
        "int4_weight_only", weight_shape=(16, 256), group_size=group, symmetric=symmetric,
        input_dtype="bfloat16", out_dtype="float32",
    )  # fmt: skip
    decision = kp.choose(CPU, config, kp.Policy(force="cpu_int4_gemm"))
    if not isinstance(decision, kp.Selected):
        pytest.skip(f"this CPU has no AVX512-BF16: {decision.reasons[0]}")
    impl = bind(decision, config, CPU)
    assert isinstance(impl, IntWeightOnly)
    return impl, config


@pytest.mark.parametrize("symmetric", [True, False])
def test_the_cpu_int4_kernel_refuses_its_own_bundle_of_another_grouping(symmetric: bool) -> None:
    # Per channel and groups of 32 or 128: the weight's shape carries the group.
    fine, _ = _cpu_int4(32, symmetric)
    coarse, _ = _cpu_int4(128, symmetric)
    bundle = fine.quantize_weights(torch.randn(16, 256))
    with pytest.raises(kp.KernelInputError, match=r"bundle\.weight"):
        coarse.apply(torch.randn(2, 256).bfloat16(), bundle)


@pytest.mark.parametrize("group", [32, 128, -1])
def test_the_cpu_int4_kernel_propagates_inf_as_torch_does_with_zero_points(group: int) -> None:
    impl, config = _cpu_int4(group, False)
    generator = torch.Generator().manual_seed(group + 100)
    packed, scale, zero = quantize_int(torch.randn(16, 256, generator=generator), config)
    bundle = impl.prepare_weights(packed, scale, zero_point=zero)
    x = torch.randn(3, 256, generator=generator).bfloat16()
    x[0, 5], x[1, 7], x[1, 200] = float("inf"), float("inf"), float("-inf")
    depth = config.weight_block[1] if group > 0 else -1
    weight = emulated_int_weight(packed, scale, zero, None, 4, 256, depth).float()
    want = x.float() @ weight.t()
    got = impl.apply(x, bundle)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(torch.isinf(got), torch.isinf(want))
