"""The processes being recorded: existing pids, or a command spawned held before exec.

Spawn mode forks a child that blocks on a pipe before ``execvp``; the recorder arms every
probe on the child's pid, then releases it, so not one instruction of the command runs
unobserved.  If the recorder dies first, the pipe closes and the child exits unrun.

    child = HeldChild(["python3", "serve.py"]); ...arm probes on child.pid...; child.release()
"""
import os
import shutil
import signal

from ...errors import ClockalignError


def check_pid(pid: int) -> None:
    if pid <= 0 or not os.path.exists(f"/proc/{pid}"):
        raise ClockalignError(f"process {pid} does not exist")
    if process_state(pid) == "Z":
        raise ClockalignError(f"process {pid} has already exited (it is a zombie)")


def process_state(pid: int):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    state = process_state(pid)
    return state is not None and state not in ("Z", "X")


def threads(pid: int):
    """[(tid, comm)] of a live process, from /proc."""
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                out.append((int(t), f.read().strip()))
        except OSError:
            pass
    return out


def cmdline(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


class HeldChild:
    """A forked child waiting on a pipe before it execs the command."""

    def __init__(self, argv, env=None):
        if not argv:
            raise ClockalignError("no command given after --")
        exe = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=(env or os.environ).get("PATH"))
        if not exe or not os.access(exe, os.X_OK):
            raise ClockalignError(f"command not found or not executable: {argv[0]}")
        self.argv = list(argv)
        self.env = dict(env if env is not None else os.environ)
        self.exit_status = None
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            try:
                os.close(w)
                go = os.read(r, 1)
                os.close(r)
                if go != b"1":
                    os._exit(127)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.execve(exe, self.argv, self.env)
            except BaseException:
                pass
            os._exit(127)
        os.close(r)
        self.pid = pid
        self._go = w

    def release(self):
        os.write(self._go, b"1")
        os.close(self._go)
        self._go = None

    def cancel(self):
        if self._go is not None:
            os.close(self._go)
            self._go = None
            os.waitpid(self.pid, 0)

    def poll(self):
        """None while running, else the wait status (also kept in exit_status)."""
        if self.exit_status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.exit_status
            if pid:
                self.exit_status = status
        return self.exit_status

    def describe_exit(self) -> dict:
        st = self.exit_status
        if st is None:
            return {"running": True}
        if os.WIFSIGNALED(st):
            return {"signal": os.WTERMSIG(st), "signal_name": signal.Signals(os.WTERMSIG(st)).name}
        return {"exit_code": os.WEXITSTATUS(st)}


def listening_ports(pid: int) -> list:
    """Local ports of the TCP sockets process pid listens on (its own network namespace's
    /proc/PID/net/tcp{,6}, matched to its descriptors by inode); [] where unreadable."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return []
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    if len(cols) > 9 and cols[3] == "0A" and cols[9] in inodes:   # LISTEN
                        ports.add(int(cols[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    return sorted(ports)
