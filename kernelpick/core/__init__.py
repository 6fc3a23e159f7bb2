"""kernelpick's pure core: values, the kernel catalog, rules, policy and the decision.

Imports only the standard library and attrs, never torch or cupy, so an engine can test
selection for any device on any machine.
"""

from kernelpick.core._arch import Arch, CpuArch, CudaArch, Platform, RocmArch, Version
from kernelpick.core._builtin_catalog import DEFAULT_CATALOG
from kernelpick.core._decision import SCHEMA_VERSION, Decision, Rejected, Selected, Verdict
from kernelpick.core._device import FEATURE_SCALED_MM, FEATURE_SCALED_MM_ROWWISE, DeviceCaps
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
from kernelpick.core._reasons import Reason, RejectCode, Unmet
from kernelpick.core._requirements import (
    ActivationScales,
    Alignment,
    Fp8Dtypes,
    InputDtypes,
    MinComputeCapability,
    MinTorch,
    NeedsLibrary,
    NeedsTorchFeature,
    NotBothPerTensor,
    OutDtypes,
    Requirement,
    RocmArchs,
    WeightScales,
)
from kernelpick.core._schemes import Scheme, scheme, scheme_of
from kernelpick.core._select import (
    CACHE_SIZE,
    KIND_RULES,
    cache_info,
    choose,
    clear_cache,
    evaluate,
)
from kernelpick.core._specs import Catalog, KernelKind, KernelSpec
from kernelpick.core._typing import assert_never


def default_catalog() -> Catalog:
    """kernelpick's own catalog (design §4)."""
    return DEFAULT_CATALOG


def catalog(platform: Platform | str, catalog: Catalog | None = None) -> tuple[str, ...]:
    """The kernel ids of ``platform`` in preference order (of the built-in catalog by default)."""
    source = DEFAULT_CATALOG if catalog is None else catalog
    return tuple(spec.id for spec in source.for_platform(platform))


__all__ = [
    "CACHE_SIZE",
    "ENV_DISABLED",
    "ENV_FORCE",
    "ENV_STRICT",
    "FEATURE_SCALED_MM",
    "FEATURE_SCALED_MM_ROWWISE",
    "KIND_RULES",
    "SCHEMA_VERSION",
    "ActivationScales",
    "Alignment",
    "Arch",
    "Catalog",
    "CpuArch",
    "CudaArch",
    "Decision",
    "DeviceCaps",
    "Dtype",
    "Fp8Dtypes",
    "GroupShape",
    "InputDtypes",
    "InvalidValueError",
    "KernelInputError",
    "KernelKind",
    "KernelSpec",
    "KernelpickError",
    "MinComputeCapability",
    "MinTorch",
    "NeedsLibrary",
    "NeedsTorchFeature",
    "NotBothPerTensor",
    "OutDtypes",
    "Platform",
    "Policy",
    "QuantConfig",
    "QuantKey",
    "Reason",
    "RejectCode",
    "Rejected",
    "Requirement",
    "RocmArch",
    "RocmArchs",
    "ScaleSpec",
    "Scheme",
    "Selected",
    "UnknownNameError",
    "Unmet",
    "Verdict",
    "Version",
    "WeightScales",
    "assert_never",
    "cache_info",
    "catalog",
    "choose",
    "clear_cache",
    "default_catalog",
    "device_profile",
    "device_profiles",
    "evaluate",
    "scheme",
    "scheme_of",
]
