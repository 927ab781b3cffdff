/* Shared memory between tasks on one host (docs/transport.md, "Shared
 * memory"): frames of many sizes (empty, small, 1 MiB + 1, larger than the
 * ring) arrive byte-identical with shared memory on and off; the segment is
 * unlinked once set up and was 0600; a stranger with the wrong secret gets
 * no segment; a garbage or oversized header in a ring is refused with its
 * reason; a sender killed mid-stream is lost after the frames it sent; ranks
 * that each send more than a ring before reading, a pair or a cycle of 3,
 * all go on; the
 * ring all-reduce gives the same bits over shared memory as over TCP. */
#include "net/auth.h"
#include "net/shm.h"
#include "net/sock.h"

#include "downpour/clock.h"
#include "downpour/ring.h"
#include "downpour/tcp.h"

#include "check.h"
#include "downpour/testhooks.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define T_DATA DP_FRAME_APP(0)
#define RING (64u << 10) /* small rings: big frames wrap and block */

static const unsigned char secret[] = "test_shm secret 0123456789abcdef";
static const unsigned char wrong[] = "test_shm WRONG! 0123456789abcdef";

static size_t sizes[] = {0, 1, 7, 100, 4096, (1u << 20) + 1, 300000, 0, 3};
#define N_SIZES (sizeof sizes / sizeof sizes[0])
#define BIG_FRAME (SANITIZED ? (2u << 20) : (9u << 20)) /* well past the ring */

static void fill(unsigned char *p, size_t n, int seed)
{
    for (size_t k = 0; k < n; k++)
        p[k] = (unsigned char)(k * 131 + (size_t)seed * 7 + (k >> 9));
}

static int open_pair(dp_transport *t[2], int shm, const unsigned char *sec1)
{
    int lfd[2], port[2];
    char addr[2][32];
    const char *ap[2] = {addr[0], addr[1]};
    dp_err err;
    for (int i = 0; i < 2; i++) {
        REQUIRE(dp_tcp_listen("127.0.0.1:0", 0, &lfd[i], &port[i], &err) == 0);
        snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", port[i]);
    }
    for (int i = 0; i < 2; i++) {
        dp_tcp_config cfg;
        dp_tcp_config_init(&cfg);
        cfg.rank = i;
        cfg.n_ranks = 2;
        cfg.addrs = ap;
        cfg.secret = i == 1 ? sec1 : secret;
        cfg.secret_len = sizeof secret - 1;
        cfg.listen_fd = lfd[i];
        cfg.shm = shm;
        cfg.shm_ring_bytes = RING;
        cfg.heartbeat_timeout = 3;
        REQUIRE(dp_tcp_open(&cfg, &t[i], &err) == 0);
    }
    /* rank 0 dials rank 1; rank 1's connect waits for the accept */
    int rc = dp_transport_connect(t[0], 1, dp_now() + 3, &err);
    if (rc == 0)
        rc = dp_transport_connect(t[1], 0, dp_now() + 3, &err);
    return rc;
}

/* Mappings of our segments: how many, and how many are deleted. */
static void maps(int *n, int *deleted)
{
    char line[512];
    FILE *f = fopen("/proc/self/maps", "r");
    *n = *deleted = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (strstr(line, "/dev/shm/downpour-")) {
            (*n)++;
            *deleted += strstr(line, "(deleted)") != NULL;
        }
    }
    if (f)
        fclose(f);
}

/* Segments are named by random tokens, and the suite runs other tests' links
 * beside this one, each with a segment that lives for the moments between
 * create and map. So "nothing left behind" means: no name that was not there
 * at the start is still there once a few seconds have passed. */
enum { SHM_NAMES = 512 };
static char shm_before[SHM_NAMES][256];
static int shm_nbefore;

/* This test's segments: named with its pid as their tag (main sets
 * DOWNPOUR_TEST_SHM_TAG), so other tests' segments, in /dev/shm at the same
 * time under ctest -j, are not counted as its leaks. */
static char shm_prefix[32] = "downpour-";

