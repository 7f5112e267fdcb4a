/* Known-count workload for the integration tests, calling the (fake) CUDA driver API from
 * two threads, then connect() to a listener and to a closed port, then a known sleep.
 *
 *   target [--wait] [--dlopen] [--connect PORT_OPEN PORT_CLOSED] [--sleep-ms N] [--exit N]
 *           [--hang-ms N] [--burst N] [--sticky N] [--no-sweep] [--getpwuid]
 *           [--connect-unix PATH] [--deinit N]
 * --no-sweep: leave out the sweep after the main part (the kernel lookups before it stay).
 * --getpwuid: look the user up as glibc does (it asks nscd's socket first: ENOENT where no
 *   nscd runs).  --connect-unix PATH: connect() to a unix socket at PATH (after --connect).
 * --deinit N: from an exit handler that runs after the stand-in driver's own, N
 *   cuModuleUnload, N cuLibraryUnload and one cuMemFree_v2, each CUDA_ERROR_DEINITIALIZED
 *   (a runtime unloading its modules while the process exits).
 * --wait: block until a line arrives on stdin (the test attaches the recorder first).
 * --dlopen: load libcuda.so.1 only after the wait, like `import torch` does.
 * Counts: 23 launches (12 cuLaunchKernel on thread A, 11 cuLaunchKernelEx on thread B),
 * 5 cuMemAlloc_v2 of which 2 return OUT_OF_MEMORY, 3 cuMemFree_v2, 2 HtoD, 2 DtoH,
 * 1 cuMemcpyAsync, 2 cuStreamSynchronize, 1 cuCtxSynchronize, 1 cuEventSynchronize;
 * --burst N adds N cuLaunchKernel on the main thread (func 0x3000); --sticky N adds N
 * cuLaunchKernel of func 0xdead after them, each returning 700 (ILLEGAL_ADDRESS).
 * The sweep: first the kernel lookups, then, after the main part, every other traced function (store/cuda_api.py) N_<symbol> times on the
 * main thread (counts: cuda_ids.h, from standin.SWEEP_CALLS), call i passing the
 * arguments standin.expected_call() predicts: V(sym, n) = id << 20 | n << 12 | i for
 * parameter n, with chosen failures (allocations of 2 TiB on every third call, a "bad"
 * image or a missing file on every fourth, the kernel name "missing" on every fifth, a NULL
 * unload on every fourth, cuMemSetAccess of 0 descriptors on every third). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cuda_ids.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;

static CUresult (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                          unsigned, void *, void **, void **);
static CUresult (*launch_ex)(const CUlaunchConfig *, void *, void **, void **);
static CUresult (*mem_alloc)(CUdeviceptr *, size_t);
static CUresult (*mem_free)(CUdeviceptr);
static CUresult (*htod)(CUdeviceptr, const void *, size_t);
static CUresult (*dtoh)(void *, CUdeviceptr, size_t);
static CUresult (*cpy_async)(CUdeviceptr, CUdeviceptr, size_t, void *);
static CUresult (*stream_sync)(void *);
static CUresult (*ctx_sync)(void);
static CUresult (*event_sync)(void *);

static long tid_a, tid_b;
static void *lib;

static void *need(const char *sym) {
    void *p = dlsym(lib, sym);
    if (!p) { fprintf(stderr, "libcuda.so.1 lacks %s\n", sym); exit(3); }
    return p;
}

static void load(void) {
    void *h = lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); exit(3); }
#define SYM(v, n) *(void **)&v = dlsym(h, n)
    SYM(launch, "cuLaunchKernel"); SYM(launch_ex, "cuLaunchKernelEx");
    SYM(mem_alloc, "cuMemAlloc_v2"); SYM(mem_free, "cuMemFree_v2");
    SYM(htod, "cuMemcpyHtoD_v2"); SYM(dtoh, "cuMemcpyDtoH_v2");
    SYM(cpy_async, "cuMemcpyAsync"); SYM(stream_sync, "cuStreamSynchronize");
    SYM(ctx_sync, "cuCtxSynchronize"); SYM(event_sync, "cuEventSynchronize");
}

static void *thread_a(void *arg) {
    (void)arg;
    tid_a = syscall(SYS_gettid);
    for (int i = 0; i < 12; i++)
        launch((void *)0x1000, 64 + i, 2, 1, 256, 1, 1, 1024, (void *)0x5000, NULL, NULL);
    return NULL;
}

static void *thread_b(void *arg) {
    (void)arg;
    tid_b = syscall(SYS_gettid);
    CUlaunchConfig c = {7, 3, 2, 128, 2, 1, 2048, (void *)0x6000, NULL, 0};
    for (int i = 0; i < 11; i++)
        launch_ex(&c, (void *)0x2000, NULL, NULL);
    return NULL;
}

/* ---------------------------------------------------------------- the sweep */
typedef unsigned long long u64;
typedef struct {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    u64 srcHost, srcDevice, srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    u64 dstHost, dstDevice, dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;
typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    u64 srcHost, srcDevice, srcArray, reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    u64 dstHost, dstDevice, dstArray, reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;
typedef struct {
    int type, requestedHandleTypes;
    struct { int type, id; } location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;

#define V(sym, n) ((((u64)ID_##sym) << 20) | ((u64)(n) << 12) | (u64)i)
#define P(sym, n) ((void *)V(sym, n))
#define U(sym, n) ((unsigned)V(sym, n))
#define D(n) ((unsigned)((n) * 7 + i))
#define BYTES(sym) (i % 3 == 0 ? 2ULL << 40 : V(sym, 2))
#define IMAGE (i % 4 == 1 ? "bad ptx" : "// ptx")
/* a load from a file: missing/<sym>_<i>.cubin on every fourth call (not found), else cache/ */
#define FILE_NAME(buf, sym) \
    snprintf(buf, sizeof buf, "%s/%s_%d.cubin", i % 4 == 1 ? "missing" : "cache", #sym, i)
#define LOOP(sym) for (int i = 0; i < N_##sym; i++)
/* call sym through dlsym with the parameter types of cuda.h */
#define CALL(sym, types, ...) \
    ({ static void *p_; if (!p_) p_ = need(#sym); ((CUresult (*) types)p_)(__VA_ARGS__); })

#define SW_LAUNCH(s) LOOP(s) CALL(s, (void *, unsigned, unsigned, unsigned, unsigned, unsigned, \
    unsigned, unsigned, void *, void **, void **), P(s, 1), D(2), D(3), D(4), D(5), D(6), D(7), \
    U(s, 8), P(s, 9), NULL, NULL)
#define SW_LAUNCH_EX(s) LOOP(s) { \
    CUlaunchConfig c = {D(2), D(3), D(4), D(5), D(6), D(7), U(s, 8), P(s, 9), NULL, 0}; \
    CALL(s, (const CUlaunchConfig *, void *, void **, void **), &c, P(s, 2), NULL, NULL); }
#define SW_P2(s) LOOP(s) CALL(s, (void *, void *), P(s, 1), P(s, 2))
#define SW_P1(s) LOOP(s) CALL(s, (void *), P(s, 1))
#define SW_COPY(s) LOOP(s) CALL(s, (u64, u64, size_t), V(s, 1), V(s, 2), V(s, 3))
#define SW_COPY_ASYNC(s) LOOP(s) CALL(s, (u64, u64, size_t, void *), V(s, 1), V(s, 2), \
    V(s, 3), P(s, 4))
#define SW_PEER(s) LOOP(s) CALL(s, (u64, void *, u64, void *, size_t, void *), V(s, 1), \
    P(s, 2), V(s, 3), P(s, 4), V(s, 5), P(s, 6))
#define SIDES(c, s) \
    c.srcMemoryType = 1 + i % 4; c.dstMemoryType = 1 + (i + 1) % 4; \
    c.srcHost = V(s, 20); c.srcDevice = V(s, 21); c.srcArray = V(s, 22); \
    c.dstHost = V(s, 23); c.dstDevice = V(s, 24); c.dstArray = V(s, 25); \
    c.srcPitch = c.dstPitch = c.srcXInBytes = c.dstXInBytes = V(s, 26); \
    c.WidthInBytes = 16 + i; c.Height = 3
#define SW_2D(s) LOOP(s) { CUDA_MEMCPY2D c = {0}; SIDES(c, s); \
    CALL(s, (const CUDA_MEMCPY2D *), &c); }
