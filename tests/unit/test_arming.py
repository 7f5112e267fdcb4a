"""Arming (issue 24): a per-process uprobe_multi link refused because the process is gone is
recognised (ESRCH, no live process) and skipped, never taken for a kernel without the links
(that fell back to one perf-event uprobe per function, with a misleading hint); the order
stays return link first, then entry; the recorder's arming steps add up."""
import errno
import os
import subprocess
import time

import pytest

from clockalign.capture.probes import program
from clockalign.capture.probes.cflags import ProbeOptions
from clockalign.capture.probes.program import Probes, exited_meanwhile
from clockalign.capture.recorder import Arming
from clockalign.store import cuda_api


class _Prog:
    fd = 99


class _Map(dict):
    def __delitem__(self, key):
        super().__delitem__(key.value)


class _FakeBpf:
    KPROBE = 2

    def __init__(self, tgids):
        self.maps = {"targets": _Map((t, 1) for t in tgids)}

    def load_func(self, name, kind, attach_type=None):
        return _Prog()

    def __getitem__(self, name):
        return self.maps[name]


def _probes(tgids):
    p = Probes.__new__(Probes)
    p.opts = ProbeOptions(cuda_lib="/x/libcuda.so.1")
    p.cflags = ["-DCA_PID_LINKS"]
    p.tgids, p._links, p._pid_links, p.gone = list(tgids), [], {}, set()
    p._link_specs, p.cuda_paused = [], False
    p._bpf = _FakeBpf(tgids)
    return p


def _dead_pid():
    c = subprocess.Popen(["true"])
    c.wait()
    return c.pid


@pytest.fixture
def links(monkeypatch):
    """link_uprobe_multi replaced: refuses as told, else a real fd; records the calls."""
    made, refuse = [], {}

    def fake(prog_fd, path, offsets, cookies, retprobe, pid=0):
        if pid in refuse:
            raise OSError(refuse[pid], f"uprobe_multi link on {path}: {os.strerror(refuse[pid])}")
        fd = os.open(os.devnull, os.O_RDONLY)
        made.append((pid, retprobe, fd))
        return fd
    monkeypatch.setattr(program, "link_uprobe_multi", fake)
    yield made, refuse
    for _, _, fd in made:
        try:
            os.close(fd)
        except OSError:
            pass


def _at():
    fs = list(cuda_api.FUNCTIONS.values())[:3]
    return {0x1000 * (i + 1): f for i, f in enumerate(fs)}


def test_a_gone_process_is_skipped_not_a_fallback(links):
    made, refuse = links
    dead, alive = _dead_pid(), os.getpid()
    refuse[dead] = errno.ESRCH
    p = _probes([dead, alive])
    p._attach_multi("/x/libcuda.so.1", _at())
    assert p.gone == {dead} and p.tgids == [alive] and set(p._bpf["targets"]) == {alive}
    assert [(pid, ret) for pid, ret, _ in made] == [(alive, True), (alive, False)]
    assert p._pid_links == {alive: [made[0][2], made[1][2]]}      # return link first
    assert [sp[5] for sp in p._link_specs] == [alive, alive]      # what --cuda-duty re-arms


def test_a_process_gone_between_its_return_and_entry_link_keeps_no_link(links, monkeypatch):
    made, refuse = links
    dead = _dead_pid()
    real = program.link_uprobe_multi

    def return_then_gone(prog_fd, path, offsets, cookies, retprobe, pid=0):
        if not retprobe:
            refuse[pid] = errno.ESRCH
        return real(prog_fd, path, offsets, cookies, retprobe, pid)
    monkeypatch.setattr(program, "link_uprobe_multi", return_then_gone)
    p = _probes([dead])
    p._attach_multi("/x/libcuda.so.1", _at())
    assert p.gone == {dead} and p._links == [] and p._pid_links == {} and not p._link_specs
    with pytest.raises(OSError):                  # its return link was closed
        os.fstat(made[0][2])


@pytest.mark.parametrize("err", [errno.ESRCH, errno.EINVAL])
def test_a_live_process_refused_is_still_an_error(links, err):
    """ESRCH for a process that runs, or another errno: the caller's fallback decides."""
    made, refuse = links
    refuse[os.getpid()] = err
    p = _probes([os.getpid()])
    with pytest.raises(OSError) as e:
        p._attach_multi("/x/libcuda.so.1", _at())
    assert e.value.errno == err and not p.gone


def test_exited_meanwhile():
    dead = _dead_pid()
    assert exited_meanwhile(OSError(errno.ESRCH, "x"), dead)
    assert not exited_meanwhile(OSError(errno.ESRCH, "x"), os.getpid())
    assert not exited_meanwhile(OSError(errno.EINVAL, "x"), dead)


def test_arming_steps_add_up_and_are_named():
    a = Arming()
    time.sleep(0.02)
    a.step("libcuda_lookup_s")
    a.steps.update({"bpf_compile_load_s": 0.03, "cuda_links_s": 0.001})
    time.sleep(0.03)
    a.step()
    d = a.done()
    assert d["total_s"] >= 0.05 and d["libcuda_lookup_s"] >= 0.02
    text = a.text()
    assert text.startswith(f"probes armed in {d['total_s']:.2f} s (libcuda lookup 0.0")
    assert "BPF compile and load 0.03 s" in text and "CUDA links" not in text   # < 5 ms
