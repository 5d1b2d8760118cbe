"""``--hosts FILE``: the boxes to deploy to.

Three formats. TOML (``.toml``)::

    [[hosts]]
    host = "xilinx@10.0.0.7"          # user@host[:port] or an ssh alias
    board = "pynq-z2"                 # optional: default --board / the bundle's
    python = "/usr/local/share/pynq-venv/bin/python"   # optional: edgehft's interpreter on the box
    install_dir = "/home/xilinx/edgehft"               # optional

or plain text, one ``user@host[:port]`` per line with optional ``key=value`` words (the same keys);
``#`` starts a comment.

Or the **Ansible inventory** an ops team already keeps (INI or YAML: groups, ``children``, group and host
vars), read by Ansible's own ``InventoryManager`` (``pip install 'edgehft[fleet]'``): a file ending in
``.ini``, ``.yml`` or ``.yaml``, or a text file with ``[group]`` lines. Per host: ``ansible_host`` (else the
inventory name, which may be an ssh alias), ``ansible_port``, ``ansible_user``, and edgehft's own
``edgehft_board``, ``edgehft_python``, ``edgehft_install_dir``, taken as written (never templated: no
Jinja2, no lookup runs); Ansible's other variables are Ansible's (keys
and options come from the user's ssh config, as for ``--host``). ``limit`` takes Ansible's patterns
(``venue_ny4``, ``box1:box2``, ``fleet:!canary``, ``fleet:&ny4``), as ``ansible --limit`` does.
"""
from __future__ import annotations

import contextlib
import io
import re

from edgehft.compat import tomllib
from pathlib import Path

from edgehft.errors import InputError

KEYS = {"host", "board", "python", "install_dir"}
ANSIBLE_SUFFIXES = (".ini", ".yml", ".yaml")
ANSIBLE_VARS = {"board": "edgehft_board", "python": "edgehft_python", "install_dir": "edgehft_install_dir"}
# Ansible's settings for reading an inventory here: only the INI and YAML parsers (never the script plugin,
# which runs an executable inventory), a file neither parses is an error (not "no hosts" after warnings), and
# the errors below say what Ansible's warnings would (a --limit that matches nothing, no localhost). They are
# set in this process's environment (over any value there) before ansible-core is first imported, with
# ANSIBLE_CONFIG naming an empty file: an ansible.cfg in the working directory (vars_plugins, ...) is not read.
ANSIBLE_CONFIG = {"ANSIBLE_INVENTORY_ENABLED": "ini,yaml", "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
                  "ANSIBLE_HOST_PATTERN_MISMATCH": "ignore", "ANSIBLE_LOCALHOST_WARNING": "False"}


def read_inventory(path: str | Path, limit: str | None = None) -> list[dict]:
    """The entries of an inventory file: dicts with ``host`` (``user@host[:port]`` or an ssh alias) and optional
    ``board``, ``python``, ``install_dir``; Ansible inventories add ``name`` (the inventory hostname) and
    ``groups`` (its groups, ``all`` left out). ``limit``: only these hosts (Ansible's patterns; in TOML and text
    inventories hosts as written there, joined by ``,``).

    Raises:
        InputError: unreadable file, unknown keys, an entry without ``host``, no hosts at all, or a ``limit``
            that matches none.
        MissingExtraError: an Ansible inventory without ansible-core installed.
    """
    path = Path(path)
    text = read_small_text(path, "the inventory")
    if path.suffix != ".toml" and (path.suffix in ANSIBLE_SUFFIXES or re.search(r"^\s*\[[^\]]+\]\s*$", text, re.M)):
        return _read_ansible(path, limit)
    entries = _read_edgehft(path, text)
    if limit is not None:
        wanted = [w.strip() for w in limit.split(",") if w.strip()]
        entries = [e for e in entries if e["host"] in wanted]
        if not entries:
            raise InputError(f"--limit {limit!r} matches no host of the inventory {path}",
                             hint="name hosts as the inventory writes them (groups need an Ansible inventory)")
    return entries


MAX_FILE_BYTES = 4 << 20          # an inventory or a rollout state: far more than any fleet's


