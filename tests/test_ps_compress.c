/* Compressed pushes and answers of the parameter servers (docs/strategies.md,
 * "ps family: compression"), on the in-process transport, one worker
 * against two ps shards (threads):
 * - ps-async with bf16 pushes (and bf16 answers, --ps-reply bf16) ends with
 *   the parameters of one process applying, step by step, the bf16-rounded
 *   gradient plus its error-feedback residual, bit for bit; so do fp16 and
 *   topk (the k largest of each shard's slice, chosen here by hand); with
 *   --ps-replicas 2 and ps:1 crashed after the first step too (the coded
 *   push re-sent to the backup, the primary's forwarded in fp32);
 * - topk:0.05 with error feedback converges on a quadratic, to the optimum
 *   within what the uncompressed run reaches; without the residual (each
 *   push's dropped part lost) it does not;
 * - the bytes a step puts on the wire equal the formula, frame by frame:
 *   per shard of n floats, PUSH_CODED 48 + 16 + 8 + 2n (bf16, fp16) or
 *   8 ceil(ratio n) (topk), PARAMS 48 + 4n or PARAMS16 48 + 2n;
 * - a coded block of another codec, count or length, or with an index out
 *   of the shard, is refused naming what is wrong, and its worker dropped;
 * - the program: auto with --ps-reply bf16, powersgd, model-avg (pushes
 *   coded, or answers topk) and a bad --ps-reply refused
 *   with exit 2 and why; --ps-reply under a strategy without servers too;
 *   and with MNIST, ps-async (chief, 1 worker, 1 ps) with bf16 pushes and
 *   answers reaches the uncompressed run's test accuracy within 1 %. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ps_capture.h"
#include "ps_rig.h"
#include "proc.h"
#include "downpour/compress.h"
#include "downpour/frame.h"
#include "downpour/inproc.h"
#include "downpour/log.h"
#include "downpour/optim.h"
#include "downpour/ps.h"
#include "downpour/wire.h"

#define NP 4096 /* two shards of 2048 */
#define STEPS 40

static dp_err err;

#include "ps_quadratic.h"

static void rig_open(rig *r, const dp_compress *cz, int reply16, int threads, int replicas)
{
    rig_begin(r, 22000, cz);
    r->cfg.reply16 = reply16;
    r->cfg.replicas = replicas;
    rig_open_servers(r, start_params(), NP);
    if (threads)
        rig_serve(r);
}

/* ps task k's thread stops serving, then its process "crashes": its
 * shard goes on on its backup (the other ps task). */
/* One process doing what the compressed run should: v = g + resid, sent
 * q = the codec's rounding of v (topk: the k of each shard's slice largest
 * in magnitude, the lower index first on ties, chosen here by plain
 * selection), resid = v - q, sgd applies q; the worker computes on the
 * answers (bf16-rounded with reply16).  ef 0: no residual kept. */
static void reference(const dp_compress *cz, int reply16, int ef, int steps, float *server)
{
    static float p[NP], pw[NP], g[NP], v[NP], q[NP], resid[NP];
    static char taken[NP];
    memcpy(p, start_params(), sizeof p);
    memcpy(pw, p, sizeof pw);
    memset(resid, 0, sizeof resid);
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_SGD);
    oc.lr = 0.05f;
    dp_optim o;
    REQUIRE(dp_optim_init(&o, &oc, NP, &err) == 0);
    for (int step = 0; step < steps; step++) {
        grad_at(pw, step, g);
        for (int i = 0; i < NP; i++)
            v[i] = g[i] + (ef ? resid[i] : 0.0f);
        if (cz->kind == DP_COMPRESS_TOPK) {
            memset(q, 0, sizeof q);
            memset(taken, 0, sizeof taken);
            for (int s = 0; s < 2; s++) {
                int lo = s * NP / 2, n = NP / 2;
                size_t k = dp_topk_count(cz->ratio, (size_t)n);
                for (size_t j = 0; j < k; j++) {
                    int best = -1;
                    for (int i = lo; i < lo + n; i++)
                        if (!taken[i] && (best < 0 || fabsf(v[i]) > fabsf(v[best])))
                            best = i;
                    taken[best] = 1;
                    q[best] = v[best];
                }
            }
        } else {
            for (int i = 0; i < NP; i++)
                q[i] = cz->kind == DP_COMPRESS_BF16 ? dp_bf16_to_f32(dp_f32_to_bf16(v[i]))
                       : cz->kind == DP_COMPRESS_FP16 ? dp_fp16_to_f32(dp_f32_to_fp16(v[i]))
                                                       : v[i];
        }
        for (int i = 0; i < NP; i++)
            resid[i] = v[i] - q[i];
        dp_optim_apply(&o, p, q, oc.lr);
        for (int i = 0; i < NP; i++)
            pw[i] = reply16 ? dp_bf16_to_f32(dp_f32_to_bf16(p[i])) : p[i];
    }
    memcpy(server, p, sizeof p);
    dp_optim_free(&o);
}

