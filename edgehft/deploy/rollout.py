"""A fleet rollout: the boxes of an inventory in waves, a canary first, stopped by failures, resumable.

Policy (edgehft's; the fan-out within a wave is an engine's, :mod:`edgehft.deploy.fanout`):

- the boxes in inventory order; ``canary`` (N boxes, 0: none) are wave 1; then waves of ``wave`` boxes (``N`` or
  ``P%`` of the fleet, rounded up, at least 1; None: all the rest in one wave);
- a wave's boxes are deployed at once (``parallel`` at a time); when the wave is over, the rollout stops if a
  canary failed or if more boxes have failed in this run than ``max_fail`` allows (``N`` boxes or ``P%`` of the
  fleet, rounded down; ``0``: none; None: never stop), as Ansible's ``max_fail_percentage``. The boxes of the
  waves not run are not contacted: they keep their version; the stopped rollout's exit code is
  :data:`ROLLOUT_STOPPED`;
- the state (every box: its wave, status ``pending`` / ``ok`` / ``failed`` / ``rolled back``, the version it
  served before and the one it got, the error) is written to a JSON file after every wave, so a stopped rollout
  can be **resumed** (the same bundle: the waves run again from the first box not ``ok``; failures count anew)
  or **rolled back** fleet-wide (every box the rollout switched goes back to the version it served before).

The state holds each box's SSH target (host, user, port, python, install dir, the ssh config it was reached
with), so resuming or rolling back needs the state file and, given again on the command line, that ssh config
(never taken from the file: :func:`edgehft.cli.rollout.check_ssh_config`).
"""
from __future__ import annotations

import json
import math
import os
import re
import secrets
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pydantic

from edgehft.errors import InputError

STATE_VERSION = 2          # 2: --max-fail N allows N failures (1 stopped at N)
ROLLOUT_STOPPED = 11       # the exit code of a rollout that stopped (EXIT_CODES in edgehft.cli.common)
BOX_STATUSES = ("pending", "ok", "failed", "rolled back")
ROLLOUT_STATUSES = ("planned", "running", "stopped", "complete", "rolled back")


@dataclass
class RolloutBox:
    """One box of a rollout (module docstring)."""

    name: str                      # the inventory's name for it (else its host)
    target: dict                   # SshTarget fields (edgehft.deploy.fanout.target_json)
    board: str | None
    wave: int                      # 1-based
    status: str = "pending"
    version_before: str | None = None
    version: str | None = None
    exit_code: int | None = None
    step: str | None = None
    error: str | None = None


