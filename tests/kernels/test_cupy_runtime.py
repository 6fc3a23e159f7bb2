"""The cupy launch glue and probe, checked without a GPU against stand-ins for cupy and
torch's stream: the launch's device context and stream, the stream protocol's fallback, and
the probe that proves NVRTC compiles before the cupy kernels are offered.

The kernels themselves are tests/kernels/test_cupy_kernels.py.
"""

from __future__ import annotations

import importlib.machinery
import logging
import sys
import types
from collections.abc import Callable, Iterator

import attrs
import numpy as np
import pytest
import torch

import kernelpick as kp
from kernelpick.kernels import _cupy_runtime as cupy_runtime
from kernelpick.kernels._cupy_runtime import cupy_unusable_reason, cupy_usable


class _FakeCupy:
    """Records what the launch glue does with cupy: contexts entered, and the launch.
    ``from_external`` is False for a cupy before 14, which has only ``ExternalStream``."""

    def __init__(self, from_external: bool = True) -> None:
        self.events: list[object] = []
        fake = self

        class Context:
            def __init__(self, label: str) -> None:
                self.label = label

            def __enter__(self) -> None:
                fake.events.append(("enter", self.label))

            def __exit__(self, *exc: object) -> None:
                fake.events.append(("exit", self.label))

        class Kernel:
            def __init__(self, source: str, name: str, options: tuple[str, ...]) -> None:
                fake.events.append(("compile", name, options))

            def compile(self) -> None:
                pass

            def __call__(self, grid: object, block: object, args: tuple[object, ...]) -> None:
                fake.events.append(("launch", grid, block, args))

        class Stream:
            pass

        def from_external_stream(stream: object) -> Context:
            return Context(f"stream {stream}")

        if from_external:
            Stream.from_external = staticmethod(from_external_stream)  # type: ignore[attr-defined]

        class Cuda:
            def Device(self, index: int) -> Context:
                return Context(f"device {index}")

            def ExternalStream(self, ptr: int, device_id: int) -> Context:
                return Context(f"external {ptr:#x} on {device_id}")

        Cuda.Stream = Stream  # type: ignore[attr-defined]
        self.RawKernel = Kernel
        self.cuda = Cuda()


def test_a_launch_runs_on_torchs_stream_inside_the_device_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _FakeCupy()
    monkeypatch.setattr(cupy_runtime, "_cupy", lambda: fake)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: _ProtocolStream(device))
    cupy_runtime._compiled.cache_clear()
    tensor = torch.zeros(4)
    geometry = cupy_runtime.Grid((3, 1, 1), (128, 1, 1))
    args = (tensor, None, np.int32(7), np.int64(2**40))
    cupy_runtime.launch("k", "source", geometry, args, torch.device("cuda", 1))
    cupy_runtime.launch("k", "source", geometry, args, torch.device("cuda", 1))
    cupy_runtime._compiled.cache_clear()
    compiles = [e for e in fake.events if isinstance(e, tuple) and e[0] == "compile"]
    assert len(compiles) == 1  # compiled once per device
    launch = next(e for e in fake.events if isinstance(e, tuple) and e[0] == "launch")
    order = fake.events.index(launch)
    entered = [e for e in fake.events[:order] if isinstance(e, tuple) and e[0] == "enter"]
    assert ("enter", "device 1") in entered
    assert ("enter", "stream torch-stream-cuda:1") in entered
    _, grid, block, passed = launch
    assert (grid, block) == ((3, 1, 1), (128, 1, 1))
    assert passed[0] == np.uint64(tensor.data_ptr())  # tensors travel as pointers
    assert passed[1] == np.uint64(0)  # None is NULL
    assert (type(passed[2]), type(passed[3])) == (np.int32, np.int64)
    with pytest.raises(kp.InvalidValueError, match="indexed CUDA device"):
        cupy_runtime.launch("k", "source", geometry, args, torch.device("cpu"))


