"""The cpu runtime's native plans (:mod:`edgehft.compiler.native`): a chain of LiteRT segments and native
kernel calls (LSTM, CONV_2D, MAX_POOL_2D, CONCATENATION, FULLY_CONNECTED, SOFTMAX, TANH / LOGISTIC, PAD; RESHAPE and
STRIDED_SLICE as views), tensors handed over by name, as ``native.json`` says.

A chain step is ``(kind, handle)``: ``views`` (a LiteRT segment read and written through its own buffers),
``litert`` (a segment through set/get_tensor), a view (``reshape``, ``slice``: ``(None, srcs, dst,
(index, shape))``) or a kernel (``(kernel, srcs, dst, out)``). :func:`run_step` runs one on a name -> array dict (the general path and
``bench --profile``); :func:`bind` resolves every hand-over once, with kernel outputs in shared buffers
(:mod:`edgehft.runtime.arena`), for the hot path.
"""
from __future__ import annotations

import ctypes
import functools
import json
from pathlib import Path

import numpy as np

from edgehft.runtime import litert

KERNELS = ("lstm", "conv2d", "maxpool", "concat", "fc", "softmax", "act", "pad")
VIEWS = ("reshape", "slice")
_OP_NAMES = {"lstm": "LSTM", "conv2d": "CONV_2D"}


def _view_of(x: np.ndarray, index, shape) -> np.ndarray:
    """A reshape (``index`` None) or a strided slice of ``x`` (per-dim ``{"start", "stop", "step"}`` or
    ``{"index"}``), reshaped to ``shape``; a view whenever numpy can make one."""
    if index is not None:
        x = x[tuple(slice(d["start"], d["stop"], d["step"]) if "index" not in d else d["index"] for d in index)]
    return x.reshape(shape)


class Chain:
    """The opened chain: ``steps`` [(kind, handle)], ``meta`` per step (placement, model or kernel, graph
    ops: what the profile shows), ``op_kernels`` (graph op -> "XNNPACK" | "native"), ``isa`` (native op ->
    the code path its kernel runs), ``inputs``/``outputs`` (tensor names). ``portable``: the kernels'
    portable paths (no AMX, no AVX-512), to measure how far another box's kernels may land.

    Raises :class:`~edgehft.errors.BundleError` (exit 6) for a ``native.json`` this edgehft cannot run (a
    missing field or file, an unknown step kind, inconsistent shapes); the steps opened so far are closed.
    One chain serves one thread at a time (as a LiteRT interpreter does)."""

    def __init__(self, bundle_path: Path, rel: str, threads: int, op_resolver: str, portable: bool = False):
        from edgehft.errors import BundleError
        self.steps, self.meta = [], []
        self.op_kernels: dict[int, str] = {}
        self.isa: dict[str, str] = {}
        try:
            self._open(Path(bundle_path), rel, threads, op_resolver, portable)
        except (KeyError, IndexError, TypeError, ValueError, OSError) as exc:
            self.close()
            raise BundleError(f"{rel} cannot be opened as a native chain ({type(exc).__name__}: {exc})",
                              hint="the bundle is damaged or was made by a newer edgehft: recompile it, or upgrade "
                                   "edgehft here") from None
        except BaseException:
            self.close()
            raise

    def _open(self, root: Path, rel: str, threads: int, op_resolver: str, portable: bool) -> None:
        graph = json.loads((root / rel).read_text())
        self.inputs, self.outputs = graph["inputs"], graph["outputs"]
        for st in graph["steps"]:
            kind = st["kind"]
            self.meta.append({"placement": "cpu" if kind == "litert" else "native", "model": st.get("model"),
                              "kernel": None if kind == "litert" else f"{kind} (a view, no copy)" if kind in VIEWS
                              else f"{st.get('what') or kind} (edgehft native)",
                              "ops": st.get("ops") or [st.get("op")]})
            if kind == "litert":
                self.steps.append(_open_segment(root, st, threads, op_resolver, self.op_kernels))
                continue
            self.op_kernels.update({i: "native" for i in (st.get("ops") or [st["op"]])})
            srcs, dst = tuple(st["inputs"]), st["outputs"][0]
            if kind in VIEWS:
                self.steps.append((kind, (None, srcs, dst, (st.get("index"), tuple(st["shape"])))))
                continue
            k, out = _open_kernel(root, st, portable)
            if kind in ("lstm", "conv2d"):
                self.isa[_OP_NAMES[kind]] = k.isa
            self.steps.append((kind, (k, srcs, dst, out)))

    def describe_path(self) -> str:
        return " + edgehft native " + ", ".join(f"{op} ({v})" for op, v in self.isa.items()) if self.isa else ""

    def close(self) -> None:
        steps, self.steps = self.steps, []
        for kind, h in steps:
            if kind in KERNELS:
                h[0].close()


