"""The BPF program and its attachment: cflags.py decides what bpf/probes.c is built with,
program.py loads it and makes the CUDA links (uprobe_multi.py, prologue.py, cuda_stubs.py,
duty.py), maps.py reads its maps (drops, calls in flight); libcuda.py finds the library a
target would load; tracefs.py and bpfinfo.py ask the kernel what it has."""