static int shm_list(char names[][256], int max)
{
    DIR *d = opendir("/dev/shm");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strncmp(e->d_name, shm_prefix, strlen(shm_prefix)) == 0 && n < max)
            snprintf(names[n++], 256, "%s", e->d_name);
    if (d)
        closedir(d);
    return n;
}

static void shm_snapshot(void)
{
    shm_nbefore = shm_list(shm_before, SHM_NAMES);
}

/* Names not in the snapshot that outlive a 5 s wait: this test's leaks. */
static int shm_leaked(void)
{
    static char now[SHM_NAMES][256];
    int fresh = 0;
    for (int tries = 0; tries < 50; tries++) {
        int n = shm_list(now, SHM_NAMES);
        fresh = 0;
        for (int i = 0; i < n; i++) {
            int seen = 0;
            for (int j = 0; j < shm_nbefore && !seen; j++)
                seen = strcmp(now[i], shm_before[j]) == 0;
            fresh += !seen;
        }
        if (fresh == 0)
            return 0;
        usleep(100 * 1000);
    }
    return fresh;
}

typedef struct sender_arg {
    dp_transport *t;
    unsigned char *buf;
    int rc;
} sender_arg;

static void *send_all(void *p)
{
    sender_arg *a = p;
    dp_err err;
    a->rc = 0;
    for (size_t i = 0; i < N_SIZES && !a->rc; i++) {
        fill(a->buf, sizes[i], (int)i);
        a->rc = dp_transport_send(a->t, 1, T_DATA, i, 0, a->buf, sizes[i], &err);
    }
    fill(a->buf, BIG_FRAME, 99);
    if (!a->rc)
        a->rc = dp_transport_send(a->t, 1, T_DATA, 99, 0, a->buf, BIG_FRAME, &err);
    if (a->rc)
        fprintf(stderr, "send: %s\n", err.msg);
    return NULL;
}

/* Frames of every size from rank 0 to rank 1; returns a checksum of all
 * that arrived (and checks each byte). */
static uint64_t exchange(int shm)
{
    dp_transport *t[2];
    REQUIRE(open_pair(t, shm, secret) == 0);
    int n, del;
    maps(&n, &del);
    CHECKF(shm ? n >= 2 && del == n : n == 0, "shm %d: %d mappings, %d deleted", shm, n, del);
    unsigned char *sb = malloc(BIG_FRAME), *want = malloc(BIG_FRAME), *got = malloc(BIG_FRAME);
    REQUIRE(sb && want && got);
    sender_arg a = {t[0], sb, 0};
    pthread_t thr;
    REQUIRE(pthread_create(&thr, NULL, send_all, &a) == 0);
    uint64_t sum = 0;
    dp_err err;
    for (size_t i = 0; i <= N_SIZES; i++) {
        size_t len = i < N_SIZES ? sizes[i] : BIG_FRAME;
        dp_event ev;
        REQUIRE(dp_transport_recv(t[1], 0, "data", 10, &ev, &err) == 0);
        CHECK(ev.header.length == len && ev.header.step == (i < N_SIZES ? i : 99));
        /* in two pieces, the first odd-sized */
        size_t first = len / 3;
        CHECK(dp_transport_recv_payload(t[1], 0, got, first, &err) == 0);
        CHECK(dp_transport_recv_payload(t[1], 0, got + first, len - first, &err) == 0);
        fill(want, len, i < N_SIZES ? (int)i : 99);
        CHECKF(memcmp(got, want, len) == 0, "frame %zu (%zu bytes) differs", i, len);
        for (size_t k = 0; k < len; k++)
            sum = sum * 31 + got[k];
    }
    pthread_join(thr, NULL);
    CHECK(a.rc == 0);
    dp_transport_stats s0, s1;
    dp_transport_stats_get(t[0], 1, &s0);
    dp_transport_stats_get(t[1], 0, &s1);
    CHECK(s0.frames_sent >= N_SIZES + 1 && s1.frames_recv >= N_SIZES + 1);
    dp_transport_close(t[0]);
    dp_event ev;
    REQUIRE(dp_transport_poll(t[1], 0, 5, &ev, &err) == 0);
    CHECKF(ev.kind == DP_EVENT_PEER_LOST && ev.orderly, "%s %s", dp_event_kind_name(ev.kind),
           ev.reason);
    dp_transport_close(t[1]);
    free(sb);
    free(want);
    free(got);
    return sum;
}

