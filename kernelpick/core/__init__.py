"""kernelpick's pure core: values, the kernel catalog, rules, policy and the decision.

Imports only the standard library and attrs, never torch or cupy, so an engine can test
selection for any device on any machine. ``import kernelpick as kp`` re-exports the part
the README uses; this namespace adds the value types for building configs and devices by
hand (``Dtype``, ``Version``, ``GroupShape``...), ``evaluate`` and the policy's variables.
The rule classes are in ``kernelpick.rules``.
"""

from kernelpick.core._arch import Arch, CpuArch, CudaArch, Platform, RocmArch, Version
from kernelpick.core._builtin_catalog import DEFAULT_CATALOG as _DEFAULT_CATALOG
from kernelpick.core._decision import SCHEMA_VERSION, Decision, Rejected, Selected, Verdict
from kernelpick.core._device import (
    FEATURE_CPP_TOOLCHAIN,
    FEATURE_SCALED_MM,
    FEATURE_SCALED_MM_ROWWISE,
    DeviceCaps,
)
from kernelpick.core._dtypes import Dtype
from kernelpick.core._errors import (
    InvalidValueError,
    KernelInputError,
    KernelpickError,
    UnknownNameError,
)
from kernelpick.core._policy import ENV_DISABLED, ENV_FORCE, ENV_STRICT, Policy
from kernelpick.core._profiles import device_profile, device_profiles
from kernelpick.core._quant import GroupShape, QuantConfig, QuantKey, ScaleSpec
from kernelpick.core._reasons import Reason, RejectCode
from kernelpick.core._schemes import Scheme, quant_config, scheme_of
from kernelpick.core._select import cache_info, choose, clear_cache, evaluate
from kernelpick.core._specs import Catalog, KernelKind, KernelSpec
from kernelpick.core._typing import assert_never


def default_catalog() -> Catalog:
    """kernelpick's own catalog: every built-in kernel, fastest first per platform."""
    return _DEFAULT_CATALOG


__all__ = [
    "ENV_DISABLED",
    "ENV_FORCE",
    "ENV_STRICT",
    "FEATURE_CPP_TOOLCHAIN",
    "FEATURE_SCALED_MM",
    "FEATURE_SCALED_MM_ROWWISE",
    "SCHEMA_VERSION",
    "Arch",
    "Catalog",
    "CpuArch",
    "CudaArch",
    "Decision",
    "DeviceCaps",
    "Dtype",
    "GroupShape",
    "InvalidValueError",
    "KernelInputError",
    "KernelKind",
    "KernelSpec",
    "KernelpickError",
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
