/* TCP transport under faults.  The server is rank 2 of 3 (in this process);
 * rank 1 is a good peer in a child process that must keep being served; rank
 * 0 is played by raw sockets that send garbage, truncated frames, oversized
 * lengths, wrong CRCs and wrong secrets.  Each must close that connection
 * with a logged reason naming the address.  Then: a peer killed with SIGKILL
 * and a stopped (silent) peer are reported as PEER_LOST within the heartbeat
 * timeout, and a dialer started before its listener retries until it appears. */
#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/frame.h"
#include "downpour/tcp.h"
#include "net/auth.h"
#include "net/sock.h"

#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define T_PING DP_FRAME_APP(0)
#define T_PONG DP_FRAME_APP(1)
#define MAX_FRAME (4u << 20)

static const unsigned char secret[] = "fault-test-secret-0123456789abcd";
static const char *const names[3] = {"worker:0", "worker:1", "ps:0"};
static char addr_buf[3][32];
static const char *addrs[3] = {addr_buf[0], addr_buf[1], addr_buf[2]};
static int server_port;

static dp_transport *open_rank(int rank, int listen_fd, double hb_timeout, const char *const *a,
                               int n)
{
    dp_tcp_config cfg;
    dp_tcp_config_init(&cfg);
    cfg.rank = rank;
    cfg.n_ranks = n;
    cfg.addrs = a;
    cfg.names = names;
    cfg.secret = secret;
    cfg.secret_len = sizeof secret - 1;
    cfg.listen_fd = listen_fd;
    cfg.heartbeat_interval = 0.2;
    cfg.heartbeat_timeout = hb_timeout;
    cfg.handshake_timeout = 2;
    cfg.max_frame_bytes = MAX_FRAME;
    dp_transport *t;
    dp_err err;
    if (dp_tcp_open(&cfg, &t, &err)) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        return NULL;
    }
    return t;
}

/* A good peer: answers every PING with a PONG until the server leaves. */
static int good_peer(int rank, int listen_fd)
{
    dp_transport *t = open_rank(rank, listen_fd, 1.0, addrs, 3);
    dp_err err;
    if (!t || dp_transport_connect(t, 2, dp_now() + 10, &err)) {
        fprintf(stderr, "good peer: %s\n", t ? err.msg : "open failed");
        return 2;
    }
    for (;;) {
        dp_event ev;
        if (dp_transport_poll(t, 2, 30, &ev, &err))
            return 3;
        if (ev.kind != DP_EVENT_FRAME)
            break;
        char buf[64];
        size_t n = ev.header.length < sizeof buf ? (size_t)ev.header.length : sizeof buf;
        if (dp_transport_recv_payload(t, 2, buf, n, &err) ||
            dp_transport_send(t, 2, T_PONG, ev.header.step, 0, buf, n, &err))
            return 4;
    }
    dp_transport_close(t);
    return 0;
}

static int ping(dp_transport *t, int peer, uint64_t step)
{
    dp_err err;
    dp_event ev;
    char buf[16];
    if (dp_transport_send(t, peer, T_PING, step, 0, "ping", 4, &err))
        return fprintf(stderr, "ping: %s\n", err.msg), -1;
    if (dp_transport_recv(t, peer, "pong", 5, &ev, &err))
        return fprintf(stderr, "ping: %s\n", err.msg), -1;
    if (ev.header.type != T_PONG || ev.header.step != step || ev.header.length != 4)
        return -1;
    if (dp_transport_recv_payload(t, peer, buf, 4, &err) || memcmp(buf, "ping", 4) != 0)
        return -1;
    return 0;
}

/* ---- capturing our own stderr to check the logged reasons ---- */
static int saved_stderr = -1;
static char log_path[256];

static void log_begin(void)
{
    const char *dir = getenv("DOWNPOUR_TEST_TMP");
    snprintf(log_path, sizeof log_path, "%s/test_tcp_faults.%d.log", dir ? dir : "/tmp",
             (int)getpid());
    fflush(stderr);
    saved_stderr = dup(2);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0 && saved_stderr >= 0);
    dup2(fd, 2);
    close(fd);
}

/* The refusing side logs from its handshake thread, which may still be
 * writing after the dialler has seen the refusal: waits (at most 10 s) until
 * the log holds `what`, so the check below reads a finished log. */
