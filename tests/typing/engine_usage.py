"""How an engine uses kernelpick, checked by ``mypy --strict`` (and run by a test).

If the public API's types drift, mypy fails here before an engine notices.
"""

from __future__ import annotations

import os

import attrs

import kernelpick as kp


@attrs.frozen
class NeedsMyLibrary:
    """An engine's own requirement satisfies the Requirement protocol structurally."""

    def check(self, caps: kp.DeviceCaps, config: kp.QuantConfig) -> kp.Reason | None:
        if "mylib" in caps.libraries:
            return None
        return kp.Reason(kp.RejectCode.LIBRARY_UNAVAILABLE, "mylib", "mylib is not usable")

    def render(self) -> str:
        return "mylib usable"


def engine_catalog() -> kp.Catalog:
    requirement: kp.rules.Requirement = NeedsMyLibrary()
    mine = kp.KernelSpec("my_w8a16", kp.Platform.CUDA, kp.KernelKind.W8A16, (requirement,))
    return kp.Catalog((*kp.default_catalog().kernels, mine))


def kernel_for(device: str, n: int, k: int) -> str:
    """Select a kernel for one layer, or raise with every reason, as a linear method would."""
    caps: kp.DeviceCaps = kp.device_profile(device)
    config: kp.QuantConfig = kp.quant_config("fp8_per_channel", weight_shape=(n, k))
    policy = kp.Policy.from_env(os.environ, catalog=engine_catalog())
    decision = kp.choose(caps, config, policy, catalog=engine_catalog())
    match decision:
        case kp.Selected(kernel=kernel, degraded=degraded):
            return f"{kernel} (degraded)" if degraded else kernel
        case kp.Rejected():
            codes: list[kp.RejectCode] = [reason.code for reason in decision.reasons]
            raise RuntimeError(f"{len(codes)} reasons\n{decision.render()}")
        case _:
            kp.assert_never(decision)


def fp8_range(caps: kp.DeviceCaps) -> float:
    return caps.fp8_format.quant_max


def trace_lines(decision: kp.Decision) -> list[str]:
    lines: list[str] = []
    for verdict in decision.trace:
        status = "ok" if verdict.ok else ", ".join(r.code.value for r in verdict.reasons)
        lines.append(f"{verdict.kernel} [{verdict.kind}]: {status}")
    return lines
