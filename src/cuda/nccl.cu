/* Collectives through NCCL: a unique id made by rank 0, communicators
 * joined with it, and in-place sums queued on the stream.  Built only when
 * CMake found nccl.h and libnccl (DP_HAVE_NCCL); otherwise the table's six
 * entries are NULL. */
#ifdef DP_HAVE_NCCL
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_ctx.h"

struct dp_cuda_comm {
    ncclComm_t comm;
    dp_cuda_comm *next;
};

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

int dp_cuda_comm_allreduce(void *ctx, void *comm, float *buf, size_t n)
{
    dp_cuda *c = (dp_cuda *)ctx;
    dp_cuda_comm *h = (dp_cuda_comm *)comm;
    if (dp_cuda_enter(c) < 0)
        return -1;
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, h->comm, c->stream);
    if (r == ncclInProgress) /* non-blocking: the enqueue finishes on the host, soon */
        r = settle(h->comm, -1);
    if (r != ncclSuccess) {
        (void)cudaGetLastError();
        dp_cuda_fail(c, "ncclAllReduce of %zu floats: %s (%s)", n, ncclGetErrorString(r),
                     ncclGetLastError(h->comm));
        return -1;
    }
    dp_cuda_queued(c, "ncclAllReduce");
    return c->failed || (c->capturing && c->cap_failed) ? -1 : 0;
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
        ncclResult_t r = ncclCommGetAsyncError(h->comm, &async);
        if (r != ncclSuccess)
            async = r;
        if (async != ncclSuccess && async != ncclInProgress) {
            if (msg && len)
                snprintf(msg, len, "NCCL: %s (%s)", ncclGetErrorString(async),
                         ncclGetLastError(h->comm));
            return -1;
        }
        if (!c->failed && dp_cuda_enter(c) == 0) {
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

/* Out of the context's list (which dp_cuda_comm_poll and close walk). */
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
 * communicator is non-blocking), then freed; one that does not finish
 * within a minute is aborted instead. */
static void destroy(dp_cuda_comm *h)
{
    ncclResult_t r = ncclCommFinalize(h->comm);
    if (r == ncclInProgress)
        r = settle(h->comm, 60);
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

void dp_cuda_comm_poll(dp_cuda *c)
{
    for (dp_cuda_comm *h = c->comms; h; h = h->next) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(h->comm, &async);
        if (r != ncclSuccess)
            async = r;
        if (async != ncclSuccess && async != ncclInProgress) {
            dp_cuda_fail(c, "NCCL: %s (%s)", ncclGetErrorString(async), ncclGetLastError(h->comm));
            return;
        }
    }
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
