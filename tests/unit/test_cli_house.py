"""House rules of the commands (issue 16, Order): a closed pipe is success, the CLI loads
no plotting library it does not draw with, figures are Figure objects, doctor fails
through the project's error type."""
import os
import subprocess
import sys

import pytest

from clockalign.cli.main import main as cli_main

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
RUN = os.path.join(DATA, "synthetic-report", "run.ca")
CMD = [sys.executable, "-m", "clockalign.cli.main"]


@pytest.mark.parametrize("args", [["dump", RUN], ["faults", RUN], ["info", RUN],
                                  ["align", RUN, "--json"]])
def test_reader_closing_the_pipe_is_success(args):
    """clockalign dump run.ca | head -1: exit 0, nothing on stderr."""
    p = subprocess.Popen(CMD + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert first and p.wait(timeout=120) == 0 and err == "", err


def test_faults_info_dump_align_load_no_matplotlib():
    code = ("import sys\n"
            "from clockalign.cli import faults, info, dump, align, main\n"
            "main._load('report')\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib')\n"
            "print(bad)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_report_draws_with_figure_objects_not_pyplot(tmp_path):
    code = ("import sys\n"
            "from clockalign.cli.main import main\n"
            f"try:\n    main(['report', {RUN!r}, '-o', {str(tmp_path)!r}])\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "import matplotlib\n"
            "print('matplotlib.pyplot' in sys.modules, matplotlib.get_backend())\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1].startswith("False")
    assert any(n.endswith(".png") for n in os.listdir(tmp_path))


def test_doctor_missing_requirement_is_one_sentence_exit_1(monkeypatch, capsys):
    from clockalign.capture.preflight import Check
    import clockalign.cli.doctor as doctor
    monkeypatch.setattr(doctor, "run_checks", lambda pid=None: [
        Check("tracefs", False, "not mounted", "mount -t tracefs nodev /sys/kernel/tracing",
              required=True),
        Check("NVML", False, "absent", "install it", required=False)])
    with pytest.raises(SystemExit) as e:
        cli_main(["doctor"])
    out, err = capsys.readouterr()
    assert e.value.code == 1
    assert err == "clockalign: 1 requirement(s) missing: tracefs\n"
    assert "tracefs: not mounted" in out and "Traceback" not in err


def test_python_dash_m_clockalign_is_the_command():
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "clockalign", "info", "/nonexistent/x.ca"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("clockalign: ") and "Traceback" not in p.stderr
