/* Ring all-reduce bus bandwidth over the TCP transport, beside raw loopback.
 *
 * busbw = algbw * 2(n-1)/n, as nccl-tests defines it (algbw = bytes / time):
 * the rate each rank's link carries, comparable across rank counts.  The
 * baseline is a plain TCP stream between two processes over loopback in the
 * same program (blocking sends of 1 MiB, reads of 8 KiB, no framing).
 *
 *   bench_allreduce [--ranks 2,4] [--max-bytes N] [--repeats N]
 * Target (issue 5): at 16 MiB, busbw >= 80% of raw loopback. */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
                     int n_sizes, int repeats, int out_fd)
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

static int run_ranks(int n, const size_t *sizes, int n_sizes, int repeats, double *med)
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
            _exit(rank_main(n, i, fds, addrs, sizes, n_sizes, repeats, pipes[1]));
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
        if (run_ranks(n, sizes, n_sizes, repeats, med) < 0) {
            fprintf(stderr, "bench_allreduce: the %d-rank run failed\n", n);
            return 1;
        }
        printf("\n%d ranks %12s %12s %12s %10s\n", n, "bytes", "time_us", "algbw_MB/s", "busbw_MB/s");
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
    return 0;
}
