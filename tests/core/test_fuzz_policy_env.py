"""Fuzzing ``kp.Policy.from_env`` with hypothesis: the three variables are read as the
variables table of docs/design.md#selection-rules says, or the bad value is named.

The only allowed outcomes are a correct result or a documented kernelpick error: a
``kp.KernelpickError`` whose message names the bad value. Any other exception (TypeError,
AttributeError, IndexError, a ValueError of Python's own, an error from torch) is a bug of
the library, so nothing here catches more than ``kp.KernelpickError``.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import example, given

import kernelpick as kp
from kernelpick.core import ENV_DISABLED, ENV_FORCE, ENV_STRICT
from tests.support.fuzzing import ENV, ID_SET, assert_names, fuzz

# Hypothesis fuzzers of a public entry point: seconds in all, so `make check` skips them.
pytestmark = pytest.mark.slow


def _items(text: str) -> frozenset[str]:
    return frozenset(item.strip() for item in text.split(",") if item.strip())


def _expected_policy(env: Mapping[str, str]) -> tuple[kp.Policy | None, list[str]]:
    """The policy the variables table of docs/design.md#selection-rules gives for ``env``,
    or the renderings of its bad values."""
    disabled = _items(env.get(ENV_DISABLED, ""))
    forced = _items(env.get(ENV_FORCE, ""))
    problems = [repr(env[ENV_FORCE])] if len(forced) > 1 else []
    strict_text = env.get(ENV_STRICT, "").strip().lower()
    if strict_text not in {"", "1", "0", "true", "false", "yes", "no"}:
        problems.append(repr(env[ENV_STRICT]))
    problems += [repr(item) for item in sorted((disabled | forced) - ID_SET)]
    if problems:
        return None, problems
    force = next(iter(forced)) if forced else None
    return kp.Policy(disabled, force, strict_text in {"1", "true", "yes"}), []


@fuzz(800)
@given(ENV)
@example({ENV_DISABLED: " cpu_w8a16_reference,, cpu_w8a16_reference ,", ENV_STRICT: "YES"})
@example({ENV_FORCE: "cpu_dequant_reference,cpu_dequant_reference"})
@example({ENV_FORCE: "cpu_dequant_reference,cpu_w8a16_reference"})
@example({ENV_STRICT: "maybe"})
def test_policy_from_env_reads_the_three_variables_or_names_the_bad_value(
    env: dict[str, str],
) -> None:
    expected, problems = _expected_policy(env)
    if expected is None:
        with pytest.raises(kp.KernelpickError) as caught:
            kp.Policy.from_env(env)
        assert_names(caught.value, *problems)
        return
    policy = kp.Policy.from_env(env)
    assert (policy.disabled, policy.force, policy.strict) == (
        expected.disabled,
        expected.force,
        expected.strict,
    )
