"""Events from the BPF programs to the recorder: per-CPU slot rings (slotring.py; perf
buffers, perfbuf.py, where the rings do not load), read in bulk by native/reader.c's
thread (buffers.py, drain.py); sinks.py hands every chunk to the run file and live sinks."""
