/* A restarted task rejoins (docs/transport.md, "Redial").  Ranks 0 (A) and 1
 * (B) live in this process; rank 2 (C) is a child process that answers PINGs.
 * C is killed with SIGKILL and started again on the same address: A, which
 * polls C, and B, which does not look at C until C is back, both redial it, so
 * the new C's connect_all succeeds within a few seconds.  B's replacement
 * connection waits for B to report the old loss and meanwhile gets
 * heartbeats, so the new C (heartbeat timeout 1 s) never takes B for dead.
 * A and B each see exactly one PEER_LOST for rank 2, then the new C's
 * frames, and frames flow both ways.  Finally C says BYE: nobody redials. */
#include "downpour/clock.h"
#include "downpour/tcp.h"

#include "check.h"

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define T_PING DP_FRAME_APP(0)
#define T_PONG DP_FRAME_APP(1)
#define T_JOIN DP_FRAME_APP(2) /* offset: the child's connect_all time in ms */
#define T_QUIT DP_FRAME_APP(3)

static const unsigned char secret[] = "rejoin-test-secret-0123456789abc";
static const char *const names[3] = {"ps:0", "worker:0", "worker:1"};
static char addr_buf[3][32];
static const char *addrs[3] = {addr_buf[0], addr_buf[1], addr_buf[2]};

static dp_transport *open_rank(int rank, int listen_fd)
{
    dp_tcp_config cfg;
    dp_tcp_config_init(&cfg);
    cfg.rank = rank;
    cfg.n_ranks = 3;
    cfg.addrs = addrs;
    cfg.names = names;
    cfg.secret = secret;
    cfg.secret_len = sizeof secret - 1;
    cfg.listen_fd = listen_fd;
    cfg.heartbeat_interval = 0.2;
    cfg.heartbeat_timeout = 1.0;
    cfg.handshake_timeout = 2;
    dp_transport *t;
    dp_err err;
    if (dp_tcp_open(&cfg, &t, &err)) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        return NULL;
    }
    return t;
}

/* Rank 2: connects, announces itself to 0 and 1, answers PINGs, leaves with
 * BYE on QUIT.  Any loss of a peer is a failure (exit 5). */
static int child(void)
{
    dp_transport *t = open_rank(2, -1);
    dp_err err;
    if (!t)
        return 2;
    double t0 = dp_now();
    if (dp_transport_connect_all(t, t0 + 8, &err)) {
        fprintf(stderr, "rank 2: %s\n", err.msg);
        return 3;
    }
    uint64_t ms = (uint64_t)((dp_now() - t0) * 1000);
    for (int p = 0; p < 2; p++)
        if (dp_transport_send(t, p, T_JOIN, 0, ms, "join", 4, &err))
            return 4;
    for (;;) {
        dp_event ev;
        if (dp_transport_poll(t, DP_PEER_ANY, 30, &ev, &err) || ev.kind != DP_EVENT_FRAME) {
            fprintf(stderr, "rank 2: %s %s\n", dp_event_kind_name(ev.kind), ev.reason);
            return 5;
        }
        char buf[16];
        size_t n = ev.header.length < sizeof buf ? (size_t)ev.header.length : sizeof buf;
        if (dp_transport_recv_payload(t, ev.peer, buf, n, &err))
            return 6;
        if (ev.header.type == T_QUIT)
            break;
        if (dp_transport_send(t, ev.peer, T_PONG, ev.header.step, 0, buf, n, &err))
            return 7;
    }
    dp_transport_close(t);
    return 0;
}

