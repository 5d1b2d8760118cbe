"""The board catalog: one TOML file per board in ``boards/`` (ground floor).

A board names its runtime backend, the quantization modes it takes, its latency budget and SSH
defaults. The files ship inside the wheel (``edgehft/_boards``) and are read from the source tree in a
development checkout; a third-party backend (:mod:`edgehft.backends`) adds its own directories of board
files, after these (a built-in board's name cannot be taken).
"""
from __future__ import annotations

from edgehft.compat import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from edgehft import backends
from edgehft.errors import InputError

_PKG = Path(__file__).resolve().parent
BOARD_DIRS = (_PKG / "_boards", _PKG.parent / "boards")


class Stack(BaseModel):
    """The software a board's image is expected to run (a board file's ``[stack]``), which ``edgehft deploy``'s
    probe checks the box against (:func:`edgehft.deploy.probe.stack_mismatch`). Every field is optional: an
    empty one checks nothing.

    ``image``: what to flash, in words (not checked); ``arch``: the ``platform.machine()`` values the image
    has (e.g. ``["armv7l"]``); ``python``: a PEP 440 specifier the box's Python must satisfy (``"~=3.10.0"``);
    ``interpreter``: the TFLite interpreter distributions that exist for that arch and Python (one of them
    must be installed); ``packages``: distribution name -> specifier (``{pynq = ">=3.1,<3.2"}``), each
    installed and matching."""

    model_config = ConfigDict(extra="forbid")
    image: str = ""
    arch: list[str] = Field(default_factory=list)
    python: str = ""
    interpreter: list[str] = Field(default_factory=list)
    packages: dict[str, str] = Field(default_factory=dict)

    @field_validator("python")
    @classmethod
    def _python_specifier(cls, v: str) -> str:
        _specifier(v)
        return v

    @field_validator("packages")
    @classmethod
    def _package_specifiers(cls, v: dict[str, str]) -> dict[str, str]:
        for spec in v.values():
            _specifier(spec)
        return v


def _specifier(text: str):
    """``text`` as a :class:`packaging.specifiers.SpecifierSet` (``""`` matches every version). Raises
    ValueError (pydantic reports it as the board file's error) for one that is not PEP 440."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    try:
        return SpecifierSet(text)
    except InvalidSpecifier as exc:
        raise ValueError(f"not a PEP 440 version specifier: {text!r} ({exc})") from None


class Board(BaseModel):
    """One board definition (a ``boards/<name>.toml``)."""

    model_config = ConfigDict(extra="allow")
    name: str
    backend: str
    description: str = ""
    quantization: list[str]
    default_quantization: str
    io_dtypes: list[str] = Field(default_factory=lambda: ["int8"])
    runtime: dict = Field(default_factory=dict)
    latency_budget_us: dict[str, float] = Field(default_factory=dict)
    ssh: dict = Field(default_factory=dict)
    stack: Stack = Field(default_factory=Stack)
    path: str = ""


def _board_files() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in (*BOARD_DIRS, *map(Path, backends.plugin_board_dirs())):
        if d.is_dir():
            for f in sorted(d.glob("*.toml")):
                found.setdefault(f.stem, f)
    return found


def list_boards() -> list[Board]:
    """Every board in the catalog, sorted by name."""
    return [load_board(n) for n in sorted(_board_files())]


def load_board(name: str) -> Board:
    """The board called ``name``.

    Raises:
        InputError: no such board (the message lists the known ones), or its file is invalid.
    """
    files = _board_files()
    if name not in files:
        raise InputError(f"unknown board {name!r}", hint=f"known boards: {', '.join(sorted(files)) or 'none'}")
    path = files[name]
    try:
        data = tomllib.loads(path.read_text())
        return Board(**data, path=str(path))
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise InputError(f"board file {path} is invalid: {exc}") from exc
