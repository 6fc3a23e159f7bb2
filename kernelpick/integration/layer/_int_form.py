"""The persisted form of an integer weight-only layer (int4, int8 weights; W4A16, W8A16):
compressed-tensors' ``pack-quantized`` tensors, under its names, which is what the layer
registers, its state dict holds and ``save_quantized`` writes.

The laws, checked by ``accept_int`` before any byte changes:

1. ``weight_packed`` is int32 ``[N, ceil(K * bits / 32)]``, contiguous (see
   ``kernelpick.kernels.pack_int``), and the unused bits of a short last word are zero: a
   word with bits set past K could be read as a wider K.
2. ``weight_scale`` is positive and finite, fp32, bf16 or fp16 (widened to fp32 exactly),
   of the config's scale shape ``[N, ceil(K / g)]`` (``[N, 1]`` or ``[N]`` per channel).
3. ``weight_zero_point``, for an asymmetric config only, is int32
   ``[ceil(N * bits / 32), G]``: packed along N, as the format stores it, the unused bits
   of its last row zero.
4. ``weight_g_idx``, for an act-order config only, is int32 or int64 ``[K]``, every group
   naming exactly its ``g`` columns (``kernelpick.kernels.group_order``).
5. ``weight_shape``, which the format stores beside them, is ``[N, K]`` (``check_shape``).

A tensor the config does not call for is refused by name, never ignored: a zero point
ignored reads every weight shifted, a ``g_idx`` ignored reads columns in the wrong groups.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar

import attrs
import torch

from kernelpick.core import (
    PER_CHANNEL_GROUP,
    InvalidValueError,
    KernelInputError,
    QuantConfig,
    group_size_of,
)
from kernelpick.integration.layer._param import Param
from kernelpick.kernels import (
    AmaxReduce,
    Kernel,
    WeightBundle,
    canonical_scale,
    check_tensor,
    group_order,
    pack_zero_points,
    quantize_int,
    reject,
    unpack_zero_points,
)

__all__ = [
    "INT_NAMES",
    "SHAPE_NAME",
    "IntWeights",
    "accept_int",
    "check_shape",
    "int_check",
    "int_params",
    "is_weight_only_int",
    "prepare_int",
    "quantize_int_weights",
    "values_per_word",
]

INT_NAMES = ("weight_packed", "weight_scale", "weight_zero_point", "weight_g_idx")
SHAPE_NAME = "weight_shape"  # stored beside them; the layer's plan holds the shape
_WORD = 32
_G_IDX_DTYPES = (torch.int32, torch.int64)


def is_weight_only_int(config: QuantConfig) -> bool:
    """Whether ``config`` is an integer weight-only layer, held in this form."""
    return config.activation is None and config.weight.dtype.is_integer


def values_per_word(config: QuantConfig) -> int:
    """How many of ``config``'s integer values an int32 word packs: 8 int4, 4 int8."""
    return _WORD // config.weight.dtype.bits


