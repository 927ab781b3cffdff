/* The backend table under the device executor (docs/gpu.md, "Backends").
 *
 * A backend is memory, copies, column-major products, element-wise kernels,
 * and optionally graphs and collectives, all queued in order on ONE stream.
 * The executor (dmodel.c) is written against this table only; "sim" (sim.c)
 * implements it on the host and "cuda" (src/cuda/backend_cuda.cu) in the
 * plugin libdownpour_cuda.so, whose one exported symbol is
 * DP_BACKEND_CUDA_SYMBOL.  The header is C and C++ alike, since nvcc
 * compiles the plugin as C++.
 *
 * Every queued call (copy, gemm, launch, graph_launch, comm_allreduce)
 * returns at once; a failure inside one is kept by the backend and reported
 * by the next sync().  Calls are never made from two threads at once. */
#ifndef DP_DEVICE_BACKEND_H
#define DP_DEVICE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "device/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever the table or dp_kernel changes: a plugin built from other
 * sources is refused with both numbers. */
#define DP_BACKEND_ABI 8
#define DP_BACKEND_CUDA_SYMBOL "dp_backend_cuda_v1"

typedef enum dp_copy_dir { DP_COPY_H2D, DP_COPY_D2H, DP_COPY_D2D } dp_copy_dir;

/* C = alpha op(A) op(B) + beta C in COLUMN-major order, exactly cuBLAS's
 * cublasSgemm: op(A) is m x k, op(B) k x n, C m x n; ta/tb 1 means the
 * stored matrix is transposed.  A row-major (r, c) matrix is a column-major
 * (c, r) one with leading dimension c: the executor's products are written
 * that way (dmodel.c, "Products").
 *
 * batch > 1 runs that many products, exactly cublasSgemmStridedBatched:
 * product i reads a + i stride_a, b + i stride_b and writes c + i stride_c
 * (strides in floats).  mha's attention issues one product per head over
 * the batch's records this way, not one launch per (record, head).  batch
 * 0 or 1 is one product (strides unread), so initializers that stop at ldc
 * keep their meaning. */
typedef struct dp_gemm {
    int ta, tb;
    int m, n, k;
    float alpha, beta;
    const float *a;
    int lda;
    const float *b;
    int ldb;
    float *c;
    int ldc;
    int batch;
    long long stride_a, stride_b, stride_c;
} dp_gemm;

typedef struct dp_backend {
    int abi;          /* DP_BACKEND_ABI */
    const char *name; /* "cuda", "sim" */

    /* Opens device `index`.  On failure msg says what is missing (no
     * driver, no GPU, the index past the count) and nothing is held. */
    int (*open)(void **ctx, int index, char *msg, size_t len);
    void (*close)(void *ctx);
    /* "NVIDIA H100 80GB HBM3 (cuda:0, 79.1 GiB)" */
    void (*describe)(void *ctx, char *buf, size_t len);

    /* Device memory, zero-filled; NULL when it does not fit. */
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *p);
    /* Page-locked host memory (copies from it are asynchronous); NULL when
     * it does not fit. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    /* Page-locks memory the caller allocated (cudaHostRegister), so copies
     * to and from it run at the bus's speed without a staging copy; the
     * rules above for host_alloc memory then hold for it.  0, or -1 with the
     * reason in msg (the memory stays usable, unlocked).  host_unregister
     * takes exactly a pointer registered before, before it is freed. */
    int (*host_register)(void *ctx, void *p, size_t bytes, char *msg, size_t len);
    void (*host_unregister)(void *ctx, void *p);
    /* Queued in stream order.  An H2D copy from host_alloc memory reads the
     * source when the stream reaches it, so that memory must stay unchanged
     * until a sync; from other memory the source is read before the call
     * returns.  A D2H copy's data is in place after the next sync. */
    int (*copy)(void *ctx, void *dst, const void *src, size_t bytes, dp_copy_dir dir);
    /* Waits until everything queued is done.  0, or -1 with the first
     * failure of queued work in msg (which stays failed). */
    int (*sync)(void *ctx, char *msg, size_t len);

    void (*gemm)(void *ctx, const dp_gemm *g);
    void (*launch)(void *ctx, const dp_kernel *k);

    /* Graphs (all NULL when the backend has none).  Between capture_begin
     * and capture_end, gemm, launch and H2D/D2D copies are recorded, not
     * run; graph_launch queues the recording.  Arguments are captured by
     * value, so anything that changes from one launch to the next must be
     * read from device memory (kernels.h, dp_step_block).  A recorded H2D
     * copy reads its host source at every replay, so it must come from
     * host_alloc or registered memory that outlives the graph. */
    int (*capture_begin)(void *ctx, char *msg, size_t len);
    int (*capture_end)(void *ctx, void **graph, char *msg, size_t len);
    int (*graph_launch)(void *ctx, void *graph);
    void (*graph_free)(void *ctx, void *graph);

    /* Collectives (all NULL when the backend has none): NCCL's unique id,
     * joining a communicator of `ranks` (every rank must join, each with
     * its own id bytes received from rank 0; the call returns once all
     * have), and a queued in-place sum over every rank of the communicator,
     * the same bits on every rank.
     *
     * A peer that dies leaves the others' sum waiting for ever, so a caller
     * never syncs on a collective blindly: comm_wait waits up to timeout_s
     * for everything queued (the sum included) and returns 1 when it is
     * done, 0 while it is not, -1 when it failed (a CUDA error, or the
     * communicator's own asynchronous error: NCCL's ncclCommGetAsyncError),
     * the reason in msg.  Between waits the caller looks for lost peers on
     * its own links.  comm_abort ends a communicator whose peers may be gone
     * without waiting for them (ncclCommAbort): the pending sum is abandoned
     * (its buffer holds no defined value) and later work on the stream runs;
     * comm_free ends a healthy one (waits for its work). */
    int (*comm_id)(void *ctx, uint8_t *id, size_t id_len, char *msg, size_t len);
    int (*comm_join)(void *ctx, const uint8_t *id, size_t id_len, int ranks, int rank,
                     void **comm, char *msg, size_t len);
    int (*comm_allreduce)(void *ctx, void *comm, float *buf, size_t n);
    int (*comm_wait)(void *ctx, void *comm, double timeout_s, char *msg, size_t len);
    void (*comm_abort)(void *ctx, void *comm);
    void (*comm_free)(void *ctx, void *comm);
} dp_backend;

/* The host backend (sim.c). */
extern const dp_backend dp_backend_sim;

/* The plugin's entry point has this type. */
typedef const dp_backend *(*dp_backend_entry)(void);

#ifdef __cplusplus
}
#endif

#endif
