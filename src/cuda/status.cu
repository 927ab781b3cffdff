/* The CUDA backend's failures: the first one of queued work is kept and
 * reported by every later sync, naming what was running. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_ctx.h"

void dp_cuda_fail(dp_cuda *c, const char *fmt, ...)
{
    int *flag = c->capturing ? &c->cap_failed : &c->failed;
    char *buf = c->capturing ? c->cap_err : c->err;
    if (*flag)
        return; /* the first failure is the cause; later ones follow from it */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, DP_CUDA_MSG, fmt, ap);
    va_end(ap);
    *flag = 1;
}

int dp_cuda_check(dp_cuda *c, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError(); /* clear a non-sticky error so it is not reported twice */
    dp_cuda_fail(c, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return -1;
}

int dp_cuda_enter(dp_cuda *c)
{
    if (c->failed || (c->capturing && c->cap_failed))
        return -1;
    /* The current device is per thread; the caller may have moved threads. */
    int cur = -1;
    if (dp_cuda_check(c, cudaGetDevice(&cur), "cudaGetDevice") < 0)
        return -1;
    if (cur != c->device && dp_cuda_check(c, cudaSetDevice(c->device), "cudaSetDevice") < 0)
        return -1;
    return 0;
}

void dp_cuda_queued(dp_cuda *c, const char *what)
{
    snprintf(c->last, sizeof c->last, "%s", what);
    if (c->sync_each && !c->capturing)
        dp_cuda_check(c, cudaStreamSynchronize(c->stream), what);
}

int dp_cuda_sync(void *ctx, char *msg, size_t len)
{
    dp_cuda *c = (dp_cuda *)ctx;
    if (c->capturing) { /* a wait would invalidate the capture */
        if (msg && len)
            snprintf(msg, len, "sync during a graph capture (end the capture first)");
        return -1;
    }
    if (!c->failed) {
        int cur = -1;
        if (cudaGetDevice(&cur) == cudaSuccess && cur != c->device)
            (void)dp_cuda_check(c, cudaSetDevice(c->device), "cudaSetDevice");
    }
    if (!c->failed) {
        cudaError_t e = cudaStreamSynchronize(c->stream);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            /* An asynchronous failure: the stream does not say which call. */
            dp_cuda_fail(c,
                         "%s (%s), in work queued up to %s; run with DOWNPOUR_CUDA_SYNC=1 to stop "
                         "at the failing call",
                         cudaGetErrorString(e), cudaGetErrorName(e),
                         c->last[0] ? c->last : "the first call");
        }
    }
#ifdef DP_HAVE_NCCL
    if (!c->failed)
        dp_cuda_comm_poll(c);
#endif
    if (!c->failed)
        return 0;
    if (msg && len)
        snprintf(msg, len, "%s", c->err);
    return -1;
}
