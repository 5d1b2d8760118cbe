"""The reference client of the sidecar (``edgehft serve``, :mod:`edgehft.serving.sidecar`: its module docstring has
the protocol, one datagram each way per call).

    from edgehft.serving.client import SidecarClient
    with SidecarClient("/opt/edgehft/serve.sock") as c:
        y = c.predict(window)            # float32 (1, ...) as runner.predict returns it, a tuple for several outputs
        c.status()["active"]             # the version answering
        c.rollback()                     # the previous version, kept warm by the sidecar: at once

Errors come back as the edgehft error the sidecar's ``predict`` raised (ShapeError, DTypeError, NonFiniteInputError,
..., with its message and hint, and so its exit code); :class:`SidecarUnavailableError` (exit 7) when nothing
answers. One call at a time per client (it owns one socket and one pair of buffers); a thread per client.
"""
from __future__ import annotations

import json
import socket
import struct
import time

import numpy as np

from edgehft import errors
from edgehft.errors import BoardUnavailableError, DTypeError, EdgeHFTError
from edgehft.serving.sidecar import (HEADER, MAGIC, PREDICT, ROLLBACK, STATUS, TENSOR, VERSION, WANT_SNDBUF,
                                     Malformed, pack_tensors, unpack_tensors)

_BY_EXIT = {1: errors.RunnerStateError, 3: errors.InputError, 4: errors.ConverterError, 5: errors.DriftError,
            6: errors.BundleError, 7: errors.BoardUnavailableError, 8: errors.GoldenMismatchError,
            9: errors.DeployError, 10: errors.RemoteError}


class SidecarUnavailableError(BoardUnavailableError):
    """No sidecar answers on the socket: not started, gone, or no reply within the client's timeout."""


def error_from_reply(status: int, payload: bytes) -> EdgeHFTError:
    """The edgehft error an error reply describes: the class it names in :mod:`edgehft.errors` (else the class of
    its exit code), with the sidecar's message and hint."""
    try:
        body = json.loads(payload.decode())
    except (UnicodeDecodeError, ValueError):
        body = {"message": f"error reply with status {status} and an unreadable payload"}
    cls = getattr(errors, str(body.get("type", "")), None)
    if not (isinstance(cls, type) and issubclass(cls, EdgeHFTError)):
        cls = _BY_EXIT.get(status, EdgeHFTError)
    return cls(str(body.get("message", "")), hint=body.get("hint"))


