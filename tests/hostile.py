"""Run ``python -m edgehft`` on a hostile input the way a user or an operator on a box would, and check the
rule every bad input is held to: a documented exit code, an ``error:`` line that says what is wrong, no
traceback, no signal (core dump), no hang."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

DOCUMENTED_EXIT_CODES = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}   # edgehft.errors; 1 only for Python API misuse


@dataclass
class CliOutcome:
    args: list
    returncode: int
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        """stdout and stderr with rich's line wrapping undone."""
        return " ".join((self.stdout + "\n" + self.stderr).split())


def run_cli(*args, timeout: float = 120.0, cwd=None, env: dict | None = None) -> CliOutcome:
    """``python -m edgehft ARGS`` in a fresh process (a crash there cannot take the test run down).

    Raises:
        subprocess.TimeoutExpired: the command hung past ``timeout`` seconds (a failure).
    """
    full_env = {**os.environ, "COLUMNS": "200", "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    p = subprocess.run([sys.executable, "-m", "edgehft", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, cwd=cwd, env=full_env)
    return CliOutcome(list(args), p.returncode, p.stdout, p.stderr)


def assert_refused(out: CliOutcome, code: int, message: str | None = None) -> None:
    """``out`` exited with ``code`` (a documented one), printed one ``error:`` line (containing ``message``
    when given, rich's wrapping undone) and no traceback, and was not killed by a signal."""
    where = f"{out.args}: rc {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    assert out.returncode >= 0, "killed by signal " + where
    assert code in DOCUMENTED_EXIT_CODES and out.returncode == code, where
    assert "Traceback" not in out.stdout + out.stderr, where
    if code:
        lead = "Error:" if code == 2 else "error:"        # click's own usage errors say "Error:"
        assert sum(line.startswith(lead) for line in (out.stdout + out.stderr).splitlines()) == 1, where
    if message:
        assert message in out.text, where


def bit_flips(data: bytes, count: int, seed: int) -> list[tuple[int, bytes]]:
    """``count`` copies of ``data``, each with one distinct bit flipped (seeded): ``[(bit, bytes), ...]``."""
    import numpy as np
    bits = np.random.default_rng(seed).choice(len(data) * 8, size=count, replace=False)
    out = []
    for bit in bits:
        d = bytearray(data)
        d[bit // 8] ^= 1 << (bit % 8)
        out.append((int(bit), bytes(d)))
    return out