# --- torch's stream as a cupy stream: the CUDA stream protocol when both sides have it -------


class _PlainStream:
    """torch.cuda.Stream before torch 2.10: a handle, and no ``__cuda_stream__``."""

    cuda_stream = 0xBEEF

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __str__(self) -> str:
        return f"torch-stream-{self.device}"


class _ProtocolStream(_PlainStream):
    """torch.cuda.Stream from torch 2.10: the CUDA stream protocol's (version, handle)."""

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.cuda_stream)


@pytest.mark.parametrize(
    ("from_external", "stream", "wrapped"),
    [
        (True, _ProtocolStream, "stream torch-stream-cuda:1"),
        # torch 2.8 / 2.9 with cupy 14: from_external would raise TypeError on torch's stream.
        (True, _PlainStream, "external 0xbeef on 1"),
        (False, _ProtocolStream, "external 0xbeef on 1"),
        (False, _PlainStream, "external 0xbeef on 1"),
    ],
    ids=["both-protocol", "old-torch", "old-cupy", "both-old"],
)
def test_torchs_stream_is_wrapped_by_the_protocol_only_when_both_sides_speak_it(
    monkeypatch: pytest.MonkeyPatch,
    from_external: bool,
    stream: Callable[[torch.device], _PlainStream],
    wrapped: str,
) -> None:
    fake = _FakeCupy(from_external=from_external)
    monkeypatch.setattr(torch.cuda, "current_stream", stream)
    context = cupy_runtime._torch_stream(fake, torch.device("cuda", 1))
    with context:
        pass
    assert fake.events == [("enter", wrapped), ("exit", wrapped)]


# --- the probe: cupy imports, a driver answers, and NVRTC compiles ----------------------------


class _Nvrtc:
    """cupy.cuda.nvrtc with a chosen outcome: ``error`` is raised where the real binding
    raises it (loading libnvrtc happens at the first call; a failed compile raises from
    compileProgram), and every program created is destroyed."""

    def __init__(self, error: BaseException | None = None, at: str = "compileProgram") -> None:
        self.error = error
        self.at = at
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.error is not None and name == self.at:
            raise self.error

    def createProgram(self, *args: object) -> int:
        self._call("createProgram")
        return 7

    def compileProgram(self, program: int, options: tuple[str, ...]) -> None:
        self._call("compileProgram")

    def getPTX(self, program: int) -> bytes:
        self._call("getPTX")
        return b".version 8.0\n.target sm_75\n.visible .entry kp_probe("

    def destroyProgram(self, program: int) -> None:
        self._call("destroyProgram")


def _cupy_with(nvrtc: _Nvrtc, devices: int = 1) -> types.ModuleType:
    cupy = types.ModuleType("cupy")
    cupy.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    runtime = types.SimpleNamespace(getDeviceCount=lambda: devices)
    cupy.cuda = types.SimpleNamespace(runtime=runtime, nvrtc=nvrtc)  # type: ignore[attr-defined]
    return cupy


