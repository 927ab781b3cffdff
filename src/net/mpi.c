/* The MPI transport (include/downpour/mpi.h, docs/mpi.md).
 *
 * A frame is two MPI messages on a private duplicate of MPI_COMM_WORLD: the
 * 48-byte encoded header (TAG_HDR), then, when length > 0, the payload
 * (TAG_PAY).  Messages between one pair of ranks on one communicator are
 * matched in the order they were sent (MPI's non-overtaking rule), so the
 * k-th payload received from a peer is the one announced by the k-th header;
 * a per-peer send mutex keeps the two messages of a frame together when
 * several threads send to the same peer.
 *
 * Receiving is two-step as with TCP: poll matches a header (MPI_Improbe /
 * MPI_Mrecv, with a short spin then sched_yield then 50 us sleeps while
 * nothing is there), recv_payload posts the payload's receive.  Asked for the
 * whole payload at once it receives straight into the caller's memory; asked
 * for a part, it receives the whole payload into a per-peer buffer once and
 * copies the pieces out (one extra copy, only on that path).
 *
 * The payload CRC32C is neither computed nor checked: MPI delivers messages
 * intact or aborts the job.  Likewise there are no heartbeats and no
 * PEER_LOST from a dead rank: a rank that dies ends the whole MPI job (the
 * launcher's doing), so the liveness machinery stays TCP's.  A malformed
 * header (a bug, not a network fault) marks that one peer lost, as TCP
 * closes that one connection.
 *
 * Threads: MPI is initialised asking MPI_THREAD_MULTIPLE.  When the library
 * only grants MPI_THREAD_SERIALIZED, every MPI call here runs under g_mu and
 * blocking operations become a nonblocking start plus a test loop, so one
 * thread waiting for a message never holds the lock while it waits. */
#include "downpour/mpi.h"

#include <stdlib.h>
#include <string.h>

#include "downpour/log.h"

void dp_mpi_config_init(dp_mpi_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->late_log = 5.0;
    cfg->max_frame_bytes = DP_FRAME_MAX_DEFAULT;
}

#ifndef DOWNPOUR_HAVE_MPI

#define NO_MPI "this downpour was built without MPI. Hint: apt-get install libopenmpi-dev, " \
               "rebuild (cmake -DDOWNPOUR_MPI=ON)"

int dp_mpi_available(void) { return 0; }

int dp_mpi_init(int *world_rank, int *world_size, dp_err *err)
{
    if (world_rank)
        *world_rank = -1;
    if (world_size)
        *world_size = 0;
    return dp_errf(err, NO_MPI);
}

int dp_mpi_open(const dp_mpi_config *cfg, dp_transport **out, dp_err *err)
{
    (void)cfg;
    *out = NULL;
    return dp_errf(err, NO_MPI);
}

void dp_mpi_finalize(void) {}

#else /* DOWNPOUR_HAVE_MPI */

#include <inttypes.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "transport_impl.h"

#include "downpour/clock.h"

enum { TAG_HDR = 1, TAG_PAY = 2, TAG_GROUP = 3 };

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* MPI calls, when serialised */
static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_serial;  /* the library gave less than MPI_THREAD_MULTIPLE */
static int g_started; /* dp_mpi_init called MPI_Init_thread */
static int g_done;    /* dp_mpi_finalize ran */
static int g_said;    /* the serialised mode was logged */

#define LOCK()                                                                                     \
    do {                                                                                           \
        if (g_serial)                                                                              \
            pthread_mutex_lock(&g_mu);                                                             \
    } while (0)
#define UNLOCK()                                                                                   \
    do {                                                                                           \
        if (g_serial)                                                                              \
            pthread_mutex_unlock(&g_mu);                                                           \
    } while (0)

