"""The sidecar (issue 17): ``edgehft serve INSTALL_DIR`` runs :func:`edgehft.serve`'s :class:`~edgehft.serving.Server`
in a process of its own and answers ``predict`` over a Unix datagram socket (``AF_UNIX``, ``SOCK_DGRAM``), for a
strategy that wants the model out of its process. The reference client: :class:`edgehft.serving.client.SidecarClient`.

One request is one datagram, one reply is one datagram; all integers little-endian::

    header  16 bytes   magic b"EHSC" | version u8 (1) | kind u8 | count u16 | request id u64
                       kind (request): 1 predict, 2 status, 3 rollback
                       kind (reply): the status, 0 ok, else the edgehft error's exit code (edgehft.errors)
    tensor  40 bytes   dtype code u8 | ndim u8 | 2 pad | nbytes u32 | 8 x dim u32 (unused dims 0)
                       one per input (request) or output (reply), ``count`` of them, after the header
    data               each tensor's raw bytes, C order, padded to 8 bytes, in the tensors' order

A predict reply carries the outputs as ``predict`` returns them (float32, batch 1). An error reply, a status and
a rollback reply carry ``count`` 0 and a UTF-8 JSON payload after the header: ``{"type", "message", "hint"}`` for
an error (the error class of :mod:`edgehft.errors`, e.g. ``ShapeError``, the same one ``runner.predict`` raises),
the status dict (:meth:`Sidecar.status`), ``{"active": version}`` after a rollback.

Bad input never stops the loop: a window ``predict`` refuses gets that error back; a datagram that is not a request
(bad magic, sizes that do not add up, truncated at the datagram limit) gets an InputError reply when it has a sender
address, else it is dropped; both are counted (``malformed``, ``dropped``). A reply the client cannot take (it is
gone, or its queue is full: replies are sent ``MSG_DONTWAIT``) is dropped and counted (``reply_failed``).

The loop allocates no buffer per request: the datagram is received into one preallocated buffer
(``recvmsg_into``), the windows handed to ``predict`` are numpy views on it (built once per input layout), the
outputs are copied into a preallocated reply buffer whose tensor descriptors are written once per output layout.
What is left per request is Python's own (a header tuple, a few small objects).

The datagram limit: on Linux the largest datagram is about the sender's ``SO_SNDBUF`` (capped by
``net.core.wmem_max``). At start the sidecar raises its own, measures the largest datagram that passes (a probe on a
socket pair) and refuses to start (BoardUnavailableError, exit 7) when the active version's request (its windows as
float32, or its own dtype when wider) or reply does not fit.

What the transport adds to ``predict``: per call two system calls each side (send, receive), two wake-ups of a
blocked thread, and the loop's header parsing and copies, in Python; ``benchmarks/serve_sidecar.py`` measures it
against ``runner.predict`` in one process.
"""
from __future__ import annotations

import json
import math
import os
import socket
import stat
import struct
import time

import numpy as np

from edgehft.errors import BoardUnavailableError, DTypeError, EdgeHFTError, InputError, ShapeError

MAGIC = b"EHSC"
VERSION = 1
PREDICT, STATUS, ROLLBACK = 1, 2, 3
HEADER = struct.Struct("<4sBBHQ")          # magic, version, kind | status, count, request id
TENSOR = struct.Struct("<BBxxI8I")         # dtype code, ndim, nbytes, dims
MAX_DIMS, MAX_TENSORS = 8, 64
DTYPES = {1: np.dtype("float32"), 2: np.dtype("float64"), 3: np.dtype("int8"), 4: np.dtype("uint8"),
          5: np.dtype("int16"), 6: np.dtype("uint16"), 7: np.dtype("int32"), 8: np.dtype("int64"),
          9: np.dtype("float16")}
CODES = {dt: code for code, dt in DTYPES.items()}
WANT_SNDBUF = 1 << 20                       # asked for; the kernel caps it at net.core.wmem_max


def pad8(n: int) -> int:
    """``n`` rounded up to a multiple of 8 (each tensor's data starts 8-byte aligned)."""
    return (n + 7) & ~7


def message_size(arrays_meta) -> int:
    """Bytes of one message carrying tensors ``arrays_meta`` (``[(shape, dtype), ...]``): header, descriptors,
    padded data."""
    return HEADER.size + TENSOR.size * len(arrays_meta) + sum(
        pad8(math.prod(shape) * np.dtype(dt).itemsize) for shape, dt in arrays_meta)


