/* Collectives through NCCL: a unique id made by rank 0, communicators
 * joined with it, and in-place sums queued on the stream.  Built only when
 * CMake found nccl.h and libnccl (DP_HAVE_NCCL); otherwise the table's six
 * entries are NULL. */
#ifdef DP_HAVE_NCCL
#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_ctx.h"

struct dp_cuda_comm {
    ncclComm_t comm;
    dp_cuda_comm *next;
    /* ncclAllReduce returned ncclInProgress: NCCL is still queueing the sum
     * (a non-blocking communicator may, e.g. while it connects to its peers
     * at the first sum), and until ncclCommGetAsyncError says ncclSuccess no
     * other NCCL call and no work on the stream may follow it. */
    int pending;
    /* The communicator's own failure (a peer lost, a timeout): the device
     * goes on; the caller aborts this communicator (backend.h, comm_wait). */
    int failed;
    char err[DP_CUDA_MSG];
};

static void comm_fail(dp_cuda_comm *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void comm_fail(dp_cuda_comm *h, const char *fmt, ...)
{
    if (h->failed)
        return; /* the first failure is the cause */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->err, sizeof h->err, fmt, ap);
    va_end(ap);
    h->failed = 1;
}

static_assert(sizeof(ncclUniqueId) == 128, "NCCL's unique id is not DP_COMM_ID_BYTES (128)");

int dp_cuda_comm_id(void *ctx, uint8_t *id, size_t id_len, char *msg, size_t len)
{
    (void)ctx;
    if (id_len != sizeof(ncclUniqueId)) {
        snprintf(msg, len, "comm_id: %zu id bytes given, NCCL's id has %zu", id_len,
                 sizeof(ncclUniqueId));
        return -1;
    }
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess) {
        snprintf(msg, len, "ncclGetUniqueId: %s (%s)", ncclGetErrorString(r), ncclGetLastError(NULL));
        return -1;
    }
    memcpy(id, &uid, sizeof uid);
    return 0;
}

#define JOIN_TIMEOUT_S 300

/* A non-blocking communicator's pending call, polled until it is no longer
 * in progress or timeout_s passed (then ncclInProgress). */
static ncclResult_t settle(ncclComm_t comm, int timeout_s)
{
    struct timespec t0, now, nap = {0, 100000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess)
            return r;
        if (st != ncclInProgress)
            return st;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (timeout_s >= 0 && now.tv_sec - t0.tv_sec >= timeout_s)
            return ncclInProgress;
        nanosleep(&nap, NULL);
    }
}

int dp_cuda_comm_join(void *ctx, const uint8_t *id, size_t id_len, int ranks, int rank, void **comm,
                      char *msg, size_t len)
{
    dp_cuda *c = (dp_cuda *)ctx;
    *comm = NULL;
    if (id_len != sizeof(ncclUniqueId)) {
        snprintf(msg, len, "comm_join: %zu id bytes given, NCCL's id has %zu", id_len,
                 sizeof(ncclUniqueId));
        return -1;
    }
    if (ranks < 1 || rank < 0 || rank >= ranks) {
        snprintf(msg, len, "comm_join: rank %d of %d ranks", rank, ranks);
        return -1;
    }
    if (dp_cuda_enter(c) < 0) { /* also makes this GPU current for NCCL */
        snprintf(msg, len, "comm_join: the device failed earlier: %s", c->err);
        return -1;
    }
    dp_cuda_comm *h = (dp_cuda_comm *)calloc(1, sizeof *h);
    if (!h) {
        snprintf(msg, len, "comm_join: out of host memory");
        return -1;
    }
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    /* Non-blocking, so that a rank that died before joining cannot stall the
     * others for ever: the init is polled, and given up after
     * JOIN_TIMEOUT_S with the communicator aborted. */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&h->comm, ranks, uid, rank, &config);
    if (r == ncclInProgress)
        r = settle(h->comm, JOIN_TIMEOUT_S);
    if (r != ncclSuccess) {
        if (r == ncclInProgress)
            snprintf(msg, len, "ncclCommInitRankConfig (rank %d of %d): the other ranks did "
                               "not join within %d s", rank, ranks, JOIN_TIMEOUT_S);
        else
            snprintf(msg, len, "ncclCommInitRankConfig (rank %d of %d): %s (%s)", rank, ranks,
                     ncclGetErrorString(r), ncclGetLastError(NULL));
        (void)cudaGetLastError();
        if (h->comm)
            (void)ncclCommAbort(h->comm);
        free(h);
        return -1;
    }
    h->next = c->comms;
    c->comms = h;
    *comm = h;
    return 0;
}

