"""clockalign watch: the probes of record, served live as Prometheus metrics."""
import click

from ..watch.rules import DEFAULT_P99_FACTOR, render
from .record import dump_bpf_text, probe_options, record_options

EPILOG = """\b
Examples:
  sudo clockalign watch --pid 1234                      # http://127.0.0.1:9464/metrics
  sudo clockalign watch --pid 1234 -o serve.ca          # and a run file
  sudo clockalign watch --listen 0.0.0.0:9464 --pid 1234   # reachable from other hosts
  sudo clockalign watch -- python3 serve.py             # probes armed before it starts
  sudo clockalign watch --follow tritonserver           # and every restart of it
  sudo clockalign watch --follow /srv/model/serve.py    # processes running that script
  clockalign watch --print-rules > /etc/prometheus/rules/clockalign.yml
\b
Prometheus:
  scrape_configs:
    - job_name: clockalign
      static_configs: [{targets: ["127.0.0.1:9464"]}]
"""


@click.command("watch", epilog=EPILOG)
@click.option("--listen", default="127.0.0.1:9464", show_default=True,
              help="HOST:PORT to serve /metrics on; loopback unless you choose otherwise.")
@click.option("-o", "--output", default=None,
              help="Also write a run file (created 0600, owned by the sudo user).")
@click.option("--follow", "follow", multiple=True, metavar="NAME",
              help="Attach to every process NAME names, now and whenever one appears (a "
                   "restart), and stay up when they exit. NAME without a / is a comm "
                   "(equal to /proc/PID/comm, cut to 15 characters, like pgrep -x); with a / "
                   "a file: the executable, or the script (first non-option argument) the "
                   "process runs. Repeatable; may be combined with --pid.")
@click.option("--print-rules", is_flag=True,
              help="Print the shipped Prometheus alert rules and exit.")
@click.option("--p99-factor", type=float, default=DEFAULT_P99_FACTOR, show_default=True,
              help="With --print-rules: alert when a CUDA call's p99 exceeds its own 1 h "
                   "baseline by this factor.")
@probe_options
def command(listen, output, follow, print_rules, p99_factor, dump_bpf, **kw):
    """Watch running processes (--pid) or a COMMAND given after --, with the probes of
    'record', and serve what they see at /metrics in Prometheus text format: CUDA calls by
    result and their durations, off-CPU time inside CUDA calls, wakeup latency, connect(),
    TCP resets and retransmits, allocation and fragmentation failures, module loads, Xids,
    GPU counters (dcgm-exporter names) and the GPU clock's uncertainty.

    Events are aggregated as they arrive (fixed histogram buckets, capped label values), so
    memory stays flat for days; with -o every event is also kept in a run file.  Runs until
    Ctrl-C/SIGTERM, --duration or the targets' exit; with --follow NAME the targets'
    exit does not end it: /proc is scanned every 0.25 s and each new matching process
    (a restarted service) is attached (clockalign_targets, clockalign_target_exits_total)."""
    if print_rules:
        click.echo(render(p99_factor), nl=False)
        return
    if dump_bpf:
        click.echo(dump_bpf_text(kw["no_cuda"], kw["libcuda"], kw["cuda_args"], kw["ring_mb"],
                                 kw["cuda_returns"]))
        return
    from ..watch.session import run_watch
    s = run_watch(record_options(output, follow=list(follow) or None, **kw), listen)
    drops = sum(s["drops"].values())
    wrote = f"; wrote {s['output']} ({s['size'] / 1e6:.2f} MB)" if s["output"] else ""
    f = s.get("follow")
    followed = f", {f['attached']} processes attached, {f['exited']} exited" if f else ""
    click.echo(f"watched: {s['cuda_calls']} CUDA calls{followed}, {s['scrapes']} scrapes of "
               f"{s['url']}, {drops} dropped{wrote}; stopped by {s['reason']}", err=True)
