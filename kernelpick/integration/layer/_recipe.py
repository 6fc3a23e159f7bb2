"""The recipe: what every layer of a model is quantized with, validated once and purely.

A recipe is the scheme, its block size and what the checkpoint holds (the checkpoint
format). Every engine config holds one, and a checkpoint's layout produces one, so "the
scheme must be an online one" and "only fp8_block has a block size" are checked here and
nowhere else. Making a recipe touches no device: the device and the policy come in when a
layer is planned (``LayerSteps``).
"""

from __future__ import annotations

import enum

import attrs

from kernelpick.core import (
    DEFAULT_GROUP_SIZE,
    HIGH_PRECISION,
    INTEGER_WEIGHT_ONLY,
    PER_CHANNEL_GROUP,
    Dtype,
    InvalidValueError,
    QuantConfig,
    Scheme,
    UnknownNameError,
    parse_enum,
    positive_int,
    quant_config,
)

__all__ = ["ONLINE_SCHEMES", "CheckpointFormat", "Recipe", "refuse_integer"]

# Schemes whose scales can all be computed from the weights and the live activations.
# fp8_per_tensor_static needs activation scales calibrated on data, which only a
# pre-quantized checkpoint (checkpoint_format="pre_quantized") can bring.
ONLINE_SCHEMES = (
    Scheme.FP8_PER_CHANNEL,
    Scheme.FP8_PER_TENSOR,
    Scheme.FP8_WEIGHT_ONLY,
    Scheme.FP8_BLOCK,
    Scheme.MXFP8,
    Scheme.INT8_PER_CHANNEL,
    Scheme.INT4_WEIGHT_ONLY,
    Scheme.INT8_WEIGHT_ONLY,
)


def refuse_integer(scheme: Scheme, engine: str) -> None:
    """Refuse an integer weight-only scheme by name in an ``engine`` that does not build
    its layers yet (``quantize_model``, ``load_quantized`` and the linear method do):
    never run it as another scheme's layer."""
    if scheme in INTEGER_WEIGHT_ONLY:
        raise InvalidValueError(
            "scheme", scheme.value,
            f"an FP8 or int8 W8A8 scheme in {engine}, which does not take integer weight-only "
            "layers yet; quantize_model, load_quantized and QuantizedLinearMethod do",
        )  # fmt: skip


class CheckpointFormat(enum.Enum):
    """What the checkpoint a layer loads from holds.

    ``HIGH_PRECISION``: float weights, quantized after loading (online). ``PRE_QUANTIZED``:
    weights already quantized, in the canonical layout (see
    ``kernelpick.kernels.quantize_canonical``): the FP8 or int8 ``weight``, its
    ``weight_scale`` and, for static schemes, ``input_scale``. ``FP8`` is the same member
    under its first name, and the string ``"fp8"`` still parses to it.
    """

    HIGH_PRECISION = "high_precision"
    PRE_QUANTIZED = "pre_quantized"
    FP8 = "pre_quantized"  # an alias: the name from before int8 weights loaded too

    def __str__(self) -> str:
        return self.value

    @classmethod
    def _missing_(cls, value: object) -> CheckpointFormat | None:
        return cls.PRE_QUANTIZED if value == "fp8" else None

    @classmethod
    def parse(cls, value: object) -> CheckpointFormat:
        return parse_enum(cls, value, "checkpoint format")