#define SW_2D_ASYNC(s) LOOP(s) { CUDA_MEMCPY2D c = {0}; SIDES(c, s); \
    CALL(s, (const CUDA_MEMCPY2D *, void *), &c, P(s, 2)); }
#define SW_3D(s) LOOP(s) { CUDA_MEMCPY3D c = {0}; SIDES(c, s); c.Depth = 2; \
    CALL(s, (const CUDA_MEMCPY3D *), &c); }
#define SW_3D_ASYNC(s) LOOP(s) { CUDA_MEMCPY3D c = {0}; SIDES(c, s); c.Depth = 2; \
    CALL(s, (const CUDA_MEMCPY3D *, void *), &c, P(s, 2)); }
#define SW_MEMSET(s, T) LOOP(s) CALL(s, (u64, T, size_t), V(s, 1), (T)V(s, 2), V(s, 3))
#define SW_MEMSET_ASYNC(s, T) LOOP(s) CALL(s, (u64, T, size_t, void *), V(s, 1), (T)V(s, 2), \
    V(s, 3), P(s, 4))
#define SW_ALLOC_ASYNC(s) LOOP(s) { u64 d; CALL(s, (u64 *, size_t, void *), &d, BYTES(s), \
    P(s, 3)); }
#define SW_ALLOC_POOL(s) LOOP(s) { u64 d; CALL(s, (u64 *, size_t, void *, void *), &d, \
    BYTES(s), P(s, 3), P(s, 4)); }
