/* Ring all-reduce bus bandwidth over the TCP transport, beside raw loopback,
 * and over shared memory, beside its memory-bound figure.
 *
 * busbw = algbw * 2(n-1)/n, as nccl-tests defines it (algbw = bytes / time):
 * the rate each rank's link carries, comparable across rank counts.  The
 * TCP baseline is a plain TCP stream between two processes over loopback in
 * the same program (blocking sends of 1 MiB, reads of 8 KiB, no framing).
 *
 * Shared memory (2 ranks, 16 MiB; docs/transport.md, "Shared memory";
 * docs/benchmarks.md): the bound is the time two processes take, at once,
 * for exactly the copies the transport makes per rank, no more: for each
 * 256 KiB segment of its half (ring.c's ring_step: send a segment, then
 * receive one), reduce-scatter copies the segment into its ring and adds
 * the peer's segment out of the other ring; all-gather copies the sum in
 * and the peer's sum out.  Positions advance through the two 4 MiB rings
 * as the transport's do (header and padding included), and each copy stops
 * at the wrap and at 64 KiB, as shm.c's.  So the segments are read back
 * from where they were just written, warm in cache as the transport's are
 * (a bound that streamed whole 8 MiB halves through the ring read them from
 * memory and came out below the transport).  What the bound leaves out is
 * the transport's cost: waiting for the peer, frame headers, wake-ups.  The
 * bound runs the same passes as the transport (a warm-up, then --repeats),
 * per pass the slower process, the median; bound and transport alternate
 * for 5 rounds, each round printed, then the medians.
 *
 * --mode algos (docs/strategies.md, "allreduce: all-reduce algorithms"): the
 * ring against direct from 4 bytes to 1 MiB, over TCP and over shared
 * memory, at each --ranks; direct's figure beside its latency bound, 2 of
 * the ring's hops (the ring's time at 4 bytes over its 2(n-1) hops, x 2).
 *
 *   bench_allreduce [--ranks 2,4] [--max-bytes N] [--repeats N] [--mode all|shm|hosts|algos]
 * Targets: at 16 MiB, TCP busbw >= 80% of raw loopback (issue 5); shared
 * memory busbw >= 90% of its bound (issue 13). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* setns */
#endif
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "downpour/clock.h"
#include "downpour/ring.h"
#include "downpour/tcp.h"

#define MAX_RANKS 8
#define MAX_SIZES 32
#define MAX_REPEATS 21

static const unsigned char secret[32] = "bench_allreduce secret 32 bytes";
static dp_allreduce_algo g_algo = DP_ALGO_RING; /* the figures are the ring's but in --mode algos */

/* Two hosts of a virtual cluster (--mode hosts): network namespaces made
 * by scripts/netns.sh, rank i in ns[i] at addr[i].  NULL: loopback. */
typedef struct hosts {
    char ns[2][32], addr[2][32];
} hosts;

/* Moves this process (single-threaded) into network namespace name, or
 * back into the one open at *home (name NULL). */
static int enter_ns(const char *name, int home)
{
    char path[96];
    int fd = home;
    if (name) {
        snprintf(path, sizeof path, "/var/run/netns/%s", name);
        fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    int rc = fd >= 0 ? setns(fd, CLONE_NEWNET) : -1;
    if (name && fd >= 0)
        close(fd);
    return rc;
}

/* Raw stream: bytes per second of one TCP stream between two processes, on
 * loopback or from host 0 to host 1, read 8 KiB at a time (the fastest read
 * size here, and the transport's). */
#define RAW_READ (8 * 1024)
static double raw_stream(size_t total, const hosts *h)
{
    int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (h && (home < 0 || enter_ns(h->ns[0], -1) < 0))
        return 0;
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (h && inet_pton(AF_INET, h->addr[0], &a.sin_addr) != 1)
        ls = -1;
    socklen_t al = sizeof a;
    int bad = ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 1) < 0 ||
              getsockname(ls, (struct sockaddr *)&a, &al) < 0;
    if ((h && enter_ns(NULL, home) < 0) || bad)
        return 0;
    close(home);
    size_t chunk = 1u << 20;
    char *buf = calloc(1, chunk);
    pid_t pid = fork();
    if (pid == 0) {
        if (h && enter_ns(h->ns[1], -1) < 0)
            _exit(1);
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s, (struct sockaddr *)&a, sizeof a) < 0)
            _exit(1);
        for (size_t got = 0; got < total;) {
            ssize_t k = recv(s, buf, RAW_READ, 0);
            if (k <= 0)
                _exit(1);
            got += (size_t)k;
        }
        char ack = 1;
        _exit(send(s, &ack, 1, 0) == 1 ? 0 : 1);
    }
    int s = accept(ls, NULL, NULL);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    double t0 = dp_now();
    for (size_t sent = 0; sent < total;) {
        ssize_t k = send(s, buf, chunk, 0);
        if (k <= 0)
            break;
        sent += (size_t)k;
    }
    char ack;
    ssize_t r = recv(s, &ack, 1, 0);
    double secs = dp_now() - t0;
    int st;
    waitpid(pid, &st, 0);
    close(s);
    close(ls);
    free(buf);
    return r == 1 ? (double)total / secs : 0;
}