@attrs.frozen
class Recipe:
    """A scheme, its block size (``fp8_block``'s only; None: 128), the checkpoint format
    and an integer weight-only scheme's grouping: ``group_size`` (None: the scheme's
    default; -1 per channel), ``symmetric`` (False: zero points) and ``act_order`` (a
    checkpoint's ``g_idx``). Made by ``of``, which checks them; the fields then fit."""

    scheme: Scheme
    checkpoint_format: CheckpointFormat = CheckpointFormat.HIGH_PRECISION
    block_size: int | None = None
    group_size: int | None = None
    symmetric: bool = True
    act_order: bool = False

    @classmethod
    def of(
        cls,
        scheme: Scheme | str,
        *,
        checkpoint_format: CheckpointFormat | str = CheckpointFormat.HIGH_PRECISION,
        block_size: int | None = None,
        group_size: int | None = None,
        symmetric: bool = True,
        act_order: bool = False,
    ) -> Recipe:
        """The recipe for ``scheme``, or ``InvalidValueError`` (``UnknownNameError`` for a
        name) naming the value and what is valid. An online recipe (``high_precision``
        checkpoints) needs one of ``ONLINE_SCHEMES``; ``block_size`` is ``fp8_block``'s
        and positive; ``group_size``, ``symmetric`` and ``act_order`` are the integer
        weight-only schemes' (see ``kp.quant_config``), and act-order only pre-quantized:
        round-to-nearest writes no ``g_idx``."""
        parsed = Scheme.parse(scheme)
        fmt = CheckpointFormat.parse(checkpoint_format)
        if act_order is True and group_size == PER_CHANNEL_GROUP:
            raise InvalidValueError(
                "act_order", act_order, "False with group_size=-1: act-order permutes groups, "
                "and a per-channel weight has one group a row",
            )  # fmt: skip
        recipe = cls(parsed, fmt, block_size, group_size, symmetric, act_order)
        recipe.sample_config()  # the scheme's own check of the grouping
        if act_order and fmt is CheckpointFormat.HIGH_PRECISION:
            raise InvalidValueError(
                "act_order", act_order,
                "False online: round-to-nearest quantization writes no g_idx; an act-order "
                "layer loads from a GPTQ checkpoint (checkpoint_format='pre_quantized')",
            )  # fmt: skip
        if fmt is CheckpointFormat.HIGH_PRECISION and parsed not in ONLINE_SCHEMES:
            valid = ", ".join(s.value for s in ONLINE_SCHEMES)
            raise InvalidValueError(
                "scheme", parsed.value,
                f"one of {valid}: {parsed.value} needs activation scales calibrated on "
                "data, which online quantization cannot compute; load them from a "
                "pre-quantized checkpoint with checkpoint_format='pre_quantized'",
            )  # fmt: skip
        if block_size is not None:
            if parsed is not Scheme.FP8_BLOCK:
                raise InvalidValueError(
                    "block_size", block_size, f"None: only fp8_block has one, not {parsed.value}"
                )
            positive_int("block_size", block_size, "a positive integer, e.g. 128")
        return recipe

    @property
    def online(self) -> bool:
        """Whether layers quantize high-precision weights as they load."""
        return self.checkpoint_format is CheckpointFormat.HIGH_PRECISION

    def sample_config(self) -> QuantConfig:
        """A bf16 config of this recipe for a layer deep enough to hold two of its groups:
        what every layer of the recipe shares, whatever its shape."""
        size = self.group_size if self.group_size is not None else DEFAULT_GROUP_SIZE
        return self.config(1, 2 * max(size, 1), Dtype.BFLOAT16)

    def config(
        self, n: int, k: int, dtype: object, *, bias: bool = False, k_parts: int = 1
    ) -> QuantConfig:
        """One layer's QuantConfig: ``[n, k]`` weights, ``dtype`` (a torch or kernelpick
        dtype) in and out; ``k_parts``: K is one of that many row-parallel parts."""
        return quant_config(
            self.scheme, weight_shape=(n, k), out_dtype=_compute_dtype(dtype), bias=bias,
            block_size=self.block_size, group_size=self.group_size, symmetric=self.symmetric,
            act_order=self.act_order, k_parts=k_parts,
        )  # fmt: skip


def _compute_dtype(dtype: object) -> Dtype:
    """A layer's activation dtype: bf16, fp16 or fp32 (a torch or kernelpick dtype)."""
    valid = ", ".join(sorted(d.value for d in HIGH_PRECISION))
    try:
        parsed = Dtype.parse(dtype)
    except UnknownNameError:
        parsed = None
    if parsed is None or parsed not in HIGH_PRECISION:
        raise InvalidValueError(
            "layer dtype", str(dtype).removeprefix("torch."),
            f"one of {valid}: the activations' dtype, in and out (the weight is quantized)",
        )  # fmt: skip
    return parsed
