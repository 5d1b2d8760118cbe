"""`edgehft report BUNDLE --streaming`: the streaming analysis (edgehft/streaming/analysis.py) through the CLI,
on the shipped DeepLOB compiled for the cpu board (issue 21 item 2: the report says per op cached / prepared /
on the critical path, with MACs per tick)."""
from __future__ import annotations

import json

from click.testing import CliRunner

from edgehft.cli import main


def test_report_streaming_gives_deeplobs_critical_path(deeplob_bundle):
    r = CliRunner().invoke(main, ["report", str(deeplob_bundle), "--streaming", "--json"])
    assert r.exit_code == 0, r.output
    a = json.loads(r.output)["streaming"]
    assert (a["streamable"], a["window"], a["time_axis"]) == (True, 100, 1)
    assert (a["macs_critical"], a["macs_full"]) == (3_149_248, 39_040_192)     # the 3.2 M of 39 M
    lstm = [o for o in a["ops"] if o["op"] == "UNIDIRECTIONAL_SEQUENCE_LSTM"]
    assert [(o["steps_prepared"], o["steps_critical"]) for o in lstm] == [(85, 15)]


def test_report_streaming_table_reads_at_80_columns(deeplob_bundle):
    r = CliRunner().invoke(main, ["report", str(deeplob_bundle), "--streaming"], terminal_width=80,
                           env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert max(len(line) for line in r.output.splitlines()) <= 80
    assert "streamable: yes" in r.output and "critical path 3.15M" in r.output


def test_plan_and_reasons_need_streaming(deeplob_bundle):
    r = CliRunner().invoke(main, ["report", str(deeplob_bundle), "--plan", "int8"])
    assert r.exit_code == 2 and "--plan and --reasons apply with --streaming" in r.output
