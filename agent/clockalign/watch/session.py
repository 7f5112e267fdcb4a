"""One ``clockalign watch``: the recorder with an Aggregator as its sink, and the server.

The HTTP server binds before any probe is armed, so a busy port fails at once (until the
probes are armed, /metrics says clockalign_probes_armed 0); it serves until the recording
ends (Ctrl-C, SIGTERM, --duration, the targets' exit).

    summary = run_watch(RecordOptions(pids=[1234], output=None), "127.0.0.1:9464")
"""
import sys

from ..capture.recorder import Recorder
from .aggregate import Aggregator
from .metrics import build_registry, is_loopback, parse_listen, serve


def run_watch(opts, listen: str, announce=None) -> dict:
    """Watch until the recording stops; the recorder's summary plus "scrapes" and "url"."""
    host, port = parse_listen(listen)
    say = announce or (lambda text: print(f"clockalign: {text}", file=sys.stderr, flush=True))
    url = None
    agg = Aggregator(on_open=lambda: say(f"probes armed: serving {url}"))
    registry, collector = build_registry(agg)
    server = serve(registry, host, port)
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
    return {**summary, "scrapes": collector.scrapes, "url": url,
            "cuda_calls": sum(agg.cuda_calls.values())}