def _open_segment(root: Path, st: dict, threads: int, op_resolver: str, op_kernels: dict):
    it = litert.make_interpreter(root / st["model"], threads, op_resolver)
    idx = {d["name"]: d["index"] for d in it.get_input_details() + it.get_output_details()}
    stateful = bool(litert.variable_tensors(root / st["model"]))
    op_kernels.update({st["ops"][i]: v for i, v in litert.delegated_ops(it).items()})
    ins = [(idx[n], n) for n in st["inputs"]]
    outs = [(idx[n], n) for n in st["outputs"]]
    views = litert.stable_views(it, [i for i, _ in ins] + [i for i, _ in outs])
    if views is None:
        return ("litert", (it, ins, outs, stateful))
    invoke = it._interpreter.Invoke           # copy into / read from the interpreter's own buffers
    if stateful:
        reset = it._interpreter.ResetVariableTensors

        def invoke(reset=reset, inv=invoke):
            reset()
            inv()
    return ("views", (invoke, list(zip(views[:len(ins)], (n for _, n in ins))),
                      list(zip(views[len(ins):], (n for _, n in outs))), it))


def _open_kernel(root: Path, st: dict, portable: bool = False):
    kind = st["kind"]
    if kind == "conv2d":
        from edgehft.kernels.cpu.conv import NativeConv2D
        with np.load(root / st["weights"]) as w:
            k = NativeConv2D(w["weights"], w["bias"] if "bias" in w.files else None, st["in_hw"], st["channels"],
                             st["stride"], st["padding"], activation=st["activation"], alpha=st["alpha"],
                             portable=portable)
        return k, k.out
    if kind == "maxpool":
        from edgehft.kernels.cpu.ops import NativeMaxPool2D
        k = NativeMaxPool2D(st["in_hw"], st["channels"], st["filter"], st["stride"], st["padding"], st["activation"])
        return k, k.out
    if kind == "concat":
        from edgehft.kernels.cpu.ops import NativeConcat
        k = NativeConcat(st["input_shapes"], st["axis"])
        return k, k.out
    if kind == "fc":
        from edgehft.kernels.cpu.ops import NativeDense
        with np.load(root / st["weights"]) as w:
            k = NativeDense(w["weights"], w["bias"] if "bias" in w.files else None, st["rows"], st["shape"],
                            st["activation"])
        return k, k.out
    if kind == "softmax":
        from edgehft.kernels.cpu.ops import NativeSoftmax
        k = NativeSoftmax(st["shape"], st["beta"])
        return k, k.out
    if kind == "act":
        from edgehft.kernels.cpu.ops import NativeActivation
        k = NativeActivation(st["shape"], st["act"])
        return k, k.out
    if kind == "pad":
        from edgehft.kernels.cpu.ops import NativePad
        k = NativePad(st["in_hw"], st["channels"], st["pads"])
        return k, k.out
    if kind == "lstm":
        from edgehft.kernels.cpu.lstm import NativeLSTM, recurrent_bf16_of
        with np.load(root / st["weights"]) as w:
            k = NativeLSTM([(w["kernel"], w["recurrent_kernel"], w["bias"])], st["timesteps"], True,
                           cell_clip=float(w["cell_clip"]), portable=portable,
                           recurrent_bf16=recurrent_bf16_of(st))
        if st.get("projected"):
            k.projected()
        return k, k.out.reshape(1, *k.out.shape)          # a view: (1, T, H)
    raise ValueError(f"native.json: unknown step kind {kind!r} (a newer edgehft made this bundle?)")


def _check_inputs(kind: str, k, srcs, xs) -> None:
    """The kernel was built for inputs of these sizes (from ``native.json``); a tensor handed over with
    another size means an inconsistent bundle: refuse it rather than read past a buffer."""
    want = [int(np.prod(s)) for s in k.input_shapes]
    got = [int(x.size) for x in xs]
    if got != want:
        from edgehft.errors import BundleError
        raise BundleError(f"native.json: the {kind} step reading {list(srcs)} gets {got} values, its kernel takes "
                          f"{want}", hint="the bundle is inconsistent: recompile it")


def run_step(kind: str, st, h, env: dict) -> None:
    """Run one chain step on ``env`` (tensor name -> array), in place. ``st`` is unused (the PYNQ
    runner's signature, so ``bench --profile`` times both the same way)."""
    if kind == "views":
        invoke, ins, outs, _ = h
        for view, name in ins:
            np.copyto(view, env[name].reshape(view.shape))
        invoke()
        for view, name in outs:
            env[name] = view
    elif kind == "litert":
        it, ins, outs, stateful = h
        for idx, name in ins:
            it.set_tensor(idx, env[name])
        if stateful:
            it.reset_all_variables()
        it.invoke()
        for idx, name in outs:
            env[name] = it.get_tensor(idx)
    elif kind in VIEWS:
        _, srcs, dst, (index, shape) = h
        env[dst] = _view_of(env[srcs[0]], index, shape)
    else:
        k, srcs, dst, out = h
        xs = [np.ascontiguousarray(env[s], np.float32) for s in srcs]
        _check_inputs(kind, k, srcs, xs)
        k.run_ptr(k.input_pointer(xs))
        env[dst] = out