typedef struct peer {
    pthread_mutex_t send_mu; /* the header and payload of one frame stay together */
    _Atomic uint64_t bytes_sent, bytes_recv, frames_sent, frames_recv;
    _Atomic int lost;        /* a malformed frame arrived: the peer is unusable */
    int reported;            /* lost was returned by poll */
    char reason[200];
    /* Receiving thread only. */
    int pay_pending;     /* a header was polled, its payload not all read */
    int buffered;        /* the payload sits in buf (partial reads) */
    uint64_t pay_left;   /* payload bytes the caller has not taken yet */
    size_t buf_pos, buf_cap;
    uint8_t *buf;
    dp_frame_header pay_h;
} peer;

typedef struct mpit {
    dp_transport base;
    MPI_Comm comm;    /* our duplicate of MPI_COMM_WORLD */
    int world_size;
    int *world_of;    /* n_ranks: cluster rank -> world rank */
    int *cluster_of;  /* world_size: world rank -> cluster rank, or -1 */
    uint64_t max_frame;
    peer *peers;
    /* The all-reduce communicator of the last rank set.  ar_mu: one
     * collective at a time from this process (a reducer's communication
     * thread and the main thread may both reduce). */
    pthread_mutex_t ar_mu;
    MPI_Comm ar_comm;
    int *ar_ranks, ar_n;
    _Atomic uint64_t coll_bytes; /* estimated bytes each way of the collectives */
} mpit;

static const dp_transport_ops mpi_ops;

static const char *pname(const mpit *t, int p) { return t->base.names[p]; }

static const char *mpi_errstr(int rc, char *buf)
{
    int n = 0;
    if (MPI_Error_string(rc, buf, &n) != MPI_SUCCESS)
        snprintf(buf, MPI_MAX_ERROR_STRING, "MPI error %d", rc);
    return buf;
}

/* Waiting without burning a core that an oversubscribed job shares: a few
 * spins, then yields, then 50 us naps. */
static void backoff(int spin)
{
    if (spin < 32)
        return;
    if (spin < 256) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
}

/* Completes a request.  Serialised: a test loop that takes the lock per test. */
static int wait_req(MPI_Request *req, MPI_Status *st)
{
    if (!g_serial)
        return MPI_Wait(req, st);
    for (int spin = 0;; spin++) {
        int done = 0;
        LOCK();
        int rc = MPI_Test(req, &done, st);
        UNLOCK();
        if (rc != MPI_SUCCESS || done)
            return rc;
        backoff(spin < 256 ? spin : 256); /* naps would throttle a transfer in progress */
    }
}

static int xsend(const void *buf, int count, MPI_Datatype type, int dst, int tag, MPI_Comm comm)
{
    if (!g_serial)
        return MPI_Send(buf, count, type, dst, tag, comm);
    MPI_Request req;
    LOCK();
    int rc = MPI_Isend(buf, count, type, dst, tag, comm, &req);
    UNLOCK();
    return rc != MPI_SUCCESS ? rc : wait_req(&req, MPI_STATUS_IGNORE);
}

/* ---- init and finalize ---- */

int dp_mpi_available(void) { return 1; }

/* MPI_Finalize waits for every rank (Open MPI fences), so a rank that fails
 * must not call it: its peers may be blocked waiting for it and the job would
 * hang.  It exits without finalising instead, and mpirun (or srun) ends the
 * whole job on its non-zero status.  A rank that succeeds finalises on the
 * way out; only the exit status tells the two apart, hence on_exit. */
static void finalize_at_exit(int status, void *arg)
{
    (void)arg;
    if (status == 0)
        dp_mpi_finalize();
}

