/* "sim": the backend table run on the host (backend.h), so every path of the
 * executor and every kernel body is tested on machines without a GPU.
 *
 * Memory is host memory (calloc, counted); copies are memcpy; products are
 * CBLAS in column-major order with cuBLAS's argument conventions (a strided
 * batch one product at a time), checked first so an executor bug reads as a
 * message at the next sync rather than as BLAS's own complaint; a kernel is
 * its body in a loop over the items.  Everything runs at once on the
 * calling thread, so "queued" work is done when the call returns and sync
 * only reports the kept failure.
 *
 * Graphs as CUDA captures them: between capture_begin and capture_end, gemm,
 * launch and H2D/D2D copies are RECORDED, not run, with their arguments by
 * value; graph_launch replays the record.  So a step that reads a value
 * passed by value instead of from device memory replays stale on sim too.
 *
 * host_register keeps the caller's ranges as cudaHostRegister does: one that
 * overlaps a registered range is refused (cudaErrorHostMemoryAlreadyRegistered),
 * and unregistering a pointer not registered is ignored.  Nothing is locked:
 * the ranges are only counted (sim.h), so tests see what is pinned.
 * DOWNPOUR_SIM_PINNED=<bytes> caps the bytes registered at once, so tests
 * reach a trainer's fallback to pageable memory.
 * Collectives are sim_comm.c's: shared memory between the ranks' processes
 * or threads on this host.  A sum is the one thing queued for real (as
 * NCCL's is, so a caller's watch over its peers is tested here): what runs
 * after it on the stream finishes it first (dp_sim_comm_settle).
 *
 * DOWNPOUR_SIM_MEMORY=<bytes> caps the device memory, for tests of the
 * out-of-memory paths.
 *
 * DOWNPOUR_SIM_ORDER=forward (default) | reverse | shuffle runs each kernel's
 * items in that order.  A GPU runs them in parallel, in no order, so a body
 * whose result depends on the order (an item reading another item's output
 * of the same launch, two items writing one place) would pass every test
 * on a forward loop and race on a GPU; tests/test_sim_order.c runs every
 * kernel and whole steps under all three orders and wants the same bits
 * (docs/gpu.md, "Kernels").  shuffle visits item t of n at (a t + b) mod n,
 * with a coprime to n and a, b drawn anew for every launch (replays
 * included) from DOWNPOUR_SIM_SEED (default 1), so a failure reproduces;
 * nothing is allocated per launch. */
#include "device/sim.h"

#include <cblas.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend.h"
#include "downpour/blas.h"
#include "downpour/isa.h"
#include "downpour/rng.h"
#include "downpour/testhooks.h"

/* Each device block starts with its size, so free can count it back. */
#define SIM_HEADER 64

typedef enum sim_op { SIM_GEMM, SIM_LAUNCH, SIM_COPY } sim_op;

typedef struct sim_node {
    sim_op op;
    union {
        dp_gemm gemm;
        dp_kernel kernel;
        struct {
            void *dst;
            const void *src;
            size_t bytes;
        } copy;
    } u;
} sim_node;

typedef struct sim_graph {
    sim_node *nodes;
    size_t n, cap;
} sim_graph;

/* A host range registered with host_register. */
typedef struct sim_pin {
    uintptr_t lo;
    size_t bytes;
} sim_pin;

typedef enum sim_order { SIM_FORWARD, SIM_REVERSE, SIM_SHUFFLE } sim_order;

typedef struct sim_ctx {
    dp_sim_counts counts;
    sim_order order;   /* DOWNPOUR_SIM_ORDER */
    dp_rng rng;        /* shuffle's draws, from DOWNPOUR_SIM_SEED */
    sim_pin *pins; /* counts.pinned of them, room for cap_pins */
    size_t cap_pins;
    size_t limit;      /* device bytes allowed; SIZE_MAX: no cap */
    int capturing;
    sim_graph *rec;    /* the recording while capturing */
    int failed;
    char msg[256];     /* the first failure of queued work */
    dp_sim_comm *comms; /* joined and not yet ended (sim_comm.c) */
} sim_ctx;

