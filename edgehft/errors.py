"""The errors edgehft raises. Each carries a hint that says how to fix it and a CLI exit code.

Exit codes (also in the README): 0 ok, 1 misuse of the Python API (:class:`RunnerStateError`), 2 usage, 3 bad input (model file, ticks, shapes, dtypes, NaN),
4 converter failure (crash, hang, lowering), 5 drift gate failed under ``--strict``, 6 bundle does not
match its manifest, 7 board or library unavailable (a board's runtime or device, or a package of one of
edgehft's extras: the hint names it), 8 golden vectors not reproduced, 9 deploy refused or failed
on the box (the previous version still serves), 10 box unreachable (SSH connection, authentication or host key).
"""
from __future__ import annotations


class EdgeHFTError(Exception):
    """Base class: ``str(err)`` is the problem, ``err.hint`` how to fix it."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        msg = super().__str__()
        return f"{msg}\n  hint: {self.hint}" if self.hint else msg


class RunnerStateError(EdgeHFTError, RuntimeError):
    """A :class:`~edgehft.runtime.base.Runner` was called after ``close()``, or from a second thread while
    a call was in progress (a runner serves one call at a time; open one runner per thread)."""


class InputError(EdgeHFTError, ValueError):
    """A model file, tick file or tensor the user gave cannot be used as it is."""

    exit_code = 3


class ShapeError(InputError):
    """An input window has the wrong shape."""


class DTypeError(InputError, TypeError):
    """An input window has a dtype the model cannot take."""


class NonFiniteInputError(InputError):
    """An input window holds NaN or infinity."""


class ConverterError(EdgeHFTError):
    """The TensorFlow converter crashed, hung or refused the model."""

    exit_code = 4


class LoweringError(ConverterError):
    """A layer cannot be lowered to the TFLite ops the board needs."""


class DriftError(EdgeHFTError):
    """The quantized model drifts from the float model beyond the threshold (``--strict``)."""

    exit_code = 5


class BundleError(EdgeHFTError):
    """A bundle is malformed or its files do not match its manifest."""

    exit_code = 6


class BoardUnavailableError(EdgeHFTError):
    """The board's runtime library or device is not available on this machine."""

    exit_code = 7


class MissingExtraError(EdgeHFTError):
    """A command needs a package from one of edgehft's extras that is not installed here: the box side
    installs without them (``pip install edgehft``), the compile side with ``pip install 'edgehft[compile]'``.
    The hint names the extra."""

    exit_code = 7


class GoldenMismatchError(EdgeHFTError):
    """The runtime did not reproduce the bundle's golden vectors."""

    exit_code = 8


class DeployError(EdgeHFTError):
    """A deploy was refused (wrong board, box not that board, disk full) or failed on the box; the box keeps
    serving its previous version."""

    exit_code = 9


class RemoteError(EdgeHFTError):
    """The box cannot be reached over SSH: connection refused or dropped, authentication failed, or its
    host key is unknown or changed (never auto-accepted)."""

    exit_code = 10


class HostKeyError(RemoteError):
    """The box's SSH host key is not in known_hosts, or differs from the one recorded there."""
