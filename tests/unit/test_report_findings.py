"""The report leads with findings, and its sections fit a screen: findings first, ranked,
each pointing to a section that exists; tables cut in report.md with the count left out
(report.json has all); threads that made CUDA calls first; counters in human units, the
flat ones in one line; figures only for signals that moved."""
import json
import os
import re

import pytest

from clockalign.report import build_report, figures
from clockalign.report.render import Table, fmt_value
from clockalign.timeline import Timeline

HERE = os.path.dirname(__file__)
SYNTH = os.path.join(HERE, "..", "data", "synthetic-report", "run.ca")
BUSY = os.path.join(HERE, "..", "data", "gpu-h200", "busy.ca")     # real H200, 18 threads


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    return out, build_report(Timeline.open(SYNTH), str(out))


@pytest.fixture(scope="module")
def busy(tmp_path_factory):
    out = tmp_path_factory.mktemp("busy")
    return out, build_report(Timeline.open(BUSY), str(out))


def _section(md, title):
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", md, re.S | re.M)
    assert m, title
    return m.group(1)


def test_findings_come_first_ranked_and_point_to_sections(synth):
    out, rep = synth
    md = (out / "report.md").read_text()
    assert re.findall(r"^## (.*)$", md, re.M)[0] == "Findings"
    assert rep.text.split("\n== ")[1].startswith("Findings ==")
    items = json.loads((out / "report.json").read_text())["findings"]
    # the run's Xid 13 is never recovered from: the first finding; then by time
    assert items[0]["text"].startswith("26 faults (1 not healthy again before the run "
                                       "ended); the worst: #6 +15.000000 s Xid 13")
    assert [i["section"] for i in items] == ["Faults", "CUDA work", "Context-switch jitter",
                                             None]
    assert items[3]["text"] == "No events lost."
    # pinned ones (events lost, faults not recovered) first, then by impact
    imp = [i["impact_ns"] for i in items]
    pinned = [x for x in imp if x < 0]
    assert imp[:len(pinned)] == pinned and imp[len(pinned):] == sorted(imp[len(pinned):],
                                                                       reverse=True)
    titles = set(re.findall(r"^## (.*)$", md, re.M))
    for i in items:
        if i["section"]:
            assert i["section"] in titles
            anchor = "#" + i["section"].lower().replace(" ", "-")
            assert f"]({anchor})" in md
    assert len(_section(md, "Findings").strip().splitlines()) == len(items) <= 8


def test_tables_are_cut_in_markdown_with_what_was_left_out():
    t = Table(["a", "b"])
    for i in range(12):
        t.add([f"r{i}", i])
    md = t.markdown(5, "functions")
    assert md.count("\n| r") == 5 and "7 more functions not shown; report.json has all." in md
    assert "more" not in t.markdown() and "r11" in t.text() and "... 7 more" in t.text(limit=5)


def test_threads_that_made_cuda_calls_come_first_no_summed_offcpu(busy):
    out, rep = busy
    md = (out / "report.md").read_text()
    sec = _section(md, "Context-switch jitter")
    assert " in all" not in sec
    rows = [r for r in sec.splitlines() if re.match(r"^\| \d+ ", r)]
    threads = [r for r in rows if r.count("|") == 8]
    assert threads[0].startswith("| 737 python3 | 4,124 |")     # the one thread calling CUDA
    assert len(threads) == 10 and "8 more threads not shown; report.json has all." in sec
    per_thread = json.loads((out / "report.json").read_text())["jitter"]["per_thread"]
    assert len(per_thread) == 18 and per_thread[0]["cuda_calls"] == 4124
    assert "offcpu_ns" not in json.loads((out / "report.json").read_text())["jitter"]


def test_counters_in_human_units_flat_ones_in_one_line(busy):
    out, rep = busy
    sec = _section((out / "report.md").read_text(), "GPU counters")
    assert not re.search(r"\de[+-]\d\d", sec), sec
    assert re.search(r"\| mem_used \| 107 \| [\d.]+ MiB \| [\d.]+ GiB \| [\d.]+ GiB \|", sec)
    assert re.search(r"\| power \| 107 \| [\d.]+ W \|", sec)
    assert re.search(r"\| sm_clock \| 107 \| 345 MHz \| 1,500 MHz \| 1,980 MHz \|", sec)
    flat = next(ln for ln in sec.splitlines() if "flat all run:" in ln)
    assert "mem_clock 3,201 MHz" in flat and "ecc_dbe_volatile 0" in flat
    assert "| mem_clock |" not in sec
    nums = json.loads((out / "report.json").read_text())["counters"]
    assert {r["name"] for r in nums if not r["moved"]} >= {"mem_clock", "power_limit"}


def test_fmt_value_units():
    assert fmt_value(6.67943e+08, "bytes") == "637.00 MiB"
    assert fmt_value(2.11963e+09, "bytes") == "1.97 GiB"
    assert fmt_value(659.678, "W") == "659.7 W"
    assert fmt_value(7.11029e+09, "ns") == "7.110 s"
    assert fmt_value(4, "bitmask") == "0x4"
    assert fmt_value(8.66727e+06, "mJ") == "8.67 kJ"


def test_anomaly_figure_only_for_signals_that_moved(tmp_path):
    import numpy as np
    t = np.arange(100, dtype=np.int64) * 10**8
    quiet = {"name": "quiet", "unit": "", "t": t, "z": np.zeros(100), "excursions": [],
             "episodes": []}
    det = {"signals": [quiet], "threshold": 4.0, "window": 50}
    assert figures.anomalies(det, 0, [], str(tmp_path)) is None
    moved = dict(quiet, name="moved", z=np.r_[np.zeros(50), np.full(50, 9.0)],
                 episodes=[{"start_ns": int(t[50]), "end_ns": int(t[-1]), "peak_z": 9.0}])
    det["signals"].append(moved)
    assert figures.anomalies(det, 0, [], str(tmp_path)) == "anomalies.png"
