/* TCP transport set-up: the cluster secret (environment, hex or raw, file,
 * too short, generated), refusal to start without a secret unless insecure,
 * and configuration errors that must name what is wrong. */
#include "downpour/clock.h"
#include "downpour/secret.h"
#include "downpour/tcp.h"

#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void secrets(void)
{
    dp_secret s;
    dp_err err;

    unsetenv("DOWNPOUR_SECRET");
    CHECK(dp_secret_load(&s, NULL, &err) == -1);
    CHECKF(strstr(err.msg, "DOWNPOUR_SECRET") && strstr(err.msg, "--secret-file FILE"), "%s",
           err.msg);

    setenv("DOWNPOUR_SECRET", "00112233445566778899aabbccddeeff\n", 1);
    CHECK(dp_secret_load(&s, NULL, &err) == 0);
    CHECK(s.len == 16 && s.bytes[0] == 0x00 && s.bytes[1] == 0x11 && s.bytes[15] == 0xff);

    setenv("DOWNPOUR_SECRET", "a raw pass phrase, not hex at all", 1);
    CHECK(dp_secret_load(&s, NULL, &err) == 0);
    CHECK(s.len == strlen("a raw pass phrase, not hex at all"));

    setenv("DOWNPOUR_SECRET", "short", 1);
    CHECK(dp_secret_load(&s, NULL, &err) == -1);
    CHECKF(strstr(err.msg, "at least 16") != NULL, "%s", err.msg);
    unsetenv("DOWNPOUR_SECRET");

    char hex[2 * DP_SECRET_GEN + 1];
    dp_secret g;
    CHECK(dp_secret_generate(&g, hex, sizeof hex, &err) == 0);
    CHECK(g.len == DP_SECRET_GEN && strlen(hex) == 2 * DP_SECRET_GEN);

    /* The generated hex, through a file, gives the same bytes back. */
    const char *dir = getenv("DOWNPOUR_TEST_TMP");
    char path[512];
    snprintf(path, sizeof path, "%s/secret.%d", dir ? dir : "/tmp", (int)getpid());
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fprintf(f, "%s\n", hex);
    fclose(f);
    chmod(path, 0600);
    CHECK(dp_secret_load(&s, path, &err) == 0);
    CHECK(s.len == g.len && memcmp(s.bytes, g.bytes, g.len) == 0);
    unlink(path);
    CHECK(dp_secret_load(&s, path, &err) == -1);
    CHECKF(strstr(err.msg, path) != NULL, "%s", err.msg);
    dp_secret_wipe(&s);
    CHECK(s.len == 0);
}

static int try_open(int rank, int n, const char *const *addrs, const void *secret, size_t len,
                    int insecure, dp_err *err)
{
    dp_tcp_config cfg;
    dp_tcp_config_init(&cfg);
    cfg.rank = rank;
    cfg.n_ranks = n;
    cfg.addrs = addrs;
    cfg.secret = secret;
    cfg.secret_len = len;
    cfg.insecure = insecure;
    dp_transport *t = NULL;
    int rc = dp_tcp_open(&cfg, &t, err);
    if (rc == 0) {
        CHECK(dp_tcp_port(t) > 0);
        CHECK(strcmp(dp_transport_name(t), "tcp") == 0);
        CHECK(dp_transport_rank(t) == rank && dp_transport_size(t) == n);
        /* Misuse is an error, not a crash. */
        dp_err e;
        CHECK(dp_transport_send(t, rank, DP_FRAME_APP(0), 0, 0, "x", 1, &e) == -1);
        CHECK(dp_transport_send(t, n, DP_FRAME_APP(0), 0, 0, "x", 1, &e) == -1);
        CHECK(dp_transport_send(t, (rank + 1) % n, DP_FRAME_HEARTBEAT, 0, 0, NULL, 0, &e) == -1);
        CHECKF(dp_transport_send(t, (rank + 1) % n, DP_FRAME_APP(0), 0, 0, NULL, 0, &e) == -1 &&
                   strstr(e.msg, "not connected"),
               "%s", e.msg);
        CHECK(dp_transport_recv_payload(t, (rank + 1) % n, NULL, 0, &e) == 0);
        char b[4];
        CHECK(dp_transport_recv_payload(t, (rank + 1) % n, b, 4, &e) == -1);
        dp_event ev;
        CHECK(dp_transport_poll(t, DP_PEER_ANY, 0.05, &ev, &e) == 0 && ev.kind == DP_EVENT_TIMEOUT);
        CHECK(dp_transport_poll(t, n + 5, 0, &ev, &e) == -1);
        double t0 = dp_now();
        CHECK(dp_transport_recv(t, (rank + 1) % n, "nothing", 0.2, &ev, &e) == -1);
        CHECK(ev.kind == DP_EVENT_TIMEOUT && dp_now() - t0 < 30); /* no hang */
        dp_transport_stats s;
        CHECK(dp_transport_stats_get(t, DP_PEER_ANY, &s) == 0 && s.bytes_sent == 0);
        dp_transport_close(t);
    }
    return rc;
}