#define SW_FREE_ASYNC(s) LOOP(s) CALL(s, (u64, void *), V(s, 1), P(s, 2))
#define SW_LOOKUP(s) LOOP(s) { void *f; char name[32]; \
    if (i == 0) strcpy(name, "vector_add"); else if (i == 1) strcpy(name, "gemm_tile"); \
    else if (i % 5 == 4) strcpy(name, "missing"); \
    else snprintf(name, sizeof name, "kernel_%d_%d", ID_##s, i); \
    CALL(s, (void **, void *, const char *), &f, P(s, 2), name); }
#define SW_WAIT(s) LOOP(s) CALL(s, (void *, void *, unsigned), P(s, 1), P(s, 2), U(s, 3))

/* first of all, as a real program must: the handles the threads launch (0x1000, 0x2000) */
static void sweep_lookups(void) {
    SW_LOOKUP(cuModuleGetFunction); SW_LOOKUP(cuLibraryGetKernel);
}

static void sweep(void) {
    SW_LAUNCH(cuLaunchKernel_ptsz);
    SW_LAUNCH_EX(cuLaunchKernelEx_ptsz);
    SW_P2(cuGraphLaunch); SW_P2(cuGraphLaunch_ptsz);
    SW_ALLOC_ASYNC(cuMemAllocAsync); SW_ALLOC_ASYNC(cuMemAllocAsync_ptsz);
    SW_ALLOC_POOL(cuMemAllocFromPoolAsync); SW_ALLOC_POOL(cuMemAllocFromPoolAsync_ptsz);
    SW_FREE_ASYNC(cuMemFreeAsync); SW_FREE_ASYNC(cuMemFreeAsync_ptsz);
    SW_COPY(cuMemcpyHtoD_v2_ptds); SW_COPY(cuMemcpyDtoH_v2_ptds);
    SW_COPY(cuMemcpyDtoD_v2); SW_COPY(cuMemcpyDtoD_v2_ptds);
    SW_COPY(cuMemcpy); SW_COPY(cuMemcpy_ptds);
    SW_COPY_ASYNC(cuMemcpyAsync_ptsz);
    SW_COPY_ASYNC(cuMemcpyHtoDAsync_v2); SW_COPY_ASYNC(cuMemcpyHtoDAsync_v2_ptsz);
    SW_COPY_ASYNC(cuMemcpyDtoHAsync_v2); SW_COPY_ASYNC(cuMemcpyDtoHAsync_v2_ptsz);
    SW_COPY_ASYNC(cuMemcpyDtoDAsync_v2); SW_COPY_ASYNC(cuMemcpyDtoDAsync_v2_ptsz);
    SW_PEER(cuMemcpyPeerAsync); SW_PEER(cuMemcpyPeerAsync_ptsz);
    SW_2D(cuMemcpy2D_v2); SW_2D(cuMemcpy2D_v2_ptds);
    SW_2D_ASYNC(cuMemcpy2DAsync_v2); SW_2D_ASYNC(cuMemcpy2DAsync_v2_ptsz);
    SW_3D(cuMemcpy3D_v2); SW_3D(cuMemcpy3D_v2_ptds);
    SW_3D_ASYNC(cuMemcpy3DAsync_v2); SW_3D_ASYNC(cuMemcpy3DAsync_v2_ptsz);
    SW_MEMSET(cuMemsetD8_v2, unsigned char); SW_MEMSET(cuMemsetD8_v2_ptds, unsigned char);
    SW_MEMSET(cuMemsetD16_v2, unsigned short); SW_MEMSET(cuMemsetD16_v2_ptds, unsigned short);
    SW_MEMSET(cuMemsetD32_v2, unsigned); SW_MEMSET(cuMemsetD32_v2_ptds, unsigned);
    SW_MEMSET_ASYNC(cuMemsetD8Async, unsigned char);
    SW_MEMSET_ASYNC(cuMemsetD8Async_ptsz, unsigned char);
    SW_MEMSET_ASYNC(cuMemsetD16Async, unsigned short);
    SW_MEMSET_ASYNC(cuMemsetD16Async_ptsz, unsigned short);
    SW_MEMSET_ASYNC(cuMemsetD32Async, unsigned);
    SW_MEMSET_ASYNC(cuMemsetD32Async_ptsz, unsigned);
    SW_P1(cuStreamSynchronize_ptsz); SW_P1(cuCtxSynchronize_v2);
    SW_WAIT(cuStreamWaitEvent); SW_WAIT(cuStreamWaitEvent_ptsz);
    SW_P2(cuEventRecord); SW_P2(cuEventRecord_ptsz);
    SW_WAIT(cuEventRecordWithFlags); SW_WAIT(cuEventRecordWithFlags_ptsz);
    LOOP(cuMemCreate) {
        u64 h; CUmemAllocationProp prop = {0};
        prop.location.id = (int)V(cuMemCreate, 3);
        CALL(cuMemCreate, (u64 *, size_t, const CUmemAllocationProp *, u64), &h,
             BYTES(cuMemCreate), &prop, V(cuMemCreate, 4));
    }
    LOOP(cuMemMap) CALL(cuMemMap, (u64, size_t, size_t, u64, u64), V(cuMemMap, 1),
                        V(cuMemMap, 2), V(cuMemMap, 3), V(cuMemMap, 4), V(cuMemMap, 5));
    LOOP(cuMemUnmap) CALL(cuMemUnmap, (u64, size_t), V(cuMemUnmap, 1), V(cuMemUnmap, 2));
    LOOP(cuMemRelease) CALL(cuMemRelease, (u64), V(cuMemRelease, 1));
    LOOP(cuMemAddressReserve) { u64 d; CALL(cuMemAddressReserve, (u64 *, size_t, size_t, u64, u64),
        &d, V(cuMemAddressReserve, 2), V(cuMemAddressReserve, 3), V(cuMemAddressReserve, 4),
        V(cuMemAddressReserve, 5)); }
    LOOP(cuModuleLoadData) { void *m; CALL(cuModuleLoadData, (void **, const void *), &m, IMAGE); }
    LOOP(cuModuleLoadDataEx) { void *m; CALL(cuModuleLoadDataEx,
        (void **, const void *, unsigned, int *, void **), &m, IMAGE, U(cuModuleLoadDataEx, 3),
        NULL, NULL); }
    LOOP(cuLibraryLoadData) { void *l; CALL(cuLibraryLoadData,
        (void **, const void *, int *, void **, unsigned, int *, void **, unsigned), &l, IMAGE,
        NULL, NULL, U(cuLibraryLoadData, 5), NULL, NULL, U(cuLibraryLoadData, 8)); }
    LOOP(cuModuleLoad) { void *m; char f[64]; FILE_NAME(f, cuModuleLoad);
        CALL(cuModuleLoad, (void **, const char *), &m, f); }
    LOOP(cuLibraryLoadFromFile) { void *l; char f[64]; FILE_NAME(f, cuLibraryLoadFromFile);
        CALL(cuLibraryLoadFromFile,
             (void **, const char *, int *, void **, unsigned, int *, void **, unsigned), &l, f,
             NULL, NULL, U(cuLibraryLoadFromFile, 5), NULL, NULL, U(cuLibraryLoadFromFile, 8)); }
    LOOP(cuModuleUnload) CALL(cuModuleUnload, (void *), i % 4 == 3 ? NULL : P(cuModuleUnload, 1));
    LOOP(cuLibraryUnload) CALL(cuLibraryUnload, (void *),
                               i % 4 == 3 ? NULL : P(cuLibraryUnload, 1));
    LOOP(cuMemSetAccess) { int desc[3] = {1, 0, 3};
        CALL(cuMemSetAccess, (u64, size_t, const void *, size_t), V(cuMemSetAccess, 1),
             V(cuMemSetAccess, 2), desc, i % 3 == 2 ? 0 : V(cuMemSetAccess, 4)); }
    LOOP(cuMemAddressFree) CALL(cuMemAddressFree, (u64, size_t), V(cuMemAddressFree, 1),
                                V(cuMemAddressFree, 2));
    LOOP(cuCtxCreate_v2) { void *c; CALL(cuCtxCreate_v2, (void **, unsigned, int), &c,
        U(cuCtxCreate_v2, 2), (int)V(cuCtxCreate_v2, 3)); }
    LOOP(cuCtxCreate_v3) { void *c; CALL(cuCtxCreate_v3, (void **, void *, int, unsigned, int),
        &c, NULL, (int)V(cuCtxCreate_v3, 3), U(cuCtxCreate_v3, 4), (int)V(cuCtxCreate_v3, 5)); }
    LOOP(cuCtxCreate_v4) { void *c; CALL(cuCtxCreate_v4, (void **, void *, unsigned, int), &c,
        NULL, U(cuCtxCreate_v4, 3), (int)V(cuCtxCreate_v4, 4)); }
    LOOP(cuDevicePrimaryCtxRetain) { void *c; CALL(cuDevicePrimaryCtxRetain, (void **, int), &c,
        (int)V(cuDevicePrimaryCtxRetain, 2)); }
    LOOP(cuInit) CALL(cuInit, (unsigned), U(cuInit, 1));
}

