/* sim's collectives (backend.h; docs/gpu.md, "Backends"): the ranks of a
 * communicator are processes or threads on this host, and they meet in a
 * shared-memory segment that the id names.
 *
 * Id: 16 random bytes (getrandom), then 112 zero bytes.  The segment is
 * /dev/shm/downpour-simcomm-<the 16 bytes in hex>.  Every joiner opens it
 * (O_CREAT, 0600); the first one, under flock, sizes it for `ranks`
 * (posix_fallocate, so a full /dev/shm is an error at join rather than a
 * SIGBUS in a sum) and stamps the header.  Later joiners check the header
 * under the same lock and never resize, so no mapping ever outlives its
 * file's end.  Once every rank has joined, each unlinks the name.
 *
 *   0         header: u32 magic "DPSC", u32 version, u32 ranks, u32 slot floats
 *   4096      per rank, CTL_BYTES each: its rank_ctl
 *   slots     per rank, SLOT_FLOATS floats: its chunk of the sum under way
 *
 * A rank writes only its own control block and slot.  A sum goes chunk by
 * chunk: copy my chunk to my slot, publish arrived = seq (release), wait
 * until every rank arrived, add the slots in rank order 0..R-1 into the
 * caller's buffer (so every rank gets the same bits: those of a plain loop
 * over the ranks' buffers in rank order), publish done = seq, and wait until
 * every rank is done before the slots are reused.
 *
 * A sum is QUEUED, as NCCL's is: comm_allreduce publishes the first chunk
 * and returns; comm_wait moves it on for at most its timeout and says
 * whether it is done; anything sim runs later on the stream (a copy, a
 * product, a kernel, a sync) first finishes every sum in flight
 * (dp_sim_comm_settle), so stream order holds.  A caller that waits in
 * slices and watches its peers between them (allreduce.c) sees a frozen
 * peer as it would on a GPU.
 *
 * A wait spins SPIN_NS, then naps NAP_NS at a time.  A peer that is behind
 * and has left (its aborted flag, set by comm_abort and comm_free), whose
 * process is gone (threads of one process share a pid: for them the flag is
 * the word), or that stays behind past DOWNPOUR_SIM_COMM_TIMEOUT seconds
 * fails the communicator.  The failure is kept (comm_wait reports it) and
 * is the communicator's alone: the device's sync() knows nothing of it. */
#include "device/sim.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "device/backend.h"
#include "downpour/testhooks.h"

#define ID_BYTES 128 /* NCCL's unique id's size: one id travels for either backend */
#define ID_RANDOM 16
#define MAX_RANKS 1024
#define SEG_MAGIC 0x43535044u /* "DPSC" */
#define SEG_VERSION 1u
#define CTL_OFF 4096
#define CTL_BYTES 128
#define PAGE 4096
#define SLOT_FLOATS ((size_t)64 * 1024) /* 256 KiB a rank: 1024 ranks fit in 256 MiB */
#define SEG_DIR "/dev/shm/downpour-simcomm-"
#define SPIN_NS 20000 /* then nap: on a few cores a spinning rank steals its peers' core */
#define NAP_NS 50000
#define LIVENESS_NAPS 100 /* look for dead peers every this many naps (5 ms and more) */
#define DEFAULT_TIMEOUT_S 300.0
#define TIMEOUT_ENV "DOWNPOUR_SIM_COMM_TIMEOUT"

