/* clockalign probes, compiled by BCC at record time.
 *
 * Parameters come in as -D cflags (see capture/probes/cflags.py; `clockalign record --dump-bpf`
 * prints them): CA_MAX_THREADS, CA_CALL_SLOTS, CA_CPU_IDS, CA_RING_SLOTS, and the
 * feature switches CA_PERF_BUFFERS, CA_CUDA,
 * CA_PID_LINKS, CA_REGS_ONLY, CA_CONNECT, CA_SCHED, CA_XID, CA_TCP, CA_FOLLOW_CHILDREN,
 * CA_FORK_COMM_DATALOC, CA_XID_DATALOC, CA_XID_MSG_MAX (and CA_XID_PRINTK for the tests).
 * Targets (tgids) live in the `targets` map, filled by user space, so one program serves
 * several --pid and spawn mode alike.
 *
 * Records go to this CPU's slot ring (capture/transport/slotring.py): an mmapable array of fixed
 * 128-byte slots that the program writes in place, with no helper call; a compare-and-swap
 * on the ring's head reserves a slot and the kind, stored last, commits it.  A record is
 * built on the BPF stack (EVENT() declares one, submit() copies it into a slot or counts a
 * drop); the CUDA return, the hot path, fills its slot directly.  With CA_PERF_BUFFERS
 * (capture/probes/program.py's fall-back where the rings do not load: no BPF CAS)
 * submit() sends to per-CPU perf buffers instead (capture/transport/perfbuf.py), the transport
 * before: on the H200 the CUDA probes took 259-403 ns of
 * BPF time a call with it, 188-192 with the rings (scripts/bench/probe_cost.py,
 * results/overhead.md, runs h200-12 and h200-13).
 * Every piece of the CUDA path was measured (scripts/bench/probe_cost.py): the pairing
 * state is a per-thread array slot, not a hash map, and the launch's stack arguments are
 * read in one copy, not three.
 *
 * Only tracepoint arguments and user memory are read: these hosts run kernels with no
 * matching headers, so kernel struct layouts from the headers cannot be trusted.
 */
#include <uapi/linux/ptrace.h>
#include "clockalign.h"

#ifndef CA_MAX_TARGETS
#define CA_MAX_TARGETS 1024
#endif
#ifndef CA_MAX_THREADS
#define CA_MAX_THREADS 65536
#endif
#ifndef CA_CPU_IDS
#define CA_CPU_IDS 64           /* possible CPU ids (the rings and drops are indexed by them) */
#endif
#ifndef CA_CALL_SLOTS
#define CA_CALL_SLOTS 65536     /* power of two: a thread's slot is tid & (CA_CALL_SLOTS - 1) */
#endif

#ifdef CA_PERF_BUFFERS
BPF_PERF_OUTPUT(events);
#else
#ifdef CA_TEST_NO_SLOT_RINGS
#error "slot rings refused (CLOCKALIGN_TEST_NO_SLOT_RINGS): perf-buffer fall-back tests"
#endif
#ifndef CA_RING_SLOTS
#define CA_RING_SLOTS 65536     /* records per CPU, a power of two */
#endif
BPF_F_TABLE("array", u32, struct ca_ring_ctl, ring_ctl, CA_CPU_IDS, BPF_F_MMAPABLE);
BPF_F_TABLE("array", u32, struct ca_event, ring, CA_CPU_IDS * CA_RING_SLOTS, BPF_F_MMAPABLE);
#endif
BPF_HASH(targets, u32, u8, CA_MAX_TARGETS);
/* drops[cpu * CA_NKINDS + kind]: an mmapable array, so user space reads the counts without
 * a map syscall.  A map syscall raises the kernel's bpf_prog_active on its CPU with only
 * migration (not preemption) disabled: a recorder preempted inside one there made the kernel
 * skip every tracepoint program on that CPU until it ran again, and off-CPU records were
 * lost without a count (Probes.skipped_runs counts such skips now) */
BPF_F_TABLE("array", u32, u64, drops, CA_CPU_IDS * CA_NKINDS, BPF_F_MMAPABLE);
/* tid -> tgid of target threads seen (switch-out, clone), so a signal aimed at a thread
 * finds its process without reading task_struct */
BPF_HASH(tid_tgid, u32, u32, CA_MAX_THREADS);

static __always_inline int is_target(u32 tgid)
{
    return targets.lookup(&tgid) != NULL;
}

static __always_inline void count_drop(u32 kind)
{
    u32 idx = bpf_get_smp_processor_id() * CA_NKINDS + (kind & (CA_NKINDS - 1));
    u64 *d = drops.lookup(&idx);
    if (d)
        __sync_fetch_and_add(d, 1);     /* another program can run on this CPU meanwhile */
}

/* one zeroed record on the BPF stack (a uprobe program can be preempted, so no per-CPU
 * scratch map), sent by submit() */
