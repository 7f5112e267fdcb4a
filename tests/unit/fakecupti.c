/*
 * A stand-in libcupti for testing the injection library (native/ca_cupti.c) with no GPU:
 * the same entry points, compiled against the real CUPTI headers (so record layouts
 * match), driven by fake_run(n) which plays n kernel launches (+ one memcpy and one memset):
 * driver-API callbacks at entry/exit on the calling thread, then activity records handed
 * over at the next cuptiActivityFlushAll.  -DNO_RAW leaves out
 * cuptiActivityEnableRawTimestamps, as an old libcupti would.
 */
#define _GNU_SOURCE
#pragma GCC visibility push(default)   /* built with -fvisibility=hidden */
#include <cupti.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if CUPTI_API_VERSION >= 130000
typedef CUpti_ActivityKernel10 k_t;
typedef CUpti_ActivityMemcpy6 c_t;
#else
typedef CUpti_ActivityKernel9 k_t;
typedef CUpti_ActivityMemcpy5 c_t;
#endif
typedef CUpti_ActivityMemset4 s_t;

static CUpti_BuffersCallbackRequestFunc req;
static CUpti_BuffersCallbackCompleteFunc done;
static CUpti_CallbackFunc cb;
static int enabled[1024];
static int raw;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *pend;
static size_t pend_len, pend_cap;
static const char *names[] = {"k_fake0", "k_fake1", "k_fake2"};

#define CB_LAUNCH 13
#define CB_COPY 20
#define CB_MEMSET 21
#define CB_SYNC 30

static int kind_on[64];    /* activity kinds enabled: fake_run queues only those */
CUptiResult cuptiActivityEnable(CUpti_ActivityKind k)
{
    if (k == CUPTI_ACTIVITY_KIND_GRAPH_TRACE && kind_on[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL])
        return CUPTI_ERROR_NOT_COMPATIBLE;     /* as the real one: graph or kernel level */
    kind_on[k & 63] = 1;
    return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityDisable(CUpti_ActivityKind k) { kind_on[k & 63] = 0; return CUPTI_SUCCESS; }
CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc r,
                                           CUpti_BuffersCallbackCompleteFunc d)
{
    req = r;
    done = d;
    return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityGetNextRecord(uint8_t *buf, size_t valid, CUpti_Activity **rec)
{
    uint8_t *p = *rec ? (uint8_t *)*rec : buf;
    if (*rec) {
        CUpti_ActivityKind k = (*rec)->kind;
        p += k == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ? sizeof(k_t)
           : k == CUPTI_ACTIVITY_KIND_MEMCPY ? sizeof(c_t) : sizeof(s_t);
    }
    if ((size_t)(p - buf) >= valid)
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *rec = (CUpti_Activity *)p;
    return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityFlushAll(uint32_t flag)
{
    (void)flag;
    pthread_mutex_lock(&mu);
    if (!pend_len) {
        pthread_mutex_unlock(&mu);
        return CUPTI_SUCCESS;
    }
    uint8_t *b;
    size_t size, maxr;
    req(&b, &size, &maxr);
    size_t n = pend_len < size ? pend_len : size;
    memcpy(b, pend, n);
    pend_len = 0;
    pthread_mutex_unlock(&mu);
    done(NULL, 0, b, size, n);
    return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext c, uint32_t s, size_t *d)
{
    (void)c; (void)s;
    *d = 0;
    return CUPTI_SUCCESS;
}
#ifndef NO_RAW
CUptiResult cuptiActivityEnableRawTimestamps(uint8_t on) { raw = on; return CUPTI_SUCCESS; }
#endif
static int taken;          /* fake_take_subscription(): as when a profiler holds it */
CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *h, CUpti_CallbackFunc f, void *u)
{
    (void)u;
    if (taken || cb)
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    *h = (CUpti_SubscriberHandle)1;
    cb = f;
    return CUPTI_SUCCESS;
}
CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle h)
{
    (void)h;
    cb = NULL;
    memset(enabled, 0, sizeof(enabled));
    return CUPTI_SUCCESS;
}
CUptiResult cuptiEnableCallback(uint32_t on, CUpti_SubscriberHandle h, CUpti_CallbackDomain d,
                                CUpti_CallbackId id)
{
    (void)h;
    if (d == CUPTI_CB_DOMAIN_DRIVER_API && id < 1024)
        enabled[id] = on;
    return CUPTI_SUCCESS;
}
CUptiResult cuptiGetCallbackName(CUpti_CallbackDomain d, uint32_t id, const char **name)
{
    (void)d;
    *name = id == CB_LAUNCH ? "cuLaunchKernel" : id == CB_COPY ? "cuMemcpyHtoD_v2"
          : id == CB_MEMSET ? "cuMemsetD8Async" : id == CB_SYNC ? "cuCtxSynchronize" : "cuOther";
    return CUPTI_SUCCESS;
}
static uint64_t now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
CUptiResult cuptiGetTimestamp(uint64_t *t) { *t = now() + 5000000; return CUPTI_SUCCESS; }
CUptiResult cuptiGetDeviceId(CUcontext c, uint32_t *id) { (void)c; *id = 0; return CUPTI_SUCCESS; }
CUptiResult cuptiGetVersion(uint32_t *v) { *v = CUPTI_API_VERSION; return CUPTI_SUCCESS; }
CUptiResult cuptiGetResultString(CUptiResult r, const char **s) { (void)r; *s = "fake"; return CUPTI_SUCCESS; }

