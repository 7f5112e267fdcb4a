/* Shared record layout: mirrored by clockalign/store/schema.py (EVENT_DTYPE, Kind).
 * Every event is one fixed 128-byte record sent through the per-CPU perf buffers, so user
 * space decodes a whole batch with one numpy view (capture/perfbuf.py, native/batch.c).
 * Numbers are file format: never reuse one. */

#ifndef CLOCKALIGN_H
#define CLOCKALIGN_H

#define CA_KIND_CUDA 1
#define CA_KIND_CUDA_UNFINISHED 2
#define CA_KIND_CONNECT 3
#define CA_KIND_SCHED 4
#define CA_KIND_XID 5
#define CA_KIND_THREAD_NEW 6
#define CA_KIND_THREAD_NAME 7
#define CA_KIND_THREAD_EXIT 8
#define CA_KIND_PROC_EXIT 9
#define CA_KIND_SIGNAL 10
#define CA_KIND_TCP 11
#define CA_KIND_XID_MSG 12
#define CA_KIND_CUDA_ENTRY 13    /* a CUDA call recorded at its entry only (its return not probed) */
#define CA_NKINDS 32

/* drops[] is indexed by kind (a record that could not be sent), plus these: index 0
 * counts state-map updates that failed (a map full); the CUDA call slots count calls not
 * paired: another live target thread held the slot (tid equal modulo the slots), calls
 * nested deeper than CA_NEST, a return that found another function on top */
#define CA_DROP_MAP_FULL 0
#define CA_DROP_UNPAIRED 29
#define CA_DROP_NESTED 30
#define CA_DROP_SLOT_BUSY 31

/* probed CUDA calls one thread can be inside at once (a power of two) */
#define CA_NEST 2

#define CA_DATA_LEN 56

/* CA_KIND_TCP codes */
#define CA_TCP_RESET_SENT 1
#define CA_TCP_RESET_RECEIVED 2
#define CA_TCP_RETRANSMIT 3

struct ca_event {
    u64 ts;         /* MONOTONIC ns (bpf_ktime_get_ns); call entry for paired events */
    u64 dur;        /* ns: call duration, off-CPU time */
    u32 pid;        /* tgid */
    u32 tid;
    u16 kind;
    u16 code;       /* CUDA function id, sched 1=preempted, signal result, ... */
    s32 ret;        /* CUresult, -errno, prev_state, xid code, exit code, signal */
    u64 a[5];
    u8 data[CA_DATA_LEN];
};

/* grid/block dims packed x | y << 32 | z << 48 (schema.unpack_dims) */
#define CA_DIMS(x, y, z) (((u64)(u32)(x)) | (((u64)((y) & 0xFFFF)) << 32) | (((u64)((z) & 0xFFFF)) << 48))

#endif