#define EVENT(e, k) \
    struct ca_event e##_rec; \
    __builtin_memset(&e##_rec, 0, sizeof(e##_rec)); \
    struct ca_event *e = &e##_rec; \
    e->kind = (k)

#ifdef CA_PERF_BUFFERS
/* set by user space once every CPU's buffer is in the events map: the tracepoints run from
 * the moment BCC loads them, and a record sent before then has nowhere to go (-ENOENT) but
 * belongs to no recording yet */
BPF_ARRAY(armed, u32, 1);

static __always_inline void submit(void *ctx, struct ca_event *e)
{
    if (events.perf_submit(ctx, e, sizeof(*e)) < 0) {
        int zero = 0;
        u32 *on = armed.lookup(&zero);
        if (on && *on)
            count_drop(e->kind);
    }
}
#else
/* A slot of this CPU's ring for a record of kind, or NULL (the drop counted) when the ring
 * is full.  A uprobe program can be preempted, and a tracepoint's can run on the same CPU
 * meanwhile, so the head moves by compare-and-swap: a lost race is retried once, then
 * counted as a drop like a full ring.  A slot reserved is always committed (a BPF program
 * runs to its end), so the reader never waits on one for long. */
/* One try at moving r's head past a free slot: 1 and *at = that slot's position, else 0
 * (the ring full, or another writer moved head first) */
static __always_inline int ring_claim(struct ca_ring_ctl *r, u64 *at)
{
    u64 h = *(volatile u64 *)&r->head;
    *at = h;
    return h - *(volatile u64 *)&r->tail < CA_RING_SLOTS &&
           __sync_val_compare_and_swap(&r->head, h, h + 1) == h;
}

static __always_inline struct ca_event *ring_reserve(u32 kind)
{
    u32 cpu = bpf_get_smp_processor_id();
    struct ca_ring_ctl *r = ring_ctl.lookup(&cpu);
    u64 at = 0;
    if (!r || !(ring_claim(r, &at) || ring_claim(r, &at))) {
        count_drop(kind);
        return NULL;
    }
    u32 idx = cpu * CA_RING_SLOTS + (u32)(at & (CA_RING_SLOTS - 1));
    return ring.lookup(&idx);        /* never NULL: cpu < CA_CPU_IDS, checked above */
}

/* The record complete: its kind (never 0) stored last, after every other field (x86-64
 * keeps stores in order; the barrier keeps the compiler from moving them). */
static __always_inline void ring_commit(struct ca_event *slot, u32 kind)
{
    asm volatile("" ::: "memory");
    *(volatile u16 *)&slot->kind = kind;
}

static __always_inline void submit(void *ctx, struct ca_event *e)
{
    u32 kind = e->kind;
    struct ca_event *slot = ring_reserve(kind);
    if (!slot)
        return;
    e->kind = 0;
    __builtin_memcpy(slot, e, sizeof(*e));
    ring_commit(slot, kind);
}
#endif

static __always_inline void stamp_task(struct ca_event *e)
{
    u64 pt = bpf_get_current_pid_tgid();
    e->pid = pt >> 32;
    e->tid = (u32)pt;
}

/* ------------------------------------------------------------------ CUDA driver API */
#ifdef CA_CUDA
/* Calls in flight, per thread: an array slot (tid & mask) holding a small stack, so a
 * probed function that calls another probed one pairs too.  An array lookup is cheaper
 * than a hash update + lookup + delete (measured: ~250 ns a call less on the H200), and
 * user space maps the array to list the calls still running at stop (struct ca_slot in
 * clockalign.h). */
BPF_F_TABLE("array", u32, struct ca_slot, inflight, CA_CALL_SLOTS, BPF_F_MMAPABLE);

/* CA_REGS_ONLY (record --cuda-args registers): no user-memory reads in the CUDA probes —
 * stack arguments, struct fields, out-parameters and strings read as 0 — for the cost of
 * a bpf_probe_read_user per call (scripts/bench/probe_cost.py measures both) */
#ifdef CA_REGS_ONLY
#define CUDA_READ(dst, size, src) ((void)0)
#define CUDA_READ_STR(dst, size, src) ((void)0)
#else
#define CUDA_READ(dst, size, src) bpf_probe_read_user(dst, size, src)
#define CUDA_READ_STR(dst, size, src) bpf_probe_read_user_str(dst, size, src)
#endif

static __always_inline struct ca_slot *call_slot(u32 tid)
{
    u32 idx = tid & (CA_CALL_SLOTS - 1);
    return inflight.lookup(&idx);
}

/* CA_ENTRY_ONLY_LO/_HI (record --cuda-returns blocking): a bit per function id whose
 * return is not probed.  Those calls (launches, async copies and memsets, event records,
 * stream waits: they only enqueue work) are recorded at their entry as CA_KIND_CUDA_ENTRY,
 * with no duration and no return code, for one trap a call instead of two: the trap, not
 * the BPF program, is most of what a probed call costs (results/serving-loop.md). */
#if defined(CA_ENTRY_ONLY_LO) || defined(CA_ENTRY_ONLY_HI)
#ifndef CA_ENTRY_ONLY_LO
#define CA_ENTRY_ONLY_LO 0
#endif
#ifndef CA_ENTRY_ONLY_HI
#define CA_ENTRY_ONLY_HI 0
#endif
static __always_inline int entry_only(u32 fn)
{
    return fn < 64 ? (((u64)CA_ENTRY_ONLY_LO >> fn) & 1)
                   : fn < 128 ? (((u64)CA_ENTRY_ONLY_HI >> (fn - 64)) & 1) : 0;
}

static __always_inline int cuda_entry_record(u64 pt, u32 fn, u64 a0, u64 a1, u64 a2, u64 a3,
                                             u64 a4)
{
#ifdef CA_PERF_BUFFERS
    return 0;                       /* never built so: capture/probes/cflags.py refuses it */
#else
    struct ca_event *e = ring_reserve(CA_KIND_CUDA_ENTRY);
    if (!e)
        return 0;
    e->kind = 0;
    e->ts = bpf_ktime_get_ns();
    e->dur = 0;
    e->pid = pt >> 32;
    e->tid = (u32)pt;
    e->code = fn;
    e->ret = 0;
    e->a[0] = a0; e->a[1] = a1; e->a[2] = a2; e->a[3] = a3; e->a[4] = a4;
    __builtin_memset(e->data, 0, CA_DATA_LEN);
    ring_commit(e, CA_KIND_CUDA_ENTRY);
    return 0;
#endif
}
#else
#define entry_only(fn) 0
#define cuda_entry_record(pt, fn, a0, a1, a2, a3, a4) 0
#endif

static __always_inline int cuda_enter(u32 fn, u64 a0, u64 a1, u64 a2, u64 a3, u64 a4)
{
    u64 pt = bpf_get_current_pid_tgid();
#ifndef CA_PID_LINKS
    if (!is_target(pt >> 32))
        return 0;
#endif                              /* else the uprobe_multi links fire in the targets only */
    if (entry_only(fn))
        return cuda_entry_record(pt, fn, a0, a1, a2, a3, a4);
    u32 tid = (u32)pt;
    struct ca_slot *s = call_slot(tid);
    if (!s)
        return 0;
    if (s->tid != tid) {
        if (s->depth) {             /* another target thread, tid equal modulo the slots */
            count_drop(CA_DROP_SLOT_BUSY);
            return 0;
        }
        s->tid = tid;
    }
    u32 d = s->depth;
    if (d >= CA_NEST) {
        count_drop(CA_DROP_NESTED);
        return 0;
    }
    struct ca_call *c = &s->c[d & (CA_NEST - 1)];
    c->ts = bpf_ktime_get_ns();
    c->fn = fn;
    c->a[0] = a0; c->a[1] = a1; c->a[2] = a2; c->a[3] = a3; c->a[4] = a4;
    s->depth = d + 1;
    return 0;
}

/* The innermost call of this thread, if it is fn (no target check: only targets fill
 * slots).  A return that matches no entry (the probes were attached mid-call) is ignored;
 * one that finds another function on top means an entry lost its return: resynchronise. */
static __always_inline struct ca_call *cuda_top(struct ca_slot *s, u32 tid, u32 fn)
{
    if (!s || s->tid != tid || s->depth == 0)
        return NULL;
    u32 d = s->depth - 1;
    struct ca_call *c = &s->c[d & (CA_NEST - 1)];
    if (c->fn != fn) {
        count_drop(CA_DROP_UNPAIRED);
        s->depth = 0;
        return NULL;
    }
    s->depth = d;
    return c;
}

static __always_inline void cuda_fill(struct pt_regs *ctx, struct ca_event *e, u64 pt,
                                      struct ca_call *c, u64 now, u32 fn, int deref_a0)
{
    e->ts = c->ts;
    e->dur = now - c->ts;
    e->pid = pt >> 32;
    e->tid = (u32)pt;
    e->code = fn;
    e->ret = (s32)PT_REGS_RC(ctx);
    e->a[0] = c->a[0]; e->a[1] = c->a[1]; e->a[2] = c->a[2];
    e->a[3] = c->a[3]; e->a[4] = c->a[4];
#ifndef CA_REGS_ONLY
    if (deref_a0 && e->ret == 0 && c->a[0]) {
        u64 ptr = 0;
        bpf_probe_read_user(&ptr, sizeof(ptr), (void *)c->a[0]);
        e->a[0] = ptr;
    }
#endif
}

static __always_inline u64 stack_arg(struct pt_regs *ctx, int n)
{
    /* x86-64 SysV: at a function's first instruction, sp -> return address, and
     * argument 7 onward sit above it in 8-byte slots. */
    u64 val = 0;
    CUDA_READ(&val, sizeof(val), (void *)(PT_REGS_SP(ctx) + 8 * (n - 6)));
    return val;
}

static __always_inline int launch_enter(struct pt_regs *ctx, u32 fn)
{
    /* blockDimZ, sharedMemBytes, hStream: stack arguments 7..9, read in one copy */
    u64 st[3] = {};
    CUDA_READ(st, sizeof(st), (void *)(PT_REGS_SP(ctx) + 8));
    return cuda_enter(fn, PT_REGS_PARM1(ctx),
                      CA_DIMS(PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx)),
                      CA_DIMS(PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), st[0]),
                      (u32)st[1], st[2]);
}

