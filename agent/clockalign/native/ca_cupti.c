/*
 * clockalign's CUPTI injection library: `clockalign record --gpu-activity -- CMD` sets
 * CUDA_INJECTION64_PATH to this file, and libcuda calls InitializeInjection() at cuInit.
 *
 * It collects concurrent-kernel, memcpy and memset activity with RAW GPU timestamps where
 * libcupti exports the undocumented cuptiActivityEnableRawTimestamps(uint8_t) (every
 * libcupti 10.2-13.0 does), else CUPTI's converted ones, flagged as such; plus, through the
 * callback API, one record per driver call that can start GPU work (launches, copies,
 * memsets), stamped on MONOTONIC at its entry and exit with the calling thread's tid and
 * the correlation id that ties it to its activity record.  Records go to the recorder as
 * fixed-size binary packets through the FIFO named by CLOCKALIGN_CUPTI_FIFO
 * (ca_gpu_wire.h): no per-record work on the Python side.
 *
 * libcupti is dlopen'ed (CLOCKALIGN_CUPTI_LIB), so this file needs only the CUPTI and
 * cuda.h headers to build:
 *     gcc -O2 -shared -fPIC -fvisibility=hidden -I<cupti include> -I<cuda include> ca_cupti.c \
 *         -o ca_cupti.so -ldl -lpthread   (clockalign.native.build does this, cached)
 * CLOCKALIGN_CUPTI_RAW=0 keeps CUPTI's converted timestamps (for comparisons).
 * CLOCKALIGN_CUPTI_MODE picks what is collected (CA_MODE_* bits of ca_gpu_wire.h, as a
 * number; default kernels, copies, memsets and the launching calls); "graph" mode takes a
 * CUDA graph's execution as one record instead of its kernels (CUPTI's graph-level trace).
 * CLOCKALIGN_CUPTI_CTL names a file holding such a number: the flusher re-reads it every
 * period and switches collection to it (0: nothing; activity in windows), sending a
 * CA_GK_MODE record with the time of each switch, so the run file says what was on when.
 *
 * `record --pid P --gpu-activity` loads the library into a running process instead
 * (capture/targets/inject_so.py) and calls ca_cupti_attach(settings): see ca_gpu_wire.h,
 * struct ca_live.
 *
 * A write that would raise SIGPIPE (the recorder is gone) is caught with SIGPIPE blocked
 * in the writing thread; the library then stops collecting, and the target runs on.
 */
#define _GNU_SOURCE
#include <cupti.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ca_gpu_wire.h"

#if !defined(CUPTI_API_VERSION)
#error "cupti.h did not define CUPTI_API_VERSION"
#elif CUPTI_API_VERSION >= 130000
typedef CUpti_ActivityKernel10 ca_kernel_t;
typedef CUpti_ActivityMemcpy6 ca_memcpy_t;
typedef CUpti_ActivityMemset4 ca_memset_t;
#elif CUPTI_API_VERSION >= 18
typedef CUpti_ActivityKernel9 ca_kernel_t;
typedef CUpti_ActivityMemcpy5 ca_memcpy_t;
typedef CUpti_ActivityMemset4 ca_memset_t;
#else
#error "CUPTI older than CUDA 12 (CUPTI_API_VERSION < 18) is not supported"
#endif

#define BUF_BYTES (4u << 20)
#define FLUSH_NS 100000000ull     /* activity flushed and staged records sent every 100 ms */
#define CLOCK_EVERY 5             /* a CUPTI clock sandwich every 5 flushes */

static struct {
    CUptiResult (*ActivityEnable)(CUpti_ActivityKind);
    CUptiResult (*ActivityDisable)(CUpti_ActivityKind);
    CUptiResult (*ActivityRegisterCallbacks)(CUpti_BuffersCallbackRequestFunc,
                                             CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*ActivityGetNextRecord)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*ActivityFlushAll)(uint32_t);
    CUptiResult (*ActivityGetNumDroppedRecords)(CUcontext, uint32_t, size_t *);
    CUptiResult (*ActivityEnableRawTimestamps)(uint8_t);
    CUptiResult (*Subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
    CUptiResult (*Unsubscribe)(CUpti_SubscriberHandle);
    CUptiResult (*EnableCallback)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain,
                                  CUpti_CallbackId);
    CUptiResult (*GetCallbackName)(CUpti_CallbackDomain, uint32_t, const char **);
    CUptiResult (*GetTimestamp)(uint64_t *);
    CUptiResult (*GetDeviceId)(CUcontext, uint32_t *);
    CUptiResult (*GetVersion)(uint32_t *);
    CUptiResult (*GetResultString)(CUptiResult, const char **);
} cu;

