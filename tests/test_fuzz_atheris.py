"""Coverage-guided fuzzing of the parsers with atheris, for a CI-sized budget.

The targets and their seed corpora live in fuzz/. New inputs found here go to a temporary
directory; the kept corpus is only read. Skipped where atheris is not installed (it has
wheels for Linux x86-64 up to CPython 3.12; the test extra installs it there).
"""

from __future__ import annotations

import importlib.util
import resource
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # coverage-guided runs of up to 30 s each

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
TARGETS = [("fuzz_policy_env.py", "policy_env"), ("fuzz_arch.py", "arch")]
# What a target may use on top of where it starts. libFuzzer reads its own peak RSS, and
# Linux hands a child this process's peak through fork and exec, so after a full test run
# (torch, models) the target starts at gigabytes it never allocated. The limit is set above
# that inherited floor, not at an absolute figure.
TARGET_RSS_MB = 2048


def _rss_limit_mb() -> int:
    inherited_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # KiB on Linux
    return inherited_mb + TARGET_RSS_MB


@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris not installed")
@pytest.mark.parametrize(("script", "corpus"), TARGETS)
def test_fuzz_target_finds_no_crash(script: str, corpus: str, tmp_path: Path) -> None:
    seeds = FUZZ / "corpus" / corpus
    assert any(seeds.iterdir()), f"the kept corpus {seeds} is empty"
    (tmp_path / "found").mkdir()
    command = [
        sys.executable, str(FUZZ / script),
        "-runs=20000", "-max_total_time=30", "-timeout=10", f"-rss_limit_mb={_rss_limit_mb()}",
        f"-artifact_prefix={tmp_path}/", str(tmp_path / "found"), str(seeds),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=FUZZ)
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
    assert result.returncode == 0, tail
    assert "Done " in result.stderr, tail
