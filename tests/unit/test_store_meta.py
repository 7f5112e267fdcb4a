"""How a target of the run file's metadata is named in info, the report and the trace."""
from clockalign.store.meta import target_label


def test_host_process_has_no_label():
    assert target_label({"pid": 1234, "nspid": 1234, "cgroup": "/"}) == ""


def test_container_target_names_its_pid_container_and_cgroup():
    t = {"pid": 4321, "nspid": 1, "cgroup": "/system.slice/docker-" + "ab" * 32 + ".scope",
         "container": {"runtime": "docker", "id": "ab" * 32}}
    assert target_label(t) == ("pid 1 in its namespace, container docker abababababab, "
                               "cgroup /system.slice/docker-" + "ab" * 32 + ".scope")


def test_old_run_files_without_the_fields():
    assert target_label({"pid": 7, "cmdline": ["python3"]}) == ""


def test_trace_process_name_carries_the_label():
    from clockalign.export.model import TraceModel
    from clockalign.store.devices import Devices

    class TL:
        devices = Devices([])
        meta = {"targets": [{"pid": 4321, "nspid": 1, "cmdline": ["python3", "serve.py"],
                             "container": {"runtime": "containerd", "id": "c0ffee" * 10}}]}
        threads = {}
    m = TraceModel(TL())
    assert m.tracks.processes[4321] == ("python3 serve.py [pid 1 in its namespace, "
                                        "container containerd c0ffeec0ffee]")