/* A raw link pair through the setup on a loopback connection (insecure:
 * CRCs, no keys), the acceptor in a thread. */
typedef struct acc_arg {
    int fd;
    dp_shm *link;
} acc_arg;

static void *acc_main(void *p)
{
    acc_arg *a = p;
    dp_auth_session s = {0};
    s.shm = 1;
    char why[200];
    dp_auth_io io = {0};
    dp_err err;
    if (dp_shm_accept(a->fd, 1, 0, 1, &s, dp_now() + 3, &a->link, why, sizeof why, &io, &err))
        a->link = NULL;
    return NULL;
}

static void link_pair(dp_shm **d, dp_shm **a)
{
    int lfd, port, fd[2], eno;
    dp_err err;
    dp_sockaddr sa;
    char addr[32];
    REQUIRE(dp_sock_listen("127.0.0.1:0", 0, &lfd, &port, &err) == 0);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    REQUIRE(dp_sock_resolve(addr, 0, &sa, &err) == 0);
    REQUIRE(dp_sock_dial(&sa, 0, 2, &fd[0], &eno, &err) == 0);
    REQUIRE((fd[1] = accept(lfd, NULL, NULL)) >= 0);
    close(lfd);
    acc_arg aa = {fd[1], NULL};
    pthread_t thr;
    REQUIRE(pthread_create(&thr, NULL, acc_main, &aa) == 0);
    dp_auth_session s = {0};
    s.shm = 1;
    char why[200];
    dp_auth_io io = {0};
    REQUIRE(dp_shm_dial(fd[0], 0, 1, RING, &s, dp_now() + 3, d, why, sizeof why, &io, &err) == 0);
    pthread_join(thr, NULL);
    REQUIRE(*d && aa.link);
    *a = aa.link;
    CHECK(access(dp_shm_path(*d), F_OK) != 0); /* unlinked once both had it */
    CHECK(io.frames_sent == 1 && io.frames_recv == 1);
    close(fd[0]);
    close(fd[1]);
}

static int never_wait(void *ctx, int sending, dp_err *err)
{
    (void)ctx;
    (void)sending;
    return dp_errf(err, "would wait");
}

/* A header the peer wrote into the ring is decoded and bounded like one
 * from a socket: garbage and an oversized length are refused with the
 * reason, never trusted. */
static void garbage_headers(void)
{
    dp_shm *d, *a;
    link_pair(&d, &a);
    dp_shm_waiter w = {never_wait, NULL, NULL};
    dp_err err;
    dp_frame_header h;
    char why[200];
    uint8_t hb[DP_FRAME_HEADER_SIZE];
    CHECK(dp_shm_next(a, 1000, &h, why, sizeof why) == 0); /* nothing yet */
    memset(hb, 'x', sizeof hb);
    CHECK(dp_shm_send(d, hb, NULL, 0, 0, &w, &err) == 0);
    CHECK(dp_shm_next(a, 1000, &h, why, sizeof why) == -1);
    CHECKF(strstr(why, "bad magic") != NULL, "%s", why);
    dp_shm_close(a);
    dp_shm_close(d);

    link_pair(&d, &a);
    dp_frame_header big = {0};
    big.type = T_DATA;
    big.length = 5000;
    big.flags = 0;
    dp_frame_encode(hb, &big);
    static unsigned char pay[5000];
    struct iovec v = {pay, sizeof pay};
    CHECK(dp_shm_send(d, hb, &v, 1, sizeof pay, &w, &err) == 0);
    CHECK(dp_shm_next(a, 1000, &h, why, sizeof why) == -1);
    CHECKF(strstr(why, "exceeds the maximum") != NULL, "%s", why);
    dp_shm_close(a);
    dp_shm_close(d);

    /* and a frame that is fine goes through, byte for byte */
    link_pair(&d, &a);
    big.length = 7;
    dp_frame_encode(hb, &big);
    v.iov_len = 7;
    memcpy(pay, "payload", 7);
    CHECK(dp_shm_send(d, hb, &v, 1, 7, &w, &err) == 0);
    CHECK(dp_shm_next(a, 1000, &h, why, sizeof why) == 1 && h.length == 7);
    char got[8] = {0};
    CHECK(dp_shm_recv(a, got, 7, 0, &w, &err) == 0 && strcmp(got, "payload") == 0);
    CHECK(dp_shm_rx_ready(a) == 0); /* its padding went with it */
    dp_shm_close(a);
    dp_shm_close(d);
}