int dp_mpi_init(int *world_rank, int *world_size, dp_err *err)
{
    int rc = 0, inited = 0, finalized = 0;
    pthread_mutex_lock(&g_init_mu);
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) {
        rc = dp_errf(err, "MPI was already finalized in this process");
    } else if (!inited) {
        /* DOWNPOUR_MPI_SERIALIZED=1 asks for less, to test the serialised path. */
        const char *ser = getenv("DOWNPOUR_MPI_SERIALIZED");
        int ask = ser && strcmp(ser, "1") == 0 ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE;
        int provided = MPI_THREAD_SINGLE;
        int r = MPI_Init_thread(NULL, NULL, ask, &provided);
        if (r != MPI_SUCCESS) {
            char s[MPI_MAX_ERROR_STRING];
            rc = dp_errf(err, "MPI_Init_thread: %s", mpi_errstr(r, s));
        } else if (provided < MPI_THREAD_SERIALIZED) {
            g_started = 1;
            rc = dp_errf(err, "the MPI library offers thread level %d; downpour needs at least "
                              "MPI_THREAD_SERIALIZED (its sampler and I/O threads run beside "
                              "the MPI calls)", provided);
        } else {
            g_started = 1;
            g_serial = provided < MPI_THREAD_MULTIPLE;
            on_exit(finalize_at_exit, NULL);

        }
    } else {
        int provided = MPI_THREAD_SINGLE;
        MPI_Query_thread(&provided);
        if (provided < MPI_THREAD_SERIALIZED)
            dp_warn("MPI was initialised with thread level %d (below SERIALIZED) by the program; "
                    "the MPI transport assumes one thread uses it at a time",
                    provided);
        g_serial = provided < MPI_THREAD_MULTIPLE;
    }
    pthread_mutex_unlock(&g_init_mu);
    if (rc == 0) {
        int r = 0, s = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
        MPI_Comm_size(MPI_COMM_WORLD, &s);
        if (g_serial && r == 0 && !g_said) {
            dp_info("MPI thread level SERIALIZED: the transport serialises its MPI calls");
            g_said = 1;
        }
        if (world_rank)
            *world_rank = r;
        if (world_size)
            *world_size = s;
    }
    return rc;
}

void dp_mpi_finalize(void)
{
    pthread_mutex_lock(&g_init_mu);
    if (g_started && !g_done) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized)
            MPI_Finalize();
        g_done = 1;
    }
    pthread_mutex_unlock(&g_init_mu);
}

/* ---- send ---- */

static int peer_lost_err(mpit *t, int p, dp_err *err)
{
    return dp_errf(err, "%s is unusable: %s", pname(t, p), t->peers[p].reason);
}

static void mark_lost(mpit *t, int p, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void mark_lost(mpit *t, int p, const char *fmt, ...)
{
    peer *c = &t->peers[p];
    if (atomic_load(&c->lost))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->reason, sizeof c->reason, fmt, ap);
    va_end(ap);
    c->reported = 0;
    atomic_store(&c->lost, 1);
    dp_warn("dropping %s: %s", pname(t, p), c->reason);
}

static int mpi_connect(dp_transport *bt, int p, double deadline, dp_err *err)
{
    (void)deadline;
    mpit *t = (mpit *)bt;
    return atomic_load(&t->peers[p].lost) ? peer_lost_err(t, p, err) : 0; /* MPI_Init wired us */
}