static CUresult (*p_cuDeviceGet)(CUdevice *, int);
static CUresult (*p_cuDeviceGetUuid)(CUuuid *, CUdevice);
static CUresult (*p_cuDeviceGetCount)(int *);

static int fifo = -1;
static volatile int dead;          /* the recorder went away: stop sending */
static uint32_t my_pid;
static uint16_t ts_flags = CA_F_CONVERTED;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static CUpti_SubscriberHandle subscriber;

/* staged records (API callbacks and activity), sent as one packet when full */
static struct {
    struct ca_pkt h;
    struct ca_gpu_rec r[CA_RECS_PER_PKT];
} stage;
static unsigned staged;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A record of kind stamped now (MONOTONIC) holding value; the rest zero. */
static struct ca_gpu_rec mark_now(uint16_t kind, uint64_t value)
{
    struct ca_gpu_rec o;
    memset(&o, 0, sizeof(o));
    o.kind = kind;
    o.start = mono_ns();
    o.value = value;
    return o;
}

static int live;                       /* loaded by ca_cupti_attach, not by CUDA */
__attribute__((visibility("default"))) struct ca_live ca_cupti_live;

/* The reason GPU activity is off: into ca_cupti_live.error (the recorder reads it in live
 * mode) and, when CUDA loaded the library, on the target's stderr.  Returns `code`. */
__attribute__((format(printf, 2, 3))) static int fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ca_cupti_live.error, sizeof(ca_cupti_live.error), fmt, ap);
    va_end(ap);
    ca_cupti_live.failure = code;
    if (!live)
        fprintf(stderr, "clockalign-cupti: %s (GPU activity is off)\n", ca_cupti_live.error);
    return code;
}

static int warn(const char *what, CUptiResult r)
{
    const char *s = "?";
    if (cu.GetResultString)
        cu.GetResultString(r, &s);
    return fail(r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED ? CA_FAIL_SUBSCRIBED
                : CA_FAIL_CUPTI, "%s failed: %s", what, s);
}

