"""No false faults, no foreign links in a chain (issue 16 item 7), on the H200 recording.

The CUDA runtime's MPS probe (connect to unix:/tmp/nvidia-mps..., ENOENT) used to be the
recording's first fault, and its chain took in the refused connects to an unrelated TCP
peer (127.0.0.1:58539) and ended "healthy after 798 ms" on that peer's success.
"""
import os

from clockalign.store import cuda_api
from clockalign.timeline import Timeline

FAULTS = os.path.join(os.path.dirname(__file__), "..", "data", "gpu-h200", "faults.ca")


def test_mps_probe_is_information_not_a_fault():
    tl = Timeline.open(FAULTS)
    faults = tl.faults()
    assert not [f for f in faults if (f.target or "").startswith("unix:/tmp/nvidia-mp")]
    notes = [n for n in tl.notes if "MPS server" in n]
    assert len(notes) == 1 and "ENOENT" in notes[0] and "623" in notes[0]
    conn = [f for f in faults if f.kind == "connect_error"]
    assert [(f.target, f.name) for f in conn] == [("127.0.0.1:58539", "ECONNREFUSED")]


def test_a_chain_holds_only_what_follows_from_its_fault():
    faults = Timeline.open(FAULTS).faults()
    for f in faults:
        for e in f.chain:
            if f.kind == "connect_error" and e["what"] in ("retry", "error", "success"):
                assert e["target"] == f.target, (f.id, e)
            if f.kind == "cuda_error" and e["what"] == "error":
                assert cuda_api.BY_SYMBOL[e["function"]].role == \
                    cuda_api.BY_SYMBOL[f.function].role, (f.id, e)
    c = next(f for f in faults if f.kind == "connect_error")
    assert [e["what"] for e in c.chain] == ["retry", "success"]
    # healthy = that peer answered again: the recovery, nothing about another peer
    assert c.healthy_ns == c.recovery_ns and 200_000_000 < c.healthy_ns < 201_000_000
    assert not [f for f in faults if f.healthy_ns is not None
                and 798_000_000 <= f.healthy_ns < 799_000_000]
