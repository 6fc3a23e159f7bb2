"""The launch table: how each catalog id runs (one ``Launch`` row per id, naming its family).

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
    HIGH_PRECISION,
    Catalog,
    CpuArch,
    DeviceCaps,
    Dtype,
    InvalidValueError,
    KernelKind,
    KernelSpec,
    QuantConfig,
    default_catalog,
    is_bool,
)
from kernelpick.kernels._base import KernelBase
from kernelpick.kernels._block_scaled_mm import BlockScaledMM, MxScaledMM
from kernelpick.kernels._cpu_gemm import CpuFp8Gemm, CpuFp8GemmW8A16, CpuInt8Gemm
from kernelpick.kernels._cpu_int4 import CpuInt4Gemm
from kernelpick.kernels._int8 import Int8IntMM, Int8IntMMPadded
from kernelpick.kernels._reference import ReferenceW8A8, ReferenceW8A16
from kernelpick.kernels._scaled_mm import ChannelwiseUnfused, RowwiseScaledMM, TensorwiseScaledMM
from kernelpick.kernels._w8a16 import CupyGemvW8A16, DequantMatmul
from kernelpick.kernels._wna16 import IntDequantMatmul
from kernelpick.kernels._wna16_ops import Int4PackMM, Int8PackMM

__all__ = ["BIAS_IN_16_BIT", "LAUNCHES", "Launch", "check_rows", "launch_table"]


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
    per-token and 1x128 group activations with the cupy kernels, used only where the
    device's cupy is usable.
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
# bias in every output dtype. The CUDA W8A8 kernels quantize per-token (and 1x128 group)
# activations with the fused cupy kernels when cupy is usable (one pass instead of several
# torch ops).
LAUNCHES: Mapping[str, Launch] = MappingProxyType(
    {
        "cuda_rowwise_scaled_mm": Launch(
            RowwiseScaledMM, fused_bias=BIAS_IN_16_BIT, fused_quant=True
        ),
        # No bias in-op with 128-block scales: torch's block-scaled tests never pass one and
        # cuBLASLt's bias epilogue with VEC128/BLK128x128 scales is unverified; added in fp32.
        # Its 1x128 activation groups are quantized by the fused cupy group kernel.
        "cuda_block_scaled_mm": Launch(BlockScaledMM, fused_bias=(), fused_quant=True),
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
        "cuda_int4pack_mm": Launch(Int4PackMM),
        "cuda_wna16_torch": Launch(IntDequantMatmul),
        "rocm_rowwise_scaled_mm": Launch(RowwiseScaledMM, fused_bias=BIAS_IN_16_BIT),
        "rocm_tensorwise_scaled_mm": Launch(TensorwiseScaledMM, fused_bias=BIAS_IN_16_BIT),
        "rocm_channelwise_unfused": Launch(ChannelwiseUnfused, fused_bias=BIAS_IN_16_BIT),
        "rocm_w8a16_torch": Launch(DequantMatmul),
        "rocm_int4pack_mm": Launch(Int4PackMM),
        "rocm_wna16_torch": Launch(IntDequantMatmul),
        "cpu_fp8_gemm": Launch(CpuFp8Gemm),
        "cpu_fp8_w8a16_gemm": Launch(CpuFp8GemmW8A16),
        "cpu_int8_gemm": Launch(CpuInt8Gemm),
        "cpu_int8_int_mm": Launch(Int8IntMM),
        "cpu_rowwise_scaled_mm": Launch(RowwiseScaledMM),
        "cpu_tensorwise_scaled_mm": Launch(TensorwiseScaledMM),
        "cpu_int4_gemm": Launch(CpuInt4Gemm),
        "cpu_int4pack_mm": Launch(Int4PackMM),
        "cpu_int8pack_mm": Launch(Int8PackMM),
        "cpu_dequant_reference": Launch(ReferenceW8A8),
        "cpu_w8a16_reference": Launch(ReferenceW8A16),
        "cpu_wna16_reference": Launch(IntDequantMatmul),
    }
)


def launch_table(launches: object) -> dict[str, Launch] | None:
    """``launches`` as a plain dict (None stays None), or ``InvalidValueError`` naming the
    first entry that is not a kernel id with its ``Launch`` row."""
    if launches is None:
        return None
    if not isinstance(launches, Mapping):
        expected = "None or a mapping of kernel id to kernelpick.kernels.Launch (LAUNCHES)"
        raise InvalidValueError("launches", type(launches).__name__, expected)
    for key, row in launches.items():  # the first bad entry, named: a table has dozens
        if not isinstance(key, str):
            raise InvalidValueError("launches key", key, "a kernel id (a str) of the catalog")
        if not isinstance(row, Launch):
            family = row.__name__ if isinstance(row, type) else "YourKernelFamily"
            found = f"class {row.__name__}" if isinstance(row, type) else type(row).__name__
            raise InvalidValueError(
                f"launches[{key!r}]", found, f"a kernelpick.kernels.Launch, e.g. Launch({family})"
            )
    # Copied into a plain dict: a later change to the caller's table cannot reach layers
    # already made, and a model holding it can still be deep-copied (a mappingproxy cannot).
    return dict(launches)


def check_rows(catalog: Catalog | None, launches: Mapping[str, Launch] | None) -> None:
    """Every kernel ``catalog`` may select has a row in ``launches``, or ``InvalidValueError``
    naming the first that has none and how to add it. Checked for the whole catalog
    once, not per selection: a cast or a move selects again in the middle of torch's walk
    over the model, after the modules before the layer changed, so the tables must be
    known to fit before the first layer is made."""
    rows = LAUNCHES if launches is None else launches
    for spec in (default_catalog() if catalog is None else catalog).kernels:
        if spec.id not in rows:
            # Not a misspelling: the catalog names a kernel the table cannot run.
            expected = (
                f"a launch row for every catalog id: add {{**LAUNCHES, {spec.id!r}: "
                "Launch(<family>)} to launches, or leave the id out of the catalog"
            )
            raise InvalidValueError("launches", f"no row for {spec.id!r}", expected)
