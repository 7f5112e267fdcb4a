"""watch's /metrics server under scrape bursts (issue 24): the wall time of N concurrent
scrapes, repeated, with idle clients connected, and the process's RSS, threads and
descriptors before and after; optionally the same burst against prometheus_client's own
server (what watch used before) for comparison.

    python scripts/bench/watch_burst.py --out results/watch-burst [--baseline]

Writes OUT/burst.json (every burst's wall time and the server's RSS after it) and
OUT/burst.md.  No root: the server and a real Aggregator run in a child process (its RSS,
threads and descriptors are read from /proc), the clients in threads of this one.
"""
import argparse
import datetime
import json
import multiprocessing
import os
import platform
import socket
import sys
import threading
import time

from clockalign.store.schema import Chunk
from clockalign.watch.aggregate import Aggregator
from clockalign.watch.metrics import build_registry, serve

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)                    # tests.unit.test_watch_aggregate: the batches
from tests.unit.test_watch_aggregate import ONE_GPU, cuda, events  # noqa: E402


def usage(pid):
    """The server process's RSS (kB), threads and open descriptors."""
    with open(f"/proc/{pid}/status") as f:
        st = dict(ln.split(":", 1) for ln in f)
    return {"rss_kb": int(st["VmRSS"].split()[0]), "threads": int(st["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def serve_in_child(conn, baseline):
    """The server process: serve, send the port, wait for the word to stop, send counts."""
    reg, _ = build_registry(aggregator())
    if baseline:
        from prometheus_client import start_http_server
        server, _ = start_http_server(0, addr="127.0.0.1", registry=reg)
    else:
        server = serve(reg, "127.0.0.1", 0)
    conn.send(server.server_address[1])
    conn.recv()
    counts = {} if baseline else {"renders": server.renders, "served": server.scrapes}
    server.shutdown()
    server.server_close()
    conn.send(counts)


def start_server(baseline=False):
    mine, theirs = multiprocessing.Pipe()
    p = multiprocessing.get_context("fork").Process(target=serve_in_child,
                                                    args=(theirs, baseline), daemon=True)
    p.start()
    return p, mine, mine.recv()


def stop_server(p, conn):
    conn.send("stop")
    counts = conn.recv()
    p.join()
    return counts


def scrape(port, timeout):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        n = 0
        while True:
            b = s.recv(1 << 16)
            if not b:
                return n
            n += len(b)


def burst(port, n, timeout):
    go = threading.Barrier(n + 1)
    done, failed = [], []

    def one():
        go.wait()
        t0 = time.monotonic()
        try:
            scrape(port, timeout)
            done.append(time.monotonic() - t0)
        except OSError as e:
            failed.append(type(e).__name__)
    ts = [threading.Thread(target=one) for _ in range(n)]
    for t in ts:
        t.start()
    go.wait()
    t0 = time.monotonic()
    for t in ts:
        t.join()
    done.sort()
    return {"wall_s": round(time.monotonic() - t0, 3), "ok": len(done), "failed": failed,
            "p50_s": round(done[len(done) // 2], 3) if done else None,
            "max_s": round(done[-1], 3) if done else None}


def aggregator():
    a = Aggregator()
    a.open(ONE_GPU)
    a.write_columns(Chunk.EVENTS, events(*[cuda("cuLaunchKernel", pid=100 + i % 7)
                                           for i in range(100)]))
    return a


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--bursts", type=int, default=20)
    ap.add_argument("--idle", type=int, default=300, help="idle clients kept connected")
    ap.add_argument("--baseline", action="store_true",
                    help="one burst against prometheus_client's start_http_server too")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    proc, conn, port = start_server()
    res = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
           "machine": f"{platform.node()} ({platform.machine()}, kernel {platform.release()}, "
                      f"{os.cpu_count()} CPUs), load average {os.getloadavg()[0]:.2f}",
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "scrapes": a.scrapes, "idle_clients": a.idle}
    burst(port, 20, 30)                                       # warm-up
    start = usage(proc.pid)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(a.idle)]
    runs = []
    for _ in range(a.bursts):
        r = burst(port, a.scrapes, 60)
        r.update(usage(proc.pid))
        runs.append(r)
    for c in idle:
        c.close()
    time.sleep(0.5)
    end = usage(proc.pid)
    res.update(start=start, end=end, bursts=runs, **stop_server(proc, conn))
    if a.baseline:
        proc, conn, port = start_server(baseline=True)
        res["baseline"] = burst(port, a.scrapes, 60)
        res["baseline"].update(usage(proc.pid))
        stop_server(proc, conn)
    with open(os.path.join(a.out, "burst.json"), "w") as f:
        json.dump(res, f, indent=1)
    walls = sorted(r["wall_s"] for r in runs)
    rss = [r["rss_kb"] for r in runs]
    lines = [
        "# watch /metrics under scrape bursts", "",
        f"Command: `{res['command']}` on {res['machine']}, {res['date']}.", "",
        f"{a.bursts} bursts of {a.scrapes} concurrent scrapes (one connection each) of a real "
        f"Aggregator, with {a.idle} idle clients connected throughout; the server "
        "(watch/server.py) in its own process, its RSS/threads/descriptors from /proc "
        "(raw numbers in burst.json).", "",
        "| | |", "|---|---|",
        f"| burst wall time, median (min–max) | {walls[len(walls) // 2]} s "
        f"({walls[0]}–{walls[-1]} s) |",
        f"| scrapes answered / failed | {sum(r['ok'] for r in runs)} / "
        f"{sum(len(r['failed']) for r in runs)} |",
        f"| renderings for {res['served']} scrapes | {res['renders']} |",
        f"| server RSS after warm-up / after burst 1 / after the last / at the end | "
        f"{start['rss_kb']} / {rss[0]} / {rss[-1]} / {end['rss_kb']} kB |",
        f"| server threads before / during bursts (max) / after | {start['threads']} / "
        f"{max(r['threads'] for r in runs)} / {end['threads']} |",
        f"| server descriptors before / during bursts (max) / after | {start['fds']} / "
        f"{max(r['fds'] for r in runs)} / {end['fds']} |",
    ]
    if a.baseline:
        b = res["baseline"]
        lines += ["", f"prometheus_client's start_http_server (watch's server before issue 24), "
                  f"one burst of {a.scrapes}: {b['wall_s']} s wall, {b['ok']} answered, "
                  f"{len(b['failed'])} failed ({', '.join(sorted(set(b['failed']))) or '-'}), "
                  f"slowest answered {b['max_s']} s; server threads after it {b['threads']}."]
    with open(os.path.join(a.out, "burst.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
