"""Load a shared library into a running process and call functions in it, through ptrace.

One thread of the target (the main one) is seized and interrupted (PTRACE_SEIZE +
PTRACE_INTERRUPT: no SIGSTOP, so no job-control side effects); its registers are saved; a
call is set up on its stack, below the red zone, with 0 as the return address: when the
called function returns, the thread faults at address 0 and the tracer, seeing SIGSEGV with
rip == 0, takes rax and suppresses the signal.  Afterwards the registers and the stack bytes
below it (what the calls wrote, 256 KiB at most) are put back exactly and the thread is
detached; a system call it was interrupted in is restarted by the kernel as after any
signal (orig_rax is saved; during our calls it is -1, so no restart is attempted in the
middle).  The other threads keep running throughout.  ptrace requests come from the thread
that seized: use a Tracee from one thread.

dlopen is found from the ELF file mapped (read through /proc/PID/map_files, so a
container's own libc) plus the base the target mapped it at, in libc (glibc >= 2.34, musl),
libdl, or glibc's private __libc_dlopen_mode.  x86-64 only.

    with Tracee(pid) as t:
        h = t.dlopen("/tmp/x.so")                 # InjectError with dlerror()'s text
        rc = t.call(t.symbol("/tmp/x.so", "start"), b"settings\\0")
"""
import ctypes
import errno
import os
import platform
import signal
import struct
import time

from ...errors import ClockalignError

PTRACE_CONT, PTRACE_DETACH = 7, 17
PTRACE_GETREGS, PTRACE_SETREGS = 12, 13
PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4206, 0x4207
PTRACE_EVENT_STOP = 128
WALL = 0x40000000
RTLD_NOW, RTLD_GLOBAL = 2, 0x100
RED_ZONE = 128
SCRATCH_GAP = 512            # below the red zone, what our call's arguments start under
CALL_TIMEOUT_S = 60.0
SETTLE_TRIES = 50            # interrupts until the thread stops outside the loader / libc
LOCKED_SYSCALLS = {9, 10, 11, 12, 25, 28}   # mmap mprotect munmap brk mremap madvise
STACK_KEPT = 256 << 10       # bytes below the stack pointer saved, and put back at detach


class InjectError(ClockalignError):
    """The library could not be loaded into, or called in, the target (one sentence)."""


class _Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in (
        "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags "
        "rsp ss fs_base gs_base ds es fs gs").split()]


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
for _f in (_libc.process_vm_readv, _libc.process_vm_writev):
    _f.restype = ctypes.c_ssize_t
    _f.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                   ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]


def _ptrace(req, tid, addr=0, data=0):
    r = _libc.ptrace(req, tid, ctypes.c_void_p(addr), ctypes.c_void_p(data))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


# -- what the target maps ----------------------------------------------------------------
def maps(pid) -> list:
    """(start, end, perms, offset, path, inode) of each file-backed mapping of the target."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi, parts[1], int(parts[2], 16), parts[5].rstrip("\n"),
                        int(parts[4])))
    return out


def mapped(pid, predicate) -> list:
    """Paths (as the target sees them) of mapped files whose base name passes predicate."""
    return list(dict.fromkeys(m[4] for m in maps(pid)
                              if predicate(os.path.basename(m[4])) and "(deleted)" not in m[4]))


def in_target(pid, path) -> str:
    """A path from the target's maps as the target itself names it: maps show paths from
    the reader's root where it can reach them (a chroot's files under the chroot)."""
    try:
        root = os.readlink(f"/proc/{pid}/root")
    except OSError:
        return path
    if root != "/" and path.startswith(root + "/"):
        return path[len(root):]
    return path


def host_path(pid, path) -> str:
    """``path`` inside the target's mount namespace, as this process can open it."""
    return f"/proc/{pid}/root{path}"