@pytest.fixture
def fresh_probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The probe is cached per process: forget it before and after."""
    cupy_unusable_reason.cache_clear()
    yield monkeypatch
    cupy_unusable_reason.cache_clear()


def _missing_libnvrtc() -> BaseException:
    """What cupy 14 raises when libnvrtc cannot be loaded: cuda.pathfinder's
    DynamicLibNotFoundError (a RuntimeError), as this machine without libnvrtc shows."""
    pathfinder = pytest.importorskip("cuda.pathfinder", reason="cupy 14 brings cuda-pathfinder")
    error: type[BaseException] = pathfinder.DynamicLibNotFoundError
    return error('Failure finding "libnvrtc.so.13 or libnvrtc.so.12": No such file\nsearched')


def _compile_failed() -> BaseException:
    """NVRTC's own error for a failed compile (NVRTC_ERROR_COMPILATION is 6); made without
    calling its __init__, which asks libnvrtc for the message."""
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="needs cupy")
    error: BaseException = nvrtc.NVRTCError.__new__(nvrtc.NVRTCError, 6)
    return error


def test_with_a_device_and_nvrtc_compiling_cupy_is_usable(fresh_probe: pytest.MonkeyPatch) -> None:
    nvrtc = _Nvrtc()
    fresh_probe.setitem(sys.modules, "cupy", _cupy_with(nvrtc))
    assert cupy_usable() is True
    assert cupy_unusable_reason() is None
    assert nvrtc.calls == ["createProgram", "compileProgram", "getPTX", "destroyProgram"]


@pytest.mark.parametrize("at", ["createProgram", "compileProgram"])
def test_with_libnvrtc_missing_cupy_is_unusable_and_says_why(
    fresh_probe: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, at: str
) -> None:
    fresh_probe.setitem(sys.modules, "cupy", _cupy_with(_Nvrtc(_missing_libnvrtc(), at=at)))
    with caplog.at_level(logging.DEBUG, logger="kernelpick.kernels"):
        assert cupy_usable() is False
        assert cupy_usable() is False  # cached: probed and logged once
    reason = cupy_unusable_reason()
    assert reason is not None
    assert reason.startswith("NVRTC cannot compile a kernel (DynamicLibNotFoundError: ")
    assert "libnvrtc" in reason
    assert "\n" not in reason
    records = [r for r in caplog.records if r.name == "kernelpick.kernels"]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.WARNING, f"cupy is not usable: {reason}")
    ]


@pytest.mark.parametrize(
    "error",
    [
        _compile_failed,
        # cupy 13 when libnvrtc is missing (its SoftLink raises RuntimeError)
        lambda: RuntimeError("CuPy failed to load libnvrtc.so.12: OSError: cannot open"),
        lambda: OSError("libnvrtc-builtins.so.12.8: cannot open shared object file"),
    ],
    ids=["NVRTCError", "cupy-13-missing-library", "OSError"],
)
def test_with_a_device_but_a_failing_compile_cupy_is_unusable(
    fresh_probe: pytest.MonkeyPatch, error: Callable[[], BaseException]
) -> None:
    nvrtc = _Nvrtc(error())
    fresh_probe.setitem(sys.modules, "cupy", _cupy_with(nvrtc))
    assert cupy_usable() is False
    reason = cupy_unusable_reason()
    assert reason is not None
    assert reason.startswith(f"NVRTC cannot compile a kernel ({type(error()).__name__}")
    assert nvrtc.calls[-1] == "destroyProgram"  # the program is freed on failure too


def test_an_error_the_probe_does_not_expect_is_not_swallowed(
    fresh_probe: pytest.MonkeyPatch,
) -> None:
    fresh_probe.setitem(sys.modules, "cupy", _cupy_with(_Nvrtc(ValueError("a bug"))))
    with pytest.raises(ValueError, match="a bug"):
        cupy_usable()


def test_without_a_device_nvrtc_is_not_asked(fresh_probe: pytest.MonkeyPatch) -> None:
    nvrtc = _Nvrtc()
    fresh_probe.setitem(sys.modules, "cupy", _cupy_with(nvrtc, devices=0))
    assert cupy_usable() is False
    assert cupy_unusable_reason() == "the CUDA driver sees no device"
    assert nvrtc.calls == []


def test_an_unusable_cupy_turns_the_cupy_kernels_down_naming_nvrtc() -> None:
    caps = attrs.evolve(kp.device_profile("h100"), libraries=frozenset())
    decision = kp.choose(caps, kp.quant_config("fp8_weight_only", weight_shape=(4096, 4096)))
    assert isinstance(decision, kp.Selected)
    cupy = next(v for v in decision.trace if v.kernel == "cuda_w8a16_cupy")
    assert [r.render() for r in cupy.reasons] == [
        "requires cupy; cupy is not usable "
        "(not installed, no driver, or NVRTC cannot compile a kernel)"
    ]
