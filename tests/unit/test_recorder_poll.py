"""How long the recorder sleeps between reads of the event buffers."""
from clockalign.capture.recorder import POLL_S, next_poll_s


def test_idle_buffers_wait_the_full_period():
    assert next_poll_s(0.0, 0.05, 0.001) == POLL_S


def test_slow_filling_buffers_wait_the_full_period():
    # 1 % in 50 ms: half full in 2.5 s
    assert next_poll_s(0.01, 0.05, 0.001) == POLL_S


def test_fast_filling_buffer_is_read_before_half_full():
    # 40 % in 20 ms: 20 %/10 ms, half full in 25 ms; 3 ms of this read already spent
    s = next_poll_s(0.4, 0.020, 0.003)
    assert abs(s - 0.022) < 1e-9


def test_never_a_busy_loop():
    assert next_poll_s(1.0, 0.001, 0.01) == 0.0005


def test_sinks_and_helpers_import_before_the_probes_fire():
    """Recorder._preload (called before the probes are attached) asks each sink to import
    what it will need: watch's aggregator imports align (scipy.optimize) there, not at the
    first GPU clock chunk, where the import's GIL stretches kept the buffer reader waiting."""
    import subprocess
    import sys
    code = """
import sys
from clockalign.capture.recorder import Recorder, RecordOptions
from clockalign.watch.aggregate import Aggregator
assert "clockalign.align" not in sys.modules
rec = Recorder(RecordOptions(output=None, sinks=[Aggregator()], counters="none",
                             gpu_clock=False))
rec.devices = []
rec._preload()
print("clockalign.align" in sys.modules, "clockalign.capture.clockprobe" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "True"]