/* One packet, one write(2) (atomic: <= PIPE_BUF).  Caller holds `lock`. */
static void send_packet(const void *buf, size_t len)
{
    sigset_t pipe, old;
    if (dead || fifo < 0)
        return;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, &old);
    ssize_t w;
    do {
        w = write(fifo, buf, len);
    } while (w < 0 && errno == EINTR);
    if (w != (ssize_t)len) {
        if (w < 0 && errno == EPIPE) {
            struct timespec zero = {0, 0};
            while (sigtimedwait(&pipe, NULL, &zero) > 0)
                ;
        }
        dead = 1;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void flush_stage_locked(void)
{
    if (!staged)
        return;
    stage.h.magic = CA_PKT_MAGIC;
    stage.h.type = CA_PKT_RECORDS;
    stage.h.n = (uint16_t)staged;
    stage.h.pid = my_pid;
    stage.h.len = staged * (uint32_t)sizeof(struct ca_gpu_rec);
    send_packet(&stage, sizeof(struct ca_pkt) + stage.h.len);
    staged = 0;
}

static void put_locked(const struct ca_gpu_rec *r)
{
    stage.r[staged] = *r;
    stage.r[staged].pid = my_pid;
    if (++staged == CA_RECS_PER_PKT)
        flush_stage_locked();
}

static void put(const struct ca_gpu_rec *r)
{
    pthread_mutex_lock(&lock);
    put_locked(r);
    pthread_mutex_unlock(&lock);
}

static void send_name_locked(uint32_t space, uint32_t id, const char *s)
{
    struct {
        struct ca_pkt h;
        struct ca_name_hdr n;
        char text[CA_NAME_PER_PKT];
    } p;
    size_t total = strlen(s), off = 0;
    do {
        size_t k = total - off < CA_NAME_PER_PKT ? total - off : CA_NAME_PER_PKT;
        p.h.magic = CA_PKT_MAGIC;
        p.h.type = CA_PKT_NAME;
        p.h.n = (uint16_t)k;
        p.h.pid = my_pid;
        p.h.len = (uint32_t)(sizeof(p.n) + k);
        p.n.id = id;
        p.n.space = space;
        p.n.offset = (uint32_t)off;
        p.n.total = (uint32_t)total;
        memcpy(p.text, s + off, k);
        send_packet(&p, sizeof(p.h) + p.h.len);
        off += k;
    } while (off < total);
}

/* Kernel names interned by content (FNV-1a 64), open addressing; id 0 is "no name". */
static struct name_slot { uint64_t h; uint32_t id; } *names;
static size_t names_cap, names_used;
static uint32_t next_name_id = 1;

static uint64_t fnv(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h ? h : 1;
}

static int names_grow_locked(void)
{
    size_t cap = names_cap ? names_cap * 2 : 4096;
    struct name_slot *t = calloc(cap, sizeof(*t));
    if (!t)
        return -1;
    for (size_t i = 0; i < names_cap; i++) {
        if (!names[i].h)
            continue;
        size_t j = names[i].h & (cap - 1);
        while (t[j].h)
            j = (j + 1) & (cap - 1);
        t[j] = names[i];
    }
    free(names);
    names = t;
    names_cap = cap;
    return 0;
}

static uint32_t intern_locked(const char *s)
{
    if (!s)
        return 0;
    if (names_used * 2 >= names_cap && names_grow_locked() < 0)
        return 0;
    uint64_t h = fnv(s);
    size_t j = h & (names_cap - 1);
    while (names[j].h) {
        if (names[j].h == h)
            return names[j].id;
        j = (j + 1) & (names_cap - 1);
    }
    names[j].h = h;
    names[j].id = next_name_id++;
    names_used++;
    send_name_locked(CA_NAME_KERNEL, names[j].id, s);
    return names[j].id;
}

static uint64_t dims(int32_t x, int32_t y, int32_t z)
{
    return (uint64_t)(uint32_t)x | (uint64_t)(uint16_t)y << 32 | (uint64_t)(uint16_t)z << 48;
}

/* --- activity buffers -------------------------------------------------------------- */
static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, BUF_BYTES);
    *size = *buffer ? BUF_BYTES : 0;
    *max_records = 0;
}

/* The fields every activity record kind used here has, by the same names. */
#define CA_COMMON(o, r) do { \
        (o).start = (r)->start; (o).end = (r)->end; (o).corr = (r)->correlationId; \
        (o).device = (r)->deviceId; (o).stream = (r)->streamId; (o).context = (r)->contextId; \
    } while (0)

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t *buffer,
                                      size_t size, size_t valid)
{
    CUpti_Activity *rec = NULL;
    (void)size;
    pthread_mutex_lock(&lock);
    while (valid && cu.ActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        struct ca_gpu_rec o;
        memset(&o, 0, sizeof(o));
        o.flags = ts_flags;
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
            rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const ca_kernel_t *k = (const ca_kernel_t *)rec;
            o.kind = CA_GK_KERNEL;
            CA_COMMON(o, k);
            o.grid = dims(k->gridX, k->gridY, k->gridZ);
            o.block = dims(k->blockX, k->blockY, k->blockZ);
            o.shmem = (uint32_t)(k->staticSharedMemory + k->dynamicSharedMemory);
            o.name = intern_locked(k->name);
            o.value = k->graphNodeId;        /* 0 and 0: not launched from a graph */
            o.aux = k->graphId;
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const ca_memcpy_t *m = (const ca_memcpy_t *)rec;
            o.kind = CA_GK_MEMCPY;
            CA_COMMON(o, m);
            o.value = m->bytes;
            o.aux = m->copyKind | (uint32_t)m->srcKind << 8 | (uint32_t)m->dstKind << 16;
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_GRAPH_TRACE) {
            const CUpti_ActivityGraphTrace2 *g = (const CUpti_ActivityGraphTrace2 *)rec;
            o.kind = CA_GK_GRAPH;
            CA_COMMON(o, g);
            o.aux = g->graphId;
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const ca_memset_t *m = (const ca_memset_t *)rec;
            o.kind = CA_GK_MEMSET;
            CA_COMMON(o, m);
            o.value = m->bytes;
            o.aux = m->value;
        } else {
            continue;
        }
        put_locked(&o);
    }
    size_t dropped = 0;
    if (cu.ActivityGetNumDroppedRecords(ctx, stream_id, &dropped) == CUPTI_SUCCESS && dropped) {
        struct ca_gpu_rec o = mark_now(CA_GK_DROPPED, dropped);
        o.stream = stream_id;
        put_locked(&o);
    }
    pthread_mutex_unlock(&lock);
    free(buffer);
}

