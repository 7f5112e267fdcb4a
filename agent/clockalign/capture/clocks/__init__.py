"""Clock domains measured against MONOTONIC while recording: cpuclock.py (REALTIME,
BOOTTIME, MONOTONIC_RAW sandwiches), gpuclock.py (a GPU's %globaltimer by ping-pong, over
cudadriver.py), devices.py (NVML index <-> bus id <-> CUDA ordinal), clockprobe.py (the
thread that runs them and writes their chunks)."""