/* Keeps the first failure; later ones would only be its consequences. */
static void sim_fail(sim_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sim_fail(sim_ctx *c, const char *fmt, ...)
{
    if (c->failed)
        return;
    c->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
}

/* DOWNPOUR_SIM_ORDER and DOWNPOUR_SIM_SEED into c; unset or empty: forward, seed 1. */
static int read_order(sim_ctx *c, char *msg, size_t len)
{
    static const char *const names[] = {"forward", "reverse", "shuffle"};
    const char *order = dp_hook_text(DP_HOOK_SIM_ORDER);
    c->order = SIM_FORWARD;
    if (order && *order) {
        int found = 0;
        for (int o = 0; o < 3; o++)
            if (strcmp(order, names[o]) == 0) {
                c->order = (sim_order)o;
                found = 1;
            }
        if (!found) {
            snprintf(msg, len,
                     "device sim: DOWNPOUR_SIM_ORDER '%s' is not an order of items; the "
                     "accepted values are forward, reverse, shuffle",
                     order);
            return -1;
        }
    }
    unsigned long long seed = 1;
    const char *s = dp_hook_text(DP_HOOK_SIM_SEED);
    if (s && *s) {
        char *end;
        seed = strtoull(s, &end, 10);
        if (*end || *s == '-') {
            snprintf(msg, len,
                     "device sim: DOWNPOUR_SIM_SEED '%s' is not a seed (an unsigned decimal "
                     "integer)",
                     s);
            return -1;
        }
    }
    dp_rng_seed(&c->rng, (uint64_t)seed);
    return 0;
}

static int sim_open(void **ctx, int index, char *msg, size_t len)
{
    if (index != 0) {
        snprintf(msg, len, "device sim: there is one sim device (index 0), not %d", index);
        return -1;
    }
    sim_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(msg, len, "device sim: out of memory for its context");
        return -1;
    }
    c->limit = SIZE_MAX;
    const char *cap = dp_hook_text(DP_HOOK_SIM_MEMORY);
    if (cap && *cap) {
        char *end;
        unsigned long long v = strtoull(cap, &end, 10);
        if (*end) {
            snprintf(msg, len, "device sim: DOWNPOUR_SIM_MEMORY '%s' is not a count of bytes",
                     cap);
            free(c);
            return -1;
        }
        c->limit = (size_t)v;
    }
    if (read_order(c, msg, len) < 0) {
        free(c);
        return -1;
    }
    *ctx = c;
    return 0;
}

static void sim_graph_free(void *ctx, void *graph)
{
    (void)ctx;
    sim_graph *gr = graph;
    if (!gr)
        return;
    free(gr->nodes);
    free(gr);
}

static void sim_close(void *ctx)
{
    sim_ctx *c = ctx;
    if (!c)
        return;
    dp_sim_comm_close_all(c);
    sim_graph_free(c, c->rec);
    free(c->pins);
    free(c);
}

static void sim_describe(void *ctx, char *buf, size_t len)
{
    (void)ctx;
    snprintf(buf, len, "sim (host)");
}

static void *sim_alloc(void *ctx, size_t bytes)
{
    sim_ctx *c = ctx;
    if (c->failed) /* as the CUDA plugin: a failed device allocates nothing */
        return NULL;
    if (bytes > c->limit - c->counts.bytes || bytes > SIZE_MAX - SIM_HEADER)
        return NULL;
    unsigned char *p = calloc(1, bytes + SIM_HEADER);
    if (!p)
        return NULL;
    memcpy(p, &bytes, sizeof bytes);
    c->counts.allocs++;
    c->counts.bytes += bytes;
    return p + SIM_HEADER;
}

static void sim_free(void *ctx, void *p)
{
    sim_ctx *c = ctx;
    if (!p)
        return;
    unsigned char *base = (unsigned char *)p - SIM_HEADER;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    c->counts.bytes -= bytes;
    free(base);
}

static void *sim_host_alloc(void *ctx, size_t bytes)
{
    sim_ctx *c = ctx;
    void *p = malloc(bytes ? bytes : 1);
    if (p)
        c->counts.host_allocs++;
    return p;
}

static void sim_host_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

/* As cudaHostRegister: refused for no bytes, during a capture (as the CUDA
 * plugin refuses it), and for a range that overlaps one registered.  The
 * messages name no device, as the plugin's: the caller does (dmodel.c). */
