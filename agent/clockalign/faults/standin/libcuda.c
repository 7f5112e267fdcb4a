/* A fake libcuda.so.1 for integration tests: the real driver API's exported symbols and
 * calling conventions, with known behaviour (no GPU needed):
 *   cuMemAlloc_v2 / cuMemAllocAsync return 2 (CUDA_ERROR_OUT_OF_MEMORY) for > 1 TiB,
 *   cuLaunchKernel* return 700 (CUDA_ERROR_ILLEGAL_ADDRESS) when f == 0xdead,
 *   synchronize calls sleep 2 ms so they have a measurable duration. */
#include <stddef.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUfunction, *CUstream, *CUevent;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;

static volatile unsigned long long next_ptr = 0x7f0000000000ULL;
static void nap(long ns) { struct timespec t = {0, ns}; nanosleep(&t, NULL); }
static CUresult alloc(CUdeviceptr *p, size_t n) {
    if (n > (1ULL << 40)) return 2;
    *p = __atomic_fetch_add(&next_ptr, (n + 255) & ~255ULL, __ATOMIC_SEQ_CST);
    return 0;
}

CUresult cuInit(unsigned flags) { (void)flags; return 0; }
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params,
                        void **extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)s;
    (void)params; (void)extra;
    return f == (CUfunction)0xdead ? 700 : 0;
}
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)c; (void)params; (void)extra;
    return f == (CUfunction)0xdead ? 700 : 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return alloc(p, n); }
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return alloc(p, n); }
CUresult cuMemFree_v2(CUdeviceptr p) { return p ? 0 : 1; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { (void)d; (void)s; (void)n; return 0; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { (void)d; (void)s; (void)n; return 0; }
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    (void)d; (void)s; (void)n; (void)st; return 0;
}
CUresult cuStreamSynchronize(CUstream s) { (void)s; nap(2000000); return 0; }
CUresult cuCtxSynchronize(void) { nap(2000000); return 0; }
CUresult cuEventSynchronize(CUevent e) { (void)e; nap(2000000); return 0; }
