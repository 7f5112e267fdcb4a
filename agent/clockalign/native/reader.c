/* A reader thread in C that keeps the per-CPU event buffers empty without the GIL: the slot
 * rings (capture/transport/slotring.py, mode 1) or the perf buffers
 * (capture/transport/perfbuf.py, mode 0); capture/transport/drain.py takes what it gathered.
 *
 * A Python reader thread (what clockalign had before) needs the GIL between its reads: an
 * import, a long numpy step or a collection in any other thread of the recorder holds it for
 * tens of milliseconds, and at 1 M events/s one
 * CPU's 8 MiB buffer is full in 65 ms.  This thread never touches Python: it copies every
 * CPU's records (batch.c's ca_slot_drain or ca_drain, built into the same library) into one
 * growing staging area and moves each buffer's tail; Python takes what has gathered with
 * ca_reader_take.  When the staging area holds max_rows it stops reading until Python takes:
 * the buffers fill and what cannot be written is counted (the BPF drops map for the slot
 * rings, PERF_RECORD_LOST for perf buffers), so memory stays bounded and nothing is lost
 * uncounted.  x86-64 only, like batch.c: each buffer's head is read with an acquire load
 * and its tail written with a release store.
 *
 *   r = ca_reader_start(ctls, data_areas, ncpu, size, rec, max_rows, poll_ns, mode)
 *       (ctls: each CPU's head/tail words; size: each data area's bytes)
 *   n = ca_reader_take(r, rows, ts, cap)        (also: ca_reader_pending, ca_reader_stats)
 *   ca_reader_stop(r)                           (joins; then take the rest; ca_reader_free)
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* batch.c, built into the same library (native/__init__.py SOURCES) */
int64_t ca_drain(const uint8_t *data, uint64_t size, uint64_t tail, uint64_t head,
                 uint32_t body_size, uint8_t *out, uint64_t *ts, int64_t cap,
                 uint64_t *lost, uint64_t *bad, uint64_t *new_tail);
int64_t ca_slot_drain(uint8_t *slots, uint64_t nslots, uint64_t tail, uint64_t head,
                      uint32_t rec, uint32_t kind_off, uint8_t *out, uint64_t *ts, int64_t cap,
                      uint64_t *new_tail);

enum { MODE_PERF = 0, MODE_SLOTS = 1 };
/* where each mode keeps a buffer's head and tail: perf_event_mmap_page.data_head/data_tail;
 * slotring.py's struct ca_ring_ctl (head and tail on cache lines of their own) */
static const uint32_t HEAD_OFF[2] = {1024, 0}, TAIL_OFF[2] = {1032, 64};
#define SLOT_KIND_OFF 24        /* struct ca_event.kind (bpf/clockalign.h) */

struct ca_reader {
    int ncpu, mode;
    uint8_t **ctl, **data;
    uint64_t size;
    uint32_t rec;
    int64_t max_rows, poll_ns;
    pthread_t thread;
    pthread_mutex_t mu;
    volatile int stop;
    uint8_t *rows;              /* staging: n rows of rec bytes, and their timestamps */
    uint64_t *ts;
    int64_t n, cap;
    int cpus;                   /* additions (a CPU in a pass) since the last take: with
                                   more than one the rows may be out of timestamp order */
    uint64_t lost, bad;
    double last_fill, peak_fill;
    int64_t held_ns;            /* time reading was held back by max_rows */
};

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void sleep_ns(int64_t ns)
{
    struct timespec t = {ns / 1000000000, ns % 1000000000};
    nanosleep(&t, NULL);
}

/* room for `more` rows; 0 when max_rows would be passed or memory is short */
static int reserve(struct ca_reader *r, int64_t more)
{
    if (r->n + more <= r->cap)
        return 1;
    if (r->n + more > r->max_rows)
        return 0;
    int64_t cap = r->cap ? r->cap : 65536;
    while (cap < r->n + more)
        cap *= 2;
    if (cap > r->max_rows)
        cap = r->max_rows;
    uint8_t *rows = realloc(r->rows, (size_t)cap * r->rec);
    if (!rows)
        return 0;
    r->rows = rows;
    uint64_t *ts = realloc(r->ts, (size_t)cap * 8);
    if (!ts)
        return 0;
    r->ts = ts;
    r->cap = cap;
    return 1;
}

/* One pass over every CPU's buffer; returns the fullest buffer's fill before reading. */
static double pass(struct ca_reader *r, int *held)
{
    double fullest = 0;
    *held = 0;
    for (int c = 0; c < r->ncpu; c++) {
        int m = r->mode;
        uint64_t head = __atomic_load_n((uint64_t *)(r->ctl[c] + HEAD_OFF[m]), __ATOMIC_ACQUIRE);
        uint64_t tail = *(uint64_t *)(r->ctl[c] + TAIL_OFF[m]);
        if (head <= tail)
            continue;
        /* perf: head and tail count bytes, a sample takes 12 more than its record;
         * slots: they count records */
        uint64_t bytes = m == MODE_SLOTS ? (head - tail) * r->rec : head - tail;
        double fill = (double)bytes / (double)r->size;
        if (fill > fullest)
            fullest = fill;
        int64_t most = m == MODE_SLOTS ? (int64_t)(head - tail)
                                       : (int64_t)((head - tail) / (12 + r->rec)) + 1;
        pthread_mutex_lock(&r->mu);
        if (!reserve(r, most)) {
            pthread_mutex_unlock(&r->mu);
            *held = 1;
            continue;
        }
        uint64_t new_tail = tail;
        uint8_t *rows = r->rows + (size_t)r->n * r->rec;
        int64_t got = m == MODE_SLOTS
            ? ca_slot_drain(r->data[c], r->size / r->rec, tail, head, r->rec, SLOT_KIND_OFF,
                            rows, r->ts + r->n, r->cap - r->n, &new_tail)
            : ca_drain(r->data[c], r->size, tail, head, r->rec, rows, r->ts + r->n,
                       r->cap - r->n, &r->lost, &r->bad, &new_tail);
        if (got > 0) {
            r->n += got;
            r->cpus++;
        }
        pthread_mutex_unlock(&r->mu);
        __atomic_store_n((uint64_t *)(r->ctl[c] + TAIL_OFF[m]), new_tail, __ATOMIC_RELEASE);
    }
    pthread_mutex_lock(&r->mu);
    r->last_fill = fullest;
    if (fullest > r->peak_fill)
        r->peak_fill = fullest;
    pthread_mutex_unlock(&r->mu);
    return fullest;
}

