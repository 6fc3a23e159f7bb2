"""The vLLM tests' one world-size-1 group, shared by every vLLM test module of a session:
vLLM's distributed state is set up once per process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engines import vllm_workers as workers


@pytest.fixture(scope="session")
def vllm_tp1() -> Iterator[None]:
    with workers.vllm_group(1, 0, workers.free_port()):
        yield
