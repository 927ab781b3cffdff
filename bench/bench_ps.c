/* Parameter-server update rate against the transport's own throughput, and
 * the frame MAC's cost on it (docs/transport.md, "Frame MAC").
 *
 * Two processes per mode on loopback: a worker and a ps holding all 266,610
 * parameters of mlp-300-100.  First the baseline: the worker sends a frame
 * of the model's size and the other process sends one back (what a push and
 * its parameters cost on the wire, with no server work).  Then Downpour SGD
 * proper: pushes of the gradient, each applied with Adam on the server and
 * answered with fresh parameters.  The modes (CRC only, MAC, and with
 * DP_BENCH_ENCRYPT=1 MAC + encryption) run in the same program, their timings
 * taken in turn (CRC, MAC, ... CRC, MAC), so the MAC's cost is the median of
 * pairs taken moments apart: the figure beside its bound.  Prints pushes per
 * second, both rates in MB/s, and the fraction.  Medians of REPEATS timings.
 *
 *   bench_ps [--pushes N] [--repeats N]
 *   DP_BENCH_INSECURE=1: CRC-only frames alone; DP_BENCH_ENCRYPT=1: adds
 *   encrypted payloads */
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
/* Issue 9's bound: the frame MAC may cost under 5 % of ps-async throughput. */
#define MAC_BOUND 0.05

enum { MODE_CRC, MODE_MAC, MODE_ENC, N_MODES };
static const char *const mode_name[N_MODES] = {"CRC only", "MAC", "MAC + encryption"};

/* One mode: this process's worker side and its forked ps. */
typedef struct rig {
    int on;
    pid_t pid;
    dp_cluster c;
    dp_ps_layout layout;
    dp_transport *t;
    dp_ps_client *client;
    double echo_t[MAX_REPEATS], push_t[MAX_REPEATS];
} rig;

static int open_transport(const dp_cluster *c, int rank, const dp_secret *secret, int mode,
                          dp_transport **t, dp_err *err)
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
    tc.secret_len = mode == MODE_CRC ? 0 : secret->len;
    tc.insecure = mode == MODE_CRC;
    tc.encrypt = mode == MODE_ENC;
    if (dp_tcp_open(&tc, t, err) < 0)
        return -1;
    return dp_transport_connect_all(*t, dp_now() + 30, err);
}

