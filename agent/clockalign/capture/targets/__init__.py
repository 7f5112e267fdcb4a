"""The processes a recording is about: process.py (a command held before exec, --pid
checks, threads, listening ports), follow.py (--follow by name), container.py (mount
namespaces and roots), inject_so.py (a library loaded into a running process)."""