static int sim_host_register(void *ctx, void *p, size_t bytes, char *msg, size_t len)
{
    sim_ctx *c = ctx;
    uintptr_t lo = (uintptr_t)p;
    if (!p || bytes == 0 || bytes > UINTPTR_MAX - lo) {
        snprintf(msg, len, "host_register of %zu bytes at %p: invalid argument", bytes, p);
        return -1;
    }
    if (c->capturing) {
        snprintf(msg, len, "host_register during a graph capture");
        return -1;
    }
    const char *limit = dp_hook_text(DP_HOOK_SIM_PINNED);
    if (limit && *limit) {
        char *end;
        unsigned long long v = strtoull(limit, &end, 10);
        if (*end) {
            snprintf(msg, len, "DOWNPOUR_SIM_PINNED '%s' is not a count of bytes", limit);
            return -1;
        }
        if (bytes > v || c->counts.pinned_bytes > v - bytes) {
            snprintf(msg, len,
                     "host_register of %zu bytes: DOWNPOUR_SIM_PINNED allows %llu bytes and "
                     "%zu are registered (cudaErrorMemoryAllocation)",
                     bytes, v, c->counts.pinned_bytes);
            return -1;
        }
    }
    for (long i = 0; i < c->counts.pinned; i++) {
        const sim_pin *r = &c->pins[i];
        if (lo < r->lo + r->bytes && r->lo < lo + bytes) {
            snprintf(msg, len,
                     "host_register of %zu bytes at %p: part or all of it is already "
                     "registered (%zu bytes at %p; cudaErrorHostMemoryAlreadyRegistered)",
                     bytes, p, r->bytes, (void *)r->lo);
            return -1;
        }
    }
    if ((size_t)c->counts.pinned == c->cap_pins) {
        size_t cap = c->cap_pins ? 2 * c->cap_pins : 8;
        sim_pin *pins = realloc(c->pins, cap * sizeof *pins);
        if (!pins) {
            snprintf(msg, len, "out of memory registering %zu bytes", bytes);
            return -1;
        }
        c->pins = pins;
        c->cap_pins = cap;
    }
    c->pins[c->counts.pinned++] = (sim_pin){lo, bytes};
    c->counts.pinned_bytes += bytes;
    return 0;
}

/* Exactly a pointer registered before; any other is ignored, as the CUDA
 * plugin ignores cudaHostUnregister's error for it. */
static void sim_host_unregister(void *ctx, void *p)
{
    sim_ctx *c = ctx;
    for (long i = 0; i < c->counts.pinned; i++)
        if (c->pins[i].lo == (uintptr_t)p) {
            c->counts.pinned_bytes -= c->pins[i].bytes;
            c->pins[i] = c->pins[--c->counts.pinned];
            return;
        }
}

/* Appends a node to the recording; a failed append fails the capture. */
static void record(sim_ctx *c, const sim_node *nd)
{
    sim_graph *gr = c->rec;
    if (gr->n == gr->cap) {
        size_t cap = gr->cap ? 2 * gr->cap : 64;
        sim_node *nodes = realloc(gr->nodes, cap * sizeof *nodes);
        if (!nodes) {
            sim_fail(c, "device sim: out of memory recording a graph of %zu nodes", gr->n);
            return;
        }
        gr->nodes = nodes;
        gr->cap = cap;
    }
    gr->nodes[gr->n++] = *nd;
}

static int sim_copy(void *ctx, void *dst, const void *src, size_t bytes, dp_copy_dir dir)
{
    dp_sim_comm_settle(ctx); /* stream order: a sum queued before runs first */
    sim_ctx *c = ctx;
    if (c->capturing) {
        if (dir == DP_COPY_D2H) { /* as CUDA: a capture cannot hand data to the host */
            sim_fail(c, "device sim: a D2H copy of %zu bytes during graph capture", bytes);
            return -1;
        }
        sim_node nd = {.op = SIM_COPY};
        nd.u.copy.dst = dst;
        nd.u.copy.src = src;
        nd.u.copy.bytes = bytes;
        record(c, &nd);
        return 0;
    }
    if (bytes)
        memmove(dst, src, bytes);
    return 0;
}

static int sim_sync(void *ctx, char *msg, size_t len)
{
    dp_sim_comm_settle(ctx); /* stream order: a sum queued before runs first */
    sim_ctx *c = ctx;
    if (!c->failed)
        return 0;
    snprintf(msg, len, "%s", c->msg);
    return -1;
}

static int imax(int a, int b) { return a > b ? a : b; }

