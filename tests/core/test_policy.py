"""Policy: disable, force, strict, and reading it from the environment."""

from __future__ import annotations

import pytest

import kernelpick as kp
from kernelpick.core import ENV_DISABLED, ENV_FORCE, ENV_STRICT

PTPC = kp.quant_config("fp8_per_channel", weight_shape=(4096, 4096))
H100 = kp.device_profile("h100")


def test_a_disabled_kernel_is_reported_and_skipped() -> None:
    decision = kp.choose(H100, PTPC, kp.Policy(disabled=frozenset({"cuda_rowwise_scaled_mm"})))
    assert isinstance(decision, kp.Selected)
    assert decision.kernel == "cuda_channelwise_unfused"
    rowwise = decision.trace[0]
    assert [r.code for r in rowwise.reasons] == [kp.RejectCode.DISABLED]
    assert _line(rowwise.reasons[0]) == (
        "cuda_rowwise_scaled_mm: disabled by policy (Policy.disabled, KERNELPICK_DISABLED_KERNELS)"
    )


def test_a_forced_kernel_that_fits_is_selected_and_others_say_not_forced() -> None:
    decision = kp.choose(H100, PTPC, kp.Policy(force="cuda_channelwise_unfused"))
    assert isinstance(decision, kp.Selected)
    assert decision.kernel == "cuda_channelwise_unfused"
    for verdict in decision.trace:
        codes = [r.code for r in verdict.reasons]
        assert (kp.RejectCode.NOT_FORCED in codes) == (verdict.kernel != decision.kernel)


def test_a_forced_kernel_that_cannot_implement_the_config_is_rejected_with_its_reasons() -> None:
    decision = kp.choose(H100, PTPC, kp.Policy(force="cuda_w8a16_torch"))
    assert isinstance(decision, kp.Rejected)
    forced = [r for r in decision.reasons if r.kernel == "cuda_w8a16_torch"]
    assert [r.code for r in forced] == [kp.RejectCode.WEIGHT_ONLY_ACTIVATION]
    # Never a silent fall-through to the kernel that would otherwise win.
    assert "cuda_rowwise_scaled_mm: not forced: policy forces cuda_w8a16_torch" in decision.render()


def test_a_forced_kernel_of_another_platform_is_rejected_as_such() -> None:
    decision = kp.choose(kp.device_profile("cpu"), PTPC, kp.Policy(force="cuda_rowwise_scaled_mm"))
    assert isinstance(decision, kp.Rejected)
    last = decision.trace[-1]
    assert last.kernel == "cuda_rowwise_scaled_mm"
    assert _line(last.reasons[0]) == "cuda_rowwise_scaled_mm: runs on cuda; device platform is cpu"
    # Its own rules are still evaluated and kept.
    assert kp.RejectCode.COMPUTE_CAPABILITY in {r.code for r in last.reasons[1:]}
    assert all(v.kernel in kp.default_catalog().ids_for("cpu") for v in decision.trace[:-1])


def test_choose_refuses_a_policy_naming_an_unknown_id() -> None:
    with pytest.raises(kp.UnknownNameError, match="cuda_rowwise_scaled_mm") as info:
        kp.choose(H100, PTPC, kp.Policy(disabled=frozenset({"cuda_rowwise_scaledmm"})))
    assert info.value.closest == "cuda_rowwise_scaled_mm"


def test_from_env_reads_all_three_variables() -> None:
    env = {
        ENV_DISABLED: " cuda_rowwise_scaled_mm, ,cuda_w8a16_cupy,cuda_rowwise_scaled_mm,",
        ENV_FORCE: " cuda_channelwise_unfused ",
        ENV_STRICT: "Yes",
    }
    assert kp.Policy.from_env(env) == kp.Policy(
        disabled=frozenset({"cuda_rowwise_scaled_mm", "cuda_w8a16_cupy"}),
        force="cuda_channelwise_unfused",
        strict=True,
    )


def test_from_env_with_nothing_set_is_the_default_policy() -> None:
    assert kp.Policy.from_env({}) == kp.Policy()
    assert kp.Policy.from_env({ENV_STRICT: " ", ENV_FORCE: "", ENV_DISABLED: ","}) == (kp.Policy())


@pytest.mark.parametrize(
    ("text", "strict"),
    [("1", True), ("true", True), ("YES", True), ("0", False), ("False", False), ("no", False)],
)
def test_from_env_strict_values(text: str, strict: bool) -> None:
    assert kp.Policy.from_env({ENV_STRICT: text}).strict is strict


@pytest.mark.parametrize("text", ["2", "on", "y", "truee"])
def test_from_env_rejects_other_strict_values(text: str) -> None:
    with pytest.raises(kp.InvalidValueError, match=ENV_STRICT) as info:
        kp.Policy.from_env({ENV_STRICT: text})
    assert info.value.value == text


@pytest.mark.parametrize(
    ("variable", "value", "closest"),
    [
        (ENV_DISABLED, "cuda_rowwise_scaled_mn", "cuda_rowwise_scaled_mm"),
        (ENV_FORCE, "cpu_dequant_refrence", "cpu_dequant_reference"),
        (ENV_DISABLED, "rocm_w8a16_torch,marlin", None),
    ],
)
def test_from_env_misspelt_id_names_the_closest_valid_one(
    variable: str, value: str, closest: str | None
) -> None:
    with pytest.raises(kp.UnknownNameError) as info:
        kp.Policy.from_env({variable: value})
    assert isinstance(info.value, ValueError)
    assert info.value.closest == closest
    if closest is not None:
        assert f"did you mean {closest!r}" in str(info.value)
    assert "cpu_w8a16_reference" in str(info.value)  # lists the known ids


def test_from_env_refuses_two_forced_kernels() -> None:
    with pytest.raises(kp.InvalidValueError, match="a single kernel id"):
        kp.Policy.from_env({ENV_FORCE: "cpu_dequant_reference,cpu_w8a16_reference"})


def test_from_env_checks_ids_against_the_given_catalog() -> None:
    engine = kp.Catalog((kp.KernelSpec("marlin", kp.Platform.CUDA, kp.KernelKind.W8A16),))
    assert kp.Policy.from_env({ENV_FORCE: "marlin"}, catalog=engine).force == "marlin"
    with pytest.raises(kp.UnknownNameError):
        kp.Policy.from_env({ENV_FORCE: "marlin"})


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [({"strict": "yes"}, "strict"), ({"force": 3}, "force"), ({"disabled": 5}, "disabled")],
)
def test_policy_fields_are_validated(kwargs: dict[str, object], what: str) -> None:
    with pytest.raises(kp.InvalidValueError, match=what):
        kp.Policy(**kwargs)  # type: ignore[arg-type]


def test_a_bare_string_disables_one_kernel_not_its_letters() -> None:
    assert kp.Policy(disabled="cpu_dequant_reference").disabled == {"cpu_dequant_reference"}


def _line(reason: kp.Reason) -> str:
    return f"{reason.kernel}: {reason.render()}"
