"""The compiled CPU FP8 kernels: W8A8 (per-token, 1 x 128 group or per-tensor activations,
the last dynamic or static) and W8A16, one custom op each ISA.

The math is in ``_cpu_fp8_gemm.cpp``: the FP8 weight is decoded exactly in registers
(never as a whole-weight copy) with a GEMV path for small M and, for large M, outer
products over panels decoded once per call (with bf16 units) or decoded fp32 panels handed
to torch's GEMM; activation quantization (dynamic per token, per 1 x 128 group or
per tensor, or with a stored per-tensor scale) is fused into the same call. Weights are
scaled per tensor, per channel or per 128 x 128 block (block FP8: DeepSeek-V3, Qwen3 FP8).
The op is a ``torch.library`` custom op with a fake (meta) implementation, so
``torch.compile(fullgraph=True)`` traces it as one node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Protocol, TypeVar, cast

import attrs
import torch

from kernelpick.core import (
    CPU_FP8_ACTIVATIONS,
    CPU_FP8_BLOCK,
    CPU_FP8_STATIC,
    CPU_FP8_WEIGHTS,
    CPU_INT8_ACTIVATIONS,
    CPU_INT8_WEIGHTS,
    INT8_DOT_ISA,
    Dtype,
    GroupShape,
    InvalidValueError,
    KernelKind,
    QuantConfig,
)
from kernelpick.kernels._base import RowMajorKernel, WeightBundle
from kernelpick.kernels._cpu_build import (
    ISA_LEVELS,
    LOCK,
    VNNI_LEVELS,
    KernelBuildError,
    compile_failed,
    levels_within,
    load_ops,
    op_name,
)
from kernelpick.kernels._cpu_cache import LOGGER
from kernelpick.kernels._int8 import int_mm_weight
from kernelpick.kernels._scaled_mm import apply_scales

__all__ = [
    "AMX_INT_MM_FROM_TOKENS",
    "BLOCK",
    "INT_MM_FROM_TOKENS",
    "VNNI_INT_MM_FROM_TOKENS",
    "CpuFp8Gemm",
    "CpuFp8GemmW8A16",
    "CpuInt8Gemm",
    "int_mm_from_tokens",
    "registered_op",
]

# The one block size the op serves (block FP8 as released: DeepSeek-V3, Qwen3 FP8), and the
# scale groups it reads: the catalog rows' rules, read from the same values, so the family
# refuses exactly what cpu_fp8_gemm's row turns down.
BLOCK = CPU_FP8_BLOCK
_WEIGHT_GROUPS = CPU_FP8_WEIGHTS.groups
_ACTIVATION_GROUPS = CPU_FP8_ACTIVATIONS.groups


class _Op(Protocol):
    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None,
        quantize_input: bool,
        out_dtype: torch.dtype,
        act_group: int,
        weight_block: int,
        input_scale: torch.Tensor | None,
    ) -> torch.Tensor: ...


def _fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    quantize_input: bool,
    out_dtype: torch.dtype,
    act_group: int,
    weight_block: int,
    input_scale: torch.Tensor | None,
) -> torch.Tensor:
    # What the op returns, for tracing: [M, N] in out_dtype, on x's device.
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=out_dtype)


def _no_context(ctx: object, inputs: tuple[object, ...], output: torch.Tensor) -> None:
    return None


# Each op, registered once: held under LOCK, so threads binding at once neither build twice
# nor register the fake and the autograd refusal twice.
_REGISTERED: dict[str, object] = {}


def registered_op(level: str, name: str, fake: Callable[..., torch.Tensor], what: str) -> object:
    """``torch.ops.kernelpick.<name>`` of ``level``'s build, built or loaded on first use,
    with its ``fake`` (for tracing) and a refusal of a backward pass through ``what``
    registered once."""

    def no_backward(ctx: object, grad: torch.Tensor) -> None:
        # Without this, autograd would pass through the op with no gradient, silently.
        expected = (
            "no backward pass: kernelpick's CPU kernels are for inference; run the layer "
            "under torch.no_grad() or torch.inference_mode(), or train the high-precision model"
        )
        raise InvalidValueError("backward through", what, expected)

    with LOCK:
        op = _REGISTERED.get(name)
        if op is None:
            load_ops(level)
            qualified = f"kernelpick::{name}"
            torch.library.register_fake(qualified)(fake)
            torch.library.register_autograd(qualified, no_backward, setup_context=_no_context)
            op = _REGISTERED[name] = getattr(torch.ops.kernelpick, name)
        return op


def _custom_op(level: str) -> _Op:
    """The FP8/int8 GEMM of ``level`` (see ``registered_op``)."""
    return cast(_Op, registered_op(level, op_name(level), _fake, "the CPU FP8 GEMM"))


# The levels whose failed compile was logged: once per process, not once per layer bound.
_WARNED: set[str] = set()


Op = TypeVar("Op")


def best_op(kernel_id: str, levels: list[str], op_of: Callable[[str], Op]) -> tuple[str, Op]:
    """The best of ``levels`` that builds, and its op (``op_of(level)``). A level whose
    compile fails gives way to the next, with a warning: a compiler too old for one level's
    flags must not cost a CPU the levels below it (logged once per level). Any other
    failure, or every level's, raises the best one's."""
    failure: KernelBuildError | None = None
    for level in levels:
        try:
            return level, op_of(level)
        except KernelBuildError as error:
            if not compile_failed(level):
                raise
            failure = failure or error
            if level in _WARNED:
                continue
            _WARNED.add(level)
            LOGGER.warning(
                "%s: the %s CPU kernel did not compile, trying the next ISA level down: %s",
                kernel_id, level, error.detail.strip()[-500:],
            )  # fmt: skip
    assert failure is not None, "levels is never empty here"
    raise failure


# The op's act_group for one scale over the whole activation (dynamic, or the stored one).
PER_TENSOR_GROUP = -1


def _scale_groups(kernel_id: str, config: QuantConfig, quantize: bool) -> tuple[int, int]:
    """The op's ``act_group`` (0: per token, -1: per tensor, else the group's K extent) and
    ``weight_block`` (0: per tensor or per channel) for ``config``, or
    ``InvalidValueError`` for a scale layout the op would misread."""
    weight = config.weight.scale
    if weight.group not in _WEIGHT_GROUPS or weight.dtype not in CPU_FP8_WEIGHTS.dtypes:
        # The op reads fp32 scales, one per tensor, row or 128 x 128 block.
        expected = f"fp32 per-tensor, per-channel or {GroupShape.block(BLOCK).render()} scales"
        raise InvalidValueError(f"{kernel_id} weight scales", weight.render(), expected)
    weight_block = BLOCK if weight.group == GroupShape.block(BLOCK) else 0
    act = config.activation
    if not quantize:
        return 0, weight_block
    if (
        act is None
        or act.dtype is not Dtype.FLOAT8_E4M3FN
        or act.scale.group not in _ACTIVATION_GROUPS
        or act.scale.dtype not in CPU_FP8_ACTIVATIONS.dtypes
        or (act.scale.static and act.scale.group not in CPU_FP8_STATIC.static_groups)
    ):
        # The op quantizes per token, per 1 x 128 group or per tensor itself: any other
        # activation config would run as if it were one of those, silently.
        found = "none" if act is None else act.render()
        expected = (
            "e4m3fn activations quantized dynamically per-token, per-group (1, 128) or "
            "per-tensor, or with a static per-tensor scale, with fp32 scales"
        )
        raise InvalidValueError(f"{kernel_id} activation config", found, expected)
    act_group = {GroupShape.PER_TOKEN: 0, GroupShape.PER_TENSOR: PER_TENSOR_GROUP}
    return act_group.get(act.scale.group, BLOCK), weight_block


@attrs.frozen
class CpuFp8Gemm(RowMajorKernel):
    """W8A8 on the CPU: FP8 activations per token, per 1 x 128 group or per tensor (dynamic,
    or a stored per-tensor scale), FP8 weights
    per channel, per tensor or per 128 x 128 block, any N and K; products in fp32 (or exact
    in bf16 with AVX512-BF16), block scales applied group by group along K.

    Built for the best ISA level the device's probed flags allow, when the kernel is bound.
    """

    KIND: ClassVar[KernelKind] = KernelKind.W8A8
    _QUANTIZE: ClassVar[bool] = True
    _WEIGHT: ClassVar[Dtype] = Dtype.FLOAT8_E4M3FN

    level: str = attrs.field(init=False)
    # The op's act_group and weight_block arguments for this config (see _scale_groups).
    _groups: tuple[int, int] = attrs.field(init=False, eq=False, repr=False)
    # The op itself, looked up once: torch.compile then traces a call to it, not the lookup.
    _op: _Op = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        levels = levels_within(self.isa)
        if not levels:
            needs = " or ".join("+".join(sorted(flags)) for flags, _cflags in ISA_LEVELS.values())
            raise InvalidValueError(f"{self.kernel_id} CPU ISA", sorted(self.isa), needs)
        if self.fp8_format is not Dtype.FLOAT8_E4M3FN and self._WEIGHT is not Dtype.INT8:
            # The op decodes e4m3fn bytes (a CPU computes in OCP e4m3fn).
            raise InvalidValueError(
                f"{self.kernel_id} FP8 format", self.fp8_format.value, "float8_e4m3fn"
            )
        if self.config.weight.dtype is not self._WEIGHT:
            # The op reads the bytes by the weight tensor's dtype: int8 read as e4m3fn (or
            # e5m2 as either) would be other values.
            raise InvalidValueError(
                f"{self.kernel_id} weight dtype", self.config.weight.dtype.value, self._WEIGHT.value
            )
        groups = self._groups_for(self.config)
        # Built or loaded now, at set-up, not inside the first forward.
        level, op = best_op(self.kernel_id, levels, _custom_op)
        object.__setattr__(self, "level", level)
        object.__setattr__(self, "_groups", groups)
        object.__setattr__(self, "_op", op)

    def _groups_for(self, config: QuantConfig) -> tuple[int, int]:
        return _scale_groups(self.kernel_id, config, self._QUANTIZE)

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        act_group, weight_block = self._groups
        # A static config's bundle holds its stored scale (prepare_weights checked it).
        static = bundle.input_scale if self._QUANTIZE else None
        return self._op(
            x, bundle.weight, bundle.scale, bias, self._QUANTIZE, self.out_dtype,
            act_group, weight_block, static,
        )  # fmt: skip


@attrs.frozen
class CpuFp8GemmW8A16(CpuFp8Gemm):
    """W8A16 on the CPU: the activations as they come, FP8 weights decoded in registers
    (per-tensor, per-channel or 128 x 128 block scales)."""

    KIND: ClassVar[KernelKind] = KernelKind.W8A16
    _QUANTIZE: ClassVar[bool] = False


# From this many tokens, where the CPU has VNNI or AMX, CpuInt8Gemm hands the product to
# torch._int_mm. Measured on the AVX-512-BF16 EPYC (VNNI), N = K = 4096, bf16, 2 threads,
# 7 paired repeats, the avx512 build's time (exact int16 multiply-adds in 4 x 4 register
# tiles, _cpu_int8_codec.h I16x32) over _int_mm's: 0.20 at M = 4, 0.54 at 16, 0.70 at 32,
# 0.84 at 40, 0.96 at 48, 1.01 at 56, 1.02 at 64: even near 50. Without an int8 dot product
# _int_mm sums wrong and is never selected.
INT_MM_FROM_TOKENS = 49
# The same for the builds with vpdpbusd (VNNI_LEVELS, U8x64), by K, the longest first.
# Measured as above with `python -m benchmarks.int8_handover` (weights rotated past the LLC),
# the avx512_vnni build over _int_mm: N = K = 4096 0.31 at M = 16, 0.64 at 64, 0.92 at
# 128, 0.91 at 192, 0.93 at 256, 1.02 at 512; N = 14336, K = 4096 0.79 at 128, 1.04 at
# 192, 1.01 at 256; N = K = 2048 0.71 at 64, 0.90 at 128, 0.93 at 192, 1.00 at 384;
# N = 4096, K = 14336 0.89 at 256, 1.17 at 384. Under K = 2048 (N = K = 1024: 0.70 at 48,
# 0.78 at 64) the op takes fp32 panels past 64 tokens (kIntPanelsBelowK), about 3x.
VNNI_INT_MM_FROM_TOKENS: tuple[tuple[int, int], ...] = ((2048, 192), (0, 65))
# Where the CPU has AMX-INT8 (and oneDNN may use it), _int_mm runs on AMX tiles, for every
# build. Measured as above on a 2-core AMX Xeon, the avx512_amx build over _int_mm:
# N = K = 4096 0.65 / 0.81 / 0.89 / 1.00 / 1.30 at M = 16 / 32 / 40 / 48 / 64 (1.59 at
# 256); N = 14336, K = 4096 0.86 / 0.95 / 1.10 at 32 / 40 / 48; N = K = 2048 0.85 / 0.88 /
# 1.06; N = K = 1024 0.81 / 0.98 / 1.11.
AMX_INT_MM_FROM_TOKENS = 41


def int_mm_from_tokens(level: str, k: int, amx: bool = False) -> int:
    """The batch size (tokens) from which ``cpu_int8_gemm``'s ``level`` build hands a layer of
    K ``k`` to ``torch._int_mm``, on a CPU with an int8 dot product (``amx``: AMX-INT8)."""
    if amx:
        return AMX_INT_MM_FROM_TOKENS
    if level not in VNNI_LEVELS:
        return INT_MM_FROM_TOKENS
    return next(tokens for shortest, tokens in VNNI_INT_MM_FROM_TOKENS if k >= shortest)


@attrs.frozen
class CpuInt8Gemm(CpuFp8Gemm):
    """W8A8 int8 on the CPU (``int8_per_channel``): per-token int8 activations quantized in
    the op, int8 weights per channel or per tensor, multiplied in registers and summed
    exactly in int32 (``vpmaddwd``, or ``vpdpbusd`` with AVX512-VNNI): for CPUs where
    ``torch._int_mm`` has no int8 dot product (no VNNI), and at decode sizes where it has
    one; from ``int_mm_from_tokens(level, K)`` tokens on such a CPU the product goes to
    ``torch._int_mm`` (exact int32 sums), which wins there."""

    _WEIGHT: ClassVar[Dtype] = Dtype.INT8

    # The batch size from which the product goes to torch._int_mm, or None (no int8 dot).
    _int_mm_from: int | None = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        handover = None
        if self.isa & INT8_DOT_ISA.flags:
            amx = "amx_int8" in self.isa
            handover = int_mm_from_tokens(self.level, self.config.weight_shape[1], amx)
        object.__setattr__(self, "_int_mm_from", handover)

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if self._int_mm_from is None or x.shape[0] < self._int_mm_from:
            return super()._matmul(x, bundle, bias)
        # Past decode sizes on a CPU with an int8 dot product, oneDNN's int8 GEMM (exact
        # int32 sums) on the same bytes, viewed as Int8IntMM hands them over.
        xq, x_scale = self.quantize_input(x, bundle)
        acc = torch._int_mm(xq, int_mm_weight(bundle.weight.t())).to(torch.float32)
        return apply_scales(acc, x_scale, bundle.scale, bias, self.out_dtype)

    def _groups_for(self, config: QuantConfig) -> tuple[int, int]:
        # The catalog row's rules (INT8_PER_TOKEN), read from the same values.
        act, weight = config.activation, config.weight.scale
        if (
            act is None
            or act.dtype is not Dtype.INT8
            or act.scale.static
            or act.scale.group not in CPU_INT8_ACTIVATIONS.groups
            or weight.group not in CPU_INT8_WEIGHTS.groups
            or {act.scale.dtype, weight.dtype} != {Dtype.FLOAT32}
        ):
            found = "weight-only" if act is None else f"{act.render()}, weight {weight.render()}"
            expected = (
                "int8 activations quantized dynamically per-token and per-tensor or "
                "per-channel int8 weights, fp32 scales"
            )
            raise InvalidValueError(f"{self.kernel_id} scales", found, expected)
        return 0, 0
