"""Accept: the only place that checks and canonicalizes a layer's tensors.

Every way a tensor reaches a layer goes through here: kernelpick's own loaders and an
engine's (each tensor as it arrives, ``weight_check``/``scale_check``), and then, once the
layer has all of them, ``accept`` (quantized tensors: the linear method's processing,
``load_quantized``, ``load_state_dict``, transformers' loading) or ``accept_float`` (a
high-precision weight, quantized here: the online paths). Whatever path a bad tensor
takes, it meets the same check and the same error.

The laws, in the order they are checked:

1. A weight is dense, has data, and has the layer's dtype and shape: the canonical FP8
   (e4m3fn) or int8 ``[N, K]``, contiguous, for a quantized one; a real float ``[N, K]``
   for a high-precision one. Casting a quantized weight would drop its scales, so a wrong
   dtype is refused, never converted.
2. An FP8 weight holds no NaN byte (a corrupt checkpoint: e4m3fnuz devices read NaN bytes
   as +-240); a high-precision one no NaN or Inf.
3. A scale is positive and finite, stored in one of the layouts checkpoints use for the
   layer's shape, and widens exactly to its canonical dtype: fp32, or E8M0 (MXFP8) as it is.
4. A bias is finite, as the weight must be.
5. Then, and only then, the bytes change: -0 becomes +0 (the byte e4m3fnuz reads as NaN),
   a fused layer's per-shard per-tensor scales merge into one (the largest), and static
   input scales take the largest. A tensor the caller still owns is copied, never changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import attrs
import torch

from kernelpick.core import Dtype, QuantConfig
from kernelpick.integration.layer._int_form import (
    IntWeights,
    is_weight_only_int,
    quantize_int_weights,
)
from kernelpick.integration.layer._shards import per_tensor
from kernelpick.kernels import (
    CANONICAL_FP8,
    CHUNK_ROWS,
    E8M0_DTYPES,
    AmaxReduce,
    canonical_dtype,
    canonical_scale,
    check_finite,
    check_fp8_finite,
    check_tensor,
    has_negative_zero,
    one_tensor_scale,
    positive_zero_,
    quantize_canonical,
    reject,
    torch_dtype,
)

__all__ = [
    "CanonicalWeights",
    "Check",
    "accept",
    "accept_float",
    "check_bias",
    "check_float",
    "float_weight_check",
    "scale_check",
    "weight_check",
]

# Checks one tensor against the shape it must have and returns the value to copy.
Check = Callable[[str, torch.Tensor, tuple[int, ...]], torch.Tensor]

_PRE_QUANTIZED = "checkpoint_format='pre_quantized' (or 'fp8'; the pre-quantized path)"
_ONLINE = "checkpoint_format='high_precision' (online quantization)"
_E8M0_NAN = 0xFF  # the one byte of float8_e8m0fnu that is not a power of two


@attrs.frozen(eq=False)  # tensors: compared by identity
class CanonicalWeights:
    """A layer's canonical tensors (see ``kernelpick.kernels._canonical``): the FP8 or int8
    ``weight [N, K]``, its ``weight_scale`` and, for a static scheme, ``input_scale``."""

    NAMES: ClassVar[tuple[str, str, str]] = ("weight", "weight_scale", "input_scale")

    weight: torch.Tensor
    weight_scale: torch.Tensor
    input_scale: torch.Tensor | None = None

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return self.weight, self.weight_scale, self.input_scale


def float_weight_check(label: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The float ``weight`` of the online path (law 1). FP8 and integer tensors are refused:
    they are quantized already, and casting them would drop their scales."""
    check_tensor(label, tensor)
    if tensor.is_complex():
        raise reject(label, tensor, "a real floating-point dtype")
    if tensor.dtype.itemsize == 1 or not tensor.is_floating_point():
        raise reject(
            label, tensor, f"a high-precision float tensor; a quantized weight belongs to "
            f"{_PRE_QUANTIZED}, which loads its scales too",
        )  # fmt: skip
    if tuple(tensor.shape) != shape:
        raise reject(label, tensor, f"shape {list(shape)}")
    return tensor


