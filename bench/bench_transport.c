/* Transport benchmark: throughput of 1 MiB and 64 MiB frames and round-trip
 * latency of 64-byte messages between two processes on loopback, beside a
 * raw-socket baseline (plain blocking send/recv loops, same socket options)
 * in the same program.  Raw and transport runs alternate, each repeated, and
 * the medians are compared.  Targets: >= 90 % of raw throughput, latency
 * within 1.2x of raw.
 *
 *   bench_transport [repetitions (7)] [split|same|free]
 *
 * split (the default) pins the two processes to different CPUs, as tasks on
 * different cores or hosts run; same pins both to CPU 0, where every cycle
 * of checksum work is added to the copy; free lets the scheduler choose (on a
 * busy machine it flips between the two, so medians become bimodal).
 * DP_BENCH_SOCKBUF=bytes sets SO_SNDBUF/SO_RCVBUF of both (0: autotuning);
 * DP_BENCH_CRC=sse4.2+pclmul (etc.) picks the CRC32C implementation.
 *
 * The transport runs three ways in the same program, each on its own pair of
 * connections: CRC only (insecure, no secret), with the frame MAC (a secret),
 * and with the MAC and encryption (docs/transport.md, "Frame MAC"). */
#include "bench.h"
#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/tcp.h"

#include <errno.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int SOCK_BUF = 4 << 20; /* DP_BENCH_SOCKBUF overrides; 0 = kernel autotuning */
#define LAT_MSG 64
#define LAT_ROUNDS 20000
#define T_DATA DP_FRAME_APP(0)
#define T_ACK DP_FRAME_APP(1)

static const unsigned char secret[] = "bench-secret-bench-secret-123456";

typedef struct run {
    size_t size;
    int count;
} run;

static const run runs[2] = {{1u << 20, 1024}, {64u << 20, 16}}; /* 1 GiB each */

enum { V_CRC, V_MAC, V_ENC, NV };
static const char *const vname[NV] = {"CRC only", "MAC", "MAC+encrypt"};

static void pin(int cpu)
{
    if (cpu < 0)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        fprintf(stderr, "bench_transport: cannot pin to CPU %d: %s\n", cpu, strerror(errno));
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_transport: %s: %s\n", what, msg);
    exit(1);
}

