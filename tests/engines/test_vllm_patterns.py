"""The vLLM plugin reads a config's patterns (``modules_to_not_convert``, a compressed-tensors
checkpoint's ``targets`` and ``ignore``) as the rest of kernelpick does: matched by RE2 in
linear time, and refused when the config is read if Python's ``re`` and RE2 cannot read them alike.
"""

from __future__ import annotations

import pytest

import kernelpick as kp
from kernelpick.integration import CheckpointError
from kernelpick.integration.formats import compressed_tensors as _ct_config
from tests.engines import vllm_workers as workers
from tests.support.pattern_timing import seconds, timings

workers.require_vllm()  # before vLLM's first import, which reads the platform

pytestmark = pytest.mark.slow  # vLLM's import alone takes seconds


def test_patterns_python_backtracks_on_for_ever_match_in_well_under_a_second() -> None:
    results = timings(["vllm", "vllm_compressed_tensors"], timeout_s=240)  # vLLM's import
    assert {key: out for key, out in results.items() if seconds(out) >= 1.0} == {}


@pytest.mark.parametrize("pattern", ["(?<=x)y", r"(a)\1", "(", "[z-a]"])
def test_a_pattern_re_and_re2_cannot_read_alike_is_refused_by_from_config(pattern: str) -> None:
    from kernelpick.engines.vllm import KernelpickConfig

    with pytest.raises(kp.InvalidValueError, match="modules_to_not_convert") as caught:
        KernelpickConfig.from_config({"modules_to_not_convert": [pattern]})
    assert repr(pattern) in str(caught.value)
    checkpoint = _ct_config.to_config(kp.Scheme.FP8_PER_CHANNEL, [f"re:{pattern}"])
    with pytest.raises(CheckpointError, match="ignore") as caught_ct:
        KernelpickConfig.from_config(checkpoint)  # not a re.error from get_quant_method
    assert repr(f"re:{pattern}") in str(caught_ct.value)
