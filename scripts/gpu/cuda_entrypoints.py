#!/usr/bin/env python3
"""Which libcuda entry points does a workload really reach?  One counting uprobe per exported
cu* function of the real libcuda (BCC), filtered by the workload's tgid.

    sudo python3 scripts/gpu/cuda_entrypoints.py --out OUT/entrypoints.json \
        -- scripts/workloads/coverage_window.py --no-profiler --out OUT/ep-workload.json
    sudo python3 scripts/gpu/cuda_entrypoints.py --pid 1234 --duration 10
    sudo python3 scripts/gpu/cuda_entrypoints.py --lib ./libcuda.so.1 -- ./target   # stand-in

* Symbols: the ELF dynamic symbol table of the library (own parser below; no pyelftools),
  defined STT_FUNC/IFUNC, global or weak, name starting with "cu".  Names sharing one address
  are probed once and reported together ("a=b").
* One BPF program, attached to every symbol; it counts per (tgid, phase, PT_REGS_IP).  On x86
  the IP a uprobe program sees is the probed address itself (checked on the stand-in; the
  resolver also accepts address+1, the int3 length, and says which it saw).  IP -> symbol with
  the workload's /proc/PID/maps (polled while it runs: it may exit before we read) and the ELF
  load segments.
* Phase: the number of connect()s the workload made to 127.0.0.1:MARKER_PORT so far (the
  coverage workload marks its window that way; the port goes to it in CLOCKALIGN_MARKER_PORT).
  Phase 1 = inside the marked window.
* cuGetProcAddress(_v2) is also traced (entry: requested name and version; return: the pointer
  written to *pfn): a pointer that is no exported symbol's address is an entry point that
  uprobes on exported symbols cannot see.
* A spawned command is held (before exec) until every probe is attached.
"""
import argparse
import ctypes
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time

# ------------------------------------------------------------------ pure helpers (no bcc)

SHT_DYNSYM = 11
PT_LOAD = 1
STT_FUNC, STT_GNU_IFUNC = 2, 10
STB_GLOBAL, STB_WEAK = 1, 2


def _read(f, off, n):
    f.seek(off)
    b = f.read(n)
    if len(b) != n:
        raise ValueError(f"short read at {off}")
    return b