/* The counters are shared between processes: they must be lock-free, since
 * a lock-based atomic's lock lives in one process. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_LONG_LOCK_FREE == 2 &&
                   ATOMIC_LLONG_LOCK_FREE == 2,
               "sim's collectives need lock-free 32- and 64-bit atomics");

typedef struct seg_header {
    uint32_t magic, version, ranks, slot_floats;
} seg_header;

typedef struct rank_ctl {
    _Atomic int32_t pid;      /* its process, once joined */
    _Atomic uint32_t aborted; /* it left: comm_abort, comm_free or a failed join */
    _Atomic uint64_t pidns;   /* its pid namespace's inode: pids compare only within one */
    _Atomic uint64_t joined;  /* 1 once joined */
    _Atomic uint64_t n;       /* floats of its sum under way */
    _Atomic uint64_t arrived; /* the last chunk it wrote to its slot */
    _Atomic uint64_t done;    /* the last chunk it read from every slot */
} rank_ctl;
_Static_assert(sizeof(rank_ctl) <= CTL_BYTES, "rank_ctl outgrew its CTL_BYTES");

typedef enum wait_on { ON_JOINED, ON_ARRIVED, ON_DONE } wait_on;

struct dp_sim_comm {
    unsigned char *base; /* the mapped segment */
    size_t bytes;
    int ranks, rank;
    double timeout_s;
    uint64_t seq;     /* chunks summed so far */
    size_t n;         /* floats of the sum under way, for messages */
    uint64_t pidns;   /* this process's pid namespace */
    int failed;
    char fail[256];   /* why, kept */
    /* the sum in flight: buf[0..n) from float off, in phase (ON_ARRIVED:
     * waiting for every rank's chunk seq; ON_DONE: for every rank to have
     * read it), waiting since wait_t0 */
    float *buf;
    size_t off;
    wait_on phase;
    double wait_t0;
    dp_sim_comm *next; /* in its context's list */
};


static size_t slots_off(int ranks)
{
    size_t end = CTL_OFF + (size_t)ranks * CTL_BYTES;
    return (end + PAGE - 1) / PAGE * PAGE;
}

static size_t seg_bytes(int ranks)
{
    return slots_off(ranks) + (size_t)ranks * SLOT_FLOATS * sizeof(float);
}

static rank_ctl *ctl(const dp_sim_comm *c, int r)
{
    return (rank_ctl *)(c->base + CTL_OFF + (size_t)r * CTL_BYTES);
}

static float *slot(const dp_sim_comm *c, int r)
{
    return (float *)(c->base + slots_off(c->ranks)) + (size_t)r * SLOT_FLOATS;
}

static _Atomic uint64_t *counter(rank_ctl *k, wait_on w)
{
    return w == ON_JOINED ? &k->joined : w == ON_ARRIVED ? &k->arrived : &k->done;
}

