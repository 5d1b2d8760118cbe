"""The board-options contract (ground floor): command-line options only one board kind takes, declared by
its backend (:mod:`edgehft.backends`, ``board_options``) and added to ``compile`` / ``report`` by the CLI.

A backend declares each option as an :class:`Option` (plain data: the CLI turns it into a click option) and
turns the values a user gave into the ``board_options`` dict its compiler stage
(``CompileOptions.board_options``) and partitioner (``predict(model, board, **board_options)``) read, with
:meth:`BoardOptions.collect`. A board whose backend declares none of the given options refuses them (exit 3),
naming the board kind they are for. Runs on the box too: imports nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Option:
    """One command-line option of one board kind.

    Attributes:
        flags: its spellings, long first (``("--min-runtime", "-m")``).
        dest: the parameter name its value arrives under (unique across every backend's options).
        help: the ``--help`` text.
        kind: ``"int"`` (``minimum`` applies), ``"flag"`` (True when given, None when not), ``"text"`` or
            ``"file"`` (an existing file, not a directory).
        minimum: the smallest value an ``"int"`` takes.
        commands: the commands that take it (``"compile"``, ``"report"``).
    """

    flags: tuple
    dest: str
    help: str
    kind: str = "text"
    minimum: int | None = None
    commands: tuple = ("compile", "report")


@dataclass(frozen=True)
class BoardOptions:
    """A backend's own options (:attr:`options`), the boards they are for (:attr:`owner`, for messages) and the
    ``board_options`` keys :meth:`collect` makes of them (:attr:`keys`)."""

    owner: str
    options: tuple = field(default_factory=tuple)
    keys: tuple = field(default_factory=tuple)

    def collect(self, values: dict) -> dict:
        """``{key: value}`` for :attr:`keys` from the raw option ``values`` (``{dest: value or None}``), only
        those the user gave; the base returns the given ones as they are, keyed by ``dest``.

        Raises:
            InputError: a value this board kind cannot use (exit 3).
        """
        return {o.dest: values[o.dest] for o in self.options if values.get(o.dest) is not None}

    def given(self, values: dict) -> list:
        """The spellings (short where there is one) of the options in ``values`` the user gave."""
        return [o.flags[-1] if len(o.flags) > 1 else o.flags[0] for o in self.options
                if values.get(o.dest) is not None]

    def spelled(self) -> str:
        """Every option, short spellings first: ``"-m/-a/-i/--edgetpu-model"``."""
        return "/".join(o.flags[-1] if len(o.flags) > 1 else o.flags[0] for o in self.options)