def elf_load_segments(path):
    """[(p_offset, p_vaddr, p_filesz)] of the PT_LOAD segments of a 64-bit little-endian ELF."""
    with open(path, "rb") as f:
        hdr = _read(f, 0, 64)
        if hdr[:4] != b"\x7fELF" or hdr[4] != 2 or hdr[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF")
        phoff, = struct.unpack_from("<Q", hdr, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", hdr, 0x36)
        out = []
        for i in range(phnum):
            p = _read(f, phoff + i * phentsize, 56)
            p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack("<IIQQQQQQ", p)
            if p_type == PT_LOAD:
                out.append((p_offset, p_vaddr, p_filesz))
        return out


def elf_dynamic_functions(path, prefix="cu"):
    """[(name, vaddr, size)] of defined global/weak function symbols in .dynsym whose name
    starts with prefix, sorted by name."""
    with open(path, "rb") as f:
        hdr = _read(f, 0, 64)
        if hdr[:4] != b"\x7fELF" or hdr[4] != 2 or hdr[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF")
        shoff, = struct.unpack_from("<Q", hdr, 0x28)
        shentsize, shnum, _ = struct.unpack_from("<HHH", hdr, 0x3A)
        if not shoff or not shnum:
            raise ValueError(f"{path}: no section headers")
        secs = []
        for i in range(shnum):
            s = _read(f, shoff + i * shentsize, 64)
            _, sh_type, _, _, sh_offset, sh_size, sh_link, _, _, sh_entsize = \
                struct.unpack("<IIQQQQIIQQ", s)
            secs.append((sh_type, sh_offset, sh_size, sh_link, sh_entsize))
        out = []
        pre = prefix.encode()
        for sh_type, off, size, link, entsize in secs:
            if sh_type != SHT_DYNSYM:
                continue
            strtab = _read(f, secs[link][1], secs[link][2])
            syms = _read(f, off, size)
            entsize = entsize or 24
            for j in range(size // entsize):
                st_name, st_info, _, st_shndx, st_value, st_size = \
                    struct.unpack_from("<IBBHQQ", syms, j * entsize)
                if st_shndx == 0 or not st_value:
                    continue
                if (st_info & 0xF) not in (STT_FUNC, STT_GNU_IFUNC):
                    continue
                if (st_info >> 4) not in (STB_GLOBAL, STB_WEAK):
                    continue
                end = strtab.find(b"\0", st_name)
                name = strtab[st_name:end]
                if name.startswith(pre):
                    out.append((name.decode(), st_value, st_size))
        return sorted(set(out))


def nm_dynamic_functions(path, prefix="cu"):
    """The same list from `nm -D --defined-only` (fallback; sizes unknown -> 0)."""
    txt = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True,
                         check=True).stdout
    out = []
    for line in txt.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in ("T", "W", "i"):
            name = parts[2].split("@", 1)[0]
            if name.startswith(prefix):
                out.append((name, int(parts[0], 16), 0))
    return sorted(set(out))


def group_by_address(funcs):
    """{vaddr: [names]} (aliases share one probe)."""
    by = {}
    for name, vaddr, _ in funcs:
        by.setdefault(vaddr, []).append(name)
    for v in by.values():
        v.sort(key=lambda n: (len(n), n))
    return by


def parse_maps(text, lib_path=None, inode=None):
    """[(start, end, file_offset)] of the mappings of one file in /proc/PID/maps text, matched
    by inode (when given) or by real path."""
    real = os.path.realpath(lib_path) if lib_path else None
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        rng, _, off, _, ino, path = parts
        path = path.strip()
        if inode is not None:
            if int(ino) != inode:
                continue
        elif path != real and os.path.realpath(path) != real:
            continue
        a, b = rng.split("-")
        out.append((int(a, 16), int(b, 16), int(off, 16)))
    return out


def ip_to_vaddr(ip, mappings, segments):
    """The library's ELF virtual address of a process address, or None."""
    for start, end, off in mappings:
        if start <= ip < end:
            foff = ip - start + off
            for p_off, p_vaddr, p_filesz in segments:
                if p_off <= foff < p_off + p_filesz:
                    return foff - p_off + p_vaddr
            return None
    return None


def resolve_ip(ip, mappings, segments, by_vaddr):
    """(names, delta) for a probe hit: delta 0 when IP is the probed address, 1 when it is one
    past it (int3 length); (None, None) when unknown."""
    v = ip_to_vaddr(ip, mappings, segments)
    if v is None:
        return None, None
    for delta in (0, 1):
        if v - delta in by_vaddr:
            return by_vaddr[v - delta], delta
    return None, None


def infer_bias(ips, vaddrs, page=4096):
    """(load bias, hits explained, delta) when the target's maps were never read (it exited
    before the first poll): the page-aligned bias that maps the most hit IPs onto symbol
    addresses (with delta 0 or 1 for the IP semantics)."""
    vs = sorted(set(vaddrs))
    best = (None, 0, None)
    for delta in (0, 1):
        support = {}
        for ip in set(ips):
            for v in vs:
                b = ip - delta - v
                if b >= 0 and b % page == 0:
                    support[b] = support.get(b, 0) + 1
        if support:
            b, n = max(support.items(), key=lambda kv: kv[1])
            if n > best[1]:
                best = (b, n, delta)
    return best


def ldconfig_libcuda():
    for exe in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            txt = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        for line in txt.splitlines():
            if line.strip().startswith("libcuda.so.1 ") and "=>" in line \
                    and ("x86-64" in line or "64bit" in line):
                return os.path.realpath(line.split("=>", 1)[1].strip())
    return None


def table(rows, header):
    """Plain text table: rows of tuples (first column left, others right aligned)."""
    rows = [tuple(str(c) for c in r) for r in rows]
    w = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h))
         for i, h in enumerate(header)]
    fmt = lambda r: "  ".join(c.ljust(w[0]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r))
    return "\n".join([fmt(header), fmt(tuple("-" * x for x in w))] + [fmt(r) for r in rows])


def free_loopback_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ------------------------------------------------------------------ BPF side

