/* The recorder's per-event work in C: draining the per-CPU slot rings or perf buffers and
 * turning a batch of fixed-size event records into run-file format 2's column planes
 * (store/codec.py).  Numpy spends ~1.3 us per event on the same steps (strided structured
 * copies); this ~0.05 us.
 * The output is byte for byte what codec.encode_columns builds: tests compare the two.
 * Built and loaded by clockalign/native/__init__.py; x86-64 (loads and stores need no fences,
 * as preflight.check_architecture states). */
#include <stdint.h>
#include <string.h>

#define PERF_RECORD_LOST 2
#define PERF_RECORD_SAMPLE 9

static void ring_copy(const uint8_t *data, uint64_t mask, uint64_t at, void *dst, uint64_t len)
{
    uint64_t pos = at & mask, first = mask + 1 - pos;
    if (first >= len) {
        memcpy(dst, data + pos, len);
    } else {
        memcpy(dst, data + pos, first);
        memcpy((uint8_t *)dst + first, data, len - first);
    }
}

/* Copy the raw bodies of the samples in one perf ring's [tail, head) into out (body_size bytes
 * each, at most cap) and their first 8 bytes (the timestamp) into ts.  A sample whose raw size
 * is not body_size is stepped over and counted in *bad; PERF_RECORD_LOST adds its count to
 * *lost.  Returns the samples copied; *new_tail is where reading stopped. */
int64_t ca_drain(const uint8_t *data, uint64_t size, uint64_t tail, uint64_t head,
                 uint32_t body_size, uint8_t *out, uint64_t *ts, int64_t cap,
                 uint64_t *lost, uint64_t *bad, uint64_t *new_tail)
{
    uint64_t mask = size - 1;
    int64_t n = 0;
    while (head - tail >= 8 && n < cap) {
        uint8_t hdr[8];
        uint32_t type, raw;
        uint16_t sz;
        ring_copy(data, mask, tail, hdr, 8);
        memcpy(&type, hdr, 4);
        memcpy(&sz, hdr + 6, 2);
        if (sz < 8 || head - tail < sz)
            break;                                  /* not a record: the kernel never writes one */
        if (type == PERF_RECORD_SAMPLE && sz >= 12) {
            ring_copy(data, mask, tail + 8, &raw, 4);
            if (raw >= body_size && sz >= 12 + body_size) {
                uint8_t *dst = out + (uint64_t)n * body_size;
                ring_copy(data, mask, tail + 12, dst, body_size);
                memcpy(&ts[n], dst, 8);
                n++;
            } else {
                (*bad)++;
            }
        } else if (type == PERF_RECORD_LOST && sz >= 24) {
            uint64_t cnt;
            ring_copy(data, mask, tail + 16, &cnt, 8);
            *lost += cnt;
        }
        tail += sz;
    }
    *new_tail = tail;
    return n;
}

/* Copy the committed records of one slot ring's positions [tail, head)
 * (capture/transport/slotring.py: nslots slots of rec bytes; a slot is committed once its
 * 16-bit kind at kind_off is not 0, the BPF writer storing it last) into out (at most cap) and their first 8 bytes (the
 * timestamp) into ts.  Stops at the first slot still being written.  Each slot read gets its
 * kind cleared, before the caller moves the tail past it, so the writer that reuses the slot
 * leaves it uncommitted until it is complete.  Returns the records copied; *new_tail is
 * where reading stopped. */
int64_t ca_slot_drain(uint8_t *slots, uint64_t nslots, uint64_t tail, uint64_t head,
                      uint32_t rec, uint32_t kind_off, uint8_t *out, uint64_t *ts, int64_t cap,
                      uint64_t *new_tail)
{
    uint64_t mask = nslots - 1;
    int64_t n = 0;
    while (tail < head && n < cap) {
        uint8_t *s = slots + (tail & mask) * rec;
        uint16_t *kind = (uint16_t *)(s + kind_off);
        if (__atomic_load_n(kind, __ATOMIC_ACQUIRE) == 0)
            break;
        uint8_t *dst = out + (uint64_t)n * rec;
        memcpy(dst, s, rec);
        memcpy(&ts[n], dst, 8);
        __atomic_store_n(kind, 0, __ATOMIC_RELAXED);
        n++;
        tail++;
    }
    *new_tail = tail;
    return n;
}

/* rows[order[i]] -> dst[i], each rec_size bytes. */
void ca_take(const uint8_t *rows, const int64_t *order, int64_t n, uint32_t rec_size, uint8_t *dst)
{
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + (uint64_t)i * rec_size, rows + (uint64_t)order[i] * rec_size, rec_size);
}

enum { HOW_RAW = 0, HOW_SHUFFLE = 1, HOW_DELTA = 2, HOW_SPARSE = 3 };

