"""Robustness: the same answers under load, nothing lost on a failed conversion, and no
NaN or Inf out of any quantizer, whatever comes in."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest
import torch

import kernelpick as kp
from kernelpick.core import CpuArch, Dtype
from kernelpick.integration import ModelConversionError, quantize_model
from kernelpick.kernels import LAUNCHES, IntWeightOnly, KernelBase
from kernelpick.kernels._canonical import quantize_canonical
from tests.support.snapshots import snapshot
from tests.support.torch_cpu import FNUZ_REFUSED, refuses_fnuz

CPU = kp.device_profile("cpu")
FP8 = [Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ]


def _questions(count: int, seed: int) -> list[tuple[kp.DeviceCaps, kp.QuantConfig, kp.Policy]]:
    rng = random.Random(seed)
    profiles = list(kp.device_profiles().values())
    ids = list(kp.default_catalog().ids)
    shapes = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (100, 60), (48, 32)]
    policies = [
        kp.Policy(),
        kp.Policy(strict=True),
        kp.Policy(disabled=frozenset(rng.sample(ids, 3))),
    ]
    return [
        (
            rng.choice(profiles),
            kp.quant_config(rng.choice(list(kp.Scheme)), weight_shape=rng.choice(shapes),
                      out_dtype=rng.choice(["bfloat16", "float16", "float32"])),
            rng.choice(policies),
        )
        for _ in range(count)
    ]  # fmt: skip


@pytest.mark.slow  # 25-28 s: 10,000 questions, then 16 threads asking them all
def test_sixteen_threads_get_exactly_what_one_thread_gets_and_the_cache_stays_bounded() -> None:
    kp.clear_cache()
    work = _questions(10_000, seed=7)
    expected = [kp.choose(*question) for question in work]
    kp.clear_cache()
    results: list[list[kp.Decision]] = [[] for _ in range(16)]
    errors: list[BaseException] = []
    start = threading.Barrier(16)

    def worker(index: int) -> None:
        order = list(range(len(work)))
        random.Random(index).shuffle(order)  # each thread asks in its own order
        start.wait()
        try:
            answers = {i: kp.choose(*work[i]) for i in order}
            results[index] = [answers[i] for i in range(len(work))]
        except BaseException as error:  # reported below, not swallowed
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for answers in results:
        assert answers == expected
    info = kp.cache_info()
    assert info.maxsize == 4096
    assert info.currsize <= info.maxsize


class Stack(torch.nn.Module):
    def __init__(self, widths: list[tuple[int, int]]) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(k, n) for n, k in widths)


WIDTHS = [(64, 32), (48, 64), (32, 48), (64, 32), (16, 64)]
# Only the _scaled_mm kernels, which need K and N to be multiples of 16: so an unaligned
# layer is one that no kernel takes. The references and the compiled kernels (cpu_fp8_gemm,
# cpu_fp8_w8a16_gemm) take any N and K, so they are disabled.
ALIGNED_ONLY = kp.Policy(
    disabled=frozenset(
        {
            "cpu_fp8_gemm",
            "cpu_fp8_w8a16_gemm",
            "cpu_dequant_reference",
            "cpu_w8a16_reference",
        }
    )
)


def _unaligned(model: Stack, index: int) -> None:
    old = model.layers[index]
    assert isinstance(old, torch.nn.Linear)
    model.layers[index] = torch.nn.Linear(old.in_features, old.out_features + 3)


def _non_finite(value: float) -> Callable[[Stack, int], None]:
    def inject(model: Stack, index: int) -> None:
        with torch.no_grad():
            model.layers[index].get_parameter("weight")[1, 2] = value

    return inject


def _float64(model: Stack, index: int) -> None:
    model.layers[index] = model.layers[index].double()


FAILURES = {
    "no kernel takes the shape": _unaligned,
    "a NaN weight": _non_finite(float("nan")),
    "an Inf weight": _non_finite(float("-inf")),
    "an unsupported dtype": _float64,
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
@pytest.mark.parametrize("index", range(len(WIDTHS)))
def test_a_failure_at_any_layer_leaves_every_module_and_byte_as_it_was(
    failure: str, index: int
) -> None:
    torch.manual_seed(index)
    model = Stack(WIDTHS)
    FAILURES[failure](model, index)
    before = snapshot(model)
    with pytest.raises(ModelConversionError) as info:
        quantize_model(model, caps=CPU, policy=ALIGNED_ONLY)
    assert [name for name, _ in info.value.failures] == [f"layers.{index}"]
    assert snapshot(model) == before
    # And the same model, repaired, converts.
    clean = Stack(WIDTHS)
    assert len(quantize_model(clean, caps=CPU, policy=ALIGNED_ONLY).layers) == len(WIDTHS)


def _extreme_rows(width: int, fp8: Dtype) -> torch.Tensor:
    rows = [
        torch.zeros(width),  # all zero
        torch.full((width,), 3.25),  # constant
        torch.full((width,), 1e-40),  # subnormal fp32
        torch.full((width,), -fp8.quant_max),  # exactly the FP8 range
        torch.full((width,), fp8.finfo_max * 1.5),  # beyond it
        torch.linspace(-1e30, 1e30, width),  # huge, both signs
        torch.tensor([1e-45, -1e-45] * (width // 2)),  # the smallest subnormals
        torch.cat([torch.full((width - 1,), 1e-30), torch.tensor([1e30])]),  # one huge outlier
    ]
    return torch.stack(rows)


def _finite_fp8(tensor: torch.Tensor) -> bool:
    return bool(torch.isfinite(tensor.float()).all())


HOST = kp.probe("cpu")
HOST_ISA = HOST.arch.isa if isinstance(HOST.arch, CpuArch) else frozenset()
# The compiled kernels: CPU-only families whose op takes e4m3fn weights, the only flavour a
# CPU has (DeviceCaps.fp8_format), and which need the host's ISA and a C++ toolchain.
COMPILED = frozenset({"cpu_fp8_gemm", "cpu_fp8_w8a16_gemm", "cpu_int8_gemm"})
# int8 kernels store int8 whatever the device's FP8 flavour: one case is enough.
ONE_FLAVOUR = COMPILED | {"cpu_int8_int_mm"}


def _integer(kernel: str) -> bool:
    return issubclass(LAUNCHES[kernel].family, IntWeightOnly)


CASES = [
    pytest.param(kernel, fp8, id=f"{kernel}-{fp8.value}")
    # The integer weight-only families: tests/kernels/test_wna16_kernels.py.
    for kernel in sorted(k for k in LAUNCHES if k.startswith("cpu") and not _integer(k))
    for fp8 in FP8
    if kernel not in ONE_FLAVOUR or fp8 is Dtype.FLOAT8_E4M3FN
]


def _scheme(kernel: str) -> str:
    if "int8" in kernel:
        return "int8_per_channel"
    return "fp8_weight_only" if "w8a16" in kernel else (
        "fp8_per_tensor" if "tensorwise" in kernel else "fp8_per_channel"
    )  # fmt: skip


def _runs_here(kernel: str) -> bool:
    config = kp.quant_config(_scheme(kernel), weight_shape=(16, 32))
    return isinstance(kp.choose(HOST, config, kp.Policy(force=kernel)), kp.Selected)


@pytest.mark.parametrize(("kernel", "fp8"), CASES)
def test_no_input_gives_nan_or_inf_in_a_quantized_weight_or_activation(
    kernel: str, fp8: Dtype
) -> None:
    if kernel in COMPILED and not _runs_here(kernel):
        pytest.skip(f"{kernel} needs an x86 CPU with AVX2+FMA+F16C and a C++ toolchain")
    if refuses_fnuz(kernel, fp8):
        pytest.skip(FNUZ_REFUSED)
    width = 32
    config = kp.quant_config(_scheme(kernel), weight_shape=(16, width), out_dtype="float32")
    spec = kp.default_catalog().kernel(kernel)
    family = LAUNCHES[kernel].family
    impl: KernelBase = family(spec, config, torch.device("cpu"), fp8, isa=HOST_ISA)
    extreme = _extreme_rows(width, fp8).repeat(2, 1)  # 16 rows: the scaled_mm alignment
    weight, scale = quantize_canonical(extreme, config)
    bundle = impl.prepare_weights(weight, scale)  # the device's flavour: e4m3fnuz reads 224
    assert _finite_fp8(bundle.weight)
    assert bool(torch.isfinite(bundle.scale).all())
    assert float(bundle.weight.float().abs().max()) <= fp8.quant_max
    if config.activation is not None:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x = extreme.clamp(-6e4, 6e4).to(dtype) if dtype == torch.float16 else extreme.to(dtype)
            q, x_scale = impl.quantize_input(x, bundle)
            assert _finite_fp8(q), dtype
            assert bool(torch.isfinite(x_scale).all()), dtype
    moderate = torch.randn(4, width)
    assert bool(torch.isfinite(impl.apply(moderate, bundle)).all())
    # A kernel may quantize activations inside its op rather than through quantize_input
    # (cpu_fp8_gemm does): the extreme rows through apply, against a moderate weight, must
    # come out finite too, in every input dtype.
    moderate_bundle = impl.quantize_weights(torch.randn(16, width))
    for name in ("float32", "bfloat16", "float16"):
        typed = kp.quant_config(
            _scheme(kernel), weight_shape=(16, width), input_dtype=name, out_dtype="float32"
        )
        typed_impl = family(spec, typed, torch.device("cpu"), fp8, isa=HOST_ISA)
        x = extreme.clamp(-6e4, 6e4) if name == "float16" else extreme
        out = typed_impl.apply(x.to(getattr(torch, name)), moderate_bundle)
        assert bool(torch.isfinite(out).all()), name