static double raw_loopback(size_t total) { return raw_stream(total, NULL); }

/* One rank: all-reduces each size `repeats` times; rank 0 writes medians to out_fd. */
static int rank_main(int n, int me, const int *fds, char addrs[][32], const size_t *sizes,
                     int n_sizes, int repeats, int shm, int out_fd)
{
    const char *ap[MAX_RANKS];
    int ranks[MAX_RANKS];
    for (int i = 0; i < n; i++) {
        ap[i] = addrs[i];
        ranks[i] = i;
    }
    dp_tcp_config cfg;
    dp_tcp_config_init(&cfg);
    cfg.rank = me;
    cfg.n_ranks = n;
    cfg.addrs = ap;
    cfg.secret = secret;
    cfg.secret_len = sizeof secret;
    cfg.listen_fd = fds[me];
    cfg.shm = shm;
    dp_err err;
    dp_transport *t;
    dp_ring ring;
    float *buf = malloc(sizes[n_sizes - 1]);
    if (!buf || dp_tcp_open(&cfg, &t, &err) < 0 ||
        dp_transport_connect_all(t, dp_now() + 30, &err) < 0 ||
        dp_ring_init(&ring, t, ranks, n, 60, 0, &err) < 0) {
        fprintf(stderr, "rank %d: %s\n", me, err.msg);
        return 1;
    }
    dp_ring_set_algo(&ring, g_algo);
    memset(buf, 0, sizes[n_sizes - 1]);
    uint64_t step = 0;
    for (int s = 0; s < n_sizes; s++) {
        size_t len = sizes[s] / sizeof(float);
        double times[MAX_REPEATS];
        for (int r = -1; r < repeats; r++) { /* -1 warms up */
            double t0 = dp_now();
            if (dp_ring_allreduce(&ring, buf, len, ++step, 0, &err) < 0) {
                fprintf(stderr, "rank %d: %s\n", me, err.msg);
                return 1;
            }
            if (r >= 0)
                times[r] = dp_now() - t0;
        }
        qsort(times, (size_t)repeats, sizeof *times, bench_cmp_double);
        double med = times[repeats / 2];
        if (me == 0 && write(out_fd, &med, sizeof med) != sizeof med)
            return 1;
    }
    dp_ring_free(&ring);
    dp_transport_close(t);
    free(buf);
    return 0;
}

/* n ranks on loopback, or (h) 2 ranks each in its host; rank 0 reports
 * the median time of each size into med. */
static int run_ranks_on(int n, const size_t *sizes, int n_sizes, int repeats, int shm, double *med,
                        const hosts *h)
{
    int fds[MAX_RANKS], pipes[2];
    char addrs[MAX_RANKS][32];
    dp_err err;
    int home = h ? open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC) : -1;
    if (h && home < 0)
        return -1;
    for (int i = 0; i < n; i++) {
        int port, rc;
        char at[48];
        snprintf(at, sizeof at, "%s:0", h ? h->addr[i] : "127.0.0.1");
        if (h && enter_ns(h->ns[i], -1) < 0) { /* the listener lives in its host */
            fprintf(stderr, "bench_allreduce: cannot enter %s\n", h->ns[i]);
            return -1;
        }
        rc = dp_tcp_listen(at, 0, &fds[i], &port, &err);
        if (h && enter_ns(NULL, home) < 0)
            return -1;
        if (rc < 0) {
            fprintf(stderr, "bench_allreduce: %s\n", err.msg);
            return -1;
        }
        snprintf(addrs[i], sizeof addrs[i], "%s:%d", h ? h->addr[i] : "127.0.0.1", port);
    }
    if (h)
        close(home);
    if (pipe(pipes) < 0)
        return -1;
    pid_t pids[MAX_RANKS];
    for (int i = 0; i < n; i++)
        if ((pids[i] = fork()) == 0) {
            if (h && enter_ns(h->ns[i], -1) < 0) /* its dials leave from its host */
                _exit(1);
            _exit(rank_main(n, i, fds, addrs, sizes, n_sizes, repeats, shm, pipes[1]));
        }
    for (int i = 0; i < n; i++)
        close(fds[i]);
    close(pipes[1]);
    int got = 0;
    while (got < n_sizes && read(pipes[0], &med[got], sizeof *med) == sizeof *med)
        got++;
    close(pipes[0]);
    int ok = 1;
    for (int i = 0; i < n; i++) {
        int st;
        waitpid(pids[i], &st, 0);
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    return ok && got == n_sizes ? 0 : -1;
}

