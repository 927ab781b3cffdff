/* Graphs: the stream's work captured once, replayed by one launch. */
#include <stdio.h>
#include <stdlib.h>

#include "cuda/cuda_ctx.h"

typedef struct dp_cuda_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
} dp_cuda_graph;

int dp_cuda_capture_begin(void *ctx, char *msg, size_t len)
{
    dp_cuda *c = (dp_cuda *)ctx;
    if (c->capturing) {
        snprintf(msg, len, "capture_begin: a capture is already under way");
        return -1;
    }
    if (dp_cuda_enter(c) < 0) {
        snprintf(msg, len, "capture_begin: the device failed earlier: %s", c->err);
        return -1;
    }
    /* ThreadLocal: other threads' CUDA calls (a data loader) may go on. */
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(msg, len, "cudaStreamBeginCapture: %s (%s)", cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return -1;
    }
    c->capturing = 1;
    c->cap_failed = 0;
    c->cap_err[0] = '\0';
    return 0;
}

int dp_cuda_capture_end(void *ctx, void **graph, char *msg, size_t len)
{
    dp_cuda *c = (dp_cuda *)ctx;
    *graph = NULL;
    if (!c->capturing) {
        snprintf(msg, len, "capture_end: no capture is under way");
        return -1;
    }
    cudaGraph_t g = NULL;
    /* Always ended, even after a failure, to give the stream back. */
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    c->capturing = 0;
    if (c->cap_failed || e != cudaSuccess) {
        if (e != cudaSuccess)
            (void)cudaGetLastError();
        if (c->cap_failed)
            snprintf(msg, len, "graph capture: %s", c->cap_err);
        else
            snprintf(msg, len, "cudaStreamEndCapture: %s (%s)", cudaGetErrorString(e),
                     cudaGetErrorName(e));
        if (g)
            (void)cudaGraphDestroy(g);
        return -1;
    }
    dp_cuda_graph *h = (dp_cuda_graph *)calloc(1, sizeof *h);
    if (!h) {
        (void)cudaGraphDestroy(g);
        snprintf(msg, len, "graph capture: out of host memory");
        return -1;
    }
    e = cudaGraphInstantiate(&h->exec, g, 0);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(msg, len, "cudaGraphInstantiate: %s (%s)", cudaGetErrorString(e),
                 cudaGetErrorName(e));
        (void)cudaGraphDestroy(g);
        free(h);
        return -1;
    }
    h->graph = g;
    *graph = h;
    return 0;
}

int dp_cuda_graph_launch(void *ctx, void *graph)
{
    dp_cuda *c = (dp_cuda *)ctx;
    dp_cuda_graph *h = (dp_cuda_graph *)graph;
    if (dp_cuda_enter(c) < 0)
        return -1;
    if (c->capturing) {
        dp_cuda_fail(c, "graph_launch during a graph capture");
        return -1;
    }
    if (dp_cuda_check(c, cudaGraphLaunch(h->exec, c->stream), "cudaGraphLaunch") < 0)
        return -1;
    dp_cuda_queued(c, "a graph");
    return c->failed ? -1 : 0;
}

void dp_cuda_graph_free(void *ctx, void *graph)
{
    (void)ctx;
    dp_cuda_graph *h = (dp_cuda_graph *)graph;
    if (!h)
        return;
    if (cudaGraphExecDestroy(h->exec) != cudaSuccess)
        (void)cudaGetLastError();
    if (cudaGraphDestroy(h->graph) != cudaSuccess)
        (void)cudaGetLastError();
    free(h);
}