def weight_check(config: QuantConfig) -> Check:
    """The quantized ``weight`` (laws 1 and 2, contiguity aside: a loader copies a part
    into place): e4m3fn without NaN bytes, or int8 for an int8 scheme (any of -128..127:
    compressed-tensors' symmetric int8 reaches -128)."""
    fmt = canonical_dtype(config)
    dtype = torch_dtype(fmt)
    layout = "the canonical FP8 layout" if fmt is CANONICAL_FP8 else "an int8 scheme's weight"

    def check(label: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        check_tensor(label, tensor)
        if tensor.dtype != dtype:
            hint = f"; a high-precision weight belongs to {_ONLINE}"
            wanted = f"dtype {str(dtype).removeprefix('torch.')} ({layout})"
            floating = tensor.is_floating_point() and tensor.dtype.itemsize > 1
            raise reject(label, tensor, wanted + (hint if floating else ""))
        if tuple(tensor.shape) != shape:
            raise reject(label, tensor, f"shape {list(shape)}")
        if fmt is CANONICAL_FP8:
            check_fp8_finite(label, tensor)
        return tensor

    return check


def _e8m0_scale(label: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    # MX scales are exponents: a float scale would have to be rounded to one, which is a
    # second quantization, so only E8M0 itself is taken (OCP MX spec, section 5.4), or its
    # bytes as a checkpoint stores them (E8M0_STORED).
    check_tensor(label, tensor, dtypes=E8M0_DTYPES)
    if tuple(tensor.shape) != shape:
        raise reject(label, tensor, f"float8_e8m0fnu scales of shape {list(shape)}")
    if bool((tensor.view(torch.uint8) == _E8M0_NAN).any()):
        raise reject(label, tensor, "E8M0 scales without NaN (byte 0xFF)")
    return tensor.contiguous().view(torch.float8_e8m0fnu)


def scale_check(config: QuantConfig) -> Check:
    """A weight scale (law 3): fp32 from the layouts checkpoints use (``[N, 1]``
    or ``[N]`` per channel; ``[]``, ``[1]`` or ``[1, 1]`` per tensor; bf16 and fp16 widen
    exactly), or an MX config's float8_e8m0fnu weight scale as it is (or its uint8 bytes,
    as a state dict and a checkpoint store it)."""
    if config.weight.scale.dtype is Dtype.FLOAT8_E8M0FNU:
        return _e8m0_scale
    return canonical_scale


def accept(
    config: QuantConfig,
    label: Callable[[str], str],
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    input_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    shards: tuple[int, ...] = (),
    owned: bool = False,
    chunk_rows: int = CHUNK_ROWS,
) -> CanonicalWeights:
    """A layer's quantized tensors, checked (laws 1-4), then canonical (law 5). ``label``
    names a tensor in errors (``prefix.weight``, with the rank of a shard). ``shards``: the
    rows of a fused layer's shards when it holds a per-tensor scale (and a static input
    scale) per shard, which are merged; otherwise ``weight_scale`` has the config's shape.
    ``owned``: the caller hands the tensors over, so -0 is fixed in place; otherwise a
    weight with -0 is copied first."""
    n, k = config.weight_shape
    fp8 = canonical_dtype(config) is CANONICAL_FP8
    weight = weight_check(config)(label("weight"), weight, (n, k))
    if not weight.is_contiguous():
        raise reject(label("weight"), weight, "a contiguous row-major [N, K] tensor")
    merge = len(shards) > 1 and per_tensor(config)
    check = scale_check(config)
    scale_shape = (len(shards),) if merge else config.weight_scale_shape
    scale = check(label("weight_scale"), weight_scale, scale_shape)
    static = None
    if input_scale is not None:  # one per shard where they merge, as the weight scales
        static = canonical_scale(label("input_scale"), input_scale, (len(shards) if merge else 1,))
    if bias is not None:
        check_bias(config, label, bias, chunk_rows=chunk_rows)
    # Law 5: every check passed; only now do bytes change.
    if merge:
        weight, scale = one_tensor_scale(weight, shards, scale, chunk_rows)
    elif fp8:
        if not owned and has_negative_zero(weight, chunk_rows):
            weight = weight.clone()
        positive_zero_(weight, chunk_rows)
    if static is not None and static.numel() > 1:
        static = static.amax().reshape(1)
    return CanonicalWeights(weight, scale, static)


def check_bias(
    config: QuantConfig,
    label: Callable[[str], str],
    bias: torch.Tensor,
    *,
    chunk_rows: int = CHUNK_ROWS,
) -> None:
    """Law 4: a bias is a float ``[N]`` tensor, finite, as the weight must be."""
    n = config.weight_shape[0]
    check_tensor(label("bias"), bias)
    if tuple(bias.shape) != (n,) or not bias.is_floating_point() or bias.dtype.itemsize == 1:
        raise reject(label("bias"), bias, f"a high-precision float tensor of shape [{n}]")
    check_finite(label("bias"), bias.detach().view(1, -1), chunk_rows)


def check_float(
    config: QuantConfig,
    label: Callable[[str], str],
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    chunk_rows: int = CHUNK_ROWS,
) -> None:
    """Laws 1, 2 and 4 for a high-precision weight: the config's shape and input dtype,
    finite values, a finite bias. Read-only, so a conversion can check every layer before
    it changes any."""
    n, k = config.weight_shape
    dtype = torch_dtype(config.input_dtype)
    check_tensor(label("weight"), weight)  # a meta or sparse weight has nothing to quantize
    if tuple(weight.shape) != (n, k) or weight.dtype != dtype:
        raise reject(label("weight"), weight, f"shape [{n}, {k}], dtype {config.input_dtype}")
    check_finite(label("weight"), weight, chunk_rows)
    if bias is not None:
        check_bias(config, label, bias, chunk_rows=chunk_rows)


def accept_float(
    config: QuantConfig,
    label: Callable[[str], str],
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    checked: bool = False,
    chunk_rows: int = CHUNK_ROWS,
    reduce_amax: AmaxReduce | None = None,
) -> CanonicalWeights | IntWeights:
    """A high-precision weight, checked (``check_float``; ``checked``: the caller already
    did) and quantized to the canonical layout (fp32 amax, clamp floor, ``chunk_rows`` rows
    at a time), or for an integer weight-only config to its pack-quantized form
    (round-to-nearest, as compressed-tensors quantizes). A tensor-parallel shard passes
    ``reduce_amax`` (see ``kernelpick.kernels.quantize_canonical``). ``weight`` itself is
    never changed."""
    if not checked:
        check_float(config, label, weight, bias, chunk_rows=chunk_rows)
    if is_weight_only_int(config):
        return quantize_int_weights(config, weight, reduce_amax=reduce_amax)
    with torch.no_grad():
        q, scale = quantize_canonical(
            weight.detach(), config, chunk_rows=chunk_rows, reduce_amax=reduce_amax
        )
    return CanonicalWeights(q, scale)
