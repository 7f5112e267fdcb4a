"""One ``clockalign watch``: the recorder with an Aggregator as its sink, and the server.

The HTTP server binds before any probe is armed, so a busy port fails at once (until the
probes are armed, /metrics says clockalign_probes_armed 0); it serves until the recording
ends (Ctrl-C, SIGTERM, --duration, the targets' exit).

    summary = run_watch(RecordOptions(pids=[1234], output=None), "127.0.0.1:9464")
"""
import sys

from ..capture.recorder import Recorder
from ..timeline.heap import set_mmap_threshold
from .aggregate import Aggregator
from .metrics import build_registry, is_loopback, parse_listen, serve


MMAP_THRESHOLD_BYTES = 128 << 10


def fix_mmap_threshold() -> bool:
    """Keep glibc's mmap threshold at 128 KiB for this process (True if it could be set).

    glibc raises the threshold after each large free, so once a backlog has been worked off
    (the CPUs were busy elsewhere for a while) the next event batches come from the heap,
    and the heap keeps its high-water mark: watch's RSS stepped up 7-17 MiB after each such
    spell and stayed there (results/watch.md).  Fixed, every batch is its own mapping and
    goes back to the kernel when freed.  watch only: record keeps the faster heap reuse."""
    return set_mmap_threshold(MMAP_THRESHOLD_BYTES)


def run_watch(opts, listen: str, announce=None) -> dict:
    """Watch until the recording stops; the recorder's summary plus "scrapes" and "url"."""
    fix_mmap_threshold()
    host, port = parse_listen(listen)
    say = announce or (lambda text: print(f"clockalign: {text}", file=sys.stderr, flush=True))
    url = None
    agg = Aggregator(on_open=lambda: say(f"probes armed: serving {url}"))
    registry, _ = build_registry(agg)
    server = serve(registry, host, port, on_scrape=lambda n: setattr(agg, "scrapes", n))
    try:
        bound = server.server_address[1]
        url = f"http://{f'[{host}]' if ':' in host else host}:{bound}/metrics"
        if not is_loopback(host):
            say(f"listening on {host}:{bound}, reachable from other hosts (--listen)")
        opts.sinks = list(opts.sinks) + [agg]
        summary = Recorder(opts).run()
    finally:
        server.shutdown()
        server.server_close()
    return {**summary, "scrapes": server.scrapes, "url": url,
            "cuda_calls": agg.cuda_calls_seen}