struct ca_launch_config {   /* CUlaunchConfig */
    u32 grid[3];
    u32 block[3];
    u32 shmem;
    u32 pad;
    u64 stream;
};

static __always_inline int launch_ex_enter(struct pt_regs *ctx, u32 fn)
{
    struct ca_launch_config c = {};
    CUDA_READ(&c, sizeof(c), (void *)PT_REGS_PARM1(ctx));
    return cuda_enter(fn, PT_REGS_PARM2(ctx), CA_DIMS(c.grid[0], c.grid[1], c.grid[2]),
                      CA_DIMS(c.block[0], c.block[1], c.block[2]), c.shmem, c.stream);
}

static __always_inline u64 user_u64(u64 base, u32 off)
{
    u64 v = 0;
    CUDA_READ(&v, sizeof(v), (void *)(base + off));
    return v;
}

static __always_inline u64 user_u32(u64 base, u32 off)
{
    u32 v = 0;
    CUDA_READ(&v, sizeof(v), (void *)(base + off));
    return v;
}

/* CUDA_MEMCPY2D / CUDA_MEMCPY3D of cuda.h.  Each side of a copy is the host, device or
 * array pointer its CUmemorytype names (1 host, 2 device, 3 array, 4 unified: device). */
static __always_inline u64 copy_side(u32 type, u64 host, u64 dev, u64 array)
{
    return type == 1 ? host : type == 3 ? array : dev;
}