/* --- driver calls that start GPU work ---------------------------------------------- */
static __thread uint64_t tl_enter;
static __thread uint32_t tl_tid;
static uint32_t api_name_sent[CUPTI_DRIVER_TRACE_CBID_SIZE + 1];

static void device_record_ordinal(uint32_t ordinal)
{
    CUdevice dev;
    CUuuid uuid;
    struct ca_gpu_rec o;
    memset(&o, 0, sizeof(o));
    o.kind = CA_GK_DEVICE;
    o.start = mono_ns();
    o.device = ordinal;
    if (p_cuDeviceGet && p_cuDeviceGetUuid && p_cuDeviceGet(&dev, (int)ordinal) == CUDA_SUCCESS &&
        p_cuDeviceGetUuid(&uuid, dev) == CUDA_SUCCESS) {
        memcpy(&o.grid, uuid.bytes, 8);
        memcpy(&o.block, uuid.bytes + 8, 8);
        o.aux = 1;
    }
    put(&o);
}

static void device_record(CUcontext ctx)
{
    uint32_t ordinal;
    if (ctx && cu.GetDeviceId(ctx, &ordinal) == CUPTI_SUCCESS)
        device_record_ordinal(ordinal);
}

static void CUPTIAPI on_callback(void *ud, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                 const void *data)
{
    (void)ud;
    if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
        if (cbid == CUPTI_CBID_RESOURCE_CONTEXT_CREATED)
            device_record(((const CUpti_ResourceData *)data)->context);
        return;
    }
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API || dead)
        return;
    const CUpti_CallbackData *cb = data;
    if (cb->callbackSite == CUPTI_API_ENTER) {
        tl_enter = mono_ns();
        return;
    }
    struct ca_gpu_rec o;
    memset(&o, 0, sizeof(o));
    o.kind = CA_GK_API;
    o.end = mono_ns();
    o.start = tl_enter;
    if (!tl_tid)
        tl_tid = (uint32_t)syscall(SYS_gettid);
    o.tid = tl_tid;
    o.corr = cb->correlationId;
    o.aux = cbid;
    if (cb->functionReturnValue)
        o.value = (uint64_t)*(const CUresult *)cb->functionReturnValue;
    pthread_mutex_lock(&lock);
    if (cbid <= CUPTI_DRIVER_TRACE_CBID_SIZE && !api_name_sent[cbid] && cb->functionName) {
        api_name_sent[cbid] = 1;
        send_name_locked(CA_NAME_API, cbid, cb->functionName);
    }
    o.name = cbid;
    put_locked(&o);
    pthread_mutex_unlock(&lock);
}

/* Launches, copies, memsets, graph launches: the driver calls whose work CUPTI records. */
static int starts_gpu_work(const char *name)
{
    static const char *const prefixes[] = {"cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch"};
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(*prefixes); i++)
        if (!strncmp(name, prefixes[i], strlen(prefixes[i])))
            return 1;
    return 0;
}

/* --- what is collected: CA_MODE_* bits, switched at run time ----------------------- */
static uint32_t mode_now;                /* what is enabled */
static const char *ctl_path;             /* CLOCKALIGN_CUPTI_CTL */
static int api_enabled_ids[CUPTI_DRIVER_TRACE_CBID_SIZE];

static CUptiResult set_kind(CUpti_ActivityKind k, int on)
{
    return on ? cu.ActivityEnable(k) : cu.ActivityDisable(k);
}

/* Switch collection to `want`; returns what is on afterwards (a kind CUPTI refused stays
 * off, and says so once on stderr). */
