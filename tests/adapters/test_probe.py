"""Device probing (docs/design.md#layers-and-data-flow): pure translates over recorded and
hand-written device properties, the routing of a device request, and the live CPU probe of
this machine."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import subprocess
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import torch

import kernelpick as kp
from kernelpick.adapters import _probe as any_probe
from kernelpick.adapters.cpu import _device as cpu_device
from kernelpick.adapters.cuda import _device as cuda_device
from kernelpick.adapters.rocm import _device as rocm_device
from kernelpick.core import (
    CPP_TOOLCHAIN_PARTS,
    FEATURE_BUILD_ROOT,
    FEATURE_CPP_TOOLCHAIN,
    FEATURE_CXX_COMPILER,
    FEATURE_NINJA,
    FEATURE_SCALED_MM,
    FEATURE_SCALED_MM_ROWWISE,
    Arch,
    CpuArch,
    CudaArch,
    Dtype,
    RocmArch,
    Version,
)
from kernelpick.kernels._cupy_runtime import cupy_unusable_reason, cupy_usable

FIXTURES = Path(__file__).parents[1] / "fixtures" / "devices"
META_KEYS = ("_source", "platform")
TRANSLATE: dict[str, Callable[[Mapping[str, object]], kp.DeviceCaps]] = {
    "cpu": cpu_device.translate,
    "cuda": cuda_device.translate,
    "rocm": rocm_device.translate,
}
GPU_AVAILABLE = torch.cuda.is_available()
BOTH_FEATURES = frozenset({FEATURE_SCALED_MM, FEATURE_SCALED_MM_ROWWISE})
ALL_CPU_FEATURES = BOTH_FEATURES | {FEATURE_CPP_TOOLCHAIN}
FN = Dtype.FLOAT8_E4M3FN
FNUZ = Dtype.FLOAT8_E4M3FNUZ


def _fixture(stem: str) -> dict[str, object]:
    data = json.loads((FIXTURES / f"{stem}.json").read_text())
    assert isinstance(data, dict)
    return data


def _props(stem: str) -> dict[str, object]:
    """A fixture as read_properties returns it: without the provenance keys."""
    return {k: v for k, v in _fixture(stem).items() if k not in META_KEYS}


def _translate(stem: str) -> kp.DeviceCaps:
    return TRANSLATE[str(_fixture(stem)["platform"])](_props(stem))


# --- the fixtures themselves ---------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_every_fixture_says_where_it_came_from_and_which_platform(path: Path) -> None:
    data = _fixture(path.stem)
    assert data["platform"] in TRANSLATE
    source = data["_source"]
    assert isinstance(source, str)
    if path.stem == "cpu":
        assert source.startswith("Recorded by kernelpick.adapters.cpu.read_properties(0)")
    else:
        assert "by hand from public specifications" in source
        assert "not recorded on a device" in source


def test_the_cpu_fixture_has_exactly_the_keys_read_properties_returns() -> None:
    assert set(_props("cpu")) == set(cpu_device.read_properties(0))


# --- translate: examples -------------------------------------------------------------------

Example = tuple[str, kp.Platform, Arch, Dtype, Version, set[str], set[str], str]
EXAMPLES: list[Example] = [
    # stem, platform, arch, fp8, toolkit, libraries, features, profile
    ("t4", kp.Platform.CUDA, CudaArch(7, 5), FN, Version(13, 0), {"cupy"}, set(), "t4"),
    ("a100", kp.Platform.CUDA, CudaArch(8, 0), FN, Version(13, 0), {"cupy"}, set(), "a100"),
    ("h100", kp.Platform.CUDA, CudaArch(9, 0), FN, Version(13, 0), {"cupy"}, set(), "h100"),
    (
        "mi300x",
        kp.Platform.ROCM,
        RocmArch("gfx942"),
        FNUZ,
        Version(7, 2, 26015),
        set(),
        set(),
        "mi300x",
    ),
    (
        "mi355x",
        kp.Platform.ROCM,
        RocmArch("gfx950"),
        FN,
        Version(7, 2, 26015),
        set(),
        set(),
        "mi355x",
    ),
]


@pytest.mark.parametrize(
    ("stem", "platform", "arch", "fp8", "toolkit", "libraries", "features", "profile"),
    EXAMPLES,
    ids=[row[0] for row in EXAMPLES],
)
def test_translate_gpu_fixture(
    stem: str,
    platform: kp.Platform,
    arch: Arch,
    fp8: Dtype,
    toolkit: Version,
    libraries: set[str],
    features: set[str],
    profile: str,
) -> None:
    caps = _translate(stem)
    assert caps.platform is platform
    assert caps.arch == arch
    assert caps.fp8_format is fp8
    assert caps.toolkit_version == toolkit
    assert caps.libraries == libraries
    assert caps.features == features
    assert caps.torch_version == Version(2, 13)
    assert caps.name == _fixture(stem)["name"]
    expected = kp.device_profile(profile)
    assert (caps.platform, caps.arch) == (expected.platform, expected.arch)


def test_translate_cpu_fixture() -> None:
    caps = _translate("cpu")
    props = _props("cpu")
    assert caps.platform is kp.Platform.CPU
    assert caps.arch == CpuArch(str(props["machine"]), frozenset(_strings(props["isa"])))
    assert caps.fp8_format is FN
    assert caps.toolkit_version is None
    assert caps.libraries == frozenset()
    # The recording machine runs torch 2.13 and has a C++ compiler and ninja.
    assert caps.features == ALL_CPU_FEATURES
    # The profile describes an AVX2 machine; the recorded one has at least that.
    profile = kp.device_profile("cpu")
    assert isinstance(profile.arch, CpuArch)
    assert isinstance(caps.arch, CpuArch)
    assert (caps.platform, caps.arch.machine) == (profile.platform, profile.arch.machine)
    assert profile.arch.isa <= caps.arch.isa


ALL_PARTS = dict.fromkeys(CPP_TOOLCHAIN_PARTS, True)
NO_PARTS = dict.fromkeys(CPP_TOOLCHAIN_PARTS, False)


@pytest.mark.parametrize(
    ("scaled_mm", "rowwise", "parts", "features"),
    [
        (True, True, ALL_PARTS, ALL_CPU_FEATURES),
        (True, True, NO_PARTS, BOTH_FEATURES),
        (True, False, NO_PARTS, {FEATURE_SCALED_MM}),
        (False, True, NO_PARTS, {FEATURE_SCALED_MM_ROWWISE}),
        (False, False, ALL_PARTS, {FEATURE_CPP_TOOLCHAIN}),
        (False, False, NO_PARTS, set()),
        # A toolchain short of one part: the parts found, so the reason names the one missing.
        (True, True, {**ALL_PARTS, FEATURE_CXX_COMPILER: False},
         BOTH_FEATURES | {FEATURE_NINJA, FEATURE_BUILD_ROOT}),
        (False, False, {**ALL_PARTS, FEATURE_NINJA: False},
         {FEATURE_CXX_COMPILER, FEATURE_BUILD_ROOT}),
        (False, False, {**NO_PARTS, FEATURE_NINJA: True}, {FEATURE_NINJA}),
    ],
)  # fmt: skip
def test_cpu_features_follow_the_probed_booleans(
    scaled_mm: bool, rowwise: bool, parts: dict[str, bool], features: set[str]
) -> None:
    props = {**_props("cpu"), "scaled_mm": scaled_mm, "scaled_mm_rowwise": rowwise, **parts}
    assert cpu_device.translate(props).features == features


def _strings(value: object) -> list[str]:
    assert isinstance(value, list)
    return [str(item) for item in value]


# --- translate: rejections -----------------------------------------------------------------

REQUIRED = {
    "cpu": [
        "machine",
        "name",
        "isa",
        "torch_version",
        "scaled_mm",
        "scaled_mm_rowwise",
        *CPP_TOOLCHAIN_PARTS,
    ],
    "t4": ["name", "major", "minor", "torch_version", "cuda_version", "libraries"],
    "mi300x": ["name", "gcnArchName", "torch_version", "hip_version"],
}


@pytest.mark.parametrize(
    ("stem", "key"), [(stem, key) for stem, keys in REQUIRED.items() for key in keys]
)
def test_translate_rejects_a_missing_key_naming_it(stem: str, key: str) -> None:
    props = _props(stem)
    del props[key]
    translate = TRANSLATE[str(_fixture(stem)["platform"])]
    with pytest.raises(kp.InvalidValueError, match=repr(key)) as info:
        translate(props)
    assert info.value.value is None


@pytest.mark.parametrize(
    ("stem", "key", "bad"),
    [
        ("cpu", "machine", 64),
        ("cpu", "isa", "avx2"),
        ("cpu", "isa", ["avx2", 3]),
        ("cpu", "scaled_mm", "yes"),
        ("cpu", "scaled_mm_rowwise", 1),
        ("cpu", "cxx_compiler", "true"),
        ("cpu", "ninja", None),
        ("cpu", "writable_build_root", 0),
        ("cpu", "torch_version", 2.13),
        ("t4", "name", None),
        ("t4", "major", "7"),
        ("t4", "minor", True),
        ("t4", "minor", -1),
        ("t4", "libraries", "cupy"),
        ("t4", "cuda_version", 12.8),
        ("mi300x", "gcnArchName", 942),
        ("mi300x", "hip_version", 7),
    ],
)
def test_translate_rejects_a_wrong_type_naming_key_and_value(
    stem: str, key: str, bad: object
) -> None:
    props = {**_props(stem), key: bad}
    translate = TRANSLATE[str(_fixture(stem)["platform"])]
    with pytest.raises(kp.InvalidValueError, match=repr(key)) as info:
        translate(props)
    assert info.value.value == bad


@pytest.mark.parametrize("bad", ["gfx", "gfx94", "", "sramecc+:gfx942", "942"])
def test_translate_rejects_a_malformed_gcn_arch_name(bad: str) -> None:
    with pytest.raises(kp.InvalidValueError, match="gcnArchName") as info:
        rocm_device.translate({**_props("mi300x"), "gcnArchName": bad})
    assert info.value.value == bad
    assert "gfx942" in info.value.expected


def test_translate_rejects_a_torch_build_without_cuda() -> None:
    with pytest.raises(kp.InvalidValueError, match="not a CUDA build") as info:
        cuda_device.translate({**_props("t4"), "cuda_version": None})
    assert info.value.what == "CUDA property 'cuda_version'"


def test_translate_rejects_a_torch_build_without_rocm() -> None:
    with pytest.raises(kp.InvalidValueError, match="not a ROCm build") as info:
        rocm_device.translate({**_props("mi300x"), "hip_version": None})
    assert info.value.what == "ROCm property 'hip_version'"


def test_translate_ignores_properties_it_does_not_read() -> None:
    props = {**_props("h100"), "total_memory": "lots", "extra": object()}
    assert cuda_device.translate(props) == _translate("h100")


# --- cpuinfo parsing -------------------------------------------------------------------------

X86 = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx f16c avx2 fma avx512f avx512bw avx512vl avx512vbmi avx512_vbmi2 \
avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2
"""
ARM = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes sha2 crc32 atomics asimdhp asimddp sve sve2 i8mm bf16
CPU implementer\t: 0x41
"""


@pytest.mark.parametrize(
    ("text", "name", "isa"),
    [
        (
            X86,
            "Intel(R) Xeon(R) Platinum 8480+",
            [
                "amx_bf16",
                "amx_int8",
                "amx_tile",
                "avx2",
                "avx512_bf16",
                "avx512_fp16",
                "avx512bw",
                "avx512f",
                "avx512vbmi",
                "avx512vl",
                "f16c",
                "fma",
            ],
        ),
        (ARM, None, ["asimd", "asimddp", "asimdhp", "bf16", "i8mm", "sve", "sve2"]),
        ("", None, []),
        ("garbage without colons\n", None, []),
    ],
    ids=["x86-first-processor", "aarch64-features", "empty", "garbage"],
)
def test_parse_cpuinfo(text: str, name: str | None, isa: list[str]) -> None:
    assert cpu_device.parse_cpuinfo(text) == (name, isa)


# --- routing ---------------------------------------------------------------------------------

CPU = kp.Platform.CPU
CUDA = kp.Platform.CUDA
ROCM = kp.Platform.ROCM

ROUTES = [
    # device, cuda_available, is_hip, current, expected
    (None, False, False, 0, (CPU, 0)),
    (None, True, False, 3, (CUDA, 3)),
    (None, True, True, 1, (ROCM, 1)),
    ("auto", False, False, 0, (CPU, 0)),
    (" AUTO ", True, False, 2, (CUDA, 2)),
    ("cpu", True, False, 2, (CPU, 0)),
    ("cpu", True, True, 2, (CPU, 0)),
    ("cuda", True, False, 2, (CUDA, 2)),
    ("cuda", True, True, 0, (ROCM, 0)),
    ("cuda:1", True, False, 0, (CUDA, 1)),
    ("CUDA:7", True, True, 0, (ROCM, 7)),
    (0, True, False, 5, (CUDA, 0)),
    (2, True, True, 0, (ROCM, 2)),
    (torch.device("cpu"), True, False, 1, (CPU, 0)),
    (torch.device("cuda"), True, False, 1, (CUDA, 1)),
    (torch.device("cuda", 3), True, True, 1, (ROCM, 3)),
]


@pytest.mark.parametrize(("device", "available", "hip", "current", "expected"), ROUTES)
def test_route_device(
    device: object,
    available: bool,
    hip: bool,
    current: int,
    expected: tuple[kp.Platform, int],
) -> None:
    assert any_probe.route_device(device, available, hip, current) == expected


@pytest.mark.parametrize("device", ["cuda", "cuda:0", 0, 1, torch.device("cuda", 0)])
def test_route_device_rejects_a_gpu_request_without_a_gpu(device: object) -> None:
    with pytest.raises(kp.InvalidValueError, match="no GPU is available") as info:
        any_probe.route_device(device, False, False, 0)
    assert info.value.value == device


@pytest.mark.parametrize(
    ("device", "error"),
    [
        ("gpu", kp.UnknownNameError),
        ("cdua", kp.UnknownNameError),
        ("cuda:-1", kp.UnknownNameError),
        ("cuda:x", kp.UnknownNameError),
        ("", kp.UnknownNameError),
        (-1, kp.InvalidValueError),
        (True, kp.InvalidValueError),
        (1.0, kp.InvalidValueError),
        (torch.device("meta"), kp.InvalidValueError),
        ([0], kp.InvalidValueError),
    ],
)
def test_route_device_rejects_what_it_does_not_accept(
    device: object, error: type[kp.KernelpickError]
) -> None:
    with pytest.raises(error) as info:
        any_probe.route_device(device, True, False, 0)
    assert repr(device) in str(info.value)
    assert "cuda" in str(info.value)  # says what is accepted


def test_an_unknown_device_name_suggests_the_closest() -> None:
    with pytest.raises(kp.UnknownNameError) as info:
        any_probe.route_device("cdua", True, False, 0)
    assert info.value.closest == "cuda"


# --- the live CPU probe of this machine ------------------------------------------------------


@pytest.mark.skipif(GPU_AVAILABLE, reason="None and 'auto' mean the GPU here")
@pytest.mark.parametrize("device", [None, "auto"])
def test_probe_device_defaults_to_the_cpu_without_a_gpu(device: object) -> None:
    assert any_probe.probe_device(device) is cpu_device.probe()


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_probe_device_cpu_features_come_from_the_trial(device: object) -> None:
    caps = any_probe.probe_device(device)
    props = cpu_device.read_properties(0)
    assert caps.platform is kp.Platform.CPU
    assert (FEATURE_SCALED_MM in caps.features) is props["scaled_mm"]
    assert (FEATURE_SCALED_MM_ROWWISE in caps.features) is props["scaled_mm_rowwise"]
    assert (FEATURE_CPP_TOOLCHAIN in caps.features) is all(props[p] for p in CPP_TOOLCHAIN_PARTS)
    assert caps == cpu_device.translate(props)
    if caps.torch_version >= Version(2, 13):
        # torch 2.13's CPU build runs both (docs/design.md#the-catalog-and-its-hardware-facts)
        assert caps.features >= BOTH_FEATURES


@pytest.mark.skipif(GPU_AVAILABLE, reason="a GPU is present")
@pytest.mark.parametrize("device", ["cuda:0", 0])
def test_probe_device_rejects_a_gpu_request_without_a_gpu(device: object) -> None:
    with pytest.raises(kp.InvalidValueError, match="no GPU is available"):
        any_probe.probe_device(device)


def test_cpu_probe_is_cached_and_only_index_0_exists() -> None:
    assert cpu_device.probe() is cpu_device.probe()
    assert cpu_device.probe(0) is cpu_device.probe()
    for bad in (1, -1, True):
        with pytest.raises(kp.InvalidValueError, match="CPU device index"):
            cpu_device.probe(bad)
        with pytest.raises(kp.InvalidValueError, match="CPU device index"):
            cpu_device.read_properties(bad)


# --- the GPU read paths, with torch.cuda faked (index 1 of 2 devices) --------------------------


def _fake_device(props: Mapping[str, object]) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{k: v for k, v in props.items() if k not in META_KEYS})


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Two fake GPUs in torch.cuda; the probe caches are emptied before and after."""
    for module in (cuda_device, rocm_device):
        module._probe.cache_clear()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    yield monkeypatch
    for module in (cuda_device, rocm_device):
        module._probe.cache_clear()