static int run_ranks(int n, const size_t *sizes, int n_sizes, int repeats, int shm, double *med)
{
    return run_ranks_on(n, sizes, n_sizes, repeats, shm, med, NULL);
}

#define SHM_BYTES ((size_t)16 << 20)
#define SHM_RING ((size_t)4 << 20) /* the transport's default ring */
#define SHM_PIECE ((size_t)64 << 10) /* shm.c copies and publishes at most this at once */
#define SHM_FRAME ((size_t)48)       /* a frame header, before each segment */

/* One segment through a ring, as shm.c moves it: into the ring at *pos (in),
 * or out of it (out: copied, or added to dst), in pieces that stop at the
 * wrap and at SHM_PIECE; *pos then moves past the segment, its header and
 * its padding, as the ring's write and read positions do. */
static void seg_through(float *seg, uint8_t *ring, size_t *pos, size_t n, int in, int add)
{
    uint8_t *p = (uint8_t *)seg;
    size_t at = (*pos + SHM_FRAME) & (SHM_RING - 1);
    for (size_t left = n; left;) {
        size_t k = left < SHM_RING - at ? left : SHM_RING - at;
        if (k > SHM_PIECE)
            k = SHM_PIECE;
        if (in) {
            memcpy(ring + at, p, k);
        } else if (add) {
            float *d = (float *)(void *)p;
            for (size_t j = 0; j < k / sizeof(float); j++) {
                float v;
                memcpy(&v, ring + at + 4 * j, sizeof v);
                d[j] += v;
            }
        } else {
            memcpy(p, ring + at, k);
        }
        p += k;
        left -= k;
        at = (at + k) & (SHM_RING - 1);
    }
    *pos = (*pos + ((SHM_FRAME + n + 7) & ~(size_t)7)) & (SHM_RING - 1);
}

/* The copies of one 2-rank all-reduce of SHM_BYTES at rank r (ring.c's
 * ring_step: each segment sent, then the peer's received), segments of
 * DP_RING_SEGMENT_BYTES: reduce-scatter sends my half and adds the peer's,
 * all-gather sends the sum and copies the peer's out. */
static void bound_pass(float *buf, uint8_t *tx, uint8_t *rx, int r, size_t *tpos, size_t *rpos)
{
    size_t half = SHM_BYTES / 2 / sizeof(float), seg = DP_RING_SEGMENT_BYTES / sizeof(float);
    float *mine = buf + (size_t)r * half, *other = buf + (size_t)(1 - r) * half;
    for (int phase = 0; phase < 2; phase++) {
        float *out = phase == 0 ? mine : other, *in = phase == 0 ? other : mine;
        for (size_t i = 0; i < half; i += seg) {
            size_t k = half - i < seg ? half - i : seg;
            seg_through(out + i, tx, tpos, k * sizeof(float), 1, 0);
            seg_through(in + i, rx, rpos, k * sizeof(float), 0, phase == 0);
        }
    }
}

/* The memory-bound time of a 2-rank all-reduce of SHM_BYTES: two processes
 * at once, each doing its rank's copies through the two rings as the
 * transport does (see the top), but with no waiting, framing or wake-ups;
 * one warm-up pass, then `passes` timed; per pass the slower rank's time,
 * the median over the passes. */