/* Rank 0 as a child: sends 3 frames, then dies mid-way through a big one. */
/* Two listeners on 127.0.0.1 and their addresses, for a pair of ranks in
 * two processes. */
static void listen_pair(int lfd[2], char addr[2][32])
{
    dp_err err;
    for (int i = 0; i < 2; i++) {
        int port;
        REQUIRE(dp_tcp_listen("127.0.0.1:0", 0, &lfd[i], &port, &err) == 0);
        snprintf(addr[i], 32, "127.0.0.1:%d", port);
    }
}

/* Rank `rank` of two, with shared memory, connected to the other; NULL on
 * failure. */
static dp_transport *open_rank(int rank, int lfd, const char **ap)
{
    dp_tcp_config cfg;
    dp_tcp_config_init(&cfg);
    cfg.rank = rank;
    cfg.n_ranks = 2;
    cfg.addrs = ap;
    cfg.secret = secret;
    cfg.secret_len = sizeof secret - 1;
    cfg.listen_fd = lfd;
    cfg.shm_ring_bytes = RING;
    dp_transport *t;
    dp_err err;
    if (dp_tcp_open(&cfg, &t, &err))
        return NULL;
    if (dp_transport_connect(t, 1 - rank, dp_now() + 5, &err)) {
        dp_transport_close(t);
        return NULL;
    }
    return t;
}

/* Forks a pair of ranks with shared memory: rank 0 in the child runs
 * child(t) (and exits), rank 1 is returned in *parent. */
static pid_t fork_pair(void (*child)(dp_transport *), dp_transport **parent)
{
    static char addr[2][32]; /* the transports keep the addresses */
    static const char *ap[2] = {addr[0], addr[1]};
    int lfd[2];
    listen_pair(lfd, addr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(lfd[1]);
        dp_transport *t = open_rank(0, lfd[0], ap);
        if (!t)
            _exit(2);
        child(t);
        _exit(5);
    }
    close(lfd[0]);
    *parent = open_rank(1, lfd[1], ap);
    REQUIRE(*parent);
    return pid;
}

/* Rank 0 of killed_midstream: four frames, then death. */
static void send_then_die(dp_transport *t)
{
    dp_err err;
    for (int i = 0; i < 3; i++)
        if (dp_transport_send(t, 1, T_DATA, (uint64_t)i, 0, "abcd", 4, &err))
            _exit(3);
    /* a larger one, then death: the ring holds all four */
    static unsigned char big[RING / 2];
    if (dp_transport_send(t, 1, T_DATA, 3, 0, big, sizeof big, &err))
        _exit(4);
    raise(SIGKILL);
}

static void killed_midstream(void)
{
    dp_err err;
    dp_transport *t;
    pid_t pid = fork_pair(send_then_die, &t);
    int st;
    waitpid(pid, &st, 0); /* dead before we read anything */
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    int frames = 0, lost = 0;
    for (int k = 0; k < 10 && !lost; k++) {
        dp_event ev;
        REQUIRE(dp_transport_poll(t, 0, 5, &ev, &err) == 0);
        if (ev.kind == DP_EVENT_FRAME) {
            CHECK(ev.header.step == (uint64_t)frames);
            CHECK(dp_transport_skip_payload(t, 0, &err) == 0);
            frames++;
        } else if (ev.kind == DP_EVENT_PEER_LOST) {
            lost = 1;
            CHECKF(!ev.orderly && strstr(ev.reason, "EOF"), "%s", ev.reason);
        }
    }
    CHECKF(frames == 4 && lost, "%d frames before the loss (4 sent), lost %d", frames, lost);
    dp_transport_close(t);
}

