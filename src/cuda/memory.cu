/* Device and pinned host memory, and copies queued on the stream. */
#include <stdio.h>

#include "cuda/cuda_ctx.h"

void *dp_cuda_alloc(void *ctx, size_t bytes)
{
    dp_cuda *c = (dp_cuda *)ctx;
    if (dp_cuda_enter(c) < 0)
        return NULL;
    if (c->capturing) { /* the memset would be recorded, and cudaMalloc may wait */
        dp_cuda_fail(c, "alloc of %zu bytes during a graph capture", bytes);
        return NULL;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        /* Not a failure of queued work: the caller names the memory that
         * does not fit.  Clear it so the next launch check is not blamed. */
        (void)cudaGetLastError();
        return NULL;
    }
    /* Zero-filled in stream order: every later use is on the same stream. */
    if (bytes && dp_cuda_check(c, cudaMemsetAsync(p, 0, bytes, c->stream), "cudaMemsetAsync") < 0) {
        (void)cudaFree(p);
        return NULL;
    }
    return p;
}

void dp_cuda_free(void *ctx, void *p)
{
    dp_cuda *c = (dp_cuda *)ctx;
    if (!p)
        return;
    if (c->capturing) { /* cudaFree waits for the device, which ends a capture */
        dp_cuda_fail(c, "free during a graph capture (the memory is kept)");
        return;
    }
    (void)dp_cuda_select(c);
    if (cudaFree(p) != cudaSuccess)
        (void)cudaGetLastError(); /* a failed device: sync reports the cause */
}

void *dp_cuda_host_alloc(void *ctx, size_t bytes)
{
    dp_cuda *c = (dp_cuda *)ctx;
    if (c->capturing) {
        dp_cuda_fail(c, "host_alloc of %zu bytes during a graph capture", bytes);
        return NULL;
    }
    /* Pinned memory belongs to the current context: this GPU's, not that of
     * whatever device the calling thread had current (a thread that never
     * chose one would create GPU 0's context here). */
    if (dp_cuda_select(c) != cudaSuccess)
        return NULL;
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

void dp_cuda_host_free(void *ctx, void *p)
{
    dp_cuda *c = (dp_cuda *)ctx;
    if (!p)
        return;
    if (c->capturing) {
        dp_cuda_fail(c, "host_free during a graph capture (the memory is kept)");
        return;
    }
    (void)dp_cuda_select(c);
    if (cudaFreeHost(p) != cudaSuccess)
        (void)cudaGetLastError();
}

/* Memory the caller owns, page-locked in place (a model's host arrays): a
 * failure is no fault of the device, so the reason goes back, not into
 * the context's kept failure. */
int dp_cuda_host_register(void *ctx, void *p, size_t bytes, char *msg, size_t len)
{
    dp_cuda *c = (dp_cuda *)ctx;
    if (c->capturing) {
        snprintf(msg, len, "host_register during a graph capture");
        return -1;
    }
    cudaError_t e = dp_cuda_select(c); /* registered in this GPU's context (host_alloc) */
    if (e != cudaSuccess) {
        snprintf(msg, len, "cudaSetDevice(%d): %s", c->device, cudaGetErrorString(e));
        return -1;
    }
    e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(msg, len, "cudaHostRegister of %zu bytes: %s", bytes, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

void dp_cuda_host_unregister(void *ctx, void *p)
{
    if (!p)
        return;
    (void)dp_cuda_select((dp_cuda *)ctx); /* the context it was registered in */
    if (cudaHostUnregister(p) != cudaSuccess)
        (void)cudaGetLastError();
}

int dp_cuda_copy(void *ctx, void *dst, const void *src, size_t bytes, dp_copy_dir dir)
{
    dp_cuda *c = (dp_cuda *)ctx;
    static const char *const names[] = {"copy H2D", "copy D2H", "copy D2D"};
    cudaMemcpyKind kind;
    switch (dir) {
    case DP_COPY_H2D: kind = cudaMemcpyHostToDevice; break;
    case DP_COPY_D2H: kind = cudaMemcpyDeviceToHost; break;
    case DP_COPY_D2D: kind = cudaMemcpyDeviceToDevice; break;
    default:
        dp_cuda_fail(c, "copy: unknown direction %d", (int)dir);
        return -1;
    }
    if (dp_cuda_enter(c) < 0)
        return -1;
    if (bytes == 0)
        return 0;
    char what[64];
    snprintf(what, sizeof what, "%s of %zu bytes", names[dir], bytes);
    if (dp_cuda_check(c, cudaMemcpyAsync(dst, src, bytes, kind, c->stream), what) < 0)
        return -1;
    /* backend.h: from memory that is not page-locked the source is read
     * before the call returns (callers free it at once: layer_lcn.c's taps).
     * CUDA promises that only when the driver stages the copy ("may"; "for
     * all other transfers, the function should be fully asynchronous",
     * "API synchronization behavior"), so wait for it here.  Never in a
     * step: the step block's ring is page-locked. */
    if (kind == cudaMemcpyHostToDevice && !c->capturing && !c->sync_each) {
        cudaPointerAttributes at;
        cudaError_t e = cudaPointerGetAttributes(&at, src);
        if (e != cudaSuccess)
            (void)cudaGetLastError();
        if (e != cudaSuccess || at.type == cudaMemoryTypeUnregistered) {
            e = cudaStreamSynchronize(c->stream);
            if (e != cudaSuccess) { /* as dp_cuda_sync: the stream does not say which call */
                (void)cudaGetLastError();
                dp_cuda_fail(c, "%s (%s), in work queued up to %s", cudaGetErrorString(e),
                             cudaGetErrorName(e), what);
                return -1;
            }
        }
    }
    dp_cuda_queued(c, what);
    return c->failed || (c->capturing && c->cap_failed) ? -1 : 0;
}
