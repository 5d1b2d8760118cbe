"""``predict_many`` one by one (:meth:`edgehft.runtime.base.Runner.predict_many` and the batched path's fallback,
:mod:`edgehft.runtime.batching`): the calls a list of windows makes, each result copied, a bad window named by
its index."""
from __future__ import annotations

import numpy as np

from edgehft.errors import InputError


def as_calls(windows) -> list[tuple]:
    """``windows`` (a list: one array per call for a one-input model, a tuple of arrays per call otherwise) as
    a list of per-call tuples.

    Raises:
        InputError: ``windows`` is an array or not a sequence (exit 3).
    """
    if isinstance(windows, np.ndarray) or not hasattr(windows, "__len__"):
        raise InputError(f"predict_many takes a list of windows, got {type(windows).__name__}",
                         hint="pass [x1, x2, ...] (a tuple of arrays per window for a model with several inputs)")
    return [w if isinstance(w, tuple) else (w,) for w in windows]


def with_index(exc: InputError, i: int, n: int) -> InputError:
    """``exc`` (a bad window's error) again, its message prefixed with which of the ``n`` windows it is."""
    return type(exc)(f"predict_many input {i} of {n}: {exc.args[0]}", hint=exc.hint)


def _copy(y):
    return tuple(a.copy() for a in y) if isinstance(y, tuple) else y.copy()


def loop_calls(predict, calls: list[tuple]) -> list:
    """``[copy of predict(*c) for c in calls]``.

    Raises:
        ShapeError, DTypeError, NonFiniteInputError: a bad window, the message naming its index (the windows
            before it have run; their results are dropped).
    """
    out = []
    for i, c in enumerate(calls):
        try:
            out.append(_copy(predict(*c)))
        except InputError as exc:
            raise with_index(exc, i, len(calls)) from None
    return out
