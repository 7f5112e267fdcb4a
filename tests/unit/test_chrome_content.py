"""The Chrome JSON export's content is what it was before the compact text (issue 26):
each trace, read back with the json module (tests/unit/chrome_content.py: times as exact
ns, defaults the trace names once put back on the events that left them out), gives the
same events (phase, name, category, pid/tid, ts and dur to the ns, flow ids, args) as the
trace the previous writer made, whose digests tests/data/chrome-content.json keeps.

That file was made with the writer of commit 8e0f818 (space-padded row matrices, every
arg on every event, µs with three decimals); regenerate it only for a change of content
made on purpose:

    PYTHONPATH=agent python -m tests.unit.test_chrome_content --update
"""
import json
import os

import pytest

from tests.unit import chrome_content
from tests.unit import stored_content as sc

HERE = os.path.dirname(os.path.abspath(__file__))
STORED = os.path.join(HERE, "..", "data", "chrome-content.json")


def export_digests(name, workdir) -> dict:
    from clockalign.export.chrome_json import write_chrome_json
    return sc.export_digests(name, workdir, ".json", write_chrome_json,
                             lambda b: chrome_content.digests(chrome_content.content(b)))


@pytest.mark.parametrize("name", sorted(sc.runs()))
def test_same_content_as_before(name, tmp_path):
    sc.assert_same(name, export_digests(name, str(tmp_path)), STORED)


if __name__ == "__main__":
    sc.update(STORED, export_digests, __doc__)


def test_every_record_is_as_small_as_its_json(tmp_path):
    """No byte the format does not need: each record (one a line) is exactly the compact
    json.dumps of what it holds, so no padding, no whitespace, no trailing zero in a µs
    decimal; args holding their default are left out, said once in the first record."""
    from clockalign.export.chrome_json import write_chrome_json
    from clockalign.export.jsonrows import DEFAULTS
    from clockalign.timeline import Timeline
    for name in ("synthetic-faults", "gpu-activity"):
        run = str(tmp_path / f"{name}.ca")
        sc.runs()[name][0](run)
        out = tmp_path / f"{name}.json"
        with open(out, "wb") as f:
            write_chrome_json(Timeline.open(run), f)
        data = out.read_bytes()
        lines = data.decode().split("\n")
        assert lines[0] == '{"traceEvents":[' and lines[-1] == ""
        records = [ln[:-1] if ln.endswith(",") else ln for ln in lines[1:-2]]
        assert len(records) > 200
        for r in records:
            assert json.dumps(json.loads(r), ensure_ascii=False, separators=(",", ":")) == r
        evs = json.loads(data)["traceEvents"]
        assert evs[0]["name"] == "clockalign" and evs[0]["args"]["defaults"] == DEFAULTS
        calls = [e for e in evs if e["ph"] == "X" and e["cat"] == "cuda"]
        assert calls and not any(e["args"].get("result") == "CUDA_SUCCESS" for e in calls)
        assert any("." in str(e["ts"]) for e in evs if "ts" in e)      # ns kept where there
