"""Buffer reuse for the native chain (the cpu runtime's native plans): each native kernel step writes its
output into a buffer shared with other steps whose outputs are not alive at the same time, so the chain
touches a few buffers that stay in the CPU's L2 cache instead of one fresh output buffer per kernel.

The plan is TFLite's arena idea on a straight-line chain: an output is alive from the step that writes it
to the last step that reads it (to the end for the chain's outputs); a buffer is reused by the first later
step whose output fits and starts after the buffer's current tenant is dead.
"""
from __future__ import annotations

import numpy as np


def plan_buffers(steps: list[tuple[list[str], str | None, int]], keep: set[str]) -> list[int | None]:
    """``steps``: per step ``(input names, output name or None, output bytes)`` in execution order; an
    output of None (LiteRT segments, which write their own buffers) takes no buffer. ``keep``: names read
    after the chain (its outputs). Returns per step the index of the shared buffer its output goes to, or
    None; buffer sizes are :func:`buffer_sizes` of the same arguments."""
    return _plan(steps, keep)[0]


def buffer_sizes(steps, keep) -> list[int]:
    """The byte size of each shared buffer :func:`plan_buffers` assigns."""
    return _plan(steps, keep)[1]


def _plan(steps, keep):
    last_use: dict[str, int] = {}
    for j, (ins, _, _) in enumerate(steps):
        for n in ins:
            last_use[n] = j
    end = len(steps)
    sizes: list[int] = []
    busy_until: list[int] = []          # per buffer: the last step that still reads its tenant
    where: list[int | None] = []
    for j, (_, out, nbytes) in enumerate(steps):
        if out is None:
            where.append(None)
            continue
        dies = end if out in keep else last_use.get(out, j)
        pick = None
        for b, until in enumerate(busy_until):      # a free buffer: its tenant was last read before step j
            if until < j and (pick is None or abs(sizes[b] - nbytes) < abs(sizes[pick] - nbytes)):
                pick = b
        if pick is None:
            sizes.append(nbytes)
            busy_until.append(dies)
            where.append(len(sizes) - 1)
        else:
            sizes[pick] = max(sizes[pick], nbytes)
            busy_until[pick] = dies
            where.append(pick)
    return where, sizes


def allocate(sizes: list[int]) -> list[np.ndarray]:
    """64-byte aligned zeroed byte buffers of the given sizes."""
    out = []
    for n in sizes:
        raw = np.zeros(n + 64, np.uint8)
        off = (-raw.ctypes.data) % 64
        out.append(raw[off:off + n])
    return out
