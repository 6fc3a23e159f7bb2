"""atheris target: Policy.from_env on arbitrary KERNELPICK_* values."""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from _checks import outcome

    import kernelpick.core as core

NAMES = (core.ENV_DISABLED, core.ENV_FORCE, core.ENV_STRICT)
IDS = core.default_catalog().ids


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    env: dict[str, str] = {}
    for name in NAMES:
        if fdp.ConsumeBool():
            # Mix real ids in, so the fuzzer reaches the accepting paths too.
            parts = [
                IDS[fdp.ConsumeIntInRange(0, len(IDS) - 1)] if fdp.ConsumeBool()
                else fdp.ConsumeUnicodeNoSurrogates(12)
                for _ in range(fdp.ConsumeIntInRange(0, 4))
            ]  # fmt: skip
            env[name] = fdp.ConsumeUnicodeNoSurrogates(3).join(parts)
    policy = outcome(lambda: core.Policy.from_env(env))
    if policy is None:
        return
    if not policy.kernel_ids <= set(IDS):
        raise AssertionError(f"unknown ids accepted: {policy.kernel_ids - set(IDS)}")
    strict_text = env.get(core.ENV_STRICT, "").strip().lower()
    if policy.strict != (strict_text in {"1", "true", "yes"}):
        raise AssertionError(f"strict {policy.strict} from {strict_text!r}")


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