/* The ps process: echoes `echoes` frames, then serves until the worker is done. */
static int ps_main(const rig *g, int mode, const dp_secret *secret, const float *init, size_t n,
                   long echoes)
{
    dp_err err;
    dp_transport *t;
    float *buf = malloc(n * sizeof *buf);
    if (!buf || open_transport(&g->c, 1, secret, mode, &t, &err) < 0) {
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
    int rc = dp_ps_serve(t, &g->c, &g->layout, &pc, &oc, &start, n, &err);
    if (rc < 0)
        fprintf(stderr, "bench_ps (ps): %s\n", err.msg);
    dp_transport_close(t);
    free(buf);
    return rc < 0;
}

static double median_of(const double *v, int n)
{
    double w[MAX_REPEATS];
    memcpy(w, v, (size_t)n * sizeof *v);
    return bench_median(w, n);
}

int main(int argc, char **argv)
{
    long pushes = 300;
    int repeats = 5;
    if (bench_push_args(argc, argv, "bench_ps", MAX_REPEATS, &pushes, &repeats) != 0)
        return 2;
    rig rigs[N_MODES] = {{0}};
    rigs[MODE_CRC].on = 1;
    rigs[MODE_MAC].on = !(getenv("DP_BENCH_INSECURE") && atoi(getenv("DP_BENCH_INSECURE")));
    rigs[MODE_ENC].on = rigs[MODE_MAC].on && getenv("DP_BENCH_ENCRYPT") &&
                        atoi(getenv("DP_BENCH_ENCRYPT"));
    dp_err err;
    dp_model m;
    dp_secret secret;
    int ports[2 * N_MODES];
    dp_ps_config pc;
    dp_ps_config_init(&pc);
    if (dp_model_init(&m, "mlp-300-100", 1, 1, &err) < 0 ||
        dp_launch_free_ports(ports, NULL, 2 * N_MODES, &err) < 0 ||
        dp_secret_generate(&secret, NULL, 0, &err) < 0) {
        fprintf(stderr, "bench_ps: %s\n", err.msg);
        return 1;
    }
    for (int k = 0; k < N_MODES; k++)
        if (rigs[k].on && (dp_cluster_local(&rigs[k].c, 0, 1, 1, ports + 2 * k, &err) < 0 ||
                           dp_ps_layout_make(&rigs[k].layout, &rigs[k].c, m.n_params, &pc, &err) < 0)) {
            fprintf(stderr, "bench_ps: %s\n", err.msg);
            return 1;
        }
    dp_model_init_params(&m, 1);
    size_t n = m.n_params, bytes = n * sizeof(float);
    long echoes = pushes * repeats + pushes / 10 + 1;
    /* Every ps is forked before this process starts a transport's threads. */
    for (int k = 0; k < N_MODES; k++) {
        if (!rigs[k].on)
            continue;
        rigs[k].pid = fork();
        if (rigs[k].pid == 0)
            _exit(ps_main(&rigs[k], k, &secret, m.params, n, echoes));
    }

    int status = 1;
    for (int k = 0; k < N_MODES; k++)
        if (rigs[k].on && open_transport(&rigs[k].c, 0, &secret, k, &rigs[k].t, &err) < 0)
            goto fail;
    /* Each repeat times every mode in turn, so a pair is taken moments apart. */
    for (int r = -1; r < repeats; r++) { /* r = -1 warms up */
        long reps = r < 0 ? pushes / 10 + 1 : pushes;
        for (int k = 0; k < N_MODES; k++) {
            if (!rigs[k].on)
                continue;
            double t0 = dp_now();
            for (long i = 0; i < reps; i++) {
                dp_event ev;
                if (dp_transport_send(rigs[k].t, 1, ECHO, 0, 0, m.params, bytes, &err) < 0 ||
                    dp_transport_recv(rigs[k].t, 1, "echo", 60, &ev, &err) < 0 ||
                    dp_transport_recv_payload(rigs[k].t, 1, m.grads, bytes, &err) < 0)
                    goto fail;
            }
            if (r >= 0)
                rigs[k].echo_t[r] = (dp_now() - t0) / reps;
        }
    }
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_ADAM);
    for (int k = 0; k < N_MODES; k++)
        if (rigs[k].on &&
            dp_ps_client_open(&rigs[k].client, rigs[k].t, &rigs[k].layout, &pc, &oc, n, &err) < 0)
            goto fail;
    memset(m.grads, 0, bytes);
    for (size_t i = 0; i < n; i += 97)
        m.grads[i] = 1e-3f;
    for (int r = -1; r < repeats; r++) {
        long reps = r < 0 ? pushes / 10 + 1 : pushes;
        for (int k = 0; k < N_MODES; k++) {
            if (!rigs[k].on)
                continue;
            double t0 = dp_now();
            for (long i = 0; i < reps; i++)
                if (dp_ps_client_step(rigs[k].client, m.params, m.grads, 128, 1.0f, &err) < 0)
                    goto fail;
            if (r >= 0)
                rigs[k].push_t[r] = (dp_now() - t0) / reps;
        }
    }
    for (int k = 0; k < N_MODES; k++)
        if (rigs[k].on && dp_transport_send(rigs[k].t, 1, DP_WIRE_DONE, 0, 0, NULL, 0, &err) < 0)
            goto fail;
    printf("model mlp-300-100: %zu parameters, %.2f MB each way per push; medians of %d runs\n", n,
           bytes / 1e6, repeats);
    printf("%-17s %28s %36s %10s\n", "", "round trip (no server work)",
           "ps-async push + Adam + params back", "fraction");
    for (int k = 0; k < N_MODES; k++) {
        if (!rigs[k].on)
            continue;
        double e = median_of(rigs[k].echo_t, repeats), p = median_of(rigs[k].push_t, repeats);
        printf("%-17s %9.0f /s %10.0f MB/s %13.0f /s %14.0f MB/s %9.1f%%\n", mode_name[k], 1 / e,
               2 * bytes / e / 1e6, 1 / p, 2 * bytes / p / 1e6, 100 * e / p);
    }
    /* The cost of each keyed mode: 1 - its push rate over CRC-only's, pair by pair. */
    for (int k = MODE_MAC; k < N_MODES; k++) {
        if (!rigs[k].on)
            continue;
        double cost[MAX_REPEATS];
        for (int r = 0; r < repeats; r++)
            cost[r] = 1 - rigs[MODE_CRC].push_t[r] / rigs[k].push_t[r];
        double c = bench_median(cost, repeats);
        if (k == MODE_MAC)
            printf("%s cost on ps-async pushes/s: %.1f %% (median of %d pairs, %.1f to %.1f); "
                   "bound: under %.0f %%: %s\n",
                   mode_name[k], 100 * c, repeats, 100 * cost[0], 100 * cost[repeats - 1],
                   100 * MAC_BOUND, c < MAC_BOUND ? "met" : "NOT met");
        else
            printf("%s cost on ps-async pushes/s: %.1f %% (median of %d pairs, %.1f to %.1f)\n",
                   mode_name[k], 100 * c, repeats, 100 * cost[0], 100 * cost[repeats - 1]);
    }
    status = 0;
fail:
    if (status)
        fprintf(stderr, "bench_ps: %s\n", err.msg);
    for (int k = 0; k < N_MODES; k++) {
        if (!rigs[k].on)
            continue;
        dp_ps_client_free(rigs[k].client);
        dp_transport_close(rigs[k].t);
        if (status)
            kill(rigs[k].pid, SIGKILL);
        int ws;
        waitpid(rigs[k].pid, &ws, 0);
        dp_cluster_free(&rigs[k].c);
    }
    dp_model_free(&m);
    return status;
}
