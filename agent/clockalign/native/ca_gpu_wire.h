/*
 * The byte stream from the CUPTI injection library (ca_cupti.c) to `clockalign record`
 * through a FIFO.  capture/gpu/gpuwire.py and store/schema.py hold the numpy twins;
 * tests/unit/test_gpu_wire.py compiles this header and checks every offset against them.
 *
 * Every write(2) is one packet of at most PIPE_BUF (4096) bytes, so packets of several
 * target processes sharing the FIFO never interleave:
 *     struct ca_pkt | payload (len bytes)
 * CA_PKT_RECORDS: n records of struct ca_gpu_rec.
 * CA_PKT_NAME:    struct ca_name_hdr | n bytes of the name from byte `offset` on
 *                 (long names come in several packets).
 */
#ifndef CA_GPU_WIRE_H
#define CA_GPU_WIRE_H
#include <stdint.h>

#define CA_PKT_MAGIC 0x31474143u          /* "CAG1" little endian */
#define CA_PKT_MAX 4096u                  /* PIPE_BUF on Linux */
#define CA_PKT_RECORDS 1
#define CA_PKT_NAME 2

struct ca_pkt {
    uint32_t magic;
    uint16_t type;
    uint16_t n;           /* records, or name bytes in this packet */
    uint32_t pid;
    uint32_t len;         /* payload bytes after this header */
};

/* ca_gpu_rec.kind */
#define CA_GK_KERNEL 1    /* start,end: GPU time; grid,block packed; name: kernel name id;
                             value: CUDA graph node id, aux: graph id (0: not from a graph) */
#define CA_GK_MEMCPY 2    /* value: bytes; aux: copyKind | srcKind << 8 | dstKind << 16 */
#define CA_GK_MEMSET 3    /* value: bytes; aux: the byte value set */
#define CA_GK_API 4       /* a driver call that can start GPU work: start/end MONOTONIC at
                             its CUPTI entry/exit callback; tid; corr; value: CUresult;
                             aux: cbid; name: function name id */
#define CA_GK_DEVICE 5    /* device: CUDA ordinal in the target; grid/block: its UUID bytes */
#define CA_GK_CLOCK 6     /* start: MONOTONIC, value: cuptiGetTimestamp(), end: MONOTONIC */
#define CA_GK_DROPPED 7   /* value: records CUPTI dropped (context, stream as given) */
#define CA_GK_INFO 8      /* value: CUPTI version; aux: CA_RAW_*; start: MONOTONIC at init */
#define CA_GK_MODE 9      /* what is collected from start (MONOTONIC) on: value: CA_MODE_* bits */
#define CA_GK_GRAPH 10    /* one CUDA graph's execution (CA_MODE_GRAPH): start,end: GPU time;
                             corr: its cuGraphLaunch; aux: CUPTI graph id */

/* CA_GK_MODE value (CLOCKALIGN_CUPTI_MODE, or the control file's word): what is collected */
#define CA_MODE_KERNEL 1  /* every kernel (graph nodes too) */
#define CA_MODE_MEMCPY 2
#define CA_MODE_MEMSET 4
#define CA_MODE_API 8     /* the launching calls' callbacks (tid, MONOTONIC, correlation) */
#define CA_MODE_GRAPH 16  /* a graph launch as one record, instead of its kernels */

/* ca_gpu_rec.flags */
#define CA_F_RAW 1        /* start/end are raw GPU timestamps (%globaltimer ns) */
#define CA_F_CONVERTED 2  /* start/end are CUPTI's conversion to its CPU clock */

/* CA_GK_INFO aux: what became of cuptiActivityEnableRawTimestamps */
#define CA_RAW_ON 0
#define CA_RAW_NOT_EXPORTED 1
#define CA_RAW_FAILED 2
#define CA_RAW_NOT_ASKED 3

/* ca_name_hdr.space */
#define CA_NAME_KERNEL 1
#define CA_NAME_API 2

struct ca_gpu_rec {       /* 80 bytes */
    uint16_t kind;
    uint16_t flags;
    uint32_t pid;
    uint64_t start;
    uint64_t end;
    uint64_t value;
    uint64_t grid;        /* x | y << 32 | z << 48, as bpf/clockalign.h packs dims */
    uint64_t block;
    uint32_t corr;
    uint32_t device;
    uint32_t stream;
    uint32_t name;
    uint32_t tid;
    uint32_t aux;
    uint32_t context;
    uint32_t shmem;       /* static + dynamic shared memory of a kernel */
};

struct ca_name_hdr {
    uint32_t id;
    uint32_t space;
    uint32_t offset;
    uint32_t total;
};

/* Live attach (record --pid --gpu-activity): the library is dlopen'ed into a running process
 * through ptrace and ca_cupti_attach("key=value\n...") is called (keys: fifo, lib, raw,
 * mode, pid); CUPTI is started by the library's own thread, so the hijacked thread returns at
 * once and no CUDA lock it may hold is needed (pid: the target as the host numbers it).
 * The recorder follows the exported `ca_cupti_live` by reading the target's memory;
 * ca_cupti_detach() asks the thread to turn activity off, flush, unsubscribe and exit (its
 * tid is then gone from /proc/PID/task). */
#define CA_LIVE_IDLE 0
#define CA_LIVE_STARTING 1
#define CA_LIVE_RUNNING 2
#define CA_LIVE_STOPPING 3
#define CA_LIVE_STOPPED 4
#define CA_LIVE_FAILED 5

/* ca_live.failure */
#define CA_FAIL_NONE 0
#define CA_FAIL_CONF 1          /* the settings string lacks fifo or lib */
#define CA_FAIL_FIFO 2          /* the FIFO cannot be opened in the target */
#define CA_FAIL_LIB 3           /* libcupti cannot be loaded or lacks a symbol */
#define CA_FAIL_CUPTI 4         /* a CUPTI call failed */
#define CA_FAIL_SUBSCRIBED 5    /* another CUPTI subscriber is present (a profiler) */
#define CA_FAIL_THREAD 6        /* the library's thread cannot be started */
#define CA_FAIL_BUSY 7          /* already attached */

struct ca_live {          /* 256 bytes */
    int32_t state;        /* CA_LIVE_* */
    int32_t failure;      /* CA_FAIL_* */
    uint32_t tid;         /* the library's thread, while it runs */
    uint32_t cupti_version;
    char error[240];      /* one sentence on failure */
};

#define CA_RECS_PER_PKT ((CA_PKT_MAX - sizeof(struct ca_pkt)) / sizeof(struct ca_gpu_rec))
#define CA_NAME_PER_PKT (CA_PKT_MAX - sizeof(struct ca_pkt) - sizeof(struct ca_name_hdr))
#endif
