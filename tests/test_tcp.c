/* TCP transport between two processes on loopback: 10,000 small frames and
 * one 64 MiB frame (gathered from three pieces on send, scattered into two on
 * receive), byte-exact; wire counters exact (tagged frames: a secret); a BYE arrives as an orderly
 * PEER_LOST. */
#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/rng.h"
#include "downpour/tcp.h"

#include "check.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_SMALL 10000
#define BIG (64u << 20)
#define T_SMALL DP_FRAME_APP(0)
#define T_BIG DP_FRAME_APP(1)
#define T_DONE DP_FRAME_APP(2)
#define HB_WIRE dp_frame_wire_size_mac(0) /* a heartbeat: header and its tag */

static const unsigned char secret[] = "0123456789abcdef0123456789abcdef";
static const char *const names[2] = {"worker:0", "ps:0"};

static size_t small_len(int i) { return (size_t)(i * 7919) % 301; }

static void fill_small(unsigned char *p, int i, size_t n)
{
    for (size_t k = 0; k < n; k++)
        p[k] = (unsigned char)(i * 31 + (int)k);
}

static void fill_big(unsigned char *p)
{
    dp_rng r;
    dp_rng_seed(&r, 7);
    for (size_t k = 0; k < BIG; k += 8) {
        uint64_t v = dp_rng_u64(&r);
        memcpy(p + k, &v, 8);
    }
}

static dp_transport *open_rank(int rank, int listen_fd, const char *const *addrs)
{
    dp_tcp_config cfg;
    dp_tcp_config_init(&cfg);
    cfg.rank = rank;
    cfg.n_ranks = 2;
    cfg.addrs = addrs;
    cfg.names = names;
    cfg.secret = secret;
    cfg.secret_len = sizeof secret - 1;
    cfg.listen_fd = listen_fd;
    dp_transport *t;
    dp_err err;
    if (dp_tcp_open(&cfg, &t, &err)) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        return NULL;
    }
    if (dp_transport_connect(t, 1 - rank, dp_now() + 10, &err)) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        dp_transport_close(t);
        return NULL;
    }
    return t;
}

/* Rank 0, in the child: sends everything, checks its own counters. */
static int sender(int listen_fd, const char *const *addrs)
{
    dp_transport *t = open_rank(0, listen_fd, addrs);
    if (!t)
        return 2;
    dp_err err;
    dp_transport_stats s0, s1;
    dp_transport_stats_get(t, 1, &s0);
    unsigned char buf[301];
    uint64_t wire = 0;
    for (int i = 0; i < N_SMALL; i++) {
        size_t n = small_len(i);
        fill_small(buf, i, n);
        if (dp_transport_send(t, 1, T_SMALL, (uint64_t)i, (uint64_t)i * 3, buf, n, &err)) {
            fprintf(stderr, "sender: %s\n", err.msg);
            return 3;
        }
        wire += dp_frame_wire_size_mac(n);
    }
    unsigned char *big = malloc(BIG);
    if (!big)
        return 4;
    fill_big(big);
    struct iovec iov[3] = {{big, 1000}, {big + 1000, BIG / 2}, {big + 1000 + BIG / 2, 0}};
    iov[2].iov_len = BIG - 1000 - BIG / 2;
    if (dp_transport_sendv(t, 1, T_BIG, 99, 12345, iov, 3, &err)) {
        fprintf(stderr, "sender: %s\n", err.msg);
        return 5;
    }
    wire += dp_frame_wire_size_mac(BIG);
    free(big);
    dp_transport_stats_get(t, 1, &s1);
    uint64_t frames = s1.frames_sent - s0.frames_sent, bytes = s1.bytes_sent - s0.bytes_sent;
    uint64_t hb = s1.heartbeats_sent - s0.heartbeats_sent;
    int rc = 0;
    if (bytes != wire + hb * HB_WIRE || frames - hb != N_SMALL + 1) {
        fprintf(stderr, "sender counters: %llu frames, %llu bytes, %llu expected\n",
                (unsigned long long)frames, (unsigned long long)bytes, (unsigned long long)wire);
        rc = 6;
    }
    dp_event ev;
    if (dp_transport_recv(t, 1, "the receiver's verdict", 60, &ev, &err) ||
        ev.header.type != T_DONE) {
        fprintf(stderr, "sender: %s\n", err.msg);
        rc = 7;
    } else if (ev.header.step != 0) {
        rc = 8; /* the receiver found a mismatch */
    }
    dp_transport_close(t);
    return rc;
}

