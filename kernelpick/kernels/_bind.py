"""``bind``: from a choice (a ``Selected`` or a kernel id) to a kernel bound to one layer's
config and one device, through the launch table."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from kernelpick.core import (
    Catalog,
    DeviceCaps,
    InvalidValueError,
    Platform,
    QuantConfig,
    Rejected,
    Selected,
    UnknownNameError,
    default_catalog,
    reason_lines,
    rule_reasons,
)
from kernelpick.kernels._base import KernelBase
from kernelpick.kernels._launch import LAUNCHES, Launch

__all__ = ["bind"]


# torch names ROCm devices "cuda" as well.
_DEVICE_TYPE = {Platform.CPU: "cpu", Platform.CUDA: "cuda", Platform.ROCM: "cuda"}
_DEVICE_FORMS = "None, 'cpu', 'cuda', 'cuda:N', a GPU index N >= 0 or a torch.device"


def _parse_device(device: object) -> torch.device:
    # bool is an int subclass: True would be GPU 1.
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise InvalidValueError("device", device, _DEVICE_FORMS)
    if isinstance(device, int) and device < 0:
        raise InvalidValueError("device", device, _DEVICE_FORMS)
    try:
        parsed = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, ValueError, TypeError):  # torch's own parse error for 'gpu', 'cuda:x'
        raise InvalidValueError("device", device, _DEVICE_FORMS) from None
    # CPU tensors report device "cpu", never "cpu:0": an index would refuse every one of them.
    return torch.device("cpu") if parsed.type == "cpu" else parsed


def _device(kernel_id: str, platform: Platform, device: object) -> torch.device:
    wanted = _DEVICE_TYPE[platform]
    resolved = torch.device(wanted) if device is None else _parse_device(device)
    if resolved.type != wanted:
        expected = f"a {wanted} device, since {kernel_id} runs on {platform}"
        raise InvalidValueError("device", str(device), expected)
    if resolved.type == "cuda" and resolved.index is None:
        # The current GPU; torch would raise a bare AssertionError on a build without one.
        if not torch.cuda.is_available():
            expected = f"a GPU for {kernel_id}, but torch sees none on this machine"
            raise InvalidValueError("device", device, expected)
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def _kernel_id(choice: Selected | Rejected | str) -> str:
    match choice:
        case str():
            return choice
        case Selected():
            return choice.kernel
        case Rejected():
            expected = "a kp.Selected or a kernel id; this decision is a rejection:\n"
            raise InvalidValueError("choice", "Rejected", expected + choice.render())
        case _:
            raise InvalidValueError("choice", choice, "a kp.Selected or a kernel id")


def bind(
    choice: Selected | Rejected | str,
    config: QuantConfig,
    caps: DeviceCaps,
    device: torch.device | str | int | None = None,
    *,
    catalog: Catalog | None = None,
    launches: Mapping[str, Launch] | None = None,
) -> KernelBase:
    """The runnable kernel for ``choice`` (a ``Selected``, or a kernel id) on ``device``.

    ``caps`` supplies the device's facts (its FP8 format, whether cupy is usable);
    ``device`` is where the tensors live, by default the CPU or the current GPU. A kernel of
    your own is found in ``catalog`` (its spec) and ``launches`` (its row), both defaulting
    to kernelpick's.

    The kernel's catalog rules (its kind's and its own) are checked against ``config`` on
    ``caps`` again, since a ``Selected`` does not carry the config it was chosen for: a
    choice made for one layer cannot run another layer it cannot implement. A degraded but
    valid pair (a W8A16 kernel for a per-tensor activation config) is allowed; policy is
    not applied here. Raises ``UnknownNameError`` for an id with no spec or no launch row,
    and ``InvalidValueError`` for a rejection, an argument of the wrong type, a kernel of
    another platform than caps', a config the kernel's rules turn down (with every
    reason), or a launch row whose family is of another kind than the catalog row.

    The kernel's ``prepare_weights`` takes canonical FP8 bytes (no -0, no NaN byte: on
    gfx94x they are reread as e4m3fnuz, where -0 is NaN) and does not scan for them on
    each call; ``kernelpick.kernels.canonicalize_fp8_`` makes a weight of one's own canonical.
    """
    kernel_id = _kernel_id(choice)
    _check_arguments(config, caps, catalog, launches)
    rows = LAUNCHES if launches is None else launches
    spec = (default_catalog() if catalog is None else catalog).kernel(kernel_id)
    row = rows.get(kernel_id)
    if row is None:
        raise UnknownNameError("launchable kernel id", kernel_id, sorted(map(str, rows)))
    if not isinstance(row, Launch):
        raise InvalidValueError(f"launches[{kernel_id!r}]", row, "a kernelpick.kernels.Launch")
    if spec.platform is not caps.platform:
        raise InvalidValueError("caps", caps.name, f"a {spec.platform} device for {kernel_id}")
    failing = rule_reasons(spec, caps, config)
    if failing:
        lines = "".join(f"\n{line}" for line in reason_lines(failing))
        expected = f"a config {kernel_id} can implement on {caps.name}; its rules say:{lines}"
        raise InvalidValueError("config", config.render(), expected)
    return row.kernel(spec, config, caps, _device(kernel_id, spec.platform, device))


def _check_arguments(config: object, caps: object, catalog: object, launches: object) -> None:
    if not isinstance(config, QuantConfig):
        raise InvalidValueError("config", config, "a kp.QuantConfig")
    if not isinstance(caps, DeviceCaps):
        raise InvalidValueError("caps", caps, "a kp.DeviceCaps")
    if catalog is not None and not isinstance(catalog, Catalog):
        raise InvalidValueError("catalog", catalog, "a kp.Catalog or None")
    if launches is not None and not isinstance(launches, Mapping):
        raise InvalidValueError("launches", launches, "a mapping of kernel ids to Launch rows")
