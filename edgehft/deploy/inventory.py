"""``--hosts FILE``: the boxes to deploy to.

Two formats. TOML (``.toml``)::

    [[hosts]]
    host = "xilinx@10.0.0.7"          # user@host[:port] or an ssh alias
    board = "pynq-z2"                 # optional: default --board / the bundle's
    python = "/usr/local/share/pynq-venv/bin/python"   # optional: edgehft's interpreter on the box
    install_dir = "/home/xilinx/edgehft"               # optional

or plain text, one ``user@host[:port]`` per line with optional ``key=value`` words (the same keys);
``#`` starts a comment.
"""
from __future__ import annotations

from edgehft.compat import tomllib
from pathlib import Path

from edgehft.errors import InputError

KEYS = {"host", "board", "python", "install_dir"}


def read_inventory(path: str | Path) -> list[dict]:
    """The entries of an inventory file: dicts with ``host`` and optional ``board``, ``python``, ``install_dir``.

    Raises:
        InputError: unreadable file, unknown keys, an entry without ``host``, or no hosts at all.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"cannot read the inventory {path}: {exc.strerror}") from None
    entries: list[dict] = []
    if path.suffix == ".toml":
        try:
            entries = list(tomllib.loads(text).get("hosts", []))
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"inventory {path} is not valid TOML: {exc}") from None
    else:
        for n, line in enumerate(text.splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            entry = {"host": words[0]}
            for w in words[1:]:
                if "=" not in w:
                    raise InputError(f"{path}:{n}: {w!r} is not key=value", hint=f"keys: {', '.join(sorted(KEYS))}")
                k, v = w.split("=", 1)
                entry[k] = v
            entries.append(entry)
    for e in entries:
        unknown = set(e) - KEYS
        if unknown or not isinstance(e.get("host"), str):
            raise InputError(f"inventory {path}: bad entry {e!r}",
                             hint="each entry needs host=...; optional keys: board, python, install_dir")
    if not entries:
        raise InputError(f"inventory {path} lists no hosts")
    return entries