static int mpi_sendv(dp_transport *bt, int p, dp_frame_header *h, const struct iovec *iov,
                     int iovcnt, dp_err *err)
{
    mpit *t = (mpit *)bt;
    peer *c = &t->peers[p];
    int blen[DP_TRANSPORT_MAX_IOV];
    MPI_Aint disp[DP_TRANSPORT_MAX_IOV];
    const void *one = NULL;
    uint64_t len = 0;
    int ns = 0;
    for (int i = 0; i < iovcnt; i++) {
        if (!iov[i].iov_len)
            continue;
        len += iov[i].iov_len;
        if (len > t->max_frame)
            break;
        one = iov[i].iov_base;
        blen[ns] = (int)iov[i].iov_len;
        MPI_Get_address(iov[i].iov_base, &disp[ns]);
        ns++;
    }
    if (len > t->max_frame)
        return dp_errf(err, "sending %" PRIu64 "+ bytes to %s: frame larger than the maximum %" PRIu64
                            " bytes",
                       len, pname(t, p), t->max_frame);
    if (atomic_load(&c->lost))
        return peer_lost_err(t, p, err);
    h->source = (uint32_t)t->base.rank;
    h->length = len;
    h->payload_crc = 0; /* MPI delivers intact: no CRC (see the top of this file) */
    if (len > DP_FRAME_CHUNK)
        h->flags |= DP_FRAME_F_CHUNKED;
    uint8_t hb[DP_FRAME_HEADER_SIZE];
    dp_frame_encode(hb, h);
    int dst = t->world_of[p], rc;

    pthread_mutex_lock(&c->send_mu);
    rc = xsend(hb, DP_FRAME_HEADER_SIZE, MPI_BYTE, dst, TAG_HDR, t->comm);
    if (rc == MPI_SUCCESS && ns == 1) {
        rc = xsend(one, (int)len, MPI_BYTE, dst, TAG_PAY, t->comm);
    } else if (rc == MPI_SUCCESS && ns > 1) {
        /* The pieces as one message, without copying them together. */
        MPI_Datatype dt;
        LOCK();
        rc = MPI_Type_create_hindexed(ns, blen, disp, MPI_BYTE, &dt);
        if (rc == MPI_SUCCESS && (rc = MPI_Type_commit(&dt)) != MPI_SUCCESS)
            MPI_Type_free(&dt);
        UNLOCK();
        if (rc == MPI_SUCCESS) {
            rc = xsend(MPI_BOTTOM, 1, dt, dst, TAG_PAY, t->comm);
            LOCK();
            MPI_Type_free(&dt);
            UNLOCK();
        }
    }
    pthread_mutex_unlock(&c->send_mu);
    if (rc != MPI_SUCCESS) {
        char s[MPI_MAX_ERROR_STRING];
        return dp_errf(err, "sending %s frame to %s: %s", dp_frame_type_name(h->type),
                       pname(t, p), mpi_errstr(rc, s));
    }
    atomic_fetch_add_explicit(&c->frames_sent, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->bytes_sent, DP_FRAME_HEADER_SIZE + len, memory_order_relaxed);
    return 0;
}

/* ---- receive ---- */

/* Receives the pending payload of peer p (exactly pay_h.length bytes) into dst. */
static int recv_whole(mpit *t, int p, void *dst, dp_err *err)
{
    peer *c = &t->peers[p];
    uint64_t len = c->pay_h.length;
    MPI_Request req;
    MPI_Status st;
    LOCK();
    int rc = MPI_Irecv(dst, (int)len, MPI_BYTE, t->world_of[p], TAG_PAY, t->comm, &req);
    UNLOCK();
    if (rc == MPI_SUCCESS)
        rc = wait_req(&req, &st);
    int got = -1;
    if (rc == MPI_SUCCESS)
        MPI_Get_count(&st, MPI_BYTE, &got);
    if (rc != MPI_SUCCESS || got != (int)len) {
        char s[MPI_MAX_ERROR_STRING];
        c->pay_pending = 0;
        if (rc != MPI_SUCCESS)
            mark_lost(t, p, "receiving the payload of %s frame: %s",
                      dp_frame_type_name(c->pay_h.type), mpi_errstr(rc, s));
        else
            mark_lost(t, p, "payload of %d bytes after a %s header announcing %" PRIu64, got,
                      dp_frame_type_name(c->pay_h.type), len);
        return peer_lost_err(t, p, err);
    }
    atomic_fetch_add_explicit(&c->bytes_recv, len, memory_order_relaxed);
    return 0;
}

/* Buffers the whole pending payload for partial reads (or skipping). */
static int buffer_payload(mpit *t, int p, dp_err *err)
{
    peer *c = &t->peers[p];
    size_t len = (size_t)c->pay_h.length;
    if (c->buf_cap < len) {
        uint8_t *b = realloc(c->buf, len);
        if (!b) {
            c->pay_pending = 0;
            mark_lost(t, p, "out of memory for a %zu-byte payload", len);
            return peer_lost_err(t, p, err);
        }
        c->buf = b;
        c->buf_cap = len;
    }
    if (recv_whole(t, p, c->buf, err))
        return -1;
    c->buffered = 1;
    c->buf_pos = 0;
    return 0;
}

