"""pip install builds clockalign's C helpers into the package (metadata: pyproject.toml).

A wheel holds agent/clockalign/native/_built/ with the event reader, the ping-pong loop and the
Perfetto layout helper,
compiled by python -m clockalign.native.build (gcc); without a C compiler the install stops
with one sentence instead of leaving a package that cannot record.  The CUPTI injection
library depends on the CUPTI of the host that records: `sudo python3 -m
clockalign.native.build` builds it there (`clockalign doctor` says when it is missing).
An editable install (pip install -e, scripts/setup.sh) builds nothing here: setup.sh runs
the build itself, into the checkout.
"""
import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution


class BuildWithHelpers(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        into = os.path.join(self.build_lib, "clockalign", "native", "_built")
        env = dict(os.environ, PYTHONPATH=os.path.abspath(self.build_lib))
        r = subprocess.run([sys.executable, "-m", "clockalign.native.build", "--no-cupti",
                            "--into", into], env=env)
        if r.returncode != 0:
            raise SystemExit("clockalign: pip install needs a C compiler (gcc) to build the C "
                             "helpers that recording runs")


class BinaryDistribution(Distribution):
    """The wheel carries compiled helpers: tag it for this platform, not pure Python."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithHelpers}, distclass=BinaryDistribution)