static uint32_t apply_mode(uint32_t want)
{
    static const struct { uint32_t bit; CUpti_ActivityKind kind; } kinds[] = {
        {CA_MODE_KERNEL, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL},
        {CA_MODE_MEMCPY, CUPTI_ACTIVITY_KIND_MEMCPY},
        {CA_MODE_MEMSET, CUPTI_ACTIVITY_KIND_MEMSET},
        {CA_MODE_GRAPH, CUPTI_ACTIVITY_KIND_GRAPH_TRACE},
    };
    if (want & CA_MODE_GRAPH)
        want &= ~(uint32_t)CA_MODE_KERNEL;       /* CUPTI takes one or the other */
    /* switch off first: graph-level and kernel-level tracing exclude each other */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < sizeof(kinds) / sizeof(*kinds); i++) {
            uint32_t bit = kinds[i].bit;
            int on = !!(want & bit), was = !!(mode_now & bit);
            if (on == was || on != pass)
                continue;
            CUptiResult r = set_kind(kinds[i].kind, on);
            if (r == CUPTI_SUCCESS) {
                mode_now ^= bit;
            } else {
                const char *why = "?";
                cu.GetResultString(r, &why);
                fprintf(stderr, "clockalign-cupti: activity kind %d could not be switched %s: "
                        "%s\n", (int)kinds[i].kind, on ? "on" : "off", why);
            }
        }
    }
    if (!!(want & CA_MODE_API) != !!(mode_now & CA_MODE_API)) {
        uint32_t on = !!(want & CA_MODE_API);
        for (uint32_t id = 1; id < CUPTI_DRIVER_TRACE_CBID_SIZE; id++)
            if (api_enabled_ids[id])
                cu.EnableCallback(on, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id);
        mode_now ^= CA_MODE_API;
    }
    struct ca_gpu_rec o = mark_now(CA_GK_MODE, mode_now);
    o.aux = want;
    put(&o);
    return mode_now;
}

static uint32_t parse_mode(const char *s, uint32_t dflt)
{
    char *end;
    if (!s || !*s)
        return dflt;
    unsigned long v = strtoul(s, &end, 0);
    return end == s ? dflt : (uint32_t)v;
}

/* The control file's word, if it changed since the last look (else keep what is on). */
static void poll_ctl(void)
{
    static char last[32];
    char buf[32] = {0};
    if (!ctl_path)
        return;
    int fd = open(ctl_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0 || !strcmp(buf, last))
        return;
    memcpy(last, buf, sizeof(last));
    apply_mode(parse_mode(buf, mode_now));
}

/* --- clock sandwiches, periodic flush, exit --------------------------------------- */
static void clock_record(void)
{
    struct ca_gpu_rec o;
    uint64_t ts = 0;
    memset(&o, 0, sizeof(o));
    o.kind = CA_GK_CLOCK;
    o.flags = ts_flags;
    o.start = mono_ns();
    cu.GetTimestamp(&ts);
    o.end = mono_ns();
    o.value = ts;
    put(&o);
}

static void flush_all(uint32_t flag)
{
    cu.ActivityFlushAll(flag);
    pthread_mutex_lock(&lock);
    flush_stage_locked();
    pthread_mutex_unlock(&lock);
}

/* The flusher must be out of CUPTI before the process exits: at exit, libcupti's own
 * destructors (registered when it was loaded, so run after at_exit) would otherwise race
 * with a flush in progress. */
static pthread_t flusher_thread;
static int flusher_running, flusher_stop;
static pthread_mutex_t flusher_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t flusher_cv = PTHREAD_COND_INITIALIZER;

static void flush_loop(void)
{
    unsigned n = 0;
    pthread_mutex_lock(&flusher_mu);
    while (!flusher_stop && !dead) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += FLUSH_NS;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&flusher_cv, &flusher_mu, &until);
        if (flusher_stop)
            break;
        pthread_mutex_unlock(&flusher_mu);
        if (++n % CLOCK_EVERY == 0)
            clock_record();
        poll_ctl();
        flush_all(0);
        pthread_mutex_lock(&flusher_mu);
    }
    pthread_mutex_unlock(&flusher_mu);
}

/* The library's threads take no signal of the target's. */
static void block_signals(void)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
}