static double shm_bound(uint8_t *rings, int passes)
{
    int pp[2], go[2];
    if (pipe(pp) < 0 || pipe(go) < 0)
        return 0;
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        if ((pid[r] = fork()) == 0) {
            float *buf = malloc(SHM_BYTES);
            double t[MAX_REPEATS];
            size_t tpos = 0, rpos = 0;
            if (!buf)
                _exit(1);
            memset(buf, 0, SHM_BYTES);
            char c;
            if (read(go[0], &c, 1) != 1)
                _exit(1);
            for (int k = -1; k < passes; k++) { /* -1 maps the rings' pages */
                double t0 = dp_now();
                bound_pass(buf, rings + (size_t)r * SHM_RING, rings + (size_t)(1 - r) * SHM_RING,
                           r, &tpos, &rpos);
                if (k >= 0)
                    t[k] = dp_now() - t0;
            }
            ssize_t w = write(pp[1], t, (size_t)passes * sizeof *t);
            _exit(w == (ssize_t)((size_t)passes * sizeof *t) ? 0 : 1);
        }
    }
    usleep(20000); /* both are ready and waiting */
    if (write(go[1], "gg", 2) != 2)
        return 0;
    double worst[MAX_REPEATS] = {0}, t[MAX_REPEATS];
    int ok = 1;
    for (int r = 0; r < 2; r++) {
        size_t want = (size_t)passes * sizeof *t;
        ok &= read(pp[0], t, want) == (ssize_t)want;
        for (int k = 0; ok && k < passes; k++)
            worst[k] = t[k] > worst[k] ? t[k] : worst[k];
    }
    for (int r = 0; r < 2; r++)
        waitpid(pid[r], NULL, 0);
    close(pp[0]);
    close(pp[1]);
    close(go[0]);
    close(go[1]);
    qsort(worst, (size_t)passes, sizeof *worst, bench_cmp_double);
    return ok ? worst[passes / 2] : 0;
}

/* 2 ranks at 16 MiB over shared memory against the bound, alternating. */
static int shm_study(int repeats)
{
    enum { ROUNDS = 5 };
    uint8_t *rings = mmap(NULL, 2 * SHM_RING, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rings == MAP_FAILED)
        return -1;
    memset(rings, 0, 2 * SHM_RING);
    double tb[ROUNDS], ts[ROUNDS];
    size_t size = SHM_BYTES;
    printf("\nshared memory, 2 ranks, 16 MiB, %u KiB segments through %zu KiB rings "
           "(%d rounds, alternating):\n", DP_RING_SEGMENT_BYTES >> 10, SHM_RING >> 10, ROUNDS);
    printf("        %5s %12s %12s %9s\n", "round", "busbw_MB/s", "bound_MB/s", "fraction");
    fflush(stdout);
    for (int k = 0; k < ROUNDS; k++) {
        tb[k] = shm_bound(rings, repeats);
        if (!(tb[k] > 0) || run_ranks(2, &size, 1, repeats, 1, &ts[k]) < 0)
            return -1;
        printf("        %5d %12.0f %12.0f %9.2f\n", k + 1, SHM_BYTES / ts[k] / 1e6,
               SHM_BYTES / tb[k] / 1e6, tb[k] / ts[k]);
        fflush(stdout); /* before the next round's forks */
    }
    munmap(rings, 2 * SHM_RING);
    qsort(tb, ROUNDS, sizeof *tb, bench_cmp_double);
    qsort(ts, ROUNDS, sizeof *ts, bench_cmp_double);
    double bus = (double)SHM_BYTES / ts[ROUNDS / 2], bound = (double)SHM_BYTES / tb[ROUNDS / 2];
    printf("        median: busbw %.0f MB/s, bound %.0f MB/s: %.2f of the bound "
           "(target >= 0.90)\n", bus / 1e6, bound / 1e6, bus / bound);
    return 0;
}

#define NETNS_SH DP_SOURCE_DIR "/scripts/netns.sh"
#define HOSTS_RAW ((size_t)256 << 20) /* bytes of each raw stream */

static char g_prefix[16]; /* the hosts' netns.sh prefix, once up */

static void hosts_down(void)
{
    char cmd[256];
    if (!g_prefix[0])
        return;
    snprintf(cmd, sizeof cmd, "'%s' down %s >/dev/null 2>&1", NETNS_SH, g_prefix);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_allreduce: netns.sh down %s failed\n", g_prefix);
    g_prefix[0] = '\0';
}

/* `netns.sh up PREFIX 2` and the hosts' names and addresses; 1 (with why)
 * when this machine cannot make them. */
