"""The native ping-pong host loop (clockalign/native/ca_pingpong.c) against a host thread that
answers the way the probe kernel does (RESP_VAL, then RESP_SEQ), so it runs with no GPU."""
import ctypes
import threading
import time

import numpy as np
import pytest

from clockalign.capture.clocks import gpuclock
from clockalign.capture.clocks.gpuclock import EXIT, REQ, RESP_SEQ, RESP_VAL, RESP_WORD, WORD_MASK


@pytest.fixture
def loop():
    return gpuclock.native_loop()


def _burst(f, buf, n, timeout_ns=200_000_000, base=0):
    t0, rem, t1 = (np.zeros(n, dtype=np.int64) for _ in range(3))
    why = ctypes.c_int(-1)
    k = f(buf.ctypes.data, base, n, timeout_ns, t0.ctypes.data, rem.ctypes.data, t1.ctypes.data,
          ctypes.byref(why))
    return k, why.value, t0[:k], rem[:k], t1[:k]


def test_sandwiches_from_a_responder(loop):
    buf = np.zeros(4096 // 8, dtype=np.uint64)
    w = buf.view(np.uint64)
    stop = threading.Event()

    def responder():
        last = 0
        while not stop.is_set():
            r = int(w[REQ // 8])
            if r != last:
                w[RESP_VAL // 8] = time.monotonic_ns()     # the "remote clock": MONOTONIC
                w[RESP_SEQ // 8] = r
                last = r
    th = threading.Thread(target=responder, daemon=True)
    th.start()
    try:
        k, why, t0, rem, t1 = _burst(loop, buf, 23)
    finally:
        stop.set()
        th.join()
    assert k == 23 and why == 0
    assert (t0 <= rem).all() and (rem <= t1).all()          # causal sandwiches
    assert (np.diff(t0) > 0).all()


def test_no_answer_times_out_and_a_kernel_exit_is_told_apart(loop):
    buf = np.zeros(4096 // 8, dtype=np.uint64)
    start = time.monotonic()
    k, why, *_ = _burst(loop, buf, 5, timeout_ns=20_000_000)
    assert k == 0 and why == 2 and time.monotonic() - start < 2
    buf[EXIT // 8] = 3 | (7 << 8)                            # the kernel ended (idle timeout)
    k, why, *_ = _burst(loop, buf, 5)
    assert k == 0 and why == 1


def test_an_unbuilt_loop_is_one_sentence(monkeypatch, tmp_path):
    from clockalign import native
    monkeypatch.setattr(gpuclock, "_native", None)
    monkeypatch.setattr(native, "BUILT", tmp_path)
    monkeypatch.delitem(native._loaded, "ca_pingpong", raising=False)
    with pytest.raises(native.NativeMissing, match=r"ping-pong loop is not built "
                       r"\(ca_pingpong.c\): run scripts/setup.sh"):
        gpuclock.native_loop()


def _word_responder(w, stop, delay_s=0.0):
    """Answers the way ptx ca_pingpong_word does: one store, the value's low 5 bits the
    request's (the "remote clock" is MONOTONIC rounded down to 32 ns)."""
    def run():
        last = int(w[REQ // 8])
        while not stop.is_set():
            r = int(w[REQ // 8])
            if r != last:
                if delay_s:
                    time.sleep(delay_s)
                w[RESP_WORD // 8] = (time.monotonic_ns() & ~WORD_MASK) | (r & WORD_MASK)
                last = r
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def test_one_word_answers_give_causal_sandwiches():
    f = gpuclock.native_loop(word=True)
    buf = np.zeros(4096 // 8, dtype=np.uint64)
    base = 1000                                      # sequence numbers go past the mask
    buf[RESP_WORD // 8] = base & WORD_MASK           # "base answered", as pingpong() sets
    buf[REQ // 8] = base
    stop = threading.Event()
    th = _word_responder(buf, stop)
    try:
        k, why, t0, rem, t1 = _burst(f, buf, 70, base=base)
    finally:
        stop.set()
        th.join()
    assert k == 70 and why == 0
    assert (rem % 32 == 0).all()                     # the sequence bits are masked off
    assert (t0 <= rem + WORD_MASK).all() and (rem <= t1).all()
    assert (np.diff(rem) > 0).all()                  # each answer is its own, none stale


def test_one_word_loop_never_takes_a_stale_answer():
    f = gpuclock.native_loop(word=True)
    buf = np.zeros(4096 // 8, dtype=np.uint64)
    base = 31                                        # (base + 1) & 31 == 0: the zeroed word
    buf[RESP_WORD // 8] = base & WORD_MASK           # would match without this
    buf[REQ // 8] = base
    k, why, *_ = _burst(f, buf, 3, timeout_ns=20_000_000, base=base)
    assert k == 0 and why == 2                       # nobody answered: no sandwich made up


def test_word_answer_only_where_the_timer_has_no_low_bits():
    assert gpuclock.word_protocol_note((np.arange(10) * 32) + (1 << 40)) == ""
    note = gpuclock.word_protocol_note(np.array([64, 96, 97, 128]))
    assert "1 of 4" in note and "not multiples of 32" in note
    assert gpuclock.word_protocol_note([]) != ""
