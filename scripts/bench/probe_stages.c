/* clockalign's CUDA probe path, rebuilt one piece at a time, for scripts/bench/probe_cost.py.
 * Attached to cuLaunchKernel of the stand-in libcuda; STAGE (a -D cflag) says how much runs:
 *   0  entry uprobe only, empty            1  entry + return, both empty
 *   2  + target-tgid filter (hash lookup)  3  + bpf_ktime_get_ns at entry and return
 *   4  + pairing state kept entry->return (PAIR: 1 hash map as today, 2 per-thread array
 *        slot, 3 task-local storage)
 *   5  + the launch's arguments (registers, three stack slots read with bpf_probe_read_user)
 *   6  + one record per call: ring-buffer reserve, fill, submit (RECORD bytes); with
 *        -DRETRY a failed reserve is tried twice more; with -DPERF the record is built on
 *        the stack and sent with bpf_perf_event_output to a per-CPU perf buffer instead;
 *        with -DARING it is written in place into this CPU's slot ring, an mmapable array
 *        (a compare-and-swap reserves the slot, the kind field stored last commits it;
 *        nobody reads it here, so the capacity check loads the tail but never fails)
 * The real program (bpf/probes.c) is measured separately, through clockalign itself. */
#include <uapi/linux/ptrace.h>
#include <linux/sched.h>

#ifndef STAGE
#define STAGE 1
#endif
#ifndef PAIR
#define PAIR 1
#endif
#ifndef RECORD
#define RECORD 128
#endif

BPF_HASH(targets, u32, u8, 1024);
BPF_ARRAY(lost, u64, 1);
BPF_ARRAY(retried, u64, 1);
BPF_RINGBUF_OUTPUT(events, 4096);
BPF_PERF_OUTPUT(pevents);
#define ARING_SLOTS 4096
struct ahead { u64 head; u64 pad[7]; u64 tail; u64 pad2[7]; };
BPF_F_TABLE("array", u32, struct ahead, aheads, 64, BPF_F_MMAPABLE);

struct val { u64 ts; u32 tid; u32 fn; u64 a[5]; };
struct rec { u64 ts; u64 dur; u32 pid; u32 tid; u16 kind; u16 code; s32 ret; u64 a[5];
             u8 data[RECORD - 72]; };
BPF_F_TABLE("array", u32, struct rec, arecs, 64 * ARING_SLOTS, BPF_F_MMAPABLE);

#if PAIR == 1
struct key { u32 tid; u32 fn; };
BPF_HASH(inflight, struct key, struct val, 65536);
#elif PAIR == 2
BPF_ARRAY(inflight, struct val, 65536);
#else
BPF_TASK_STORAGE(inflight, struct val);
#endif

static __always_inline void count_lost(void)
{
    int z = 0;
    u64 *n = lost.lookup(&z);
    if (n)
        __sync_fetch_and_add(n, 1);
}

static __always_inline u64 stack_arg(struct pt_regs *ctx, int n)
{
    u64 v = 0;
    bpf_probe_read_user(&v, sizeof(v), (void *)(PT_REGS_SP(ctx) + 8 * (n - 6)));
    return v;
}

static __always_inline struct val *slot(u32 tid, int create)
{
#if PAIR == 1
    struct key k = {.tid = tid, .fn = 1};
    if (create) {
        struct val v = {};
        inflight.update(&k, &v);
    }
    return inflight.lookup(&k);
#elif PAIR == 2
    u32 i = tid & 65535;
    return inflight.lookup(&i);
#else
    return inflight.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0,
                                     create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
#endif
}

static __always_inline int is_target(u32 tgid)
{
    return targets.lookup(&tgid) != NULL;    /* BCC allows no map call inside a macro */
}

/* stages 2 and 3, the same at entry and return: the target filter, then the clock */
#if STAGE >= 2
#define FILTER() \
    u64 pt = bpf_get_current_pid_tgid(); \
    u32 tgid = pt >> 32; \
    if (!is_target(tgid)) \
        return 0
#else
#define FILTER() do { } while (0)
#endif
#if STAGE >= 3
#define CLOCK(t) u64 t = bpf_ktime_get_ns()
#else
#define CLOCK(t) do { } while (0)
#endif