static void raw_send(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            die("raw send", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

static size_t raw_chunk = 8 * 1024; /* DP_BENCH_RAWCHUNK; the transport reads 8 KiB too (raw is fastest at 8-16 KiB here) */

static void raw_recv(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len) {
        ssize_t n = recv(fd, p, len < raw_chunk ? len : raw_chunk, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            die("raw recv", n == 0 ? "EOF" : strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

static void set_opt(int fd, int level, int opt, int v)
{
    if (setsockopt(fd, level, opt, &v, sizeof v) != 0)
        die("setsockopt", strerror(errno));
}

static void raw_tune(int fd)
{
    set_opt(fd, IPPROTO_TCP, TCP_NODELAY, 1);
    if (SOCK_BUF > 0) {
        set_opt(fd, SOL_SOCKET, SO_SNDBUF, SOCK_BUF);
        set_opt(fd, SOL_SOCKET, SO_RCVBUF, SOCK_BUF);
    }
}

static dp_transport *open_rank(int rank, int lfd, const char *const *addrs, int v)
{
    dp_tcp_config cfg;
    dp_tcp_config_init(&cfg);
    cfg.rank = rank;
    cfg.n_ranks = 2;
    cfg.addrs = addrs;
    cfg.secret = secret;
    cfg.secret_len = v == V_CRC ? 0 : sizeof secret - 1;
    cfg.insecure = v == V_CRC;
    cfg.encrypt = v == V_ENC;
    cfg.listen_fd = lfd;
    cfg.sock_buf_bytes = SOCK_BUF;
    dp_transport *t;
    dp_err err;
    if (dp_tcp_open(&cfg, &t, &err) || dp_transport_connect(t, 1 - rank, dp_now() + 10, &err))
        die("transport", err.msg);
    return t;
}

static void tp_recv(dp_transport *t, int peer, void *buf, size_t cap)
{
    dp_event ev;
    dp_err err;
    if (dp_transport_recv(t, peer, "benchmark", 60, &ev, &err))
        die("recv", err.msg);
    if (ev.header.length > cap)
        die("recv", "frame larger than the buffer");
    if (dp_transport_recv_payload(t, peer, buf, (size_t)ev.header.length, &err))
        die("recv payload", err.msg);
}

static void tp_send(dp_transport *t, int peer, unsigned type, const void *buf, size_t len)
{
    dp_err err;
    if (dp_transport_send(t, peer, type, 0, 0, buf, len, &err))
        die("send", err.msg);
}

/* The child: receives and echoes according to the same schedule. */
static void child(int rawfd, dp_transport **t, int reps, unsigned char *buf)
{
    char ack = 'k';
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < runs[k].count; i++)
                raw_recv(rawfd, buf, runs[k].size);
            raw_send(rawfd, &ack, 1);
            for (int v = 0; v < NV; v++) {
                for (int i = 0; i < runs[k].count; i++)
                    tp_recv(t[v], 0, buf, runs[k].size);
                tp_send(t[v], 0, T_ACK, &ack, 1);
            }
        }
        for (int i = 0; i < LAT_ROUNDS; i++) {
            raw_recv(rawfd, buf, LAT_MSG);
            raw_send(rawfd, buf, LAT_MSG);
        }
        for (int v = 0; v < NV; v++) {
            for (int i = 0; i < LAT_ROUNDS; i++) {
                tp_recv(t[v], 0, buf, LAT_MSG);
                tp_send(t[v], 0, T_DATA, buf, LAT_MSG);
            }
        }
    }
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    const char *mode = argc > 2 ? argv[2] : "split";
    int cpu_parent = 0, cpu_child = 1;
    if (strcmp(mode, "same") == 0)
        cpu_child = 0;
    else if (strcmp(mode, "free") == 0)
        cpu_parent = cpu_child = -1;
    else if (strcmp(mode, "split") != 0)
        reps = 0;
    if (reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: bench_transport [repetitions, 1..1000] [split|same|free]\n");
        return 2;
    }
    if (cpu_child == 1 && sysconf(_SC_NPROCESSORS_ONLN) < 2)
        cpu_child = 0;
    signal(SIGPIPE, SIG_DFL);
    const char *sb = getenv("DP_BENCH_SOCKBUF");
    if (sb)
        SOCK_BUF = atoi(sb);
    const char *impl = getenv("DP_BENCH_CRC"); /* e.g. sse4.2+pclmul, to compare */
    if (impl && dp_crc32c_force(impl) != 0)
        die("DP_BENCH_CRC", "unknown or unsupported CRC32C implementation");
    const char *rc = getenv("DP_BENCH_RAWCHUNK");
    if (rc && atol(rc) > 0)
        raw_chunk = (size_t)atol(rc);
    dp_err err;
    int lfd[NV][2], port[NV][2], rawl, rawport;
    char abuf[NV][2][32];
    const char *addrs[NV][2];
    for (int v = 0; v < NV; v++)
        for (int r = 0; r < 2; r++) {
            if (dp_tcp_listen("127.0.0.1:0", SOCK_BUF, &lfd[v][r], &port[v][r], &err))
                die("listen", err.msg);
            snprintf(abuf[v][r], sizeof abuf[v][r], "127.0.0.1:%d", port[v][r]);
            addrs[v][r] = abuf[v][r];
        }
    if (dp_tcp_listen("127.0.0.1:0", SOCK_BUF, &rawl, &rawport, &err))
        die("listen", err.msg);
    size_t cap = runs[1].size;
    unsigned char *buf = malloc(cap);
    if (!buf)
        die("malloc", "out of memory");
    for (size_t i = 0; i < cap; i++)
        buf[i] = (unsigned char)(i * 2654435761u >> 13);

    pid_t pid = fork();
    if (pid < 0)
        die("fork", strerror(errno));
    if (pid == 0) {
        pin(cpu_child);
        for (int v = 0; v < NV; v++)
            close(lfd[v][0]);
        close(rawl);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        raw_tune(fd);
        struct sockaddr_in sa = {0};
        sa.sin_family = AF_INET;
        sa.sin_port = htons((uint16_t)rawport);
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
            die("raw connect", strerror(errno));
        dp_transport *t[NV];
        for (int v = 0; v < NV; v++)
            t[v] = open_rank(1, lfd[v][1], addrs[v], v);
        child(fd, t, reps, buf);
        for (int v = 0; v < NV; v++)
            dp_transport_close(t[v]);
        _exit(0);
    }
    pin(cpu_parent);
    for (int v = 0; v < NV; v++)
        close(lfd[v][1]);
    int rawfd;
    do
        rawfd = accept(rawl, NULL, NULL);
    while (rawfd < 0 && (errno == EINTR || errno == EAGAIN));
    if (rawfd < 0)
        die("raw accept", strerror(errno));
    /* accept() on the non-blocking listener gives a blocking socket. */
    raw_tune(rawfd);
    dp_transport *t[NV];
    for (int v = 0; v < NV; v++)
        t[v] = open_rank(0, lfd[v][0], addrs[v], v);

    static double raw_tp[2][1000], tp_tp[NV][2][1000], raw_lat[1000], tp_lat[NV][1000];
    char ack;
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < 2; k++) {
            double bytes = (double)runs[k].size * runs[k].count;
            double t0 = dp_now();
            for (int i = 0; i < runs[k].count; i++)
                raw_send(rawfd, buf, runs[k].size);
            raw_recv(rawfd, &ack, 1);
            raw_tp[k][r] = bytes / (dp_now() - t0) / 1e6;
            for (int v = 0; v < NV; v++) {
                t0 = dp_now();
                for (int i = 0; i < runs[k].count; i++)
                    tp_send(t[v], 1, T_DATA, buf, runs[k].size);
                tp_recv(t[v], 1, &ack, 1);
                tp_tp[v][k][r] = bytes / (dp_now() - t0) / 1e6;
            }
        }
        double t0 = dp_now();
        for (int i = 0; i < LAT_ROUNDS; i++) {
            raw_send(rawfd, buf, LAT_MSG);
            raw_recv(rawfd, buf, LAT_MSG);
        }
        raw_lat[r] = (dp_now() - t0) / LAT_ROUNDS * 1e6;
        for (int v = 0; v < NV; v++) {
            t0 = dp_now();
            for (int i = 0; i < LAT_ROUNDS; i++) {
                tp_send(t[v], 1, T_DATA, buf, LAT_MSG);
                tp_recv(t[v], 1, buf, LAT_MSG);
            }
            tp_lat[v][r] = (dp_now() - t0) / LAT_ROUNDS * 1e6;
        }
        fprintf(stderr, "rep %d: 1 MiB raw %.0f crc %.0f mac %.0f enc %.0f MB/s | 64 MiB raw %.0f "
                        "crc %.0f mac %.0f enc %.0f MB/s | rtt raw %.1f crc %.1f mac %.1f enc "
                        "%.1f us\n",
                r, raw_tp[0][r], tp_tp[0][0][r], tp_tp[1][0][r], tp_tp[2][0][r], raw_tp[1][r],
                tp_tp[0][1][r], tp_tp[1][1][r], tp_tp[2][1][r], raw_lat[r], tp_lat[0][r],
                tp_lat[1][r], tp_lat[2][r]);
    }
    int status;
    for (int v = 0; v < NV; v++)
        dp_transport_close(t[v]);
    waitpid(pid, &status, 0);
    close(rawfd);
    close(rawl);

    printf("transport benchmark: loopback, 2 processes, %d repetitions, medians "
           "(crc32c: %s, socket buffers %d, CPUs: %s)\n",
           reps, dp_crc32c_impl(), SOCK_BUF, mode);
    for (int v = 0; v < NV; v++) {
        printf("transport: %s\n", vname[v]);
        printf("%-28s %12s %12s %8s %s\n", "", "raw", "transport", "ratio", "target");
        for (int k = 0; k < 2; k++) {
            double a = bench_median(raw_tp[k], reps), b = bench_median(tp_tp[v][k], reps);
            printf("throughput %2zu MiB frames (MB/s) %9.0f %12.0f %7.2f%% %s\n",
                   runs[k].size >> 20, a, b, 100 * b / a,
                   b >= 0.9 * a ? ">= 90% met" : ">= 90% MISSED");
        }
        double a = bench_median(raw_lat, reps), b = bench_median(tp_lat[v], reps);
        printf("round trip, 64 B (us)        %9.1f %12.1f %7.2fx %s\n", a, b, b / a,
               b <= 1.2 * a ? "<= 1.2x met" : "<= 1.2x MISSED");
    }
    /* The cost of integrity, against CRC only, in the same run. */
    for (int v = V_MAC; v < NV; v++) {
        for (int k = 0; k < 2; k++) {
            double c = bench_median(tp_tp[V_CRC][k], reps), m = bench_median(tp_tp[v][k], reps);
            printf("frame %s: %2zu MiB frames %.2f GB/s vs CRC-only %.2f GB/s (%+.1f %%)\n",
                   vname[v], runs[k].size >> 20, m / 1e3, c / 1e3, 100 * (m - c) / c);
        }
        double c = bench_median(tp_lat[V_CRC], reps), m = bench_median(tp_lat[v], reps);
        printf("frame %s: 64 B round trip %.1f us vs CRC-only %.1f us (%+.1f %%)\n", vname[v], m,
               c, 100 * (m - c) / c);
    }
    free(buf);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