int main(void)
{
    signal(SIGPIPE, SIG_DFL); /* the transport must never raise it */
    int fd[2], port[2];
    dp_err err;
    for (int r = 0; r < 2; r++)
        REQUIRE(dp_tcp_listen("127.0.0.1:0", 4 << 20, &fd[r], &port[r], &err) == 0);
    char a0[32], a1[32];
    snprintf(a0, sizeof a0, "127.0.0.1:%d", port[0]);
    snprintf(a1, sizeof a1, "127.0.0.1:%d", port[1]);
    const char *addrs[2] = {a0, a1};

    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(fd[1]);
        _exit(sender(fd[0], addrs));
    }
    close(fd[0]);
    dp_transport *t = open_rank(1, fd[1], addrs);
    REQUIRE(t);
    CHECK(dp_tcp_port(t) == port[1]);
    CHECK(strcmp(dp_transport_peer_name(t, 0), "worker:0") == 0);
    dp_transport_stats s0, s1;
    dp_transport_stats_get(t, 0, &s0);

    double t0 = dp_now();
    unsigned char got[301], want[301];
    int bad_small = 0;
    uint64_t wire = 0;
    dp_event ev;
    for (int i = 0; i < N_SMALL; i++) {
        if (dp_transport_recv(t, 0, "small frames", 30, &ev, &err)) {
            fprintf(stderr, "frame %d: %s\n", i, err.msg);
            bad_small = 1;
            break;
        }
        size_t n = small_len(i);
        if (ev.header.type != T_SMALL || ev.header.step != (uint64_t)i ||
            ev.header.offset != (uint64_t)i * 3 || ev.header.length != n || ev.header.source != 0)
            bad_small++;
        REQUIRE(ev.header.length <= sizeof got);
        if (dp_transport_recv_payload(t, 0, got, (size_t)ev.header.length, &err)) {
            fprintf(stderr, "frame %d payload: %s\n", i, err.msg);
            bad_small++;
            break;
        }
        fill_small(want, i, n);
        if (memcmp(got, want, n) != 0)
            bad_small++;
        wire += dp_frame_wire_size_mac(n);
    }
    CHECKF(bad_small == 0, "%d small frames wrong", bad_small);
    double t1 = dp_now();

    unsigned char *big = malloc(BIG), *ref = malloc(BIG);
    REQUIRE(big && ref);
    memset(big, 0, BIG);
    int big_ok = dp_transport_recv(t, 0, "the 64 MiB frame", 30, &ev, &err) == 0;
    CHECKF(big_ok, "%s", err.msg);
    if (big_ok) {
        CHECK(ev.header.type == T_BIG && ev.header.step == 99 && ev.header.offset == 12345);
        CHECK(ev.header.length == BIG);
        /* Scatter: 3 MiB + 5 bytes (across a chunk boundary), then the rest. */
        size_t cut = (3u << 20) + 5;
        CHECK(dp_transport_recv_payload(t, 0, big, cut, &err) == 0);
        CHECK(dp_transport_recv_payload(t, 0, big + cut, BIG - cut, &err) == 0);
        CHECK(dp_transport_recv_payload(t, 0, big, 1, &err) == -1); /* nothing left */
        CHECK(ev.header.flags & DP_FRAME_F_CHUNKED);
        wire += dp_frame_wire_size_mac(BIG);
    }
    double t2 = dp_now();
    fill_big(ref);
    int same = memcmp(big, ref, BIG) == 0;
    CHECK(same);
    CHECK(dp_crc32c(0, big, BIG) == dp_crc32c_sw(0, ref, BIG));
    free(big);
    free(ref);

    dp_transport_stats_get(t, 0, &s1);
    uint64_t frames = s1.frames_recv - s0.frames_recv, bytes = s1.bytes_recv - s0.bytes_recv;
    uint64_t hb = s1.heartbeats_recv - s0.heartbeats_recv;
    CHECKF(frames - hb == N_SMALL + 1, "%llu frames, %llu heartbeats", (unsigned long long)frames,
           (unsigned long long)hb);
    /* Every byte on the wire: headers, payloads, the 63 chunk CRCs of the big
     * frame, and the heartbeats' headers. */
    CHECKF(bytes == wire + hb * HB_WIRE, "%llu bytes, expected %llu + %llu heartbeats",
           (unsigned long long)bytes, (unsigned long long)wire, (unsigned long long)hb);
    dp_transport_stats tot;
    dp_transport_stats_get(t, DP_PEER_ANY, &tot);
    CHECK(tot.bytes_recv == s1.bytes_recv && tot.frames_sent == s1.frames_sent);

    uint64_t verdict = (bad_small == 0 && same) ? 0 : 1;
    CHECK(dp_transport_send(t, 0, T_DONE, verdict, 0, NULL, 0, &err) == 0);
    /* The sender says BYE when it closes. */
    CHECK(dp_transport_poll(t, DP_PEER_ANY, 20, &ev, &err) == 0);
    CHECKF(ev.kind == DP_EVENT_PEER_LOST && ev.peer == 0 && ev.orderly, "event %s %s",
           dp_event_kind_name(ev.kind), ev.reason);
    int status;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "sender exited with status %d",
           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    CHECK(dp_transport_send(t, 0, T_DONE, 0, 0, NULL, 0, &err) == -1);
    fprintf(stderr, "10000 small frames in %.3f s, 64 MiB in %.3f s (%.0f MB/s)\n", t1 - t0,
            t2 - t1, BIG / (t2 - t1) / 1e6);
    dp_transport_close(t);
    dp_transport_close(NULL);
    return CHECK_DONE();
}