static int hosts_up(hosts *h, char *why, size_t cap)
{
    char cmd[256], owner[32];
    if (geteuid() != 0) {
        snprintf(why, cap, "not root");
        return 1;
    }
    if (system("command -v ip >/dev/null 2>&1") != 0 || access(NETNS_SH, X_OK) != 0) {
        snprintf(why, cap, "no 'ip' (iproute2) or no %s", NETNS_SH);
        return 1;
    }
    snprintf(owner, sizeof owner, "%ld", (long)getpid());
    setenv("NETNS_OWNER", owner, 1); /* the prefix is ours while we live */
    snprintf(g_prefix, sizeof g_prefix, "ba%ld", (long)(getpid() % 10000000));
    snprintf(cmd, sizeof cmd, "'%s' up %s 2 >/dev/null 2>&1", NETNS_SH, g_prefix);
    if (system(cmd) != 0) {
        hosts_down();
        snprintf(why, cap, "netns.sh up failed (no network namespaces here?)");
        return 1;
    }
    for (int i = 0; i < 2; i++) {
        snprintf(h->ns[i], sizeof h->ns[i], "%s-%d", g_prefix, i + 1);
        snprintf(cmd, sizeof cmd, "'%s' addr %s %d", NETNS_SH, g_prefix, i + 1);
        FILE *p = popen(cmd, "r");
        int ok = p && fgets(h->addr[i], sizeof h->addr[i], p) != NULL;
        if (p)
            pclose(p);
        h->addr[i][strcspn(h->addr[i], "\n")] = '\0';
        if (!ok || !h->addr[i][0]) {
            hosts_down();
            snprintf(why, cap, "netns.sh addr gave no address for host %d", i + 1);
            return 1;
        }
    }
    return 0;
}

/* The 2-rank ring at 16 MiB over TCP between two namespace hosts, beside a
 * raw TCP stream between the same two, alternating. */
static int hosts_study(int repeats)
{
    enum { ROUNDS = 5 };
    hosts h;
    char why[200];
    int rc = hosts_up(&h, why, sizeof why);
    if (rc) {
        printf("ring over TCP across hosts: skipped: needs root and ip netns (%s)\n", why);
        return 0;
    }
    double raw[ROUNDS], ring[ROUNDS];
    size_t size = SHM_BYTES;
    printf("ring over TCP across hosts: 2 ranks, 16 MiB, hosts %s (%s) and %s (%s), "
           "%d rounds alternating with a raw stream of %zu MiB:\n",
           h.ns[0], h.addr[0], h.ns[1], h.addr[1], ROUNDS, HOSTS_RAW >> 20);
    printf("        %5s %12s %12s %9s\n", "round", "busbw_MB/s", "raw_MB/s", "fraction");
    fflush(stdout);
    for (int k = 0; k < ROUNDS && rc == 0; k++) {
        raw[k] = raw_stream(HOSTS_RAW, &h);
        /* shared memory off: the hosts are other namespaces, which it
         * declines anyway (docs/transport.md); this keeps the figure TCP's */
        if (!(raw[k] > 0) || run_ranks_on(2, &size, 1, repeats, 0, &ring[k], &h) < 0) {
            rc = -1;
            break;
        }
        ring[k] = (double)size / ring[k]; /* 2 ranks: busbw = algbw */
        printf("        %5d %12.0f %12.0f %9.2f\n", k + 1, ring[k] / 1e6, raw[k] / 1e6,
               ring[k] / raw[k]);
        fflush(stdout);
    }
    hosts_down();
    if (rc)
        return -1;
    qsort(raw, ROUNDS, sizeof *raw, bench_cmp_double);
    qsort(ring, ROUNDS, sizeof *ring, bench_cmp_double);
    printf("        median: busbw %.0f MB/s, raw %.0f MB/s: %.2f of raw (target >= 0.80)\n",
           ring[ROUNDS / 2] / 1e6, raw[ROUNDS / 2] / 1e6, ring[ROUNDS / 2] / raw[ROUNDS / 2]);
    return 0;
}

static int algos_study(const int *rank_list, int n_rank_list, int repeats)
{
    size_t sizes[MAX_SIZES];
    int n_sizes = 0;
    for (size_t s = 4; s <= (1u << 20) && n_sizes < MAX_SIZES; s *= 4)
        sizes[n_sizes++] = s;
    for (int shm = 0; shm < 2; shm++)
        for (int k = 0; k < n_rank_list; k++) {
            int n = rank_list[k];
            if (n < 2 || n > MAX_RANKS)
                continue;
            double med[2][MAX_SIZES];
            for (int a = 0; a < 2; a++) {
                g_algo = a ? DP_ALGO_DIRECT : DP_ALGO_RING;
                if (run_ranks(n, sizes, n_sizes, repeats, shm, med[a]) < 0)
                    return -1;
            }
            double hop = med[0][0] / (2.0 * (n - 1));
            printf("\n%d ranks, %s: %10s %10s %10s %8s %14s\n", n, shm ? "shared memory" : "TCP",
                   "bytes", "ring_us", "direct_us", "dir/ring", "2-hop_bound_us");
            for (int s = 0; s < n_sizes; s++)
                printf("        %24zu %10.1f %10.1f %8.2f %14.1f\n", sizes[s], med[0][s] * 1e6,
                       med[1][s] * 1e6, med[1][s] / med[0][s], 2 * hop * 1e6);
        }
    g_algo = DP_ALGO_RING;
    return 0;
}

