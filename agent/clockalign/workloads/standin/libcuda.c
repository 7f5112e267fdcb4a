/* A fake libcuda.so.1 for integration tests: every driver API symbol clockalign traces
 * (store/cuda_api.py), with the real signatures of cuda.h, and known behaviour (no GPU):
 *   cuMemAlloc_v2 returns 2 (CUDA_ERROR_OUT_OF_MEMORY) for > 1 TiB, and so do the other
 *     allocators (cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemCreate);
 *   cuLaunchKernel* return 700 (CUDA_ERROR_ILLEGAL_ADDRESS) when f == 0xdead;
 *   cuModuleLoadData/Ex and cuLibraryLoadData return 218 (CUDA_ERROR_INVALID_PTX) for an
 *     image that starts with "bad";
 *   cuModuleLoad / cuLibraryLoadFromFile return 301 (CUDA_ERROR_FILE_NOT_FOUND) for a file
 *     name that starts with "missing";
 *   cuModuleUnload / cuLibraryUnload return 400 (CUDA_ERROR_INVALID_HANDLE) for NULL, and
 *     cuMemSetAccess returns 1 (CUDA_ERROR_INVALID_VALUE) for 0 descriptors;
 *   cuModuleGetFunction / cuLibraryGetKernel return 500 (CUDA_ERROR_NOT_FOUND) for the name
 *     "missing", and the handles 0x1000 / 0x2000 for "vector_add" / "gemm_tile";
 *   every other handle written to an out-parameter is ID << 24 | n, n counting the calls of
 *     that function (ids: cuda_ids.h, generated from the table by standin.build());
 *   synchronize calls sleep 2 ms so they have a measurable duration;
 *   once the process has begun to exit (an atexit handler registered when the library
 *   loads), cuModuleUnload / cuLibraryUnload / cuMemFree_v2 return 4
 *   (CUDA_ERROR_DEINITIALIZED), as the real driver does to a runtime unloading its modules
 *   from its own exit handlers after the driver's. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_ids.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr, CUmemGenericAllocationHandle;
typedef int CUdevice;
typedef void *CUfunction, *CUstream, *CUevent, *CUcontext, *CUmodule, *CUlibrary, *CUkernel,
    *CUgraphExec, *CUmemoryPool, *CUarray;
typedef int CUjit_option, CUlibraryOption;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;
typedef struct {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;
typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;
typedef struct {
    int type, requestedHandleTypes;
    struct { int type, id; } location;
    void *win32HandleMetaData;
    struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage;
             unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct { int type; size_t value; } CUexecAffinityParam;
typedef struct { void *execAffinityParams; int numExecAffinityParams; void *cigParams; } CUctxCreateParams;

#define TIB (1ULL << 40)
static volatile int down;            /* the driver torn down: the process is exiting */
static void driver_down(void) { down = 1; }
__attribute__((constructor)) static void driver_up(void) { atexit(driver_down); }
static volatile unsigned long long next_ptr = 0x7f0000000000ULL;
static void nap(long ns) { struct timespec t = {0, ns}; nanosleep(&t, NULL); }
/* the handle an out-parameter gets: ID << 24 | how many calls of that function came before */
#define HANDLE(sym) ({ static unsigned long long n_; ((unsigned long long)ID_##sym << 24) | \
                       __atomic_fetch_add(&n_, 1, __ATOMIC_SEQ_CST); })
#define SET(p, h) do { if (p) *(p) = (__typeof__(*(p)))(h); } while (0)
#define UNUSED(...) (void)(__VA_ARGS__)

static CUresult alloc(CUdeviceptr *p, size_t n) {
    if (n > TIB) return 2;
    *p = __atomic_fetch_add(&next_ptr, (n + 255) & ~255ULL, __ATOMIC_SEQ_CST);
    return 0;
}
static int bad_image(const void *image) { return image && !strncmp(image, "bad", 3); }

CUresult cuInit(unsigned flags) { (void)flags; return 0; }

/* launches */
#define LAUNCH(sym) \
CUresult sym(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
             unsigned bz, unsigned shmem, CUstream s, void **params, void **extra) { \
    UNUSED(gx, gy, gz, bx, by, bz, shmem, s, params, extra); \
    return f == (CUfunction)0xdead ? 700 : 0; }
LAUNCH(cuLaunchKernel)
LAUNCH(cuLaunchKernel_ptsz)
#define LAUNCH_EX(sym) \
CUresult sym(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) { \
    UNUSED(c, params, extra); return f == (CUfunction)0xdead ? 700 : 0; }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)
CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { UNUSED(g, s); return 0; }
CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { UNUSED(g, s); return 0; }

/* allocation */
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return alloc(p, n); }
#define ALLOC_ASYNC(sym) \
CUresult sym(CUdeviceptr *p, size_t n, CUstream s) { \
    unsigned long long h = HANDLE(sym); (void)s; if (n > TIB) return 2; SET(p, h); return 0; }