def invoke(chain: Chain, staging_in, staging_out) -> None:
    """The general path: every step through :func:`run_step`, outputs copied to ``staging_out``."""
    env = dict(zip(chain.inputs, staging_in))
    for kind, h in chain.steps:
        run_step(kind, None, h, env)
    for name, buf in zip(chain.outputs, staging_out):
        np.copyto(buf, env[name].reshape(buf.shape))


def conv_links(chain: Chain) -> dict[int, int]:
    """Runs of convs the hot path links (:meth:`~edgehft.kernels.cpu.conv.NativeConv2D.linked_call`): step i ->
    step j when conv j reads conv i's output directly and is its only reader (no view, no other step, not a
    chain output), conv i is the only step writing it and runs before conv j, and both keep their inputs as bf16
    (AMX or VDPBF16PS). The fp32 tensor between them is then
    never written: conv i rounds its output into conv j's bf16 buffer, the bits conv j's own fill gives."""
    readers: dict[str, int] = {}
    for kind, h in chain.steps:
        names = [n for _, n in h[1]] if kind == "views" else list(h[1])
        for n in names:
            readers[n] = readers.get(n, 0) + 1
    for n in chain.outputs:
        readers[n] = readers.get(n, 0) + 2
    writers: dict[str, list] = {}                   # a name written twice (a hostile native.json) links nothing
    for i, (kind, h) in enumerate(chain.steps):
        for n in ([n for _, n in h[2]] if kind == "views" else [h[2]]):
            writers.setdefault(n, []).append(i)
    links = {}
    for j, (kind, h) in enumerate(chain.steps):
        src = h[1][0] if kind == "conv2d" and len(h[1]) == 1 else None
        if src is None or readers[src] != 1 or len(writers.get(src, ())) != 1 or src in chain.inputs:
            continue
        i = writers[src][0]
        if i >= j or chain.steps[i][0] != "conv2d":     # the producer runs first, and is a conv
            continue
        prod, cons = chain.steps[i][1][0], h[0]
        if prod.linkable and cons.linkable and cons.input_shape == prod.out.shape[1:]:
            links[i] = j
    return links


def bind(chain: Chain, staging_in, staging_out):
    """The hot path, when every buffer the chain hands over stays put (segments through their own
    buffers' views; kernel outputs in shared buffers planned by :mod:`edgehft.runtime.arena`, so the
    chain's working set stays small): each step's source and destination resolved once, one bound ctypes
    call per kernel (all of them as one native call list when there is no segment: :func:`native_calls`), a
    copy-in and invoke per segment, no name lookups. Returns ``(invoke, buffers,
    step_calls)`` (keep the buffers alive with the invoke; ``step_calls``: per chain step the call it
    makes, None for a view, for ``bench --profile``), or None when a hand-over could move (use
    :func:`invoke`)."""
    from edgehft.runtime import arena
    if any(kind not in ("views", *VIEWS, *KERNELS) for kind, _ in chain.steps):
        return None
    root: dict[str, str] = {}                   # a view's output lives in its source's buffer

    def r(n):
        return root.get(n, n)
    plan = []
    for kind, h in chain.steps:
        if kind == "views":
            plan.append(([r(n) for _, n in h[1]], None, 0))
        elif kind in VIEWS:
            root[h[2]] = r(h[1][0])
            plan.append(([r(h[1][0])], None, 0))
        else:
            plan.append(([r(n) for n in h[1]], h[2], h[3].nbytes))
    keep = {r(n) for n in chain.outputs}
    where = arena.plan_buffers(plan, keep)
    pool = arena.allocate(arena.buffer_sizes(plan, keep))
    env = dict(zip(chain.inputs, staging_in))
    calls, per_step, alive = [], [], []       # alive: what the bound calls point into, kept with the invoke
    links = conv_links(chain)
    linked_to = set(links.values())
    for idx, ((kind, h), slot) in enumerate(zip(chain.steps, where)):
        n_calls = len(calls)
        if kind == "views":
            inv, ins, outs, _ = h
            pairs = [(view, env[name].reshape(view.shape)) for view, name in ins]
            if not all(np.may_share_memory(src, env[name]) for (_, src), (_, name) in zip(pairs, ins)):
                return None                     # a reshape that copies would read stale data

            def seg(pairs=tuple(pairs), inv=inv, copy=np.copyto):
                for dst, src in pairs:
                    copy(dst, src)
                inv()
            calls.append(seg)
            env.update({name: view for view, name in outs})
        elif kind in VIEWS:
            _, srcs, dst, (index, shape) = h
            env[dst] = _view_of(env[srcs[0]], index, shape)
            if not np.may_share_memory(env[dst], env[srcs[0]]):
                return None
        else:
            k, srcs, dst, out = h
            xs = [env[s] for s in srcs]
            _check_inputs(kind, k, srcs, xs)
            if any(x.dtype != np.float32 or not x.flags.c_contiguous for x in xs):
                return None
            y = pool[slot][:out.nbytes].view(out.dtype).reshape(out.shape)
            nxt = chain.steps[links[idx]][1][0] if idx in links else None
            calls.append(_kernel_call(k, xs, y, nxt, idx in linked_to, idx in links or idx in linked_to, alive))
            env[dst] = y
        per_step.append(calls[-1] if len(calls) > n_calls else None)
    finals = [(buf, env[name].reshape(buf.shape)) for name, buf in zip(chain.outputs, staging_out)]
    if not all(np.may_share_memory(src, env[name]) for (_, src), name in zip(finals, chain.outputs)):
        return None

    return _invoker(calls, finals, alive), (pool, alive), per_step


