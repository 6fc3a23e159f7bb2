"""An engine's own mixed-precision (WNA16) catalog, written with kp.KernelSpec and the
integer weight rules: vLLM's CUDA ``_POSSIBLE_KERNELS`` order (CutlassW4A8, Machete,
AllSpark, Marlin, Conch, Exllama, TritonW4A16; vllm/model_executor/kernels/linear/
mixed_precision/), each kernel's ``can_implement`` stated as rules. It chooses as vLLM does
on the t4, a100 and h100 profiles, and a layer nothing serves keeps every reason.

vLLM's weight types map onto kernelpick's configs: uint4b8 / uint8b128 (stored with a
bias, value q - 8 / q - 128) are symmetric int4 / int8, uint4 / uint8 with zero points
are asymmetric ones.
"""

from __future__ import annotations

import attrs
import pytest

import kernelpick as kp
from kernelpick.core import CudaArch, Dtype

R = kp.rules
CUDA, W8A8, W8A16 = kp.Platform.CUDA, kp.KernelKind.W8A8, kp.KernelKind.W8A16
INT4, INT8 = Dtype.INT4, Dtype.INT8
HALF = R.InputDtypes(frozenset({Dtype.BFLOAT16, Dtype.FLOAT16}))


@attrs.frozen
class Multiples:
    """An engine's own rule: K and N multiples of their own (vLLM's kernels state both)."""

    k: int
    n: int

    def check(self, caps: kp.DeviceCaps, config: kp.QuantConfig) -> kp.Reason | None:
        if config.k % self.k == 0 and config.n % self.n == 0:
            return None
        needed = f"K % {self.k} == 0 and N % {self.n} == 0"
        return kp.Reason(kp.RejectCode.SHAPE_ALIGNMENT, needed, f"N={config.n}, K={config.k}")

    def render(self) -> str:
        return f"K % {self.k}, N % {self.n}"


def _spec(
    name: str, requires: tuple[R.Requirement, ...], kind: kp.KernelKind = W8A16
) -> kp.KernelSpec:
    fallback: frozenset[kp.GroupShape] | None = None if kind is W8A8 else frozenset()
    return kp.KernelSpec(name, CUDA, kind, requires, fallback=fallback)


_ZP = R.ZeroPoints(frozenset({INT4, INT8}))
ENGINE = kp.Catalog(
    (
        # FP8 (e4m3) activations: a W8A8 kernel to kernelpick, turned down by its kind here.
        _spec(
            "cutlass_w4a8",
            (
                R.CudaArchs({9: None}),
                R.QuantDtypes(frozenset({INT4})),
                R.GroupSizes(frozenset({128}), per_channel=False),
                Multiples(128, 128),
                R.OutDtypes(frozenset({Dtype.BFLOAT16})),
            ),
            W8A8,
        ),
        _spec(
            "machete",
            (
                R.CudaArchs({9: None}),
                R.QuantDtypes(frozenset({INT4, INT8})),
                R.GroupSizes(frozenset({64, 128})),
                _ZP,
                R.ActOrder(True),
                HALF,
                Multiples(64, 128),
            ),
        ),
        _spec(
            "allspark",
            (
                R.CudaArchs({8: None}),
                R.QuantDtypes(frozenset({INT8})),
                R.GroupSizes(frozenset()),
                HALF,
                Multiples(16, 16),
            ),
        ),
        _spec(
            "marlin",
            (
                R.MinComputeCapability(CudaArch(7, 5)),
                R.QuantDtypes(frozenset({INT4, INT8})),
                R.GroupSizes(frozenset({32, 64, 128})),
                R.ZeroPoints(frozenset({INT4})),
                R.ActOrder(True),
                Multiples(128, 64),
            ),
        ),
        _spec(
            "conch",
            (
                R.MinComputeCapability(CudaArch(8, 0)),
                R.NeedsLibrary("conch"),
                R.QuantDtypes(frozenset({INT4, INT8})),
                R.GroupSizes(frozenset({128})),
                _ZP,
            ),
        ),
        _spec(
            "exllama",
            (
                R.MinComputeCapability(CudaArch(6, 0)),
                R.QuantDtypes(frozenset({INT4, INT8})),
                R.InputDtypes(frozenset({Dtype.FLOAT16})),
                R.GroupSizes(None, per_channel=False, whole_k=True),
                R.ActOrder(True),
                Multiples(1, 8),
            ),
        ),
        _spec(
            "triton_w4a16",
            (
                R.QuantDtypes(frozenset({INT4})),
                R.GroupSizes(frozenset({32, 64, 128, 256}), whole_k=True),
                R.ZeroPoints(frozenset({INT4})),
                HALF,
                Multiples(1, 8),
            ),
        ),
    )
)