static uint64_t load_le(const uint8_t *p, uint32_t w)
{
    uint64_t v = 0;
    memcpy(&v, p, w);                              /* little-endian host */
    return v;
}

/* Columns of n rows of rec_size bytes -> format 2's uncompressed payload, column after
 * column: raw bytes; byte planes (plane k holds byte k of every row); planes of the zigzag of
 * the row-to-row difference (first row against 0); sparse: a little-endian bit per row (any
 * byte set) then the set rows.  cols holds (offset, width, how) per column.  Returns the
 * bytes written to out, which must hold n * (sum of widths) + (n+7)/8 per sparse column;
 * sparse_sizes gets each sparse column's stored size.
 *
 * The rows are read in blocks that stay in cache while every column takes its bytes (one pass
 * per column over a batch larger than the cache cost ~0.3 us an event); each column writes to
 * its own region, and the regions are closed up at the end (a sparse one is shorter than its
 * region). */
#define BLOCK 512
#define MAX_COLS 64

int64_t ca_encode(const uint8_t *rows, int64_t n, uint32_t rec_size,
                  const int32_t *cols, int32_t ncols, uint8_t *out, int64_t *sparse_sizes)
{
    uint8_t *start[MAX_COLS], *cur[MAX_COLS];
    uint64_t prev[MAX_COLS];
    uint64_t at = 0, nb = (uint64_t)(n + 7) / 8;
    if (ncols > MAX_COLS)
        return -1;
    for (int32_t c = 0; c < ncols; c++) {
        uint32_t w = (uint32_t)cols[3 * c + 1];
        int32_t how = cols[3 * c + 2];
        if (how < HOW_RAW || how > HOW_SPARSE || w == 0 || w > 64 ||
            (how == HOW_RAW && w != 1) || (how == HOW_DELTA && w > 8))
            return -1;
        start[c] = out + at;
        prev[c] = 0;
        if (how == HOW_SPARSE) {
            memset(start[c], 0, nb);
            cur[c] = start[c] + nb;
            at += nb;
        }
        at += (uint64_t)n * w;
    }
    for (int64_t b = 0; b < n; b += BLOCK) {
        int64_t e = b + BLOCK < n ? b + BLOCK : n;
        for (int32_t c = 0; c < ncols; c++) {
            uint32_t off = (uint32_t)cols[3 * c], w = (uint32_t)cols[3 * c + 1];
            int32_t how = cols[3 * c + 2];
            const uint8_t *r = rows + off;
            uint8_t *o = start[c];
            if (how == HOW_RAW) {
                for (int64_t i = b; i < e; i++)
                    o[i] = r[(uint64_t)i * rec_size];
            } else if (how == HOW_SHUFFLE) {
                for (uint32_t k = 0; k < w; k++) {
                    uint8_t *plane = o + (uint64_t)k * n;
                    for (int64_t i = b; i < e; i++)
                        plane[i] = r[(uint64_t)i * rec_size + k];
                }
            } else if (how == HOW_DELTA) {
                uint32_t bits = 8 * w;
                uint64_t m = bits == 64 ? ~0ULL : ((1ULL << bits) - 1), p = prev[c];
                for (int64_t i = b; i < e; i++) {
                    uint64_t v = load_le(r + (uint64_t)i * rec_size, w);
                    uint64_t d = (v - p) & m;
                    p = v;
                    int64_t s = bits == 64 ? (int64_t)d : (int64_t)(d << (64 - bits)) >> (64 - bits);
                    uint64_t z = (((uint64_t)s << 1) ^ (uint64_t)(s >> 63)) & m;
                    for (uint32_t k = 0; k < w; k++)
                        o[(uint64_t)k * n + i] = (uint8_t)(z >> (8 * k));
                }
                prev[c] = p;
            } else {
                uint8_t *body = cur[c];
                for (int64_t i = b; i < e; i++) {
                    const uint8_t *q = r + (uint64_t)i * rec_size;
                    int any = 0;
                    for (uint32_t k = 0; k < w && !any; k++)
                        any = q[k] != 0;
                    if (any) {
                        o[i >> 3] |= (uint8_t)(1u << (i & 7));
                        memcpy(body, q, w);
                        body += w;
                    }
                }
                cur[c] = body;
            }
        }
    }
    uint8_t *dst = out;
    int32_t ns = 0;
    for (int32_t c = 0; c < ncols; c++) {
        uint32_t w = (uint32_t)cols[3 * c + 1];
        uint64_t len = cols[3 * c + 2] == HOW_SPARSE ? (uint64_t)(cur[c] - start[c])
                                                     : (uint64_t)n * w;
        if (cols[3 * c + 2] == HOW_SPARSE)
            sparse_sizes[ns++] = (int64_t)len;
        if (dst != start[c])
            memmove(dst, start[c], len);
        dst += len;
    }
    return dst - out;
}
