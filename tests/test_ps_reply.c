/* Coded answers of the parameter servers and --compress auto under the ps
 * family (docs/strategies.md, "ps family: compression"), on the in-process
 * transport, one worker against two ps shards of 2048 floats (threads):
 * - ps-async with --ps-reply topk:RATIO (pushes f32, or top-k with error
 *   feedback) ends with the parameters of one process in which the worker's
 *   copy takes, after each step, the ceil(RATIO n) parameters of each shard
 *   farthest from it (ties: the lower index) at the server's values, bit for
 *   bit: the servers' and the worker's, each, and the worker's copy is not
 *   the servers' (what was not sent is still owed);
 * - the bytes of a step equal the formula: PARAMS_CODED 48 + 8 + 8k a shard;
 * - so does --ps-reply delta4 (the copy takes the 4-bit difference of each
 *   shard, with the smallest power-of-two scale), with f32 or top-k pushes;
 * - --compress auto with a link faked at 1000 ns a byte
 *   (DOWNPOUR_TEST_LINK_NS) takes topk:0.1 pushes and 4-bit answers, and its
 *   run is the same one process's bit for bit; the rule on numbers: 80 ns a
 *   byte takes 0.1 for 784-300-100-10, 0.1 ns none;
 * - answers top-k or 4-bit with the mirror converge on a quadratic to the
 *   optimum within what uncompressed answers reach;
 * - a coded answer that is not one (another codec, count, length, an index
 *   past the shard or not increasing; a 4-bit one's scale not a power of
 *   two, a value of -8, a padding nibble) is refused naming what, and
 *   changes nothing; one on the wire fails the worker's step. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "ps_rig.h"
#include "downpour/compress.h"
#include "downpour/frame.h"
#include "downpour/log.h"
#include "downpour/optim.h"
#include "downpour/ps.h"
#include "downpour/testhooks.h"
#include "downpour/wire.h"
#include "downpour/ps_auto.h"

#define NP 4096 /* two shards of 2048 */
#define HALF (NP / 2)
#define STEPS 30
#define D4 (-1.0) /* an answer (reply) of the 4-bit difference, --ps-reply delta4 */

static dp_err err;

#include "ps_quadratic.h"

/* The k of x[lo, lo + n) largest in magnitude (ties: the lower index), by
 * plain selection, marked in taken. */
static void pick(const float *x, int lo, int n, size_t k, char *taken)
{
    for (size_t j = 0; j < k; j++) {
        int best = -1;
        for (int i = lo; i < lo + n; i++)
            if (!taken[i] && (best < 0 || fabsf(x[i]) > fabsf(x[best])))
                best = i;
        taken[best] = 1;
    }
}

/* The 4-bit difference of x[lo, lo + n) from pw, added to pw: the scale
 * the smallest power of two s with 7 s >= max |x - pw|, each value the
 * difference / s rounded to nearest even. */
static void delta4(const float *x, float *pw, int lo, int n)
{
    float most = 0;
    for (int i = lo; i < lo + n; i++)
        most = fmaxf(most, fabsf(x[i] - pw[i]));
    if (most == 0)
        return;
    float sc = 1.0f;
    while (sc * 7.0f < most)
        sc *= 2.0f;
    while (sc * 0.5f * 7.0f >= most)
        sc *= 0.5f;
    for (int i = lo; i < lo + n; i++)
        pw[i] += nearbyintf((x[i] - pw[i]) / sc) * sc;
}

/* One process: the worker computes on its copy pw; pushes v = g + resid
 * (top-k of it with push > 0, else whole), resid = v - sent; sgd applies
 * what was sent; then per shard the answer's k parameters farthest from
 * pw take the server's values (reply D4: pw takes the 4-bit difference). */
