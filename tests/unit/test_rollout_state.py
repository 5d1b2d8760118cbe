"""A rollout's state file is input (issue 18 review): rollout.load refuses, with exit 3 and the field, anything
edgehft would not have written; nothing from it reaches ssh as an option or as a config file."""
from __future__ import annotations

import json

import pytest

from edgehft.deploy import rollout
from edgehft.deploy.fanout import target_json
from edgehft.deploy.ssh import parse_target, ssh_argv
from edgehft.errors import InputError


@pytest.fixture
def state(tmp_path):
    targets = [target_json(parse_target(f"edgehft@127.0.0.1:{2200 + i}", idle_timeout=30)) for i in range(4)]
    r = rollout.plan([f"b{i}" for i in range(4)], targets, ["cpu"] * 4, "/b", "ab" * 32, canary=1, wave="2",
                     max_fail="1", state_dir=tmp_path)
    r.save()
    return r.path


def edited(path, change) -> str:
    d = json.loads(open(path).read())
    change(d)
    open(path, "w").write(json.dumps(d))
    return path


def test_the_file_edgehft_wrote_loads(state):
    r = rollout.load(state)
    assert [b.wave for b in r.boxes] == [1, 2, 2, 3] and r.boxes[2].target["port"] == 2202


@pytest.mark.parametrize("change, said", [
    (lambda d: d["boxes"][0]["target"].update(host="-oProxyCommand=touch /tmp/x"), "is not a host name"),
    (lambda d: d["boxes"][0]["target"].update(host="box;rm -rf /"), "is not a host name"),
    (lambda d: d["boxes"][1]["target"].update(user="root -oX"), "is not a user name"),
    (lambda d: d["boxes"][1]["target"].update(port="22"), "is not a port"),
    (lambda d: d["boxes"][1]["target"].update(port=True), "is not a port"),
    (lambda d: d["boxes"][1]["target"].update(idle_timeout="x"), "idle_timeout 'x'"),
    (lambda d: d["boxes"][1]["target"].update(python="python3 -c evil"), "is not an interpreter path"),
    (lambda d: d["boxes"][1]["target"].update(install_dir="relative/dir"), "is not an absolute path"),
    (lambda d: d["boxes"][1]["target"].update(extra_env={"A B": "1"}), "not variable names"),
    (lambda d: d["boxes"][1]["target"].update(extra_env={"PYTHONPATH": "/tmp/evil"}), "which no board file's"),
    (lambda d: d["boxes"][1]["target"].update(extra_env={"LD_PRELOAD": "/tmp/evil.so"}), "which no board file's"),
    (lambda d: d["boxes"][1]["target"].update(evil=1), "fields"),
    (lambda d: d["boxes"][2].update(wave=1000000000), "wave 1000000000, not 1 .. 4"),
    (lambda d: d["boxes"][2].update(wave="1"), "boxes.2.wave"),
    (lambda d: d["boxes"][2].update(wave=0), "wave 0, not 1 .. 4"),
    (lambda d: d["boxes"][2].update(status="owned"), "boxes.2.status"),
    (lambda d: d.update(wave="abc"), "wave 'abc' is not a number"),
    (lambda d: d.update(canary=4), "canary 4 of 4 boxes"),
    (lambda d: d.update(extra="x"), "extra"),
    (lambda d: d.update(boxes=[]), "boxes"),
    (lambda d: d.update(bundle_sha256="../../etc"), "bundle_sha256"),
])
def test_a_hostile_state_is_refused(state, change, said):
    with pytest.raises(InputError) as e:
        rollout.load(edited(state, change))
    assert e.value.exit_code == 3 and said in str(e.value), str(e.value)


def test_not_json_or_another_version(tmp_path):
    for text, said in (("", "is not a rollout state file"), ("[1, 2]", "is not a rollout state file"),
                       ('{"state_version": 9}', "rollout state version 9"),
                       ('{"state_version": 1}', "in version 1 --max-fail N stopped at N failures")):
        (tmp_path / "s.json").write_text(text)
        with pytest.raises(InputError, match=said):
            rollout.load(tmp_path / "s.json")


def test_a_host_is_never_an_ssh_option():
    import dataclasses
    t = dataclasses.replace(parse_target("box", idle_timeout=30), host="-oProxyCommand=touch /tmp/x")  # unchecked
    argv = ssh_argv(t, ["true"])
    assert argv[argv.index("--") + 1] == t.host and argv.index("--") > max(
        i for i, a in enumerate(argv) if a.startswith("-") and a != t.host and a != "--")


def test_a_board_files_environment_is_kept(state):
    """The names a board file's [ssh] env sets (the PYNQ boards' XILINX_XRT) are what a target may carry."""
    d = json.loads(open(state).read())
    d["boxes"][1]["target"]["extra_env"] = {"XILINX_XRT": "/usr"}
    path = __import__("pathlib").Path(state).parent / "xrt.json"
    path.write_text(json.dumps(d))
    assert rollout.load(path).boxes[1].target["extra_env"] == {"XILINX_XRT": "/usr"}


def test_the_rollout_table_shows_hostile_text_as_text(state, capsys):
    """Versions and the stop reason come from the state file: markup and escapes are shown, not obeyed."""
    from edgehft.cli.rollout import print_rollout
    r = rollout.load(state)
    r.boxes[1].version_before, r.status, r.stop_reason = "[/x]", "stopped", "\x1b[31mRED"
    print_rollout(r)
    said = capsys.readouterr().out
    assert "[/x]" in said and "\x1b" not in said and "\\x1b[31mRED" in said


def test_a_new_rollout_never_overwrites_a_state_file(state):
    from edgehft.cli.rollout import start_rollout
    before = open(state).read()
    with pytest.raises(InputError, match="exists: it may hold another rollout's state") as e:
        start_rollout("/nonexistent-bundle", [], "cpu", 1, "2", None, state)
    assert e.value.exit_code == 3 and "--resume" in e.value.hint and open(state).read() == before


def test_a_name_cannot_forge_a_line_of_output():
    """A box name from an inventory or a state file with a newline, a tab or escapes prints on one line, escaped."""
    from edgehft.report import printable_name
    said = printable_name("b1\x1b]0;TITLE\x07\x1bcX\nFAKE LINE\tx")
    assert "\n" not in said and "\x1b" not in said and "\t" not in said and said.endswith("\\nFAKE LINE\\tx")
