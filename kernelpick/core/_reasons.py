"""Why a kernel was turned down, as data: a code plus what was needed and what was found.

Text is made only when a reason is shown, from the template table below, so tests and
tools compare codes while people read sentences.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["Reason", "RejectCode", "Unmet"]


class RejectCode(enum.Enum):
    """Every way a kernel can be turned down. Tests and tools match on these."""

    # Members are singletons: identity hashing is correct and, unlike Enum.__hash__,
    # runs in C. Rules test set membership of these on every decision.
    __hash__ = object.__hash__

    WRONG_PLATFORM = "wrong_platform"
    COMPUTE_CAPABILITY = "compute_capability"
    GPU_ARCH = "gpu_arch"
    TOOLKIT_VERSION = "toolkit_version"
    TORCH_VERSION = "torch_version"
    TORCH_FEATURE = "torch_feature"
    LIBRARY_UNAVAILABLE = "library_unavailable"
    FP8_DTYPE = "fp8_dtype"
    WEIGHT_ONLY_ACTIVATION = "weight_only_activation"
    ACTIVATION_REQUIRED = "activation_required"
    ACTIVATION_SCALES = "activation_scales"
    WEIGHT_SCALES = "weight_scales"
    SCALE_COMBINATION = "scale_combination"
    SHAPE_ALIGNMENT = "shape_alignment"
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
    RejectCode.FP8_DTYPE: "supports FP8 {needed}; config has {found}",
    RejectCode.WEIGHT_ONLY_ACTIVATION: (
        "weight-only (W8A16) kernel cannot honour {found} activation quantization"
    ),
    RejectCode.ACTIVATION_REQUIRED: (
        "quantizes activations (W8A8); config is weight-only (no activation quantization)"
    ),
    RejectCode.ACTIVATION_SCALES: "supports {needed} activation scales; config has {found}",
    RejectCode.WEIGHT_SCALES: "supports {needed} weight scales; config has {found}",
    RejectCode.SCALE_COMBINATION: "requires {needed}; config has {found}",
    RejectCode.SHAPE_ALIGNMENT: "requires {needed}; layer has {found}",
    RejectCode.INPUT_DTYPE: "supports input dtype {needed}; config has {found}",
    RejectCode.OUT_DTYPE: "supports output dtype {needed}; config asks for {found}",
    RejectCode.DISABLED: "disabled by policy (Policy.disabled, KERNELPICK_DISABLED_KERNELS)",
    RejectCode.NOT_FORCED: "not forced: policy forces {needed}",
    RejectCode.STRICT_DEGRADED: "strict policy rejects a degraded choice: {found}",
    RejectCode.UNSUPPORTED: "requires {needed}; found {found}",
}


def _message(code: RejectCode, needed: str, found: str) -> str:
    return TEMPLATES[code].format(needed=needed, found=found)


# Unmet and Reason are NamedTuples rather than attrs classes: an uncached decision makes a
# dozen of them, and a tuple is built in half the time (the choose_uncached_ns budget).


class Unmet(NamedTuple):
    """What a requirement returns when it does not hold: the kernel id is added later."""

    code: RejectCode
    needed: str
    found: str

    @property
    def message(self) -> str:
        return _message(self.code, self.needed, self.found)


class Reason(NamedTuple):
    """One reason a kernel was turned down: ``str(reason)`` is ``"<kernel>: <message>"``."""

    kernel: str
    code: RejectCode
    needed: str
    found: str

    @classmethod
    def of(cls, kernel: str, unmet: Unmet) -> Reason:
        """The reason a requirement's ``Unmet`` gives for ``kernel``."""
        return cls(kernel, unmet.code, unmet.needed, unmet.found)

    @property
    def message(self) -> str:
        return _message(self.code, self.needed, self.found)

    def __str__(self) -> str:
        return f"{self.kernel}: {self.message}"