/* Sleep poll_ns, or less where the fullest buffer, filling as fast as it did since the last
 * pass, would be half full by then (the rule the Python reader used: scripts/bench/
 * python_reader.py next_poll_s). */
static void *run(void *arg)
{
    struct ca_reader *r = arg;
    int64_t t_prev = now_ns();
    while (!r->stop) {
        int64_t t0 = now_ns();
        int held;
        double fill = pass(r, &held);
        int64_t t1 = now_ns();
        int64_t sleep = r->poll_ns;
        if (held) {
            sleep = 1000000;                    /* 1 ms: Python takes, then we read again */
            pthread_mutex_lock(&r->mu);
            r->held_ns += sleep;
            pthread_mutex_unlock(&r->mu);
        } else if (fill > 0 && t0 > t_prev) {
            double rate = fill / ((double)(t0 - t_prev) / 1e9);   /* buffer fractions a second */
            int64_t half = (int64_t)(0.5 / rate * 1e9) - (t1 - t0);
            if (half < sleep)
                sleep = half < 500000 ? 500000 : half;
        }
        t_prev = t0;
        sleep_ns(sleep);
    }
    int held;
    pass(r, &held);                             /* what came while stopping */
    return NULL;
}

struct ca_reader *ca_reader_start(uint8_t **ctl, uint8_t **data, int ncpu, uint64_t size,
                                  uint32_t rec, int64_t max_rows, int64_t poll_ns, int mode)
{
    if (mode != MODE_PERF && mode != MODE_SLOTS)
        return NULL;
    struct ca_reader *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->ncpu = ncpu;
    r->mode = mode;
    r->ctl = malloc(sizeof(uint8_t *) * (size_t)ncpu);
    r->data = malloc(sizeof(uint8_t *) * (size_t)ncpu);
    if (!r->ctl || !r->data) {
        free(r->ctl); free(r->data); free(r);
        return NULL;
    }
    memcpy(r->ctl, ctl, sizeof(uint8_t *) * (size_t)ncpu);
    memcpy(r->data, data, sizeof(uint8_t *) * (size_t)ncpu);
    r->size = size;
    r->rec = rec;
    r->max_rows = max_rows;
    r->poll_ns = poll_ns;
    pthread_mutex_init(&r->mu, NULL);
    if (pthread_create(&r->thread, NULL, run, r) != 0) {
        pthread_mutex_destroy(&r->mu);
        free(r->ctl); free(r->data); free(r);
        return NULL;
    }
    return r;
}

int64_t ca_reader_pending(struct ca_reader *r)
{
    pthread_mutex_lock(&r->mu);
    int64_t n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* Move up to cap gathered rows (oldest first) into rows/ts; *cpus: how many additions (a CPU
 * in a pass) there were since the last take (more than one: the rows may be out of
 * timestamp order).  Returns how many were moved. */
int64_t ca_reader_take(struct ca_reader *r, uint8_t *rows, uint64_t *ts, int64_t cap,
                       int32_t *cpus)
{
    pthread_mutex_lock(&r->mu);
    int64_t n = r->n < cap ? r->n : cap;
    memcpy(rows, r->rows, (size_t)n * r->rec);
    memcpy(ts, r->ts, (size_t)n * 8);
    if (n < r->n) {
        memmove(r->rows, r->rows + (size_t)n * r->rec, (size_t)(r->n - n) * r->rec);
        memmove(r->ts, r->ts + n, (size_t)(r->n - n) * 8);
    }
    r->n -= n;
    *cpus = r->cpus;
    r->cpus = r->n ? 1 : 0;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* lost, bad, held_ns; last and peak fill */
void ca_reader_stats(struct ca_reader *r, uint64_t *out, double *fill)
{
    pthread_mutex_lock(&r->mu);
    out[0] = r->lost; out[1] = r->bad; out[2] = (uint64_t)r->held_ns;
    fill[0] = r->last_fill; fill[1] = r->peak_fill;
    pthread_mutex_unlock(&r->mu);
}

void ca_reader_stop(struct ca_reader *r)
{
    r->stop = 1;
    pthread_join(r->thread, NULL);
}

void ca_reader_free(struct ca_reader *r)
{
    pthread_mutex_destroy(&r->mu);
    free(r->rows); free(r->ts); free(r->ctl); free(r->data); free(r);
}
