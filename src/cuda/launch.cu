/* The element-wise kernels: each body of kernels.h run as a grid-stride
 * loop, one instantiation per line of DP_KERNELS, so a kernel added there
 * needs nothing here. */
#include <stdio.h>

#include "cuda/cuda_ctx.h"

namespace {

template <int ID> struct dp_body;
#define DP_BODY(ID, name)                                                                        \
    template <> struct dp_body<DP_K_##ID> {                                                      \
        static __device__ __forceinline__ void run(const dp_kernel *k, long i)                   \
        {                                                                                        \
            dp_k_##name(k, i);                                                                   \
        }                                                                                        \
    };
DP_KERNELS(DP_BODY)
#undef DP_BODY

/* __grid_constant__: the body takes the arguments' address without a
 * per-thread copy into local memory. */
template <int ID> __global__ void dp_run(const __grid_constant__ dp_kernel k)
{
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < k.items; i += stride)
        dp_body<ID>::run(&k, i);
}

const char *const dp_kernel_names[] = {
#define DP_NAME(ID, name) #name,
    DP_KERNELS(DP_NAME)
#undef DP_NAME
};

} // namespace

enum { DP_BLOCK = 256, DP_BLOCKS_PER_SM = 32 };

/* A kernel's parameters are passed by value in at most 4 KB (32,764 bytes
 * from CUDA 12.1 on Volta and newer): dp_kernel must stay far below. */
static_assert(sizeof(dp_kernel) <= 4096, "dp_kernel is too large to be a kernel parameter");

void dp_cuda_launch(void *ctx, const dp_kernel *k)
{
    dp_cuda *c = (dp_cuda *)ctx;
    if (dp_cuda_enter(c) < 0)
        return;
    if ((int)k->id < 0 || (int)k->id >= DP_K_COUNT) {
        dp_cuda_fail(c, "launch: unknown kernel id %d (this plugin knows %d kernels)", (int)k->id,
                     (int)DP_K_COUNT);
        return;
    }
    if (k->items <= 0)
        return;
    /* Enough blocks to fill the GPU several times over; the grid-stride
     * loop covers the rest. */
    long blocks = (k->items + DP_BLOCK - 1) / DP_BLOCK;
    long cap = (long)(c->sm_count > 0 ? c->sm_count : 1) * DP_BLOCKS_PER_SM;
    unsigned grid = (unsigned)(blocks < cap ? blocks : cap);
    /* A launch's own error is read back through cudaGetLastError, which also
     * holds whatever a call before it left there (cudaErrorNotReady from a
     * cudaStreamQuery, a library's internal call); those were handled where
     * they were returned, so they must not be blamed on this kernel.  A
     * sticky error is not cleared by this and shows again below. */
    (void)cudaGetLastError();
    switch (k->id) {
#define DP_CASE(ID, name)                                                                        \
    case DP_K_##ID:                                                                              \
        dp_run<DP_K_##ID><<<grid, DP_BLOCK, 0, c->stream>>>(*k);                                 \
        break;
        DP_KERNELS(DP_CASE)
#undef DP_CASE
    default:
        break; /* checked above */
    }
    char what[64];
    snprintf(what, sizeof what, "kernel %s", dp_kernel_names[k->id]);
    if (dp_cuda_check(c, cudaGetLastError(), what) < 0)
        return;
    dp_cuda_queued(c, what);
}

cudaError_t dp_cuda_kernels_runnable(void)
{
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, dp_run<0>);
    if (e != cudaSuccess)
        (void)cudaGetLastError();
    return e;
}