static void reference(double push, double reply, int steps, float *server, float *worker)
{
    static float p[NP], pw[NP], g[NP], v[NP], q[NP], resid[NP], d[NP];
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
            v[i] = g[i] + resid[i];
        if (push > 0) {
            memset(taken, 0, sizeof taken);
            for (int s = 0; s < 2; s++)
                pick(v, s * HALF, HALF, dp_topk_count(push, HALF), taken);
            for (int i = 0; i < NP; i++)
                q[i] = taken[i] ? v[i] : 0.0f;
        } else {
            memcpy(q, v, sizeof q);
        }
        for (int i = 0; i < NP; i++)
            resid[i] = v[i] - q[i];
        dp_optim_apply(&o, p, q, oc.lr);
        if (reply == D4) {
            for (int s = 0; s < 2; s++)
                delta4(p, pw, s * HALF, HALF);
        } else if (reply > 0) {
            for (int i = 0; i < NP; i++)
                d[i] = p[i] - pw[i];
            memset(taken, 0, sizeof taken);
            for (int s = 0; s < 2; s++)
                pick(d, s * HALF, HALF, dp_topk_count(reply, HALF), taken);
            for (int i = 0; i < NP; i++)
                if (taken[i])
                    pw[i] = p[i];
        } else {
            memcpy(pw, p, sizeof pw);
        }
    }
    memcpy(server, p, sizeof p);
    memcpy(worker, pw, sizeof pw);
    dp_optim_free(&o);
}

static void rig_open(rig *r, const dp_compress *cz, double reply) /* reply D4: delta4 */
{
    rig_begin(r, 22100, cz);
    r->cfg.reply_topk = reply > 0 ? reply : 0;
    r->cfg.reply_delta4 = reply == D4;
    rig_open_servers(r, start_params(), NP);
}

/* STEPS steps of the worker (auto: after its choice); the chief pulls the
 * servers' parameters.  Checks each step's bytes against the formula for
 * pushes of `push` and answers of `reply` (0: f32). */