static pid_t spawn(void)
{
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) { /* exec: a fresh process, no threads or locks of ours */
        execl("/proc/self/exe", "test_tcp_rejoin", "child", addrs[0], addrs[1], addrs[2],
              (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* The next frame from rank 2 on t, counting PEER_LOST events on the way. */
static int next_from_2(dp_transport *t, int *lost, int *orderly, dp_event *ev)
{
    dp_err err;
    double until = dp_now() + 8;
    while (dp_now() < until) {
        if (dp_transport_poll(t, 2, until - dp_now(), ev, &err))
            return -1;
        if (ev->kind == DP_EVENT_PEER_LOST) {
            (*lost)++;
            *orderly = ev->orderly;
            fprintf(stderr, "rank %d: lost rank 2: %s\n", dp_transport_rank(t), ev->reason);
            if (ev->orderly)
                return 1;
            /* After a loss the rank is connected again by the redial. */
            if (dp_transport_connect(t, 2, until, &err))
                return fprintf(stderr, "reconnect: %s\n", err.msg), -1;
            continue;
        }
        if (ev->kind == DP_EVENT_FRAME)
            return 0;
    }
    return -1;
}

static int expect_join(dp_transport *t, int *lost)
{
    dp_event ev;
    dp_err err;
    int orderly = 0;
    if (next_from_2(t, lost, &orderly, &ev) != 0 || ev.header.type != T_JOIN)
        return -1;
    CHECKF(ev.header.offset < 5000, "rank 2 took %llu ms to connect",
           (unsigned long long)ev.header.offset);
    return dp_transport_skip_payload(t, 2, &err);
}

static int ping(dp_transport *t, uint64_t step, int *lost)
{
    dp_err err;
    dp_event ev;
    int orderly = 0;
    if (dp_transport_send(t, 2, T_PING, step, 0, "ping", 4, &err))
        return fprintf(stderr, "ping: %s\n", err.msg), -1;
    if (next_from_2(t, lost, &orderly, &ev) != 0 || ev.header.type != T_PONG ||
        ev.header.step != step)
        return -1;
    return dp_transport_skip_payload(t, 2, &err);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc == 5 && strcmp(argv[1], "child") == 0) {
        for (int i = 0; i < 3; i++)
            snprintf(addr_buf[i], sizeof addr_buf[i], "%s", argv[2 + i]);
        return child();
    }
    dp_err err;
    int lfd[3], port[3];
    for (int i = 0; i < 3; i++) {
        REQUIRE(dp_tcp_listen("127.0.0.1:0", 0, &lfd[i], &port[i], &err) == 0);
        snprintf(addr_buf[i], sizeof addr_buf[i], "127.0.0.1:%d", port[i]);
    }
    close(lfd[2]); /* rank 2's processes bind it themselves, one after the other */

    pid_t c1 = spawn();
    dp_transport *a = open_rank(0, lfd[0]), *b = open_rank(1, lfd[1]);
    REQUIRE(a && b);
    CHECKF(dp_transport_connect_all(a, dp_now() + 10, &err) == 0, "%s", err.msg);
    CHECKF(dp_transport_connect_all(b, dp_now() + 10, &err) == 0, "%s", err.msg);
    int lost_a = 0, lost_b = 0;
    REQUIRE(expect_join(a, &lost_a) == 0 && expect_join(b, &lost_b) == 0);
    CHECK(ping(a, 1, &lost_a) == 0 && ping(b, 2, &lost_b) == 0);
    uint64_t inc1 = dp_transport_peer_incarnation(a, 2);
    CHECK(inc1 != 0 && dp_transport_peer_incarnation(b, 2) == inc1);

    /* The crash.  A polls C and sees the loss; B looks away. */
    kill(c1, SIGKILL);
    int st;
    waitpid(c1, &st, 0);
    dp_event ev;
    REQUIRE(dp_transport_poll(a, 2, 5, &ev, &err) == 0);
    CHECKF(ev.kind == DP_EVENT_PEER_LOST && !ev.orderly, "%s", dp_event_kind_name(ev.kind));
    lost_a++;

    /* The restart: both redial it. */
    double t_restart = dp_now();
    pid_t c2 = spawn();
    CHECK(expect_join(a, &lost_a) == 0);
    fprintf(stderr, "rank 2 rejoined rank 0 %.2f s after its restart\n", dp_now() - t_restart);
    /* B still does not look; its new connection must keep C from losing it
     * (C's heartbeat timeout is 1 s). */
    usleep(2500 * 1000);
    CHECK(expect_join(b, &lost_b) == 0);
    CHECK(ping(a, 3, &lost_a) == 0 && ping(b, 4, &lost_b) == 0);
    CHECK(ping(a, 5, &lost_a) == 0 && ping(b, 6, &lost_b) == 0);
    uint64_t inc2 = dp_transport_peer_incarnation(a, 2);
    CHECK(inc2 != 0 && inc2 != inc1 && dp_transport_peer_incarnation(b, 2) == inc2);
    CHECKF(lost_a == 1 && lost_b == 1, "PEER_LOST for rank 2: %d on rank 0, %d on rank 1",
           lost_a, lost_b);

    /* An orderly leave: BYE, and no redial. */
    CHECK(dp_transport_send(a, 2, T_QUIT, 0, 0, "quit", 4, &err) == 0);
    int orderly = 0;
    CHECK(next_from_2(a, &lost_a, &orderly, &ev) == 1 && orderly == 1);
    CHECK(next_from_2(b, &lost_b, &orderly, &ev) == 1 && orderly == 1);
    waitpid(c2, &st, 0);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 2 exit status 0x%x", st);
    int port2;
    REQUIRE(dp_tcp_listen(addrs[2], 0, &lfd[2], &port2, &err) == 0);
    struct pollfd p = {lfd[2], POLLIN, 0};
    CHECKF(poll(&p, 1, 1500) == 0, "someone dialed rank 2 after its BYE");
    close(lfd[2]);
    CHECK(dp_transport_connect(a, 2, dp_now() + 0.3, &err) != 0); /* a plain dial still works as before */

    dp_transport_close(a);
    dp_transport_close(b);
    return CHECK_DONE();
}