def _config(scheme: str = "int4_weight_only", **kwargs: object) -> kp.QuantConfig:
    return kp.quant_config(scheme, weight_shape=(4096, 4096), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("profile", "config", "kernel"),
    [
        ("h100", _config(), "machete"),
        ("a100", _config(), "marlin"),  # AllSpark is per-channel int8 only
        ("t4", _config(), "marlin"),
        ("h100", _config(symmetric=False), "machete"),
        ("a100", _config(symmetric=False), "marlin"),
        ("a100", _config("int8_weight_only"), "allspark"),
        ("h100", _config("int8_weight_only"), "machete"),
        ("t4", _config("int8_weight_only"), "marlin"),
        ("h100", _config(group_size=32), "marlin"),  # Machete reads -1, 64, 128
        ("t4", _config(act_order=True, out_dtype="float16"), "marlin"),
        ("a100", _config(group_size=256), "triton_w4a16"),
    ],
)
def test_the_engine_catalog_chooses_as_vllm_does(
    profile: str, config: kp.QuantConfig, kernel: str
) -> None:
    decision = kp.choose(kp.device_profile(profile), config, catalog=ENGINE)
    assert isinstance(decision, kp.Selected), decision.render()
    assert decision.kernel == kernel


def test_a_layer_no_kernel_serves_keeps_every_reason() -> None:
    # Group 96 on a T4: every kernel says why, in order, and each reason has its own code.
    decision = kp.choose(kp.device_profile("t4"), _config(group_size=96), catalog=ENGINE)
    assert isinstance(decision, kp.Rejected)
    by_kernel: dict[str, set[kp.RejectCode]] = {}
    for reason in decision.reasons:
        by_kernel.setdefault(reason.kernel, set()).add(reason.code)
    assert list(by_kernel) == list(ENGINE.ids)
    code = kp.RejectCode
    assert by_kernel["cutlass_w4a8"] >= {code.ACTIVATION_REQUIRED, code.GPU_ARCH}
    assert by_kernel["machete"] >= {code.GPU_ARCH, code.GROUP_SIZE}
    assert by_kernel["marlin"] == {code.GROUP_SIZE}
    assert by_kernel["conch"] >= {
        code.COMPUTE_CAPABILITY,
        code.LIBRARY_UNAVAILABLE,
        code.GROUP_SIZE,
    }
    assert by_kernel["exllama"] == {code.INPUT_DTYPE, code.GROUP_SIZE}  # fp16 only; 4096 % 96
    assert by_kernel["triton_w4a16"] == {code.GROUP_SIZE}


def test_the_core_laws_hold_for_the_engine_kernels_too() -> None:
    # AllSpark declares no ZeroPoints or ActOrder rule: the core refuses both for it.
    a100 = kp.device_profile("a100")
    asym = _config("int8_weight_only", symmetric=False)
    verdict = next(
        v for v in kp.core.evaluate(a100, asym, catalog=ENGINE) if v.kernel == "allspark"
    )
    assert [r.code for r in verdict.reasons] == [kp.RejectCode.ZERO_POINTS]
    # A group cut by tensor parallelism: Marlin's "not divisible by group_size" (vLLM), here
    # the core's law, for every kernel.
    cut = kp.quant_config("int4_weight_only", weight_shape=(4096, 2000), k_parts=2)
    decision = kp.choose(kp.device_profile("h100"), cut, catalog=ENGINE)
    assert isinstance(decision, kp.Rejected)
    assert all(kp.RejectCode.GROUP_STRADDLE in {r.code for r in v.reasons} for v in decision.trace)
    # An FP8 or W8A8 config never reaches a weight-only integer kernel.
    ptpc = kp.quant_config("fp8_per_channel", weight_shape=(4096, 4096))
    assert isinstance(kp.choose(kp.device_profile("t4"), ptpc, catalog=ENGINE), kp.Rejected)