static void *flusher(void *arg)
{
    (void)arg;
    block_signals();
    flush_loop();
    return NULL;
}

static void live_stop_and_wait(void);

static void at_exit(void)
{
    if (live) {
        live_stop_and_wait();
        return;
    }
    if (flusher_running) {
        pthread_mutex_lock(&flusher_mu);
        flusher_stop = 1;
        pthread_cond_signal(&flusher_cv);
        pthread_mutex_unlock(&flusher_mu);
        pthread_join(flusher_thread, NULL);
        flusher_running = 0;
    }
    if (dead)
        return;
    clock_record();
    flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

static int resolve(void *h, const char *lib)
{
#define SYM(field, name) \
    if (!(*(void **)&cu.field = dlsym(h, name))) \
        return fail(CA_FAIL_LIB, "%s has no %s", lib, name);
    SYM(ActivityEnable, "cuptiActivityEnable")
    SYM(ActivityDisable, "cuptiActivityDisable")
    SYM(ActivityRegisterCallbacks, "cuptiActivityRegisterCallbacks")
    SYM(ActivityGetNextRecord, "cuptiActivityGetNextRecord")
    SYM(ActivityFlushAll, "cuptiActivityFlushAll")
    SYM(ActivityGetNumDroppedRecords, "cuptiActivityGetNumDroppedRecords")
    SYM(Subscribe, "cuptiSubscribe")
    SYM(Unsubscribe, "cuptiUnsubscribe")
    SYM(EnableCallback, "cuptiEnableCallback")
    SYM(GetCallbackName, "cuptiGetCallbackName")
    SYM(GetTimestamp, "cuptiGetTimestamp")
    SYM(GetDeviceId, "cuptiGetDeviceId")
    SYM(GetVersion, "cuptiGetVersion")
    SYM(GetResultString, "cuptiGetResultString")
#undef SYM
    *(void **)&cu.ActivityEnableRawTimestamps = dlsym(h, "cuptiActivityEnableRawTimestamps");
    return 0;
}

/* libcupti loaded, raw timestamps asked for, activity buffers and callbacks registered,
 * collection switched on: shared by both ways in.  Returns 0 or a CA_FAIL_* code (the
 * reason in ca_cupti_live.error). */
static int setup(const char *lib, const char *raw_env, const char *mode)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        return fail(CA_FAIL_LIB, "cannot load %s: %s", lib, dlerror());
    if (resolve(h, lib))
        return CA_FAIL_LIB;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (cuda) {
        *(void **)&p_cuDeviceGet = dlsym(cuda, "cuDeviceGet");
        *(void **)&p_cuDeviceGetCount = dlsym(cuda, "cuDeviceGetCount");
        *(void **)&p_cuDeviceGetUuid = dlsym(cuda, "cuDeviceGetUuid_v2");
        if (!p_cuDeviceGetUuid)
            *(void **)&p_cuDeviceGetUuid = dlsym(cuda, "cuDeviceGetUuid");
    }
    struct ca_gpu_rec info;
    memset(&info, 0, sizeof(info));
    info.kind = CA_GK_INFO;
    info.start = mono_ns();
    uint32_t version = 0;
    cu.GetVersion(&version);
    ca_cupti_live.cupti_version = version;
    info.value = version;
    info.aux = CA_RAW_NOT_ASKED;
    if (!raw_env || strcmp(raw_env, "0")) {
        if (!cu.ActivityEnableRawTimestamps) {
            info.aux = CA_RAW_NOT_EXPORTED;
        } else if (cu.ActivityEnableRawTimestamps(1) != CUPTI_SUCCESS) {
            info.aux = CA_RAW_FAILED;
        } else {
            info.aux = CA_RAW_ON;
            ts_flags = CA_F_RAW;
        }
    }
    info.flags = ts_flags;
    CUptiResult r;
    if ((r = cu.ActivityRegisterCallbacks(buffer_requested, buffer_completed)) != CUPTI_SUCCESS)
        return warn("cuptiActivityRegisterCallbacks", r);
    if ((r = cu.Subscribe(&subscriber, on_callback, NULL)) != CUPTI_SUCCESS)
        return warn("cuptiSubscribe (is another CUPTI client, e.g. a profiler, attached?)", r);
    cu.EnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_CREATED);
    for (uint32_t id = 1; id < CUPTI_DRIVER_TRACE_CBID_SIZE; id++) {
        const char *name = NULL;
        api_enabled_ids[id] = cu.GetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, id, &name) ==
                              CUPTI_SUCCESS && name && starts_gpu_work(name);
    }
    put(&info);
    apply_mode(parse_mode(mode, CA_MODE_KERNEL | CA_MODE_MEMCPY | CA_MODE_MEMSET | CA_MODE_API));
    return 0;
}