/* How long a sum may stay ncclInProgress before the host gives up on it
 * where it must wait (dp_cuda_comm_settle): a peer frozen while NCCL
 * connects to it would otherwise hold the host for ever. */
#define QUEUE_TIMEOUT_S 300

void dp_cuda_comm_settle(dp_cuda *c)
{
    for (dp_cuda_comm *h = c->comms; h; h = h->next) {
        if (!h->pending || h->failed)
            continue;
        ncclResult_t r = settle(h->comm, QUEUE_TIMEOUT_S);
        h->pending = 0;
        if (r == ncclInProgress)
            comm_fail(h, "ncclAllReduce: NCCL had not queued the sum after %d s (a peer that "
                         "does not answer)", QUEUE_TIMEOUT_S);
        else if (r != ncclSuccess)
            comm_fail(h, "ncclAllReduce: %s (%s)", ncclGetErrorString(r),
                      ncclGetLastError(h->comm));
    }
}

/* Queued, not waited for: with ncclInProgress the sum is left pending, and
 * comm_wait (bounded, in the caller's slices) or the next call that queues
 * work (dp_cuda_enter, bounded) sees it queued.  A failure of the
 * communicator (a peer lost) is the communicator's, as comm_wait's are, so
 * the device stays usable for the state's way back to the host; only a CUDA
 * error inside NCCL fails the device. */
int dp_cuda_comm_allreduce(void *ctx, void *comm, float *buf, size_t n)
{
    dp_cuda *c = (dp_cuda *)ctx;
    dp_cuda_comm *h = (dp_cuda_comm *)comm;
    if (c->capturing) { /* as sim: a graph holds no sums, and comm_wait cannot poll one */
        dp_cuda_fail(c, "ncclAllReduce of %zu floats during a graph capture", n);
        return -1;
    }
    if (dp_cuda_enter(c) < 0 || h->failed) /* enter: an earlier sum of h queued first */
        return -1;
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, h->comm, c->stream);
    if (r == ncclInProgress) {
        h->pending = 1;
        r = ncclSuccess;
    }
    if (r != ncclSuccess) {
        (void)cudaGetLastError();
        if (r == ncclUnhandledCudaError)
            dp_cuda_fail(c, "ncclAllReduce of %zu floats: %s (%s)", n, ncclGetErrorString(r),
                         ncclGetLastError(h->comm));
        else
            comm_fail(h, "ncclAllReduce of %zu floats: %s (%s)", n, ncclGetErrorString(r),
                      ncclGetLastError(h->comm));
        return -1;
    }
    /* Named for messages, never waited for here (not even with
     * DOWNPOUR_CUDA_SYNC=1): a sum whose peer died never ends. */
    snprintf(c->last, sizeof c->last, "ncclAllReduce");
    return c->failed ? -1 : 0;
}

/* The stream polled, and the communicator's asynchronous error with it: a
 * sum whose peer died never completes, and NCCL may say so here first. */
