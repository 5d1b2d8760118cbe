"""Board-side tests (pynq venv). This file makes the directory a package, so its conftest.py is
imported as ``board.conftest`` and does not shadow ``tests/conftest.py``, which other test modules
import as ``conftest``."""