struct ca_memcpy2d {
    u64 src_x, src_y;
    u32 src_type, pad0;
    u64 src_host, src_dev, src_array, src_pitch;
    u64 dst_x, dst_y;
    u32 dst_type, pad1;
    u64 dst_host, dst_dev, dst_array, dst_pitch;
    u64 width, height;
};

static __always_inline int memcpy2d_enter(struct pt_regs *ctx, u32 fn, u64 stream)
{
    struct ca_memcpy2d c = {};
    CUDA_READ(&c, sizeof(c), (void *)PT_REGS_PARM1(ctx));
    return cuda_enter(fn, copy_side(c.dst_type, c.dst_host, c.dst_dev, c.dst_array),
                      copy_side(c.src_type, c.src_host, c.src_dev, c.src_array),
                      c.width * c.height, stream, c.src_type | ((u64)c.dst_type << 8));
}

struct ca_memcpy3d {
    u64 src_x, src_y, src_z, src_lod;
    u32 src_type, pad0;
    u64 src_host, src_dev, src_array, reserved0, src_pitch, src_height;
    u64 dst_x, dst_y, dst_z, dst_lod;
    u32 dst_type, pad1;
    u64 dst_host, dst_dev, dst_array, reserved1, dst_pitch, dst_height;
    u64 width, height, depth;
};

static __always_inline int memcpy3d_enter(struct pt_regs *ctx, u32 fn, u64 stream)
{
    struct ca_memcpy3d c = {};
    CUDA_READ(&c, sizeof(c), (void *)PT_REGS_PARM1(ctx));
    return cuda_enter(fn, copy_side(c.dst_type, c.dst_host, c.dst_dev, c.dst_array),
                      copy_side(c.src_type, c.src_host, c.src_dev, c.src_array),
                      c.width * c.height * c.depth, stream,
                      c.src_type | ((u64)c.dst_type << 8));
}

/* The CUDA record of a return; with slot >= 0, the C string whose pointer the entry kept
 * in a[slot] copied into data (cuModuleGetFunction's kernel name, a module's file name). */
