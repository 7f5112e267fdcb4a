"""The parts of capture/targets/inject_so.py that need no ptrace: symbols from the mapped ELF file
plus the mapping's base, checked against where this very process's loader put them."""
import ctypes
import os
import platform

import pytest

from clockalign.capture.targets import inject_so
from clockalign.capture.gpu.cupti_attach import LiveCupti, refusal

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 only")


def test_dlopen_found_where_our_own_loader_put_it():
    d = inject_so.find_dlopen(os.getpid())
    libc = ctypes.CDLL(None)
    assert d["dlopen"] == ctypes.cast(libc.dlopen, ctypes.c_void_p).value
    assert d["dlerror"] == ctypes.cast(libc.dlerror, ctypes.c_void_p).value
    assert os.path.basename(d["lib"]).startswith(("libc.so", "libdl.so"))


def test_symbol_of_a_library_by_path_and_a_missing_one():
    libc = ctypes.CDLL(None)
    path = inject_so.mapped(os.getpid(), lambda n: n.startswith("libc.so"))[0]
    name, addr = inject_so.symbol_address(os.getpid(), path, ["no_such_fn", "getpid"])
    assert name == "getpid" and addr == ctypes.cast(libc.getpid, ctypes.c_void_p).value
    assert inject_so.symbol_address(os.getpid(), path, ["no_such_fn"]) is None


def test_not_an_elf_file_is_one_sentence():
    with pytest.raises(inject_so.InjectError, match="not a 64-bit little-endian ELF"):
        inject_so._dynsyms(b"#!/bin/sh\n" + b"\0" * 64)


def test_refusals_known_before_any_stop(tmp_path):
    gone = 2 ** 22 + 12345
    assert inject_so.ptrace_refusal(gone) == f"process {gone} does not exist"
    # this test process has no libcuda: said before anything is touched
    assert refusal(os.getpid()) == (f"process {os.getpid()} has not loaded libcuda: CUPTI can "
                                    "start only in a process that uses CUDA (attach again once "
                                    "it does)")


def test_settings_name_the_fifo_libcupti_and_the_hosts_pid(tmp_path):
    live = LiveCupti(os.getpid(), "/x/ca_cupti.so", "/y/libcupti.so.13", raw=False)
    live.stage(str(tmp_path))            # same root as ours: nothing copied
    assert live.lib_in_target == "/x/ca_cupti.so"
    s = live.settings()
    assert s.endswith(b"\0")
    assert s[:-1].decode().splitlines() == [f"fifo={tmp_path}/activity-{os.getpid()}.fifo",
                                            "lib=/y/libcupti.so.13", "raw=0",
                                            f"pid={os.getpid()}"]
    assert os.path.exists(f"{tmp_path}/activity-{os.getpid()}.fifo")


def test_in_target_strips_a_chroots_prefix(monkeypatch):
    monkeypatch.setattr(os, "readlink", lambda p: "/srv/root")
    assert inject_so.in_target(1, "/srv/root/usr/lib/libc.so.6") == "/usr/lib/libc.so.6"
    assert inject_so.in_target(1, "/usr/lib/libc.so.6") == "/usr/lib/libc.so.6"
