/* The function the probe-cost micro-benchmark calls: cuLaunchKernel's signature, built
 * -O0 -fcf-protection=none so that it starts with `push %rbp` like most real prologues.
 * A probed first instruction that the kernel cannot emulate (the gcc-built stand-in's
 * `cmp`) is single-stepped out of line: a second trap that makes every probe look dearer
 * than on a real libcuda. */
typedef int CUresult;
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shmem, void *s, void **params,
                        void **extra)
{
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)s;
    (void)params; (void)extra;
    return f == (void *)0xdead ? 700 : 0;
}
