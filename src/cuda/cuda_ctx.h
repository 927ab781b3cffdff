/* The CUDA backend's context and the helpers its files share (one stream,
 * one cuBLAS handle, the first failure of queued work).  C++ under nvcc;
 * nothing here is exported from the plugin (hidden visibility), only
 * dp_backend_cuda_v1 is (backend_cuda.cu). */
#ifndef DP_CUDA_CTX_H
#define DP_CUDA_CTX_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "device/backend.h"

#define DP_CUDA_MSG 512

typedef struct dp_cuda_comm dp_cuda_comm; /* nccl.cu */

typedef struct dp_cuda {
    int device;
    int sm_count;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *workspace; /* cuBLAS's, set once so captured products allocate nothing */
    int tf32;        /* DOWNPOUR_TF32=1: products in TF32 tensor-core math */
    int sync_each;   /* DOWNPOUR_CUDA_SYNC=1: wait after every queued call */
    int capturing;
    /* The first failure of queued work; it stays, as a broken CUDA context
     * does (an illegal address fails every later call). */
    int failed;
    char err[DP_CUDA_MSG];
    /* A failure while capturing fails the capture, not the device. */
    int cap_failed;
    char cap_err[DP_CUDA_MSG];
    char last[64]; /* what was queued last: "kernel xent_fwd", "gemm 128x300x784" */
    char desc[256];
    dp_cuda_comm *comms; /* joined communicators, destroyed at close */
} dp_cuda;

/* Records the first failure (of the capture, while capturing). */
void dp_cuda_fail(dp_cuda *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 0 when e is cudaSuccess; else clears CUDA's last error (so a later launch
 * check does not blame the wrong call), records "what: message (name)" and
 * returns -1. */
int dp_cuda_check(dp_cuda *c, cudaError_t e, const char *what);
/* Makes c's GPU the calling thread's current device (it is per thread, and
 * the caller may have moved threads): cudaSuccess or cudaSetDevice's error. */
cudaError_t dp_cuda_select(dp_cuda *c);
/* Before queueing: -1 when the device (or the capture) already failed, or
 * the calling thread cannot select the device.  A sum NCCL is still queueing
 * is waited for first (dp_cuda_comm_settle), so later work follows it. */
int dp_cuda_enter(dp_cuda *c);
/* After queueing `what`: remembers it for messages, and with
 * DOWNPOUR_CUDA_SYNC=1 (outside captures) waits and names it on failure. */
void dp_cuda_queued(dp_cuda *c, const char *what);

/* The entries, one file each. */
void *dp_cuda_alloc(void *ctx, size_t bytes);
void dp_cuda_free(void *ctx, void *p);
void *dp_cuda_host_alloc(void *ctx, size_t bytes);
void dp_cuda_host_free(void *ctx, void *p);
int dp_cuda_host_register(void *ctx, void *p, size_t bytes, char *msg, size_t len);
void dp_cuda_host_unregister(void *ctx, void *p);
int dp_cuda_copy(void *ctx, void *dst, const void *src, size_t bytes, dp_copy_dir dir);
int dp_cuda_sync(void *ctx, char *msg, size_t len);
void dp_cuda_gemm(void *ctx, const dp_gemm *g);
void dp_cuda_launch(void *ctx, const dp_kernel *k);
/* Whether this plugin has machine code (or PTX) the current device runs:
 * cudaSuccess, or CUDA's error (cudaErrorNoKernelImageForDevice). */
cudaError_t dp_cuda_kernels_runnable(void);
int dp_cuda_capture_begin(void *ctx, char *msg, size_t len);
int dp_cuda_capture_end(void *ctx, void **graph, char *msg, size_t len);
int dp_cuda_graph_launch(void *ctx, void *graph);
void dp_cuda_graph_free(void *ctx, void *graph);
#ifdef DP_HAVE_NCCL
int dp_cuda_comm_id(void *ctx, uint8_t *id, size_t id_len, char *msg, size_t len);
int dp_cuda_comm_join(void *ctx, const uint8_t *id, size_t id_len, int ranks, int rank, void **comm,
                      char *msg, size_t len);
int dp_cuda_comm_allreduce(void *ctx, void *comm, float *buf, size_t n);
int dp_cuda_comm_wait(void *ctx, void *comm, double timeout_s, char *msg, size_t len);
void dp_cuda_comm_abort(void *ctx, void *comm);
void dp_cuda_comm_free(void *ctx, void *comm);
/* Waits, bounded, until NCCL has queued every sum it returned ncclInProgress
 * for (a non-blocking communicator), so work queued after it on the stream
 * runs after it; a failure or the bound fails that communicator alone. */
void dp_cuda_comm_settle(dp_cuda *c);
void dp_cuda_comm_close_all(dp_cuda *c);
#endif

#endif