/* The bytes of one ps-async step of the worker, frame by frame. */
static void bytes_by_hand(const rig *r, uint64_t *sent, uint64_t *recv)
{
    *sent = *recv = 0;
    for (int s = 0; s < 2; s++) {
        uint64_t n = r->layout.range[s].hi - r->layout.range[s].lo;
        uint64_t body = r->cfg.compress.kind == DP_COMPRESS_NONE ? 4 * n
                        : r->cfg.compress.kind == DP_COMPRESS_TOPK
                            ? 8 + 8 * (uint64_t)ceil(r->cfg.compress.ratio * (double)n)
                            : 8 + 2 * n;
        *sent += DP_FRAME_HEADER_SIZE + DP_PUSH_HEAD_SIZE + body;
        *recv += DP_FRAME_HEADER_SIZE + (r->cfg.reply16 ? 2 : 4) * n;
    }
}

/* STEPS steps of the worker; the chief pulls the servers' parameters. */
/* crash: with --ps-replicas 2, ps:1 crashes after step 0 (the worker
 * re-sends its coded push to the backup, which applies it). */
static void run(const dp_compress *cz, int reply16, int crash, float *server, float *worker,
                uint64_t *step_sent, uint64_t *step_recv)
{
    rig r;
    rig_open(&r, cz, reply16, 1, crash ? 2 : 1);
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_SGD);
    oc.lr = 0.05f;
    dp_ps_client *w, *chief;
    REQUIRE(dp_ps_client_open(&w, r.ts[1], &r.layout, &r.cfg, &oc, NP, &err) == 0);
    REQUIRE(dp_ps_client_open(&chief, r.ts[0], &r.layout, &r.cfg, &oc, NP, &err) == 0);
    CHECK((dp_ps_client_residual(w) != NULL) == (cz->kind != DP_COMPRESS_NONE));
    static float params[NP], g[NP];
    memcpy(params, start_params(), sizeof params);
    for (int step = 0; step < STEPS; step++) {
        grad_at(params, step, g);
        dp_transport_stats a, b;
        REQUIRE(dp_transport_stats_get(r.ts[1], DP_PEER_ANY, &a) == 0);
        if (dp_ps_client_step(w, params, g, 1, oc.lr, &err) < 0) {
            fprintf(stderr, "step: %s\n", err.msg);
            exit(1);
        }
        REQUIRE(dp_transport_stats_get(r.ts[1], DP_PEER_ANY, &b) == 0);
        if (crash) {
            if (step == 0)
                crash_ps(&r, 1);
            continue;
        }
        uint64_t sent, recv;
        bytes_by_hand(&r, &sent, &recv);
        CHECKF(b.bytes_sent - a.bytes_sent == sent && b.bytes_recv - a.bytes_recv == recv,
               "%s reply16 %d: step %d moved %llu / %llu bytes; by hand %llu / %llu",
               dp_compress_kind_name(cz->kind), reply16, step,
               (unsigned long long)(b.bytes_sent - a.bytes_sent),
               (unsigned long long)(b.bytes_recv - a.bytes_recv), (unsigned long long)sent,
               (unsigned long long)recv);
        *step_sent = sent;
        *step_recv = recv;
    }
    memcpy(worker, params, sizeof params);
    if (dp_ps_client_pull(chief, server, 0, &err) < 0) {
        fprintf(stderr, "pull: %s\n", err.msg);
        exit(1);
    }
    dp_ps_client_free(w);
    dp_ps_client_free(chief);
    rig_close(&r, 1);
}

static double dist(const float *p)
{
    double d = 0;
    for (int i = 0; i < NP; i++)
        d = fmax(d, fabs((double)p[i] - (double)target(i)));
    return d;
}