BPF_TEXT = r"""
#include <uapi/linux/ptrace.h>
struct key_t { u32 tgid; u32 phase; u64 ip; };
BPF_HASH(targets, u32, u8, 65536);
BPF_HASH(counts, struct key_t, u64, 131072);
BPF_ARRAY(phase, u32, 1);
BPF_ARRAY(lost, u64, 2);

static inline int is_target(u32 tgid) { return targets.lookup(&tgid) != 0; }

int on_call(struct pt_regs *ctx) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!is_target(tgid)) return 0;
    int z = 0;
    u32 *ph = phase.lookup(&z);
    struct key_t k = {};
    k.tgid = tgid; k.phase = ph ? *ph : 0; k.ip = PT_REGS_IP(ctx);
    u64 *v = counts.lookup(&k);
    if (v) { __sync_fetch_and_add(v, 1); return 0; }
    u64 one = 1;
    if (counts.insert(&k, &one) != 0) {
        v = counts.lookup(&k);
        if (v) __sync_fetch_and_add(v, 1);
        else { u64 *l = lost.lookup(&z); if (l) __sync_fetch_and_add(l, 1); }
    }
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_connect) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (MARKER_PORT == 0 || !is_target(tgid)) return 0;
    struct { u16 family; u16 port; u32 addr; } sa = {};
    bpf_probe_read_user(&sa, sizeof(sa), (void *)args->uservaddr);
    if (sa.family != 2 || sa.port != MARKER_PORT_BE) return 0;
    int z = 0;
    u32 *ph = phase.lookup(&z);
    if (ph) __sync_fetch_and_add(ph, 1);
    return 0;
}

#ifdef FOLLOW
TRACEPOINT_PROBE(sched, sched_process_fork) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!is_target(tgid)) return 0;
    u32 child = args->child_pid;
    u8 one = 1;
    targets.update(&child, &one);
    return 0;
}
#endif

struct gpa_in { u64 pfn; u64 flags; u32 ver; u32 pad; char name[64]; };
struct gpa_key { u32 tgid; u32 ver; char name[64]; };
struct gpa_val { u64 count; u64 fn; s64 ret; u64 flags; };
BPF_HASH(gpa_inflight, u32, struct gpa_in, 4096);
BPF_HASH(gpa, struct gpa_key, struct gpa_val, 16384);

int gpa_enter(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    if (!is_target(id >> 32)) return 0;
    u32 tid = (u32)id;
    struct gpa_in in = {};
    bpf_probe_read_user_str(in.name, sizeof(in.name), (void *)PT_REGS_PARM1(ctx));
    in.pfn = PT_REGS_PARM2(ctx);
    in.ver = (u32)PT_REGS_PARM3(ctx);
    in.flags = PT_REGS_PARM4(ctx);
    gpa_inflight.update(&tid, &in);
    return 0;
}

int gpa_return(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct gpa_in *in = gpa_inflight.lookup(&tid);
    if (!in) return 0;
    struct gpa_key k = {};
    k.tgid = id >> 32; k.ver = in->ver;
    __builtin_memcpy(k.name, in->name, sizeof(k.name));
    u64 fn = 0;
    if (in->pfn) bpf_probe_read_user(&fn, sizeof(fn), (void *)in->pfn);
    s64 ret = (s64)(int)PT_REGS_RC(ctx);
    u64 flags = in->flags;
    gpa_inflight.delete(&tid);
    struct gpa_val *v = gpa.lookup(&k);
    if (v) { __sync_fetch_and_add(&v->count, 1); v->fn = fn; v->ret = ret; return 0; }
    struct gpa_val nv = {1, fn, ret, flags};
    gpa.update(&k, &nv);
    return 0;
}
"""


def import_bpf():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        from bcc import BPF
    return BPF


class MapsPoller(threading.Thread):
    """Keeps the latest libcuda mappings of each target tgid (the target may exit before the
    counts are read)."""

    def __init__(self, lib, tgids_fn, period=0.05):
        super().__init__(daemon=True)
        self.lib = lib
        self.inode = os.stat(lib).st_ino
        self.tgids_fn = tgids_fn
        self.period = period
        self.maps = {}
        self.stop = threading.Event()

    def poll_once(self):
        for tgid in self.tgids_fn():
            try:
                with open(f"/proc/{tgid}/maps") as f:
                    m = parse_maps(f.read(), inode=self.inode)
            except OSError:
                continue
            if m:
                self.maps[tgid] = m

    def run(self):
        while not self.stop.is_set():
            self.poll_once()
            self.stop.wait(self.period)


