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

cudaError_t dp_cuda_select(dp_cuda *c)
{
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e == cudaSuccess && cur != c->device)
        e = cudaSetDevice(c->device);
    if (e != cudaSuccess)
        (void)cudaGetLastError();
    return e;
}

int dp_cuda_enter(dp_cuda *c)
{
    if (c->failed || (c->capturing && c->cap_failed))
        return -1;
    /* The current device is per thread; the caller may have moved threads. */
    if (dp_cuda_check(c, dp_cuda_select(c), "cudaSetDevice") < 0)
        return -1;
#ifdef DP_HAVE_NCCL
    if (c->comms)
        dp_cuda_comm_settle(c);
#endif
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
    if (!c->failed)
        (void)dp_cuda_check(c, dp_cuda_select(c), "cudaSetDevice");
#ifdef DP_HAVE_NCCL
    if (!c->failed && c->comms) /* a sum NCCL is still queueing is part of the wait */
        dp_cuda_comm_settle(c);
#endif
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
    /* A communicator's own error is not the device's: comm_wait reports it,
     * and the caller aborts that communicator and goes on (backend.h). */
    if (!c->failed)
        return 0;
    if (msg && len)
        snprintf(msg, len, "%s", c->err);
    return -1;
}