def _install(monkeypatch: pytest.MonkeyPatch, stems: list[str], torch_version: str) -> None:
    devices = [_fake_device(_fixture(stem)) for stem in stems]

    def get_device_properties(index: int) -> types.SimpleNamespace:
        return devices[index]

    monkeypatch.setattr(torch.cuda, "get_device_properties", get_device_properties)
    monkeypatch.setattr(torch, "__version__", torch_version)


def test_cuda_read_properties_reads_the_index_it_is_given(fake_gpus: pytest.MonkeyPatch) -> None:
    _install(fake_gpus, ["a100", "t4"], "2.13.0+cu130")
    fake_gpus.setattr(torch.version, "cuda", "13.0")
    fake_gpus.setattr(cuda_device, "cupy_usable", lambda: True)
    assert cuda_device.read_properties(1) == _props("t4")
    assert cuda_device.probe(1) == _translate("t4")
    assert cuda_device.probe(1) is cuda_device.probe(1)
    assert cuda_device.probe(0) == _translate("a100")
    fake_gpus.setattr(cuda_device, "cupy_usable", lambda: False)
    assert cuda_device.read_properties(1)["libraries"] == []


def test_probe_device_routes_the_current_gpu_to_cuda(fake_gpus: pytest.MonkeyPatch) -> None:
    _install(fake_gpus, ["a100", "t4"], "2.13.0+cu130")
    fake_gpus.setattr(torch.version, "cuda", "13.0")
    fake_gpus.setattr(torch.version, "hip", None)
    fake_gpus.setattr(cuda_device, "cupy_usable", lambda: True)
    fake_gpus.setattr(torch.cuda, "is_available", lambda: True)
    fake_gpus.setattr(torch.cuda, "current_device", lambda: 1)
    assert any_probe.probe_device() == _translate("t4")
    assert any_probe.probe_device("cuda:0") == _translate("a100")
    with pytest.raises(kp.InvalidValueError, match=r"from 0 to 1") as info:
        any_probe.probe_device("cuda:2")
    assert info.value.value == 2


