"""clockalign: CUDA calls, context switches, connect(), GPU counters and faults on one clock.

    sudo clockalign record --pid 1234 -o run.ca
    clockalign report run.ca
"""
__version__ = "0.1.0"