static __always_inline int cuda_return_str(struct pt_regs *ctx, u32 fn, int deref_a0,
                                           int slot)
{
    u64 now = bpf_ktime_get_ns();
    u64 pt = bpf_get_current_pid_tgid();
    struct ca_call *c = cuda_top(call_slot((u32)pt), (u32)pt, fn);
    if (!c)
        return 0;
#ifdef CA_PERF_BUFFERS
    EVENT(e, CA_KIND_CUDA);
#else
    /* the hot path: the record is filled in its slot, no stack copy */
    struct ca_event *e = ring_reserve(CA_KIND_CUDA);
    if (!e)
        return 0;
    e->kind = 0;
    __builtin_memset(e->data, 0, CA_DATA_LEN);
#endif
    cuda_fill(ctx, e, pt, c, now, fn, deref_a0);
    if (slot >= 0 && slot < 5 && c->a[slot])
        CUDA_READ_STR(e->data, CA_DATA_LEN, (void *)c->a[slot]);
#ifdef CA_PERF_BUFFERS
    submit(ctx, e);
#else
    ring_commit(e, CA_KIND_CUDA);
#endif
    return 0;
}

/* deref_a0: a0 is an out-parameter (CUdeviceptr *, handle *), replaced by what the call
 * wrote there when it succeeded */
static __always_inline int cuda_return(struct pt_regs *ctx, u32 fn, int deref_a0)
{
    return cuda_return_str(ctx, fn, deref_a0, -1);
}

/* The enter_X / return_X stub of each function comes from store/cuda_api.py, appended
 * by capture/probes/cflags.py (capture/probes/cuda_stubs.py writes it; --dump-bpf shows it). */
#endif /* CA_CUDA */

/* ------------------------------------------------------------------ connect() */
#ifdef CA_CONNECT
struct conn_val {
    u64 ts;
    u64 fd;
    u64 addrlen;
    u8 addr[CA_DATA_LEN];
};
BPF_HASH(conn_inflight, u32, struct conn_val, CA_MAX_THREADS);

TRACEPOINT_PROBE(syscalls, sys_enter_connect)
{
    u64 pt = bpf_get_current_pid_tgid();
    if (!is_target(pt >> 32))
        return 0;
    u32 tid = (u32)pt;
    struct conn_val v = {};
    v.ts = bpf_ktime_get_ns();
    v.fd = args->fd;
    v.addrlen = args->addrlen;
    /* constant sizes keep the verifier happy: sockaddr_in 16, sockaddr_in6 28, unix <= 110 */
    void *ua = (void *)args->uservaddr;
    if (v.addrlen >= CA_DATA_LEN)
        bpf_probe_read_user(v.addr, CA_DATA_LEN, ua);
    else if (v.addrlen >= 28)
        bpf_probe_read_user(v.addr, 28, ua);
    else if (v.addrlen >= 16)
        bpf_probe_read_user(v.addr, 16, ua);
    else if (v.addrlen >= 2)
        bpf_probe_read_user(v.addr, 2, ua);
    if (conn_inflight.update(&tid, &v))
        count_drop(CA_DROP_MAP_FULL);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_connect)
{
    u64 now = bpf_ktime_get_ns();
    u64 pt = bpf_get_current_pid_tgid();
    u32 tid = (u32)pt;
    struct conn_val *v = conn_inflight.lookup(&tid);
    if (!v)
        return 0;
    EVENT(e, CA_KIND_CONNECT);
    e->ts = v->ts;
    e->dur = now - v->ts;
    e->pid = pt >> 32;
    e->tid = tid;
    e->ret = (s32)args->ret;
    e->a[0] = v->fd;
    e->a[1] = v->addrlen;
    __builtin_memcpy(e->data, v->addr, CA_DATA_LEN);
    conn_inflight.delete(&tid);
    submit(args, e);
    return 0;
}
#endif /* CA_CONNECT */

/* ------------------------------------------------------------------ scheduler */
#ifdef CA_SCHED
struct off_val {
    u64 ts;
    s64 state;
    u32 tgid;
    u32 cpu;
    u32 in_cuda;    /* id of the probed CUDA call the thread was inside when switched out */
    u32 pad;
};
BPF_HASH(offcpu, u32, struct off_val, CA_MAX_THREADS);
BPF_HASH(wakeups, u32, u64, CA_MAX_THREADS);