static int open_fifo(const char *path)
{
    fifo = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fifo < 0)
        return fail(CA_FAIL_FIFO, "cannot open %s: %s", path, strerror(errno));
    fcntl(fifo, F_SETFL, fcntl(fifo, F_GETFL) & ~O_NONBLOCK);
    return 0;
}

static void close_fifo(void)
{
    pthread_mutex_lock(&lock);
    if (fifo >= 0)
        close(fifo);
    fifo = -1;
    pthread_mutex_unlock(&lock);
}

static int spawn_started;

__attribute__((visibility("default"))) int InitializeInjection(void)
{
    if (spawn_started++ || live)
        return 1;
    const char *path = getenv("CLOCKALIGN_CUPTI_FIFO");
    const char *lib = getenv("CLOCKALIGN_CUPTI_LIB");
    if (!path || !lib) {
        fprintf(stderr, "clockalign-cupti: CLOCKALIGN_CUPTI_FIFO and CLOCKALIGN_CUPTI_LIB must "
                        "be set (this library is loaded by clockalign record --gpu-activity)\n");
        return 1;
    }
    my_pid = (uint32_t)getpid();
    if (open_fifo(path))
        return 1;
    if (setup(lib, getenv("CLOCKALIGN_CUPTI_RAW"), getenv("CLOCKALIGN_CUPTI_MODE"))) {
        close_fifo();
        return 1;
    }
    ctl_path = getenv("CLOCKALIGN_CUPTI_CTL");
    poll_ctl();
    clock_record();
    flusher_running = pthread_create(&flusher_thread, NULL, flusher, NULL) == 0;
    atexit(at_exit);
    return 1;
}

/* --- live attach: loaded into a running process by record --pid --gpu-activity --- */
static struct { char fifo[512], lib[512], raw[8], mode[32], pid[16]; } conf;

static void conf_value(const char *text, const char *key, char *out, size_t cap)
{
    size_t k = strlen(key);
    out[0] = 0;
    const char *nl;
    for (const char *line = text; line && *line; line = (nl = strchr(line, '\n')) ? nl + 1 : NULL) {
        if (strncmp(line, key, k) || line[k] != '=')
            continue;
        const char *v = line + k + 1, *end = strchr(v, '\n');
        size_t n = end ? (size_t)(end - v) : strlen(v);
        if (n >= cap)
            n = cap - 1;
        memcpy(out, v, n);
        out[n] = 0;
        return;
    }
}

/* Everything that leaves the process as it was: activity and callbacks off, what was
 * collected flushed, the subscription given back, the FIFO closed.  The activity buffer
 * callbacks stay registered with CUPTI (there is no unregistering), so the library stays
 * loaded: inert, with no thread. */
static void teardown(void)
{
    apply_mode(0);
    cu.EnableCallback(0, subscriber, CUPTI_CB_DOMAIN_RESOURCE,
                      CUPTI_CBID_RESOURCE_CONTEXT_CREATED);
    clock_record();
    flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    cu.Unsubscribe(subscriber);
    close_fifo();
    pthread_mutex_lock(&lock);
    free(names);
    names = NULL;
    names_cap = names_used = 0;
    next_name_id = 1;
    memset(api_name_sent, 0, sizeof(api_name_sent));
    staged = 0;
    pthread_mutex_unlock(&lock);
}