int dp_cuda_comm_wait(void *ctx, void *comm, double timeout_s, char *msg, size_t len)
{
    dp_cuda *c = (dp_cuda *)ctx;
    dp_cuda_comm *h = (dp_cuda_comm *)comm;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        /* A communicator's error is not the device's: the caller aborts it
         * and goes on with a new one, so it is not kept as a failure. */
        ncclResult_t async = ncclSuccess;
        if (!h->failed) {
            ncclResult_t r = ncclCommGetAsyncError(h->comm, &async);
            if (r != ncclSuccess)
                async = r;
            if (async != ncclSuccess && async != ncclInProgress)
                comm_fail(h, "NCCL: %s (%s)", ncclGetErrorString(async),
                          ncclGetLastError(h->comm));
        }
        if (h->failed) {
            h->pending = 0;
            if (msg && len)
                snprintf(msg, len, "%s", h->err);
            return -1;
        }
        if (h->pending && async == ncclSuccess)
            h->pending = 0; /* NCCL has queued the sum: the stream now holds it */
        /* While NCCL still queues the sum the stream does not hold it yet,
         * and an idle stream would pass for a finished sum. */
        if (!h->pending && !c->failed && dp_cuda_check(c, dp_cuda_select(c), "cudaSetDevice") == 0) {
            cudaError_t e = cudaStreamQuery(c->stream);
            if (e == cudaSuccess)
                return 1;
            /* Not an error, but the runtime keeps it as the thread's last
             * error, where the next launch check would take it for its own. */
            if (e == cudaErrorNotReady)
                (void)cudaGetLastError();
            else {
                (void)cudaGetLastError();
                dp_cuda_fail(c, "%s (%s), in work queued up to %s", cudaGetErrorString(e),
                             cudaGetErrorName(e), c->last[0] ? c->last : "the first call");
            }
        }
        if (c->failed) {
            if (msg && len)
                snprintf(msg, len, "%s", c->err);
            return -1;
        }
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double spent = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
        if (spent >= timeout_s)
            return 0;
        /* a sum of a few MB takes tens of microseconds: poll, don't sleep long */
        struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
    }
}

/* Out of the context's list (which dp_cuda_comm_settle and close walk). */
static void unlist(dp_cuda *c, dp_cuda_comm *h)
{
    for (dp_cuda_comm **p = &c->comms; *p; p = &(*p)->next)
        if (*p == h) {
            *p = h->next;
            return;
        }
}

/* ncclCommAbort returns without waiting for the peers and makes the
 * communicator's pending kernels exit; the stream runs on. */
void dp_cuda_comm_abort(void *ctx, void *comm)
{
    dp_cuda *c = (dp_cuda *)ctx;
    dp_cuda_comm *h = (dp_cuda_comm *)comm;
    if (!h)
        return;
    unlist(c, h);
    if (ncclCommAbort(h->comm) != ncclSuccess)
        (void)cudaGetLastError();
    free(h);
}

/* A healthy communicator: its work finished (finalize, polled: the
 * communicator is non-blocking), then freed; one that failed, or does not
 * finish within a minute, is aborted instead.  A sum still being queued is
 * settled first: NCCL takes no other call on the communicator before. */
static void destroy(dp_cuda_comm *h)
{
    ncclResult_t r = h->failed ? ncclInternalError : ncclSuccess;
    if (r == ncclSuccess && h->pending)
        r = settle(h->comm, 60);
    if (r == ncclSuccess) {
        r = ncclCommFinalize(h->comm);
        if (r == ncclInProgress)
            r = settle(h->comm, 60);
    }
    if ((r == ncclSuccess ? ncclCommDestroy(h->comm) : ncclCommAbort(h->comm)) != ncclSuccess)
        (void)cudaGetLastError();
    free(h);
}

void dp_cuda_comm_free(void *ctx, void *comm)
{
    dp_cuda *c = (dp_cuda *)ctx;
    dp_cuda_comm *h = (dp_cuda_comm *)comm;
    if (!h)
        return;
    unlist(c, h);
    destroy(h);
}

void dp_cuda_comm_close_all(dp_cuda *c)
{
    while (c->comms) {
        dp_cuda_comm *h = c->comms;
        c->comms = h->next;
        destroy(h);
    }
}
#endif