/* cublasSgemm's argument checks (its CUBLAS_STATUS_INVALID_VALUE cases). */
static int gemm_ok(sim_ctx *c, const dp_gemm *g)
{
    int rows_a = g->ta ? g->k : g->m, rows_b = g->tb ? g->n : g->k;
    if (g->m < 0 || g->n < 0 || g->k < 0) {
        sim_fail(c, "device sim: gemm with a negative size (m %d, n %d, k %d)", g->m, g->n, g->k);
        return 0;
    }
    if (g->lda < imax(1, rows_a)) {
        sim_fail(c, "device sim: gemm lda %d < the %d rows of the stored A", g->lda, rows_a);
        return 0;
    }
    if (g->ldb < imax(1, rows_b)) {
        sim_fail(c, "device sim: gemm ldb %d < the %d rows of the stored B", g->ldb, rows_b);
        return 0;
    }
    if (g->ldc < imax(1, g->m)) {
        sim_fail(c, "device sim: gemm ldc %d < m %d", g->ldc, g->m);
        return 0;
    }
    if (g->batch < 0 || (g->batch > 1 && (g->stride_a < 0 || g->stride_b < 0 || g->stride_c < 0))) {
        sim_fail(c, "device sim: gemm batch %d, strides %lld, %lld, %lld: none may be negative",
                 g->batch, g->stride_a, g->stride_b, g->stride_c);
        return 0;
    }
    return 1;
}

static void run_gemm(sim_ctx *c, const dp_gemm *g)
{
    if (!gemm_ok(c, g))
        return;
    if (g->m == 0 || g->n == 0)
        return;
    dp_blas_ready(); /* OpenBLAS set up (blas.h), as every product of the tree */
    /* A batch is its products one by one: the bits of single products. */
    int batch = g->batch > 1 ? g->batch : 1;
    for (int i = 0; i < batch; i++)
        cblas_sgemm(CblasColMajor, g->ta ? CblasTrans : CblasNoTrans,
                    g->tb ? CblasTrans : CblasNoTrans, g->m, g->n, g->k, g->alpha,
                    g->a + i * g->stride_a, g->lda, g->b + i * g->stride_b, g->ldb, g->beta,
                    g->c + i * g->stride_c, g->ldc);
}

static void sim_gemm(void *ctx, const dp_gemm *g)
{
    dp_sim_comm_settle(ctx); /* stream order: a sum queued before runs first */
    sim_ctx *c = ctx;
    if (c->capturing) {
        sim_node nd = {.op = SIM_GEMM};
        nd.u.gemm = *g;
        record(c, &nd);
        return;
    }
    run_gemm(c, g);
}