static int mpi_recv_payload(dp_transport *bt, int p, void *dst, size_t len, dp_err *err)
{
    mpit *t = (mpit *)bt;
    peer *c = &t->peers[p];
    if (len == 0)
        return 0;
    if (!dst)
        return dp_errf(err, "recv_payload: NULL destination");
    if (!c->pay_pending)
        return dp_errf(err, "no payload pending from %s: poll a frame first", pname(t, p));
    if (len > c->pay_left)
        return dp_errf(err, "reading %zu payload bytes from %s but only %" PRIu64 " are left", len,
                       pname(t, p), c->pay_left);
    if (!c->buffered && len == c->pay_h.length) {
        /* The whole payload at once: straight into the caller's memory. */
        int rc = recv_whole(t, p, dst, err);
        c->pay_pending = 0;
        c->pay_left = 0;
        return rc;
    }
    if (!c->buffered && buffer_payload(t, p, err))
        return -1;
    memcpy(dst, c->buf + c->buf_pos, len);
    c->buf_pos += len;
    c->pay_left -= len;
    if (c->pay_left == 0)
        c->pay_pending = c->buffered = 0;
    return 0;
}

static int mpi_skip_payload(dp_transport *bt, int p, dp_err *err)
{
    mpit *t = (mpit *)bt;
    peer *c = &t->peers[p];
    if (!c->pay_pending)
        return 0;
    if (!c->buffered && buffer_payload(t, p, err))
        return -1;
    c->pay_pending = c->buffered = 0;
    c->pay_left = 0;
    return 0;
}

/* Unread payloads are discarded before the next poll of their peer (as with
 * TCP); a loss not yet reported becomes the event. */
static int before_poll(mpit *t, int want, dp_event *ev)
{
    for (int i = 0; i < t->base.n_ranks; i++) {
        if (!dp_transport_base_wants(&t->base, want, i))
            continue;
        peer *c = &t->peers[i];
        if (c->pay_pending)
            dp_transport_base_discard(&t->base, i, c->pay_left, c->pay_h.type);
        if (atomic_load(&c->lost) && !c->reported) {
            c->reported = 1;
            dp_transport_base_lost(ev, i, 0, c->reason);
            return 1;
        }
    }
    return 0;
}

/* A header message from world rank w: 1 with a FRAME or PEER_LOST event in ev,
 * 0 when it was dropped. */
static int take_header(mpit *t, int w, const uint8_t *hb, int count, dp_event *ev)
{
    int p = w >= 0 && w < t->world_size ? t->cluster_of[w] : -1;
    if (p < 0 || p == t->base.rank) {
        dp_warn("dropping a frame header from MPI rank %d, which is no task of this cluster", w);
        return 0;
    }
    peer *c = &t->peers[p];
    if (atomic_load(&c->lost))
        return 0;
    atomic_fetch_add_explicit(&c->bytes_recv, (uint64_t)count, memory_order_relaxed);
    dp_frame_header h;
    char why[200];
    if (count != DP_FRAME_HEADER_SIZE) {
        mark_lost(t, p, "frame header message of %d bytes (expected %d)", count,
                  DP_FRAME_HEADER_SIZE);
    } else if (dp_frame_decode(&h, hb, t->max_frame, why, sizeof why) != DP_FRAME_OK) {
        mark_lost(t, p, "bad frame header: %s", why);
    } else if (h.source != (uint32_t)p) {
        mark_lost(t, p, "frame claims to come from rank %u", h.source);
    } else if (h.type < DP_FRAME_APP_FIRST) {
        mark_lost(t, p, "unexpected %s frame (%" PRIu64 " payload bytes)",
                  dp_frame_type_name(h.type), h.length);
    } else {
        atomic_fetch_add_explicit(&c->frames_recv, 1, memory_order_relaxed);
        c->pay_pending = h.length > 0;
        c->buffered = 0;
        c->pay_left = h.length;
        c->pay_h = h;
        memset(ev, 0, sizeof *ev);
        ev->kind = DP_EVENT_FRAME;
        ev->peer = p;
        ev->header = h;
        return 1;
    }
    c->reported = 1;
    dp_transport_base_lost(ev, p, 0, c->reason);
    return 1;
}

