"""``edgehft build-engine``: the jetson backend's own command (its ``commands``, :mod:`edgehft.backends`), run
on a Jetson: build a bundle's TensorRT engine there and record the real per-layer placement."""
from __future__ import annotations

import json

import click
from rich.markup import escape
from rich.table import Table

from edgehft import backends
from edgehft.cli.common import handles_errors, json_opt, out
from edgehft.errors import InputError


@click.command("build-engine")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--dla-core", type=click.IntRange(min=0), default=None,
              help="Build for this DLA core (GPU fallback for what the DLA cannot run); default: GPU only.")
@click.option("--no-gpu-fallback", is_flag=True, help="With --dla-core: fail instead of falling back to the GPU.")
@click.option("--workspace-mib", type=click.IntRange(min=16), default=None,
              help="TensorRT workspace limit (default: the board file's).")
@json_opt
@handles_errors
def build_engine_cmd(bundle, dla_core, no_gpu_fallback, workspace_mib, as_json):
    """On a Jetson: build BUNDLE's TensorRT engine with this box's TensorRT, cache it by TensorRT version,
    L4T release, module, DLA core, precision and model hash, and print the real per-layer placement. The
    placement record is cached next to the engine (<key>.json, keyed like it and carrying the model hash);
    `edgehft report BUNDLE` lays it next to the prediction. The bundle is not written: it still verifies.

    \b
    Example (on the Jetson):
      edgehft build-engine /opt/edgehft/current --dla-core 0"""
    from edgehft.boards import load_board
    from edgehft.bundle import load_bundle
    from edgehft.partition.jetson_confirmed import record_for
    from edgehft.toolchains import tensorrt as T
    b = load_bundle(bundle)
    m = b.manifest
    if not backends.partitioner(m.backend, required=False).takes_engine_records:      # the backend whose engines these are
        raise InputError(f"bundle {b.path} is for {m.board} ({m.backend}), not a Jetson board")
    board = load_board(m.board)
    data, layers, version = T.build_engine(b.model_path, m.quantization.mode, dla_core=dla_core,
                                           gpu_fallback=not no_gpu_fallback,
                                           workspace_mib=workspace_mib or int(board.tensorrt.get("workspace_mib", 1024)))
    identity = T.board_identity()
    key = T.cache_key(version, identity, dla_core, m.quantization.mode, m.files[m.model_file])
    record = record_for(key=key, board=m.board, bundle=str(b.path), version=version, identity=identity,
                        dla_core=dla_core, precision=m.quantization.mode, model_sha256=m.files[m.model_file],
                        layers=layers, engine=str(T.cache_dir() / f"{key}.engine"))
    path = T.save_engine(key, data, record)          # <key>.engine and the placement record <key>.json
    counts = {d: sum(lay["device"] == d for lay in layers if not lay.get("glue")) for d in ("DLA", "GPU")}
    if as_json:
        click.echo(json.dumps({**record, "engine": str(path), "record": str(path.with_suffix(".json")),
                               "counts": counts}))
        return
    t = Table(title=f"{m.board}: engine {path.name} (TensorRT {version}), placement confirmed by the inspector",
              title_justify="left")
    for c in ("#", "layer", "type", "device"):
        t.add_column(c)
    for k, lay in enumerate(layers):
        t.add_row(str(k), escape(lay["name"]), escape(lay["type"]), lay["device"] + (" (copy)" if lay.get("glue") else ""))
    out.print(t)
    out.print(f"{counts['DLA']} layers on the DLA, {counts['GPU']} on the GPU; cached at {path}")
    out.print(f"placement record {path.with_suffix('.json')}: `edgehft report {bundle}` shows it per ONNX node "
              "next to the prediction", highlight=False)


COMMANDS = [build_engine_cmd]
