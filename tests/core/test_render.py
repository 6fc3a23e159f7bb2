"""Rendering at the edge: the text layout engines know, and the JSON-able record."""

from __future__ import annotations

import json

import pytest

import kernelpick as kp
from kernelpick.core import SCHEMA_VERSION, Verdict

PTPC = kp.quant_config("fp8_per_channel", weight_shape=(4096, 4096))


def test_rejected_text_is_the_layout_engines_print_then_the_hints() -> None:
    decision = kp.choose(kp.device_profile("a100"), PTPC)
    assert isinstance(decision, kp.Rejected)
    lines = decision.render().splitlines()
    assert lines[0] == (
        "Failed to find a kernel that can implement the ScaledMM linear layer. Reasons:"
    )
    assert lines[1] == (
        "  - cuda_rowwise_scaled_mm: requires compute capability 8.9 or higher; device has 8.0"
    )
    reasons = len(decision.reasons)
    assert (
        "  - cuda_w8a16_torch: weight-only (W8A16) kernel cannot honour per-token "
        "activation quantization"
    ) in lines[:reasons]
    # The integer weight-only rows come last, and say both what they cannot honour and
    # what they read instead.
    assert lines[reasons] == (
        "  - cuda_wna16_torch: supports quantized int4 or int8; config has float8_e4m3fn"
    )
    assert lines[1 : reasons + 1] == [f"  - {r.kernel}: {r.render()}" for r in decision.reasons]
    assert lines[reasons + 1 :] == [f"Hint: {hint}" for hint in decision.hints]


def test_a_rejection_hints_at_what_works_computed_from_the_catalog() -> None:
    a100 = kp.device_profile("a100")
    decision = kp.choose(a100, PTPC)
    assert isinstance(decision, kp.Rejected)
    # The scheme hint is what choose() itself answers for that scheme on this device.
    exact = []
    for scheme in kp.Scheme:
        other = kp.choose(a100, kp.quant_config(scheme, weight_shape=(4096, 4096)))
        # A degraded stand-in is named only when nothing exact is.
        mine = scheme is kp.Scheme.FP8_PER_CHANNEL
        if isinstance(other, kp.Selected) and not other.degraded and not mine:
            exact.append(f"{scheme} selects {other.kernel}")
    assert exact
    assert decision.hints[0] == f"on {a100.name}, " + "; ".join(exact)
    # The device hint names what the first device-bound kernel needs, and that device works.
    assert decision.hints[1] == (
        "or move to a device with compute capability 8.9 or higher, "
        "where cuda_rowwise_scaled_mm runs"
    )
    assert isinstance(kp.choose(kp.device_profile("l4"), PTPC), kp.Selected)
    assert decision.to_dict()["hints"] == list(decision.hints)


def test_a_rejection_no_device_or_scheme_fixes_has_no_hint() -> None:
    # A shape no kernel's alignment accepts, forced onto one kernel: nothing to suggest.
    config = kp.quant_config("fp8_per_channel", weight_shape=(4096, 4100))
    policy = kp.Policy(force="cuda_rowwise_scaled_mm")
    decision = kp.choose(kp.device_profile("h100"), config, policy)
    assert isinstance(decision, kp.Rejected)
    assert decision.hints == ()
    assert "Hint" not in decision.render()


def test_selected_text_names_the_kernel_and_why_not_the_others() -> None:
    decision = kp.choose(kp.device_profile("h100"), PTPC)
    assert isinstance(decision, kp.Selected)
    text = decision.render()
    assert text.startswith("Selected cuda_rowwise_scaled_mm.\nOther kernels:\n")
    assert "  - cuda_channelwise_unfused: also viable" in text
    assert "  - cuda_tensorwise_scaled_mm: supports per-tensor activation scales" in text


def test_degraded_choice_is_flagged_in_text() -> None:
    config = kp.quant_config("fp8_per_tensor", weight_shape=(4096, 4096))
    decision = kp.choose(kp.device_profile("t4"), config)
    assert isinstance(decision, kp.Selected)
    assert decision.render().startswith("Selected cuda_w8a16_cupy (degraded: weight-only (W8A16)")