static long gcd(long a, long b)
{
    while (b) {
        long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The order of a launch of n > 1 items, as a first item and a stride: item t
 * is (first + t stride) mod n, every item once since gcd(stride, n) = 1.
 * reverse is first n-1, stride n-1 (that is, -1). */
static void pick_order(sim_ctx *c, long n, long *first, long *stride)
{
    if (c->order == SIM_REVERSE) {
        *first = *stride = n - 1;
        return;
    }
    long a = 1 + (long)(dp_rng_u64(&c->rng) % (uint64_t)(n - 1));
    while (gcd(a, n) != 1)
        a = a == n - 1 ? 1 : a + 1;
    *first = (long)(dp_rng_u64(&c->rng) % (uint64_t)n);
    *stride = a;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* Adam's fast arithmetic (nn/adam_fast.h) is fmaf: compiled for the baseline
 * x86 every fmaf is a call into libm, ten times the host update's time; on
 * a CPU with FMA the forward loop runs it inline (the same bits: an fma is
 * an fma). */
__attribute__((target("avx2,fma"))) static void adam_forward_fma(const dp_kernel *k, long n)
{
    const dp_ka_optim *a = &k->u.optim; /* dp_k_adam's fast half */
    float decay = dp_k_decay(a);
    for (long i = 0; i < n; i++)
        dp_adam_fast_element(a->p + i, a->s0 + i, a->s1 + i,
                             dp_k_l2(a, a->g[i] * a->step->scale, i), a->step->lr_t, a->b1,
                             1.0f - a->b1, a->b2, 1.0f - a->b2, a->eps, 0.0f, decay);
}
#endif

/* One kernel: its body for every item, the body chosen from DP_KERNELS, the
 * items in the context's order. */
static void run_kernel(sim_ctx *c, const dp_kernel *k)
{
    long n = k->items, first = 0, stride = 1;
    if (c->order != SIM_FORWARD && n > 1)
        pick_order(c, n, &first, &stride);
#if defined(__x86_64__) && defined(__GNUC__)
    if (k->id == DP_K_ADAM && first == 0 && stride == 1 && !k->u.optim.exact &&
        dp_isa_max() >= DP_ISA_AVX2) {
        adam_forward_fma(k, n);
        return;
    }
#endif
    switch (k->id) {
#define SIM_CASE(ID, name)                                                                       \
    case DP_K_##ID:                                                                              \
        if (stride == 1 && first == 0) /* forward: the plain loop, as fast as before */          \
            for (long i = 0; i < n; i++)                                                         \
                dp_k_##name(k, i);                                                               \
        else                                                                                     \
            for (long t = 0, i = first; t < n; t++) {                                            \
                dp_k_##name(k, i);                                                               \
                i += stride;                                                                     \
                if (i >= n)                                                                      \
                    i -= n;                                                                      \
            }                                                                                    \
        break;
        DP_KERNELS(SIM_CASE)
#undef SIM_CASE
    default:
        sim_fail(c, "device sim: no kernel has id %d (there are %d)", (int)k->id, (int)DP_K_COUNT);
        break;
    }
}

static void sim_launch(void *ctx, const dp_kernel *k)
{
    dp_sim_comm_settle(ctx); /* stream order: a sum queued before runs first */
    sim_ctx *c = ctx;
    if (c->capturing) {
        sim_node nd = {.op = SIM_LAUNCH};
        nd.u.kernel = *k;
        record(c, &nd);
        return;
    }
    run_kernel(c, k);
}

static int sim_capture_begin(void *ctx, char *msg, size_t len)
{
    dp_sim_comm_settle(ctx); /* stream order: a sum queued before runs first */
    sim_ctx *c = ctx;
    if (c->capturing) {
        snprintf(msg, len, "device sim: a graph capture is already under way");
        return -1;
    }
    c->rec = calloc(1, sizeof *c->rec);
    if (!c->rec) {
        snprintf(msg, len, "device sim: out of memory for a graph");
        return -1;
    }
    c->capturing = 1;
    return 0;
}

static int sim_capture_end(void *ctx, void **graph, char *msg, size_t len)
{
    sim_ctx *c = ctx;
    if (!c->capturing) {
        snprintf(msg, len, "device sim: capture_end without capture_begin");
        return -1;
    }
    c->capturing = 0;
    *graph = c->rec;
    c->rec = NULL;
    if (c->failed) { /* a node that could not be recorded: the graph is not whole */
        sim_graph_free(c, *graph);
        *graph = NULL;
        snprintf(msg, len, "%s", c->msg);
        return -1;
    }
    return 0;
}

static int sim_graph_launch(void *ctx, void *graph)
{
    dp_sim_comm_settle(ctx); /* stream order: a sum queued before runs first */
    sim_ctx *c = ctx;
    const sim_graph *gr = graph;
    if (c->capturing) {
        sim_fail(c, "device sim: a graph of %zu nodes launched during a capture", gr->n);
        return -1;
    }
    c->counts.graph_launches++;
    for (size_t i = 0; i < gr->n; i++) {
        const sim_node *nd = &gr->nodes[i];
        switch (nd->op) {
        case SIM_GEMM: run_gemm(c, &nd->u.gemm); break;
        case SIM_LAUNCH: run_kernel(c, &nd->u.kernel); break;
        case SIM_COPY:
            if (nd->u.copy.bytes)
                memmove(nd->u.copy.dst, nd->u.copy.src, nd->u.copy.bytes);
            break;
        }
    }
    return 0;
}

dp_sim_counts dp_sim_counts_of(const void *ctx)
{
    const sim_ctx *c = ctx;
    return c->counts;
}

dp_sim_comm **dp_sim_comm_list(void *ctx) { return &((sim_ctx *)ctx)->comms; }

int dp_sim_capturing(const void *ctx) { return ((const sim_ctx *)ctx)->capturing; }

const dp_backend dp_backend_sim = {
    .abi = DP_BACKEND_ABI,
    .name = "sim",
    .open = sim_open,
    .close = sim_close,
    .describe = sim_describe,
    .alloc = sim_alloc,
    .free = sim_free,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .host_register = sim_host_register,
    .host_unregister = sim_host_unregister,
    .copy = sim_copy,
    .sync = sim_sync,
    .gemm = sim_gemm,
    .launch = sim_launch,
    .capture_begin = sim_capture_begin,
    .capture_end = sim_capture_end,
    .graph_launch = sim_graph_launch,
    .graph_free = sim_graph_free,
    .comm_id = dp_sim_comm_id,
    .comm_join = dp_sim_comm_join,
    .comm_allreduce = dp_sim_comm_allreduce,
    .comm_wait = dp_sim_comm_wait,
    .comm_abort = dp_sim_comm_abort,
    .comm_free = dp_sim_comm_free,
};
