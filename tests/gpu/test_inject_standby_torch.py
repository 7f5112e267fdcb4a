"""A warm PyTorch standby on the GPU: an illegal address poisons the serving worker's CUDA
context (Xid 31), and the standby, its own context in another process, serves at once."""
import time

import pytest

from clockalign.inject import faults

from ..unit.test_inject_standby import _ev, running_service

pytest.importorskip("torch", reason="torch is not installed")


def test_the_standby_serves_through_an_illegal_address(tmp_path):
    with running_service(tmp_path, engine="torch", deadline_ms=2000, device="cuda",
                         start_s=120) as (d, events):
        meta = d.metadata()
        assert meta["parameters"]["device"] == "cuda"
        t0 = time.monotonic_ns()
        rep = d.repetition(faults.FAULTS["illegal-address"].request(meta, 0))
        assert rep["status"] == 500 and "sticky" in rep["error"], rep
        assert rep["polls"] == 1                  # ready at once: the standby serves
        switch, = _ev(events, "switch", t0)
        assert switch["why"] == "sticky"
        for i in range(3):                        # the standby's context is whole
            assert d.infer(faults.normal_request(meta, i))[3] == 200
        assert d.wait_standby(1, 120) is not None
        assert _ev(events, "standby_ready", t0)[0]["worker"] not in (switch["worker"],
                                                                     switch["old"])