def pack_tensors(buf, arrays) -> int:
    """Write the descriptors and data of ``arrays`` (numpy arrays of a dtype in :data:`CODES`, at most 8 dims)
    after the header of ``buf`` (a writable bytearray); returns the message's length in bytes.

    Raises:
        DTypeError: a dtype the protocol does not carry; ShapeError: more than 8 dims;
        InputError: the message is larger than ``buf``."""
    off = HEADER.size + TENSOR.size * len(arrays)
    at = HEADER.size
    mv = memoryview(buf)
    for i, a in enumerate(arrays):
        code = CODES.get(a.dtype)
        if code is None:
            raise DTypeError(f"input {i}: dtype {a.dtype} cannot travel to the sidecar",
                             hint="pass float32 windows (or the model's own dtype)")
        if a.ndim > MAX_DIMS:
            raise ShapeError(f"input {i}: {a.ndim} dimensions, the sidecar protocol carries at most {MAX_DIMS}")
        if off + a.nbytes > len(buf):
            raise InputError(f"message of {off + a.nbytes} bytes or more: over the datagram limit {len(buf)} bytes",
                             hint="a smaller window, or raise net.core.wmem_max on this machine")
        TENSOR.pack_into(buf, at, code, a.ndim, a.nbytes, *a.shape, *([0] * (MAX_DIMS - a.ndim)))
        at += TENSOR.size
        mv[off:off + a.nbytes] = memoryview(np.ascontiguousarray(a)).cast("B")
        off = pad8(off + a.nbytes)
    return off


class Malformed(Exception):
    """A datagram that is not a well-formed message (the sidecar answers InputError, the client raises it)."""


