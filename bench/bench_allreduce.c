/* Ring all-reduce bus bandwidth over the TCP transport, beside raw loopback,
 * and over shared memory, beside its memory-bound figure.
 *
 * busbw = algbw * 2(n-1)/n, as nccl-tests defines it (algbw = bytes / time):
 * the rate each rank's link carries, comparable across rank counts.  The
 * TCP baseline is a plain TCP stream between two processes over loopback in
 * the same program (blocking sends of 1 MiB, reads of 8 KiB, no framing).
 *
 * Shared memory (2 ranks, 16 MiB; docs/transport.md, "Shared memory"): the
 * bound is the time two processes take, at once, for the memory traffic the
 * algorithm needs per rank: reduce-scatter, a copy of half the buffer into
 * the ring (4 MiB, wrapping) and an add of half from the other ring; then
 * all-gather, a copy of half into the ring and a copy of half out of the
 * other.  No synchronisation, no framing: what the copies cost alone.  The
 * bound and the transport alternate, medians of each.
 *
 *   bench_allreduce [--ranks 2,4] [--max-bytes N] [--repeats N]
 * Targets: at 16 MiB, TCP busbw >= 80% of raw loopback (issue 5); shared
 * memory busbw >= 90% of its bound (issue 13). */
#include <netinet/in.h>
#include <netinet/tcp.h>
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

/* Raw loopback: bytes per second of one TCP stream between two processes,
 * read 8 KiB at a time (the fastest read size here, and the transport's). */
#define RAW_READ (8 * 1024)
static double raw_loopback(size_t total)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 1) < 0 ||
        getsockname(ls, (struct sockaddr *)&a, &al) < 0)
        return 0;
    size_t chunk = 1u << 20;
    char *buf = calloc(1, chunk);
    pid_t pid = fork();
    if (pid == 0) {
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

static int run_ranks(int n, const size_t *sizes, int n_sizes, int repeats, int shm, double *med)
{
    int fds[MAX_RANKS], pipes[2];
    char addrs[MAX_RANKS][32];
    dp_err err;
    for (int i = 0; i < n; i++) {
        int port;
        if (dp_tcp_listen("127.0.0.1:0", 0, &fds[i], &port, &err) < 0) {
            fprintf(stderr, "bench_allreduce: %s\n", err.msg);
            return -1;
        }
        snprintf(addrs[i], sizeof addrs[i], "127.0.0.1:%d", port);
    }
    if (pipe(pipes) < 0)
        return -1;
    pid_t pids[MAX_RANKS];
    for (int i = 0; i < n; i++)
        if ((pids[i] = fork()) == 0)
            _exit(rank_main(n, i, fds, addrs, sizes, n_sizes, repeats, shm, pipes[1]));
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

#define SHM_BYTES ((size_t)16 << 20)
#define SHM_RING ((size_t)4 << 20) /* the transport's default ring */

/* Copies n bytes into (out 0) or out of (out 1) a ring of SHM_RING bytes,
 * or adds them from it (add), wrapping as the transport does. */
static void ring_traffic(float *buf, float *ring, size_t n, int out, int add)
{
    size_t rf = SHM_RING / sizeof(float);
    for (size_t at = 0; at < n / sizeof(float);) {
        size_t k = n / sizeof(float) - at < rf ? n / sizeof(float) - at : rf;
        if (add) {
            for (size_t j = 0; j < k; j++)
                buf[at + j] += ring[j];
        } else if (out) {
            memcpy(buf + at, ring, k * sizeof(float));
        } else {
            memcpy(ring, buf + at, k * sizeof(float));
        }
        at += k;
    }
}

/* The memory-bound time of a 2-rank all-reduce of SHM_BYTES: two processes
 * at once, each doing its rank's copies and add (see the top). */
static double shm_bound(float *rings)
{
    int pp[2], go[2];
    if (pipe(pp) < 0 || pipe(go) < 0)
        return 0;
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        if ((pid[r] = fork()) == 0) {
            float *buf = malloc(SHM_BYTES), *tx = rings + r * (SHM_RING / sizeof(float)),
                  *rx = rings + (1 - r) * (SHM_RING / sizeof(float));
            if (!buf)
                _exit(1);
            memset(buf, 0, SHM_BYTES);
            size_t half = SHM_BYTES / 2;
            float *mine = buf + r * (half / sizeof(float)), *other = buf + (1 - r) * (half / sizeof(float));
            char c;
            if (read(go[0], &c, 1) != 1)
                _exit(1);
            double t = 0;
            for (int pass = 0; pass < 2; pass++) { /* the first maps the rings' pages */
                double t0 = dp_now();
                ring_traffic(mine, tx, half, 0, 0);  /* reduce-scatter: send my half */
                ring_traffic(other, rx, half, 0, 1); /* add the peer's */
                ring_traffic(other, tx, half, 0, 0); /* all-gather: send the sum */
                ring_traffic(mine, rx, half, 1, 0);  /* copy the peer's sum out */
                t = dp_now() - t0;
            }
            _exit(write(pp[1], &t, sizeof t) == sizeof t ? 0 : 1);
        }
    }
    usleep(20000); /* both are ready and waiting */
    if (write(go[1], "gg", 2) != 2)
        return 0;
    double worst = 0;
    for (int r = 0; r < 2; r++) {
        double t;
        if (read(pp[0], &t, sizeof t) == sizeof t && t > worst)
            worst = t;
        waitpid(pid[r], NULL, 0);
    }
    close(pp[0]);
    close(pp[1]);
    close(go[0]);
    close(go[1]);
    return worst;
}

/* 2 ranks at 16 MiB over shared memory against the bound, alternating. */
static int shm_study(int repeats)
{
    enum { ROUNDS = 5 };
    float *rings = mmap(NULL, 2 * SHM_RING, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                        -1, 0);
    if (rings == MAP_FAILED)
        return -1;
    memset(rings, 0, 2 * SHM_RING);
    double tb[ROUNDS], ts[ROUNDS];
    size_t size = SHM_BYTES;
    for (int k = 0; k < ROUNDS; k++) {
        tb[k] = shm_bound(rings);
        if (!(tb[k] > 0) || run_ranks(2, &size, 1, repeats, 1, &ts[k]) < 0)
            return -1;
    }
    munmap(rings, 2 * SHM_RING);
    qsort(tb, ROUNDS, sizeof *tb, bench_cmp_double);
    qsort(ts, ROUNDS, sizeof *ts, bench_cmp_double);
    double bus = (double)SHM_BYTES / ts[ROUNDS / 2], bound = (double)SHM_BYTES / tb[ROUNDS / 2];
    printf("\nshared memory, 2 ranks, 16 MiB (medians of %d rounds, alternating):\n", ROUNDS);
    printf("        busbw %.0f MB/s, memory bound %.0f MB/s (copies in, add, copy out): "
           "%.2f of the bound (target >= 0.90)\n",
           bus / 1e6, bound / 1e6, bus / bound);
    return 0;
}

int main(int argc, char **argv)
{
    int rank_list[4] = {2, 4}, n_rank_list = 2, repeats = 7;
    size_t max_bytes = 64u << 20;
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
        }
    }
    if (repeats < 1 || repeats > MAX_REPEATS || max_bytes < 4096) {
        fprintf(stderr, "usage: bench_allreduce [--ranks 2,4] [--max-bytes N>=4096] [--repeats 1..%d]\n",
                MAX_REPEATS);
        return 2;
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
    return 0;
}