def read_small_text(path: Path, what: str, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of ``path``, a regular file of at most ``limit`` bytes (opened without blocking: a FIFO
    or a device is refused, never read).

    Raises:
        InputError: missing, not a regular file, larger than ``limit``, or not UTF-8."""
    import os
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{what} {path} is not a regular file", hint="give the file itself")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{what} {path} is more than {limit:,} B", hint="is this the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {path} is not UTF-8 text (byte {exc.start})") from None


def _read_edgehft(path: Path, text: str) -> list[dict]:
    """The entries of edgehft's own TOML or text inventory (module docstring)."""
    entries: list[dict] = []
    if path.suffix == ".toml":
        try:
            entries = list(tomllib.loads(text).get("hosts", []))
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"inventory {path} is not valid TOML: {exc}") from None
    else:
        for n, line in enumerate(text.splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            entry = {"host": words[0]}
            for w in words[1:]:
                if "=" not in w:
                    raise InputError(f"{path}:{n}: {w!r} is not key=value", hint=f"keys: {', '.join(sorted(KEYS))}")
                k, v = w.split("=", 1)
                entry[k] = v
            entries.append(entry)
    for e in entries:
        unknown = set(e) - KEYS
        if unknown or not isinstance(e.get("host"), str):
            raise InputError(f"inventory {path}: bad entry {e!r}",
                             hint="each entry needs host=...; optional keys: board, python, install_dir")
    if not entries:
        raise InputError(f"inventory {path} lists no hosts")
    return entries


def _read_ansible(path: Path, limit: str | None) -> list[dict]:
    """The hosts of an Ansible inventory, through ansible-core (module docstring), ``limit`` applied."""
    import os
    from edgehft.compat import require_extra
    require_extra("ansible", "fleet", f"the Ansible inventory {path}")
    for key, value in ANSIBLE_CONFIG.items():        # read when ansible.constants is first imported: forced, so
        os.environ[key] = value                       # no setting of the caller's enables the script plugin
    os.environ["ANSIBLE_CONFIG"] = _empty_ansible_cfg()   # and no ansible.cfg of the working directory is read
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager
    loader, said = DataLoader(), io.StringIO()
    try:
        with contextlib.redirect_stderr(said):        # Ansible's warnings: the parsers' reasons, said below
            inv = InventoryManager(loader=loader, sources=[str(path)], parse=True)
            if limit is not None:
                inv.subset(limit)
            hosts = inv.get_hosts()
            variables = VariableManager(loader=loader, inventory=inv)
            entries = [_ansible_entry(h.name, variables.get_vars(host=h), h.get_groups()) for h in hosts]
    except AnsibleError:
        why = [ln.split(": ", 1)[1].strip() for ln in said.getvalue().splitlines()
               if ln.startswith("[WARNING]: Failed to parse inventory with") and ": " in ln]
        raise InputError(f"the Ansible inventory {path} cannot be read: " + ("; ".join(why) or "no parser took it"),
                         hint="Ansible's INI or YAML inventory format (edgehft reads no inventory scripts or "
                              "plugins); `ansible-inventory -i FILE --list` shows what Ansible makes of it") from None
    if not entries:
        groups = sorted(g for g in inv.groups if g not in ("all", "ungrouped"))
        raise InputError(f"the Ansible inventory {path} lists no hosts" + (f" that --limit {limit!r} matches"
                                                                           if limit is not None else ""),
                         hint=f"its groups: {', '.join(groups) or 'none'}")
    return entries


def _empty_ansible_cfg() -> str:
    """An empty ``.cfg`` file of this process's (removed at exit) for ANSIBLE_CONFIG: Ansible then reads no
    ansible.cfg of the working directory or the home directory (whose vars_plugins would load code)."""
    import atexit
    import os
    import tempfile
    fd, path = tempfile.mkstemp(prefix="edgehft-ansible-", suffix=".cfg")
    os.close(fd)
    atexit.register(lambda: os.path.exists(path) and os.unlink(path))
    return path


def _ansible_entry(name: str, v: dict, groups) -> dict:
    """One host's entry from its Ansible variables: ``ansible_user@ansible_host:ansible_port`` (IPv6 in brackets)."""
    host = str(v.get("ansible_host") or name)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    user, port = v.get("ansible_user"), v.get("ansible_port")
    entry = {"host": (f"{user}@" if user else "") + host + (f":{port}" if port else ""), "name": name,
             "groups": sorted(g.name for g in groups if g.name != "all")}
    entry.update({k: str(v[var]) for k, var in ANSIBLE_VARS.items() if v.get(var) is not None})
    return entry
