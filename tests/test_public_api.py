"""The public surface is small and pinned: what the README needs, and nothing by accident."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

import kernelpick as kp

PUBLIC = [
    "Catalog",
    "Compute",
    "Decision",
    "DeviceCaps",
    "InvalidValueError",
    "KernelInputError",
    "KernelKind",
    "KernelSpec",
    "KernelpickError",
    "Platform",
    "Policy",
    "QuantConfig",
    "Reason",
    "RejectCode",
    "Rejected",
    "Scheme",
    "Selected",
    "UnknownNameError",
    "__version__",
    "assert_never",
    "bind",
    "cache_info",
    "choose",
    "clear_cache",
    "default_catalog",
    "device_profile",
    "device_profiles",
    "probe",
    "quant_config",
    "rules",
]


def test_the_public_list_is_exactly_this() -> None:
    assert sorted(kp.__all__) == PUBLIC
    assert len(kp.__all__) <= 30
    assert dir(kp) == PUBLIC
    for name in PUBLIC:
        assert getattr(kp, name) is not None


def test_internal_names_are_not_reachable_from_kp() -> None:
    for name in ("Dtype", "Version", "evaluate", "Unmet", "catalog", "DEFAULT_CATALOG"):
        with pytest.raises(AttributeError, match=name):
            getattr(kp, name)
    # Nor what the package's own module imports for itself.
    for name in ("warnings", "Any", "TYPE_CHECKING", "annotations"):
        assert not hasattr(kp, name), name
    assert not hasattr(kp.core, "DEFAULT_CATALOG")


def test_every_rule_class_is_in_kp_rules() -> None:
    for name in kp.rules.__all__:
        assert getattr(kp.rules, name) is not None
    used = {type(rule).__name__ for spec in kp.default_catalog() for rule in spec.requires}
    assert used <= set(kp.rules.__all__)


@pytest.mark.parametrize(("old", "new"), [("scheme", "quant_config"), ("CACHE_SIZE", None)])
def test_names_the_readme_once_showed_still_work_with_a_warning(old: str, new: str | None) -> None:
    with pytest.warns(DeprecationWarning, match=f"kp.{old} is deprecated"):
        value = getattr(kp, old)
    if new is not None:
        assert value is getattr(kp, new)
    else:
        assert value == kp.cache_info().maxsize


def test_public_names_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in PUBLIC:
            getattr(kp, name)


def test_the_version_is_the_installed_distributions() -> None:
    from importlib.metadata import version

    assert kp.__version__ == version("kernelpick")


def test_import_kernelpick_does_not_import_torch() -> None:
    code = "import sys, kernelpick; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("name", "where"),
    [
        ("Dtype", "kernelpick.core.Dtype"),
        ("Version", "kernelpick.core.Version"),
        ("evaluate", "kernelpick.core.evaluate"),
        ("GroupShape", "kernelpick.core.GroupShape"),
        ("CudaArch", "kernelpick.core.CudaArch"),
        ("Verdict", "kernelpick.core.Verdict"),
        ("Alignment", "kp.rules.Alignment"),
        ("KIND_RULES", "kp.rules.KIND_RULES"),
        ("Unmet", "kp.Reason"),
        ("catalog", "kp.default_catalog().ids_for(platform)"),
    ],
)
def test_a_name_gone_from_kp_says_where_it_lives_now(name: str, where: str) -> None:
    with pytest.raises(AttributeError) as info:
        getattr(kp, name)
    assert where in str(info.value)
    assert not hasattr(kp, name)
    assert name not in dir(kp)


def test_an_unknown_name_is_a_plain_attribute_error() -> None:
    name = "no_such_name"
    with pytest.raises(AttributeError) as info:
        getattr(kp, name)
    assert str(info.value) == "module 'kernelpick' has no attribute 'no_such_name'"


OLD_NAMES = [
    # (module, old name, the name it is now)
    ("kernelpick.integration", "Fp8Linear", "QuantizedLinear"),
    ("kernelpick.integration", "Fp8LinearMethod", "QuantizedLinearMethod"),
    ("kernelpick.adapters", "Launch", "kernelpick.kernels.Launch"),
    ("kernelpick.adapters", "LAUNCHES", "kernelpick.kernels.LAUNCHES"),
    ("kernelpick.adapters", "bind", "kernelpick.kernels.bind"),
    ("kernelpick.kernels", "quantize_weight", "quantize_canonical"),
]


@pytest.mark.parametrize(("module", "old", "new"), OLD_NAMES, ids=[n[1] for n in OLD_NAMES])
def test_an_old_name_still_works_with_a_warning_saying_when_it_goes(
    module: str, old: str, new: str
) -> None:
    import importlib

    namespace = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated and goes away in 0\.4\.0"):
        value = getattr(namespace, old)
    target, _, name = new.rpartition(".")
    assert value is getattr(importlib.import_module(target) if target else namespace, name)
    assert old not in namespace.__all__


def test_layer_state_kernel_is_the_bound_kernel_with_a_warning() -> None:
    import torch

    from kernelpick.integration import layer_state, quantize_model

    model = torch.nn.Sequential(torch.nn.Linear(32, 32))
    quantize_model(model, caps=kp.device_profile("cpu"), policy=kp.Policy())
    state = layer_state(model[0])
    with pytest.warns(DeprecationWarning, match=r"LayerState\.kernel is deprecated .* 0\.4\.0"):
        assert state.kernel is state.bound
    assert state.bound is not None