def spawn_held(cmd, env):
    """Start cmd held before exec (a python stub blocked on a pipe; the pid stays the same
    through the exec); returns (proc, release)."""
    r, w = os.pipe()
    stub = ("import os,sys; fd=int(sys.argv[1]); os.read(fd, 1); os.close(fd); "
            "os.execvp(sys.argv[2], sys.argv[2:])")
    proc = subprocess.Popen([sys.executable, "-c", stub, str(r)] + cmd, pass_fds=(r,), env=env)
    os.close(r)

    def release():
        os.write(w, b"g")
        os.close(w)
    return proc, release


def vaddr_to_offset(vaddr, segments):
    for off, va, size in segments:
        if va <= vaddr < va + size:
            return vaddr - va + off
    return None


def attach_multi(bpf, lib, by_vaddr, segments):
    """One uprobe_multi link for every address (Linux 6.6+): ~1000 perf-event uprobes take
    minutes to detach, a link one grace period.  Returns (attached, link fd)."""
    from clockalign.capture.probes.uprobe_multi import BPF_TRACE_UPROBE_MULTI, link_uprobe_multi
    pairs = [(vaddr_to_offset(v, segments), v) for v in sorted(by_vaddr)]
    pairs = [(o, v) for o, v in pairs if o is not None]
    fn = bpf.load_func("on_call", type(bpf).KPROBE, attach_type=BPF_TRACE_UPROBE_MULTI)
    fd = link_uprobe_multi(fn.fd, os.path.realpath(lib), [o for o, _ in pairs],
                           [v for _, v in pairs], retprobe=False)
    return {v: by_vaddr[v] for _, v in pairs}, fd


