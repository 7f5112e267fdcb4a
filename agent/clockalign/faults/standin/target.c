/* Known-count workload for the integration tests, calling the (fake) CUDA driver API from
 * two threads, then connect() to a listener and to a closed port, then a known sleep.
 *
 *   target [--wait] [--dlopen] [--connect PORT_OPEN PORT_CLOSED] [--sleep-ms N] [--exit N]
 *           [--hang-ms N] [--burst N]
 * --wait: block until a line arrives on stdin (the test attaches the recorder first).
 * --dlopen: load libcuda.so.1 only after the wait, like `import torch` does.
 * Counts: 23 launches (12 cuLaunchKernel on thread A, 11 cuLaunchKernelEx on thread B),
 * 5 cuMemAlloc_v2 of which 2 return OUT_OF_MEMORY, 3 cuMemFree_v2, 2 HtoD, 2 DtoH,
 * 1 cuMemcpyAsync, 2 cuStreamSynchronize, 1 cuCtxSynchronize, 1 cuEventSynchronize;
 * --burst N adds N cuLaunchKernel on the main thread (func 0x3000). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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

static void load(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
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

int main(int argc, char **argv) {
    int wait = 0, use_dlopen = 0, port_open = 0, port_closed = 0, sleep_ms = 0, code = 0;
    int hang_ms = 0, burst = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--wait")) wait = 1;
        else if (!strcmp(argv[i], "--dlopen")) use_dlopen = 1;
        else if (!strcmp(argv[i], "--connect") && i + 2 < argc) {
            port_open = atoi(argv[++i]); port_closed = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--sleep-ms") && i + 1 < argc) sleep_ms = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--exit") && i + 1 < argc) code = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--hang-ms") && i + 1 < argc) hang_ms = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--burst") && i + 1 < argc) burst = atoi(argv[++i]);
    }
    if (!use_dlopen) load();
    if (wait) {
        printf("ready %d\n", getpid());
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin)) return 4;
    }
    if (use_dlopen) load();

    pthread_t a, b;
    pthread_create(&a, NULL, thread_a, NULL);
    pthread_create(&b, NULL, thread_b, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);

    for (int i = 0; i < burst; i++)   /* extra launches on the main thread */
        launch((void *)0x3000, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);

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

    int c_open = port_open ? try_connect(port_open) : 1;
    int c_closed = port_closed ? try_connect(port_closed) : 1;
    long tid_sleep = syscall(SYS_gettid);
    if (sleep_ms) {
        struct timespec t = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L};
        nanosleep(&t, NULL);
    }
    printf("{\"pid\": %d, \"tid_a\": %ld, \"tid_b\": %ld, \"tid_main\": %ld, \"oom\": %d, "
           "\"connect_open\": %d, \"connect_closed\": %d}\n",
           getpid(), tid_a, tid_b, tid_sleep, oom, c_open, c_closed);
    fflush(stdout);
    if (hang_ms) {   /* a synchronize that is still running when the recorder stops */
        struct timespec t = {hang_ms / 1000, (hang_ms % 1000) * 1000000L};
        nanosleep(&t, NULL);
    }
    return code;
}