static void *live_main(void *arg)
{
    (void)arg;
    block_signals();
    ca_cupti_live.tid = (uint32_t)syscall(SYS_gettid);
    if (setup(conf.lib, conf.raw, conf.mode[0] ? conf.mode : NULL)) {
        if (cu.Unsubscribe && ca_cupti_live.failure == CA_FAIL_CUPTI)
            cu.Unsubscribe(subscriber);
        close_fifo();
        ca_cupti_live.tid = 0;
        __atomic_store_n(&ca_cupti_live.state, CA_LIVE_FAILED, __ATOMIC_RELEASE);
        return NULL;
    }
    if (p_cuDeviceGetCount) {         /* contexts made before the attach: no callback told */
        int count = 0;
        if (p_cuDeviceGetCount(&count) == CUDA_SUCCESS)
            for (int i = 0; i < count; i++)
                device_record_ordinal((uint32_t)i);
    }
    clock_record();
    __atomic_store_n(&ca_cupti_live.state, CA_LIVE_RUNNING, __ATOMIC_RELEASE);
    flush_loop();
    __atomic_store_n(&ca_cupti_live.state, CA_LIVE_STOPPING, __ATOMIC_RELEASE);
    teardown();
    ca_cupti_live.tid = 0;
    __atomic_store_n(&ca_cupti_live.state, CA_LIVE_STOPPED, __ATOMIC_RELEASE);
    return NULL;
}

/* Called by the recorder on a hijacked thread of the target: it returns at once (that
 * thread may hold a CUDA lock CUPTI's calls need); the library's own thread starts CUPTI.
 * Returns 0 or a CA_FAIL_* code. */
__attribute__((visibility("default"))) int ca_cupti_attach(const char *settings)
{
    static int atexit_done;
    int st = __atomic_load_n(&ca_cupti_live.state, __ATOMIC_ACQUIRE);
    if (spawn_started || (st >= CA_LIVE_STARTING && st <= CA_LIVE_STOPPING))
        return CA_FAIL_BUSY;
    live = 1;
    ca_cupti_live.failure = CA_FAIL_NONE;
    ca_cupti_live.error[0] = 0;
    conf_value(settings, "fifo", conf.fifo, sizeof(conf.fifo));
    conf_value(settings, "lib", conf.lib, sizeof(conf.lib));
    conf_value(settings, "raw", conf.raw, sizeof(conf.raw));
    conf_value(settings, "mode", conf.mode, sizeof(conf.mode));
    conf_value(settings, "pid", conf.pid, sizeof(conf.pid));   /* the host's, not a container's */
    ca_cupti_live.state = CA_LIVE_FAILED;
    if (!conf.fifo[0] || !conf.lib[0])
        return fail(CA_FAIL_CONF, "the settings name no fifo or no lib");
    my_pid = conf.pid[0] ? (uint32_t)strtoul(conf.pid, NULL, 10) : (uint32_t)getpid();
    dead = 0;
    flusher_stop = 0;
    if (open_fifo(conf.fifo))
        return CA_FAIL_FIFO;
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    ca_cupti_live.state = CA_LIVE_STARTING;
    int e = pthread_create(&t, &attr, live_main, NULL);
    pthread_attr_destroy(&attr);
    if (e) {
        ca_cupti_live.state = CA_LIVE_FAILED;
        close_fifo();
        return fail(CA_FAIL_THREAD, "cannot start the library's thread: %s", strerror(e));
    }
    if (!atexit_done++)
        atexit(at_exit);
    return 0;
}

/* Asks the library's thread to turn everything off and exit (ca_cupti_live.state becomes
 * CA_LIVE_STOPPED).  Returns at once with the state it found. */
__attribute__((visibility("default"))) int ca_cupti_detach(void)
{
    int st = __atomic_load_n(&ca_cupti_live.state, __ATOMIC_ACQUIRE);
    if (st == CA_LIVE_STARTING || st == CA_LIVE_RUNNING) {
        pthread_mutex_lock(&flusher_mu);
        flusher_stop = 1;
        pthread_cond_signal(&flusher_cv);
        pthread_mutex_unlock(&flusher_mu);
    }
    return st;
}

/* At the target's exit while attached: the thread must be out of CUPTI first. */
static void live_stop_and_wait(void)
{
    ca_cupti_detach();
    for (int i = 0; i < 2000; i++) {
        int st = __atomic_load_n(&ca_cupti_live.state, __ATOMIC_ACQUIRE);
        if (st != CA_LIVE_STARTING && st != CA_LIVE_RUNNING && st != CA_LIVE_STOPPING)
            return;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
}