def attach_all(bpf, lib, by_vaddr, log, segments=None):
    attached, failed = {}, {}
    t0 = time.monotonic()
    if segments:
        try:
            attached, fd = attach_multi(bpf, lib, by_vaddr, segments)
            bpf.ca_links = [fd]
            return attached, failed, time.monotonic() - t0
        except OSError as e:
            log(f"  uprobe_multi unavailable ({e}); one perf-event uprobe per symbol")
    for i, (vaddr, names) in enumerate(sorted(by_vaddr.items())):
        try:
            bpf.attach_uprobe(name=lib, sym=names[0], fn_name="on_call")
            attached[vaddr] = names
        except Exception as e:           # bcc raises bare Exception
            failed["=".join(names)] = str(e)[:200]
        if i and i % 200 == 0:
            log(f"  attached {len(attached)}/{i + 1} ({time.monotonic() - t0:.1f} s)")
    return attached, failed, time.monotonic() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", help="libcuda to probe (default: ldconfig's libcuda.so.1, or the "
                    "one --pid maps)")
    ap.add_argument("--pid", type=int, help="attach to a running process instead of spawning")
    ap.add_argument("--duration", type=float, help="--pid: stop after this many seconds")
    ap.add_argument("--out", help="JSON output path")
    ap.add_argument("--follow-children", action="store_true")
    ap.add_argument("--python", default=sys.executable, help="interpreter for a .py workload")
    ap.add_argument("--prefix", default="cu")
    ap.add_argument("--no-getprocaddress", action="store_true")
    ap.add_argument("--top", type=int, default=0, help="print only the N most called")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- workload.py args... | -- command")
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd and not a.pid:
        ap.error("give --pid or a command after --")
    log = lambda s: print(s, file=sys.stderr, flush=True)
    if cmd and cmd[0].endswith(".py"):
        cmd = [a.python] + cmd

    lib = a.lib
    if not lib and a.pid:
        with open(f"/proc/{a.pid}/maps") as f:
            for line in f:
                p = line.split(None, 5)
                if len(p) == 6 and os.path.basename(p[5].strip()).startswith("libcuda.so"):
                    lib = p[5].strip()
                    break
    lib = lib or ldconfig_libcuda()
    if not lib or not os.path.exists(lib):
        sys.exit("no libcuda found (give --lib)")
    lib = os.path.realpath(lib)
    try:
        funcs, how = elf_dynamic_functions(lib, a.prefix), "own ELF parser"
    except (ValueError, OSError) as e:
        log(f"ELF parser failed ({e}); trying nm -D")
        funcs, how = nm_dynamic_functions(lib, a.prefix), "nm -D"
    segments = elf_load_segments(lib)
    by_vaddr = group_by_address(funcs)
    log(f"{lib}: {len(funcs)} exported {a.prefix}* functions at {len(by_vaddr)} addresses "
        f"({how})")

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.environ["BCC_PROBE_LIMIT"] = str(max(4096, 2 * len(by_vaddr) + 100))
    port = free_loopback_port()
    env = dict(os.environ, CLOCKALIGN_MARKER_PORT=str(port))

    proc = release = None
    if cmd:
        proc, release = spawn_held(cmd, env)
        tgid = proc.pid
    else:
        tgid = a.pid
    BPF = import_bpf()
    flags = [f"-DMARKER_PORT={port}", f"-DMARKER_PORT_BE={socket.htons(port)}"]
    if a.follow_children:
        flags.append("-DFOLLOW")
    t_compile = time.monotonic()
    bpf = BPF(text=BPF_TEXT, cflags=flags)
    bpf["targets"][ctypes.c_uint32(tgid)] = ctypes.c_uint8(1)
    compile_s = time.monotonic() - t_compile
    attached, failed, attach_s = attach_all(bpf, lib, by_vaddr, log, segments)
    gpa_attached = []
    if not a.no_getprocaddress:
        for sym in ("cuGetProcAddress", "cuGetProcAddress_v2"):
            if any(sym in n for n in by_vaddr.values()):
                try:
                    bpf.attach_uprobe(name=lib, sym=sym, fn_name="gpa_enter")
                    bpf.attach_uretprobe(name=lib, sym=sym, fn_name="gpa_return")
                    gpa_attached.append(sym)
                except Exception as e:
                    failed[f"{sym} (getprocaddress probe)"] = str(e)[:200]
    log(f"attached {len(attached)} probes in {attach_s:.1f} s (BPF compile {compile_s:.1f} s); "
        f"{len(failed)} failed; marker port {port}")

    targets_fn = lambda: sorted(int(k.value) for k in bpf["targets"].keys())
    poller = MapsPoller(lib, targets_fn)
    poller.start()
    t_run = time.monotonic()
    rc = None
    try:
        if proc:
            release()
            rc = proc.wait()
        else:
            deadline = time.monotonic() + a.duration if a.duration else None
            while os.path.exists(f"/proc/{tgid}") and (not deadline or time.monotonic() < deadline):
                time.sleep(0.2)
    except KeyboardInterrupt:
        log("interrupted")
    run_s = time.monotonic() - t_run
    poller.poll_once()
    poller.stop.set()

    result = collect(bpf, lib, segments, by_vaddr, poller.maps, tgid)
    result.update(lib=lib, symbol_source=how, n_symbols=len(funcs), n_addresses=len(by_vaddr),
                  n_attached=len(attached), attach_failed=failed, attach_s=round(attach_s, 2),
                  compile_s=round(compile_s, 2), run_s=round(run_s, 2), command=cmd or None,
                  pid=tgid, exit_code=rc, marker_port=port, getprocaddress_probed=gpa_attached,
                  never_called=sorted("=".join(n) for v, n in attached.items()
                                      if "=".join(n) not in result["calls"]))
    for fd in getattr(bpf, "ca_links", []):
        os.close(fd)
    bpf.cleanup()
    print_report(result, a.top)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
        log(f"wrote {a.out}")
    return 0 if rc in (None, 0) else 1


def collect(bpf, lib, segments, by_vaddr, maps, main_tgid):
    """Read the BPF maps into {calls, calls_by_phase, per_tgid, ip_semantics, ...}."""
    raw = [(int(k.tgid), int(k.phase), int(k.ip), int(v.value)) for k, v in bpf["counts"].items()]
    gpa_raw = [(k.name.decode(errors="replace"), int(k.ver), int(k.tgid), int(v.count),
                int(v.fn), int(v.ret), int(v.flags)) for k, v in bpf["gpa"].items()]
    lost = int(bpf["lost"][ctypes.c_int(0)].value)
    return summarize(raw, gpa_raw, segments, by_vaddr, maps, main_tgid, lost)