int enter(struct pt_regs *ctx)
{
    FILTER();
    CLOCK(ts);
#if STAGE >= 4
    struct val *v = slot((u32)pt, 1);
    if (!v) {
        count_lost();
        return 0;
    }
    v->ts = ts;
    v->tid = (u32)pt;
    v->fn = 1;
#endif
#if STAGE >= 5
    v->a[0] = PT_REGS_PARM1(ctx);
    v->a[1] = PT_REGS_PARM2(ctx) | (PT_REGS_PARM3(ctx) << 32);
    v->a[2] = PT_REGS_PARM5(ctx) | (PT_REGS_PARM6(ctx) << 32) | (stack_arg(ctx, 7) << 48);
    v->a[3] = stack_arg(ctx, 8);
    v->a[4] = stack_arg(ctx, 9);
#endif
    return 0;
}

int ret(struct pt_regs *ctx)
{
    FILTER();
    CLOCK(now);
#if STAGE >= 4
    struct val *v = slot((u32)pt, 0);
    if (!v || v->tid != (u32)pt || v->fn != 1)
        return 0;
#if STAGE >= 6 && defined(PERF)
    struct rec r = {};
    r.ts = v->ts; r.dur = now - v->ts; r.pid = tgid; r.tid = (u32)pt; r.kind = 1; r.code = 1;
    r.ret = (s32)PT_REGS_RC(ctx);
    r.a[0] = v->a[0]; r.a[1] = v->a[1]; r.a[2] = v->a[2]; r.a[3] = v->a[3]; r.a[4] = v->a[4];
    if (pevents.perf_submit(ctx, &r, sizeof(r)))
        count_lost();
#elif STAGE >= 6 && defined(ARING)
    u32 cpu = bpf_get_smp_processor_id() & 63;
    struct ahead *h = aheads.lookup(&cpu);
    if (!h)
        return 0;
    u64 at = h->head;
    if (at - h->tail >= (1ULL << 62) || __sync_val_compare_and_swap(&h->head, at, at + 1) != at) {
        count_lost();
    } else {
        u32 i = cpu * ARING_SLOTS + (u32)(at & (ARING_SLOTS - 1));
        struct rec *e = arecs.lookup(&i);
        if (e) {
            e->ts = v->ts; e->dur = now - v->ts; e->pid = tgid; e->tid = (u32)pt;
            e->code = 1; e->ret = (s32)PT_REGS_RC(ctx);
            e->a[0] = v->a[0]; e->a[1] = v->a[1]; e->a[2] = v->a[2];
            e->a[3] = v->a[3]; e->a[4] = v->a[4];
            __builtin_memset(e->data, 0, sizeof(e->data));
            asm volatile("" ::: "memory");
            e->kind = 1;                /* stored last: the slot is complete */
        }
    }
#elif STAGE >= 6
    struct rec *e = events.ringbuf_reserve(sizeof(struct rec));
#ifdef RETRY
    if (!e) {
        int z = 0;
        u64 *n = retried.lookup(&z);
        if (n)
            __sync_fetch_and_add(n, 1);
        e = events.ringbuf_reserve(sizeof(struct rec));
    }
    if (!e)
        e = events.ringbuf_reserve(sizeof(struct rec));
#endif
    if (e) {
        __builtin_memset(e, 0, sizeof(*e));
        e->ts = v->ts;
        e->dur = now - v->ts;
        e->pid = tgid;
        e->tid = (u32)pt;
        e->kind = 1;
        e->code = 1;
        e->ret = (s32)PT_REGS_RC(ctx);
        e->a[0] = v->a[0]; e->a[1] = v->a[1]; e->a[2] = v->a[2];
        e->a[3] = v->a[3]; e->a[4] = v->a[4];
        events.ringbuf_submit(e, 0);
    } else {
        count_lost();
    }
#endif
    v->fn = 0;
#if PAIR == 1
    struct key k = {.tid = (u32)pt, .fn = 1};
    inflight.delete(&k);
#endif
#endif
    return 0;
}