static uint64_t seen(rank_ctl *k, wait_on w)
{
    return atomic_load_explicit(counter(k, w), memory_order_acquire);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Keeps the first failure: later ones follow from it. */
static int comm_fail(dp_sim_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int comm_fail(dp_sim_comm *c, const char *fmt, ...)
{
    if (!c->failed) {
        c->failed = 1;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->fail, sizeof c->fail, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static uint64_t my_pidns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Whether process pid is gone: no such process, or a zombie whose parent
 * has not reaped it yet (kill() still finds those). */
static int pid_gone(int pid)
{
    if (pid <= 0 || pid == (int)getpid())
        return 0;
    if (kill(pid, 0) < 0)
        return errno == ESRCH;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT;
    ssize_t k = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (k <= 0)
        return 0;
    buf[k] = '\0';
    const char *p = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold ')' */
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* What this rank was doing, for messages: "comm_join: " or "sim collective: "
 * first, "(rank 0 was in a sum of N floats)" after. */
static const char *prefix(wait_on w)
{
    return w == ON_JOINED ? "comm_join" : "sim collective";
}

static void doing(const dp_sim_comm *c, wait_on w, char *buf, size_t len)
{
    if (w == ON_JOINED)
        snprintf(buf, len, "rank %d was joining", c->rank);
    else
        snprintf(buf, len, "rank %d was in a sum of %zu floats", c->rank, c->n);
}

static int lost(dp_sim_comm *c, wait_on w, int r, const char *what)
{
    char d[96];
    doing(c, w, d, sizeof d);
    return comm_fail(c, "%s: rank %d of %d (pid %d) %s (%s)", prefix(w), r, c->ranks,
                     (int)atomic_load(&ctl(c, r)->pid), what, d);
}

/* The ranks still behind seq, as "1, 2" (the first few, then a count). */
static void behind_list(dp_sim_comm *c, wait_on w, uint64_t seq, char *buf, size_t len)
{
    size_t at = 0;
    int listed = 0, more = 0;
    buf[0] = '\0';
    for (int r = 0; r < c->ranks; r++) {
        if (seen(ctl(c, r), w) >= seq)
            continue;
        if (listed == 8) {
            more++;
            continue;
        }
        int k = snprintf(buf + at, len - at, "%s%d", listed ? ", " : "", r);
        if (k > 0 && (size_t)k < len - at)
            at += (size_t)k;
        listed++;
    }
    if (more)
        snprintf(buf + at, len - at, " and %d more", more);
}

static int all_joined(dp_sim_comm *c)
{
    for (int r = 0; r < c->ranks; r++)
        if (seen(ctl(c, r), ON_JOINED) < 1)
            return 0;
    return 1;
}

/* Waits until every rank's counter w reached seq (0), or until `until`
 * (a now_s() time; < 0: no bound) passes first (1), or fails the
 * communicator (-1).  The communicator's own timeout runs from t0, which
 * may be earlier than this call (a sum moved on over several comm_waits).
 * A peer's counter is read again after its flag or its death is seen: a
 * peer may finish this chunk and leave between two reads, and then its last
 * word stands. */
static int wait_until(dp_sim_comm *c, wait_on w, uint64_t seq, double t0, double until)
{
    double entered = now_s();
    long naps = 0;
    int from = 0; /* every rank below has reached seq */
    for (;;) {
        while (from < c->ranks && seen(ctl(c, from), w) >= seq)
            from++;
        if (from == c->ranks)
            return 0;
        for (int r = from; r < c->ranks; r++) {
            rank_ctl *k = ctl(c, r);
            if (seen(k, w) < seq && atomic_load_explicit(&k->aborted, memory_order_acquire) &&
                seen(k, w) < seq)
                return lost(c, w, r, "left the communicator (comm_abort or comm_free)");
        }
        /* While some rank has not joined, no join has returned: a rank that
         * joined and left is one whose join failed, and nobody can sum. */
        if (w == ON_JOINED)
            for (int r = 0; r < from; r++)
                if (atomic_load_explicit(&ctl(c, r)->aborted, memory_order_acquire) &&
                    !all_joined(c))
                    return lost(c, w, r, "gave up joining");
        double now = now_s(), spent = now - t0;
        if (until >= 0 && now >= until)
            return 1;
        if (now - entered < SPIN_NS * 1e-9)
            continue;
        if (++naps % LIVENESS_NAPS == 0)
            for (int r = from; r < c->ranks; r++) {
                rank_ctl *k = ctl(c, r);
                if (seen(k, w) < seq && atomic_load(&k->pidns) == c->pidns &&
                    pid_gone((int)atomic_load(&k->pid)) && seen(k, w) < seq)
                    return lost(c, w, r, "is gone");
            }
        if (spent >= c->timeout_s) {
            char who[128], d[96];
            behind_list(c, w, seq, who, sizeof who);
            doing(c, w, d, sizeof d);
            if (w == ON_JOINED)
                return comm_fail(c, "comm_join: rank(s) %s of %d did not join within %g s "
                                    "(" TIMEOUT_ENV ")",
                                 who, c->ranks, c->timeout_s);
            return comm_fail(c, "sim collective: no word from rank(s) %s of %d within %g s (%s; "
                                TIMEOUT_ENV ")",
                             who, c->ranks, c->timeout_s, d);
        }
        struct timespec nap = {0, NAP_NS};
        nanosleep(&nap, NULL);
    }
}

static int wait_all(dp_sim_comm *c, wait_on w, uint64_t seq)
{
    return wait_until(c, w, seq, now_s(), -1);
}

/* DOWNPOUR_SIM_COMM_TIMEOUT: seconds, a plain decimal above 0. */
static int read_timeout(double *out, char *msg, size_t len)
{
    const char *v = dp_hook_text(DP_HOOK_SIM_COMM_TIMEOUT);
    *out = DEFAULT_TIMEOUT_S;
    if (!v || !*v)
        return 0;
    char *end = NULL;
    double t = 0;
    if (v[0] >= '0' && v[0] <= '9' && strspn(v, "0123456789.") == strlen(v))
        t = strtod(v, &end);
    if (!end || *end || !(t > 0) || t > 1e7) {
        snprintf(msg, len, "comm_join: " TIMEOUT_ENV " '%s' is not a number of seconds above 0 "
                           "(e.g. 300)", v);
        return -1;
    }
    *out = t;
    return 0;
}

int dp_sim_comm_id(void *ctx, uint8_t *id, size_t id_len, char *msg, size_t len)
{
    (void)ctx;
    if (id_len != ID_BYTES) {
        snprintf(msg, len, "comm_id: %zu id bytes given, sim's id has %d", id_len, ID_BYTES);
        return -1;
    }
    memset(id, 0, ID_BYTES);
    size_t got = 0;
    while (got < ID_RANDOM) {
        ssize_t k = getrandom(id + got, ID_RANDOM - got, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            snprintf(msg, len, "comm_id: getrandom: %s", strerror(errno));
            return -1;
        }
        got += (size_t)k;
    }
    return 0;
}

/* An id from comm_id: random bytes first, zeros after (never all zeros, so
 * an id nobody filled in is refused). */
static int id_ok(const uint8_t *id)
{
    int random = 0;
    for (int i = 0; i < ID_RANDOM; i++)
        random |= id[i];
    for (int i = ID_RANDOM; i < ID_BYTES; i++)
        if (id[i])
            return 0;
    return random != 0;
}

/* Opens, sizes or checks, and maps the segment; marks `rank` joined.  The
 * file lock makes the first joiner's sizing and stamping one step. */
static int seg_attach(dp_sim_comm *c, const char *path, char *msg, size_t len)
{
    int fd = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(msg, len, "comm_join: cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    int rc = -1, first = 0;
    while (flock(fd, LOCK_EX) < 0) {
        if (errno != EINTR) {
            snprintf(msg, len, "comm_join: cannot lock %s: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
    }
    struct stat st;
    size_t want = seg_bytes(c->ranks);
    if (fstat(fd, &st) < 0) {
        snprintf(msg, len, "comm_join: cannot stat %s: %s", path, strerror(errno));
        goto out;
    }
    if (st.st_size == 0) {
        first = 1;
        int e = posix_fallocate(fd, 0, (off_t)want);
        if (e) {
            snprintf(msg, len, "comm_join: cannot make %s %zu bytes for %d ranks: %s", path, want,
                     c->ranks, strerror(e));
            goto out;
        }
    } else {
        seg_header h;
        if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || h.magic != SEG_MAGIC ||
            h.version != SEG_VERSION || h.slot_floats != SLOT_FLOATS) {
            snprintf(msg, len, "comm_join: %s is not a sim communicator of this build", path);
            goto out;
        }
        if (h.ranks != (uint32_t)c->ranks) {
            snprintf(msg, len, "comm_join: rank %d joins with %d ranks, but this communicator "
                               "was made for %u ranks (by its first joiner)",
                     c->rank, c->ranks, h.ranks);
            goto out;
        }
        if ((size_t)st.st_size != want) {
            snprintf(msg, len, "comm_join: %s is %lld bytes, %d ranks need %zu", path,
                     (long long)st.st_size, c->ranks, want);
            goto out;
        }
    }
    void *p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        snprintf(msg, len, "comm_join: cannot map %s (%zu bytes): %s", path, want,
                 strerror(errno));
        goto out;
    }
    c->base = p;
    c->bytes = want;
    if (first) {
        seg_header h = {SEG_MAGIC, SEG_VERSION, (uint32_t)c->ranks, (uint32_t)SLOT_FLOATS};
        memcpy(c->base, &h, sizeof h);
    }
    rank_ctl *me = ctl(c, c->rank);
    if (atomic_load(&me->joined)) {
        snprintf(msg, len, "comm_join: rank %d of %d joined this communicator twice", c->rank,
                 c->ranks);
        munmap(c->base, c->bytes);
        c->base = NULL;
        goto out;
    }
    atomic_store(&me->pid, (int32_t)getpid());
    atomic_store(&me->pidns, c->pidns);
    atomic_store_explicit(&me->joined, 1, memory_order_release);
    rc = 0;
out:
    if (rc < 0 && first)
        unlink(path); /* it holds nothing yet: a peer that has it open sizes it anew */
    flock(fd, LOCK_UN);
    close(fd);
    return rc;
}

/* Ends a communicator: peers waiting on this rank fail at once. */
static void comm_end(void *ctx, dp_sim_comm *c)
{
    for (dp_sim_comm **p = dp_sim_comm_list(ctx); *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    atomic_store_explicit(&ctl(c, c->rank)->aborted, 1, memory_order_release);
    munmap(c->base, c->bytes);
    free(c);
}

int dp_sim_comm_join(void *ctx, const uint8_t *id, size_t id_len, int ranks, int rank,
                     void **comm, char *msg, size_t len)
{
    *comm = NULL;
    if (id_len != ID_BYTES) {
        snprintf(msg, len, "comm_join: %zu id bytes given, sim's id has %d", id_len, ID_BYTES);
        return -1;
    }
    if (ranks < 1 || ranks > MAX_RANKS) {
        snprintf(msg, len, "comm_join: %d ranks; sim's communicators have 1 to %d", ranks,
                 MAX_RANKS);
        return -1;
    }
    if (rank < 0 || rank >= ranks) {
        snprintf(msg, len, "comm_join: rank %d is outside 0 to %d (%d ranks)", rank, ranks - 1,
                 ranks);
        return -1;
    }
    if (!id_ok(id)) {
        snprintf(msg, len, "comm_join: the id was not made by sim's comm_id (16 random bytes, "
                           "then zeros)");
        return -1;
    }
    dp_sim_comm *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(msg, len, "comm_join: out of memory");
        return -1;
    }
    c->ranks = ranks;
    c->rank = rank;
    c->pidns = my_pidns();
    if (read_timeout(&c->timeout_s, msg, len) < 0) {
        free(c);
        return -1;
    }
    char path[sizeof SEG_DIR + 2 * ID_RANDOM];
    memcpy(path, SEG_DIR, sizeof SEG_DIR - 1);
    for (int i = 0; i < ID_RANDOM; i++)
        snprintf(path + sizeof SEG_DIR - 1 + 2 * i, 3, "%02x", id[i]);
    if (seg_attach(c, path, msg, len) < 0) {
        free(c);
        return -1;
    }
    int rc = wait_all(c, ON_JOINED, 1);
    unlink(path); /* every rank has it mapped, or the join failed: either way the name goes */
    if (rc < 0) {
        snprintf(msg, len, "%s", c->fail);
        c->next = NULL;
        atomic_store_explicit(&ctl(c, c->rank)->aborted, 1, memory_order_release);
        munmap(c->base, c->bytes);
        free(c);
        return -1;
    }
    dp_sim_comm **list = dp_sim_comm_list(ctx);
    c->next = *list;
    *list = c;
    *comm = c;
    return 0;
}

/* Publishes the chunk at c->off: copied to my slot, arrived = seq. */
static void publish(dp_sim_comm *c)
{
    size_t k = c->n - c->off < SLOT_FLOATS ? c->n - c->off : SLOT_FLOATS;
    rank_ctl *me = ctl(c, c->rank);
    uint64_t seq = ++c->seq;
    memcpy(slot(c, c->rank), c->buf + c->off, k * sizeof(float));
    atomic_store_explicit(&me->n, (uint64_t)c->n, memory_order_relaxed);
    atomic_store_explicit(&me->arrived, seq, memory_order_release);
    c->phase = ON_ARRIVED;
    c->wait_t0 = now_s();
}

/* Moves the sum in flight on until `until` (< 0: until it ends): 0 done
 * (nothing in flight), 1 still in flight, -1 failed. */
static int progress(dp_sim_comm *c, double until)
{
    while (c->buf && !c->failed) {
        int rc = wait_until(c, c->phase, c->seq, c->wait_t0, until);
        if (rc != 0)
            return rc;
        if (c->phase == ON_DONE) { /* every rank read chunk seq: on to the next */
            c->off += SLOT_FLOATS;
            if (c->off >= c->n)
                c->buf = NULL;
            else
                publish(c);
            continue;
        }
        for (int r = 0; r < c->ranks; r++) {
            uint64_t theirs = atomic_load_explicit(&ctl(c, r)->n, memory_order_relaxed);
            if (theirs != (uint64_t)c->n)
                return comm_fail(c, "sim collective: rank %d of %d sums %llu floats, rank %d "
                                    "%zu: every rank must sum the same count",
                                 r, c->ranks, (unsigned long long)theirs, c->rank, c->n);
        }
        size_t k = c->n - c->off < SLOT_FLOATS ? c->n - c->off : SLOT_FLOATS;
        float *restrict out = c->buf + c->off;
        memcpy(out, slot(c, 0), k * sizeof(float));
        for (int r = 1; r < c->ranks; r++) {
            const float *restrict in = slot(c, r);
            for (size_t i = 0; i < k; i++)
                out[i] += in[i];
        }
        atomic_store_explicit(&ctl(c, c->rank)->done, c->seq, memory_order_release);
        c->phase = ON_DONE;
        c->wait_t0 = now_s();
    }
    return c->failed ? -1 : 0;
}

int dp_sim_comm_allreduce(void *ctx, void *comm, float *buf, size_t n)
{
    dp_sim_comm *c = comm;
    if (c->failed)
        return -1;
    if (dp_sim_capturing(ctx))
        return comm_fail(c, "sim collective: a sum of %zu floats during a graph capture (sim "
                            "records no collectives)",
                         n);
    dp_sim_comm_settle(ctx); /* stream order: the sums queued before this one */
    if (c->failed)
        return -1;
    if (n == 0)
        return 0;
    c->buf = buf;
    c->n = n;
    c->off = 0;
    publish(c);
    return 0;
}

void dp_sim_comm_settle(void *ctx)
{
    for (dp_sim_comm *c = *dp_sim_comm_list(ctx); c; c = c->next)
        progress(c, -1);
}

/* The sum in flight moved on for at most timeout_s. */
int dp_sim_comm_wait(void *ctx, void *comm, double timeout_s, char *msg, size_t len)
{
    (void)ctx;
    dp_sim_comm *c = comm;
    int rc = progress(c, now_s() + (timeout_s > 0 ? timeout_s : 0));
    if (rc >= 0)
        return rc == 0 ? 1 : 0;
    if (msg && len)
        snprintf(msg, len, "%s", c->fail);
    return -1;
}

void dp_sim_comm_abort(void *ctx, void *comm)
{
    if (comm)
        comm_end(ctx, comm);
}

void dp_sim_comm_free(void *ctx, void *comm)
{
    if (comm)
        comm_end(ctx, comm);
}

void dp_sim_comm_close_all(void *ctx)
{
    dp_sim_comm **list = dp_sim_comm_list(ctx);
    while (*list)
        comm_end(ctx, *list);
}