def test_probe_device_routes_the_current_gpu_to_rocm(fake_gpus: pytest.MonkeyPatch) -> None:
    _install(fake_gpus, ["mi355x", "mi300x"], "2.13.0+rocm7.2")
    fake_gpus.setattr(torch.version, "hip", "7.2.26015")
    fake_gpus.setattr(torch.cuda, "is_available", lambda: True)
    fake_gpus.setattr(torch.cuda, "current_device", lambda: 1)
    assert rocm_device.read_properties(1) == _props("mi300x")
    assert any_probe.probe_device() == _translate("mi300x")
    assert any_probe.probe_device(0) == _translate("mi355x")
    assert rocm_device.probe(1) is rocm_device.probe(1)


@pytest.mark.parametrize("bad", [-1, 2, True])
@pytest.mark.parametrize("module", [cuda_device, rocm_device], ids=["cuda", "rocm"])
def test_gpu_read_properties_rejects_an_index_out_of_range(
    fake_gpus: pytest.MonkeyPatch, module: types.ModuleType, bad: object
) -> None:
    _install(fake_gpus, ["t4", "t4"], "2.13.0+cu130")
    with pytest.raises(kp.InvalidValueError, match=r"from 0 to 1") as info:
        module.read_properties(bad)
    assert info.value.value == bad
    with pytest.raises(kp.InvalidValueError, match=r"from 0 to 1"):
        module.probe(bad)