def _dynsyms(data: bytes) -> dict:
    """Defined symbols of an ELF64 little-endian file's .dynsym: name -> value."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise InjectError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out = {}
    for s in secs:
        if s[1] != 11:            # SHT_DYNSYM
            continue
        strtab = secs[s[6]]
        for off in range(s[4], s[4] + s[5], 24):
            name, info, _, shndx, value, _ = struct.unpack_from("<IBBHQQ", data, off)
            if shndx == 0 or not value or (info & 0xF) not in (1, 2, 10):   # OBJECT FUNC IFUNC
                continue
            a = strtab[4] + name
            nm = data[a:data.index(b"\0", a)].decode()
            out.setdefault(nm, value)
    return out


def symbol_address(pid, path, names) -> tuple:
    """(name, address in the target) of the first of ``names`` that ``path`` (as the target
    sees it) defines, or None.  The mapping is found by its path or, where the target's
    maps show another one (a chroot), by the file's inode; the ELF is read through
    /proc/PID/map_files, so exactly the file mapped."""
    ms = [m for m in maps(pid) if m[4] == path]
    if not ms:
        ino = os.stat(host_path(pid, path)).st_ino
        ms = [m for m in maps(pid) if m[5] == ino]
    if not ms:
        raise InjectError(f"{path} is not mapped in process {pid}")
    first = min(ms)
    try:
        with open(f"/proc/{pid}/map_files/{first[0]:x}-{first[1]:x}", "rb") as f:
            data = f.read()
    except PermissionError:          # map_files wants CAP_SYS_ADMIN on older kernels
        with open(host_path(pid, in_target(pid, first[4])), "rb") as f:
            data = f.read()
    syms = _dynsyms(data)
    hit = next((n for n in names if n in syms), None)
    if hit is None:
        return None
    base = first[0] - first[3]
    etype, = struct.unpack_from("<H", data, 0x10)
    return hit, (base + syms[hit] if etype == 3 else syms[hit])


def _loader_libs(pid):
    def is_loader(name):
        return name.startswith(("libc.so", "libdl.so", "ld-musl", "libc.musl"))
    return mapped(pid, is_loader)


def find_dlopen(pid) -> dict:
    """Addresses of dlopen, dlerror (and the library they came from) in the target."""
    for lib in _loader_libs(pid):
        got = symbol_address(pid, lib, ["dlopen"])
        if got:
            err = symbol_address(pid, lib, ["dlerror"])
            return {"lib": lib, "dlopen": got[1], "dlerror": err[1] if err else None, "flag": 0}
    for lib in _loader_libs(pid):      # glibc < 2.34 with no libdl loaded: its private one
        got = symbol_address(pid, lib, ["__libc_dlopen_mode"])
        if got:
            return {"lib": lib, "dlopen": got[1], "dlerror": None, "flag": 0x80000000}
    static = not mapped(pid, lambda n: n.startswith("ld-"))
    raise InjectError(f"process {pid} has no dlopen to call"
                      + (" (it is statically linked: no dynamic loader is mapped)" if static
                         else " (no libc, libdl or musl mapped exports it)"))


def read_memory(pid, addr, n) -> bytes:
    """Up to n bytes of the target's memory at addr (no stop needed: process_vm_readv)."""
    buf = ctypes.create_string_buffer(n)
    local, remote = _IoVec(ctypes.addressof(buf), n), _IoVec(addr, n)
    got = _libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if got < 0:
        e = ctypes.get_errno()
        raise InjectError(f"cannot read process {pid}'s memory: {os.strerror(e)}")
    return buf.raw[:got]


def _region_start(pid, addr) -> int:
    """The start of the mapping holding addr (the thread's stack)."""
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
            if lo <= addr < hi:
                return lo
    raise InjectError(f"process {pid}'s stack pointer {addr:#x} is in no mapping")


# -- why ptrace would be refused -----------------------------------------------------------
def status_fields(pid) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def ptrace_refusal(pid):
    """The sentence saying why ptrace of ``pid`` will fail, known before trying, or None."""
    if platform.machine() != "x86_64":
        return ("attaching to a running process is implemented for x86-64 only, not "
                f"{platform.machine()}")
    try:
        st = status_fields(pid)
    except OSError:
        return f"process {pid} does not exist"
    if st.get("TracerPid", "0") != "0":
        return (f"process {pid} is already traced by process {st['TracerPid']} (a debugger or "
                "another tool): only one tracer is allowed")
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read())
    except (OSError, ValueError):
        scope = None
    if scope == 3:
        return "ptrace is disabled on this host (kernel.yama.ptrace_scope = 3, until reboot)"
    return None


