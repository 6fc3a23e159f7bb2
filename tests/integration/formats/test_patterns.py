"""The patterns of a quantization config (kernelpick's and FineGrainedFP8's
``modules_to_not_convert``, compressed-tensors' ``targets`` and ``ignore``) are untrusted
input: matched by RE2 in time linear in the name, compiled once, and a pattern Python's ``re``
and RE2 cannot read alike is refused when the config is read."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from transformers.quantizers.quantizers_utils import should_convert_module

import kernelpick as kp
from kernelpick.integration import CheckpointError
from kernelpick.integration.formats import _patterns, _re2, read_layout
from kernelpick.integration.formats import compressed_tensors as _ct_config
from tests.support.pattern_timing import ROOT, seconds, timings

# -- time ------------------------------------------------------------------------------


@pytest.mark.slow  # a fresh process imports torch and transformers
def test_patterns_python_backtracks_on_for_ever_read_and_match_in_well_under_a_second() -> None:
    readers = ["transformers", "fine_grained_fp8", "compressed_tensors_targets",
               "compressed_tensors_ignore"]  # fmt: skip
    results = timings(readers, timeout_s=120)
    assert {key: out for key, out in results.items() if seconds(out) >= 1.0} == {}


def test_a_pattern_is_compiled_once_not_at_every_match(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[str] = []

    def counting(pattern: str) -> _re2.Regex | str:
        compiled.append(pattern)
        return _re2.compile_re2(pattern)

    monkeypatch.setattr(_patterns, "compile_re2", counting)
    _patterns._compiled.cache_clear()
    pattern = r"model\.layers\.[0-3]\.mlp"
    _patterns.check_patterns([pattern])
    names = [f"model.layers.{i}.mlp.{part}" for i in range(8) for part in ("up", "down")]
    assert sum(_patterns.kept(name, [pattern]) for name in names) == 8
    assert compiled == [pattern]


# -- refused when the config is read ---------------------------------------------------

# A pattern, and what the refusal says about it.
REFUSED = [
    ("(?<=x)y", "RE2"),  # lookbehind
    (r"(a)\1", "back-reference"),
    ("(", "Python's re"),
    ("[z-a]", "Python's re"),
    ("[[:digit:]]", "POSIX class"),  # RE2's class, Python's characters
    ("a{,3}", "{0,n}"),  # Python's repetition, RE2's text
    (r"x\Z", "RE2"),
]


def _transformers(pattern: str) -> object:
    from kernelpick.engines.transformers import KernelpickConfig

    return KernelpickConfig(modules_to_not_convert=[pattern])


def _fine_grained_fp8(pattern: str) -> object:
    return read_layout("config.json", {"quant_method": "fp8", "modules_to_not_convert": [pattern]})


def _ct_ignore(pattern: str) -> object:
    return read_layout("config.json", _ct_config.to_config(kp.Scheme.FP8_BLOCK, [f"re:{pattern}"]))


def _ct_targets(pattern: str) -> object:
    config = _ct_config.to_config(kp.Scheme.FP8_PER_CHANNEL, [])
    config["config_groups"]["group_0"]["targets"] = ["Linear", f"re:{pattern}"]
    return read_layout("config.json", config)


READERS: list[tuple[Callable[[str], object], type[kp.KernelpickError]]] = [
    (_transformers, kp.InvalidValueError),
    (_fine_grained_fp8, CheckpointError),
    (_ct_ignore, CheckpointError),
    (_ct_targets, CheckpointError),
]


@pytest.mark.parametrize(("read", "error"), READERS, ids=lambda r: getattr(r, "__name__", ""))
@pytest.mark.parametrize(("pattern", "why"), REFUSED)
def test_a_pattern_re_and_re2_cannot_read_alike_is_refused_when_the_config_is_read(
    read: Callable[[str], object], error: type[kp.KernelpickError], pattern: str, why: str
) -> None:
    with pytest.raises(error) as caught:
        read(pattern)
    assert repr(pattern) in str(caught.value) or repr(f"re:{pattern}") in str(caught.value)
    assert why in str(caught.value)


def test_a_plain_name_needs_no_re2_and_a_regex_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "re2", None)  # what importing an absent module raises
    monkeypatch.setattr(_re2, "_loaded", [])
    _patterns._compiled.cache_clear()
    assert _fine_grained_fp8("lm_head") is not None
    assert _ct_ignore("lm_head") is not None
    assert _patterns.kept("model.lm_head", ["lm_head"])
    with pytest.raises(_re2.Re2UnavailableError, match=r"'model\.layers\.\*'.*google-re2"):
        _fine_grained_fp8("model.layers.*")
    with pytest.raises(kp.KernelpickError, match="pip install google-re2"):
        _ct_ignore(".*")
    _patterns._compiled.cache_clear()


@pytest.mark.slow  # a fresh process imports torch
def test_kernelpick_imports_and_reads_plain_names_where_re2_is_absent() -> None:
    code = textwrap.dedent(
        """
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "re2":
                    raise ImportError(f"blocked import of {name}")
                return None

        sys.meta_path.insert(0, Block())
        import kernelpick, kernelpick.integration
        from kernelpick.integration.formats import read_layout
        read_layout("config.json", {"quant_method": "fp8", "modules_to_not_convert": ["lm_head"]})
        print("re2" in sys.modules)
        """
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=False, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.strip() == "False"


# -- the engines' rules: transformers' should_convert_module, compressed-tensors' re.match --

_ATOMS = ["a", "b", "1", ".", r"\.", "[ab]", "[^.]", r"\d", r"\w", "^", "$", r"\b", r"\B"]
_QUANTIFIERS = ["*", "+", "?", "{0,2}", "{2}", "*?"]
REGEXES = st.recursive(
    st.sampled_from(_ATOMS),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map("".join),
        st.tuples(inner, inner).map("|".join),
        st.tuples(inner, st.sampled_from(_QUANTIFIERS)).map(lambda t: f"(?:{t[0]}){t[1]}"),
    ),
    max_leaves=6,
)
# Module names are never empty (on "", Python's \B never matches, RE2's does).
NAMES = st.lists(st.text("ab1", max_size=3), min_size=1, max_size=4).map(".".join).filter(bool)


@settings(max_examples=300, deadline=None)
@given(name=NAMES, regex=REGEXES)
def test_a_compressed_tensors_regex_matches_as_re_match_does(name: str, regex: str) -> None:
    assume(_patterns.ct_refusal(regex) is None)
    assert _patterns.ct_matches(name, regex) == (re.match(regex, name) is not None)


# Ending in an anchor, which must see the name past the module boundary ("a$" keeps "a",
# not "a.b"), as often as not.
ANCHORED = st.tuples(REGEXES, st.sampled_from(["", "$", r"\b", r"\B"])).map("".join)


@settings(max_examples=300, deadline=None)
@given(name=NAMES, patterns=st.lists(ANCHORED | st.text("ab1_", max_size=4), max_size=2))
@example(name="a.bc", patterns=["a$|a.b"])  # "a" is at a boundary, not at the end
def test_kept_is_transformers_should_convert_module(name: str, patterns: list[str]) -> None:
    assume(all(_patterns.not_convert_refusal(pattern) is None for pattern in patterns))
    assert _patterns.kept(name, patterns) == (not should_convert_module(name, patterns))


@pytest.mark.parametrize("pattern", [r"model\.layers\.\d+\.attn\.\w+", r"re:.*\bproj"])
def test_a_class_the_engines_read_apart_is_refused_on_a_non_ascii_name(pattern: str) -> None:
    """RE2 reads \\w, \\d, \\s and \\b as ASCII, Python's re as Unicode: on a name with
    non-ASCII characters the two could keep different layers, so the match is refused."""
    name = "model.layers.0.attn.proj_é"
    if pattern.startswith("re:"):
        assert _patterns.ct_matches("model.layers.0.attn.proj", pattern[3:])
        with pytest.raises(kp.InvalidValueError, match="non-ASCII name"):
            _patterns.ct_matches(name, pattern[3:])
    else:
        assert _patterns.kept("model.layers.0.attn.proj", [pattern])
        with pytest.raises(kp.InvalidValueError, match="non-ASCII name"):
            _patterns.kept(name, [pattern])
    assert _patterns.kept(name, [r"model\.layers\.[0-9]+"])  # spelled out: both agree
