"""Loading a library into a running process through ptrace (capture/targets/inject_so.py), as root,
with no GPU: a test library whose constructor leaves a file, put into a C loop and a Python
loop that keep counting; what the process shows afterwards (every count, the same checksum,
its own exit code), the thread's registers and stack bytes exactly as before, and the
refusals: a static binary, a process already traced, ptrace not permitted."""
import os
import platform
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from clockalign.capture.targets.inject_so import InjectError, Tracee, ptrace_refusal

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="the ptrace call set-up is x86-64 only")

LOOP_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv)
{
    int n = atoi(argv[1]);
    unsigned long long x = 0;
    for (int i = 0; i < n; i++) {
        for (volatile int j = 0; j < 200000; j++)
            x += (unsigned long long)j * (unsigned)(i + 1);
        printf("%d %llu\n", i, x);
        fflush(stdout);
        usleep(10000);
    }
    return 7;
}
"""

PROBE_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static char dir[512];
static void mark(const char *what, const char *text)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s.%d", dir, what, getpid());
    FILE *f = fopen(p, "w");
    if (f) { fputs(text, f); fclose(f); }
}
__attribute__((constructor)) static void loaded(void)
{
    snprintf(dir, sizeof dir, "%s", MARK_DIR);
    mark("loaded", "constructor ran");
}
int probe_start(const char *settings) { mark("started", settings); return 42; }
int probe_stop(void) { mark("stopped", "stop ran"); return 5; }
"""

PY_LOOP = textwrap.dedent("""
    import sys, time
    x = 0
    for i in range(int(sys.argv[1])):
        x += sum(range(i * 1000))
        print(i, x, flush=True)
        time.sleep(0.01)
    sys.exit(3)
""")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("inject")
    (d / "loop.c").write_text(LOOP_C)
    (d / "probe.c").write_text(PROBE_C)
    subprocess.run(["gcc", "-O1", str(d / "loop.c"), "-o", str(d / "loop")], check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DMARK_DIR="{d}"', str(d / "probe.c"),
                    "-o", str(d / "probe.so")], check=True)
    static = subprocess.run(["gcc", "-O1", "-static", str(d / "loop.c"), "-o",
                             str(d / "loop_static")], capture_output=True)
    return d, static.returncode == 0


def _expected(n):
    x, out = 0, []
    for i in range(n):
        x += sum(j * (i + 1) for j in range(200000))
        out.append(f"{i} {x}")
    return out


def _start(cmd, lines=3):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    got = [p.stdout.readline().strip() for _ in range(lines)]
    return p, got


def _inject_and_check(d, pid):
    probe = str(d / "probe.so")
    with Tracee(pid) as t:
        below = t.read(t.saved.rsp - 4096, 4096)
        regs = bytes(t.saved)
        t.dlopen(probe)
        assert t.call(t.symbol(probe, "probe_start"), b"fifo=/x\nlib=/y\n\0") == 42
        assert t.call(t.symbol(probe, "probe_stop")) == 5
        # restored exactly: every register, and the stack bytes our calls used
        t.restore()
        assert bytes(t._getregs()) == regs
        assert t.read(t.saved.rsp - 4096, 4096) == below
    assert (d / f"loaded.{pid}").read_text() == "constructor ran"
    assert (d / f"started.{pid}").read_text() == "fifo=/x\nlib=/y\n"
    assert (d / f"stopped.{pid}").read_text() == "stop ran"
    maps = open(f"/proc/{pid}/maps").read()
    assert probe in maps                      # loaded, in the target's own address space


def _py_expected(n):
    x, out = 0, []
    for i in range(n):
        x += sum(range(i * 1000))
        out.append(f"{i} {x}")
    return out


@pytest.mark.parametrize("lang", ["c", "python"])
def test_library_loaded_into_a_running_loop_which_counts_on_intact(built, lang):
    d, _ = built
    n, cmd, rc, expected = ((120, [str(d / "loop")], 7, _expected) if lang == "c" else
                            (150, [sys.executable, "-c", PY_LOOP], 3, _py_expected))
    p, first = _start(cmd + [str(n)])
    try:
        _inject_and_check(d, p.pid)
        rest = [line.strip() for line in p.stdout]
        assert p.wait(timeout=60) == rc
    finally:
        p.kill()
    assert first + rest == expected(n)        # no count lost, repeated or corrupted


@pytest.mark.parametrize("binary,library,why", [
    ("loop", "missing.so", "cannot open shared object file"),      # dlerror's own text
    ("loop_static", "probe.so", "statically linked"),
])
def test_a_failing_dlopen_is_one_sentence_and_the_process_runs_on(built, binary, library, why):
    d, static_ok = built
    if binary == "loop_static" and not static_ok:
        pytest.skip("gcc -static failed here (no static libc installed)")
    p, _ = _start([str(d / binary), "300"])
    try:
        with Tracee(p.pid) as t:
            with pytest.raises(InjectError, match=why):
                t.dlopen(str(d / library))
        assert p.poll() is None
    finally:
        p.kill()


def test_process_already_traced_is_refused_naming_the_tracer(built):
    d, _ = built
    p, _ = _start([str(d / "loop"), "300"])
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from clockalign.capture.targets.inject_so import _ptrace, PTRACE_SEIZE
        _ptrace(PTRACE_SEIZE, {p.pid})
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(InjectError, match=f"already traced by process {holder.pid}"):
            Tracee(p.pid).__enter__()
    finally:
        holder.kill()
        holder.wait()
        p.kill()