def _attach_error(pid, e) -> InjectError:
    why = ptrace_refusal(pid)
    if why:
        return InjectError(why)
    if e.errno == errno.EPERM:
        try:
            with open("/proc/sys/kernel/yama/ptrace_scope") as f:
                yama = f" (kernel.yama.ptrace_scope = {int(f.read())})"
        except (OSError, ValueError):
            yama = ""
        return InjectError(f"ptrace of process {pid} is not permitted{yama}: it needs "
                           "CAP_SYS_PTRACE over the process (root in its user namespace)")
    if e.errno == errno.ESRCH:
        return InjectError(f"process {pid} does not exist")
    return InjectError(f"ptrace of process {pid} failed: {e.strerror}")


# -- the traced thread ---------------------------------------------------------------------
class Tracee:
    """One seized, stopped thread of ``pid``; restored exactly and detached on exit."""

    def __init__(self, pid, tid=None, timeout_s=CALL_TIMEOUT_S):
        self.pid, self.tid = pid, tid or pid
        self.timeout_s = timeout_s
        self.saved = None
        self._seized = False
        self._pending_sig = 0
        self._stack = None
        self.traps = 0            # SIGSEGVs at address 0 taken (a BPF signal probe sees each)

    def __enter__(self):
        why = ptrace_refusal(self.pid)
        if why:
            raise InjectError(why)
        try:
            _ptrace(PTRACE_SEIZE, self.tid)
        except OSError as e:
            raise _attach_error(self.pid, e) from None
        self._seized = True
        try:
            self._stop_settled()
            lo = max(self.saved.rsp - STACK_KEPT, _region_start(self.pid, self.saved.rsp - 1))
            self._stack = (lo, self.read(lo, self.saved.rsp - lo))
        except BaseException:
            self._detach()
            raise
        return self

    def __exit__(self, *exc):
        self._detach()

    def _interrupt(self):
        _ptrace(PTRACE_INTERRUPT, self.tid)
        while True:
            status = self._wait()
            sig = os.WSTOPSIG(status)
            if status >> 16 == PTRACE_EVENT_STOP:
                return
            _ptrace(PTRACE_CONT, self.tid, 0, sig)     # a signal of its own: delivered

    def _stop_settled(self):
        """Stop the thread where a call is safe: outside the dynamic loader and libc, or
        blocked in one of their system calls that does not hold a lock of theirs (malloc
        maps and unmaps memory with its arena locked).  A heuristic: a few
        interrupt-and-resume rounds until it holds."""
        unsafe = [(m[0], m[1]) for m in maps(self.pid) if "x" in m[2] and
                  os.path.basename(m[4]).startswith(("ld-", "libc.so", "libc.musl",
                                                     "libpthread.so"))]
        for i in range(SETTLE_TRIES):
            self._interrupt()
            self.saved = self._getregs()
            nr = self.saved.orig_rax
            inside = any(lo <= self.saved.rip < hi for lo, hi in unsafe)
            waiting = nr != 2 ** 64 - 1 and nr not in LOCKED_SYSCALLS
            if not inside or waiting or i == SETTLE_TRIES - 1:
                return
            _ptrace(PTRACE_CONT, self.tid, 0, 0)
            time.sleep(0.001)

    def _wait(self, timeout_s=None):
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                got, status = os.waitpid(self.tid, os.WNOHANG | WALL)
            except ChildProcessError:
                raise InjectError(f"process {self.pid} went away while being traced") from None
            if got:
                if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                    self._seized = False
                    raise InjectError(f"process {self.pid} exited while being traced")
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError
            time.sleep(0.0005)

    def restore(self):
        """The stack bytes and registers as they were when the thread was stopped."""
        if self._stack is not None:
            self.write(*self._stack)
        if self.saved is not None:
            self._setregs(self.saved)

    def _getregs(self) -> _Regs:
        r = _Regs()
        _ptrace(PTRACE_GETREGS, self.tid, 0, ctypes.addressof(r))
        return r

    def _setregs(self, r: _Regs):
        _ptrace(PTRACE_SETREGS, self.tid, 0, ctypes.addressof(r))

    def _detach(self):
        if not self._seized:
            return
        self._seized = False
        try:
            self.restore()
            _ptrace(PTRACE_DETACH, self.tid, 0, self._pending_sig)
        except OSError:
            pass        # it exited meanwhile

    # -- memory ----------------------------------------------------------------------
    def read(self, addr, n) -> bytes:
        return read_memory(self.pid, addr, n)

    def write(self, addr, data: bytes):
        buf = ctypes.create_string_buffer(data, len(data))
        local, remote = _IoVec(ctypes.addressof(buf), len(data)), _IoVec(addr, len(data))
        got = _libc.process_vm_writev(self.pid, ctypes.byref(local), 1, ctypes.byref(remote),
                                      1, 0)
        if got != len(data):
            e = ctypes.get_errno()
            raise InjectError(f"cannot write process {self.pid}'s memory: {os.strerror(e)}")

    def read_str(self, addr, limit=512) -> str:
        if not addr:
            return ""
        raw = b""
        while len(raw) < limit:       # page by page: a read stops at an unmapped page
            chunk = self.read(addr + len(raw), 4096 - (addr + len(raw)) % 4096)
            raw += chunk
            if not chunk or b"\0" in chunk:
                break
        return raw.split(b"\0", 1)[0][:limit].decode(errors="replace")

    # -- calls -----------------------------------------------------------------------
    def call(self, addr, *args) -> int:
        """Call ``addr`` with up to six integer / bytes arguments (bytes are copied below
        the stack and passed by address) on the stopped thread; returns rax."""
        if len(args) > 6:
            raise ValueError("at most six arguments")
        s = self.saved
        sp = s.rsp - RED_ZONE - SCRATCH_GAP
        vals = []
        blobs = []
        for a in args:
            if isinstance(a, (bytes, bytearray)):
                sp = (sp - len(a)) & ~15
                blobs.append((sp, bytes(a)))
                vals.append(sp)
            else:
                vals.append(int(a) & (2 ** 64 - 1))
        sp = (sp & ~15) - 8          # as after a call instruction: rsp + 8 is 16-aligned
        if sp < self._stack[0]:
            raise InjectError("the call's arguments do not fit in the saved stack bytes")
        self.write(sp, b"\0" * 8)
        for at, blob in blobs:
            self.write(at, blob)
        r = _Regs.from_buffer_copy(s)
        r.rip, r.rsp, r.rax, r.orig_rax = addr, sp, 0, 2 ** 64 - 1
        for name, v in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9"), vals):
            setattr(r, name, v)
        self._setregs(r)
        try:
            return self._run_until_return()
        finally:
            try:
                self._setregs(s)
            except OSError:
                pass      # the target is gone

    def _run_until_return(self) -> int:
        _ptrace(PTRACE_CONT, self.tid, 0, 0)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                status = self._wait(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                self._interrupt()
                raise InjectError(f"a call in process {self.pid} did not return within "
                                  f"{self.timeout_s:.0f} s (abandoned; the thread may be "
                                  "stuck on a lock)") from None
            sig = os.WSTOPSIG(status)
            if status >> 16 == PTRACE_EVENT_STOP:
                _ptrace(PTRACE_CONT, self.tid, 0, 0)
                continue
            if sig == signal.SIGSEGV:
                r = self._getregs()
                if r.rip == 0:
                    self.traps += 1
                    return r.rax
                raise InjectError(f"the call crashed in process {self.pid} (SIGSEGV at "
                                  f"{r.rip:#x}); its thread was put back as it was")
            _ptrace(PTRACE_CONT, self.tid, 0, sig)      # its own signal: delivered

    # -- the loader ------------------------------------------------------------------
    def dlopen(self, path: str) -> int:
        """dlopen(path, RTLD_NOW) in the target; the handle, or InjectError with dlerror."""
        d = find_dlopen(self.pid)
        h = self.call(d["dlopen"], path.encode() + b"\0", RTLD_NOW | d["flag"])
        if not h:
            why = self.read_str(self.call(d["dlerror"])) if d["dlerror"] else ""
            try:
                filtered = status_fields(self.pid).get("Seccomp", "0") != "0"
            except OSError:
                filtered = False
            raise InjectError(f"dlopen of {path} in process {self.pid} failed"
                              + (f": {why}" if why else "")
                              + (" (the process runs under a seccomp filter, which may forbid "
                                 "what dlopen does)" if filtered else ""))
        return h

    def symbol(self, path: str, name: str) -> int:
        got = symbol_address(self.pid, path, [name])
        if not got:
            raise InjectError(f"{path} has no {name}")
        return got[1]
