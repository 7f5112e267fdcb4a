/* Layouts shared by the BPF program and user space: struct ca_event (store/schema.py
 * EVENT_DTYPE, Kind), the slot rings' control words (capture/transport/slotring.py,
 * native/reader.c), the CUDA call slots (capture/probes/maps.py) and the drop indices
 * (maps.DROP_NAMES).
 * Every event is one fixed 128-byte record, so user space decodes a whole batch with one
 * numpy view.  tests/unit/test_event_layout.py compiles this header with gcc and checks each
 * offset, size and constant against the Python side.  Numbers are file format: never reuse
 * one. */

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

/* the bytes of a CA_KIND_XID_MSG record that carry message text: a0..a4 and data */
#define CA_XID_PART_LEN 96

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

/* Each CPU's slot ring: slots [tail, head) hold records not yet read; head is moved by the
 * BPF writers, tail by the reader.  They sit on cache lines of their own: the reader reads
 * head and writes tail once a pass, the writers of one CPU share head. */
struct ca_ring_ctl {
    u64 head;
    u64 pad0[7];
    u64 tail;
    u64 pad1[7];
};

/* CUDA calls in flight, per thread (tid & mask): a small stack of CA_NEST calls, read by
 * user space at stop to list the calls still running (capture/probes/maps.py SLOT_DTYPE) */
struct ca_call {
    u64 ts;
    u32 fn;
    u32 pad;
    u64 a[5];
};
struct ca_slot {
    u32 tid;
    u32 depth;
    struct ca_call c[CA_NEST];
};

/* grid/block dims packed x | y << 32 | z << 48 (schema.unpack_dims) */
#define CA_DIMS(x, y, z) (((u64)(u32)(x)) | (((u64)((y) & 0xFFFF)) << 32) | (((u64)((z) & 0xFFFF)) << 48))

#endif
