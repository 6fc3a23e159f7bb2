"""Fuzzing the ``kernelpick`` command line with hypothesis: any argv and environment
exits 0, 1 or 2 and never raises; a shape it cannot read is named.

The only allowed outcomes are a correct result or a documented kernelpick error: a
``kp.KernelpickError`` whose message names the bad value. Any other exception (TypeError,
AttributeError, IndexError, a ValueError of Python's own, an error from torch) is a bug of
the library, so nothing here catches more than ``kp.KernelpickError``.
"""

from __future__ import annotations

import io

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kernelpick.cli import main
from tests.support.fuzzing import (
    DTYPE_NAMES,
    ENV,
    IDS,
    PROFILE_NAMES,
    SCHEME_NAMES,
    assert_names,
    fuzz,
    near_miss,
)

# Hypothesis fuzzers of a public entry point: seconds in all, so `make check` skips them.
pytestmark = pytest.mark.slow

SHAPE_TEXT: st.SearchStrategy[str] = st.one_of(
    st.sampled_from(["4096,4096", "16x32", " 64 , 128 ", "4096x", "-1,5", "1e3,4", "0,16"]),
    st.sampled_from(["4096", "1,2,3", "x", ",", "", "4096X4096", "16,,16", "0x10,16", "+5,5"]),
    st.builds(
        lambda n, sep, k: f"{n}{sep}{k}",
        st.integers(-5, 5000),
        st.sampled_from([",", "x", " , ", ";", "*"]),
        st.integers(-5, 5000),
    ),
    st.text(alphabet="0123456789,x -.e", max_size=10),
)
DISABLE_TEXT: st.SearchStrategy[str] = st.one_of(
    st.lists(st.one_of(st.sampled_from(IDS), near_miss(IDS), st.just("")), max_size=4).map(
        ",".join
    ),
    st.text(max_size=10),
)
DEVICE_TEXT: st.SearchStrategy[str] = st.one_of(
    st.sampled_from(PROFILE_NAMES),
    st.sampled_from(["auto", "AUTO", " h100 ", "H100", "cuda", "cpu:0", ""]),
    near_miss(PROFILE_NAMES),
    st.text(max_size=8),
)
OPTION_VALUES: dict[str, st.SearchStrategy[str]] = {
    "--device": DEVICE_TEXT,
    "--scheme": st.one_of(st.sampled_from(SCHEME_NAMES), near_miss(SCHEME_NAMES), st.text()),
    "--shape": SHAPE_TEXT,
    "--out-dtype": st.one_of(st.sampled_from(sorted(DTYPE_NAMES)), st.text(max_size=8)),
    "--disable": DISABLE_TEXT,
    "--force": st.one_of(st.sampled_from(IDS), near_miss(IDS), st.just(""), st.text(max_size=8)),
    "--format": st.sampled_from(["text", "markdown", "json", "csv", ""]),
}
FLAGS = ("--bias", "--strict", "--json", "--bogus", "-x", "--", "--dev", "--s")


def _not_help(token: str) -> bool:
    # Help is its own test: argparse accepts any prefix of --help, and -h with others.
    return not (token.startswith("-h") or (token.startswith("--h") and "--help".startswith(token)))


@st.composite
def argv_lists(draw: st.DrawFn) -> list[str]:
    argv: list[str] = []
    command = draw(st.sampled_from(["explain", "explain", "matrix", "devices", "kernels", "", "x"]))
    if command:
        argv.append(command)
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["option", "option", "flag", "random"]))
        if kind == "option":
            option = draw(st.sampled_from(sorted(OPTION_VALUES)))
            argv.append(option)
            if draw(st.integers(0, 9)):
                argv.append(draw(OPTION_VALUES[option]))
        elif kind == "flag":
            argv.append(draw(st.sampled_from(FLAGS)))
        else:
            argv.append(draw(st.text(max_size=10)))
    return [token for token in argv if token != "bench" and _not_help(token)]


CLI_ENV: st.SearchStrategy[dict[str, str]] = st.one_of(st.just({}), ENV)


def _run_cli(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, env=env, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _check_status(status: int, out: str, err: str) -> None:
    assert status in (0, 1, 2)
    if status == 1:
        assert err.startswith("kernelpick: error: "), err
    else:
        assert err == ""
        assert out


@fuzz(600)
@given(argv_lists(), CLI_ENV)
@example(["explain", "--device", "auto", "--shape", "16,32"], {})
@example(["explain", "--shape", "4096x"], {})
@example(["explain", "--shape", "-1,5"], {})
@example(["explain", "--shape", "1e3,4"], {})
@example(["explain", "--disable", "cpu_w8a16_reference,,junk"], {})
def test_cli_exits_0_1_or_2_and_never_raises(argv: list[str], env: dict[str, str]) -> None:
    _check_status(*_run_cli(argv, env))


@fuzz(400)
@given(
    st.one_of(
        SHAPE_TEXT,
        st.text(max_size=12),
        st.builds(
            lambda n, k: f"{n},{k}",
            st.text(alphabet="0123456789²³¹٣٤\uff11", min_size=1, max_size=4),
            st.text(alphabet="0123456789²³¹٣٤\uff11", min_size=1, max_size=4),
        ),
    ).filter(lambda text: not text.startswith("-"))
)
@example("²,4")
@example("4,³")
@example("9" * 5000 + ",4")
def test_cli_shape_is_read_or_named(text: str) -> None:
    status, out, err = _run_cli(["explain", "--device", "h100", "--shape", text], {})
    _check_status(status, out, err)
    if status == 1:
        assert_names(err, repr(text)[:60])


@pytest.mark.parametrize("argv", [["--help"], ["explain", "-h"], ["kernels", "--he"]])
def test_cli_help_returns_a_status_and_writes_to_out(argv: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, env={}, out=out, err=err)
    assert status == 0
    assert "usage: kernelpick" in out.getvalue()