def unpack_tensors(buf, count: int, length: int) -> list:
    """The ``count`` tensors of the message in ``buf[:length]`` as numpy views on ``buf`` (no copy).

    Raises:
        Malformed: unknown dtype code, more than 8 dims, sizes that do not add up to ``length``."""
    if count > MAX_TENSORS:
        raise Malformed(f"{count} tensors in one message (at most {MAX_TENSORS})")
    off = HEADER.size + TENSOR.size * count
    if off > length:
        raise Malformed(f"{length} bytes cannot hold the header and {count} tensor descriptors ({off} bytes)")
    out, end = [], off
    for i in range(count):
        code, ndim, nbytes, *dims = TENSOR.unpack_from(buf, HEADER.size + i * TENSOR.size)
        dt = DTYPES.get(code)
        if dt is None or ndim > MAX_DIMS:
            raise Malformed(f"tensor {i}: dtype code {code} or {ndim} dims not known to protocol {VERSION}")
        shape = tuple(dims[:ndim])
        if math.prod(shape) * dt.itemsize != nbytes or off + nbytes > length:
            raise Malformed(f"tensor {i}: shape {shape} {dt} is not its {nbytes} bytes, or runs past the "
                            f"{length}-byte message")
        out.append(np.frombuffer(buf, dtype=dt, count=nbytes // dt.itemsize, offset=off).reshape(shape))
        end = off + nbytes
        off = pad8(end)
    if length > off:
        raise Malformed(f"{length - end} bytes after the last tensor")
    return out


def error_payload(exc: BaseException) -> tuple[int, bytes]:
    """(status, JSON payload) of an error reply: an EdgeHFTError's exit code, class, message and hint; anything
    else exit 1 with its class name."""
    if isinstance(exc, EdgeHFTError):
        status, msg, hint = exc.exit_code, exc.args[0] if exc.args else "", exc.hint
    elif isinstance(exc, Malformed):
        status, msg, hint = InputError.exit_code, f"malformed request: {exc}", \
            "send requests made by edgehft.serving.client (protocol in edgehft.serving.sidecar)"
        exc = InputError(msg)
    else:
        status, msg, hint = 1, f"{type(exc).__name__}: {exc}", "see the sidecar's log"
    body = {"type": type(exc).__name__, "message": str(msg), "hint": hint}
    return max(1, min(255, int(status))), json.dumps(body).encode()


def max_datagram(sndbuf: int) -> int:
    """The largest datagram (bytes) a Unix datagram socket with ``SO_SNDBUF`` = ``sndbuf`` (as the kernel reports
    it) sends here: a binary search with a socket pair (about 20 sends, at start only)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf // 2)   # the kernel doubles what it is given
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sndbuf // 2)
        data, rx = bytearray(sndbuf + 1), bytearray(sndbuf + 1)
        lo, hi = 0, sndbuf + 1                  # lo passes, hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                a.send(memoryview(data)[:mid], socket.MSG_DONTWAIT)
                b.recv_into(rx)
                lo = mid
            except OSError:
                hi = mid
        return lo
    finally:
        a.close()
        b.close()


def check_fits(inputs, outputs, limit: int) -> tuple[int, int]:
    """(request, reply) bytes of the model whose inputs/outputs are ``[(shape, dtype), ...]``: a window as float32
    (its own dtype when wider), outputs float32.

    Raises:
        BoardUnavailableError: either is over ``limit`` (the largest datagram here)."""
    req = message_size([(s, np.float32 if np.dtype(d).itemsize <= 4 else d) for s, d in inputs])
    rep = message_size([(s, np.float32) for s, _ in outputs])
    if max(req, rep) > limit:
        raise BoardUnavailableError(
            f"the model's {'request' if req > limit else 'reply'} is {max(req, rep)} bytes, over the largest "
            f"Unix datagram here ({limit} bytes)",
            hint="raise net.core.wmem_max (sysctl -w net.core.wmem_max=4194304), or serve in-process (edgehft.serve)")
    return req, rep


def _claim_path(path: str) -> None:
    """Remove a stale socket file at ``path`` (nothing listens there); refuse a live one or a file that is not a
    socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise InputError(f"--socket {path}: exists and is not a socket", hint="give a free path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)                          # stale: left by a sidecar that did not exit cleanly
        return
    except OSError as exc:
        raise InputError(f"--socket {path}: cannot check the socket there: {exc}",
                         hint="give a path of your own") from exc
    finally:
        probe.close()
    raise BoardUnavailableError(f"--socket {path}: another process serves on it",
                                hint="stop that sidecar, or give another --socket path")


def bind_socket(path: str, group=None, sndbuf: int = WANT_SNDBUF) -> socket.socket:
    """A Unix datagram socket bound at ``path``, mode 0600 (0660 and group ``group``, a name or gid, when given),
    ``SO_SNDBUF``/``SO_RCVBUF`` raised to ``sndbuf`` (capped by the kernel).

    Raises:
        InputError: the path is too long, not creatable, not a socket, or the group unknown or not yours;
        BoardUnavailableError: another process serves on it."""
    _claim_path(path)
    gid = None
    if group is not None:
        import grp
        try:
            gid = int(group) if str(group).isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise InputError(f"--group {group}: no such group", hint="a group name or gid on this machine") from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise InputError(f"--socket {path}: cannot bind: {exc}",
                         hint="a writable directory and a path under 108 bytes") from exc
    finally:
        os.umask(old)
    try:
        if gid is not None:
            os.chown(path, -1, gid)
            os.chmod(path, 0o660)
    except OSError as exc:
        sock.close()
        os.unlink(path)
        raise InputError(f"--group {group}: cannot give the socket to it: {exc}",
                         hint="a group you are a member of") from exc
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, sndbuf)
    return sock


def release_socket(sock: socket.socket, path: str, ino: int) -> None:
    """Close ``sock`` (from :func:`bind_socket`) and remove its file at ``path`` if it is still the one bound then
    (inode ``ino``: ``os.stat(path).st_ino`` right after the bind)."""
    sock.close()
    try:
        if os.stat(path).st_ino == ino:
            os.unlink(path)
    except OSError:
        pass


class Sidecar:
    """The serving loop of ``edgehft serve``: ``server`` (a :class:`~edgehft.serving.Server`) answers the requests
    arriving on a Unix datagram socket at ``path`` (protocol: the module docstring). :meth:`serve_forever` runs the
    loop in the calling thread (the serving thread: pin it there) until :meth:`stop`; :meth:`close` removes the
    socket file. ``on_event`` gets the sidecar's own events (``listening``).

    Raises (at construction): what :func:`bind_socket` raises; BoardUnavailableError when the active version's
    request or reply does not fit a datagram here (:func:`check_fits`)."""

    def __init__(self, server, path, *, group=None, sndbuf: int = WANT_SNDBUF, on_event=None, spin: bool = False,
                 sock: socket.socket | None = None):
        self.server, self.path, self.spin = server, str(path), bool(spin)
        self.counters = dict(requests=0, predictions=0, errors=0, malformed=0, dropped=0, control=0, reply_failed=0)
        self._stopping, self._specs = False, None
        self._sock = sock if sock is not None else bind_socket(self.path, group, sndbuf)   # sock: bound at path
        self._ino = os.stat(self.path).st_ino
        try:
            self.sndbuf = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            self.max_datagram = max_datagram(self.sndbuf)
            ins, outs = self._active_specs()
            self.request_bytes, self.reply_bytes = check_fits(ins, outs, self.max_datagram)
        except BaseException:
            self.close()
            raise
        self._rbuf, self._sbuf = bytearray(self.max_datagram + 1), bytearray(self.max_datagram)
        self._rmv, self._smv = memoryview(self._rbuf), memoryview(self._sbuf)
        self._in_cache: dict = {}              # descriptor bytes -> (message length, views on _rbuf)
        self._out_key, self._out_views, self._out_len = None, None, 0
        if on_event is not None:
            on_event({"event": "listening", "version": server.active, "socket": self.path, "pid": os.getpid(),
                      "max_datagram": self.max_datagram, "request_bytes": self.request_bytes,
                      "reply_bytes": self.reply_bytes, "spin": self.spin})

    # --- the loop ----------------------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """Answer requests until :meth:`stop` (from a signal handler or another thread). With ``spin`` the loop
        polls the socket (non-blocking receives, 100 % of its core) instead of sleeping in the kernel until a
        request comes: the request no longer waits for this thread to be woken and scheduled."""
        recv, bufs = self._sock.recvmsg_into, [self._rbuf]
        flags_in = socket.MSG_DONTWAIT if self.spin else 0
        while not self._stopping:
            try:
                n, _, flags, addr = recv(bufs, 0, flags_in)
            except BlockingIOError:               # spin: nothing yet
                continue
            if self._stopping:
                break
            self.counters["requests"] += 1
            try:
                self._handle(n, flags, addr)
            except Exception as exc:              # never stops the loop: answered, or counted
                self._reply_error(exc, addr, self._request_id(n))

    def stop(self) -> None:
        """Make :meth:`serve_forever` return after the request in progress (safe in a signal handler: it sets a
        flag and shuts the socket's receive side, which wakes a blocked receive; clients' sends then fail)."""
        self._stopping = True
        try:
            self._sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def close(self) -> None:
        """Close the socket and remove its file (only if it is still this sidecar's)."""
        release_socket(self._sock, self.path, self._ino)

    def _handle(self, n: int, flags: int, addr) -> None:
        if flags & socket.MSG_TRUNC:
            raise Malformed(f"request over the sidecar's datagram limit ({self.max_datagram} bytes)")
        if n < HEADER.size:
            raise Malformed(f"{n} bytes, shorter than the {HEADER.size}-byte header")
        magic, version, kind, count, rid = HEADER.unpack_from(self._rbuf, 0)
        if magic != MAGIC or version != VERSION:
            raise Malformed(f"magic {bytes(magic)!r} version {version}, expected {MAGIC!r} version {VERSION}")
        if kind == PREDICT:
            return self._predict(n, count, rid, addr)
        self.counters["control"] += 1
        try:
            if kind == STATUS:
                body = self.status()
            elif kind == ROLLBACK:
                body = {"active": self.server.rollback(why="asked by a sidecar client")}
            else:
                raise Malformed(f"request kind {kind} (1 predict, 2 status, 3 rollback)")
        except Exception as exc:
            return self._reply_error(exc, addr, rid)
        self._send_payload(0, rid, json.dumps(body, default=str).encode(), addr)

    def _predict(self, n: int, count: int, rid: int, addr) -> None:
        key = bytes(self._rmv[HEADER.size:HEADER.size + TENSOR.size * count])
        hit = self._in_cache.get(key)
        if hit is None or hit[0] != n:
            hit = (n, unpack_tensors(self._rbuf, count, n))
            if len(self._in_cache) >= 16:
                self._in_cache.clear()
            self._in_cache[key] = hit
        try:
            y = self.server.predict(*hit[1])
        except Exception as exc:
            return self._reply_error(exc, addr, rid)
        outs = y if isinstance(y, tuple) else (y,)
        if self._out_key is None or len(outs) != len(self._out_key) or \
                any(a is not b for a, b in zip(outs, self._out_key)):
            self._layout_outputs(outs)
        for view, a in zip(self._out_views, outs):
            np.copyto(view, a)
        HEADER.pack_into(self._sbuf, 0, MAGIC, VERSION, 0, len(outs), rid)
        self.counters["predictions"] += 1
        self._send(self._out_msg, addr)

    def _layout_outputs(self, outs) -> None:
        """Descriptors of ``outs`` written into the reply buffer once, and views where their data goes (kept
        while ``predict`` returns the same output buffers, as a runner does)."""
        self._out_len = pack_tensors(self._sbuf, [np.ascontiguousarray(a) for a in outs])
        off, views = HEADER.size + TENSOR.size * len(outs), []
        for a in outs:
            views.append(np.frombuffer(self._sbuf, dtype=a.dtype, count=a.size, offset=off).reshape(a.shape))
            off = pad8(off + a.nbytes)
        self._out_key, self._out_views = tuple(outs), views
        self._out_msg = self._smv[:self._out_len]

    # --- replies -----------------------------------------------------------------------------------------------
    def _send(self, msg, addr) -> None:
        if not addr:
            self.counters["dropped"] += 1
            return
        try:
            self._sock.sendto(msg, socket.MSG_DONTWAIT, addr)
        except OSError:                           # the client is gone or not reading: its loss, not the loop's
            self.counters["reply_failed"] += 1

    def _send_payload(self, status: int, rid: int, payload: bytes, addr) -> None:
        msg = bytearray(HEADER.size + len(payload))
        HEADER.pack_into(msg, 0, MAGIC, VERSION, status, 0, rid)
        msg[HEADER.size:] = payload
        if len(msg) > self.max_datagram:      # a status that big: say so rather than send nothing
            return self._send_payload(1, rid, json.dumps({"type": "EdgeHFTError", "message": "reply too large",
                                                          "hint": None}).encode(), addr)
        self._send(msg, addr)

    def _reply_error(self, exc: BaseException, addr, rid: int) -> None:
        """The error reply (counted: ``malformed`` for a datagram that is not a request, else ``errors``)."""
        self.counters["malformed" if isinstance(exc, Malformed) else "errors"] += 1
        status, payload = error_payload(exc)
        self._send_payload(status, rid, payload, addr)

    def _request_id(self, n: int) -> int:
        """The request id of a datagram whose header is whole (its reply names it), else 0."""
        return HEADER.unpack_from(self._rbuf, 0)[4] if n >= HEADER.size else 0

    # --- control -----------------------------------------------------------------------------------------------
    def _active_specs(self):
        """([(shape, dtype)] inputs, [(shape, dtype)] outputs) of the active version, from the manifest its runner
        opened and verified (:attr:`edgehft.serving.Server.runner`; cached for that runner)."""
        runner = self.server.runner
        if self._specs is None or self._specs[0] is not runner:
            m = runner.bundle.manifest
            self._specs = (runner, ([(tuple(s.shape), s.dtype) for s in m.inputs],
                                    [(tuple(s.shape), s.dtype) for s in m.outputs]))
        return self._specs[1]

    def status(self) -> dict:
        """``{"active", "previous", "pid", "socket", "max_datagram", "counters", "inputs", "outputs", "events",
        "last_event", "time_utc"}``: ``inputs``/``outputs`` the active version's ``[{"shape", "dtype"}]`` (the
        bundle's own dtypes: predict takes float32 windows for quantized inputs), ``events`` how many the server
        emitted."""
        ins, outs = self._active_specs()
        events = self.server.events
        return {"active": self.server.active, "previous": self.server.previous, "pid": os.getpid(),
                "socket": self.path, "max_datagram": self.max_datagram, "counters": dict(self.counters),
                "inputs": [{"shape": list(s), "dtype": d} for s, d in ins],
                "outputs": [{"shape": list(s), "dtype": d} for s, d in outs],
                "events": self.server.events_emitted, "last_event": events[-1] if events else None,
                "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