class SidecarClient:
    """A client of the sidecar listening on ``path`` (``edgehft serve``'s ``--socket``, default
    ``<install_dir>/serve.sock``). ``timeout`` (s) bounds each call's wait for its reply (the kernel's
    ``SO_RCVTIMEO``: no extra system call per request); ``max_datagram`` the reply buffer (bytes). ``spin``: wait
    for each reply by polling the socket (non-blocking receives, this thread at 100 % until the reply) instead of
    sleeping in the kernel: with a sidecar started with ``--spin`` on a core of its own, neither side waits to
    be woken (``benchmarks/serve_sidecar.py`` measures both).

    Raises (at construction): SidecarUnavailableError when no sidecar listens on ``path``."""

    def __init__(self, path, timeout: float = 5.0, max_datagram: int = 1 << 20, spin: bool = False):
        self.path, self.timeout, self.spin = str(path), float(timeout), bool(spin)
        self._sbuf, self._rbuf = bytearray(max_datagram), bytearray(max_datagram + 1)
        self._rbufs, self._next = [self._rbuf], 1
        self._in_layouts: dict = {}    # (dtype, shape) per window -> (message, views on _sbuf)
        self._out_layouts: dict = {}   # reply descriptor bytes -> views on _rbuf
        self._sock = None
        self._connect()

    def _connect(self) -> None:
        if self._sock is not None:
            self._sock.close()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            s.bind("")                                  # an abstract address of its own, for the replies (Linux)
            for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                s.setsockopt(socket.SOL_SOCKET, opt, WANT_SNDBUF)
            sec = int(self.timeout)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                         struct.pack("ll", sec, int((self.timeout - sec) * 1e6)))
            s.connect(self.path)
        except OSError as exc:
            s.close()
            raise SidecarUnavailableError(f"no sidecar answers on {self.path}: {exc}",
                                          hint="start one: edgehft serve INSTALL_DIR (--socket PATH)") from exc
        self._sock = s

    # --- calls -------------------------------------------------------------------------------------------------
    def predict(self, *windows):
        """``predict`` of the sidecar's active version on ``windows`` (one numpy array per model input, as
        ``runner.predict`` takes them). Returns float32 output(s) with the output's shape (batch 1): an array, a
        tuple for several outputs; fresh arrays (yours to keep).

        Raises:
            ShapeError, DTypeError, NonFiniteInputError: what the sidecar's predict raised (its message);
            DTypeError: a window that is not a numpy array or of a dtype the protocol does not carry;
            InputError: a request over the datagram limit; SidecarUnavailableError: no reply within ``timeout``."""
        rid = self._take_id()
        msg = self._pack(windows)
        HEADER.pack_into(self._sbuf, 0, MAGIC, VERSION, PREDICT, len(windows), rid)
        count, n = self._call(msg, rid)
        key = bytes(self._rbuf[HEADER.size:HEADER.size + TENSOR.size * count])
        views = self._out_layouts.get(key)
        if views is None:
            try:
                views = unpack_tensors(self._rbuf, count, n)
            except Malformed as exc:
                raise SidecarUnavailableError(f"the sidecar's reply is malformed: {exc}",
                                              hint="client and sidecar of the same edgehft version") from exc
            self._out_layouts = {key: views}   # one output layout at a time: a version's
        if len(views) == 1:
            return views[0].copy()
        return tuple(v.copy() for v in views)

    def _pack(self, windows):
        """The request's descriptors and data in the send buffer (descriptors written once per window layout);
        returns the whole message (a view on the buffer; the caller writes its header)."""
        key = tuple((w.dtype, w.shape) if isinstance(w, np.ndarray) else None for w in windows)
        hit = self._in_layouts.get(key)
        if hit is None:
            for i, w in enumerate(windows):
                if not isinstance(w, np.ndarray):
                    raise DTypeError(f"input {i}: expected a numpy array, got {type(w).__name__}")
            n = pack_tensors(self._sbuf, windows)          # also raises what the protocol cannot carry
            hit = (memoryview(self._sbuf)[:n], unpack_tensors(self._sbuf, len(windows), n))
            self._in_layouts = {key: hit}                  # the layout whose descriptors the buffer holds
            return hit[0]
        for v, w in zip(hit[1], windows):
            np.copyto(v, w)
        return hit[0]

    def status(self) -> dict:
        """The sidecar's status: ``active``, ``previous`` (version ids), ``counters`` (requests, predictions,
        errors, malformed, dropped, control, reply_failed), ``inputs``/``outputs``, ``max_datagram``, ``pid``, ...
        (:meth:`edgehft.serving.sidecar.Sidecar.status`). Raises SidecarUnavailableError: no reply."""
        return self._control(STATUS)

    def rollback(self) -> str:
        """Swap the sidecar back to its previous version at once; returns the version now active.

        Raises:
            InputError: no version was swapped out yet; SidecarUnavailableError: no reply."""
        return self._control(ROLLBACK)["active"]

    def close(self) -> None:
        """Close the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the round trip ----------------------------------------------------------------------------------------
    def _take_id(self) -> int:
        rid, self._next = self._next, (self._next + 1) & 0xFFFFFFFFFFFFFFFF or 1
        return rid

    def _control(self, kind: int) -> dict:
        rid = self._take_id()
        HEADER.pack_into(self._sbuf, 0, MAGIC, VERSION, kind, 0, rid)
        _, n = self._call(memoryview(self._sbuf)[:HEADER.size], rid)
        return json.loads(bytes(self._rbuf[HEADER.size:n]).decode())

    def _call(self, msg, rid: int) -> tuple[int, int]:
        """Send ``msg``, wait for the reply to ``rid`` (stale replies to earlier, timed-out calls are skipped);
        returns (tensor count, reply length). Raises the reply's error, or SidecarUnavailableError."""
        if self._sock is None:
            raise errors.RunnerStateError("the sidecar client is closed", hint="make a new SidecarClient")
        try:
            self._sock.send(msg)
        except (ConnectionRefusedError, FileNotFoundError, BrokenPipeError):
            self._connect()                              # the sidecar restarted at the same path: once more
            self._send_again(msg)
        except OSError as exc:
            if exc.errno == 90:                          # EMSGSIZE
                raise errors.InputError(f"request of {len(msg)} bytes does not fit a datagram here: {exc}",
                                        hint="raise net.core.wmem_max, or serve in-process") from exc
            raise SidecarUnavailableError(f"cannot send to the sidecar on {self.path}: {exc}") from exc
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                n, flags = self._receive(deadline)
            except OSError as exc:                       # BlockingIOError: SO_RCVTIMEO (or the spin) ran out
                raise SidecarUnavailableError(f"no reply from the sidecar on {self.path} within {self.timeout} s "
                                              f"({exc})", hint="is it running (edgehft serve)? a longer timeout?")
            if n >= HEADER.size and not flags & socket.MSG_TRUNC:
                magic, version, status, count, got = HEADER.unpack_from(self._rbuf, 0)
                if magic == MAGIC and got == rid:
                    if status:
                        raise error_from_reply(status, bytes(self._rbuf[HEADER.size:n]))
                    return count, n
            if time.monotonic() > deadline:
                raise SidecarUnavailableError(f"no reply to request {rid} from the sidecar within {self.timeout} s")

    def _receive(self, deadline: float) -> tuple[int, int]:
        """One datagram into the reply buffer: (length, flags). Blocking (the socket's SO_RCVTIMEO), or with
        ``spin`` non-blocking receives until one comes or ``deadline`` (time.monotonic) passes (then
        BlockingIOError, as the timeout)."""
        if not self.spin:
            n, _, flags, _ = self._sock.recvmsg_into(self._rbufs)
            return n, flags
        recv, bufs, dontwait, now = self._sock.recvmsg_into, self._rbufs, socket.MSG_DONTWAIT, time.monotonic
        while True:
            try:
                n, _, flags, _ = recv(bufs, 0, dontwait)
                return n, flags
            except BlockingIOError:
                if now() > deadline:
                    raise

    def _send_again(self, msg) -> None:
        try:
            self._sock.send(msg)
        except OSError as exc:
            raise SidecarUnavailableError(f"the sidecar on {self.path} does not take requests: {exc}",
                                          hint="is it running (edgehft serve)?") from exc