TRACEPOINT_PROBE(sched, sched_switch)
{
    /* runs for every context switch on the host: the common case (neither thread a
     * target) does two lookups and returns before reading the clock */
    u32 prev = args->prev_pid, next = args->next_pid;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;   /* current is still prev here */
    int prev_target = prev != 0 && is_target(tgid);
    struct off_val *o = next ? offcpu.lookup(&next) : NULL;
    if (!prev_target && !o)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u32 cpu = bpf_get_smp_processor_id();
    if (prev_target) {
        tid_tgid.update(&prev, &tgid);
        struct off_val ov = {.ts = now, .state = args->prev_state, .tgid = tgid, .cpu = cpu};
#ifdef CA_CUDA
        /* off-CPU inside a CUDA call: the call slot this thread fills (a target thread's
         * only; no cost on the CUDA path) */
        struct ca_slot *s = call_slot(prev);
        if (s && s->tid == prev && s->depth)
            ov.in_cuda = s->c[(s->depth - 1) & (CA_NEST - 1)].fn;
#endif
        if (offcpu.update(&prev, &ov))
            count_drop(CA_DROP_MAP_FULL);
    }
    if (!o)
        return 0;
    EVENT(e, CA_KIND_SCHED);
    e->ts = o->ts;
    e->dur = now - o->ts;
    e->pid = o->tgid;
    e->tid = next;
    e->ret = (s32)o->state;
    /* preempted: reported as TASK_REPORT_MAX (0x100) since 4.14, or plain running */
    e->code = (o->state == 0 || o->state >= 0x100) ? 1 : 0;
    u64 *w = wakeups.lookup(&next);
    if (w && *w >= o->ts && *w <= now)
        e->a[0] = now - *w;
    e->a[1] = o->cpu;
    e->a[2] = cpu;
    e->a[3] = o->in_cuda;
    offcpu.delete(&next);
    wakeups.delete(&next);
    submit(args, e);
    return 0;
}

static __always_inline void note_wakeup(u32 pid)
{
    if (offcpu.lookup(&pid)) {
        u64 now = bpf_ktime_get_ns();
        wakeups.update(&pid, &now);
    }
}

TRACEPOINT_PROBE(sched, sched_wakeup)
{
    note_wakeup(args->pid);
    return 0;
}
#endif /* CA_SCHED */

/* ------------------------------------------------------------------ threads, exits */
TRACEPOINT_PROBE(sched, sched_process_fork)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!is_target(tgid))
        return 0;
    u32 child = args->child_pid;
    tid_tgid.update(&child, &tgid);   /* a forked process's tgid is fixed at its first switch */
#ifdef CA_FOLLOW_CHILDREN
    /* a thread's tid never equals another process's tgid, so adding every child is safe */
    u8 one = 1;
    targets.update(&child, &one);
#endif
    EVENT(e, CA_KIND_THREAD_NEW);
    e->ts = bpf_ktime_get_ns();
    e->pid = tgid;
    e->tid = child;
    e->a[0] = args->parent_pid;
#ifdef CA_FORK_COMM_DATALOC
    TP_DATA_LOC_READ_STR(e->data, child_comm, 16);
#else
    bpf_probe_read_kernel_str(e->data, 16, args->child_comm);
#endif
    submit(args, e);
    return 0;
}

TRACEPOINT_PROBE(task, task_rename)
{
    u64 pt = bpf_get_current_pid_tgid();
    if (!is_target(pt >> 32))
        return 0;
    EVENT(e, CA_KIND_THREAD_NAME);
    e->ts = bpf_ktime_get_ns();
    e->pid = pt >> 32;
    e->tid = args->pid;
    bpf_probe_read_kernel_str(e->data, 16, args->newcomm);
    submit(args, e);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 pt = bpf_get_current_pid_tgid();
    if (!is_target(pt >> 32))
        return 0;
    u32 tid = (u32)pt;
    tid_tgid.delete(&tid);
#ifdef CA_CUDA
    /* calls this thread never returned from: kept as unfinished, the slot freed */
    struct ca_slot *s = call_slot(tid);
    if (s && s->tid == tid) {
        u64 now = bpf_ktime_get_ns();
#pragma unroll
        for (int i = 0; i < CA_NEST; i++) {
            if (i >= s->depth)
                break;
            EVENT(u, CA_KIND_CUDA_UNFINISHED);
            u->ts = s->c[i].ts;
            u->dur = now - s->c[i].ts;
            u->pid = pt >> 32;
            u->tid = tid;
            u->code = s->c[i].fn;
            u->a[0] = s->c[i].a[0]; u->a[1] = s->c[i].a[1]; u->a[2] = s->c[i].a[2];
            u->a[3] = s->c[i].a[3]; u->a[4] = s->c[i].a[4];
            submit(args, u);
        }
        s->depth = 0;
    }
#endif
    EVENT(e, CA_KIND_THREAD_EXIT);
    e->ts = bpf_ktime_get_ns();
    stamp_task(e);
    e->code = args->group_dead;
    bpf_get_current_comm(e->data, 16);
    submit(args, e);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_exit_group)
{
    u64 pt = bpf_get_current_pid_tgid();
    if (!is_target(pt >> 32))
        return 0;
    EVENT(e, CA_KIND_PROC_EXIT);
    e->ts = bpf_ktime_get_ns();
    stamp_task(e);
    e->ret = (s32)args->error_code;
    submit(args, e);
    return 0;
}

