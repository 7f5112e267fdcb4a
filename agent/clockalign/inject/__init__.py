"""clockalign.inject: a fault's life cycle, inject -> detect -> recover, timed on one timeline.

A reference KServe-V2 inference service (service.py; its engine workers, with --standby
N warm ones: pool.py and worker.py; engines.py), faults injected through real requests (faults.py) by a client that stamps
CLOCK_MONOTONIC (driver.py), background load (load.py), the whole session recorded by
clockalign (run.py), each repetition split into segments from the recording (segments.py),
and lifecycle.json / .md / a figure (output.py).

    sudo clockalign inject --engine onnxruntime --fault timeout -n 20 -o out/
"""
