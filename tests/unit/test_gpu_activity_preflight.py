"""record --gpu-activity judges before the command starts whether any of its processes can
load CUPTI (issue 24): no NVIDIA driver, or no libcuda.so.1 its loader would find, is said
first, once, and nothing is injected (tests/integration/test_gpu_activity_record.py runs it
end to end)."""
import pytest

from clockalign.capture.gpu import gpuactivity
from clockalign.capture.gpu.gpuactivity import cannot_record


def test_no_driver_is_said_first():
    why = cannot_record({}, None)
    assert why.startswith("no NVIDIA driver is loaded on this host")


def test_no_libcuda_for_the_command(monkeypatch, tmp_path):
    import clockalign.capture.probes.libcuda as libcuda
    monkeypatch.setattr(libcuda, "ldconfig_cache", lambda root: {})
    monkeypatch.setattr(libcuda, "DEFAULT_DIRS", [str(tmp_path / "none")])
    why = cannot_record({"LD_LIBRARY_PATH": str(tmp_path)}, "NVRM version: 580")
    assert why.startswith("the command's loader finds no libcuda.so.1")
    (tmp_path / "libcuda.so.1").write_bytes(b"\x7fELF")
    assert cannot_record({"LD_LIBRARY_PATH": str(tmp_path)}, "NVRM version: 580") is None


@pytest.mark.parametrize("driver", [None, "NVRM version: 580"])
def test_the_recorder_injects_nothing_then(monkeypatch, driver, capsys, tmp_path):
    from clockalign.capture.recorder import Recorder, RecordOptions
    import clockalign.capture.recorder as recorder
    import clockalign.capture.probes.libcuda as libcuda
    monkeypatch.setattr(recorder, "nvidia_driver_version", lambda: driver)
    monkeypatch.setattr(libcuda, "ldconfig_cache", lambda root: {})
    monkeypatch.setattr(libcuda, "DEFAULT_DIRS", [str(tmp_path)])
    monkeypatch.setattr(gpuactivity.GpuActivity, "prepare", lambda self, env: pytest.fail(
        "CUPTI was prepared although no process can load it"))
    rec = Recorder(RecordOptions(command=["true"], gpu_activity=True))
    env = {"PATH": "/usr/bin"}
    rec._prepare_activity(env)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("clockalign: GPU activity will not be recorded: ")
    assert err[0].endswith("; recording the rest")
    assert rec.activity is None and "CUDA_INJECTION64_PATH" not in env