def _kernel_call(k, xs, y, nxt, linked_to: bool, linked: bool, alive: list):
    """The bound call of one kernel step reading ``xs`` into ``y``: a pointer array of its own for several inputs
    (:func:`run_step`, the general path, rewrites the kernel's), a linked conv's call (``nxt``: the conv it hands its
    output to; ``linked_to``: it reads its own bf16 buffer, not ``xs``), else the kernel's run."""
    if len(xs) > 1:
        own = (ctypes.c_void_p * len(xs))(*[x.ctypes.data for x in xs])
        alive.append(own)
        x_ptr = ctypes.addressof(own)
    else:
        x_ptr = k.input_pointer(xs)
    if linked:                                  # a run of convs without the fp32 tensors between
        return k.linked_call(None if linked_to else x_ptr, y.ctypes.data, nxt)
    return functools.partial(k._run, k._h, ctypes.c_void_p(x_ptr), ctypes.c_void_p(y.ctypes.data))


def _invoker(calls: list, finals: list, alive: list):
    """predict's invoke: every call (in one native call when they are all kernels', :func:`native_calls`), then the
    outputs copied to the staging buffers. Raises MemoryError when a kernel failed (no memory for its scratch)."""
    native = native_calls(calls)
    if native is not None:
        run, arr = native
        alive.append(arr)

        def invoke_native(run=run, finals=tuple(finals), copy=np.copyto):
            if run():
                raise MemoryError("a native kernel of the chain failed (out of memory for its scratch)")
            for dst, src in finals:
                copy(dst, src)
        return invoke_native

    def invoke_bound(calls=tuple(calls), finals=tuple(finals), copy=np.copyto):
        failed = 0
        for call in calls:                      # a kernel's returns its code, a segment's None
            failed += bool(call())
        if failed:
            raise MemoryError("a native kernel of the chain failed (out of memory for its scratch)")
        for dst, src in finals:
            copy(dst, src)
    return invoke_bound


class _BoundCall(ctypes.Structure):
    _fields_ = [(f, ctypes.c_int64) for f in ("fn", "handle", "in_", "out", "next", "nargs")]


def native_calls(calls):
    """``(run, array)`` when every call is a ctypes kernel entry point bound with 3 or 4 pointer arguments
    (``functools.partial`` of the library's function: a kernel's run, a linked conv's run), else None (a LiteRT
    segment or another Python callable): ``run()`` runs them all in one native call (``edgehft_calls_run``,
    cpu_calls.cpp; ~0.35 µs of ctypes saved per call) and returns how many failed; keep ``array`` alive."""
    from edgehft.kernels.cpu import build
    specs = []
    for c in calls:
        if not (isinstance(c, functools.partial) and isinstance(c.func, ctypes._CFuncPtr) and not c.keywords
                and len(c.args) in (3, 4)):
            return None
        args = [a.value if isinstance(a, ctypes.c_void_p) else a for a in c.args]
        if not all(a is None or isinstance(a, int) for a in args):
            return None
        args = [a or 0 for a in args]
        fn = ctypes.cast(c.func, ctypes.c_void_p).value
        specs.append(_BoundCall(fn, args[0], args[1], args[2], args[3] if len(args) == 4 else 0, len(args)))
    if not specs:
        return None
    lib = build.load_library()
    run = lib.edgehft_calls_run
    run.restype, run.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]
    arr = (_BoundCall * len(specs))(*specs)
    return functools.partial(run, ctypes.addressof(arr), len(specs)), arr
