"""atheris target: the arch, version, dtype and platform parsers on arbitrary text."""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from _checks import outcome

    import kernelpick.core as core


def one_input(data: bytes) -> None:
    text = atheris.FuzzedDataProvider(data).ConsumeUnicodeNoSurrogates(64)
    cuda = outcome(lambda: core.CudaArch.parse(text))
    if cuda is not None and core.CudaArch.parse(str(cuda)) != cuda:
        raise AssertionError(f"CudaArch {text!r} does not round-trip")
    rocm = outcome(lambda: core.RocmArch.parse(text))
    if rocm is not None and (core.RocmArch.parse(rocm.name) != rocm or ":" in rocm.name):
        raise AssertionError(f"RocmArch {text!r} does not round-trip")
    version = outcome(lambda: core.Version.parse(text))
    if version is not None and core.Version.parse(str(version)) != version:
        raise AssertionError(f"Version {text!r} does not round-trip")
    outcome(lambda: core.Dtype.parse(text))
    outcome(lambda: core.Platform.parse(text))
    outcome(lambda: core.device_profile(text))


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