def _words(values: int, bits: int) -> int:
    return -(-values * bits // _WORD)


def int_params(config: QuantConfig) -> tuple[Param, ...]:
    """The parameters a pre-quantized integer layer registers, with the dimensions an
    engine narrows each by and, for a packed one, the dimension it packs (``packed_dim``:
    an engine narrows that one by words)."""
    n, k = config.weight_shape
    bits = config.weight.dtype.bits
    groups = config.weight_scale_shape[1]
    # Scales and zero points vary along K where the whole layer (every row-parallel part
    # of it) has more than one group: an engine narrows them to a part's groups. Else
    # every part holds the same one column.
    size = group_size_of(config)
    along_k = size is not None and size != PER_CHANNEL_GROUP and size < k * config.k_parts
    grouped = {"output_dim": 0} | ({"input_dim": 1} if along_k else {})
    # packed_dim: the dimension whose values are packed 32 / bits to a word.
    packed = {"output_dim": 0, "input_dim": 1, "packed_dim": 1}
    params = [
        Param("weight_packed", (n, _words(k, bits)), torch.int32, packed),
        Param("weight_scale", config.weight_scale_shape, torch.float32, grouped),
    ]
    if config.weight.zero_point is not None:
        zero_dims = {**grouped, "packed_dim": 0}
        params.append(Param("weight_zero_point", (_words(n, bits), groups), torch.int32, zero_dims))
    if config.act_order:
        params.append(Param("weight_g_idx", (k,), torch.int32, {"input_dim": 0}))
    return tuple(params)


def _spare_bits_clear(label: str, words: torch.Tensor, count: int, bits: int) -> None:
    # The last word along dim -1 holds count mod (32 / bits) values; its higher bits are zero.
    used = count * bits % _WORD
    if used == 0:
        return
    last = words[..., -1].to(torch.int64) & 0xFFFFFFFF
    if bool((last >> used).any()):
        raise reject(
            label, words, f"zero bits past value {count} in each last word (bits {used}..31 "
            "of it): set bits there are weights of a larger layer",
        )  # fmt: skip


def int_check(config: QuantConfig, name: str) -> Callable[
    [str, torch.Tensor, tuple[int, ...]], torch.Tensor
]:  # fmt: skip
    """The check a loader runs on one tensor ``name`` of an integer layer as it arrives
    (dtype and shape; the values are ``accept_int``'s once the layer has them all)."""
    if name == "weight_scale":
        return canonical_scale
    dtypes = _G_IDX_DTYPES if name == "weight_g_idx" else (torch.int32,)

    def check(label: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        check_tensor(label, tensor, dtypes=dtypes)
        if tuple(tensor.shape) != shape:
            wanted = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise reject(
                label, tensor, f"{wanted} of shape {list(shape)} ({name} of {config.render()})"
            )
        if name == "weight_g_idx":
            group_order(tensor, config, label)  # its values, before a narrowing copy wraps them
        return tensor

    return check


@attrs.frozen(eq=False)  # tensors: compared by identity
class IntWeights:
    """A layer's accepted pack-quantized tensors (the laws above)."""

    NAMES: ClassVar[tuple[str, ...]] = INT_NAMES

    config: QuantConfig
    weight_packed: torch.Tensor
    weight_scale: torch.Tensor
    weight_zero_point: torch.Tensor | None = None
    weight_g_idx: torch.Tensor | None = None

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        return self.weight_packed, self.weight_scale, self.weight_zero_point, self.weight_g_idx


def prepare_int(
    kernel: Kernel, config: QuantConfig, tensors: Mapping[str, torch.Tensor | None]
) -> WeightBundle:
    """What ``kernel`` runs on, prepared from a layer's accepted tensors by name: the zero
    points unpacked to the ``[N, G]`` it reads. Plain calls only, so ``torch.compile``
    traces it."""
    zero = tensors.get("weight_zero_point")
    if zero is not None:
        zero = unpack_zero_points(zero, config.weight.dtype.bits, config.n)
    packed, scale = tensors["weight_packed"], tensors["weight_scale"]
    if packed is None or scale is None:
        raise InvalidValueError("layer", "one without its packed weight or scale",
                                "a layer holding its tensors")  # fmt: skip
    return kernel.prepare_weights(
        packed, scale, None, zero_point=zero, g_idx=tensors.get("weight_g_idx")
    )


def accept_int(
    config: QuantConfig,
    label: Callable[[str], str],
    tensors: Mapping[str, torch.Tensor | None],
) -> IntWeights:
    """A layer's pack-quantized ``tensors`` (by name) checked against laws 1-4, or
    ``KernelInputError`` naming the first that fails; the caller's tensors are not changed.
    A name outside this form is refused, as is one the config does not call for."""
    shapes = {param.name: param.shape for param in int_params(config)}
    for name, tensor in sorted(tensors.items()):
        if tensor is not None and name not in shapes:
            expected = f"none: {config.render()} has only {', '.join(shapes)}"
            raise reject(label(name), tensor, expected)
    checked: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        tensor = tensors.get(name)
        if tensor is None:
            expected = f"a tensor: {config.render()} needs {name}"
            raise KernelInputError(label(name), (), "None", "-", expected)
        checked[name] = int_check(config, name)(label(name), tensor, shape)
    bits = config.weight.dtype.bits
    packed = checked["weight_packed"]
    if not packed.is_contiguous():
        raise reject(label("weight_packed"), packed, "a contiguous row-major tensor")
    _spare_bits_clear(label("weight_packed"), packed, config.k, bits)
    zero = checked.get("weight_zero_point")
    if zero is not None:
        _spare_bits_clear(label("weight_zero_point"), zero.t(), config.n, bits)
    g_idx = checked.get("weight_g_idx")
    if g_idx is not None:
        group_order(g_idx, config, label("weight_g_idx"))
    return IntWeights(config, packed, checked["weight_scale"], zero, g_idx)


def check_shape(config: QuantConfig, label: str, tensor: object) -> None:
    """Law 5: a stored ``weight_shape`` is ``[N, K]`` of this layer."""
    n, k = config.weight_shape
    shape = check_tensor(label, tensor, dtypes=(torch.int32, torch.int64), shape=(2,))
    if shape.tolist() != [n, k]:
        raise reject(label, shape, f"[{n}, {k}], this layer's [N, K] (it holds {shape.tolist()})")


def quantize_int_weights(
    config: QuantConfig, weight: torch.Tensor, *, reduce_amax: AmaxReduce | None = None
) -> IntWeights:
    """A high-precision ``weight [N, K]`` (finite: checked by the caller) quantized
    round-to-nearest to this form, as compressed-tensors' quantizer does; a row-parallel
    shard of a per-channel layer passes ``reduce_amax`` (see ``quantize_int``)."""
    if config.act_order:
        raise reject("weight", weight, "a checkpoint's g_idx: round-to-nearest has no act-order")
    with torch.no_grad():
        packed, scale, zero = quantize_int(weight.detach(), config, reduce_amax=reduce_amax)
    if zero is not None:
        zero = pack_zero_points(zero, config.weight.dtype.bits)
    return IntWeights(config, packed, scale, zero)