static void queue(const void *rec, size_t len)
{
    if (!kind_on[((const CUpti_Activity *)rec)->kind & 63])
        return;
    pthread_mutex_lock(&mu);
    if (pend_len + len > pend_cap) {
        pend_cap = (pend_cap + len) * 2;
        pend = realloc(pend, pend_cap);
    }
    memcpy(pend + pend_len, rec, len);
    pend_len += len;
    pthread_mutex_unlock(&mu);
}

static void call(uint32_t cbid, uint32_t corr)
{
    CUpti_CallbackData d;
    CUresult ret = CUDA_SUCCESS;
    memset(&d, 0, sizeof(d));
    d.correlationId = corr;
    d.functionName = cbid == CB_LAUNCH ? "cuLaunchKernel" : cbid == CB_COPY ? "cuMemcpyHtoD_v2"
                   : "cuMemsetD8Async";
    d.functionReturnValue = &ret;
    CUpti_CallbackFunc f = cb;     /* a live detach may unsubscribe meanwhile */
    if (!enabled[cbid] || !f)
        return;
    d.callbackSite = CUPTI_API_ENTER;
    f(NULL, CUPTI_CB_DOMAIN_DRIVER_API, cbid, &d);
    d.callbackSite = CUPTI_API_EXIT;
    f(NULL, CUPTI_CB_DOMAIN_DRIVER_API, cbid, &d);
}

#define FAKE_TIMES(r, k, t0, t1, corr) do { \
        (r).kind = (k); (r).start = (t0); (r).end = (t1); (r).streamId = 7; \
        (r).correlationId = (uint32_t)(corr); \
    } while (0)

/* n launches, one copy, one memset; returns 1 if the sync callback was (wrongly) enabled,
 * -1 (and does nothing) while no one is subscribed (before a live attach, after its end) */
int fake_run(int n)
{
    CUpti_CallbackFunc f = cb;
    if (!f)
        return -1;
    CUpti_ResourceData rd;
    memset(&rd, 0, sizeof(rd));
    rd.context = (CUcontext)1;
    f(NULL, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_CREATED, &rd);
    uint64_t t = 1000000;
    for (int i = 0; i < n; i++) {
        call(CB_LAUNCH, (uint32_t)i + 1);
        k_t k;
        memset(&k, 0, sizeof(k));
        k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
        k.start = t;
        k.end = t + 1000 + (uint64_t)i;
        k.deviceId = 0;
        k.streamId = 7;
        k.correlationId = (uint32_t)i + 1;
        k.gridX = 2 + i; k.gridY = 1; k.gridZ = 1;
        k.blockX = 128; k.blockY = 1; k.blockZ = 1;
        k.staticSharedMemory = 16; k.dynamicSharedMemory = 32;
        k.name = names[i % 3];
        if (i >= n - 4) {           /* the last four: one graph of two nodes, replayed twice */
            k.graphId = 77;
            k.graphNodeId = 0x100000000ull + (uint64_t)(i % 2);
        }
        queue(&k, sizeof(k));
        t += 2000;
    }
    call(CB_COPY, (uint32_t)n + 1);
    c_t c;
    memset(&c, 0, sizeof(c));
    FAKE_TIMES(c, CUPTI_ACTIVITY_KIND_MEMCPY, t, t + 500, n + 1);
    c.copyKind = 1;
    c.bytes = 4096;
    queue(&c, sizeof(c));
    call(CB_MEMSET, (uint32_t)n + 2);
    s_t s;
    memset(&s, 0, sizeof(s));
    FAKE_TIMES(s, CUPTI_ACTIVITY_KIND_MEMSET, t + 600, t + 700, n + 2);
    s.bytes = 65536;
    s.value = 7;
    queue(&s, sizeof(s));
    return enabled[CB_SYNC];
}

/* One launch as a libcuda's cuLaunchKernel would make it, from inside that call: the
 * callbacks around it on this thread, and its kernel record stamped like cuptiGetTimestamp
 * (converted time) a microsecond after it.  -1 while no one is subscribed. */
int fake_launch(uint32_t corr)
{
    if (!cb)
        return -1;
    call(CB_LAUNCH, corr);
    k_t k;
    memset(&k, 0, sizeof(k));
    k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    k.start = now() + 5000000 + 1000;
    k.end = k.start + 2000;
    k.streamId = 7;
    k.correlationId = corr;
    k.gridX = k.gridY = k.gridZ = k.blockX = k.blockY = k.blockZ = 1;
    k.name = names[0];
    queue(&k, sizeof(k));
    return 0;
}

int fake_raw(void) { return raw; }
int fake_subscribed(void) { return cb != NULL; }
void fake_take_subscription(void) { taken = 1; }
int fake_kind_on(int k) { return kind_on[k & 63]; }
