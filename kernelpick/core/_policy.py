"""Policy: what the operator asks of the choice (disable, force, strict), and its env form."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from kernelpick.core._builtin_catalog import DEFAULT_CATALOG
from kernelpick.core._errors import InvalidValueError, is_bool
from kernelpick.core._specs import Catalog

__all__ = ["ENV_DISABLED", "ENV_FORCE", "ENV_STRICT", "Policy", "split_ids"]

ENV_DISABLED = "KERNELPICK_DISABLED_KERNELS"
ENV_FORCE = "KERNELPICK_FORCE_KERNEL"
ENV_STRICT = "KERNELPICK_STRICT"

_TRUE = frozenset({"1", "true", "yes"})
_FALSE = frozenset({"0", "false", "no"})


def split_ids(text: str) -> tuple[str, ...]:
    """Kernel ids from a comma-separated list, as the variables and the CLI flags take
    them: spaces trimmed, empty items dropped, first occurrence kept."""
    return tuple(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))


def _id_set(value: Iterable[str] | str) -> frozenset[str]:
    # A bare string is one id, not a set of characters.
    items = [value] if isinstance(value, str) else value
    try:
        return frozenset(str(item).strip() for item in items if str(item).strip())
    except TypeError:
        raise InvalidValueError("disabled", value, "a collection of kernel ids") from None


def _force(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidValueError("force", value, "a kernel id or None")
    return value.strip() or None


@attrs.frozen(cache_hash=True)
class Policy:
    """``disabled`` kernel ids are skipped; a ``force``d kernel is the only candidate (if it
    cannot implement the config the result is Rejected, never a fall-through); ``strict``
    turns down degraded choices. Ids are checked against the catalog when choosing.
    """

    disabled: frozenset[str] = attrs.field(default=frozenset(), converter=_id_set)
    force: str | None = attrs.field(default=None, converter=_force)
    strict: bool = attrs.field(default=False, validator=is_bool)

    @property
    def kernel_ids(self) -> frozenset[str]:
        """Every id this policy names."""
        return self.disabled | ({self.force} if self.force else frozenset())

    @classmethod
    def from_env(cls, env: Mapping[str, str], catalog: Catalog | None = None) -> Policy:
        """Read the policy from ``KERNELPICK_{DISABLED_KERNELS,FORCE_KERNEL,STRICT}`` in ``env``.

        Ids are comma-separated; spaces are trimmed and empty items and duplicates ignored.
        Strict takes 1/0/true/false/yes/no in any case. Unset or blank means the default.
        Every id is checked against ``catalog`` (the built-in one when None): an unknown id
        raises ``UnknownNameError`` naming the closest valid id, since a misspelt id that
        silently does nothing is how a wrong kernel reaches production.
        """
        disabled = split_ids(env.get(ENV_DISABLED, ""))
        forced = split_ids(env.get(ENV_FORCE, ""))
        if len(forced) > 1:
            raise InvalidValueError(ENV_FORCE, env[ENV_FORCE], "a single kernel id")
        strict_text = env.get(ENV_STRICT, "").strip().lower()
        if strict_text and strict_text not in _TRUE | _FALSE:
            raise InvalidValueError(
                ENV_STRICT, env[ENV_STRICT], "one of 1, 0, true, false, yes, no"
            )
        policy = cls(disabled, forced[0] if forced else None, strict_text in _TRUE)
        (DEFAULT_CATALOG if catalog is None else catalog).check_ids(sorted(policy.kernel_ids))
        return policy