int main(void)
{
    secrets();
    const char *addrs[2] = {"127.0.0.1:0", "127.0.0.1:1"};
    const char key[] = "0123456789abcdef0123456789abcdef";
    dp_err err;

    CHECK(try_open(0, 2, addrs, NULL, 0, 0, &err) == -1);
    CHECKF(strstr(err.msg, "no cluster secret") != NULL, "%s", err.msg);
    CHECK(try_open(0, 2, addrs, NULL, 0, 1, &err) == 0); /* insecure: allowed, warned */
    CHECK(try_open(0, 2, addrs, key, 32, 0, &err) == 0);

    CHECK(try_open(2, 2, addrs, key, 32, 0, &err) == -1);
    CHECKF(strstr(err.msg, "rank 2 of 2") != NULL, "%s", err.msg);

    const char *bad[2] = {"localhost", "127.0.0.1:1"};
    CHECK(try_open(0, 2, bad, key, 32, 0, &err) == -1);
    CHECKF(strstr(err.msg, "localhost") && strstr(err.msg, "host:port"), "%s", err.msg);
    const char *badport[2] = {"127.0.0.1:http", "127.0.0.1:1"};
    CHECK(try_open(0, 2, badport, key, 32, 0, &err) == -1);
    CHECKF(strstr(err.msg, "port") != NULL, "%s", err.msg);
    const char *noaddr[2] = {"127.0.0.1:0", NULL};
    CHECK(try_open(0, 2, noaddr, key, 32, 0, &err) == -1);
    CHECKF(strstr(err.msg, "rank 1") && strstr(err.msg, "missing"), "%s", err.msg);

    /* A port already taken: the message names the address and the cause. */
    int fd, port;
    REQUIRE(dp_tcp_listen("127.0.0.1:0", 0, &fd, &port, &err) == 0);
    char taken[32];
    snprintf(taken, sizeof taken, "127.0.0.1:%d", port);
    const char *busy[2] = {taken, "127.0.0.1:1"};
    CHECK(try_open(0, 2, busy, key, 32, 0, &err) == -1);
    CHECKF(strstr(err.msg, taken) && strstr(err.msg, "in use"), "%s", err.msg);
    close(fd);

    /* Nobody listening: the dialer gives up at its deadline with the cause. */
    REQUIRE(dp_tcp_listen("127.0.0.1:0", 0, &fd, &port, &err) == 0);
    close(fd);
    snprintf(taken, sizeof taken, "127.0.0.1:%d", port);
    const char *gone[2] = {"127.0.0.1:0", taken};
    dp_tcp_config cfg;
    dp_tcp_config_init(&cfg);
    cfg.rank = 0;
    cfg.n_ranks = 2;
    cfg.addrs = gone;
    cfg.secret = (const unsigned char *)key;
    cfg.secret_len = 32;
    dp_transport *t;
    REQUIRE(dp_tcp_open(&cfg, &t, &err) == 0);
    double t0 = dp_now();
    CHECK(dp_transport_connect(t, 1, dp_now() + 0.5, &err) == -1);
    CHECKF(strstr(err.msg, "refused") && strstr(err.msg, taken), "%s", err.msg);
    CHECK(dp_now() - t0 < 30); /* the deadline, not a hang */
    dp_transport_close(t);
    return CHECK_DONE();
}