TRACEPOINT_PROBE(signal, signal_generate)
{
    u32 tid = args->pid, tgid = tid;
    if (!is_target(tgid)) {
        u32 *t = tid_tgid.lookup(&tid);
        if (!t || !is_target(*t))
            return 0;
        tgid = *t;
    }
    EVENT(e, CA_KIND_SIGNAL);
    e->ts = bpf_ktime_get_ns();
    e->pid = tgid;
    e->tid = tid;
    e->ret = args->sig;
    e->code = (u16)args->result;
    e->a[0] = bpf_get_current_pid_tgid() >> 32;
    e->a[1] = args->code;
    bpf_get_current_comm(e->data, 16);
    submit(args, e);
    return 0;
}

/* ------------------------------------------------------------------ TCP resets, retransmits */
#ifdef CA_TCP
/* Resets and retransmits are mostly handled in softirq context, where the current task is
 * anyone: they are attributed through the socket instead.  A target's sockets are learnt
 * where the kernel changes a TCP state in the target's own context (connect: SYN_SENT),
 * and its listening ports where it listens (also filled from /proc at start, for
 * listeners opened before the recording), so accepted connections count by local port. */
BPF_HASH(tcp_socks, u64, u32, CA_MAX_THREADS);
BPF_HASH(tcp_ports, u16, u32, 4096);

#define CA_TCP_SYN_SENT 2
#define CA_TCP_CLOSE 7
#define CA_TCP_LISTEN 10

TRACEPOINT_PROBE(sock, inet_sock_set_state)
{
    if (args->protocol != 6)            /* IPPROTO_TCP */
        return 0;
    u64 sk = (u64)args->skaddr;
    u16 port = args->sport;
    if (args->newstate == CA_TCP_CLOSE) {
        tcp_socks.delete(&sk);
        if (args->oldstate == CA_TCP_LISTEN)
            tcp_ports.delete(&port);
        return 0;
    }
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (args->newstate != CA_TCP_SYN_SENT && args->newstate != CA_TCP_LISTEN)
        return 0;
    if (!is_target(tgid))
        return 0;
    int err = args->newstate == CA_TCP_SYN_SENT ? tcp_socks.update(&sk, &tgid)
                                                : tcp_ports.update(&port, &tgid);
    if (err)
        count_drop(CA_DROP_MAP_FULL);
    return 0;
}

static __always_inline u32 tcp_owner(u64 sk, u16 lport)
{
    u32 *t = sk ? tcp_socks.lookup(&sk) : NULL;
    if (!t)
        t = tcp_ports.lookup(&lport);
    return t ? *t : 0;
}

/* data: local then remote address as sockaddr_in / sockaddr_in6 (28 bytes each), the
 * layout connect() records keep, so one decoder reads both */
static __always_inline void tcp_sockaddr(u8 *out, u16 family, u16 port, const u8 *v4,
                                         const u8 *v6)
{
    *(u16 *)out = family;
    *(u16 *)(out + 2) = bpf_htons(port);
    if (family == 10)
        bpf_probe_read_kernel(out + 8, 16, v6);
    else
        bpf_probe_read_kernel(out + 4, 4, v4);
}

static __always_inline void tcp_event(void *ctx, struct ca_event *e, u32 owner, u32 code)
{
    u64 pt = bpf_get_current_pid_tgid();
    e->ts = bpf_ktime_get_ns();
    e->pid = owner;
    e->tid = (pt >> 32) == owner ? (u32)pt : 0;     /* 0: not in the owner's context */
    e->code = code;
    submit(ctx, e);
}

/* tcp_send_reset's reason is an enum the distro headers lack, so BCC cannot build its
 * args struct: the layout is written here, checked against tracefs by capture/probes/cflags.py
 * (tcp_cflags), and the name makes BCC attach it to tcp:tcp_send_reset */
struct ca_tcp_send_reset {
    u64 common;
    u64 skbaddr;
    u64 skaddr;
    s32 state;
    u32 reason;
    u8 saddr[28];       /* sockaddr_in / sockaddr_in6, local first (reversed from the skb when */
    u8 daddr[28];       /* no full socket is at hand) */
};

int tracepoint__tcp__tcp_send_reset(struct ca_tcp_send_reset *args)
{
    u16 lport = 0;
    bpf_probe_read_kernel(&lport, 2, args->saddr + 2);
    u32 owner = tcp_owner(args->skaddr, bpf_ntohs(lport));
    if (!owner)
        return 0;
    EVENT(e, CA_KIND_TCP);
    bpf_probe_read_kernel(e->data, 28, args->saddr);
    bpf_probe_read_kernel(e->data + 28, 28, args->daddr);
    e->ret = args->state;
#ifdef CA_TCP_RESET_REASON
    e->a[0] = args->reason;
#endif
    tcp_event(args, e, owner, CA_TCP_RESET_SENT);
    return 0;
}

