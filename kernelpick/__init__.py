"""kernelpick: choose, explain and run the GEMM kernel for a quantized (FP8) linear layer.

``import kernelpick as kp`` gives what the README uses: the pure decision (``kp.choose``),
the values it reads and returns, and two calls that touch a device, ``kp.probe`` and
``kp.bind``, which import torch only when called. The rule classes a kernel declares are in
``kp.rules``; every value type of the pure core is in ``kernelpick.core``.
"""

import typing as _typing
import warnings as _warnings

from kernelpick import rules
from kernelpick._version import __version__
from kernelpick.core import (
    Catalog,
    Compute,
    Decision,
    DeviceCaps,
    InvalidValueError,
    KernelInputError,
    KernelKind,
    KernelpickError,
    KernelSpec,
    Platform,
    Policy,
    QuantConfig,
    Reason,
    RejectCode,
    Rejected,
    Scheme,
    Selected,
    UnknownNameError,
    assert_never,
    cache_info,
    choose,
    clear_cache,
    default_catalog,
    device_profile,
    device_profiles,
    quant_config,
)

if _typing.TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

    from kernelpick.kernels import KernelBase, Launch


def probe(device: object = None) -> DeviceCaps:
    """The ``DeviceCaps`` of a live device, probed once per device and cached.

    ``device``: None or ``"auto"`` for the current one (the current GPU if torch sees one,
    else the CPU), ``"cpu"``, ``"cuda"``, ``"cuda:N"``, a GPU index or a ``torch.device``.
    """
    # Imported here, not at the top, so that `import kernelpick` stays free of torch.
    from kernelpick.adapters import probe_device

    return probe_device(device)


def bind(
    choice: Selected | Rejected | str,
    config: QuantConfig,
    caps: DeviceCaps,
    device: "torch.device | str | int | None" = None,
    *,
    catalog: Catalog | None = None,
    launches: "Mapping[str, Launch] | None" = None,
) -> "KernelBase":
    """The runnable kernel for ``choice`` (a ``Selected``, or a kernel id) on ``device``.

    The kernel's catalog rules are checked against ``config`` again (a choice made for one
    layer cannot run another it cannot implement). The kernel takes a high-precision weight
    (``quantize_weights``) or the canonical FP8 one (``prepare_weights``), and runs with
    ``apply``. ``prepare_weights`` trusts the weight's bytes to be canonical (no -0, which
    e4m3fnuz devices read as NaN, and no NaN byte) rather than scanning them on every
    call: make a weight of one's own canonical with ``kernelpick.kernels.canonicalize_fp8_``.
    See ``kernelpick.kernels.bind``.
    """
    from kernelpick.kernels import bind as bind_kernel

    return bind_kernel(choice, config, caps, device, catalog=catalog, launches=launches)


__all__ = [
    "Catalog",
    "Compute",
    "Decision",
    "DeviceCaps",
    "InvalidValueError",
    "KernelInputError",
    "KernelKind",
    "KernelSpec",
    "KernelpickError",
    "Platform",
    "Policy",
    "QuantConfig",
    "Reason",
    "RejectCode",
    "Rejected",
    "Scheme",
    "Selected",
    "UnknownNameError",
    "__version__",
    "assert_never",
    "bind",
    "cache_info",
    "choose",
    "clear_cache",
    "default_catalog",
    "device_profile",
    "device_profiles",
    "probe",
    "quant_config",
    "rules",
]

# Names the README once showed, kept working with a warning that says what replaced them.
_DEPRECATED = {
    "scheme": ("kp.quant_config", quant_config),
    "CACHE_SIZE": ("kp.cache_info().maxsize", cache_info().maxsize),
}
# Names 0.1 exported here that are gone from kp: an AttributeError says where they are now
# (the whole core was re-exported then; value types and rules now have their own homes).
_GONE = {
    "Unmet": "kp.Reason: a rule's check() returns kp.Reason(code, needed, found)",
    "catalog": "kp.default_catalog().ids_for(platform)",
}


def _moved(name: str) -> str:
    """Where ``name`` went, as the tail of the AttributeError's message."""
    if name in _GONE:
        return f"; use {_GONE[name]}"
    if name in rules.__all__:
        return f"; it is kp.rules.{name} now"
    from kernelpick import core

    return f"; it is kernelpick.core.{name} now" if name in core.__all__ else ""


def __getattr__(name: str) -> _typing.Any:
    if name in _DEPRECATED:
        replacement, value = _DEPRECATED[name]
        message = f"kp.{name} is deprecated; use {replacement}"
        _warnings.warn(message, DeprecationWarning, stacklevel=2)
        return value
    raise AttributeError(f"module 'kernelpick' has no attribute {name!r}{_moved(name)}", name=name)


def __dir__() -> list[str]:
    return sorted(__all__)