int main(int argc, char **argv)
{
    int rank_list[4] = {2, 4}, n_rank_list = 2, repeats = 7;
    size_t max_bytes = 64u << 20;
    const char *mode = "all";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--ranks") == 0) {
            n_rank_list = 0;
            for (char *p = argv[i + 1]; *p && n_rank_list < 4;) {
                rank_list[n_rank_list++] = (int)strtol(p, &p, 10);
                if (*p == ',')
                    p++;
            }
        } else if (strcmp(argv[i], "--max-bytes") == 0) {
            max_bytes = (size_t)strtoull(argv[i + 1], NULL, 10);
        } else if (strcmp(argv[i], "--repeats") == 0) {
            repeats = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--mode") == 0) {
            mode = argv[i + 1];
        }
    }
    int all = strcmp(mode, "all") == 0;
    if (repeats < 1 || repeats > MAX_REPEATS || max_bytes < 4096 ||
        (!all && strcmp(mode, "shm") != 0 && strcmp(mode, "hosts") != 0 &&
         strcmp(mode, "algos") != 0)) {
        fprintf(stderr, "usage: bench_allreduce [--ranks 2,4] [--max-bytes N>=4096] "
                        "[--repeats 1..%d] [--mode all|shm|hosts|algos]\n", MAX_REPEATS);
        return 2;
    }
    if (strcmp(mode, "algos") == 0)
        return algos_study(rank_list, n_rank_list, repeats) < 0 ? 1 : 0;
    if (strcmp(mode, "shm") == 0)
        return shm_study(repeats) < 0 ? 1 : 0;
    if (strcmp(mode, "hosts") == 0) {
        if (hosts_study(repeats) < 0) {
            fprintf(stderr, "bench_allreduce: the run across hosts failed\n");
            return 1;
        }
        return 0;
    }
    size_t sizes[MAX_SIZES];
    int n_sizes = 0;
    for (size_t s = 4096; s <= max_bytes && n_sizes < MAX_SIZES; s *= 4)
        sizes[n_sizes++] = s;

    double raws[5];
    for (int i = 0; i < 5; i++)
        raws[i] = raw_loopback((size_t)1 << 30);
    qsort(raws, 5, sizeof *raws, bench_cmp_double);
    double raw = raws[2];
    printf("raw loopback TCP stream: %.0f MB/s (median of 5 x 1 GiB)\n", raw / 1e6);
    int status = 0;
    for (int k = 0; k < n_rank_list; k++) {
        int n = rank_list[k];
        if (n < 2 || n > MAX_RANKS)
            continue;
        double med[MAX_SIZES];
        if (run_ranks(n, sizes, n_sizes, repeats, 0, med) < 0) {
            fprintf(stderr, "bench_allreduce: the %d-rank run failed\n", n);
            return 1;
        }
        printf("\n%d ranks (TCP) %12s %12s %12s %10s\n", n, "bytes", "time_us", "algbw_MB/s", "busbw_MB/s");
        for (int s = 0; s < n_sizes; s++) {
            double alg = (double)sizes[s] / med[s], bus = alg * 2 * (n - 1) / n;
            printf("        %12zu %12.1f %12.0f %10.0f%s\n", sizes[s], med[s] * 1e6, alg / 1e6,
                   bus / 1e6, sizes[s] == (16u << 20) ? "  <- 16 MiB" : "");
            if (sizes[s] == (16u << 20)) {
                printf("        16 MiB busbw is %.1f%% of raw loopback (target >= 80%%)\n", 100 * bus / raw);
                status |= bus < 0.8 * raw;
            }
        }
    }
    if (shm_study(repeats) < 0) {
        fprintf(stderr, "bench_allreduce: the shared-memory run failed\n");
        return 1;
    }
    printf("\n");
    if (hosts_study(repeats) < 0) {
        fprintf(stderr, "bench_allreduce: the run across hosts failed\n");
        return 1;
    }
    return 0;
}
