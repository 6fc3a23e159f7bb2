"""Property tests of the pure decision, one test per rule (docs/design.md#selection-rules,
over the values of docs/design.md#vocabulary and the catalog of
docs/design.md#the-catalog-and-its-hardware-facts)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TypeVar

import attrs
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.core import (
    FEATURE_CPP_TOOLCHAIN,
    SCHEMA_VERSION,
    CpuArch,
    CudaArch,
    GroupShape,
    RocmArch,
    Verdict,
    Version,
    evaluate,
)

CATALOG = kp.default_catalog()
IDS = CATALOG.ids
# The same kernels, least preferred first: weight-only kernels then come before the W8A8
# ones, so "prefer a non-degraded kernel" and "catalog order" are exercised for real.
CATALOGS = {"default": CATALOG, "reversed": kp.Catalog(tuple(reversed(CATALOG.kernels)))}
PROFILES = kp.device_profiles()
HEADER = "Failed to find a kernel that can implement the ScaledMM linear layer. Reasons:"
PTPC_4096 = kp.quant_config(kp.Scheme.FP8_PER_CHANNEL, weight_shape=(4096, 4096))
# Block FP8 is SM 9.x-only (its hint names CUDA archs with their toolkit): found by a seed.
BLOCK_128 = kp.quant_config("fp8_block", weight_shape=(128, 128), out_dtype="bfloat16")

PROPERTY_SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@attrs.frozen
class Question:
    """One call to ``choose``; profile and catalog by name, for readable failure reports."""

    profile: str
    config: kp.QuantConfig
    policy: kp.Policy
    order: str = "default"

    @property
    def caps(self) -> kp.DeviceCaps:
        return PROFILES[self.profile]

    @property
    def catalog(self) -> kp.Catalog:
        return CATALOGS[self.order]

    @property
    def platform_ids(self) -> tuple[str, ...]:
        return self.catalog.ids_for(self.caps.platform)

    def ask(self, policy: kp.Policy) -> kp.Decision:
        return kp.choose(self.caps, self.config, policy, self.catalog)

    def choose(self) -> kp.Decision:
        return self.ask(self.policy)


def make_question(
    profile: str,
    name: kp.Scheme,
    shape: tuple[int, int] = (4096, 4096),
    *,
    out_dtype: str = "bfloat16",
    bias: bool = False,
    disabled: frozenset[str] = frozenset(),
    force: str | None = None,
    strict: bool = False,
    order: str = "default",
) -> Question:
    config = kp.quant_config(name, weight_shape=shape, out_dtype=out_dtype, bias=bias)
    return Question(profile, config, kp.Policy(disabled, force, strict), order)


# Unaligned extents and multiples of 16, both over 1..20000.
extents: st.SearchStrategy[int] = st.one_of(
    st.integers(min_value=1, max_value=20000),
    st.integers(min_value=1, max_value=20000 // 16).map(lambda m: m * 16),
)
shapes: st.SearchStrategy[tuple[int, int]] = st.tuples(extents, extents)
profile_names: st.SearchStrategy[str] = st.sampled_from(sorted(PROFILES))
schemes: st.SearchStrategy[kp.Scheme] = st.sampled_from(list(kp.Scheme))
out_dtypes: st.SearchStrategy[str] = st.sampled_from(["bfloat16", "float16", "float32"])
kernel_ids: st.SearchStrategy[str] = st.sampled_from(IDS)
configs: st.SearchStrategy[kp.QuantConfig] = st.builds(
    lambda name, shape, out, bias: kp.quant_config(
        name, weight_shape=shape, out_dtype=out, bias=bias
    ),
    schemes,
    shapes,
    out_dtypes,
    st.booleans(),
)
policies: st.SearchStrategy[kp.Policy] = st.builds(
    lambda disabled, force, strict: kp.Policy(disabled, force, strict),
    st.frozensets(kernel_ids, max_size=len(IDS)),
    st.one_of(st.none(), kernel_ids),
    st.booleans(),
)
# Mostly small policies, so that plenty of questions end in a selection.
light_policies: st.SearchStrategy[kp.Policy] = st.one_of(
    st.just(kp.Policy()),
    st.builds(
        lambda disabled, strict: kp.Policy(disabled, None, strict),
        st.frozensets(kernel_ids, max_size=3),
        st.booleans(),
    ),
    policies,
)
orders: st.SearchStrategy[str] = st.sampled_from(sorted(CATALOGS))
questions: st.SearchStrategy[Question] = st.builds(
    Question, profile_names, configs, light_policies, orders
)

# The cases that matter most (the vLLM 61316 behaviours, docs/design.md#the-problem), run
# on every test run whatever hypothesis draws.
KEY_EXAMPLES = [
    make_question("t4", kp.Scheme.FP8_PER_CHANNEL),  # the vLLM 61316 config: Rejected
    make_question("a100", kp.Scheme.FP8_PER_TENSOR),  # W8A16 fallback, degraded
    make_question("a100", kp.Scheme.FP8_PER_TENSOR, strict=True),
    make_question("a100", kp.Scheme.FP8_WEIGHT_ONLY),  # W8A16, not degraded
    make_question("h100", kp.Scheme.FP8_PER_CHANNEL),
    make_question("h100", kp.Scheme.FP8_PER_CHANNEL, (4095, 4096)),  # unaligned
    make_question("mi300x", kp.Scheme.FP8_PER_CHANNEL, out_dtype="float16"),
    make_question("mi250x", kp.Scheme.FP8_PER_TENSOR_STATIC, bias=True),
    make_question("cpu", kp.Scheme.FP8_PER_CHANNEL, (1, 1)),
    make_question("h100", kp.Scheme.FP8_PER_CHANNEL, force="cuda_w8a16_torch"),
    make_question("h100", kp.Scheme.FP8_PER_CHANNEL, force="cpu_dequant_reference"),
    make_question("cpu", kp.Scheme.FP8_PER_CHANNEL, (32, 32), force="cuda_w8a16_cupy"),
    make_question("cpu", kp.Scheme.FP8_WEIGHT_ONLY, force="cpu_w8a16_reference"),
    # A forced weight-only kernel of another platform, for a per-token config, also disabled.
    make_question(
        "h100",
        kp.Scheme.FP8_PER_CHANNEL,
        disabled=frozenset({"rocm_w8a16_torch"}),
        force="rocm_w8a16_torch",
    ),
    make_question(
        "h100",
        kp.Scheme.FP8_PER_CHANNEL,
        disabled=frozenset({"cuda_rowwise_scaled_mm", "cpu_dequant_reference"}),
    ),
    make_question("l4", kp.Scheme.FP8_PER_TENSOR, disabled=frozenset(IDS)),
    # Least preferred first: a degraded W8A16 kernel precedes the viable W8A8 ones.
    make_question("h100", kp.Scheme.FP8_PER_TENSOR, order="reversed"),
    make_question("a100", kp.Scheme.FP8_PER_TENSOR, order="reversed", strict=True),
    make_question("mi300x", kp.Scheme.FP8_PER_CHANNEL, force="cuda_w8a16_cupy", order="reversed"),
]


TestFn = TypeVar("TestFn", bound=Callable[..., None])


def with_key_examples(test: TestFn) -> TestFn:
    for question in KEY_EXAMPLES:
        test = example(question=question)(test)
    return test


def codes(verdict: Verdict) -> list[kp.RejectCode]:
    return [reason.code for reason in verdict.reasons]


# --- the rules ---------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(question=questions)
@with_key_examples
def test_choose_never_raises_and_is_deterministic(question: Question) -> None:
    first = question.choose()
    assert isinstance(first, (kp.Selected, kp.Rejected))
    assert question.choose() == first
    # Equal values, not the same objects, ask the same question.
    twin = kp.choose(
        attrs.evolve(question.caps),
        attrs.evolve(question.config),
        kp.Policy(set(question.policy.disabled), question.policy.force, question.policy.strict),
        kp.Catalog(list(question.catalog.kernels)),
    )
    assert twin == first
    kp.clear_cache()
    assert question.choose() == first
    # The cached answer is the uncached evaluation.
    assert first.trace == evaluate(
        question.caps, question.config, question.policy, question.catalog
    )


@PROPERTY_SETTINGS
@given(question=questions)
@with_key_examples
def test_selected_kernel_is_first_ok_preferring_non_degraded(question: Question) -> None:
    decision = question.choose()
    ok = [v for v in decision.trace if v.ok]
    if not ok:
        assert isinstance(decision, kp.Rejected)
        return
    assert isinstance(decision, kp.Selected)
    chosen = [v for v in decision.trace if v.kernel == decision.kernel]
    assert len(chosen) == 1
    assert chosen[0].ok
    assert chosen[0].reasons == ()
    non_degraded = [v for v in ok if not v.degraded]
    expected = non_degraded[0] if non_degraded else ok[0]
    assert decision.kernel == expected.kernel
    assert decision.degraded is expected.degraded
    assert decision.alternatives == tuple(v.kernel for v in ok if v.kernel != decision.kernel)


@PROPERTY_SETTINGS
@given(question=questions)
@with_key_examples
def test_trace_covers_platform_in_order_and_marks_not_forced(question: Question) -> None:
    decision = question.choose()
    own = question.platform_ids
    assert own == tuple(s.id for s in question.catalog if s.platform is question.caps.platform)
    traced = tuple(v.kernel for v in decision.trace)
    force = question.policy.force
    if force is not None and force not in own:
        assert traced == (*own, force)
        last = decision.trace[-1]
        wrong = [r for r in last.reasons if r.code is kp.RejectCode.WRONG_PLATFORM]
        assert len(wrong) == 1
        assert wrong[0].needed == str(CATALOG.kernel(force).platform)
        assert wrong[0].found == str(question.caps.platform)
        assert last.kind is CATALOG.kernel(force).kind
        assert isinstance(decision, kp.Rejected)
    else:
        assert traced == own
    for verdict in decision.trace:
        assert verdict.kind is CATALOG.kernel(verdict.kernel).kind
        assert all(reason.kernel == verdict.kernel for reason in verdict.reasons)
        not_forced = [r for r in verdict.reasons if r.code is kp.RejectCode.NOT_FORCED]
        if force is None or verdict.kernel == force:
            assert not_forced == []
        else:
            assert len(not_forced) == 1
            assert not_forced[0].needed == force
    if isinstance(decision, kp.Selected) and force is not None:
        assert decision.kernel == force


@PROPERTY_SETTINGS
@given(question=questions)
@with_key_examples
def test_w8a16_never_serves_per_token_activations(question: Question) -> None:
    decision = question.choose()
    act = question.config.activation
    if act is None or act.scale.group != GroupShape.PER_TOKEN:
        return
    w8a16 = [v for v in decision.trace if v.kind is kp.KernelKind.W8A16]
    # Every platform has weight-only kernels, so the rule is always exercised here.
    assert w8a16
    for verdict in w8a16:
        assert not verdict.ok
        rule = [r for r in verdict.reasons if r.code is kp.RejectCode.WEIGHT_ONLY_ACTIVATION]
        assert len(rule) == 1
        assert "per-token" in rule[0].render()
    if isinstance(decision, kp.Selected):
        [selected] = [v for v in decision.trace if v.kernel == decision.kernel]
        assert selected.kind is not kp.KernelKind.W8A16


@PROPERTY_SETTINGS
@given(question=questions, pick=st.integers(min_value=0, max_value=len(IDS) - 1))
# h100 PTPC selects row-wise; disable the unfused kernel (pick 1 of the others).
@example(question=make_question("h100", kp.Scheme.FP8_PER_CHANNEL), pick=1)
# a100 per-tensor selects cuda_w8a16_cupy (degraded); disable cuda_w8a16_torch (pick 3).
@example(question=make_question("a100", kp.Scheme.FP8_PER_TENSOR), pick=3)
# Least preferred first: h100 per-tensor selects tensorwise past two degraded kernels.
@example(question=make_question("h100", kp.Scheme.FP8_PER_TENSOR, order="reversed"), pick=0)
# t4 PTPC is Rejected; disable row-wise (pick 0).
@example(question=make_question("t4", kp.Scheme.FP8_PER_CHANNEL), pick=0)
def test_disabling_an_unselected_kernel_keeps_the_selection(question: Question, pick: int) -> None:
    decision = question.choose()
    chosen = decision.kernel if isinstance(decision, kp.Selected) else None
    candidates = [i for i in IDS if i != chosen]
    extra = candidates[pick % len(candidates)]
    policy = attrs.evolve(question.policy, disabled=question.policy.disabled | {extra})
    after = question.ask(policy)
    if isinstance(decision, kp.Selected):
        assert isinstance(after, kp.Selected)
        assert after.kernel == decision.kernel
        assert after.degraded is decision.degraded
    else:
        assert isinstance(after, kp.Rejected)


@PROPERTY_SETTINGS
@given(question=questions)
@with_key_examples
def test_disabled_kernel_is_never_selected(question: Question) -> None:
    decision = question.choose()
    disabled = question.policy.disabled
    if isinstance(decision, kp.Selected):
        assert decision.kernel not in disabled
    # Every verdict, the appended one of a forced kernel of another platform included.
    for verdict in decision.trace:
        assert (kp.RejectCode.DISABLED in codes(verdict)) is (verdict.kernel in disabled)


@PROPERTY_SETTINGS
@given(question=questions)
@with_key_examples
def test_strict_never_selects_degraded(question: Question) -> None:
    decision = question.choose()
    if not isinstance(decision, kp.Selected):
        return
    [selected] = [v for v in decision.trace if v.kernel == decision.kernel]
    expect_degraded = (
        selected.kind is kp.KernelKind.W8A16 and question.config.activation is not None
    )
    if question.policy.strict:
        assert decision.degraded is False
        assert not expect_degraded
    else:
        assert decision.degraded is expect_degraded
    assert selected.degraded is decision.degraded
    # Every degraded verdict under strict carries the strict reason.
    if question.policy.strict:
        for verdict in decision.trace:
            if verdict.degraded:
                assert kp.RejectCode.STRICT_DEGRADED in codes(verdict)


@PROPERTY_SETTINGS
@given(question=questions)
@with_key_examples
def test_rejected_lists_every_reason_and_renders_one_line_each(question: Question) -> None:
    decision = question.choose()
    if not isinstance(decision, kp.Rejected):
        return
    everything = tuple(r for v in decision.trace for r in v.reasons)
    assert decision.reasons == everything
    # A Rejected has no viable kernel, so every kernel contributes at least one reason.
    assert all(not v.ok for v in decision.trace)
    lines = decision.render().split("\n")
    assert lines[0] == HEADER
    assert len(lines) == 1 + len(everything) + len(decision.hints)
    assert lines[1 : len(everything) + 1] == [f"  - {r.kernel}: {r.render()}" for r in everything]
    assert lines[len(everything) + 1 :] == [f"Hint: {hint}" for hint in decision.hints]
    assert sum(line.startswith("  - ") for line in lines) == len(everything)


@PROPERTY_SETTINGS
@given(question=questions)
@with_key_examples
def test_to_dict_round_trips_through_json(question: Question) -> None:
    decision = question.choose()
    record = decision.to_dict()
    again = json.loads(json.dumps(record))
    assert again == record
    assert record["schema_version"] == SCHEMA_VERSION
    statuses = [entry["status"] for entry in record["trace"]]
    assert [entry["kernel"] for entry in record["trace"]] == [v.kernel for v in decision.trace]
    if isinstance(decision, kp.Selected):
        assert record["outcome"] == "selected"
        assert record["kernel"] == decision.kernel
        assert record["degraded"] is decision.degraded
        assert statuses.count("selected") == 1
        assert record["trace"][statuses.index("selected")]["kernel"] == decision.kernel
    else:
        assert record["outcome"] == "rejected"
        assert record["kernel"] is None
        assert "selected" not in statuses
        assert "viable" not in statuses
    for entry, verdict in zip(record["trace"], decision.trace, strict=True):
        assert [r["code"] for r in entry["reasons"]] == [r.code.value for r in verdict.reasons]
        assert [r["message"] for r in entry["reasons"]] == [r.render() for r in verdict.reasons]


def test_cache_is_bounded() -> None:
    kp.clear_cache()
    assert kp.cache_info().currsize == 0
    size = kp.cache_info().maxsize
    assert size is not None
    assert size == 4096
    caps = kp.device_profile("cpu")
    extra = 100
    for n in range(1, size + extra + 1):
        config = kp.quant_config(kp.Scheme.FP8_PER_TENSOR, weight_shape=(n, 16))
        kp.choose(caps, config)
        assert kp.cache_info().currsize <= size
    info = kp.cache_info()
    assert info.misses >= size + extra
    assert info.currsize == size
    # The oldest question was evicted (least recently used first), the newest kept.
    newest = kp.quant_config(kp.Scheme.FP8_PER_TENSOR, weight_shape=(size + extra, 16))
    hits = kp.cache_info().hits
    kp.choose(caps, newest)
    assert kp.cache_info().hits == hits + 1
    oldest = kp.quant_config(kp.Scheme.FP8_PER_TENSOR, weight_shape=(1, 16))
    misses = kp.cache_info().misses
    kp.choose(caps, oldest)
    assert kp.cache_info().misses == misses + 1
    kp.clear_cache()


# --- device hints ------------------------------------------------------------------------

# Each profile as it is, and with one fact of its stack changed, so that device hints come
# up for toolkits, libraries, torch versions and features as well as for archs.
STACK_CHANGES: dict[str, Callable[[kp.DeviceCaps], kp.DeviceCaps]] = {
    "as is": lambda caps: caps,
    "ROCm 6.2": lambda caps: attrs.evolve(caps, toolkit_version=Version(6, 2)),
    "ROCm 6.4": lambda caps: attrs.evolve(caps, toolkit_version=Version(6, 4)),
    "no libraries": lambda caps: attrs.evolve(caps, libraries=frozenset()),
    "torch 2.6": lambda caps: attrs.evolve(caps, torch_version=Version(2, 6)),
    "no features": lambda caps: attrs.evolve(caps, features=frozenset()),
    "no f16c": lambda caps: (
        attrs.evolve(caps, arch=CpuArch(caps.arch.machine, caps.arch.isa - {"f16c"}))
        if isinstance(caps.arch, CpuArch)
        else caps
    ),
}
_DEVICE_HINT = re.compile(r"(?:or )?move to a device with (.+), where (\S+) runs")
Change = Callable[[kp.DeviceCaps], kp.DeviceCaps]


def _move_to(arch: RocmArch | CudaArch, least: Version | None) -> Change:
    """To ``arch``, and to ``least`` of its toolkit (ROCm, CUDA) when the hint names one
    (else the toolkit unchanged)."""

    def change(caps: kp.DeviceCaps) -> kp.DeviceCaps:
        moved = attrs.evolve(caps, arch=arch)
        return moved if least is None else attrs.evolve(moved, toolkit_version=least)

    return change


def _with_isa(arch: object, flags: frozenset[str]) -> CpuArch:
    # The same CPU with the named instructions added (any CPU, when the hint names one).
    machine = arch.machine if isinstance(arch, CpuArch) else "x86_64"
    isa = arch.isa if isinstance(arch, CpuArch) else frozenset()
    return CpuArch(machine, isa | flags)


def _alternatives(part: str, spec: kp.KernelSpec) -> list[Change]:
    """The devices one part of a device hint names, each as the facts it changes: a part
    names one device fact, or (for archs) several alternatives, each claimed to pass."""
    if match := re.fullmatch(r"compute capability (\S+) or higher", part):
        arch = CudaArch.parse(match[1])
        return [lambda caps: attrs.evolve(caps, arch=arch)]
    if match := re.fullmatch(r"GPU architecture (.+)", part):
        found: list[Change] = []
        for option in re.split(r", or |, | or ", match[1]):
            if cuda := re.fullmatch(r"SM (\d+)\.x(?: with CUDA >= (\S+))?", option):
                least = None if cuda[2] is None else Version.parse(cuda[2])
                found.append(_move_to(CudaArch(int(cuda[1]), 0), least))
                continue
            parsed = re.fullmatch(r"([\w/]+)(?: with ROCm >= (\S+))?", option)
            assert parsed is not None, f"an arch option the test cannot read: {option!r}"
            least = None if parsed[2] is None else Version.parse(parsed[2])
            found += [_move_to(RocmArch(name), least) for name in parsed[1].split("/")]
        return found
    if match := re.fullmatch(
        r"(?:ROCm (\S+) or newer on \w+|CUDA (\S+) or newer on SM \d+\.x)", part
    ):
        version = Version.parse(match[1] or match[2])
        return [lambda caps: attrs.evolve(caps, toolkit_version=version)]
    if match := re.fullmatch(r"torch (\S+) or newer", part):
        version = Version.parse(match[1])
        return [lambda caps: attrs.evolve(caps, torch_version=version)]
    if match := re.fullmatch(r"CPU instructions (.+)", part):
        flags = frozenset(match[1].split(", "))
        return [lambda caps: attrs.evolve(caps, arch=_with_isa(caps.arch, flags))]
    if re.fullmatch(r"a C\+\+ toolchain \(.+\)", part):
        return [lambda caps: attrs.evolve(caps, features=caps.features | {FEATURE_CPP_TOOLCHAIN})]
    features = {
        r.meaning: r.feature for r in spec.rules if isinstance(r, kp.rules.NeedsTorchFeature)
    }
    if part in features:
        return [lambda caps: attrs.evolve(caps, features=caps.features | {features[part]})]
    libraries = {r.library for r in spec.rules if isinstance(r, kp.rules.NeedsLibrary)}
    assert part in libraries, f"a device hint part the test cannot read: {part!r}"
    return [lambda caps: attrs.evolve(caps, libraries=caps.libraries | {part})]


def _hinted_devices(caps: kp.DeviceCaps, needs: str, spec: kp.KernelSpec) -> list[kp.DeviceCaps]:
    devices = [caps]
    for part in needs.split(" and "):
        devices = [change(device) for device in devices for change in _alternatives(part, spec)]
    return devices


@PROPERTY_SETTINGS
@given(
    profile=profile_names,
    stack=st.sampled_from(sorted(STACK_CHANGES)),
    config=configs,
)
@example(profile="mi250x", stack="ROCm 6.2", config=PTPC_4096)
@example(profile="mi355x", stack="ROCm 6.4", config=PTPC_4096)
@example(profile="a100", stack="no libraries", config=PTPC_4096)
@example(profile="cpu", stack="no features", config=PTPC_4096)
@example(profile="h100", stack="torch 2.6", config=PTPC_4096)
@example(profile="gh200", stack="ROCm 6.2", config=BLOCK_128)
@example(profile="a100", stack="ROCm 6.2", config=BLOCK_128)
def test_every_device_hint_holds_on_the_device_it_names(
    profile: str, stack: str, config: kp.QuantConfig
) -> None:
    # Change only the facts the hint names, and the kernel it names passes all its rules.
    caps = STACK_CHANGES[stack](PROFILES[profile])
    decision = kp.choose(caps, config)
    if not isinstance(decision, kp.Rejected):
        return
    for hint in decision.hints:
        match = _DEVICE_HINT.fullmatch(hint)
        if match is None:
            continue
        spec = CATALOG.kernel(match[2])
        for device in _hinted_devices(caps, match[1], spec):
            verdict = next(v for v in evaluate(device, config) if v.kernel == spec.id)
            assert verdict.ok, (hint, device, [r.render() for r in verdict.reasons])