static void log_await(const char *what)
{
    for (int i = 0; i < 1000; i++) {
        fflush(stderr);
        char buf[65536];
        FILE *f = fopen(log_path, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = '\0';
        if (strstr(buf, what))
            return;
        usleep(10000);
    }
}

/* Restores stderr, echoes what was logged, and returns it (static buffer). */
static const char *log_end(void)
{
    static char text[65536];
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    FILE *f = fopen(log_path, "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = '\0';
    if (f)
        fclose(f);
    unlink(log_path);
    fputs(text, stderr);
    return text;
}

/* ---- raw rank 0 ---- */

static int raw_connect(void)
{
    dp_sockaddr sa;
    dp_err err;
    int fd, eno;
    REQUIRE(dp_sock_resolve(addrs[2], 0, &sa, &err) == 0);
    REQUIRE(dp_sock_dial(&sa, 0, 2, &fd, &eno, &err) == 0);
    return fd;
}

/* A rank 0 that passed the handshake: returns the fd, or -1. */
static int raw_auth(const unsigned char *key, size_t key_len, dp_err *err)
{
    int fd = raw_connect();
    dp_auth_params p = {0, 3, key, key_len, dp_now() + 3, NULL, NULL, 0x1234, 0, NULL, 0};
    dp_auth_io io = {0};
    dp_auth_session sess;
    if (dp_auth_dial(fd, &p, 2, &io, &sess, err) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Waits until the server closes fd (EOF or reset), at most 3 s. */
static int wait_closed(int fd)
{
    char buf[512];
    double end = dp_now() + 3;
    while (dp_now() < end) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return 0;
        if (n < 0)
            dp_sock_wait(fd, POLLIN, 0.1);
    }
    return -1;
}

static void send_raw(int fd, const void *p, size_t n)
{
    dp_err err;
    CHECKF(dp_sock_write_full(fd, p, n, dp_now() + 2, &err) == 0, "%s", err.msg);
}

static void header(uint8_t *b, unsigned type, uint64_t len, uint32_t crc)
{
    dp_frame_header h = {0};
    h.type = (uint16_t)type;
    h.source = 0;
    h.length = len;
    h.payload_crc = crc;
    if (len > DP_FRAME_CHUNK)
        h.flags = DP_FRAME_F_CHUNKED;
    dp_frame_encode(b, &h);
}

/* Polls rank 0 until PEER_LOST; a FRAME's payload is read (and may fail).
 * Returns the reason, or "" if none came within 3 s. */
static const char *expect_lost(dp_transport *t)
{
    static char reason[256];
    dp_event ev;
    dp_err err;
    reason[0] = '\0';
    double end = dp_now() + 3;
    while (dp_now() < end) {
        if (dp_transport_poll(t, 0, end - dp_now(), &ev, &err))
            break;
        if (ev.kind == DP_EVENT_FRAME) {
            char *buf = malloc(ev.header.length ? (size_t)ev.header.length : 1);
            REQUIRE(buf);
            int rc = dp_transport_recv_payload(t, 0, buf, (size_t)ev.header.length, &err);
            free(buf);
            if (rc)
                fprintf(stderr, "recv_payload failed as expected: %s\n", err.msg);
            continue;
        }
        if (ev.kind == DP_EVENT_PEER_LOST) {
            snprintf(reason, sizeof reason, "%s", ev.reason);
            break;
        }
    }
    return reason;
}

#define EXPECT_LOST(t, word)                                                                  \
    do {                                                                                      \
        const char *r_ = expect_lost(t);                                                      \
        CHECKF(strstr(r_, word) != NULL, "PEER_LOST reason '%s' lacks '%s'", r_, word);       \
    } while (0)

static void fault_cases(dp_transport *t)
{
    uint8_t h[DP_FRAME_HEADER_SIZE];
    dp_err err;
    char junk[200];
    memset(junk, 'x', sizeof junk);

    /* 1. Garbage instead of a handshake. */
    int fd = raw_connect();
    const char http[] = "GET / HTTP/1.1\r\nHost: example\r\n\r\n................";
    send_raw(fd, http, sizeof http);
    CHECK(wait_closed(fd) == 0);
    close(fd);

    /* 2. A handshake that never finishes (the server's 2 s handshake timeout). */
    fd = raw_connect();
    send_raw(fd, "DPWF", 4);
    CHECK(wait_closed(fd) == 0);
    close(fd);

    /* 3. Wrong secret, answered by a real dialer. */
    fd = raw_auth((const unsigned char *)"not-the-secret-not-the-secret!!!", 32, &err);
    CHECKF(fd < 0 && strstr(err.msg, "authentication failed"), "%s", err.msg);

    /* 4. Wrong secret, from a stranger who sends a made-up proof. */
    fd = raw_connect();
    uint8_t hello[52] = {3, 0, 0, 0, 2, 0, 0, 0};
    header(h, DP_FRAME_HELLO, sizeof hello, dp_crc32c(0, hello, sizeof hello));
    send_raw(fd, h, sizeof h);
    send_raw(fd, hello, sizeof hello);
    uint8_t chal[DP_FRAME_HEADER_SIZE + 76];
    CHECK(dp_sock_read_full(fd, chal, sizeof chal, dp_now() + 2, &err) == 0);
    uint8_t mac[32] = {1, 2, 3};
    header(h, DP_FRAME_AUTH, sizeof mac, dp_crc32c(0, mac, sizeof mac));
    send_raw(fd, h, sizeof h);
    send_raw(fd, mac, sizeof mac);
    CHECK(wait_closed(fd) == 0);
    close(fd);

    /* 5. Garbage after a good handshake. */
    fd = raw_auth(secret, sizeof secret - 1, &err);
    CHECKF(fd >= 0, "%s", err.msg);
    send_raw(fd, junk, 100);
    EXPECT_LOST(t, "bad magic");
    close(fd);
    CHECK(ping(t, 1, 5) == 0);

    /* 6. A frame cut short: the peer closes after 10 of 1000 payload bytes. */
    fd = raw_auth(secret, sizeof secret - 1, &err);
    CHECKF(fd >= 0, "%s", err.msg);
    header(h, DP_FRAME_APP(0), 1000, 0);
    send_raw(fd, h, sizeof h);
    send_raw(fd, junk, 10);
    close(fd);
    EXPECT_LOST(t, "closed mid-frame");
    CHECK(ping(t, 1, 6) == 0);

    /* 7. A header cut short. */
    fd = raw_auth(secret, sizeof secret - 1, &err);
    CHECKF(fd >= 0, "%s", err.msg);
    header(h, DP_FRAME_APP(0), 0, 0);
    send_raw(fd, h, 20);
    close(fd);
    EXPECT_LOST(t, "20 of 48 header bytes");
    CHECK(ping(t, 1, 7) == 0);

    /* 8. A length over the maximum frame size: refused before any allocation. */
    fd = raw_auth(secret, sizeof secret - 1, &err);
    CHECKF(fd >= 0, "%s", err.msg);
    header(h, DP_FRAME_APP(0), (uint64_t)1 << 40, 0);
    send_raw(fd, h, sizeof h);
    EXPECT_LOST(t, "exceeds the maximum frame size");
    CHECK(wait_closed(fd) == 0);
    close(fd);
    CHECK(ping(t, 1, 8) == 0);

    /* 9. A wrong payload CRC: on a keyed connection the frame has no valid
     * tag either, which is what refuses it (docs/transport.md, "Frame MAC"). */
    fd = raw_auth(secret, sizeof secret - 1, &err);
    CHECKF(fd >= 0, "%s", err.msg);
    header(h, DP_FRAME_APP(0), 100, dp_crc32c(0, junk, 100) ^ 1);
    send_raw(fd, h, sizeof h);
    send_raw(fd, junk, 100);
    EXPECT_LOST(t, "failed authentication");
    close(fd);
    CHECK(ping(t, 1, 9) == 0);

    /* 9b. A chunked frame whose second chunk's CRC is wrong. */
    fd = raw_auth(secret, sizeof secret - 1, &err);
    CHECKF(fd >= 0, "%s", err.msg);
    size_t big = (size_t)DP_FRAME_CHUNK;
    char *chunk0 = calloc(1, big);
    REQUIRE(chunk0);
    header(h, DP_FRAME_APP(0), big + 100, dp_crc32c(0, chunk0, big));
    send_raw(fd, h, sizeof h);
    send_raw(fd, chunk0, big);
    uint8_t crc1[4];
    dp_put_u32(crc1, dp_crc32c(0, junk, 100) ^ 0x100);
    send_raw(fd, crc1, 4);
    send_raw(fd, junk, 100);
    free(chunk0);
    EXPECT_LOST(t, "failed authentication");
    close(fd);
    CHECK(ping(t, 1, 19) == 0);

    /* 10. A wrong header CRC. */
    fd = raw_auth(secret, sizeof secret - 1, &err);
    CHECKF(fd >= 0, "%s", err.msg);
    header(h, DP_FRAME_APP(0), 0, 0);
    h[47] ^= 0x40;
    send_raw(fd, h, sizeof h);
    EXPECT_LOST(t, "header CRC");
    close(fd);
    CHECK(ping(t, 1, 10) == 0);

    /* 11. A frame claiming another source rank. */
    fd = raw_auth(secret, sizeof secret - 1, &err);
    CHECKF(fd >= 0, "%s", err.msg);
    dp_frame_header fh = {0};
    fh.type = DP_FRAME_APP(0);
    fh.source = 1;
    dp_frame_encode(h, &fh);
    send_raw(fd, h, sizeof h);
    EXPECT_LOST(t, "claims to come from rank 1");
    close(fd);

    /* 12. A second connection claiming a rank that is already connected, from
     * the same process (its incarnation): a new incarnation would replace it. */
    fd = -1;
    dp_auth_params p = {1,    3,    secret, sizeof secret - 1, dp_now() + 3,
                        NULL, NULL, dp_transport_peer_incarnation(t, 1), 0, NULL, 0};
    dp_auth_io io = {0};
    dp_auth_session sess;
    int rfd = raw_connect();
    CHECK(dp_transport_peer_incarnation(t, 1) != 0);
    CHECK(dp_auth_dial(rfd, &p, 2, &io, &sess, &err) == -2);
    CHECKF(strstr(err.msg, "already connected") != NULL, "%s", err.msg);
    close(rfd);
    CHECK(ping(t, 1, 12) == 0);
}

/* The dialer starts first and retries until the listener appears. */
static void connect_before_listen(void)
{
    int lfd, port;
    dp_err err;
    REQUIRE(dp_tcp_listen("127.0.0.1:0", 0, &lfd, &port, &err) == 0);
    close(lfd); /* a port that was free a moment ago */
    char a1[32];
    snprintf(a1, sizeof a1, "127.0.0.1:%d", port);
    const char *a[2] = {"127.0.0.1:0", a1};
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        dp_transport *t = open_rank(0, -1, 2.0, a, 2);
        if (!t || dp_transport_connect(t, 1, dp_now() + 10, &err))
            _exit(2);
        int rc = dp_transport_send(t, 1, T_PING, 42, 0, "late", 4, &err) ? 3 : 0;
        dp_event ev;
        if (!rc && dp_transport_poll(t, 1, 10, &ev, &err) == 0 && ev.kind == DP_EVENT_PEER_LOST)
            rc = ev.orderly ? 0 : 4;
        dp_transport_close(t);
        _exit(rc);
    }
    usleep(700 * 1000);
    dp_transport *t = open_rank(1, -1, 2.0, a, 2);
    REQUIRE(t);
    double t0 = dp_now();
    CHECKF(dp_transport_connect(t, 0, dp_now() + 10, &err) == 0, "%s", err.msg);
    dp_event ev;
    CHECK(dp_transport_recv(t, 0, "late ping", 10, &ev, &err) == 0);
    CHECK(ev.header.step == 42);
    CHECK(dp_transport_skip_payload(t, 0, &err) == 0);
    fprintf(stderr, "connect-before-listen: connected %.2f s after the listener opened\n",
            dp_now() - t0);
    dp_transport_close(t);
    int status;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "dialer exit %d",
           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

int main(void)
{
    dp_err err;
    int fd[3], port[3];
    for (int r = 0; r < 3; r++) {
        REQUIRE(dp_tcp_listen("127.0.0.1:0", 0, &fd[r], &port[r], &err) == 0);
        snprintf(addr_buf[r], sizeof addr_buf[r], "127.0.0.1:%d", port[r]);
    }
    server_port = port[2];
    close(fd[0]); /* rank 0 is played by raw sockets */

    pid_t good = fork();
    REQUIRE(good >= 0);
    if (good == 0) {
        close(fd[2]);
        _exit(good_peer(1, fd[1]));
    }
    close(fd[1]);
    /* A 2 s heartbeat timeout: short for the test, long enough that a loaded
     * CI machine (ASan, tests in parallel) never starves a live peer past it. */
    dp_transport *t = open_rank(2, fd[2], 2.0, addrs, 3);
    REQUIRE(t);
    REQUIRE(dp_transport_connect(t, 1, dp_now() + 10, &err) == 0);
    CHECK(ping(t, 1, 1) == 0);

    log_begin();
    fault_cases(t);
    /* Each refusal is logged by its own handshake thread, in no set order:
     * waits for every reason, not only the last case's. */
    static const char *const reasons[] = {
        "refused connection from 127.0.0.1:", "bad magic", "read timed out",
        "rejected by peer: authentication failed", "does not know the cluster secret",
        "lost worker:0 (127.0.0.1:", "failed authentication: altered or replayed",
        "already connected"};
    for (size_t i = 0; i < sizeof reasons / sizeof *reasons; i++)
        log_await(reasons[i]);
    const char *log = log_end();
    for (size_t i = 0; i < sizeof reasons / sizeof *reasons; i++)
        CHECKF(strstr(log, reasons[i]) != NULL, "no \"%s\" in the log", reasons[i]);

    /* The good peer is still served. */
    CHECK(ping(t, 1, 100) == 0);
    dp_transport_stats s;
    dp_transport_stats_get(t, 1, &s);
    CHECK(s.frames_recv >= 11 && s.bytes_recv >= s.frames_recv * DP_FRAME_HEADER_SIZE);

    /* SIGKILL: reported by the connection's end (EOF comes at once), not by
     * the heartbeat's silence: the reason says which, whatever the load. */
    double t0 = dp_now();
    kill(good, SIGKILL);
    dp_event ev;
    CHECK(dp_transport_poll(t, DP_PEER_ANY, 30, &ev, &err) == 0);
    double dt = dp_now() - t0;
    CHECKF(ev.kind == DP_EVENT_PEER_LOST && ev.peer == 1 && !ev.orderly, "%s %s",
           dp_event_kind_name(ev.kind), ev.reason);
    CHECKF(!strstr(ev.reason, "heartbeat"), "SIGKILL noticed by silence, not EOF: %s",
           ev.reason);
    fprintf(stderr, "SIGKILL noticed after %.3f s: %s\n", dt, ev.reason);
    waitpid(good, NULL, 0);

    /* A stopped peer says nothing: lost by silence after the 2 s timeout. */
    REQUIRE(dp_tcp_listen("127.0.0.1:0", 0, &fd[1], &port[1], &err) == 0);
    snprintf(addr_buf[1], sizeof addr_buf[1], "127.0.0.1:%d", port[1]);
    /* A stranger connects first and says nothing: the good peer's handshake
     * runs beside it, not after its 2 s handshake timeout. */
    int silent = raw_connect();
    REQUIRE(silent >= 0);
    usleep(100 * 1000); /* its handshake is under way */
    pid_t stopped = fork();
    REQUIRE(stopped >= 0);
    if (stopped == 0)
        _exit(good_peer(1, fd[1]));
    close(fd[1]);
    t0 = dp_now();
    CHECKF(dp_transport_connect(t, 1, dp_now() + 10, &err) == 0, "%s", err.msg);
    dt = dp_now() - t0;
    CHECKF(dt < 1.5, "a silent stranger delayed a good peer's connection by %.2f s", dt);
    fprintf(stderr, "connected beside a silent stranger in %.3f s\n", dt);
    CHECK(ping(t, 1, 200) == 0);
    close(silent);
    kill(stopped, SIGSTOP);
    t0 = dp_now();
    CHECK(dp_transport_poll(t, 1, 30, &ev, &err) == 0);
    dt = dp_now() - t0;
    CHECKF(ev.kind == DP_EVENT_PEER_LOST && strstr(ev.reason, "heartbeat"), "%s %s",
           dp_event_kind_name(ev.kind), ev.reason);
    /* not before the timeout's silence (load only makes it later) */
    CHECKF(dt > 1.0, "silence noticed after %.2f s (timeout 2 s)", dt);
    fprintf(stderr, "stopped peer noticed after %.3f s: %s\n", dt, ev.reason);
    kill(stopped, SIGKILL);
    waitpid(stopped, NULL, 0);
    dp_transport_close(t);

    connect_before_listen();
    return CHECK_DONE();
}
