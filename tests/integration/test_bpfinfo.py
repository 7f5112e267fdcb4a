"""bpf(2)'s view of the recorder's programs (capture/probes/bpfinfo.py): the benchmark reads run
times from it and the recorder the kernel's skipped runs, reported beside the drops."""
import os

from clockalign.capture.probes import bpfinfo
from clockalign.capture.probes.cflags import ProbeOptions
from clockalign.capture.probes.program import Probes


def test_the_probes_programs_are_seen_and_nothing_was_skipped(fakecuda):
    opts = ProbeOptions(cuda_lib=str(fakecuda / "libcuda.so.1"), connect=True, sched=True,
                        xid=False, tcp=False)
    with Probes(opts, [os.getpid()]) as p:
        mine = {fn.name.decode(): bpfinfo.prog_info(fn.fd) for fn in p._bpf.funcs.values()}
        assert {"enter_any", "return_any"} <= set(mine)
        for name, info in mine.items():
            assert info is not None, name
            # the kernel keeps 15 characters (of a tracepoint's, BCC's name without
            # its "tracepoint__")
            assert info["name"] == name.removeprefix("tracepoint__")[:15], name
            assert info["jited"]
        everything = bpfinfo.system_progs()
        assert {v["name"] for v in everything.values()} >= {i["name"] for i in mine.values()}
        assert p.skipped_runs() == sum(i["recursion_misses"] for i in mine.values())
