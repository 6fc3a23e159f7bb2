"""The launch table: how each catalog id runs, and ``bind``, from a choice to a kernel.

A kernel is declared in three places, each once: its requirements in the core catalog
(``kp.default_catalog()``), its family (the math, in ``kernelpick.kernels``) and its row
here, which names the family and the traits the catalog does not state. Alignment is not
repeated here: the kernel reads it from the catalog row's ``Alignment`` rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

import attrs
import torch

from kernelpick.core import (
    Catalog,
    CpuArch,
    DeviceCaps,
    InvalidValueError,
    KernelKind,
    KernelSpec,
    Platform,
    QuantConfig,
    Rejected,
    Selected,
    UnknownNameError,
    default_catalog,
)
from kernelpick.core._decision import reason_lines
from kernelpick.core._dtypes import HIGH_PRECISION, Dtype
from kernelpick.core._errors import is_bool
from kernelpick.core._select import rule_reasons
from kernelpick.kernels import (
    BlockScaledMM,
    ChannelwiseUnfused,
    CpuFp8Gemm,
    CpuFp8GemmW8A16,
    CupyGemvW8A16,
    DequantMatmul,
    Int8IntMM,
    Int8IntMMPadded,
    KernelBase,
    MxScaledMM,
    ReferenceW8A8,
    ReferenceW8A16,
    RowwiseScaledMM,
    TensorwiseScaledMM,
)

__all__ = ["LAUNCHES", "Launch", "bind"]


def _family(_inst: object, attribute: attrs.Attribute[type[KernelBase]], value: object) -> None:
    if not (isinstance(value, type) and issubclass(value, KernelBase)):
        raise InvalidValueError("Launch family", value, "a subclass of KernelBase (a class)")
    if not isinstance(getattr(value, "KIND", None), KernelKind):
        expected = "a family declaring KIND: ClassVar[KernelKind] (W8A8 or W8A16)"
        raise InvalidValueError("Launch family", value.__name__, expected)


def _dtypes(value: Iterable[Dtype | str]) -> frozenset[Dtype]:
    # A bare name is refused, as the rule classes refuse it: "bfloat16" is not a set.
    expected = "a set of output dtypes (bfloat16, float16, float32)"
    if isinstance(value, (Dtype, str)) or not isinstance(value, Iterable):
        raise InvalidValueError("Launch fused_bias", value, expected)
    dtypes = frozenset(Dtype.parse(item) for item in value)
    if not dtypes <= HIGH_PRECISION:
        raise InvalidValueError("Launch fused_bias", sorted(d.value for d in dtypes), expected)
    return dtypes


@attrs.frozen
class Launch:
    """How one catalog id runs: its kernel family plus the traits its GEMM library has.

    ``family``: a ``KernelBase`` subclass whose ``KIND`` is the catalog row's kind.
    ``fused_bias``: the output dtypes for which the op takes the bias itself (others get it
    added after the op); names such as ``"bfloat16"`` are parsed. ``fused_quant``: quantize
    per-token activations with the cupy kernel, used only where the device's cupy is usable.
    """

    family: type[KernelBase] = attrs.field(validator=_family)
    fused_bias: frozenset[Dtype] = attrs.field(
        default=HIGH_PRECISION, converter=_dtypes, kw_only=True
    )
    fused_quant: bool = attrs.field(default=False, validator=is_bool, kw_only=True)

    def kernel(
        self, spec: KernelSpec, config: QuantConfig, caps: DeviceCaps, device: torch.device
    ) -> KernelBase:
        """The family bound to one catalog row, one layer and one device. The family checks
        its kind against the row's; ``bind`` checks the platform, the device and the row's
        rules against the config first."""
        fused_quant = self.fused_quant and "cupy" in caps.libraries
        isa = caps.arch.isa if isinstance(caps.arch, CpuArch) else frozenset()
        return self.family(
            spec, config, device, caps.fp8_format, self.fused_bias, fused_quant, isa=isa
        )


# cuBLASLt refuses a bias with an fp32 output ("Bias is not supported when out_dtype is set
# to Float32", torch's _scaled_mm); hipBLASLt likewise takes it in-op for 16-bit outputs only.
BIAS_IN_16_BIT = frozenset({Dtype.BFLOAT16, Dtype.FLOAT16})

# Every id of kp.default_catalog(), by platform in catalog order. CPU _scaled_mm takes a
# bias in every output dtype. The CUDA W8A8 kernels quantize per-token activations with
# the fused cupy kernel when cupy is usable (one pass per row instead of several torch ops).
LAUNCHES: Mapping[str, Launch] = MappingProxyType(
    {
        "cuda_rowwise_scaled_mm": Launch(
            RowwiseScaledMM, fused_bias=BIAS_IN_16_BIT, fused_quant=True
        ),
        # No bias in-op with 128-block scales: torch's block-scaled tests never pass one and
        # cuBLASLt's bias epilogue with VEC128/BLK128x128 scales is unverified; added in fp32.
        "cuda_block_scaled_mm": Launch(BlockScaledMM, fused_bias=()),
        # A bf16 bias in-op with MX scales (pytorch#152665, test_mx_fp8_bias).
        "cuda_mxfp8_scaled_mm": Launch(MxScaledMM, fused_bias=BIAS_IN_16_BIT),
        "cuda_tensorwise_scaled_mm": Launch(TensorwiseScaledMM, fused_bias=BIAS_IN_16_BIT),
        "cuda_channelwise_unfused": Launch(
            ChannelwiseUnfused, fused_bias=BIAS_IN_16_BIT, fused_quant=True
        ),
        "cuda_int8_int_mm": Launch(Int8IntMM),
        "cuda_int8_int_mm_padded": Launch(Int8IntMMPadded),
        "cuda_w8a16_cupy": Launch(CupyGemvW8A16),
        "cuda_w8a16_torch": Launch(DequantMatmul),
        "rocm_rowwise_scaled_mm": Launch(RowwiseScaledMM, fused_bias=BIAS_IN_16_BIT),
        "rocm_tensorwise_scaled_mm": Launch(TensorwiseScaledMM, fused_bias=BIAS_IN_16_BIT),
        "rocm_channelwise_unfused": Launch(ChannelwiseUnfused, fused_bias=BIAS_IN_16_BIT),
        "rocm_w8a16_torch": Launch(DequantMatmul),
        "cpu_fp8_gemm": Launch(CpuFp8Gemm),
        "cpu_fp8_w8a16_gemm": Launch(CpuFp8GemmW8A16),
        "cpu_int8_int_mm": Launch(Int8IntMM),
        "cpu_rowwise_scaled_mm": Launch(RowwiseScaledMM),
        "cpu_tensorwise_scaled_mm": Launch(TensorwiseScaledMM),
        "cpu_dequant_reference": Launch(ReferenceW8A8),
        "cpu_w8a16_reference": Launch(ReferenceW8A16),
    }
)

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
        raise InvalidValueError(f"launches[{kernel_id!r}]", row, "a kernelpick.adapters.Launch")
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
