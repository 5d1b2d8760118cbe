#!/usr/bin/env python3
"""A stand-in for Coral's ``edgetpu_compiler`` *executable* in tests: it replays recorded compiler
outputs. For an input model byte-identical to a CPU model in ../shared/data/edgetpu_pairs it writes
that pair's real ``*_edgetpu.tflite`` (what the real compiler produced for it); flags are accepted and
ignored. It is put on PATH only inside the tests that drive edgehft's compiler driver; it never
stands in for a library on the import path. REPLAY_MODE=hang|crash|fail exercises the driver's
timeout, signal and error handling.
"""
import argparse
import hashlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

PAIRS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "edgetpu_pairs"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("-s", action="store_true")
    p.add_argument("-o", dest="out", default=".")
    p.add_argument("-m", dest="min_runtime")
    p.add_argument("-a", action="store_true")
    p.add_argument("-i", dest="cut")
    p.add_argument("model")
    a = p.parse_args()
    print("Edge TPU Compiler version 16.0.384591198 (edgehft test replay of recorded outputs)")
    mode = os.environ.get("REPLAY_MODE", "")
    if mode == "hang":
        time.sleep(600)
    if mode == "crash":
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    if mode == "fail":
        print("ERROR: Didn't find op for builtin opcode 'FULLY_CONNECTED' version '12'")
        print("Invalid model: " + a.model)
        return 1
    digest = hashlib.sha256(Path(a.model).read_bytes()).hexdigest()
    for cpu in PAIRS.rglob("*.tflite"):
        if not cpu.stem.endswith("_edgetpu") and hashlib.sha256(cpu.read_bytes()).hexdigest() == digest:
            out = Path(a.out) / (Path(a.model).stem + "_edgetpu.tflite")
            shutil.copyfile(cpu.with_name(cpu.stem + "_edgetpu.tflite"), out)
            print(f"\nModel compiled successfully in 1 ms.\n\nInput model: {a.model}\nOutput model: {out}")
            return 0
    print("Internal compiler error. Aborting! (no recorded output for this model)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