static int mpi_poll(dp_transport *bt, int want, double timeout_s, dp_event *ev, dp_err *err)
{
    mpit *t = (mpit *)bt;
    (void)err;
    if (before_poll(t, want, ev))
        return 0;
    int src = want == DP_PEER_ANY ? MPI_ANY_SOURCE : t->world_of[want];
    double deadline = dp_now() + timeout_s;
    for (int spin = 0;; spin++) {
        int flag = 0, count = 0, w = -1;
        uint8_t hb[DP_FRAME_HEADER_SIZE];
        MPI_Message msg;
        MPI_Status st;
        LOCK();
        int rc = MPI_Improbe(src, TAG_HDR, t->comm, &flag, &msg, &st);
        if (rc == MPI_SUCCESS && flag) {
            MPI_Get_count(&st, MPI_BYTE, &count);
            w = st.MPI_SOURCE;
            if (count == DP_FRAME_HEADER_SIZE) {
                rc = MPI_Mrecv(hb, DP_FRAME_HEADER_SIZE, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
            } else { /* not ours to trust: consume it and say so */
                void *sink = malloc(count > 0 ? (size_t)count : 1);
                rc = MPI_Mrecv(sink, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
                free(sink);
            }
        }
        UNLOCK();
        if (rc != MPI_SUCCESS) {
            char s[MPI_MAX_ERROR_STRING];
            dp_warn("MPI probe or receive of a frame header failed: %s", mpi_errstr(rc, s));
        } else if (flag) {
            if (take_header(t, w, hb, count, ev))
                return 0;
            spin = 0;
            continue;
        }
        if (dp_now() >= deadline)
            break;
        backoff(spin);
    }
    memset(ev, 0, sizeof *ev);
    ev->kind = DP_EVENT_TIMEOUT;
    ev->peer = -1;
    return 0;
}

/* ---- the collective fast path ---- */

static int allreduce_locked(mpit *t, float *buf, size_t len, const int *ranks, int n,
                            dp_err *err);

static int mpi_allreduce(dp_transport *bt, float *buf, size_t len, const int *ranks, int n,
                         dp_err *err)
{
    mpit *t = (mpit *)bt;
    pthread_mutex_lock(&t->ar_mu);
    int rc = allreduce_locked(t, buf, len, ranks, n, err);
    pthread_mutex_unlock(&t->ar_mu);
    return rc;
}

static int allreduce_locked(mpit *t, float *buf, size_t len, const int *ranks, int n,
                            dp_err *err)
{
    char s[MPI_MAX_ERROR_STRING];
    int me = 0;
    if (n < 1 || n > t->base.n_ranks)
        return dp_errf(err, "all-reduce over %d ranks (the cluster has %d)", n, t->base.n_ranks);
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= t->base.n_ranks)
            return dp_errf(err, "all-reduce: rank %d is out of range", ranks[i]);
        me += ranks[i] == t->base.rank;
    }
    if (me != 1)
        return dp_errf(err, "all-reduce: this rank (%d) is not among the %d participants exactly "
                            "once", t->base.rank, n);
    if (n == 1 || len == 0)
        return 0;
    if (t->ar_n != n || memcmp(t->ar_ranks, ranks, (size_t)n * sizeof *ranks) != 0) {
        /* A communicator of exactly these ranks, in this order; only they
         * take part in creating it (MPI_Comm_create_group). */
        int *wr = malloc((size_t)n * sizeof *wr), *keep = malloc((size_t)n * sizeof *keep);
        if (!wr || !keep) {
            free(wr);
            free(keep);
            return dp_errf(err, "all-reduce: out of memory");
        }
        for (int i = 0; i < n; i++)
            wr[i] = t->world_of[ranks[i]];
        MPI_Group world, g;
        MPI_Comm nc = MPI_COMM_NULL;
        LOCK();
        if (t->ar_comm != MPI_COMM_NULL)
            MPI_Comm_free(&t->ar_comm);
        t->ar_n = 0;
        int rc = MPI_Comm_group(t->comm, &world);
        if (rc == MPI_SUCCESS) {
            rc = MPI_Group_incl(world, n, wr, &g);
            if (rc == MPI_SUCCESS) {
                rc = MPI_Comm_create_group(t->comm, g, TAG_GROUP, &nc);
                MPI_Group_free(&g);
            }
            MPI_Group_free(&world);
        }
        UNLOCK();
        free(wr);
        if (rc != MPI_SUCCESS) {
            free(keep);
            return dp_errf(err, "all-reduce: creating the communicator of %d ranks: %s", n,
                           mpi_errstr(rc, s));
        }
        MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
        memcpy(keep, ranks, (size_t)n * sizeof *ranks);
        free(t->ar_ranks);
        t->ar_ranks = keep;
        t->ar_n = n;
        t->ar_comm = nc;
    }
    const size_t step = (size_t)1 << 28; /* an MPI count is an int */
    for (size_t off = 0; off < len; off += step) {
        int cnt = (int)(len - off < step ? len - off : step), rc;
        if (!g_serial) {
            rc = MPI_Allreduce(MPI_IN_PLACE, buf + off, cnt, MPI_FLOAT, MPI_SUM, t->ar_comm);
        } else {
            MPI_Request req;
            LOCK();
            rc = MPI_Iallreduce(MPI_IN_PLACE, buf + off, cnt, MPI_FLOAT, MPI_SUM, t->ar_comm,
                                &req);
            UNLOCK();
            if (rc == MPI_SUCCESS)
                rc = wait_req(&req, MPI_STATUS_IGNORE);
        }
        if (rc != MPI_SUCCESS)
            return dp_errf(err, "MPI_Allreduce of %d floats over %d ranks: %s", cnt, n,
                           mpi_errstr(rc, s));
    }
    /* What a ring moves each way per rank: 2(n-1)/n of the buffer. */
    atomic_fetch_add_explicit(&t->coll_bytes, (uint64_t)(2.0 * (n - 1) / n * (double)len * 4.0),
                              memory_order_relaxed);
    return 0;
}