@dataclass
class Rollout:
    """A rollout's state (module docstring); ``status`` ``planned`` / ``running`` / ``stopped`` / ``complete`` /
    ``rolled back``; ``stop_reason`` says why it stopped."""

    id: str
    bundle: str
    bundle_sha256: str
    canary: int
    wave: str | None
    max_fail: str | None
    boxes: list[RolloutBox]
    status: str = "planned"
    stop_reason: str | None = None
    created_utc: str = ""
    updated_utc: str = ""
    runs: int = 0
    state_version: int = STATE_VERSION
    path: str | None = field(default=None, repr=False)

    @property
    def waves(self) -> list[list[RolloutBox]]:
        n = max((b.wave for b in self.boxes), default=0)
        return [[b for b in self.boxes if b.wave == w] for w in range(1, n + 1)]

    def counts(self) -> dict:
        return {s: sum(b.status == s for b in self.boxes) for s in BOX_STATUSES}

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("path")
        return d

    def save(self) -> None:
        """Write the state to :attr:`path` (atomically: a temporary file renamed over it); no path: nothing."""
        self.updated_utc = _now()
        if self.path is None:
            return
        p = Path(self.path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(tmp, p)


_STRICT = pydantic.ConfigDict(extra="forbid", strict=True)


class _BoxState(pydantic.BaseModel):
    """A box in a state file (:class:`RolloutBox`'s fields, JSON types exactly)."""
    model_config = _STRICT
    name: str
    target: Dict[str, object]
    board: Optional[str]
    wave: int
    status: str = pydantic.Field(pattern=f"^({'|'.join(BOX_STATUSES)})$")
    version_before: Optional[str] = None
    version: Optional[str] = None
    exit_code: Optional[int] = None
    step: Optional[str] = None
    error: Optional[str] = None


class _State(pydantic.BaseModel):
    """A state file (:class:`Rollout`'s fields less ``path``; strict: no other keys, JSON types exactly)."""
    model_config = _STRICT
    id: str = pydantic.Field(pattern=r"^[A-Za-z0-9_.-]{1,100}$")
    bundle: str
    bundle_sha256: str = pydantic.Field(pattern="^[0-9a-f]{64}$")
    canary: int = pydantic.Field(ge=0)
    wave: Optional[str]
    max_fail: Optional[str]
    boxes: List[_BoxState] = pydantic.Field(min_length=1)
    status: str = pydantic.Field(pattern=f"^({'|'.join(ROLLOUT_STATUSES)})$")
    stop_reason: Optional[str] = None
    created_utc: str = ""
    updated_utc: str = ""
    runs: int = pydantic.Field(default=0, ge=0)
    state_version: int


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def count(text: str | None, total: int, what: str) -> int | None:
    """``N`` or ``P%`` of ``total`` boxes, rounded up, at least 1 (None stays None).

    Raises:
        InputError: not a positive whole number or a percentage in (0, 100]."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(%?)\s*", str(text))
    if not m or (not m.group(2) and "." in m.group(1)):
        raise InputError(f"{what} {text!r} is not a number of boxes or a percentage", hint=f"e.g. {what} 2 or {what} 25%")
    v = float(m.group(1))
    if m.group(2):
        if not 0 < v <= 100:
            raise InputError(f"{what} {text!r}: a percentage in (0, 100]")
        return max(1, math.ceil(v * total / 100 - 1e-9))
    if v < 1:
        raise InputError(f"{what} {text!r}: at least 1 box")
    return int(v)


def allowed_failures(text: str | None, total: int) -> int | None:
    """How many failed boxes ``--max-fail`` allows a rollout of ``total`` boxes: ``N``, or ``P%`` of ``total``
    rounded down (``0`` and ``0%``: none); one more stops it. None (no --max-fail) stays None: never stop.

    Raises:
        InputError: not a whole number or a percentage in [0, 100]."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(%?)\s*", str(text))
    if not m or (not m.group(2) and "." in m.group(1)):
        raise InputError(f"--max-fail {text!r} is not a number of boxes or a percentage",
                         hint="e.g. --max-fail 0 (stop at the first failure), --max-fail 2 or --max-fail 10%")
    v = float(m.group(1))
    if m.group(2):
        if v > 100:
            raise InputError(f"--max-fail {text!r}: a percentage in [0, 100]",
                             hint="e.g. --max-fail 0% (none) or --max-fail 10%")
        return math.floor(v * total / 100 + 1e-9)
    return int(v)


