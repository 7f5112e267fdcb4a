/* Event storm for the probe-cost benchmarks: N threads call cuLaunchKernel of a libcuda
 * (the gcc-built stand-in, whose function returns at once) in a loop, each counting its
 * own calls, so a recording's counts and drops can be checked against the truth.
 *
 *   storm --lib PATH [--threads N] [--calls N | --seconds S] [--rate CALLS_PER_S_PER_THREAD]
 *         [--wait]
 * --wait: print "ready PID" and block until a line arrives on stdin (probes attach first).
 * --repeat: with --wait, one thread and --calls: run the calls on every line that arrives
 *   (one JSON line each), until stdin ends, so that configurations can be switched between
 *   runs of one process milliseconds apart (scripts/bench/probe_cost.py --parts ab).
 * --rate: pace each thread (busy-wait on CLOCK_MONOTONIC) instead of running flat out.
 * Prints one JSON line: calls per thread, total, wall seconds, ns per call (per thread). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
static launch_fn launch;
static long long calls_each = 0, rate = 0;
static double seconds = 0;
static volatile int go = 0;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

struct worker { pthread_t th; long long calls, t0, t1; int idx; };

static void *work(void *arg) {
    struct worker *w = arg;
    while (!go) ;
    long long t0 = now_ns(), end = t0 + (long long)(seconds * 1e9), n = 0;
    long long gap = rate ? 1000000000LL / rate : 0, next = t0;
    void *func = (void *)(0x1000L + w->idx);
    for (;;) {
        if (calls_each && n >= calls_each) break;
        if (!calls_each && (n & 63) == 0 && now_ns() >= end) break;
        if (gap) { while (now_ns() < next) ; next += gap; }
        launch(func, 64, 2, 1, 256, 1, 1, 1024, (void *)0x5000, NULL, NULL);
        n++;
    }
    w->t0 = t0; w->t1 = now_ns(); w->calls = n;
    return NULL;
}

int main(int argc, char **argv) {
    const char *lib = NULL;
    int threads = 1, wait = 0, repeat = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--lib") && i + 1 < argc) lib = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--calls") && i + 1 < argc) calls_each = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--rate") && i + 1 < argc) rate = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--wait")) wait = 1;
        else if (!strcmp(argv[i], "--repeat")) repeat = 1;
        else { fprintf(stderr, "storm: unknown argument %s\n", argv[i]); return 2; }
    }
    if (!lib || (!calls_each && seconds <= 0) || threads < 1) {
        fprintf(stderr, "storm: need --lib and --calls N or --seconds S\n");
        return 2;
    }
    void *h = dlopen(lib, RTLD_NOW);
    if (!h || !(launch = (launch_fn)dlsym(h, "cuLaunchKernel"))) {
        fprintf(stderr, "storm: %s\n", dlerror());
        return 3;
    }
    if (repeat) {
        if (!wait || threads != 1 || !calls_each) {
            fprintf(stderr, "storm: --repeat needs --wait, one thread and --calls\n");
            return 2;
        }
        printf("ready %d\n", getpid());
        fflush(stdout);
        char line[64];
        go = 1;
        while (fgets(line, sizeof line, stdin)) {
            struct worker one = {.idx = 0};
            work(&one);
            printf("{\"calls\": %lld, \"ns_per_call\": %.2f}\n", one.calls,
                   (double)(one.t1 - one.t0) / (one.calls ? one.calls : 1));
            fflush(stdout);
        }
        return 0;
    }
    struct worker *w = calloc(threads, sizeof *w);
    for (int i = 0; i < threads; i++) {
        w[i].idx = i;
        pthread_create(&w[i].th, NULL, work, &w[i]);
    }
    if (wait) {
        printf("ready %d\n", getpid());
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin)) return 4;
    }
    long long t0 = now_ns();
    go = 1;
    long long total = 0;
    double ns_sum = 0;
    printf("{\"threads\": %d, \"calls\": [", threads);
    for (int i = 0; i < threads; i++) {
        pthread_join(w[i].th, NULL);
        total += w[i].calls;
        ns_sum += (double)(w[i].t1 - w[i].t0) / (w[i].calls ? w[i].calls : 1);
        printf("%s%lld", i ? ", " : "", w[i].calls);
    }
    printf("], \"total\": %lld, \"wall_s\": %.6f, \"ns_per_call\": %.2f, \"pid\": %d}\n",
           total, (now_ns() - t0) / 1e9, ns_sum / threads, getpid());
    fflush(stdout);
    return 0;
}