/* ---- stats, open, close ---- */

static void mpi_stats(const dp_transport *bt, int p, dp_transport_stats *out)
{
    mpit *t = (mpit *)bt;
    for (int i = 0; i < t->base.n_ranks; i++) {
        if (p != DP_PEER_ANY && p != i)
            continue;
        peer *c = &t->peers[i];
        out->bytes_sent += atomic_load_explicit(&c->bytes_sent, memory_order_relaxed);
        out->bytes_recv += atomic_load_explicit(&c->bytes_recv, memory_order_relaxed);
        out->frames_sent += atomic_load_explicit(&c->frames_sent, memory_order_relaxed);
        out->frames_recv += atomic_load_explicit(&c->frames_recv, memory_order_relaxed);
    }
    if (p == DP_PEER_ANY) { /* collectives have no one peer: totals only */
        uint64_t b = atomic_load_explicit(&t->coll_bytes, memory_order_relaxed);
        out->bytes_sent += b;
        out->bytes_recv += b;
    }
}

/* No barrier and no goodbye: ranks leave at different times (ps tasks after
 * the chief's SHUTDOWN), and MPI_Finalize (dp_mpi_finalize) is the only
 * collective at the end. */
static void mpi_close(dp_transport *bt)
{
    mpit *t = (mpit *)bt;
    LOCK();
    if (t->ar_comm != MPI_COMM_NULL)
        MPI_Comm_free(&t->ar_comm);
    if (t->comm != MPI_COMM_NULL)
        MPI_Comm_free(&t->comm);
    UNLOCK();
    for (int i = 0; t->peers && i < t->base.n_ranks; i++) {
        free(t->peers[i].buf);
        pthread_mutex_destroy(&t->peers[i].send_mu);
    }
    free(t->peers);
    free(t->world_of);
    free(t->cluster_of);
    free(t->ar_ranks);
    pthread_mutex_destroy(&t->ar_mu);
    dp_transport_base_free(&t->base);
    free(t);
}

