"""What the hypothesis fuzzers of the public API share: the names they draw from, the
settings they run under, the check that an error names the bad value, and the strategies
of a typing slip and of the policy environment (docs/design.md#vocabulary)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.core import ENV_DISABLED, ENV_FORCE, ENV_STRICT

__all__ = [
    "DTYPE_NAMES",
    "ENV",
    "ENV_ITEM",
    "ENV_LIST",
    "GFX_TEXT",
    "HIGH_PRECISION",
    "IDS",
    "ID_SET",
    "PROFILE_NAMES",
    "SCHEME_NAMES",
    "STRICT_TEXT",
    "assert_names",
    "fuzz",
    "near_miss",
    "positive_int",
]

IDS: tuple[str, ...] = kp.default_catalog().ids
ID_SET = frozenset(IDS)
PROFILE_NAMES: tuple[str, ...] = tuple(kp.device_profiles())
SCHEME_NAMES: tuple[str, ...] = tuple(s.value for s in kp.Scheme)

# The dtypes by torch name, and the short names people type for them
# (docs/design.md#vocabulary).
DTYPE_NAMES: dict[str, str] = {
    **{name: name for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2")},
    **{name: name for name in ("int8", "int4", "float8_e8m0fnu")},
    **{name: name for name in ("bfloat16", "float16", "float32")},
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "e4m3fn": "float8_e4m3fn",
    "e4m3fnuz": "float8_e4m3fnuz",
    "e5m2": "float8_e5m2",
    "e8m0": "float8_e8m0fnu",
    "e8m0fnu": "float8_e8m0fnu",
    "i8": "int8",
    "i4": "int4",
}
HIGH_PRECISION = frozenset({"bfloat16", "float16", "float32"})
# A gfx name as RocmArch.parse reads it (the arch and the translate fuzzers judge by it).
GFX_TEXT = re.compile(r"^gfx[0-9]{1,2}[0-9a-f]{2}$")


def fuzz(max_examples: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def assert_names(error: BaseException | str, *candidates: str) -> None:
    """``error``'s message contains at least one of ``candidates`` (renderings of a bad value)."""
    message = str(error)
    wanted = [c for c in candidates if c]
    assert any(c in message for c in wanted), f"{message!r} names none of {wanted!r}"


def positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# -- shared strategies ---------------------------------------------------------------------


@st.composite
def near_miss(draw: st.DrawFn, words: Sequence[str]) -> str:
    """``words`` member with one typing slip: a letter dropped, added, changed or swapped,
    a case change, a dash for an underscore, or padding."""
    word = draw(st.sampled_from(words))
    i = draw(st.integers(0, len(word) - 1))
    letter = draw(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789_-é"))
    op = draw(st.sampled_from(["drop", "add", "change", "swap", "upper", "dash", "pad"]))
    if op == "drop":
        return word[:i] + word[i + 1 :]
    if op == "add":
        return word[:i] + letter + word[i:]
    if op == "change":
        return word[:i] + letter + word[i + 1 :]
    if op == "swap" and i + 1 < len(word):
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    if op == "upper":
        return word.upper()
    if op == "dash":
        return word.replace("_", "-")
    return f"  {word}\t"


# -- the policy environment (kp.Policy.from_env, and the CLI's env) ----------------------

ENV_ITEM: st.SearchStrategy[str] = st.one_of(
    st.sampled_from(IDS),
    st.sampled_from(IDS).map(lambda i: f"  {i}\t"),
    near_miss(IDS),
    st.sampled_from(["", " ", ",", " , ", "\t", "\u00a0", "é", "∂", "\u3000cpu_w8a16_reference"]),
    st.text(max_size=12),
)
ENV_LIST: st.SearchStrategy[str] = st.one_of(
    st.lists(ENV_ITEM, max_size=5).map(",".join),
    st.lists(st.sampled_from(IDS), max_size=3).map(lambda ids: " , ".join(ids * 2)),
    st.text(max_size=24),
)
STRICT_TEXT: st.SearchStrategy[str] = st.one_of(
    st.sampled_from(["1", "0", "true", "false", "yes", "no", "TRUE", "No", " yes ", "YeS"]),
    st.sampled_from(["", " ", "2", "y", "n", "on", "off", "t", "01", "true,false", "\uff11"]),
    st.text(max_size=6),
)
ENV: st.SearchStrategy[dict[str, str]] = st.fixed_dictionaries(
    {},
    optional={
        ENV_DISABLED: ENV_LIST,
        ENV_FORCE: st.one_of(ENV_LIST, st.sampled_from(IDS)),
        ENV_STRICT: STRICT_TEXT,
        "KERNELPICK_OTHER": st.text(max_size=5),
    },
)
