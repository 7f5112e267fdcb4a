"""scripts/data/make_test_runs.py regenerates tests/data/synthetic/ byte for byte."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data", "synthetic")


def test_the_committed_synthetic_runs_are_what_the_script_writes(tmp_path):
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "data", "make_test_runs.py"),
                    "--out", str(tmp_path)], check=True, capture_output=True)
    for name in ("faults.ca", "faults_truncated.ca", "aligned.ca"):
        with open(tmp_path / name, "rb") as new, open(os.path.join(DATA, name), "rb") as old:
            assert new.read() == old.read(), name