int dp_mpi_open(const dp_mpi_config *cfg, dp_transport **out, dp_err *err)
{
    *out = NULL;
    int wrank, wsize;
    if (dp_mpi_init(&wrank, &wsize, err))
        return -1;
    if (cfg->n_ranks < 1 || cfg->n_ranks > wsize || cfg->rank < 0 || cfg->rank >= cfg->n_ranks)
        return dp_errf(err, "mpi transport: rank %d of %d, in an MPI job of %d ranks", cfg->rank,
                       cfg->n_ranks, wsize);
    if (!cfg->world_rank_of)
        return dp_errf(err, "mpi transport: no world_rank_of table");
    if (cfg->world_rank_of[cfg->rank] != wrank)
        return dp_errf(err, "mpi transport: cluster rank %d maps to MPI rank %d, but this "
                            "process is MPI rank %d",
                       cfg->rank, cfg->world_rank_of[cfg->rank], wrank);
    uint64_t max_frame = cfg->max_frame_bytes ? cfg->max_frame_bytes : DP_FRAME_MAX_DEFAULT;
    if (max_frame > INT_MAX)
        return dp_errf(err, "mpi transport: maximum frame size %" PRIu64 " exceeds an MPI count "
                            "(%d)", max_frame, INT_MAX);

    mpit *t = calloc(1, sizeof *t);
    if (!t)
        return dp_errf(err, "out of memory");
    t->comm = t->ar_comm = MPI_COMM_NULL;
    pthread_mutex_init(&t->ar_mu, NULL);
    if (dp_transport_base_init(&t->base, &mpi_ops, cfg->rank, cfg->n_ranks, cfg->names,
                               cfg->late_log, err)) {
        free(t);
        return -1;
    }
    t->world_size = wsize;
    t->max_frame = max_frame;
    t->peers = calloc((size_t)cfg->n_ranks, sizeof *t->peers);
    t->world_of = malloc((size_t)cfg->n_ranks * sizeof *t->world_of);
    t->cluster_of = malloc((size_t)wsize * sizeof *t->cluster_of);
    if (!t->peers || !t->world_of || !t->cluster_of) {
        free(t->peers);
        t->peers = NULL;
        dp_errf(err, "out of memory");
        goto fail;
    }
    for (int i = 0; i < cfg->n_ranks; i++)
        pthread_mutex_init(&t->peers[i].send_mu, NULL);
    for (int w = 0; w < wsize; w++)
        t->cluster_of[w] = -1;
    for (int i = 0; i < cfg->n_ranks; i++) {
        int w = cfg->world_rank_of[i];
        if (w < 0 || w >= wsize || t->cluster_of[w] >= 0) {
            dp_errf(err, "mpi transport: %s maps to MPI rank %d, %s", pname(t, i), w,
                    w < 0 || w >= wsize ? "outside the job" : "taken by another task");
            goto fail;
        }
        t->cluster_of[w] = i;
        t->world_of[i] = w;
    }
    /* Our own communicator: frames never match anybody else's messages, and
     * errors come back as codes instead of aborting the job. */
    LOCK();
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &t->comm);
    if (rc == MPI_SUCCESS)
        MPI_Comm_set_errhandler(t->comm, MPI_ERRORS_RETURN);
    UNLOCK();
    if (rc != MPI_SUCCESS) {
        char s[MPI_MAX_ERROR_STRING];
        t->comm = MPI_COMM_NULL;
        dp_errf(err, "MPI_Comm_dup: %s", mpi_errstr(rc, s));
        goto fail;
    }
    *out = &t->base;
    return 0;
fail:
    mpi_close(&t->base);
    return -1;
}

static const dp_transport_ops mpi_ops = {
    .name = "mpi",
    .connect = mpi_connect,
    .sendv = mpi_sendv,
    .poll = mpi_poll,
    .recv_payload = mpi_recv_payload,
    .skip_payload = mpi_skip_payload,
    .stats = mpi_stats,
    .close = mpi_close,
    .allreduce = mpi_allreduce,
};

#endif /* DOWNPOUR_HAVE_MPI */
