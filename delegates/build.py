"""Build ``libedgehft_kernels.so``, the FPGA kernels' C++ (``bitstreams/kernels/*.cpp``) for the host
emulation, with g++ (``-O2 -std=c++14 -fPIC -shared -ffp-contract=off``: no fused float multiply-adds,
so the ``fp32`` / ``float64`` requantize modes round exactly as numpy and XNNPACK do).

    python delegates/build.py                      # -> delegates/build/libedgehft_kernels.so
    python delegates/build.py --out DIR [-D LSTM_LANES=224 ...]

``edgehft.kernels.fpga.csim.KernelLibrary()`` does the same on first use into its cache directory; pass
``KernelLibrary(path=...)`` to load a library built here. The flags live in ``edgehft.kernels.cxx``
(``CXXFLAGS`` in ``edgehft.kernels.cxx``) so both builds stay the same.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from edgehft.kernels.cxx import CXXFLAGS  # noqa: E402
from edgehft.kernels.fpga.csim import LIBRARY_NAME, build_library, kernel_sources  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "build", help="output directory (default delegates/build)")
    ap.add_argument("--sources", type=Path, default=None, help="kernel sources (default bitstreams/kernels)")
    ap.add_argument("-D", dest="defines", action="append", default=[],
                    help="a kernel macro, e.g. -D DENSE_SLOTS=8 (limits, slots, lanes)")
    a = ap.parse_args(argv)
    out = build_library(a.out / LIBRARY_NAME, a.sources or kernel_sources(), [f"-D{d}" for d in a.defines])
    print(f"{out}  (g++ {' '.join(CXXFLAGS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
