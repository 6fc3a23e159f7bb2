"""Where vLLM is absent (the main venv): the plugin module imports, and using it says what
is missing instead of failing on an import deep inside."""

from __future__ import annotations

import importlib.util
import sys

import pytest

import kernelpick as kp

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None,
    reason="vLLM is installed here; tests/engines/test_vllm.py covers the plugin with it",
)


def test_the_module_imports_without_vllm_and_register_says_why_it_cannot_run() -> None:
    from kernelpick.engines import vllm as plugin

    assert "vllm" not in sys.modules
    with pytest.raises(plugin.VllmUnavailableError, match=r"pip install 'kernelpick\[vllm\]'"):
        plugin.register()
    with pytest.raises(kp.KernelpickError, match="needs vLLM"):
        plugin.KernelpickConfig  # noqa: B018  # the lazy attribute: the same error
    assert "vllm" not in sys.modules
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        getattr(plugin, "nothing")  # noqa: B009


def test_importing_kernelpick_imports_no_engine() -> None:
    import kernelpick.engines  # noqa: F401

    assert "kernelpick.engines.vllm._config" not in sys.modules
