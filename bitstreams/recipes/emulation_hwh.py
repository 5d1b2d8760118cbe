"""Write the emulation .hwh of the edgehft overlay for a board (see edgehft/emulate/hwh.py):

    python bitstreams/recipes/emulation_hwh.py BOARD OUT_DIR      # -> OUT_DIR/<overlay>.hwh
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from edgehft.emulate.hwh import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
