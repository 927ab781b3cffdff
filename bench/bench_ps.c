/* Parameter-server update rate against the transport's own throughput.
 *
 * Two processes on loopback: a worker and a ps holding all 266,610
 * parameters of mlp-300-100.  First the baseline: the worker sends a frame
 * of the model's size and the other process sends one back (what a push and
 * its parameters cost on the wire, with no server work).  Then Downpour SGD
 * proper: pushes of the gradient, each applied with Adam on the server and
 * answered with fresh parameters.  Prints pushes per second, both rates in
 * MB/s, and the fraction.  Medians of REPEATS timings.
 *
 *   bench_ps [--pushes N] [--repeats N]
 *   DP_BENCH_INSECURE=1: CRC-only frames; DP_BENCH_ENCRYPT=1: encrypted payloads */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "downpour/wire.h"
#include "bench.h"
#include "downpour/clock.h"
#include "downpour/cluster.h"
#include "downpour/launcher.h"
#include "downpour/model.h"
#include "downpour/ps.h"
#include "downpour/secret.h"
#include "downpour/tcp.h"

#define MAX_REPEATS 15
#define ECHO DP_FRAME_APP(200)

static int open_transport(const dp_cluster *c, int rank, const dp_secret *secret, dp_transport **t,
                          dp_err *err)
{
    const char *addrs[2] = {c->tasks[0].addr, c->tasks[1].addr};
    const char *names[2] = {c->tasks[0].name, c->tasks[1].name};
    dp_tcp_config tc;
    dp_tcp_config_init(&tc);
    tc.rank = rank;
    tc.n_ranks = 2;
    tc.addrs = addrs;
    tc.names = names;
    tc.secret = secret->bytes;
    tc.secret_len = secret->len;
    /* The frame MAC's cost (docs/transport.md): DP_BENCH_INSECURE=1 runs CRC
     * only, DP_BENCH_ENCRYPT=1 adds encryption. */
    if (getenv("DP_BENCH_INSECURE") && atoi(getenv("DP_BENCH_INSECURE"))) {
        tc.secret_len = 0;
        tc.insecure = 1;
    }
    tc.encrypt = getenv("DP_BENCH_ENCRYPT") && atoi(getenv("DP_BENCH_ENCRYPT"));
    if (dp_tcp_open(&tc, t, err) < 0)
        return -1;
    return dp_transport_connect_all(*t, dp_now() + 30, err);
}

/* The ps process: echoes `echoes` frames, then serves until the worker is done. */
static int ps_main(const dp_cluster *c, const dp_secret *secret, const dp_ps_layout *layout,
                   const float *init, size_t n, long echoes)
{
    dp_err err;
    dp_transport *t;
    float *buf = malloc(n * sizeof *buf);
    if (!buf || open_transport(c, 1, secret, &t, &err) < 0) {
        fprintf(stderr, "bench_ps (ps): %s\n", buf ? err.msg : "out of memory");
        return 1;
    }
    for (long i = 0; i < echoes; i++) {
        dp_event ev;
        if (dp_transport_recv(t, 0, "echo", 60, &ev, &err) < 0 ||
            dp_transport_recv_payload(t, 0, buf, n * sizeof *buf, &err) < 0 ||
            dp_transport_send(t, 0, ECHO, 0, 0, buf, n * sizeof *buf, &err) < 0) {
            fprintf(stderr, "bench_ps (ps): %s\n", err.msg);
            return 1;
        }
    }
    dp_ps_config pc;
    dp_ps_config_init(&pc);
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_ADAM);
    dp_ps_start start = {.params = init};
    int rc = dp_ps_serve(t, c, layout, &pc, &oc, &start, n, &err);
    if (rc < 0)
        fprintf(stderr, "bench_ps (ps): %s\n", err.msg);
    dp_transport_close(t);
    free(buf);
    return rc < 0;
}