def test_to_dict_is_json_and_carries_every_reason() -> None:
    decision = kp.choose(kp.device_profile("a100"), PTPC)
    assert isinstance(decision, kp.Rejected)
    record = json.loads(json.dumps(decision.to_dict()))
    assert record["schema_version"] == SCHEMA_VERSION
    assert (record["outcome"], record["kernel"]) == ("rejected", None)
    assert [t["kernel"] for t in record["trace"]] == list(kp.default_catalog().ids_for("cuda"))
    flat = [r for t in record["trace"] for r in t["reasons"]]
    assert [r["code"] for r in flat] == [r.code.value for r in decision.reasons]
    assert [r["message"] for r in flat] == [r.render() for r in decision.reasons]
    assert flat[0] == {
        "code": "compute_capability",
        "needed": "8.9",
        "found": "8.0",
        "message": "requires compute capability 8.9 or higher; device has 8.0",
    }


def test_to_dict_statuses_for_a_selection() -> None:
    decision = kp.choose(kp.device_profile("h100"), PTPC)
    statuses = {t["kernel"]: t["status"] for t in decision.to_dict()["trace"]}
    assert list(statuses) == list(kp.default_catalog().ids_for("cuda"))
    special = {"cuda_rowwise_scaled_mm": "selected", "cuda_channelwise_unfused": "viable"}
    assert statuses == {kernel: special.get(kernel, "rejected") for kernel in statuses}


def test_selected_text_says_where_each_other_viable_kernel_stands() -> None:
    # Least preferred first: the degraded W8A16 kernel precedes the W8A8 one chosen over it.
    catalog = kp.Catalog(tuple(reversed(kp.default_catalog().kernels)))
    config = kp.quant_config("fp8_per_tensor", weight_shape=(64, 64))
    decision = kp.choose(kp.device_profile("cpu"), config, catalog=catalog)
    assert isinstance(decision, kp.Selected)
    assert [v.kernel for v in decision.trace] == list(catalog.ids_for("cpu"))
    assert catalog.ids_for("cpu")[1:3] == ("cpu_w8a16_reference", "cpu_dequant_reference")
    assert decision.kernel == "cpu_dequant_reference"
    lines = decision.render().splitlines()
    assert (
        "  - cpu_w8a16_reference: also viable, but degraded: a non-degraded kernel is preferred"
        in lines
    )
    assert "  - cpu_tensorwise_scaled_mm: also viable (later in preference order)" in lines
    assert not any("cpu_w8a16_reference: also viable (later" in line for line in lines)
    # A degraded kernel after the choice is still only a degraded alternative.
    assert "  - cpu_fp8_w8a16_gemm: also viable (later in preference order; degraded)" in lines


def test_a_degraded_kernel_after_the_choice_is_marked_so() -> None:
    config = kp.quant_config("fp8_per_tensor", weight_shape=(64, 64))
    decision = kp.choose(kp.device_profile("cpu"), config)
    assert isinstance(decision, kp.Selected)
    lines = decision.render().splitlines()
    assert decision.kernel == "cpu_fp8_gemm"
    assert "  - cpu_w8a16_reference: also viable (later in preference order; degraded)" in lines
    assert "  - cpu_fp8_w8a16_gemm: also viable (later in preference order; degraded)" in lines
    assert "  - cpu_tensorwise_scaled_mm: also viable (later in preference order)" in lines


def test_rejected_hints_are_a_tuple_of_sentences_never_a_bare_string() -> None:
    decision = kp.choose(kp.device_profile("a100"), PTPC)
    assert isinstance(decision, kp.Rejected)
    with pytest.raises(kp.InvalidValueError, match="hints"):
        kp.Rejected(decision.trace, "some hint")
    with pytest.raises(kp.InvalidValueError, match="hints"):
        kp.Rejected(decision.trace, (1,))
    assert kp.Rejected(decision.trace, ["a", "b"]).hints == ("a", "b")


@pytest.mark.parametrize(
    "fields",
    [
        ("k", "W8A8", (), False),
        ("k", kp.KernelKind.W8A8, [], False),
        ("k", kp.KernelKind.W8A8, (), "no"),
        (None, kp.KernelKind.W8A8, (), False),
        ("k", kp.KernelKind.W8A8, ("a reason",), False),
    ],
)
def test_a_verdict_refuses_fields_of_the_wrong_type(fields: tuple[object, ...]) -> None:
    with pytest.raises(kp.InvalidValueError, match="verdict"):
        Verdict(*fields)  # type: ignore[arg-type]
