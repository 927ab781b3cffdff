/* Asking a running task for its cluster's spec (docs/transport.md, "Asking
 * for the cluster spec"; `downpour run --join HOST:PORT`): a task of a
 * 2-rank TCP transport that serves a spec hands it, byte for byte, to a
 * caller with the secret, also one of several handshake frames (5,000
 * bytes); a caller with another secret gets nothing and a message that
 * says why; a task that serves no spec, or one whose spec is above the
 * 1 MiB a query takes (it warns at open and runs on), refuses; nothing
 * listening is a clear error naming the address.  (tests/test_join.c joins a running job
 * by `run --join HOST:PORT`.) */
#include "check.h"

#include "downpour/tcp.h"
#include "downpour/transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const unsigned char secret[] = "0123456789abcdef0123456789abcdef";
static const unsigned char other[] = "fedcba9876543210fedcba9876543210";
static const char *const names[2] = {"worker:0", "worker:1"};

/* Rank 1 of a 2-rank job at addrs, serving spec (NULL: none). */
static dp_transport *open_task(const char *const *addrs, int fd, const char *spec)
{
    dp_tcp_config cfg;
    dp_tcp_config_init(&cfg);
    cfg.rank = 1;
    cfg.n_ranks = 2;
    cfg.addrs = addrs;
    cfg.names = names;
    cfg.secret = secret;
    cfg.secret_len = sizeof secret - 1;
    cfg.listen_fd = fd;
    cfg.spec_json = spec;
    dp_transport *t = NULL;
    dp_err err;
    if (dp_tcp_open(&cfg, &t, &err) < 0)
        fprintf(stderr, "dp_tcp_open: %s\n", err.msg);
    return t;
}

int main(void)
{
    dp_err err;
    int fd, port;
    REQUIRE(dp_tcp_listen("127.0.0.1:0", 0, &fd, &port, &err) == 0);
    char self[32], addr0[32] = "127.0.0.1:1"; /* rank 0 never runs here */
    snprintf(self, sizeof self, "127.0.0.1:%d", port);
    const char *addrs[2] = {addr0, self};

    /* 5,000 bytes: five SPEC frames of the handshake's 1,024 and a short one */
    char *big = malloc(5001);
    REQUIRE(big);
    int n = snprintf(big, 5001, "{\"cluster\": {\"worker\": [\"%s\", \"%s\"", addr0, self);
    while (n < 4990)
        n += snprintf(big + n, 5001 - (size_t)n, ", \"10.0.0.%d:2222\"", n % 250);
    snprintf(big + n, 5001 - (size_t)n, "]}}");
    dp_transport *t = open_task(addrs, fd, big);
    REQUIRE(t);

    char *json = NULL;
    int rc = dp_tcp_query_spec(self, secret, sizeof secret - 1, 5, &json, &err);
    CHECKF(rc == 0 && json && strcmp(json, big) == 0, "the spec asked with the secret: %s",
           rc == 0 ? "other bytes than served" : err.msg);
    fprintf(stderr, "spec of %zu bytes: %s\n", strlen(big), rc == 0 ? "as served" : err.msg);
    free(json);

    json = NULL;
    rc = dp_tcp_query_spec(self, other, sizeof other - 1, 5, &json, &err);
    CHECKF(rc < 0 && !json && strstr(err.msg, "holds another cluster secret") &&
               strstr(err.msg, self),
           "another secret: rc %d, %s", rc, rc < 0 ? err.msg : "a spec came back");
    fprintf(stderr, "another secret: %s\n", err.msg);
    dp_transport_close(t);

    /* a task that serves none, and one whose spec is one byte too long */
    char *huge = malloc((1u << 20) + 2);
    REQUIRE(huge);
    memset(huge, ' ', (1u << 20) + 1);
    huge[(1u << 20) + 1] = '\0';
    for (int k = 0; k < 2; k++) {
        REQUIRE(dp_tcp_listen("127.0.0.1:0", 0, &fd, &port, &err) == 0);
        snprintf(self, sizeof self, "127.0.0.1:%d", port);
        t = open_task(addrs, fd, k ? huge : NULL);
        REQUIRE(t);
        rc = dp_tcp_query_spec(self, secret, sizeof secret - 1, 5, &json, &err);
        CHECKF(rc < 0 && strstr(err.msg, "serves no cluster spec"), "%s: rc %d, %s",
               k ? "a spec above 1 MiB" : "no spec served", rc,
               rc < 0 ? err.msg : "a spec came back");
        fprintf(stderr, "%s: %s\n", k ? "a spec above 1 MiB" : "no spec served", err.msg);
        dp_transport_close(t);
    }
    free(huge);

    /* nothing there: the port just closed */
    rc = dp_tcp_query_spec(self, secret, sizeof secret - 1, 2, &json, &err);
    CHECKF(rc < 0 && strstr(err.msg, "cannot reach") && strstr(err.msg, self),
           "nothing listening: rc %d, %s", rc, rc < 0 ? err.msg : "a spec came back");
    fprintf(stderr, "nothing listening: %s\n", err.msg);
    free(big);
    return check_failures ? 1 : 0;
}
