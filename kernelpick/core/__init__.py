"""kernelpick's pure core: values, the kernel catalog, rules, policy and the decision.

Imports only the standard library and attrs, never torch or cupy, so an engine can test
selection for any device on any machine. ``import kernelpick as kp`` re-exports the part
the README uses; this namespace adds the value types for building configs and devices by
hand (``Dtype``, ``Version``, ``GroupShape``...), ``evaluate`` and the policy's variables.
The rule classes a kernel declares are in ``kernelpick.core.rules``, which users read as
``kp.rules``. The last group of ``__all__`` is for kernelpick's other packages, which import
the core from here and never from its private modules.
"""

from kernelpick.core._arch import Arch, CpuArch, CudaArch, Platform, RocmArch, Version
from kernelpick.core._builtin_catalog import DEFAULT_CATALOG as _DEFAULT_CATALOG
from kernelpick.core._catalog_facts import (
    CPU_BF16_ISA,
    CPU_FP8_ACTIVATIONS,
    CPU_FP8_BLOCK,
    CPU_FP8_ISA,
    CPU_FP8_STATIC,
    CPU_FP8_WEIGHTS,
    CPU_INT8_ACTIVATIONS,
    CPU_INT8_WEIGHTS,
    INT8_DOT_ISA,
    INT_MM_MIN_TOKENS,
)
from kernelpick.core._cpuinfo import KERNEL_ISA_FLAGS, parse_cpuinfo
from kernelpick.core._decision import (
    DEGRADED_NOTE,
    SCHEMA_VERSION,
    Decision,
    Rejected,
    Selected,
    Verdict,
    reason_lines,
)
from kernelpick.core._device import (
    CPP_TOOLCHAIN_PARTS,
    FEATURE_BUILD_ROOT,
    FEATURE_CPP_TOOLCHAIN,
    FEATURE_CXX_COMPILER,
    FEATURE_NINJA,
    FEATURE_SCALED_MM,
    FEATURE_SCALED_MM_ROWWISE,
    DeviceCaps,
    missing_toolchain_parts,
    toolchain_features,
)
from kernelpick.core._dtypes import HIGH_PRECISION, INTEGER_FORMATS, Dtype
from kernelpick.core._errors import (
    InvalidValueError,
    KernelInputError,
    KernelpickError,
    UnknownNameError,
    is_bool,
    is_positive_int,
    parse_enum,
    positive_int,
)
from kernelpick.core._kinds import kind_reason
from kernelpick.core._policy import ENV_DISABLED, ENV_FORCE, ENV_STRICT, Policy, split_ids
from kernelpick.core._profiles import device_profile, device_profiles
from kernelpick.core._quant import GroupShape, QuantConfig, QuantKey, ScaleSpec
from kernelpick.core._reasons import Reason, RejectCode
from kernelpick.core._schemes import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_GROUP_SIZE,
    INTEGER_WEIGHT_ONLY,
    MX_BLOCK_SIZE,
    PER_CHANNEL_GROUP,
    Scheme,
    block_size_of,
    group_size_of,
    quant_config,
    scheme_of,
)
from kernelpick.core._select import cache_info, choose, clear_cache, evaluate, rule_reasons
from kernelpick.core._specs import Catalog, KernelKind, KernelSpec
from kernelpick.core._speed import MISSING_TOOL_CODES, Compute, SpeedCode, SpeedWarning
from kernelpick.core._summary import (
    KeptLayer,
    LayerGroup,
    ModelSummary,
    UncoveredWeights,
    stored_bytes,
)
from kernelpick.core._summary_text import collapse_names
from kernelpick.core._typing import assert_never


def default_catalog() -> Catalog:
    """kernelpick's own catalog: every built-in kernel, fastest first per platform."""
    return _DEFAULT_CATALOG


__all__ = [
    "CPP_TOOLCHAIN_PARTS",
    "ENV_DISABLED",
    "ENV_FORCE",
    "ENV_STRICT",
    "FEATURE_BUILD_ROOT",
    "FEATURE_CPP_TOOLCHAIN",
    "FEATURE_CXX_COMPILER",
    "FEATURE_NINJA",
    "FEATURE_SCALED_MM",
    "FEATURE_SCALED_MM_ROWWISE",
    "SCHEMA_VERSION",
    "Arch",
    "Catalog",
    "Compute",
    "CpuArch",
    "CudaArch",
    "Decision",
    "DeviceCaps",
    "Dtype",
    "GroupShape",
    "InvalidValueError",
    "KeptLayer",
    "KernelInputError",
    "KernelKind",
    "KernelSpec",
    "KernelpickError",
    "LayerGroup",
    "ModelSummary",
    "Platform",
    "Policy",
    "QuantConfig",
    "QuantKey",
    "Reason",
    "RejectCode",
    "Rejected",
    "RocmArch",
    "ScaleSpec",
    "Scheme",
    "Selected",
    "SpeedCode",
    "SpeedWarning",
    "UncoveredWeights",
    "UnknownNameError",
    "Verdict",
    "Version",
    "assert_never",
    "cache_info",
    "choose",
    "clear_cache",
    "default_catalog",
    "device_profile",
    "device_profiles",
    "evaluate",
    "quant_config",
    "scheme_of",
]
# For kernelpick's other packages (kernels, adapters, integration, engines, cli): the
# catalog facts the families and probes read, shared validators and the parts of a
# decision they render. Not meant for engines; they may change in any release.
__all__ += [
    "CPU_BF16_ISA",
    "CPU_FP8_ACTIVATIONS",
    "CPU_FP8_BLOCK",
    "CPU_FP8_ISA",
    "CPU_FP8_STATIC",
    "CPU_FP8_WEIGHTS",
    "CPU_INT8_ACTIVATIONS",
    "CPU_INT8_WEIGHTS",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_GROUP_SIZE",
    "DEGRADED_NOTE",
    "HIGH_PRECISION",
    "INT8_DOT_ISA",
    "INTEGER_FORMATS",
    "INTEGER_WEIGHT_ONLY",
    "INT_MM_MIN_TOKENS",
    "KERNEL_ISA_FLAGS",
    "MISSING_TOOL_CODES",
    "MX_BLOCK_SIZE",
    "PER_CHANNEL_GROUP",
    "block_size_of",
    "collapse_names",
    "group_size_of",
    "is_bool",
    "is_positive_int",
    "kind_reason",
    "missing_toolchain_parts",
    "parse_cpuinfo",
    "parse_enum",
    "positive_int",
    "reason_lines",
    "rule_reasons",
    "split_ids",
    "stored_bytes",
    "toolchain_features",
]
