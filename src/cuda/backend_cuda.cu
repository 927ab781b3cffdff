/* The CUDA backend (backend.h): opening a GPU with its stream and cuBLAS
 * handle, and the table the plugin exports as DP_BACKEND_CUDA_SYMBOL. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_ctx.h"

#ifndef DP_CUDA_ARCHS
#define DP_CUDA_ARCHS "?"
#endif

/* cuBLAS's recommended workspace on Hopper (32 MiB; 4 MiB before it).
 * Given once, so products captured in a graph allocate nothing. */
#define DP_CUBLAS_WORKSPACE ((size_t)32 << 20)

static int env_on(const char *name)
{
    const char *v = getenv(name);
    return v && strcmp(v, "1") == 0;
}

/* Why cudaGetDeviceCount failed, in the words a user acts on. */
static void count_failed(cudaError_t e, char *msg, size_t len)
{
    int driver = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess)
        driver = 0;
    (void)cudaGetLastError();
    switch (e) {
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorCallRequiresNewerDriver:
        if (driver == 0)
            snprintf(msg, len,
                     "no usable GPU: the NVIDIA driver (libcuda.so.1) was not found or is older "
                     "than this CUDA runtime %d.%d (cudaGetDeviceCount: %s, %s)",
                     CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, cudaGetErrorString(e),
                     cudaGetErrorName(e));
        else
            snprintf(msg, len,
                     "no usable GPU: the NVIDIA driver supports CUDA %d.%d, older than this CUDA "
                     "runtime %d.%d; update the driver (cudaGetDeviceCount: %s, %s)",
                     driver / 1000, driver % 1000 / 10, CUDART_VERSION / 1000,
                     CUDART_VERSION % 1000 / 10, cudaGetErrorString(e), cudaGetErrorName(e));
        break;
    case cudaErrorNoDevice:
        snprintf(msg, len,
                 "no usable GPU: the NVIDIA driver found no GPU (check nvidia-smi, and "
                 "CUDA_VISIBLE_DEVICES if it is set) (cudaGetDeviceCount: %s)",
                 cudaGetErrorName(e));
        break;
    default:
        snprintf(msg, len, "no usable GPU: cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
                 cudaGetErrorName(e));
    }
}

static int fail(char *msg, size_t len, const char *what, cudaError_t e)
{
    (void)cudaGetLastError();
    snprintf(msg, len, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return -1;
}

static void cuda_close(void *ctx)
{
    dp_cuda *c = (dp_cuda *)ctx;
    if (!c)
        return;
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != c->device)
        (void)cudaSetDevice(c->device);
    if (c->stream)
        (void)cudaStreamSynchronize(c->stream); /* errors were reported by sync */
#ifdef DP_HAVE_NCCL
    dp_cuda_comm_close_all(c);
#endif
    if (c->blas)
        (void)cublasDestroy(c->blas);
    if (c->workspace)
        (void)cudaFree(c->workspace);
    if (c->stream)
        (void)cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    free(c);
}

static int cuda_open(void **out, int index, char *msg, size_t len)
{
    *out = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        count_failed(e, msg, len);
        return -1;
    }
    if (count == 0) {
        snprintf(msg, len, "no usable GPU: the NVIDIA driver found no GPU (check nvidia-smi)");
        return -1;
    }
    if (index < 0 || index >= count) {
        if (count == 1)
            snprintf(msg, len, "this machine has 1 GPU (cuda:0)");
        else
            snprintf(msg, len, "this machine has %d GPUs (cuda:0 to cuda:%d)", count, count - 1);
        return -1;
    }

    dp_cuda *c = (dp_cuda *)calloc(1, sizeof *c);
    if (!c) {
        snprintf(msg, len, "out of host memory");
        return -1;
    }
    c->device = index;
    c->tf32 = env_on("DOWNPOUR_TF32");
    c->sync_each = env_on("DOWNPOUR_CUDA_SYNC");
    cublasStatus_t s;
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(index)) != cudaSuccess) {
        fail(msg, len, "cudaSetDevice", e);
        goto fail;
    }
    if ((e = cudaGetDeviceProperties(&prop, index)) != cudaSuccess) {
        fail(msg, len, "cudaGetDeviceProperties", e);
        goto fail;
    }
    c->sm_count = prop.multiProcessorCount;
    /* An older GPU than the plugin was built for runs none of its kernels:
     * say so now rather than at the first launch. */
    if ((e = dp_cuda_kernels_runnable()) != cudaSuccess) {
        snprintf(msg, len,
                 "%s (compute capability %d.%d) cannot run this plugin's kernels, built for sm "
                 "%s: rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d%d (%s)",
                 prop.name, prop.major, prop.minor, DP_CUDA_ARCHS, prop.major, prop.minor,
                 cudaGetErrorName(e));
        goto fail;
    }
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        fail(msg, len, "cudaStreamCreateWithFlags", e);
        goto fail;
    }
    if ((s = cublasCreate(&c->blas)) != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        snprintf(msg, len, "cublasCreate: %s (%s)", cublasGetStatusString(s), cublasGetStatusName(s));
        goto fail;
    }
    if ((e = cudaMalloc(&c->workspace, DP_CUBLAS_WORKSPACE)) != cudaSuccess) {
        c->workspace = NULL;
        fail(msg, len, "cudaMalloc of cuBLAS's 32 MiB workspace", e);
        goto fail;
    }
    if ((s = cublasSetStream(c->blas, c->stream)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasSetWorkspace(c->blas, c->workspace, DP_CUBLAS_WORKSPACE)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasSetPointerMode(c->blas, CUBLAS_POINTER_MODE_HOST)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasSetMathMode(c->blas, c->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH)) !=
            CUBLAS_STATUS_SUCCESS) {
        snprintf(msg, len, "setting up cuBLAS: %s (%s)", cublasGetStatusString(s),
                 cublasGetStatusName(s));
        goto fail;
    }
    snprintf(c->desc, sizeof c->desc, "%.160s (cuda:%d, %.1f GiB, compute %d.%d, %s)", prop.name, index,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), prop.major, prop.minor,
             c->tf32 ? "TF32 products: DOWNPOUR_TF32=1" : "FP32 products");
    *out = c;
    return 0;
fail:
    cuda_close(c);
    return -1;
}

static void cuda_describe(void *ctx, char *buf, size_t len)
{
    snprintf(buf, len, "%s", ((dp_cuda *)ctx)->desc);
}

static const dp_backend dp_backend_cuda = {
    DP_BACKEND_ABI,
    "cuda",
    cuda_open,
    cuda_close,
    cuda_describe,
    dp_cuda_alloc,
    dp_cuda_free,
    dp_cuda_host_alloc,
    dp_cuda_host_free,
    dp_cuda_host_register,
    dp_cuda_host_unregister,
    dp_cuda_copy,
    dp_cuda_sync,
    dp_cuda_gemm,
    dp_cuda_launch,
    dp_cuda_capture_begin,
    dp_cuda_capture_end,
    dp_cuda_graph_launch,
    dp_cuda_graph_free,
#ifdef DP_HAVE_NCCL
    dp_cuda_comm_id,
    dp_cuda_comm_join,
    dp_cuda_comm_allreduce,
    dp_cuda_comm_wait,
    dp_cuda_comm_abort,
    dp_cuda_comm_free,
#else
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
#endif
};

/* The plugin's one exported symbol (DP_BACKEND_CUDA_SYMBOL). */
extern "C" __attribute__((visibility("default"))) const dp_backend *dp_backend_cuda_v1(void)
{
    return &dp_backend_cuda;
}