def test_ptrace_not_permitted_says_so(built):
    if not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) not found")
    d, _ = built
    p, _ = _start([str(d / "loop"), "300"])
    try:
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            "--inh-caps=-all", "--bounding-set=-all", sys.executable, "-c",
                            textwrap.dedent(f"""
            from clockalign.capture.targets.inject_so import InjectError, Tracee
            try:
                Tracee({p.pid}).__enter__()
            except InjectError as e:
                print(e)
        """)], capture_output=True, text=True, timeout=60,
            env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
        assert f"ptrace of process {p.pid} is not permitted" in r.stdout, r.stderr
        assert p.poll() is None
    finally:
        p.kill()


def test_yama_scope_3_is_named_before_trying():
    if not os.path.exists("/proc/sys/kernel/yama/ptrace_scope"):
        pytest.skip("no Yama LSM on this kernel (no /proc/sys/kernel/yama/ptrace_scope); "
                    "scope 3 cannot be undone without a reboot, so it is never set here")
    scope = int(open("/proc/sys/kernel/yama/ptrace_scope").read())
    if scope != 3:
        pytest.skip(f"ptrace_scope is {scope}; scope 3 cannot be undone without a reboot, so "
                    "it is never set here")
    assert "ptrace_scope = 3" in ptrace_refusal(os.getpid())


def test_target_signal_during_the_call_is_delivered_not_lost(built):
    """A signal the thread gets while our call runs reaches it (a SIGUSR1 handler counts)."""
    d, _ = built
    src = d / "sig.c"
    src.write_text(textwrap.dedent(r"""
        #include <signal.h>
        #include <stdio.h>
        #include <unistd.h>
        static volatile int got;
        static void on(int s) { (void)s; got++; }
        int main(void) {
            signal(SIGUSR1, on);
            printf("ready\n"); fflush(stdout);
            for (int i = 0; i < 300 && !got; i++) usleep(10000);
            printf("got %d\n", got); fflush(stdout);
            return 0;
        }
    """))
    subprocess.run(["gcc", str(src), "-o", str(d / "sig")], check=True)
    p, _ = _start([str(d / "sig")], lines=1)
    slow = d / "slow.c"
    slow.write_text("#include <unistd.h>\nint slow(void){ usleep(300000); return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(slow), "-o", str(d / "slow.so")], check=True)
    try:
        with Tracee(p.pid) as t:
            t.dlopen(str(d / "slow.so"))
            os.kill(p.pid, signal.SIGUSR1)
            assert t.call(t.symbol(str(d / "slow.so"), "slow")) == 1
        assert p.stdout.readline().strip() == "got 1"
        assert p.wait(timeout=10) == 0
    finally:
        p.kill()


def test_calls_into_a_thread_busy_in_malloc_do_not_deadlock(built):
    """The thread is stopped outside libc's code (or waiting in a call that holds no lock of
    its), so our dlopen's own mallocs never wait on an arena lock the thread holds."""
    d, _ = built
    src = d / "mallocs.c"
    src.write_text(textwrap.dedent(r"""
        #include <stdio.h>
        #include <stdlib.h>
        #include <string.h>
        int main(void) {
            unsigned long long n = 0;
            printf("ready\n"); fflush(stdout);
            for (int r = 0; r < 1000; r++) {
                for (int i = 0; i < 20000; i++) {
                    char *volatile p = malloc(16 + (i % 4000));   /* not elided */
                    memset(p, i, 16);
                    n += (unsigned char)p[3];
                    free(p);
                }
            }
            printf("sum %llu\n", n); fflush(stdout);
            return 0;
        }
    """))
    subprocess.run(["gcc", "-O0", str(src), "-o", str(d / "mallocs")], check=True)
    p, _ = _start([str(d / "mallocs")], lines=1)
    probe = str(d / "probe.so")
    try:
        for i in range(25):
            with Tracee(p.pid, timeout_s=15) as t:
                if i == 0:
                    t.dlopen(probe)
                assert t.call(t.symbol(probe, "probe_start"), b"x" * (i + 1) + b"\0") == 42
        assert (d / f"started.{p.pid}").read_text() == "x" * 25
        want = sum((i & 0xFF) for i in range(20000)) * 1000
        assert p.stdout.readline().strip() == f"sum {want}"
        assert p.wait(timeout=120) == 0
    finally:
        p.kill()


def test_dlopen_refused_by_a_seccomp_filter_names_it(built):
    """A process whose seccomp filter makes openat fail: dlopen's error and the filter said."""
    d, _ = built
    src = d / "filtered.c"
    src.write_text(textwrap.dedent(r"""
        #include <errno.h>
        #include <stddef.h>
        #include <stdio.h>
        #include <unistd.h>
        #include <linux/filter.h>
        #include <linux/seccomp.h>
        #include <sys/prctl.h>
        #include <sys/syscall.h>
        int main(void) {
            struct sock_filter f[] = {
                BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat, 0, 1),
                BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
                BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
            };
            struct sock_fprog prog = {sizeof(f) / sizeof(*f), f};
            prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) return 2;
            printf("ready\n"); fflush(stdout);
            for (int i = 0; i < 3000; i++) usleep(10000);
            return 0;
        }
    """))
    subprocess.run(["gcc", str(src), "-o", str(d / "filtered")], check=True)
    p, first = _start([str(d / "filtered")], lines=1)
    try:
        assert first == ["ready"]
        with Tracee(p.pid) as t:
            with pytest.raises(InjectError, match="Operation not permitted.*seccomp filter"):
                t.dlopen(str(d / "probe.so"))
        assert p.poll() is None
    finally:
        p.kill()
