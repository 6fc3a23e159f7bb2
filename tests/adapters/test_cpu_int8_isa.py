"""torch's CPU ``_int_mm`` (oneDNN's int8 GEMM) is exact only with an int8 dot product
(VNNI, AMX): without one, oneDNN sums u8 x s8 pairs in saturating int16, and the int32
sums come out wrong, silently. So ``cpu_int8_int_mm`` needs ``INT8_DOT_ISA``, and the CPU
probe drops those flags where ``ONEDNN_MAX_CPU_ISA`` keeps oneDNN from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.adapters.cpu._device import usable_isa
from kernelpick.core import FEATURE_CPP_TOOLCHAIN, CpuArch
from kernelpick.core._catalog_facts import INT8_DOT_ISA

ROOT = Path(__file__).resolve().parents[2]
# AVX2, FMA, F16C: no int8 dot product; and no C++ toolchain, so that cpu_int8_gemm (the
# compiled kernel, ahead of _int_mm wherever it builds) leaves these rules to decide.
PROFILE = kp.device_profile("cpu")
CPU = attrs.evolve(PROFILE, features=PROFILE.features - {FEATURE_CPP_TOOLCHAIN})
INT8 = kp.quant_config("int8_per_channel", weight_shape=(64, 128))
EXTRA = ["avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_int8"]


def _with(*flags: str) -> kp.DeviceCaps:
    arch = CPU.arch
    assert isinstance(arch, CpuArch)
    return attrs.evolve(CPU, arch=attrs.evolve(arch, isa=arch.isa | set(flags)))


def _selected(caps: kp.DeviceCaps) -> str:
    decision = kp.choose(caps, INT8, kp.Policy())
    assert isinstance(decision, kp.Selected)
    return decision.kernel


@pytest.mark.parametrize(
    ("flags", "kernel"),
    [
        ((), "cpu_dequant_reference"),  # Haswell, Zen 1-3
        (("avx512f", "avx512bw", "avx512vl"), "cpu_dequant_reference"),  # Skylake-SP
        (("avx_vnni",), "cpu_int8_int_mm"),  # Alder Lake
        (("avx512f", "avx512bw", "avx512vl", "avx512_vnni"), "cpu_int8_int_mm"),  # Ice Lake
        (("amx_int8",), "cpu_int8_int_mm"),  # Sapphire Rapids
    ],
)
def test_cpu_int8_int_mm_runs_only_with_an_int8_dot_product(
    flags: tuple[str, ...], kernel: str
) -> None:
    assert _selected(_with(*flags)) == kernel


def test_the_reason_names_the_instructions_and_what_the_cpu_lacks() -> None:
    decision = kp.choose(CPU, INT8, kp.Policy())
    [reason] = [r for v in decision.trace if v.kernel == "cpu_int8_int_mm" for r in v.reasons]
    assert reason.code is kp.RejectCode.CPU_ISA
    assert reason.needed == "one of amx_int8, avx512_vnni, avx_vnni"
    assert reason.found == "x86_64 CPU has none of them"
    assert INT8_DOT_ISA.render() == "CPU with one of amx_int8, avx512_vnni, avx_vnni"
    gpu = INT8_DOT_ISA.check(kp.device_profile("h100"), INT8)
    assert gpu is not None
    assert gpu.found.startswith("device is not a CPU")


@given(st.sets(st.sampled_from(EXTRA)))
def test_int8_dot_rule_selects_int_mm_iff_the_cpu_has_vnni_or_amx(flags: set[str]) -> None:
    expected = "cpu_int8_int_mm" if flags & INT8_DOT_ISA.flags else "cpu_dequant_reference"
    assert _selected(_with(*flags)) == expected


@given(st.sets(st.sampled_from(EXTRA)))
def test_with_a_toolchain_the_compiled_int8_kernel_is_selected_whatever_the_dot_product(
    flags: set[str],
) -> None:
    caps = _with(*flags)
    assert _selected(attrs.evolve(caps, features=caps.features | {FEATURE_CPP_TOOLCHAIN})) == (
        "cpu_int8_gemm"
    )


@pytest.mark.parametrize(
    ("environ", "kept"),
    [
        ({}, {"avx512_vnni", "avx_vnni", "amx_int8"}),
        ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, set()),
        ({"ONEDNN_MAX_CPU_ISA": "avx512_core"}, set()),
        ({"DNNL_MAX_CPU_ISA": "AVX2"}, set()),  # oneDNN's old name
        # Neither VNNI level contains the other: a Cascade Lake capped at AVX2_VNNI, or an
        # Alder Lake capped at AVX512_CORE_VNNI, runs plain AVX2.
        ({"ONEDNN_MAX_CPU_ISA": "AVX2_VNNI"}, {"avx_vnni"}),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}, {"avx512_vnni"}),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, {"avx512_vnni", "avx_vnni", "amx_int8"}),
        ({"ONEDNN_MAX_CPU_ISA": "DEFAULT"}, {"avx512_vnni", "avx_vnni", "amx_int8"}),
        ({"ONEDNN_MAX_CPU_ISA": "SOMETHING_NEW"}, set()),  # unknown: none, to be safe
    ],
)
def test_a_onednn_cap_keeps_only_the_int8_dot_products_it_lets_onednn_use(
    environ: dict[str, str], kept: set[str]
) -> None:
    flags = ["avx2", "avx512_vnni", "avx_vnni", "amx_int8", "fma"]
    assert usable_isa(flags, environ) == sorted({"avx2", "fma"} | kept)


SCRIPT = textwrap.dedent(
    """
    import json, torch
    import kernelpick as kp
    from kernelpick.integration import quantize_model

    torch.manual_seed(0)
    a = torch.randint(-128, 128, (32, 256), dtype=torch.int8)
    b = torch.randint(-128, 128, (256, 64), dtype=torch.int8)
    wrong = int((torch._int_mm(a, b).long() != a.long() @ b.long()).sum())
    model = torch.nn.Sequential(torch.nn.Linear(256, 64))
    x = torch.randn(8, 256)
    with torch.no_grad():
        reference = model(x)
        # The compiled int8 kernel would be chosen first: off, so _int_mm's rule decides.
        policy = kp.Policy(disabled={"cpu_int8_gemm"})
        report = quantize_model(model, "int8_per_channel", policy=policy, progress=False)
        error = float((model(x) - reference).norm() / reference.norm())
    print(json.dumps({"int_mm_wrong": wrong, "kernel": report.layers[0].kernel, "error": error}))
    """
)


def _run(environ: dict[str, str]) -> dict[str, object]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env={**env, **environ}, cwd=ROOT, capture_output=True,
        text=True, timeout=300, check=True,
    )  # fmt: skip
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.slow
def test_without_an_int8_dot_product_int_mm_is_wrong_and_never_selected() -> None:
    """Under ONEDNN_MAX_CPU_ISA=AVX2, as on every CPU without VNNI: _int_mm's sums are wrong
    (if they stop being, torch fixed it and the rule may go), the probe reports no VNNI,
    and quantize_model picks the reference kernel, within int8's accuracy. Where the host
    has VNNI and nothing caps oneDNN, _int_mm is exact and selected."""
    capped = _run({"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert capped["int_mm_wrong"] != 0
    assert capped["kernel"] == "cpu_dequant_reference"
    assert isinstance(capped["error"], float)
    assert capped["error"] < 0.03
    host = kp.probe("cpu").arch
    assert isinstance(host, CpuArch)
    free = _run({})
    if host.isa & INT8_DOT_ISA.flags:
        assert free["int_mm_wrong"] == 0
        assert free["kernel"] == "cpu_int8_int_mm"
    else:
        assert free["kernel"] == "cpu_dequant_reference"
    assert isinstance(free["error"], float)
    assert free["error"] < 0.03


SAPPHIRE_RAPIDS = (
    "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: avx2 fma f16c "
    "avx512f avx512bw avx512vl avx512_bf16 avx512_vnni amx_bf16 amx_int8 amx_tile\n"
)


@pytest.mark.parametrize("granted", [True, False])
def test_amx_units_count_only_where_linux_grants_this_process_their_tiles(
    granted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cpuinfo lists AMX whatever the kernel lends; an older kernel or a seccomp filter that
    # refuses arch_prctl's request leaves oneDNN and the avx512_amx build without them.
    from kernelpick.adapters.cpu import _device

    monkeypatch.setattr(_device, "_read_cpuinfo", lambda: SAPPHIRE_RAPIDS)
    monkeypatch.setattr(_device, "_amx_granted", lambda: granted)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    listed = _device.read_properties(0)["isa"]
    assert isinstance(listed, list)
    isa = set(listed)
    amx = {"amx_bf16", "amx_int8", "amx_tile"}
    assert isa & amx == (amx if granted else set[str]())
    assert {"avx512_bf16", "avx512_vnni"} <= isa