int main(int argc, char **argv)
{
    long pushes = 300;
    int repeats = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--pushes") == 0)
            pushes = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--repeats") == 0)
            repeats = atoi(argv[i + 1]);
    }
    if (pushes < 1 || repeats < 1 || repeats > MAX_REPEATS) {
        fprintf(stderr, "usage: bench_ps [--pushes N>=1] [--repeats 1..%d]\n", MAX_REPEATS);
        return 2;
    }
    dp_err err;
    dp_model m;
    dp_cluster c;
    dp_secret secret;
    dp_ps_layout layout;
    int ports[2];
    dp_ps_config pc;
    dp_ps_config_init(&pc);
    if (dp_model_init(&m, "mlp-300-100", 1, 1, &err) < 0 || dp_launch_free_ports(ports, 2, &err) < 0 ||
        dp_cluster_local(&c, 0, 1, 1, ports, &err) < 0 ||
        dp_secret_generate(&secret, NULL, 0, &err) < 0 ||
        dp_ps_layout_make(&layout, &c, m.n_params, &pc, &err) < 0) {
        fprintf(stderr, "bench_ps: %s\n", err.msg);
        return 1;
    }
    dp_model_init_params(&m, 1);
    size_t n = m.n_params, bytes = n * sizeof(float);
    long echoes = pushes * repeats + pushes / 10 + 1;
    pid_t pid = fork();
    if (pid == 0)
        _exit(ps_main(&c, &secret, &layout, m.params, n, echoes));

    dp_transport *t = NULL;
    dp_ps_client *client = NULL;
    double echo_t[MAX_REPEATS], push_t[MAX_REPEATS];
    int status = 1;
    if (open_transport(&c, 0, &secret, &t, &err) < 0)
        goto fail;
    for (int r = -1; r < repeats; r++) { /* r = -1 warms up */
        long k = r < 0 ? pushes / 10 + 1 : pushes;
        double t0 = dp_now();
        for (long i = 0; i < k; i++) {
            dp_event ev;
            if (dp_transport_send(t, 1, ECHO, 0, 0, m.params, bytes, &err) < 0 ||
                dp_transport_recv(t, 1, "echo", 60, &ev, &err) < 0 ||
                dp_transport_recv_payload(t, 1, m.grads, bytes, &err) < 0)
                goto fail;
        }
        if (r >= 0)
            echo_t[r] = (dp_now() - t0) / k;
    }
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_ADAM);
    if (dp_ps_client_open(&client, t, &layout, &pc, &oc, n, &err) < 0)
        goto fail;
    memset(m.grads, 0, bytes);
    for (size_t i = 0; i < n; i += 97)
        m.grads[i] = 1e-3f;
    for (int r = -1; r < repeats; r++) {
        long k = r < 0 ? pushes / 10 + 1 : pushes;
        double t0 = dp_now();
        for (long i = 0; i < k; i++)
            if (dp_ps_client_step(client, m.params, m.grads, 128, 1.0f, &err) < 0)
                goto fail;
        if (r >= 0)
            push_t[r] = (dp_now() - t0) / k;
    }
    if (dp_transport_send(t, 1, DP_WIRE_DONE, 0, 0, NULL, 0, &err) < 0)
        goto fail;
    qsort(echo_t, (size_t)repeats, sizeof *echo_t, bench_cmp_double);
    qsort(push_t, (size_t)repeats, sizeof *push_t, bench_cmp_double);
    double e = echo_t[repeats / 2], p = push_t[repeats / 2];
    printf("model mlp-300-100: %zu parameters, %.2f MB each way per push\n", n, bytes / 1e6);
    printf("transport round trip (same bytes, no server work): %8.0f /s  %8.0f MB/s\n", 1 / e,
           2 * bytes / e / 1e6);
    printf("ps-async push + Adam + parameters back:             %8.0f /s  %8.0f MB/s\n", 1 / p,
           2 * bytes / p / 1e6);
    printf("update rate as a fraction of the transport: %.1f%%\n", 100 * e / p);
    status = 0;
fail:
    if (status)
        fprintf(stderr, "bench_ps: %s\n", err.msg);
    dp_ps_client_free(client);
    dp_transport_close(t);
    if (status)
        kill(pid, SIGKILL);
    int ws;
    waitpid(pid, &ws, 0);
    dp_cluster_free(&c);
    dp_model_free(&m);
    return status;
}
