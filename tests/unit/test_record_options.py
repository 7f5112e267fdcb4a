"""record's option checks and the architecture preflight: one sentence, never a traceback."""
import collections
import subprocess
import sys

from clockalign.capture import preflight


def _record(*args):
    return subprocess.run([sys.executable, "-m", "clockalign.cli.main", "record", *args],
                          capture_output=True, text=True, timeout=60)


def test_gpu_clock_pings_and_period_must_be_positive():
    for args, hint in ((["--gpu-clock-pings", "0"], "--gpu-clock-pings"),
                       (["--gpu-clock-period", "0"], "--gpu-clock-period")):
        p = _record(*args, "--", "true")
        assert p.returncode == 2 and hint in p.stderr and "Traceback" not in p.stderr


def test_gpu_clock_options_unchecked_without_the_gpu_clock(monkeypatch):
    p = _record("--no-gpu-clock", "--gpu-clock-pings", "0", "--dump-bpf", "--", "true")
    assert p.returncode == 0 and "cflags" in p.stdout


def test_architecture_check_names_the_host(monkeypatch):
    U = collections.namedtuple("U", "sysname nodename release version machine")
    monkeypatch.setattr(preflight.os, "uname", lambda: U("Linux", "h", "6.8", "#1", "aarch64"))
    c = preflight.check_architecture()
    assert not c.ok and "aarch64" in c.detail and "x86-64" in c.detail
    monkeypatch.setattr(preflight.os, "uname", lambda: U("Linux", "h", "6.8", "#1", "x86_64"))
    assert preflight.check_architecture().ok
