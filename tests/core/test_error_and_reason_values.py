"""Example tables for the errors, the reasons and the kernel kinds (the vocabulary and error
format of docs/design.md#vocabulary and docs/design.md#error-format)."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import attrs
import pytest

import kernelpick as kp
from kernelpick.core import ENV_FORCE, CudaArch
from kernelpick.core._reasons import TEMPLATES
from tests.support.values import DTYPE_NAMES, PROFILE_NAMES

# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "err",
    [
        kp.UnknownNameError("dtype", "bfloat61", DTYPE_NAMES),
        kp.UnknownNameError("device profile", "h10", PROFILE_NAMES),
        kp.UnknownNameError("kernel id", None, ()),
        kp.InvalidValueError("weight_shape", (0, 16), "(N, K): two positive integers"),
        kp.InvalidValueError("strict", "maybe", "True or False"),
    ],
)
def test_error_pickle_round_trip(err: kp.KernelpickError) -> None:
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is type(err)
    assert str(copy) == str(err)
    assert copy.args == err.args
    assert isinstance(copy, kp.KernelpickError)
    assert isinstance(copy, ValueError)
    if isinstance(err, kp.UnknownNameError):
        assert isinstance(copy, kp.UnknownNameError)
        assert (copy.kind, copy.value, copy.choices, copy.closest) == (
            err.kind,
            err.value,
            err.choices,
            err.closest,
        )
    else:
        assert isinstance(err, kp.InvalidValueError)
        assert isinstance(copy, kp.InvalidValueError)
        assert (copy.what, copy.value, copy.expected) == (err.what, err.value, err.expected)


def test_raised_errors_pickle_round_trip() -> None:
    with pytest.raises(kp.UnknownNameError) as unknown:
        kp.device_profile("h10")
    with pytest.raises(kp.InvalidValueError) as invalid:
        kp.quant_config("fp8_per_channel", weight_shape=(0, 16))
    for err in (unknown.value, invalid.value):
        copy = pickle.loads(pickle.dumps(err))
        assert str(copy) == str(err)
        assert copy.value == err.value
    assert pickle.loads(pickle.dumps(unknown.value)).closest == "h100"


# --- reasons -----------------------------------------------------------------------------


def test_every_reject_code_has_a_template() -> None:
    assert set(TEMPLATES) == set(kp.RejectCode)


@pytest.mark.parametrize("code", list(kp.RejectCode))
def test_reason_renders_its_template(code: kp.RejectCode) -> None:
    reason = kp.Reason(code, "NEEDED-{x}", "FOUND-{y}", kernel="some_kernel")
    message = reason.render()
    assert message
    # The only braces left are the ones inside the substituted values.
    stripped = message.replace("NEEDED-{x}", "").replace("FOUND-{y}", "")
    assert "{" not in stripped
    assert "}" not in stripped
    assert reason.to_dict() == {
        "code": code.value,
        "needed": "NEEDED-{x}",
        "found": "FOUND-{y}",
        "message": message,
    }
    # What a rule returns differs only in the kernel the selector fills in.
    assert kp.Reason(code, "NEEDED-{x}", "FOUND-{y}").render() == message


@pytest.mark.parametrize(
    ("make", "what"),
    [
        # The order before 0.2, Reason(kernel, code, needed, found): refused, not misread.
        (lambda: kp.Reason("cuda_x", kp.RejectCode.OUT_DTYPE, "bf16", "fp16"), "reason code"),  # type: ignore[arg-type]
        (lambda: kp.Reason("compute_capability", "9.0", "8.0"), "reason code"),  # type: ignore[arg-type]
        (lambda: kp.Reason(kp.RejectCode.UNSUPPORTED, CudaArch(9, 0), "8.0"), "reason needed"),  # type: ignore[arg-type]
        (lambda: kp.Reason(kp.RejectCode.UNSUPPORTED, "9.0", None), "reason found"),  # type: ignore[arg-type]
        (lambda: kp.Reason(kp.RejectCode.UNSUPPORTED, "9.0", "8.0", 5), "reason kernel"),  # type: ignore[arg-type]
    ],
)
def test_reason_fields_are_validated(make: Callable[[], object], what: str) -> None:
    with pytest.raises(kp.InvalidValueError) as info:
        make()
    assert info.value.what == what


# --- KernelKind --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("W8A8", kp.KernelKind.W8A8),
        ("w8a16", kp.KernelKind.W8A16),
        (" W8A16 ", kp.KernelKind.W8A16),
        (kp.KernelKind.W8A8, kp.KernelKind.W8A8),
    ],
)
def test_kernel_spec_parses_its_kind(value: object, kind: kp.KernelKind) -> None:
    assert kp.KernelSpec("x", "cuda", value).kind is kind


def test_kernel_spec_refuses_an_unknown_kind_by_name() -> None:
    with pytest.raises(kp.UnknownNameError, match="kernel kind") as info:
        kp.KernelSpec("x", "cuda", "W8A4")
    assert info.value.closest in ("W8A8", "W8A16")


def test_device_caps_turn_an_arch_subclass_into_the_core_type() -> None:
    # Rules compare archs of one exact type, so a subclass would make choose raise.
    class MyArch(CudaArch):
        pass

    caps = attrs.evolve(kp.device_profile("h100"), arch=MyArch(9, 0))
    assert type(caps.arch) is CudaArch
    decision = kp.choose(caps, kp.quant_config("fp8_per_channel", weight_shape=(64, 64)))
    assert isinstance(decision, kp.Selected)


FP8_SCHEMES = ("fp8_per_channel", "fp8_per_tensor", "fp8_per_tensor_static", "fp8_weight_only",
               "fp8_block")  # fmt: skip
SHARED_STARTS: list[tuple[str, Callable[[], object], tuple[str, ...]]] = [
    ("scheme", lambda: kp.quant_config("fp8", weight_shape=(16, 16)), FP8_SCHEMES),
    ("scheme", lambda: kp.quant_config(" FP8_Per_Tens", weight_shape=(16, 16)),
     ("fp8_per_tensor", "fp8_per_tensor_static")),
    ("device profile", lambda: kp.device_profile("mi3"), ("mi300x", "mi325x", "mi355x")),
    ("kernel id", lambda: kp.Policy.from_env({ENV_FORCE: "cpu_fp8"}),
     ("cpu_fp8_gemm", "cpu_fp8_w8a16_gemm")),
    ("kernel kind", lambda: kp.KernelSpec("x", "cuda", "w8a"), ("W8A8", "W8A16")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "call", "candidates"),
    SHARED_STARTS,
    ids=[f"{kind}-{candidates[0]}" for kind, _call, candidates in SHARED_STARTS],
)
def test_a_name_that_begins_several_offers_each_of_them(
    kind: str, call: Callable[[], object], candidates: tuple[str, ...]
) -> None:
    """``fp8`` means one of the five FP8 schemes: none is nearer than the others, and
    ``mxfp8``, nearest by edit distance, is not among them."""
    with pytest.raises(kp.UnknownNameError) as info:
        call()
    error = info.value
    assert (error.kind, error.candidates, error.closest) == (kind, candidates, None)
    offered = ", ".join(map(repr, candidates))
    assert f"; did you mean one of {offered}? Known {kind}s: " in str(error)


@pytest.mark.parametrize(
    ("value", "closest"), [("fp8_per_chanel", "fp8_per_channel"), ("mxfp", "mxfp8")]
)
def test_a_slip_or_the_start_of_one_name_offers_that_name(value: str, closest: str) -> None:
    with pytest.raises(kp.UnknownNameError) as info:
        kp.quant_config(value, weight_shape=(16, 16))
    assert (info.value.candidates, info.value.closest) == ((closest,), closest)
    assert f"; did you mean {closest!r}? Known schemes: " in str(info.value)
