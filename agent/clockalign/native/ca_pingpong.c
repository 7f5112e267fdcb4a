/*
 * The host side of the GPU clock ping-pong (capture/clocks/gpuclock.py), in C: the Python loop's
 * best round trip is about 2.2 us on an H200 host, a C loop's about 1.8 us, and the band
 * half-width sits just above half the best round trip.
 *
 * `buf` is the mapped pinned buffer of gpuclock.py (byte offsets REQ 0, RESP_SEQ 64,
 * RESP_VAL 72, EXIT 136, as in ptx/globaltimer.ptx); the ping-pong kernel is already
 * running (READY seen).  For k = 1..n: t0 = MONOTONIC, REQ = base + k, spin until
 * RESP_SEQ == base + k, read RESP_VAL, t1 = MONOTONIC.  The kernel stores RESP_VAL before
 * RESP_SEQ with a system fence between; x86 loads are not reordered with other loads, and
 * `volatile` keeps the compiler from reordering them, so the value read belongs to the
 * sequence number seen.
 *
 * ca_pingpong_word() is the same loop against ca_pingpong_word of the PTX: the kernel
 * answers with ONE 8-byte store at RESP_WORD (80), its %globaltimer with the low 5 bits
 * replaced by the request's, and no fence.  One aligned 8-byte store is seen whole, so
 * value and sequence cannot be torn apart.  Only used where every %globaltimer value is a
 * multiple of 32 (gpuclock.py checks), so the value loses nothing.
 *
 * Returns the number of sandwiches taken; *why = 0 all answered, 1 the kernel ended (EXIT
 * set), 2 a ping got no answer within timeout_ns.  Called through ctypes, which releases
 * the GIL for the whole burst.
 *     gcc -O2 -shared -fPIC ca_pingpong.c -o ca_pingpong.so
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <time.h>

static inline int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#define WORD_MASK 31u

/* The loop of both answers; word (a constant at each call, so the compiler keeps one path)
 * watches RESP_WORD's low bits and takes the value from the same load, else RESP_SEQ and
 * then RESP_VAL. */
static inline __attribute__((always_inline))
int pingpong(uint64_t buf, uint64_t base, int n, int64_t timeout_ns, int64_t *t0s,
             int64_t *rem, int64_t *t1s, int *why, int word)
{
    volatile uint64_t *req = (volatile uint64_t *)(buf + 0);
    volatile uint64_t *rseq = (volatile uint64_t *)(buf + 64);
    volatile uint64_t *rval = (volatile uint64_t *)(buf + 72);
    volatile uint64_t *rword = (volatile uint64_t *)(buf + 80);
    volatile uint64_t *ex = (volatile uint64_t *)(buf + 136);
    uint64_t w = 0;
#define ANSWERED (word ? (((w = *rword) & WORD_MASK) == (seq & WORD_MASK)) : (*rseq == seq))
    *why = 0;
    for (int k = 0; k < n; k++) {
        uint64_t seq = base + (uint64_t)k + 1;
        int64_t t0 = mono_ns();
        *req = seq;
        unsigned spins = 0;
        while (!ANSWERED) {
            if ((++spins & 255) == 0 && (*ex || mono_ns() - t0 > timeout_ns)) {
                if (ANSWERED)        /* answered just as we gave up */
                    break;
                *why = *ex ? 1 : 2;
                return k;
            }
        }
        uint64_t v = word ? (w & ~(uint64_t)WORD_MASK) : *rval;
        int64_t t1 = mono_ns();
        t0s[k] = t0;
        rem[k] = (int64_t)v;
        t1s[k] = t1;
    }
#undef ANSWERED
    return n;
}

__attribute__((visibility("default")))
int ca_pingpong_word(uint64_t buf, uint64_t base, int n, int64_t timeout_ns,
                     int64_t *t0s, int64_t *rem, int64_t *t1s, int *why)
{
    return pingpong(buf, base, n, timeout_ns, t0s, rem, t1s, why, 1);
}

__attribute__((visibility("default")))
int ca_pingpong(uint64_t buf, uint64_t base, int n, int64_t timeout_ns,
                int64_t *t0s, int64_t *rem, int64_t *t1s, int *why)
{
    return pingpong(buf, base, n, timeout_ns, t0s, rem, t1s, why, 0);
}