ALLOC_ASYNC(cuMemAllocAsync)
ALLOC_ASYNC(cuMemAllocAsync_ptsz)
#define ALLOC_POOL(sym) \
CUresult sym(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) { \
    unsigned long long h = HANDLE(sym); UNUSED(pool, s); if (n > TIB) return 2; SET(p, h); \
    return 0; }
ALLOC_POOL(cuMemAllocFromPoolAsync)
ALLOC_POOL(cuMemAllocFromPoolAsync_ptsz)
CUresult cuMemFree_v2(CUdeviceptr p) { return down ? 4 : p ? 0 : 1; }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return p ? 0 : 1; }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { (void)s; return p ? 0 : 1; }

/* virtual memory */
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    unsigned long long v = HANDLE(cuMemCreate); UNUSED(prop, flags); if (n > TIB) return 2;
    SET(h, v); return 0;
}
CUresult cuMemMap(CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h,
                  unsigned long long flags) { UNUSED(p, n, off, h, flags); return 0; }
CUresult cuMemUnmap(CUdeviceptr p, size_t n) { UNUSED(p, n); return 0; }
CUresult cuMemRelease(CUmemGenericAllocationHandle h) { (void)h; return 0; }
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t align, CUdeviceptr addr,
                             unsigned long long flags) {
    UNUSED(n, align, addr, flags); SET(p, HANDLE(cuMemAddressReserve)); return 0;
}

typedef struct { struct { int type, id; } location; int flags; } CUmemAccessDesc;
CUresult cuMemSetAccess(CUdeviceptr p, size_t n, const CUmemAccessDesc *desc, size_t count) {
    UNUSED(p, n, desc); return count ? 0 : 1;
}
CUresult cuMemAddressFree(CUdeviceptr p, size_t n) { UNUSED(p, n); return 0; }

/* copies */
#define COPY(sym, D, S) CUresult sym(D d, S s, size_t n) { UNUSED(d, s, n); return 0; }
#define COPY_ASYNC(sym, D, S) \
    CUresult sym(D d, S s, size_t n, CUstream st) { UNUSED(d, s, n, st); return 0; }
COPY(cuMemcpyHtoD_v2, CUdeviceptr, const void *)
COPY(cuMemcpyHtoD_v2_ptds, CUdeviceptr, const void *)
COPY(cuMemcpyDtoH_v2, void *, CUdeviceptr)
COPY(cuMemcpyDtoH_v2_ptds, void *, CUdeviceptr)
COPY(cuMemcpyDtoD_v2, CUdeviceptr, CUdeviceptr)
COPY(cuMemcpyDtoD_v2_ptds, CUdeviceptr, CUdeviceptr)
COPY(cuMemcpy, CUdeviceptr, CUdeviceptr)
COPY(cuMemcpy_ptds, CUdeviceptr, CUdeviceptr)
COPY_ASYNC(cuMemcpyAsync, CUdeviceptr, CUdeviceptr)
COPY_ASYNC(cuMemcpyAsync_ptsz, CUdeviceptr, CUdeviceptr)
COPY_ASYNC(cuMemcpyHtoDAsync_v2, CUdeviceptr, const void *)
COPY_ASYNC(cuMemcpyHtoDAsync_v2_ptsz, CUdeviceptr, const void *)
COPY_ASYNC(cuMemcpyDtoHAsync_v2, void *, CUdeviceptr)
COPY_ASYNC(cuMemcpyDtoHAsync_v2_ptsz, void *, CUdeviceptr)
COPY_ASYNC(cuMemcpyDtoDAsync_v2, CUdeviceptr, CUdeviceptr)
COPY_ASYNC(cuMemcpyDtoDAsync_v2_ptsz, CUdeviceptr, CUdeviceptr)
#define PEER(sym) CUresult sym(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, \
                               size_t n, CUstream st) { UNUSED(d, dc, s, sc, n, st); return 0; }
PEER(cuMemcpyPeerAsync)
PEER(cuMemcpyPeerAsync_ptsz)
CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *c) { (void)c; return 0; }
CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *c) { (void)c; return 0; }
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *c, CUstream s) { UNUSED(c, s); return 0; }
CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *c, CUstream s) { UNUSED(c, s); return 0; }
CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *c) { (void)c; return 0; }
CUresult cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D *c) { (void)c; return 0; }
CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *c, CUstream s) { UNUSED(c, s); return 0; }
CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D *c, CUstream s) { UNUSED(c, s); return 0; }

/* memsets */
#define MEMSET(sym, T) CUresult sym(CUdeviceptr d, T v, size_t n) { UNUSED(d, v, n); return 0; }
#define MEMSET_ASYNC(sym, T) \
    CUresult sym(CUdeviceptr d, T v, size_t n, CUstream s) { UNUSED(d, v, n, s); return 0; }