/* A receiver killed while it slept in poll: the sender's frames after its
 * death ring its doorbell, whose reader is gone.  The transport must never
 * get SIGPIPE (it would kill this process): the sends fail or land in the
 * dead ring, and the loss is reported. */
static void sleep_until_killed(dp_transport *t)
{
    dp_err err;
    dp_event ev;
    for (;;) /* asleep on its doorbell */
        (void)dp_transport_poll(t, 1, 60, &ev, &err);
}

static void receiver_killed_asleep(void)
{
    dp_err err;
    dp_transport *t;
    pid_t pid = fork_pair(sleep_until_killed, &t);
    struct timespec nap = {0, 200 * 1000 * 1000};
    nanosleep(&nap, NULL); /* the receiver is past its spin, asleep */
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    signal(SIGPIPE, SIG_DFL); /* as in the program: main() here ignores it */
    int lost = 0;
    for (int k = 0; k < 50 && !lost; k++) {
        (void)dp_transport_send(t, 0, T_DATA, (uint64_t)k, 0, "abcd", 4, &err);
        dp_event ev;
        REQUIRE(dp_transport_poll(t, 0, 0.05, &ev, &err) == 0);
        lost = ev.kind == DP_EVENT_PEER_LOST;
    }
    CHECKF(lost, "the killed receiver was never reported lost");
    dp_transport_close(t);
    signal(SIGPIPE, SIG_IGN);
}

/* Rank 1 sums with rank 0 over the ring: its half of the work in a thread. */
typedef struct ring_arg {
    dp_transport *t;
    float *buf;
    size_t len;
    int rc;
} ring_arg;

static void *ring_rank(void *p)
{
    ring_arg *a = p;
    dp_ring r;
    dp_err err;
    int ranks[2] = {0, 1};
    a->rc = dp_ring_init(&r, a->t, ranks, 2, 10, 16 << 10, &err); /* segments < the ring */
    for (int s = 1; s <= 3 && !a->rc; s++)
        a->rc = dp_ring_allreduce(&r, a->buf, a->len, (uint64_t)s, 0, &err);
    if (a->rc)
        fprintf(stderr, "ring: %s\n", err.msg);
    dp_ring_free(&r);
    return NULL;
}