static void run(const dp_compress *cz, double reply_cfg, double push, double reply,
                float *server, float *worker)
{
    rig r;
    rig_open(&r, cz, reply_cfg);
    rig_serve(&r);
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_SGD);
    oc.lr = 0.05f;
    dp_ps_client *w, *chief;
    REQUIRE(dp_ps_client_open(&w, r.ts[1], &r.layout, &r.cfg, &oc, NP, &err) == 0);
    REQUIRE(dp_ps_client_open(&chief, r.ts[0], &r.layout, &r.cfg, &oc, NP, &err) == 0);
    static float params[NP], g[NP];
    memcpy(params, start_params(), sizeof params);
    char why[640] = "";
    REQUIRE(dp_ps_client_auto(w, params, why, sizeof why, &err) == 0);
    if (cz->kind == DP_COMPRESS_AUTO) {
        printf("%s\n", why);
        char want[64];
        snprintf(want, sizeof want, "auto: topk:%g pushes, 4-bit", push);
        CHECKF(strstr(why, want) != NULL, "auto chose otherwise: %s", why);
    }
    for (int step = 0; step < STEPS; step++) {
        grad_at(params, step, g);
        dp_transport_stats a, b;
        REQUIRE(dp_transport_stats_get(r.ts[1], DP_PEER_ANY, &a) == 0);
        if (dp_ps_client_step(w, params, g, 1, oc.lr, &err) < 0) {
            fprintf(stderr, "step: %s\n", err.msg);
            exit(1);
        }
        REQUIRE(dp_transport_stats_get(r.ts[1], DP_PEER_ANY, &b) == 0);
        uint64_t sent = 0, recv = 0;
        for (int s = 0; s < 2; s++) {
            uint64_t kp = dp_topk_count(push, HALF), kr = dp_topk_count(fabs(reply), HALF);
            sent += DP_FRAME_HEADER_SIZE + DP_PUSH_HEAD_SIZE + (push > 0 ? 8 + 8 * kp : 4 * HALF);
            recv += DP_FRAME_HEADER_SIZE + (reply == D4  ? 12 + HALF / 2
                                             : reply > 0 ? 8 + 8 * kr
                                                         : 4 * HALF);
        }
        CHECKF(b.bytes_sent - a.bytes_sent == sent && b.bytes_recv - a.bytes_recv == recv,
               "push %g reply %g: step %d moved %llu / %llu bytes; by the formula %llu / %llu",
               push, reply, step, (unsigned long long)(b.bytes_sent - a.bytes_sent),
               (unsigned long long)(b.bytes_recv - a.bytes_recv), (unsigned long long)sent,
               (unsigned long long)recv);
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

static void equals_one_process(const char *push_spec, double reply_cfg, double push,
                               double reply)
{
    dp_compress cz;
    REQUIRE(dp_compress_parse(push_spec, &cz, &err) == 0);
    static float server[NP], worker[NP], ref_s[NP], ref_w[NP];
    run(&cz, reply_cfg, push, reply, server, worker);
    reference(push, reply, STEPS, ref_s, ref_w);
    CHECKF(memcmp(server, ref_s, sizeof ref_s) == 0,
           "--compress %s, answers topk:%g: the servers' parameters are not one process's",
           push_spec, reply);
    CHECKF(memcmp(worker, ref_w, sizeof ref_w) == 0,
           "--compress %s, answers topk:%g: the worker's copy is not one process's", push_spec,
           reply);
    /* (with sgd a top-k answer at the push's own ratio carries every change) */
    CHECKF(push > 0 && reply >= push ? 1 : memcmp(worker, server, sizeof server) != 0,
           "--compress %s, answers topk:%g: the worker holds the servers' parameters whole",
           push_spec, reply);
}

static double dist(const float *p)
{
    double d = 0;
    for (int i = 0; i < NP; i++)
        d = fmax(d, fabs((double)p[i] - (double)target(i)));
    return d;
}

/* Top-k answers with the mirror's feedback reach the optimum of a flat
 * quadratic as whole answers do (400 steps). */
static void converges(void)
{
    static float a[NP], b[NP], c[NP], wa[NP], wb[NP], wc[NP];
    flat = 1;
    reference(0, 0, 400, a, wa);
    reference(0, 0.05, 400, b, wb);
    reference(0, D4, 400, c, wc);
    flat = 0;
    double dc = dist(c), dwc = dist(wc);
    printf("flat quadratic, 400 steps: 4-bit answers %.3g (the worker's copy %.3g)\n", dc, dwc);
    CHECKF(dc < 1e-3 && dwc < 1e-3, "4-bit answers end %.3g (copy %.3g) from the optimum", dc,
           dwc);
    double d0 = dist(start_params()), da = dist(a), db = dist(b), dw = dist(wb);
    printf("flat quadratic, 400 steps from %.3g: whole answers %.3g, topk:0.05 answers %.3g "
           "(the worker's copy %.3g)\n", d0, da, db, dw);
    CHECKF(db < 1e-3 && dw < 1e-3 && db < 20 * da + 1e-4,
           "topk answers end %.3g (copy %.3g) from the optimum; whole %.3g", db, dw, da);
}

/* The rule on numbers: 784-300-100-10 on one shard. */
static void rule(void)
{
    size_t n[1] = {266610};
    dp_ps_auto a;
    CHECKF(dp_ps_auto_rule(&a, n, 1, 80e-9, 3.5e-9) == 0.1, "80 ns a byte: %s", a.why);
    CHECKF(dp_ps_auto_rule(&a, n, 1, 0.1e-9, 3.5e-9) == 0, "0.1 ns a byte: %s", a.why);
    printf("%s\n", a.why);
    /* the choices as the checkpoint keeps them (strategy_state) */
    uint32_t codes[3] = {dp_ps_auto_code(0.05), DP_PS_AUTO_UNSET, dp_ps_auto_code(0)}, back[3];
    char text[64];
    REQUIRE(dp_ps_auto_format(text, sizeof text, codes, 3) == 0);
    CHECKF(strcmp(text, "ps_auto=topk:0.05,-,none") == 0, "%s", text);
    CHECK(dp_ps_auto_parse(text, 3, back, "f", &err) == 0 && memcmp(back, codes, sizeof codes) == 0);
    CHECK(dp_ps_auto_ratio(back[0]) == 0.05 && dp_ps_auto_ratio(back[1]) < 0 &&
          dp_ps_auto_ratio(back[2]) == 0);
    CHECK(dp_ps_auto_fallback(back, 3) == back[0] && dp_ps_auto_fallback(back + 1, 1) == 0);
    static const struct { const char *text, *says; } bad[] = {
        {"ps_auto=topk:0.05,-", "holds 2 worker choice(s); this run has 3"},
        {"ps_auto=none,none,none,none", "more than the 3 worker choice(s)"},
        {"ps_auto=none,,none", "worker 1's choice '' is not one"},
        {"ps_auto=none,topk:0.5,none", "worker 1's choice 'topk:0.5' is not one"},
        {"ps_auto=none,none,", "worker 2's choice '' is not one"},
        {"iter=3", "holds no 'ps_auto'"},
        {NULL, "holds no 'ps_auto'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECKF(dp_ps_auto_parse(bad[i].text, 3, back, "f.safetensors", &err) < 0 &&
                   strstr(err.msg, "f.safetensors: ") == err.msg && strstr(err.msg, bad[i].says),
               "%s: %s", bad[i].text ? bad[i].text : "(none)", err.msg);
}

/* dp_coded_set refuses what is not a coded answer and changes nothing. */
static void bad_answers(void)
{
    enum { N = 8 };
    static const struct {
        uint32_t codec, count, pairs;
        uint32_t idx[3];
        const char *says;
    } bad[] = {
        {DP_COMPRESS_BF16, 2, 2, {0, 1}, "codec"},
        {DP_COMPRESS_TOPK, 3, 2, {0, 1}, "says 3 pairs"},
        {DP_COMPRESS_TOPK, 2, 2, {1, 8}, "not below"},
        {DP_COMPRESS_TOPK, 2, 2, {3, 3}, "not above"},
        {DP_COMPRESS_TOPK, 0, 0, {0}, "takes 8 + 8k"},
    };
    for (size_t c = 0; c < sizeof bad / sizeof *bad; c++) {
        uint8_t b[8 + 8 * 3];
        dp_put_u32(b, bad[c].codec);
        dp_put_u32(b + 4, bad[c].count);
        for (uint32_t j = 0; j < bad[c].pairs; j++) {
            dp_put_u32(b + 8 + 8 * j, bad[c].idx[j]);
            dp_put_f32(b + 12 + 8 * j, 9.0f);
        }
        float x[N] = {0};
        dp_err e;
        int rc = dp_coded_set(b, 8 + 8 * bad[c].pairs, x, N, &e);
        int untouched = 1;
        for (int i = 0; i < N; i++)
            untouched &= x[i] == 0.0f;
        CHECKF(rc < 0 && strstr(e.msg, bad[c].says) && untouched, "bad answer %zu: rc %d (%s)",
               c, rc, rc < 0 ? e.msg : "accepted");
    }
    /* 4-bit answers: n 3 (a padding nibble) */
    static const struct {
        uint32_t codec, count;
        float scale;
        uint8_t q0, q1;
        size_t len;
        const char *says;
    } bad4[] = {
        {DP_CODED_DELTA4, 3, 0.25f, 0x11, 0x01, 14, "of 14 bytes"},
        {DP_CODED_DELTA4, 4, 0.25f, 0x11, 0x01, 14, "4 values"},
        {DP_CODED_DELTA4, 3, 0.3f, 0x11, 0x01, 14, "power of two"},
        {DP_CODED_DELTA4, 3, -0.25f, 0x11, 0x01, 14, "power of two"},
        {DP_CODED_DELTA4, 3, 0.25f, 0x81, 0x01, 14, "is -8"},
        {DP_CODED_DELTA4, 3, 0.25f, 0x11, 0x11, 14, "padding"},
    };
    for (size_t c = 0; c < sizeof bad4 / sizeof *bad4; c++) {
        uint8_t b[16] = {0};
        dp_put_u32(b, bad4[c].codec);
        dp_put_u32(b + 4, bad4[c].count);
        dp_put_f32(b + 8, bad4[c].scale);
        b[12] = bad4[c].q0;
        b[13] = bad4[c].q1;
        float x[3] = {1, 2, 3};
        dp_err e;
        size_t len = c == 0 ? 15 : bad4[c].len;
        int rc = dp_delta4_apply(b, len, x, 3, &e);
        CHECKF(rc < 0 && strstr(e.msg, c == 0 ? "of 15 bytes" : bad4[c].says) && x[0] == 1 &&
                   x[1] == 2 && x[2] == 3,
               "bad 4-bit answer %zu: rc %d (%s)", c, rc, rc < 0 ? e.msg : "accepted");
    }
    {
        uint8_t b[14];
        dp_put_u32(b, DP_CODED_DELTA4);
        dp_put_u32(b + 4, 3);
        dp_put_f32(b + 8, 0.25f);
        b[12] = 0xf1; /* +1, -1 */
        b[13] = 0x07; /* +7 */
        float x[3] = {1, 2, 3};
        dp_err e;
        CHECK(dp_delta4_apply(b, 14, x, 3, &e) == 0 && x[0] == 1.25f && x[1] == 1.75f &&
              x[2] == 4.75f);
    }
    uint8_t long_one[8 + 8 * (N + 1)] = {0};
    float x[N] = {0};
    dp_err e;
    CHECK(dp_coded_set(long_one, sizeof long_one, x, N, &e) < 0);

    /* on the wire: a worker answered with an index past shard 0 fails its step */
    dp_compress none = {DP_COMPRESS_NONE, 0, 0};
    rig r;
    rig_open(&r, &none, 0.05);
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_SGD);
    dp_ps_client *w;
    REQUIRE(dp_ps_client_open(&w, r.ts[1], &r.layout, &r.cfg, &oc, NP, &err) == 0);
    static float params[NP], g[NP];
    memcpy(params, start_params(), sizeof params);
    uint8_t ans[8 + 8];
    dp_put_u32(ans, DP_COMPRESS_TOPK);
    dp_put_u32(ans + 4, 1);
    dp_put_u32(ans + 8, HALF); /* one past the shard */
    dp_put_f32(ans + 12, 1.0f);
    for (int k = 0; k < 2; k++)
        REQUIRE(dp_transport_send(r.ts[r.ps0 + k], 1, DP_WIRE_PARAMS_CODED, 0,
                                  r.layout.range[k].lo, ans, sizeof ans, &err) == 0);
    int rc = dp_ps_client_step(w, params, g, 1, 0.05f, &err);
    CHECKF(rc < 0 && strstr(err.msg, "not below the shard"), "a bad answer on the wire: rc %d %s",
           rc, rc < 0 ? err.msg : "");
    CHECK(memcmp(params, start_params(), sizeof params) == 0);
    dp_ps_client_free(w);
    rig_close(&r, 0);
}

int main(void)
{
    (void)crash_ps; /* the rig's, unused here */
    dp_log_set_level(DP_LOG_WARN);
    equals_one_process("none", 0.05, 0, 0.05);
    equals_one_process("topk:0.05", 0.02, 0.05, 0.02);
    equals_one_process("none", D4, 0, D4);
    equals_one_process("topk:0.05", D4, 0.05, D4);
    REQUIRE(dp_hook_set("DOWNPOUR_TEST_LINK_NS", "1000", &err) == 0);
    equals_one_process("auto", 0, 0.1, D4);
    REQUIRE(dp_hook_set("DOWNPOUR_TEST_LINK_NS", NULL, &err) == 0);
    rule();
    if (!SANITIZED) /* arithmetic of one process: the plain build's */
        converges();
    bad_answers();
    return CHECK_DONE();
}
