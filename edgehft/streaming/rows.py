"""Row bookkeeping of the streaming analysis: what each row of a tensor is, window t+1 against window t.

Window t+1 is window t with its oldest row dropped and one new row appended. For a tensor with a time axis
(:class:`Rows`), row ``i`` of window t+1 is

- ``cached``: equal to row ``i + 1`` of window t (computed one tick ago, one position lower: a ring
  buffer keeps it);
- ``constant``: equal to row ``i`` of window t, in every window (padding rows, rows made of constants);
- ``prepared``: none of those, but it does not depend on the newest row: computable before the tick;
- ``critical``: it depends on the newest row (on the critical path from tick to signal).

A tensor without a time axis (:class:`Whole`: after a recurrence's last step or a reduction over time) is
``constant``, ``prepared`` or ``critical`` as a whole.

An op's output row is derived from the *taps* it reads (:meth:`Env.derive_rows`): the rows of its inputs,
padding, constant rows. A row is critical if a tap is; constant if every tap is; cached if each of its taps
at t+1 equals the matching tap of the next row at t (the op computes every row with the same function of
its taps: convolutions, pools, elementwise ops, copies); prepared otherwise. The rule is exact for the
equality it claims (a cached row *is* the previous window's row): it may call a row prepared that happens
to be equal, never the reverse. Tap forms: ``("r", tensor, row)``, ``("w", tensor)`` (a whole tensor),
``("k", key)`` (a constant value, ``key`` from :meth:`Env.key`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

CACHED, CONSTANT, PREPARED, CRITICAL = "cached", "constant", "prepared", "critical"
STATUSES = (CACHED, CONSTANT, PREPARED, CRITICAL)

# Keys of the values that padding reads: TFLite CONV_2D / DEPTHWISE_CONV_2D and PAD pad with real zero (the
# zero point in int8); a pool's padded taps are left out of the max / mean, which is no value at all.
ZERO = "zero"
POOL_PAD = "pool padding"


@dataclass
class Rows:
    """A tensor with a time axis: ``axis`` in its shape, ``sub`` consecutive indices of that axis per time row
    (1, or more where a reshape folded time into a feature axis: Flatten), per row its ``status`` and, for
    constant rows, the interned ``keys`` of their values. ``reversed``: the rows run newest first (a
    REVERSE_V2 along time: a Bidirectional layer's backward half)."""

    axis: int
    sub: int
    status: list
    keys: list
    reversed: bool = False

    @property
    def length(self) -> int:
        return len(self.status)

    def which(self, status: str) -> tuple:
        """The row indices with ``status``, ascending."""
        return tuple(i for i, s in enumerate(self.status) if s == status)


@dataclass
class Whole:
    """A tensor without a time axis: ``status`` (constant / prepared / critical) and its value's key when
    constant."""

    status: str
    key: object = None


def window_input(axis: int, length: int) -> Rows:
    """The model input's rows: every row but the newest is the previous window's one row lower."""
    return Rows(axis, 1, [CACHED] * (length - 1) + [CRITICAL], [None] * length)


@dataclass
class Env:
    """The analysis state of one graph: ``state`` (tensor index -> :class:`Rows` | :class:`Whole`) for every
    tensor computed so far, ``model`` the :class:`~edgehft.ir.TFLiteModel`. Constant tensors are not in
    ``state``."""

    model: object
    state: dict = field(default_factory=dict)
    _keys: dict = field(default_factory=dict)

    @property
    def graph(self):
        return self.model.main

    def key(self, value) -> int:
        """An int standing for ``value`` (any hashable): equal values, equal keys."""
        return self._keys.setdefault(value, len(self._keys))

    def const(self, t: int) -> np.ndarray | None:
        """Constant tensor ``t``'s data, or None when ``t`` is omitted (-1) or not a constant."""
        if t < 0 or not self.graph.tensors[t].is_constant:
            return None
        return self.model.buffer(self.graph.tensors[t])

    def is_const(self, t: int) -> bool:
        return t >= 0 and self.graph.tensors[t].is_constant

    def shape(self, t: int) -> tuple:
        return tuple(self.graph.tensors[t].shape)

    def row_tap(self, t: int, j: int, pad_key=ZERO) -> tuple:
        """Row ``j`` of time tensor ``t`` as a tap; a row outside it is padding with value ``pad_key``."""
        rows = self.state[t]
        if 0 <= j < rows.length:
            return ("r", t, j)
        return ("k", self.key(pad_key))

    def const_row_tap(self, t: int, axis: int, j: int, sub: int = 1) -> tuple:
        """Time row ``j`` (indices ``j*sub`` to ``(j+1)*sub - 1`` along ``axis``) of constant tensor ``t`` as a
        constant tap, keyed by its bytes."""
        data = np.take(self.const(t), range(j * sub, (j + 1) * sub), axis=axis)
        return ("k", self.key(("const", data.dtype.str, data.shape, data.tobytes())))

    def whole_row_tap(self, t: int, j: int) -> tuple:
        """Row ``j`` of tensor ``t``, which has no time axis, placed along one: a constant gets a key of its own
        per row (rows of one constant differ), anything else is the whole tensor (new each window)."""
        s = self.state[t]
        if s.status == CONSTANT:
            return ("k", self.key(("row", j, s.key)))
        return ("w", t)

    def tap_status(self, tap: tuple) -> tuple:
        """``(status, key)`` of a tap at window t+1; ``key`` is None unless the status is constant."""
        if tap[0] == "k":
            return CONSTANT, tap[1]
        s = self.state[tap[1]]
        if tap[0] == "w":
            return s.status, s.key
        return s.status[tap[2]], s.keys[tap[2]]

    def same(self, a: tuple, b: tuple) -> bool:
        """Whether tap ``a`` at window t+1 is certainly equal to tap ``b`` at window t."""
        sa, ka = self.tap_status(a)
        if sa == CONSTANT:
            sb, kb = self.tap_status(b)
            return sb == CONSTANT and kb == ka
        return (sa == CACHED and a[0] == "r" and b[0] == "r" and a[1] == b[1] and b[2] == a[2] + 1)

    def derive_rows(self, op_key, taps: list, copy: bool = False) -> tuple:
        """``(status, keys)`` per output row of an op computing every row with the same function of its taps;
        ``taps[i]`` the taps row ``i`` reads, in the order the function takes them. ``copy``: each row is a copy
        of its one tap (PAD, slices, concatenation along time), so a constant row keeps its tap's key."""
        out = [self._derive_row(op_key, ti, taps[i + 1] if i + 1 < len(taps) else None, copy)
               for i, ti in enumerate(taps)]
        return [s for s, _ in out], [k for _, k in out]

    def _derive_row(self, op_key, ti: list, nxt, copy: bool) -> tuple:
        st = [self.tap_status(x) for x in ti]
        if any(s == CRITICAL for s, _ in st):
            return CRITICAL, None
        if all(s == CONSTANT for s, _ in st):
            if copy and len(st) == 1:
                return CONSTANT, st[0][1]
            return CONSTANT, self.key((op_key, tuple(k for _, k in st)))
        if nxt is not None and len(nxt) == len(ti) and all(self.same(a, b) for a, b in zip(ti, nxt)):
            return CACHED, None
        return PREPARED, None

    def derive_whole(self, op_key, taps: list) -> Whole:
        """A tensor without a time axis computed from ``taps``."""
        st = [self.tap_status(x) for x in taps]
        if any(s == CRITICAL for s, _ in st):
            return Whole(CRITICAL)
        if all(s == CONSTANT for s, _ in st):
            return Whole(CONSTANT, self.key((op_key, tuple(k for _, k in st))))
        return Whole(PREPARED)

    def all_taps(self, t: int) -> list:
        """Every row of tensor ``t`` as taps (one ``("w", t)`` tap for a whole tensor, none for a constant)."""
        s = self.state.get(t)
        if s is None:
            return []
        if isinstance(s, Whole):
            return [("w", t)]
        return [("r", t, j) for j in range(s.length)]
