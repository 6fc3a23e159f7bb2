"""Why a kernel was turned down, as data: a code plus what was needed and what was found.

Text is made only when a reason is shown, from the template table below, so tests and
tools compare codes while people read sentences.
"""

from __future__ import annotations

import enum

import attrs

from kernelpick.core._errors import InvalidValueError

__all__ = ["Reason", "RejectCode"]


class RejectCode(enum.Enum):
    """Every way a kernel can be turned down. Tests and tools match on these."""

    WRONG_PLATFORM = "wrong_platform"
    COMPUTE_CAPABILITY = "compute_capability"
    GPU_ARCH = "gpu_arch"
    TOOLKIT_VERSION = "toolkit_version"
    TORCH_VERSION = "torch_version"
    TORCH_FEATURE = "torch_feature"
    LIBRARY_UNAVAILABLE = "library_unavailable"
    TOOLCHAIN = "toolchain"
    CPU_ISA = "cpu_isa"
    FP8_DTYPE = "fp8_dtype"
    QUANT_DTYPE = "quant_dtype"
    SCALE_DTYPE = "scale_dtype"
    WEIGHT_ONLY_ACTIVATION = "weight_only_activation"
    ACTIVATION_REQUIRED = "activation_required"
    ACTIVATION_SCALES = "activation_scales"
    WEIGHT_SCALES = "weight_scales"
    SCALE_COMBINATION = "scale_combination"
    GROUP_SIZE = "group_size"
    ZERO_POINTS = "zero_points"
    ACT_ORDER = "act_order"
    GROUP_STRADDLE = "group_straddle"
    SHAPE_ALIGNMENT = "shape_alignment"
    TOKEN_COUNT = "token_count"
    INPUT_DTYPE = "input_dtype"
    OUT_DTYPE = "out_dtype"
    DISABLED = "disabled"
    NOT_FORCED = "not_forced"
    STRICT_DEGRADED = "strict_degraded"
    UNSUPPORTED = "unsupported"

    def __str__(self) -> str:
        return self.value


# One sentence per code; {needed} and {found} come from the reason.
TEMPLATES: dict[RejectCode, str] = {
    RejectCode.WRONG_PLATFORM: "runs on {needed}; device platform is {found}",
    RejectCode.COMPUTE_CAPABILITY: (
        "requires compute capability {needed} or higher; device has {found}"
    ),
    RejectCode.GPU_ARCH: "requires GPU architecture {needed}; device is {found}",
    RejectCode.TOOLKIT_VERSION: "requires {needed}; device has {found}",
    RejectCode.TORCH_VERSION: "requires torch {needed} or newer; device has torch {found}",
    RejectCode.TORCH_FEATURE: "requires {needed}; {found}",
    RejectCode.LIBRARY_UNAVAILABLE: "requires {needed}; {found}",
    RejectCode.TOOLCHAIN: "needs {needed}; {found}",
    RejectCode.CPU_ISA: "requires CPU instructions {needed}; {found}",
    RejectCode.FP8_DTYPE: "supports FP8 {needed}; config has {found}",
    RejectCode.QUANT_DTYPE: "supports quantized {needed}; config has {found}",
    RejectCode.SCALE_DTYPE: "reads {needed} scales; config has {found} scales",
    RejectCode.WEIGHT_ONLY_ACTIVATION: (
        "weight-only (W8A16) kernel cannot honour {found} activation quantization"
    ),
    RejectCode.ACTIVATION_REQUIRED: (
        "quantizes activations (W8A8); config is weight-only (no activation quantization)"
    ),
    RejectCode.ACTIVATION_SCALES: "supports {needed} activation scales; config has {found}",
    RejectCode.WEIGHT_SCALES: "supports {needed} weight scales; config has {found}",
    RejectCode.SCALE_COMBINATION: "requires {needed}; config has {found}",
    RejectCode.GROUP_SIZE: "supports weight groups {needed}; config has {found}",
    RejectCode.ZERO_POINTS: "reads {needed}; config has {found}",
    RejectCode.ACT_ORDER: "reads {needed}; config has {found}",
    RejectCode.GROUP_STRADDLE: (
        "requires {needed}; layer has {found}, so a group straddles two ranks"
    ),
    RejectCode.SHAPE_ALIGNMENT: "requires {needed}; layer has {found}",
    RejectCode.TOKEN_COUNT: "requires {needed}; layer is called with {found}",
    RejectCode.INPUT_DTYPE: "supports input dtype {needed}; config has {found}",
    RejectCode.OUT_DTYPE: "supports output dtype {needed}; config asks for {found}",
    RejectCode.DISABLED: "disabled by policy (Policy.disabled, KERNELPICK_DISABLED_KERNELS)",
    RejectCode.NOT_FORCED: "not forced: policy forces {needed}",
    RejectCode.STRICT_DEGRADED: "strict policy rejects a degraded choice: {found}",
    RejectCode.UNSUPPORTED: "requires {needed}; found {found}",
}


@attrs.frozen
class Reason:
    """One reason a kernel was turned down: a code, what was needed and what was found.

    ``Reason(code, needed, found, kernel="")``: a rule returns one without ``kernel``, and
    the selector fills in the kernel it judged. ``needed`` and ``found`` are short phrases
    (strings), set into the code's sentence. Test on ``code``; show ``render()``, the
    sentence (``decision.render()`` adds the kernel), or ``to_dict()``.
    """

    code: RejectCode
    needed: str
    found: str
    kernel: str = ""

    def __attrs_post_init__(self) -> None:
        # One check of all four fields, exact types first: a reason is built twice per
        # failing rule of every uncached decision, and four attrs validators cost twice
        # as much (the budget is 3000 dict lookups a decision). Subclasses of str pass.
        if (
            type(self.code) is not RejectCode
            or type(self.needed) is not str
            or type(self.found) is not str
            or type(self.kernel) is not str
        ):
            self._refuse()

    def _refuse(self) -> None:
        # RejectCode is an enum with members: it has no subclasses to allow for.
        if type(self.code) is not RejectCode:
            expected = "a kp.RejectCode, e.g. RejectCode.UNSUPPORTED"
            raise InvalidValueError("reason code", self.code, expected)
        for name in ("needed", "found", "kernel"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise InvalidValueError(f"reason {name}", value, "a string (a short phrase)")

    def render(self) -> str:
        """The sentence, from the template of the code."""
        return TEMPLATES[self.code].format(needed=self.needed, found=self.found)

    def to_dict(self) -> dict[str, str]:
        """A JSON-able record; ``message`` is ``render()``."""
        return {
            "code": self.code.value,
            "needed": self.needed,
            "found": self.found,
            "message": self.render(),
        }