@pytest.mark.skipif(GPU_AVAILABLE, reason="a GPU is present")
def test_gpu_read_properties_without_a_gpu_says_none_is_visible() -> None:
    with pytest.raises(kp.InvalidValueError, match="no CUDA device is visible"):
        cuda_device.read_properties(0)
    with pytest.raises(kp.InvalidValueError, match="no ROCm device is visible"):
        rocm_device.read_properties(0)


# --- cupy: usable only when it imports, a driver answers and NVRTC compiles; never eager ----------
# (NVRTC failures: tests/kernels/test_cupy_runtime.py)


class _CompilingNvrtc:
    """cupy's NVRTC binding (cupy.cuda.nvrtc) where NVRTC compiles."""

    def createProgram(self, *args: object) -> int:
        return 1

    def compileProgram(self, program: int, options: tuple[str, ...]) -> None:
        pass

    def getPTX(self, program: int) -> bytes:
        return b".version 8.0\n.target sm_75\n"

    def destroyProgram(self, program: int) -> None:
        pass


def _fake_cupy(get_device_count: Callable[[], int]) -> types.ModuleType:
    cupy = types.ModuleType("cupy")
    cupy.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    runtime = types.SimpleNamespace(getDeviceCount=get_device_count)
    cupy.cuda = types.SimpleNamespace(runtime=runtime, nvrtc=_CompilingNvrtc())  # type: ignore[attr-defined]
    return cupy


def _no_driver() -> int:
    raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")


@pytest.fixture
def fresh_cupy_probe() -> Iterator[None]:
    """The cupy probe is cached per process: forget it before and after."""
    cupy_unusable_reason.cache_clear()
    yield
    cupy_unusable_reason.cache_clear()


@pytest.mark.usefixtures("fresh_cupy_probe")
@pytest.mark.parametrize(
    ("count", "usable"), [(lambda: 2, True), (lambda: 0, False), (_no_driver, False)]
)
def test_cupy_usable_asks_the_driver(
    monkeypatch: pytest.MonkeyPatch, count: Callable[[], int], usable: bool
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(count))
    assert cupy_usable() is usable


@pytest.mark.usefixtures("fresh_cupy_probe")
def test_cupy_unusable_when_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert cupy_usable() is False
    assert cupy_unusable_reason() == "cupy is not installed"


def test_importing_the_probes_does_not_import_cupy() -> None:
    code = (
        "import sys, kernelpick.adapters.cuda._device, kernelpick.adapters._probe; "
        "sys.exit('cupy' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
