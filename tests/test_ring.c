/* Ring all-reduce on loopback: correct sums for 1, 2, 3 and 5 ranks and for
 * buffer lengths that do not divide by the rank count (including shorter
 * than it), across segment boundaries; every rank ends bitwise identical.
 * The other algorithms (direct, hier, auto: ring.h) over TCP and shared
 * memory too, larger than the socket buffers included (no deadlock). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/ring.h"
#include "downpour/tcp.h"

#define MAX_RANKS 5

static const unsigned char secret[32] = "ring test secret, 32 bytes long";

/* Rank r's contribution to element i: small integers, so every sum is exact. */
static float value(int r, size_t i) { return (float)((i * 7 + (size_t)r * 13) % 101) - 50.0f; }

static int child(int n, int me, const int *fds, char addrs[][32], size_t len, size_t seg_bytes,
                 dp_allreduce_algo algo, int out_fd)
{
    const char *addr_p[MAX_RANKS];
    for (int i = 0; i < n; i++)
        addr_p[i] = addrs[i];
    dp_tcp_config cfg;
    dp_tcp_config_init(&cfg);
    cfg.rank = me;
    cfg.n_ranks = n;
    cfg.addrs = addr_p;
    cfg.secret = secret;
    cfg.secret_len = sizeof secret;
    cfg.listen_fd = fds[me];
    dp_err err;
    dp_transport *t;
    dp_ring ring;
    int ranks[MAX_RANKS];
    for (int i = 0; i < n; i++)
        ranks[i] = (i + 1) % n; /* ring order need not be rank order */
    float *buf = malloc((len ? len : 1) * sizeof *buf);
    if (!buf || dp_tcp_open(&cfg, &t, &err) < 0 || dp_transport_connect_all(t, dp_now() + 20, &err) < 0 ||
        dp_ring_init(&ring, t, ranks, n, 20, seg_bytes, &err) < 0) {
        fprintf(stderr, "rank %d: %s\n", me, err.msg);
        return 1;
    }
    dp_ring_set_algo(&ring, algo);
    int bad = 0;
    for (int round = 0; round < 2; round++) {
        for (size_t i = 0; i < len; i++)
            buf[i] = value(me, i) * (float)(round + 1);
        if (dp_ring_allreduce(&ring, buf, len, (uint64_t)round + 1, 0, &err) < 0) {
            fprintf(stderr, "rank %d: %s\n", me, err.msg);
            return 1;
        }
        for (size_t i = 0; i < len; i++) {
            float want = 0;
            for (int r = 0; r < n; r++)
                want += value(r, i) * (float)(round + 1);
            if (buf[i] != want && bad++ < 3)
                fprintf(stderr, "rank %d, n %d, len %zu: element %zu is %g, expected %g\n", me, n,
                        len, i, (double)buf[i], (double)want);
        }
    }
    /* Report a checksum of the result so the parent can compare replicas. */
    uint32_t crc = dp_crc32c(0, buf, len * sizeof *buf);
    if (write(out_fd, &crc, sizeof crc) != sizeof crc)
        bad++;
    dp_ring_free(&ring);
    dp_transport_close(t);
    free(buf);
    return bad != 0;
}

static void run_algo(int n, size_t len, size_t seg_bytes, dp_allreduce_algo algo)
{
    int fds[MAX_RANKS], pipes[2];
    char addrs[MAX_RANKS][32];
    dp_err err;
    for (int i = 0; i < n; i++) {
        int port;
        REQUIRE(dp_tcp_listen("127.0.0.1:0", 0, &fds[i], &port, &err) == 0);
        snprintf(addrs[i], sizeof addrs[i], "127.0.0.1:%d", port);
    }
    REQUIRE(pipe(pipes) == 0);
    pid_t pids[MAX_RANKS];
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        REQUIRE(pids[i] >= 0);
        if (pids[i] == 0) {
            alarm(60); /* a hang is a failure, never a stuck CI */
            _exit(child(n, i, fds, addrs, len, seg_bytes, algo, pipes[1]));
        }
    }
    for (int i = 0; i < n; i++)
        close(fds[i]);
    close(pipes[1]);
    uint32_t first = 0, crc;
    int got = 0, same = 1;
    while (read(pipes[0], &crc, sizeof crc) == sizeof crc) {
        if (got++ == 0)
            first = crc;
        same &= crc == first;
    }
    close(pipes[0]);
    for (int i = 0; i < n; i++) {
        int st;
        REQUIRE(waitpid(pids[i], &st, 0) == pids[i]);
        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s, n %d, len %zu: rank %d failed",
               dp_allreduce_algo_name(algo), n, len, i);
    }
    CHECKF(got == n && same, "%s, n %d, len %zu: replicas differ (%d reported)",
           dp_allreduce_algo_name(algo), n, len, got);
}

static void run(int n, size_t len, size_t seg_bytes) { run_algo(n, len, seg_bytes, DP_ALGO_RING); }

int main(void)
{
    const int sizes[] = {1, 2, 3, 5};
    const size_t lens[] = {1, 4, 7, 1000, 100003};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 5; b++)
            run(sizes[a], lens[b], 1024); /* 256-float segments: many per chunk */
    run(3, 266610, 0);                    /* mlp-300-100's gradient, default segments */
    run(2, 4u << 20, 0);                  /* 16 MiB, larger than the socket buffers */
    for (int a = DP_ALGO_DIRECT; a <= DP_ALGO_AUTO; a++) {
        run_algo(3, 7, 1024, (dp_allreduce_algo)a);
        run_algo(5, 100003, 1024, (dp_allreduce_algo)a);
        run_algo(3, 1u << 20, 0, (dp_allreduce_algo)a); /* 4 MiB: past the buffers */
    }
    return CHECK_DONE();
}