static void ring_sum(int shm, float *out[2], size_t len)
{
    dp_transport *t[2];
    REQUIRE(open_pair(t, shm, secret) == 0);
    ring_arg a[2];
    pthread_t thr[2];
    for (int i = 0; i < 2; i++) {
        out[i] = malloc(len * sizeof(float));
        REQUIRE(out[i]);
        for (size_t k = 0; k < len; k++)
            out[i][k] = (float)((k * 2654435761u + (unsigned)i * 97) % 1000) * 1e-3f - 0.37f;
        a[i] = (ring_arg){t[i], out[i], len, 0};
        REQUIRE(pthread_create(&thr[i], NULL, ring_rank, &a[i]) == 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(thr[i], NULL);
        CHECK(a[i].rc == 0);
    }
    dp_transport_close(t[0]);
    dp_transport_close(t[1]);
}

/* n transports, each connected to every other. */
static void open_n(dp_transport **t, int n)
{
    int lfd[3], port[3];
    char addr[3][32];
    const char *ap[3] = {addr[0], addr[1], addr[2]};
    dp_err err;
    for (int i = 0; i < n; i++) {
        REQUIRE(dp_tcp_listen("127.0.0.1:0", 0, &lfd[i], &port[i], &err) == 0);
        snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", port[i]);
    }
    for (int i = 0; i < n; i++) {
        dp_tcp_config cfg;
        dp_tcp_config_init(&cfg);
        cfg.rank = i;
        cfg.n_ranks = n;
        cfg.addrs = ap;
        cfg.secret = secret;
        cfg.secret_len = sizeof secret - 1;
        cfg.listen_fd = lfd[i];
        cfg.shm_ring_bytes = RING;
        cfg.heartbeat_timeout = 3;
        REQUIRE(dp_tcp_open(&cfg, &t[i], &err) == 0);
    }
    for (int i = 0; i < n; i++) /* higher ranks dial lower ones' accepts */
        for (int j = n - 1; j >= 0; j--)
            if (j != i)
                REQUIRE(dp_transport_connect(t[i], j, dp_now() + 5, &err) == 0);
}

/* Each rank sends the next a frame of 16 rings before it reads the one from
 * the previous: in a pair (each sends the other) and around a cycle of 3.
 * Waiting for room, a task takes the bytes of peers that wait on it off
 * their rings (shm_relieve, dp_shm_drain), as TCP's socket buffers would
 * hold them; without that every rank waits for ever. */
#define CROSSED (16 * RING)
typedef struct crossed_arg {
    dp_transport *t;
    int me, n, rc;
} crossed_arg;

static void *crossed_rank(void *p)
{
    crossed_arg *a = p;
    int next = (a->me + 1) % a->n, prev = (a->me + a->n - 1) % a->n;
    unsigned char *out = malloc(CROSSED), *in = malloc(CROSSED), *want = malloc(CROSSED);
    dp_err err;
    dp_event ev;
    a->rc = -1;
    if (out && in && want) {
        fill(out, CROSSED, 40 + a->me);
        fill(want, CROSSED, 40 + prev);
        if (dp_transport_send(a->t, next, T_DATA, 7, 0, out, CROSSED, &err) == 0 &&
            dp_transport_recv(a->t, prev, "crossed frame", 10, &ev, &err) == 0 &&
            ev.header.length == CROSSED &&
            dp_transport_recv_payload(a->t, prev, in, CROSSED, &err) == 0)
            a->rc = memcmp(in, want, CROSSED) == 0 ? 0 : 1;
        else
            fprintf(stderr, "rank %d of %d: %s\n", a->me, a->n, err.msg);
    }
    free(out);
    free(in);
    free(want);
    return NULL;
}

static void crossed_sends(int n)
{
    dp_transport *t[3];
    open_n(t, n);
    alarm(60); /* a cycle that waits for ever fails the test, not the suite's clock */
    crossed_arg a[3];
    pthread_t thr[3];
    for (int i = 0; i < n; i++) {
        a[i] = (crossed_arg){t[i], i, n, -1};
        REQUIRE(pthread_create(&thr[i], NULL, crossed_rank, &a[i]) == 0);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(thr[i], NULL);
        CHECKF(a[i].rc == 0, "rank %d of %d: crossed frame %s", i, n,
               a[i].rc > 0 ? "differs" : "failed");
    }
    alarm(0);
    for (int i = 0; i < n; i++)
        dp_transport_close(t[i]);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (getenv("DOWNPOUR_SHM") && strcmp(getenv("DOWNPOUR_SHM"), "0") == 0)
        unsetenv("DOWNPOUR_SHM");
    char tag[16];
    snprintf(tag, sizeof tag, "%d", (int)getpid() % 100000000);
    dp_err e;
    REQUIRE(dp_hook_set("DOWNPOUR_TEST_SHM_TAG", tag, &e) == 0);
    snprintf(shm_prefix, sizeof shm_prefix, "downpour-%s-", tag);
    shm_snapshot();

    uint64_t on = exchange(1), off = exchange(0);
    CHECK(on == off);
    CHECK(shm_leaked() == 0); /* nothing left behind */

    /* A stranger (wrong secret) never gets past the handshake: no segment. */
    dp_transport *t[2];
    CHECK(open_pair(t, 1, wrong) != 0);
    int n, del;
    maps(&n, &del);
    CHECK(n == 0);
    dp_transport_close(t[0]);
    dp_transport_close(t[1]);
    CHECK(shm_leaked() == 0);

    garbage_headers();
    killed_midstream();
    receiver_killed_asleep();
    crossed_sends(2);
    crossed_sends(3);

    size_t len = SANITIZED ? 100003 : 1000003;
    float *a[2], *b[2];
    ring_sum(1, a, len);
    ring_sum(0, b, len);
    CHECK(memcmp(a[0], a[1], len * sizeof(float)) == 0);
    CHECK(memcmp(a[0], b[0], len * sizeof(float)) == 0);
    for (int i = 0; i < 2; i++) {
        free(a[i]);
        free(b[i]);
    }
    CHECK(shm_leaked() == 0);
    return CHECK_DONE();
}