def plan(names: list[str], targets: list[dict], boards: list[str | None], bundle: str, bundle_sha256: str, *,
         canary: int = 0, wave: str | None = None, max_fail: str | None = None,
         state_dir: str | Path | None = ".edgehft/rollouts") -> Rollout:
    """A new rollout of ``bundle`` over these boxes (inventory order), its waves laid out (module docstring); its
    state file is ``state_dir/<id>.json`` (written by :func:`run`; ``state_dir`` None: none is written).

    Raises:
        InputError: no boxes; a bad ``canary``, ``wave`` or ``max_fail``; a canary as large as the fleet."""
    n = len(names)
    if n == 0:
        raise InputError("a rollout needs at least one box")
    if canary < 0 or (canary and canary >= n):
        raise InputError(f"--canary {canary}: the fleet has {n} boxes", hint="a canary is fewer boxes than the fleet")
    size = count(wave, n, "--wave") or max(1, n - canary)
    allowed_failures(max_fail, n)
    waves = [1] * canary + [(i // size) + (2 if canary else 1) for i in range(n - canary)]
    rid = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{bundle_sha256[:8]}-{secrets.token_hex(2)}"
    boxes = [RolloutBox(name=nm, target=t, board=b, wave=w) for nm, t, b, w in zip(names, targets, boards, waves)]
    return Rollout(id=rid, bundle=str(bundle), bundle_sha256=bundle_sha256, canary=canary, wave=wave,
                   max_fail=max_fail, boxes=boxes, created_utc=_now(),
                   path=None if state_dir is None else str(Path(state_dir) / f"{rid}.json"))


def load(path: str | Path) -> Rollout:
    """A rollout's state file, checked field by field (it is input: a hand-edited or hostile file is refused, not
    run): the schema's keys and types (:class:`_State`, pydantic, strict), waves 1 .. the number of boxes, the
    canary / wave / max-fail options as :func:`plan` takes them, every box's target as
    :func:`edgehft.deploy.ssh.check_target_fields` takes it.

    Raises:
        InputError: unreadable, not a rollout state, from another edgehft state version, or a field out of rule."""
    hint = "the file `edgehft deploy --hosts ... --wave/--canary/--max-fail` wrote"
    from edgehft.deploy.inventory import read_small_text
    try:
        d = json.loads(read_small_text(Path(path), "the rollout state"))
    except RecursionError:
        raise InputError(f"{path} is not a rollout state file: nested too deeply", hint=hint) from None
    except ValueError as exc:
        raise InputError(f"{path} is not a rollout state file: {exc}", hint=hint) from None
    if isinstance(d, dict) and d.get("state_version") != STATE_VERSION:
        old = d.get("state_version") == 1
        raise InputError(f"{path}: rollout state version {d.get('state_version')!r}, this edgehft reads "
                         f"{STATE_VERSION}" + (" (in version 1 --max-fail N stopped at N failures, now after more "
                                               "than N)" if old else ""),
                         hint="finish it with the edgehft that wrote it, or start a new rollout" if old else hint)
    try:
        st = _State.model_validate(d)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InputError(f"{path} is not a rollout state file: {where or 'the file'}: {first['msg']}",
                         hint=hint) from None
    from edgehft.deploy.ssh import check_target_fields
    n = len(st.boxes)
    for b in st.boxes:
        check_target_fields(b.target, str(path))
        if not 1 <= b.wave <= n:
            raise InputError(f"{path}: box {b.name!r} is in wave {b.wave}, not 1 .. {n}", hint=hint)
    if st.canary and st.canary >= n:
        raise InputError(f"{path}: canary {st.canary} of {n} boxes", hint=hint)
    count(st.wave, n, "wave")
    allowed_failures(st.max_fail, n)
    boxes = [RolloutBox(**b.model_dump()) for b in st.boxes]
    return Rollout(**{**st.model_dump(), "boxes": boxes}, path=str(path))


WaveHook = Callable[[int, List[RolloutBox], str], None]     # (wave number, its boxes, "start" | "end")


def run(r: Rollout, jobs: Callable[[list[RolloutBox]], list[dict]], fanout, parallel: int,
        on_wave: WaveHook | None = None) -> list[tuple[RolloutBox, dict]]:
    """Run the rollout's waves from the first box not ``ok`` (module docstring), saving the state after each.

    ``jobs(boxes)`` makes the fan-out jobs of a wave's boxes; ``fanout`` is an engine module
    (:func:`edgehft.deploy.fanout.engine`). Returns ``(box, deploy result)`` for the boxes run, in run order."""
    n = len(r.boxes)
    allowed = allowed_failures(r.max_fail, n)
    r.status, r.stop_reason, r.runs = "running", None, r.runs + 1
    r.save()
    failed, results = 0, []
    for w, boxes in enumerate(r.waves, 1):
        todo = [b for b in boxes if b.status != "ok"]
        if not todo:
            continue
        if on_wave:
            on_wave(w, todo, "start")
        for b, res in zip(todo, fanout.run(jobs(todo), parallel)):
            _record(b, res)
            results.append((b, res))
        failed += sum(b.status == "failed" for b in todo)
        r.save()
        if on_wave:
            on_wave(w, todo, "end")
        canary_failed = w == 1 and r.canary and any(b.status == "failed" for b in todo)
        if canary_failed or (allowed is not None and failed > allowed):
            r.status = "stopped"
            r.stop_reason = ("the canary failed" if canary_failed else
                             f"{failed} box{'es' if failed != 1 else ''} failed, more than --max-fail "
                             f"{r.max_fail} allows")
            if w < len(r.waves):
                r.stop_reason += f", after wave {w} of {len(r.waves)}"
            break
    else:
        r.status = "complete"
    r.save()
    return results


def _record(b: RolloutBox, res: dict) -> None:
    b.status = "ok" if res.get("ok") else "failed"
    b.exit_code, b.step, b.error = res.get("exit_code"), res.get("step"), res.get("error")
    if res.get("box_reached") and b.version_before is None:
        b.version_before = res.get("active_before")
    if res.get("ok"):
        b.version = res.get("active_after") or res.get("version")


def rollback(r: Rollout, jobs: Callable[[list[RolloutBox]], list[dict]], fanout, parallel: int) -> list[dict]:
    """Every box the rollout switched (``ok``) back to the version it served before; a box that served none is
    left as it is (its result says so). Saves the state; returns the rollback results, in box order."""
    switched = [b for b in r.boxes if b.status == "ok"]
    back = [b for b in switched if b.version_before]
    results = fanout.run(jobs(back), parallel) if back else []
    out = []
    for b in switched:
        if b.version_before is None:
            out.append({"host": b.name, "ok": False, "exit_code": 9, "active": b.version, "previous": None,
                        "error": "the box served no version before the rollout: nothing to go back to",
                        "hint": "`edgehft status --host` shows it; deploy the bundle it should serve"})
            continue
        res = results[back.index(b)]
        if res.get("ok"):
            b.status = "rolled back"
        else:
            b.error = res.get("error")
        out.append(res)
    if all(b.status != "ok" for b in r.boxes):
        r.status = "rolled back"
    r.save()
    return out