static int try_connect(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int r = connect(s, (struct sockaddr *)&a, sizeof(a));
    close(s);
    return r;
}

static int connect_unix(const char *path) {
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {0};
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, path, sizeof a.sun_path - 1);
    int r = connect(s, (struct sockaddr *)&a, sizeof(a));
    close(s);
    return r;
}

static int n_deinit;

/* registered before libcuda.so.1 loads, so it runs after the driver's own exit handler */
static void unload_at_exit(void) {
    for (int i = 0; i < n_deinit; i++) {
        CALL(cuModuleUnload, (void *), (void *)(0x4000UL + i));
        CALL(cuLibraryUnload, (void *), (void *)(0x4000UL + i));
    }
    if (n_deinit)
        mem_free(0x7f0000000000ULL);
}

int main(int argc, char **argv) {
    int wait = 0, use_dlopen = 0, port_open = 0, port_closed = 0, sleep_ms = 0, code = 0;
    int hang_ms = 0, burst = 0, sticky = 0, no_sweep = 0, pw = 0;
    const char *unix_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--wait")) wait = 1;
        else if (!strcmp(argv[i], "--dlopen")) use_dlopen = 1;
        else if (!strcmp(argv[i], "--connect") && i + 2 < argc) {
            port_open = atoi(argv[++i]); port_closed = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--sleep-ms") && i + 1 < argc) sleep_ms = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--exit") && i + 1 < argc) code = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--hang-ms") && i + 1 < argc) hang_ms = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--burst") && i + 1 < argc) burst = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sticky") && i + 1 < argc) sticky = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-sweep")) no_sweep = 1;
        else if (!strcmp(argv[i], "--getpwuid")) pw = 1;
        else if (!strcmp(argv[i], "--connect-unix") && i + 1 < argc) unix_path = argv[++i];
        else if (!strcmp(argv[i], "--deinit") && i + 1 < argc) n_deinit = atoi(argv[++i]);
    }
    atexit(unload_at_exit);
    if (!use_dlopen) load();
    if (wait) {
        printf("ready %d\n", getpid());
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin)) return 4;
    }
    if (use_dlopen) load();

    sweep_lookups();
    pthread_t a, b;
    pthread_create(&a, NULL, thread_a, NULL);
    pthread_create(&b, NULL, thread_b, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);

    for (int i = 0; i < burst; i++)   /* extra launches on the main thread */
        launch((void *)0x3000, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    for (int i = 0; i < sticky; i++)  /* a lost context: the stand-in answers 700 */
        launch((void *)0xdead, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);

    CUdeviceptr p[5];
    size_t sizes[5] = {1 << 20, 2ULL << 40, 4096, 3ULL << 40, 65536};
    int oom = 0;
    for (int i = 0; i < 5; i++)
        if (mem_alloc(&p[i], sizes[i]) == 2) oom++;
    char buf[4096];
    htod(p[0], buf, 4096); htod(p[2], buf, 100);
    dtoh(buf, p[0], 4096); dtoh(buf, p[4], 200);
    cpy_async(p[0], p[4], 512, (void *)0x5000);
    stream_sync((void *)0x5000); stream_sync((void *)0x6000);
    ctx_sync();
    event_sync((void *)0x7000);
    mem_free(p[0]); mem_free(p[2]); mem_free(p[4]);
    if (!no_sweep)
        sweep();
    const char *user = "";
    if (pw) {
        struct passwd *u = getpwuid(getuid());
        user = u ? u->pw_name : "?";
    }

    int c_open = port_open ? try_connect(port_open) : 1;
    int c_closed = port_closed ? try_connect(port_closed) : 1;
    int c_unix = unix_path ? connect_unix(unix_path) : 1;
    long tid_sleep = syscall(SYS_gettid);
    if (sleep_ms) {
        struct timespec t = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L};
        nanosleep(&t, NULL);
    }
    printf("{\"pid\": %d, \"tid_a\": %ld, \"tid_b\": %ld, \"tid_main\": %ld, \"oom\": %d, "
           "\"connect_open\": %d, \"connect_closed\": %d, \"connect_unix\": %d, "
           "\"user\": \"%s\"}\n",
           getpid(), tid_a, tid_b, tid_sleep, oom, c_open, c_closed, c_unix, user);
    fflush(stdout);
    if (hang_ms) {   /* a synchronize that is still running when the recorder stops */
        struct timespec t = {hang_ms / 1000, (hang_ms % 1000) * 1000000L};
        nanosleep(&t, NULL);
    }
    return code;
}