/* a reset received or a retransmit: the two tracepoints carry the same address fields */
#define TCP_SKB_EVENT(code, state, a0) ({ \
    u32 owner = tcp_owner((u64)args->skaddr, args->sport); \
    if (owner) { \
        EVENT(e, CA_KIND_TCP); \
        tcp_sockaddr(e->data, args->family, args->sport, args->saddr, args->saddr_v6); \
        tcp_sockaddr(e->data + 28, args->family, args->dport, args->daddr, args->daddr_v6); \
        e->ret = (state); \
        e->a[0] = (a0); \
        tcp_event(args, e, owner, code); \
    } \
    0; })

TRACEPOINT_PROBE(tcp, tcp_receive_reset)
{
    return TCP_SKB_EVENT(CA_TCP_RESET_RECEIVED, 0, 0);
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)
{
#ifdef CA_TCP_RETRANSMIT_ERR
    return TCP_SKB_EVENT(CA_TCP_RETRANSMIT, args->state, (u64)(s64)args->err);
#else
    return TCP_SKB_EVENT(CA_TCP_RETRANSMIT, args->state, 0);
#endif
}
#endif /* CA_TCP */

/* ------------------------------------------------------------------ NVIDIA Xid */
#if defined(CA_XID) || defined(CA_XID_PRINTK)
/* The whole message, not what fits a record: the driver formats it with kvasprintf (no
 * bound of its own), so the bound is the tracepoint's: a perf trace record holds at most
 * PERF_MAX_TRACE_SIZE (8192) bytes, header and dev string included, or it never reaches a
 * BPF program.  It goes out as CA_KIND_XID_MSG records of CA_XID_PART_LEN bytes each
 * (a[0..4] and data, code = part index, ret = message length), sent BEFORE the XID record
 * itself, so a reader has every part in hand when it meets the Xid (store/event_text.py). */
#ifndef CA_XID_MSG_MAX
#define CA_XID_MSG_MAX 8192
#endif
#define CA_XID_PARTS ((CA_XID_MSG_MAX + CA_XID_PART_LEN - 1) / CA_XID_PART_LEN)

struct xid_scratch {
    char msg[CA_XID_PARTS * CA_XID_PART_LEN];
    struct ca_event part;
};
/* a tracepoint program runs with preemption off and never nests on one CPU, so a per-CPU
 * scratch is safe here (unlike in the uprobes) */
BPF_PERCPU_ARRAY(xid_scratch, struct xid_scratch, 1);

static __always_inline void emit_xid(void *ctx, u32 code, const char *dev, const char *msg)
{
    int zero = 0;
    struct xid_scratch *s = xid_scratch.lookup(&zero);
    EVENT(e, CA_KIND_XID);
    e->ts = bpf_ktime_get_ns();
    stamp_task(e);
    e->ret = code;
    if (dev)
        bpf_probe_read_kernel_str(e->data, 16, dev);
    if (!msg) {
        submit(ctx, e);
        return;
    }
    bpf_probe_read_kernel_str(e->data + 16, CA_DATA_LEN - 16, msg);
    if (s) {
        long n = bpf_probe_read_kernel_str(s->msg, CA_XID_MSG_MAX, msg);
        u32 len = n > 0 ? (u32)(n - 1) : 0;
        e->a[0] = len;
        struct ca_event *p = &s->part;
        for (u32 i = 0; i < CA_XID_PARTS; i++) {
            u32 off = i * CA_XID_PART_LEN;
            if (off >= len)
                break;
            __builtin_memset(p, 0, sizeof(*p));
            p->kind = CA_KIND_XID_MSG;
            p->ts = e->ts;
            p->pid = e->pid;
            p->tid = e->tid;
            p->code = i;
            p->ret = len;
            __builtin_memcpy((char *)p->a, s->msg + off, CA_XID_PART_LEN);
            submit(ctx, p);
            e->a[1]++;
        }
    }
    submit(ctx, e);
}
#endif

#ifdef CA_XID
TRACEPOINT_PROBE(nvidia, nvidia_dev_xid)
{
    /* device-wide: an Xid is recorded whatever process caused it */
#ifdef CA_XID_DATALOC
    emit_xid(args, args->error_code, (char *)args + (args->data_loc_dev & 0xFFFF),
             (char *)args + (args->data_loc_msg & 0xFFFF));
#else
    emit_xid(args, args->error_code, NULL, NULL);
#endif
    return 0;
}
#endif /* CA_XID */

#ifdef CA_XID_PRINTK
/* Tests only (CLOCKALIGN_TEST_XID_PRINTK=1, capture/probes/cflags.py): no NVIDIA driver here,
 * so a kernel log line a target writes to /dev/kmsg stands in for an Xid's message: a
 * real in-kernel __data_loc string of the tracepoint's kind, through the same emit_xid */
TRACEPOINT_PROBE(printk, console)
{
    if (!is_target(bpf_get_current_pid_tgid() >> 32))
        return 0;
    emit_xid(args, CA_XID_PRINTK, NULL, (char *)args + (args->data_loc_msg & 0xFFFF));
    return 0;
}
#endif
