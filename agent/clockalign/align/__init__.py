"""clockalign.align: every clock domain on host MONOTONIC, each time with its uncertainty.

    from clockalign.align import fit_sandwiches, fit_run
    model = fit_sandwiches(t0, gpu_ns, t1, tick_ns=32)     # sandwiches t0 <= host <= t1
    host_ns, unc_ns = model.map(kernel_start_gpu_ns)
    models = fit_run(RunReader("run.ca"))                   # {"GPU0": model, "REALTIME": ...}

numpy/scipy only: no bcc, no pynvml, so a run file can be analysed anywhere.
"""
from .model import ASSUMPTION, AlignmentModel, fit_sandwiches
from .run import fit_run

__all__ = ["fit_sandwiches", "AlignmentModel", "fit_run", "ASSUMPTION"]
