"""Watch a box's install directory for a switch of its ``current`` link (``edgehft deploy`` and ``rollback``
replace it by ``rename(2)``: :mod:`edgehft.deploy.store`).

:class:`LinkWatch` says which version ``current`` points to now and blocks until it may have changed: on Linux
with ``inotify_simple`` installed (``pip install 'edgehft[serve]'``) through inotify (woken by the rename), else
by polling ``readlink`` every ``poll_s`` seconds (one system call). Either way :meth:`wait` returns at least every
``poll_s`` seconds, so a missed event costs at most that long.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

MODES = ("auto", "inotify", "poll")


def current_version(root: Path) -> str | None:
    """The version id ``root/current`` points to (``versions/<vid>`` -> ``<vid>``), or None when there is no
    link (nothing deployed yet) or it cannot be read."""
    try:
        return Path(os.readlink(root / "current")).name
    except OSError:
        return None


class LinkWatch:
    """``wait(timeout)`` until ``root/current`` may have changed; ``mode`` is ``"inotify"`` or ``"poll"`` (what
    ``"auto"`` found). Raises ValueError for an unknown mode, ImportError for ``"inotify"`` without
    ``inotify_simple``."""

    def __init__(self, root: Path, mode: str = "auto", poll_s: float = 0.2):
        if mode not in MODES:
            raise ValueError(f"watch mode {mode!r}: one of {', '.join(MODES)}")
        self.root, self.poll_s, self._ino = Path(root), float(poll_s), None
        if mode in ("auto", "inotify"):
            try:
                from inotify_simple import INotify, flags
                self._ino = INotify()
                self._ino.add_watch(str(self.root), flags.MOVED_TO | flags.CREATE | flags.DELETE)
            except (ImportError, OSError):
                if mode == "inotify":
                    raise
                self._ino = None
        self.mode = "inotify" if self._ino is not None else "poll"

    def wait(self, timeout: float | None = None) -> None:
        """Block until a change under ``root`` (inotify) or ``poll_s`` seconds (poll), at most ``timeout``."""
        t = self.poll_s if timeout is None else min(self.poll_s, timeout)
        if self._ino is not None:
            self._ino.read(timeout=int(t * 1000))
        else:
            time.sleep(t)

    def close(self) -> None:
        if self._ino is not None:
            self._ino.close()
            self._ino = None