static void equals_one_process(const char *spec, int reply16, int crash, uint64_t *sent,
                               uint64_t *recv)
{
    dp_compress cz;
    REQUIRE(dp_compress_parse(spec, &cz, &err) == 0);
    static float server[NP], worker[NP], ref[NP];
    run(&cz, reply16, crash, server, worker, sent, recv);
    reference(&cz, reply16, 1, STEPS, ref);
    CHECKF(memcmp(server, ref, sizeof ref) == 0,
           "%s reply16 %d%s: the servers' parameters are not one process's with the same "
           "rounded gradients and residual", spec, reply16, crash ? ", ps:1 crashed" : "");
    for (int i = 0; i < NP; i++) {
        float want = reply16 ? dp_bf16_to_f32(dp_f32_to_bf16(server[i])) : server[i];
        if (memcmp(&want, &worker[i], sizeof want) != 0) {
            CHECKF(0, "%s reply16 %d: the worker's parameter %d is %.9g, the servers' answer "
                      "%.9g", spec, reply16, i, (double)worker[i], (double)want);
            break;
        }
    }
}

/* topk with the residual fed back converges where the uncompressed run
 * does (on a quadratic of curvature 1, 400 steps); without it the dropped
 * part of each push is lost for good and it stalls. */
static void topk_converges(void)
{
    dp_compress none = {DP_COMPRESS_NONE, 0, 0}, topk = {DP_COMPRESS_TOPK, 0.05, 0};
    static float a[NP], b[NP], c[NP];
    flat = 1;
    reference(&none, 0, 1, 400, a);
    reference(&topk, 0, 1, 400, b);
    reference(&topk, 0, 0, 400, c);
    flat = 0;
    double d0 = dist(start_params()), da = dist(a), db = dist(b), dc = dist(c);
    printf("largest distance to the optimum after 400 steps: start %.4g, f32 %.4g, topk:0.05 "
           "with error feedback %.4g, without %.4g\n", d0, da, db, dc);
    CHECKF(db < 0.01 * d0 && db < da + 0.01 * d0,
           "topk with error feedback: %g of %g left (f32: %g)", db, d0, da);
    CHECKF(dc > 10 * db, "topk without error feedback (%g) should stay further than with (%g)",
           dc, db);
}

/* ------------------------------------------------------------ bad blocks */

static char captured[8192];

static int poll_captured(dp_ps_server *s)
{
    return ps_poll_captured(s, captured, sizeof captured, &err);
}

static void bad_blocks_refused(void)
{
    dp_compress topk = {DP_COMPRESS_TOPK, 0.01, 0}, bf16 = {DP_COMPRESS_BF16, 0, 0};
    size_t n = NP / 2, k = dp_topk_count(0.01, n), len = dp_coded_bytes(&topk, n);
    static uint8_t blk[8 + 8 * NP];
    static float out[NP];
    dp_put_u32(blk, DP_COMPRESS_TOPK);
    dp_put_u32(blk + 4, (uint32_t)k);
    for (size_t j = 0; j < k; j++) {
        dp_put_u32(blk + 8 + 8 * j, (uint32_t)(j * 3));
        dp_put_f32(blk + 12 + 8 * j, 1.0f);
    }
    CHECK(dp_coded_decode(&topk, blk, len, out, n, &err) == 0 && out[3] == 1.0f && out[1] == 0);
    CHECK(dp_coded_decode(&topk, blk, len - 8, out, n, &err) < 0 && strstr(err.msg, "bytes"));
    CHECK(dp_coded_decode(&bf16, blk, 8 + 2 * n, out, n, &err) < 0 &&
          strstr(err.msg, "a block coded as topk; this run's --compress is bf16"));
    dp_put_u32(blk + 4, (uint32_t)k + 1);
    CHECK(dp_coded_decode(&topk, blk, len, out, n, &err) < 0 && strstr(err.msg, "says"));
    dp_put_u32(blk + 4, (uint32_t)k);
    dp_put_u32(blk + 8 + 8 * (k - 1), (uint32_t)n);
    CHECKF(dp_coded_decode(&topk, blk, len, out, n, &err) < 0 &&
               strstr(err.msg, "names element 2048 of a bucket of 2048"),
           "an index out of the shard: %s", err.msg);

    /* on the wire: the server drops the worker, naming it and the fault */
    rig r;
    rig_open(&r, &topk, 0, 0, 1);
    uint8_t head[DP_PUSH_HEAD_SIZE];
    dp_push_head h = {1, 1, 0.1f, 0};
    dp_push_head_put(head, &h);
    struct iovec iov[2] = {{head, sizeof head}, {blk, len}};
    REQUIRE(dp_transport_sendv(r.ts[1], r.ps0, DP_WIRE_PUSH_CODED, 0, r.layout.range[0].lo, iov,
                               2, &err) == 0);
    CHECK(poll_captured(r.s[0]) == 0);
    CHECKF(strstr(captured, "worker:0") && strstr(captured, "bad coded gradient") &&
               strstr(captured, "names element 2048"),
           "a bad index on the wire: %s", captured);
    CHECK(dp_ps_server_updates(r.s[0]) == 0);
    rig_close(&r, 0);
}

