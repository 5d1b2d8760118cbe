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