def summarize(raw, gpa_raw, segments, by_vaddr, maps, main_tgid, lost=0):
    """raw: [(tgid, phase, ip, count)]; gpa_raw: [(name, version, tgid, count, fn, ret, flags)];
    maps: {tgid: [(start, end, offset)]} as polled.  Pure: tested on synthetic input."""
    calls, by_phase, per_tgid, unresolved = {}, {}, {}, {}
    semantics = {"ip_is_probe_address": 0, "ip_is_probe_address_plus_1": 0}
    bias_note = None
    resolvers = {}

    def resolver(tgid):
        if tgid in resolvers:
            return resolvers[tgid]
        m = maps.get(tgid) or maps.get(main_tgid)
        if m:
            f = lambda ip: ip_to_vaddr(ip, m, segments)
        else:                                       # never saw its maps: infer the load bias
            b, n, d = infer_bias([r[2] for r in raw if r[0] == tgid], by_vaddr.keys())
            nonlocal bias_note
            bias_note = {"tgid": tgid, "bias": hex(b) if b is not None else None,
                         "ips_explained": n, "delta": d}
            f = (lambda ip: ip - b) if b is not None else (lambda ip: None)
        resolvers[tgid] = f
        return f

    def lookup(tgid, ip, exact=False):
        v = resolver(tgid)(ip)
        if v is None:
            return None, None
        for delta in ((0,) if exact else (0, 1)):
            if v - delta in by_vaddr:
                return by_vaddr[v - delta], delta
        return None, None

    for tgid, ph, ip, n in raw:
        names, delta = lookup(tgid, ip)
        if names is None:
            unresolved[hex(ip)] = unresolved.get(hex(ip), 0) + n
            continue
        semantics["ip_is_probe_address" if delta == 0 else "ip_is_probe_address_plus_1"] += n
        name = "=".join(names)
        calls[name] = calls.get(name, 0) + n
        ph_d = by_phase.setdefault(str(ph), {})
        ph_d[name] = ph_d.get(name, 0) + n
        t_d = per_tgid.setdefault(str(tgid), {})
        t_d[name] = t_d.get(name, 0) + n
    gpa = []
    for name, ver, tgid, count, fn, ret, flags in gpa_raw:
        target = None
        if fn:
            names, _ = lookup(tgid, fn, exact=True)
            if names:
                target = "=".join(names)
            else:
                inside = resolver(tgid)(fn) is not None and maps.get(tgid, maps.get(main_tgid))
                target = (f"NOT EXPORTED ({'inside' if inside else 'outside'} libcuda's "
                          f"mappings, {fn:#x})")
        gpa.append({"name": name, "version": ver, "tgid": tgid, "count": count, "ret": ret,
                    "flags": flags, "resolves_to": target})
    gpa.sort(key=lambda g: (g["name"], g["version"]))
    return {"calls": dict(sorted(calls.items(), key=lambda kv: (-kv[1], kv[0]))),
            "calls_by_phase": by_phase, "per_tgid": per_tgid, "unresolved_ips": unresolved,
            "ip_semantics": semantics, "lost_map_full": lost,
            "maps_seen": sorted(maps), "bias_inferred": bias_note, "getprocaddress": gpa}


def print_report(r, top=0):
    rows = list(r["calls"].items())
    if top:
        rows = rows[:top]
    phases = sorted(r["calls_by_phase"], key=int)
    header = ("symbol", "calls") + tuple(f"phase{p}" for p in phases if len(phases) > 1)
    body = [(s, n) + tuple(r["calls_by_phase"][p].get(s, 0) for p in phases if len(phases) > 1)
            for s, n in rows]
    print(f"# {r['lib']}: {r['n_symbols']} symbols, {r['n_attached']} probed, "
          f"{len(r['attach_failed'])} failed to attach, {len(r['calls'])} called "
          f"(attach {r['attach_s']} s, run {r['run_s']} s)")
    if len(phases) > 1:
        print("# phase = connect()s to the marker port so far: 1 = inside the marked window")
    print(table(body, header))
    print(f"# total calls {sum(r['calls'].values())}; IP semantics {r['ip_semantics']}; "
          f"unresolved IPs {len(r['unresolved_ips'])}; lost (map full) {r['lost_map_full']}")
    if r.get("bias_inferred"):
        print(f"# maps never read (target exited first): load bias inferred {r['bias_inferred']}")
    if r["attach_failed"]:
        print("# failed to attach: " + ", ".join(sorted(r["attach_failed"])))
    if r["getprocaddress"]:
        hidden = [g for g in r["getprocaddress"] if g["resolves_to"]
                  and g["resolves_to"].startswith("NOT EXPORTED")]
        print(f"# cuGetProcAddress: {len(r['getprocaddress'])} (name, version) lookups, "
              f"{len(hidden)} returned a pointer that is no exported symbol:")
        for g in hidden:
            print(f"#   {g['name']} v{g['version']} -> {g['resolves_to']}")


if __name__ == "__main__":
    sys.exit(main())