/* ------------------------------------------------------------ the program */

static char out[16384];

static void program(void)
{
    const char *bin = test_bin(), *tmp = test_tmp();
    if (!bin || !tmp)
        return;
    static const struct {
        const char *args, *says;
    } bad[] = {
        {"--strategy ps-async --compress auto --ps-reply bf16", "auto chooses the answers"},
        {"--strategy model-avg --ps-reply topk:0.1", "cannot know what a worker holds"},
        {"--strategy ps-async --ps-reply topk:2", "--ps-reply"},
        {"--strategy ps-sync --compress powersgd:2", "a server cannot sum them"},
        {"--strategy model-avg --compress topk:0.1", "model-avg pushes parameters"},
        {"--strategy ps-async --ps-reply fp8", "--ps-reply: 'fp8' is not f32, bf16, delta4 or topk"},
        {"--strategy allreduce --ps-reply bf16", "strategy allreduce has no parameter servers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = run_cmd(out, sizeof out, "%s train %s", bin, bad[i].args);
        CHECKF(rc == 2 && strstr(out, bad[i].says), "train %s: exit %d: %s", bad[i].args, rc,
               out);
    }
    char probe[1200];
    if (!have_mnist(probe, sizeof probe))
        return;
    const char *run = "launch --chief --workers 1 --ps 1 -- train --strategy ps-async --dataset "
                      "mnist --model 784-64-10 --train-size 3000 --val-size 500 --test-size "
                      "1000 --epochs 2 --batch 50 --log-every 0 --no-progress --threads 1";
    int rc = run_cmd(out, sizeof out, "%s %s --metrics %s/none.jsonl", bin, run, tmp);
    CHECKF(rc == 0, "ps-async: exit %d: %s", rc, out);
    rc = run_cmd(out, sizeof out, "%s %s --compress bf16 --ps-reply bf16 --metrics %s/bf16.jsonl",
                 bin, run, tmp);
    CHECKF(rc == 0, "ps-async --compress bf16 --ps-reply bf16: exit %d: %s", rc, out);
    char a[1300], b[1300];
    snprintf(a, sizeof a, "%s/none.jsonl", tmp);
    snprintf(b, sizeof b, "%s/bf16.jsonl", tmp);
    double none = done_accuracy(a), bf16 = done_accuracy(b);
    printf("ps-async, MNIST 784-64-10, 2 epochs: test accuracy %.4f uncompressed, %.4f with bf16 "
           "pushes and answers\n", none, bf16);
    CHECKF(none > 0.5 && fabs(bf16 - none) <= 0.01 * none, "test accuracy %g against %g", bf16,
           none);
}

int main(void)
{
    dp_log_set_level(DP_LOG_WARN);
    uint64_t sent[5], recv[5];
    equals_one_process("none", 0, 0, &sent[0], &recv[0]);
    equals_one_process("bf16", 0, 0, &sent[1], &recv[1]);
    equals_one_process("bf16", 1, 0, &sent[2], &recv[2]);
    equals_one_process("fp16", 0, 0, &sent[3], &recv[3]);
    equals_one_process("topk:0.01", 1, 0, &sent[4], &recv[4]);
    uint64_t ignored[2];
    equals_one_process("topk:0.01", 1, 1, &ignored[0], &ignored[1]);
    equals_one_process("bf16", 0, 1, &ignored[0], &ignored[1]);
    printf("bytes a step of %d parameters in 2 shards, sent / received: f32 %llu / %llu, bf16 "
           "%llu / %llu, bf16 with --ps-reply bf16 %llu / %llu, topk:0.01 with it %llu / %llu\n",
           NP, (unsigned long long)sent[0], (unsigned long long)recv[0],
           (unsigned long long)sent[1], (unsigned long long)recv[1], (unsigned long long)sent[2],
           (unsigned long long)recv[2], (unsigned long long)sent[4], (unsigned long long)recv[4]);
    if (!SANITIZED) /* arithmetic of one process: the plain build's */
        topk_converges();
    bad_blocks_refused();
    program();
    return CHECK_DONE();
}
