"""Board-side tests: pynq's own driver stack against the emulated PYNQ board (edgehft.emulate).

pynq 4.0.0 pins numpy < 2 and cannot share the TensorFlow venv, so these run in the board venv:

    scripts/board-venv.sh && .venv-board/bin/python -m pytest -q tests/board

Anywhere pynq does not import (the main venv), every module here is reported as skipped, with the
reason, instead of being imported (they import pynq at the top). This works both for a plain
``pytest`` run and for ``pytest tests/board`` (a module-level ``pytest.skip`` in a conftest does not:
pytest loads the conftest of a command-line directory before collection and aborts).
"""
import pytest

try:
    import pynq  # noqa: F401
    PYNQ_MISSING = None
except Exception as exc:  # ImportError here; pynq can also fail on import for other reasons
    PYNQ_MISSING = (f"tests/board need pynq ({type(exc).__name__}: {exc}); run them with the board venv: "
                    "scripts/board-venv.sh && .venv-board/bin/python -m pytest -q tests/board")

if PYNQ_MISSING:
    class _SkippedModule(pytest.Module):
        def collect(self):
            pytest.skip(PYNQ_MISSING)

    def pytest_pycollect_makemodule(module_path, parent):
        return _SkippedModule.from_parent(parent, path=module_path)
