"""What would work instead of a rejection, computed from the catalog: never a canned text.

Two kinds of hint: another named scheme that selects a kernel on the same device, and the
device a kernel would need when only device facts turned it down.
"""

from __future__ import annotations

from collections.abc import Callable

from kernelpick.core._decision import Decision, Selected, Verdict
from kernelpick.core._device import DeviceCaps
from kernelpick.core._quant import QuantConfig
from kernelpick.core._reasons import Reason, RejectCode
from kernelpick.core._schemes import Scheme, quant_config, scheme_of

__all__ = ["hints"]

# Reasons a different device (or its software stack) fixes; the text names what it needs.
_DEVICE_NEEDS: dict[RejectCode, Callable[[Reason], str]] = {
    RejectCode.COMPUTE_CAPABILITY: lambda r: f"compute capability {r.needed} or higher",
    RejectCode.GPU_ARCH: lambda r: f"GPU architecture {r.needed}",
    RejectCode.TOOLKIT_VERSION: lambda r: r.needed,
    RejectCode.TORCH_VERSION: lambda r: f"torch {r.needed} or newer",
    RejectCode.TORCH_FEATURE: lambda r: r.needed,
    RejectCode.LIBRARY_UNAVAILABLE: lambda r: r.needed,
    # No "and" inside a part: " and " joins the parts of one hint.
    RejectCode.TOOLCHAIN: lambda r: f"{r.needed} (a C++ compiler with ninja on PATH)",
    RejectCode.CPU_ISA: lambda r: f"CPU instructions {r.needed}",
}


def _other_schemes(
    caps: DeviceCaps, config: QuantConfig, decide: Callable[[QuantConfig], Decision | None]
) -> list[str]:
    own = scheme_of(config)
    found: list[tuple[Scheme, str]] = []
    degraded: list[tuple[Scheme, str]] = []
    for scheme in Scheme:
        if scheme is own:
            continue
        other = quant_config(
            scheme,
            weight_shape=config.weight_shape,
            out_dtype=config.out_dtype,
            input_dtype=config.input_dtype,
            bias=config.bias,
            min_tokens=config.min_tokens,
        )
        decision = decide(other)
        if isinstance(decision, Selected):
            (degraded if decision.degraded else found).append((scheme, decision.kernel))
    # A degraded stand-in is worth naming only when nothing exact exists.
    named = found or [(s, f"{kernel} (degraded)") for s, kernel in degraded]
    return [f"{scheme} selects {kernel}" for scheme, kernel in named]


def _device_fix(trace: tuple[Verdict, ...]) -> str | None:
    # The first kernel, in preference order, that only device facts turned down.
    for verdict in trace:
        if verdict.reasons and all(r.code in _DEVICE_NEEDS for r in verdict.reasons):
            needs = " and ".join(_DEVICE_NEEDS[r.code](r) for r in verdict.reasons)
            return f"move to a device with {needs}, where {verdict.kernel} runs"
    return None


def hints(
    caps: DeviceCaps,
    config: QuantConfig,
    trace: tuple[Verdict, ...],
    decide: Callable[[QuantConfig], Decision | None],
) -> tuple[str, ...]:
    """What would work on ``caps`` instead of ``config``, and on which device ``config``
    would work, as one sentence each; ``decide`` answers for another config (None: it could
    not, and that scheme is left out)."""
    schemes = _other_schemes(caps, config, decide)
    device = _device_fix(trace)
    found = []
    if schemes:
        found.append(f"on {caps.name}, " + "; ".join(schemes))
    if device is not None:
        found.append(("or " if schemes else "") + device)
    return tuple(found)