MEMSET(cuMemsetD8_v2, unsigned char)
MEMSET(cuMemsetD8_v2_ptds, unsigned char)
MEMSET(cuMemsetD16_v2, unsigned short)
MEMSET(cuMemsetD16_v2_ptds, unsigned short)
MEMSET(cuMemsetD32_v2, unsigned int)
MEMSET(cuMemsetD32_v2_ptds, unsigned int)
MEMSET_ASYNC(cuMemsetD8Async, unsigned char)
MEMSET_ASYNC(cuMemsetD8Async_ptsz, unsigned char)
MEMSET_ASYNC(cuMemsetD16Async, unsigned short)
MEMSET_ASYNC(cuMemsetD16Async_ptsz, unsigned short)
MEMSET_ASYNC(cuMemsetD32Async, unsigned int)
MEMSET_ASYNC(cuMemsetD32Async_ptsz, unsigned int)

/* synchronisation, events, cross-stream waits */
CUresult cuStreamSynchronize(CUstream s) { (void)s; nap(2000000); return 0; }
CUresult cuStreamSynchronize_ptsz(CUstream s) { (void)s; nap(2000000); return 0; }
CUresult cuCtxSynchronize(void) { nap(2000000); return 0; }
CUresult cuCtxSynchronize_v2(CUcontext c) { (void)c; nap(2000000); return 0; }
CUresult cuEventSynchronize(CUevent e) { (void)e; nap(2000000); return 0; }
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned f) { UNUSED(s, e, f); return 0; }
CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned f) { UNUSED(s, e, f); return 0; }
CUresult cuEventRecord(CUevent e, CUstream s) { UNUSED(e, s); return 0; }
CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { UNUSED(e, s); return 0; }
CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned f) { UNUSED(e, s, f); return 0; }
CUresult cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned f) { UNUSED(e, s, f); return 0; }

/* modules and libraries */
CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    unsigned long long h = HANDLE(cuModuleLoadData); if (bad_image(image)) return 218;
    SET(m, h); return 0;
}
CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, CUjit_option *o,
                            void **v) {
    unsigned long long h = HANDLE(cuModuleLoadDataEx); UNUSED(n, o, v);
    if (bad_image(image)) return 218;
    SET(m, h); return 0;
}
CUresult cuLibraryLoadData(CUlibrary *l, const void *code, CUjit_option *jo, void **jv,
                           unsigned nj, CUlibraryOption *lo, void **lv, unsigned nl) {
    unsigned long long h = HANDLE(cuLibraryLoadData); UNUSED(jo, jv, nj, lo, lv, nl);
    if (bad_image(code)) return 218;
    SET(l, h); return 0;
}
static int missing_file(const char *fname) { return !fname || !strncmp(fname, "missing", 7); }
CUresult cuModuleLoad(CUmodule *m, const char *fname) {
    unsigned long long h = HANDLE(cuModuleLoad); if (missing_file(fname)) return 301;
    SET(m, h); return 0;
}
CUresult cuLibraryLoadFromFile(CUlibrary *l, const char *fname, CUjit_option *jo, void **jv,
                               unsigned nj, CUlibraryOption *lo, void **lv, unsigned nl) {
    unsigned long long h = HANDLE(cuLibraryLoadFromFile); UNUSED(jo, jv, nj, lo, lv, nl);
    if (missing_file(fname)) return 301;
    SET(l, h); return 0;
}
CUresult cuModuleUnload(CUmodule m) { return down ? 4 : m ? 0 : 400; }
CUresult cuLibraryUnload(CUlibrary l) { return down ? 4 : l ? 0 : 400; }
static CUresult lookup(void **out, unsigned long long h, const char *name) {
    if (!strcmp(name, "missing")) return 500;
    if (!strcmp(name, "vector_add")) h = 0x1000;
    else if (!strcmp(name, "gemm_tile")) h = 0x2000;
    *out = (void *)h;
    return 0;
}
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    (void)m; return lookup(f, HANDLE(cuModuleGetFunction), name);
}
CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary l, const char *name) {
    (void)l; return lookup(k, HANDLE(cuLibraryGetKernel), name);
}

/* contexts */
CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d) {
    UNUSED(flags, d); SET(c, HANDLE(cuCtxCreate_v2)); return 0;
}
CUresult cuCtxCreate_v3(CUcontext *c, CUexecAffinityParam *p, int n, unsigned flags, CUdevice d) {
    UNUSED(p, n, flags, d); SET(c, HANDLE(cuCtxCreate_v3)); return 0;
}
CUresult cuCtxCreate_v4(CUcontext *c, CUctxCreateParams *p, unsigned flags, CUdevice d) {
    UNUSED(p, flags, d); SET(c, HANDLE(cuCtxCreate_v4)); return 0;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    (void)d; SET(c, HANDLE(cuDevicePrimaryCtxRetain)); return 0;
}
