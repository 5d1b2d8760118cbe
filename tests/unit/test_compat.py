"""edgehft.compat: the TOML reader on every supported Python and the refusal for a missing extra."""
from __future__ import annotations

import pytest

from edgehft.compat import EXTRAS, require_extra, tomllib
from edgehft.errors import MissingExtraError


def test_tomllib_reads_toml():
    assert tomllib.loads('a = 1\n[b]\nc = "d"\n') == {"a": 1, "b": {"c": "d"}}
    with pytest.raises(tomllib.TOMLDecodeError):
        tomllib.loads("a = ")


def test_a_missing_extra_is_exit_7_with_the_pip_command():
    require_extra("json", "compile", "reading JSON")                 # present: returns
    for module in ("edgehft_no_such_module", "edgehft_no_such.sub"):
        with pytest.raises(MissingExtraError) as e:
            require_extra(module, "compile", "compiling a model")
        assert e.value.exit_code == 7
        assert f"compiling a model needs the Python package {module!r}" in str(e.value)
        assert e.value.hint == f"pip install 'edgehft[compile]': {EXTRAS['compile']}"


def test_on_a_python_older_than_the_extra_the_hint_says_so(monkeypatch):
    import sys
    monkeypatch.setattr(sys, "version_info", (3, 8, 18, "final", 0))           # JetPack 5's Python
    with pytest.raises(MissingExtraError) as e:
        require_extra("edgehft_no_such_module", "compile", "compiling a model")
    assert e.value.exit_code == 7
    assert e.value.hint.startswith("edgehft[compile] needs Python 3.10 or later (this is 3.8, where the box side")
    with pytest.raises(MissingExtraError) as e:
        require_extra("edgehft_no_such_module", "serve", "watching the install dir")   # serve installs on 3.8
    assert e.value.hint == f"pip install 'edgehft[serve]': {EXTRAS['serve']}"


@pytest.mark.parametrize("s, fix, head, tail", [("jetson-orin-nx", "jetson-", "orin-nx", "jetson-orin-nx"),
                                                ("v1.partial", ".partial", "v1.partial", "v1"),
                                                ("abc", "", "abc", "abc"), ("ab", "abc", "ab", "ab")])
def test_removeprefix_and_removesuffix_match_python_3_9s(s, fix, head, tail):
    from edgehft.compat import removeprefix, removesuffix
    assert removeprefix(s, fix) == head and removesuffix(s, fix) == tail
    assert (head, tail) == (s.removeprefix(fix), s.removesuffix(fix))
