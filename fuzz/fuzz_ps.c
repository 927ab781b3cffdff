/* libFuzzer target for the parameter server's messages (src/strategy/ps.c
 * and each mode's rule: ps_async.c, ps_sync.c, ps_ssp.c, ps_dssp.c,
 * model_avg.c).  A ps server is opened on the in-process transport, as
 * tests/test_ps_rules.c does, and the fuzz bytes decode into frames that the
 * chief and the workers send it (pushes with any head and floats, pulls,
 * state requests, DONE, SHUTDOWN, any other type), crashes and cuts of those
 * endpoints, and steps of the servers' clock; the server handles one event
 * after each.  Any sequence must leave the server answering, ending the run
 * (1), or refusing with a message (-1); never a crash, an out-of-bounds
 * access, a leak, or a hang.
 *
 * With a sparse table (docs/strategies.md, "Sparse rows") the server also
 * takes rows sections: PUSH_ROWS with well-formed and arbitrary sections,
 * PULL_ROWS, and PULL_TABLE asks of a chunk (2 rows here) well-formed, past
 * the shard or the chunk, or arbitrary bytes; every TABLE_ROWS answer must
 * be the chunk its head names, and arbitrary bytes read as the answer to an
 * ask (dp_ps_table_rows_check, as a client reads it) are taken only when
 * they are the chunk asked.
 *
 * With compression (docs/strategies.md, "ps family: compression": byte 0's
 * bits 0-6 / 30, 1 bf16, 2 fp16, 3 topk:0.3, and from 120 bf16 answers)
 * the server takes PUSH_CODED blocks: well-formed (any codec, a count near
 * the right one, top-k indices up to past the shard) or arbitrary bytes.
 * With byte 1's bit 3 as well, topk:0.3 becomes --compress auto (any count
 * of pairs), bf16 gets --ps-reply delta4 and none --ps-reply topk:0.3: the
 * server answers coded (PARAMS_CODED, top-k or 4-bit), and every coded
 * answer it sends must read as one (dp_coded_set, dp_delta4_apply, as a
 * worker reads it); arbitrary bytes read as one are refused with a message
 * and change nothing.
 *
 * A host leader's push (PUSH_HOST) names any workers, up to past the
 * cluster's, and is refused but under plain ps-sync.
 *
 * Input: byte 0 the mode (bits 0-6 % 5: async, sync, ssp, dssp, avg), the
 * servers' optimiser (bits 0-6 / 5 % 6) and, bit 7, a sparse table of
 * TROWS x TWIDTH before the NP dense parameters; byte 1 the workers (1 + % 3), bit 2 two ps tasks (the
 * server holds shard 0 of 2), bit 3 a moving average, bits 4-7 the staleness
 * bounds; then operations, each a byte (bits 0-1 the sender, 2-7 what it
 * does: the switch below) and a step byte, then its arguments. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/inproc.h"
#include "downpour/log.h"
#include "downpour/ps.h"
#include "downpour/wire.h"
#include "fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NP 6 /* parameters */
#define TROWS 5
#define TWIDTH 2
#define TAB (TROWS * TWIDTH)
#define MAX_WORKERS 3
#define MAX_OPS 512

static double fake_now;
static double fake_clock(void) { return fake_now; }

static const float lr_table[16] = {0.1f, 0.0f, 1.0f, 1e6f, 2e6f, -1.0f, NAN, INFINITY,
                                   1e-3f, 1e-40f, 0.5f, 0.01f, -0.0f, 3.0f, 1e-8f, 100.0f};

/* A push from `from` to the ps task: the head, then `floats` floats. */
static void send_push(dp_transport *from, int ps, unsigned type, uint64_t step, uint64_t offset,
                      size_t floats, fz_in *in)
{
    uint8_t buf[DP_PUSH_HEAD_SIZE + (NP + 4) * sizeof(float)];
    dp_push_head h;
    h.records = fz_u8(in);
    uint8_t w = fz_u8(in);
    h.want = w & 0x80 ? w : (w & 1u);
    h.lr = lr_table[fz_u8(in) & 15];
    dp_push_head_put(buf, &h);
    if (floats > NP + 4)
        floats = NP + 4;
    fz_bytes(in, buf + DP_PUSH_HEAD_SIZE, floats * sizeof(float));
    dp_err err;
    (void)dp_transport_send(from, ps, type, step, offset, buf,
                            DP_PUSH_HEAD_SIZE + floats * sizeof(float), &err);
}

/* A host leader's PUSH_HOST (docs/strategies.md, "ps-sync: one push per
 * host"): the head, 0 to 4 worker indices (any, up to past the workers),
 * then the shard's `floats` floats; taken only under sync. */
static void send_host(dp_transport *from, int ps, uint64_t step, uint64_t offset, size_t floats,
                      fz_in *in)
{
    uint8_t buf[DP_PUSH_HEAD_SIZE + 4 + 4 * 4 + NP * sizeof(float)];
    dp_push_head h = {fz_u8(in), 1, lr_table[fz_u8(in) & 15], fz_u8(in)};
    dp_push_head_put(buf, &h);
    uint8_t a = fz_u8(in);
    uint32_t m = a % 5;
    dp_put_u32(buf + DP_PUSH_HEAD_SIZE, m);
    for (uint32_t i = 0; i < m; i++)
        dp_put_u32(buf + DP_PUSH_HEAD_SIZE + 4 + 4 * i, fz_u8(in) % (MAX_WORKERS + 2));
    size_t k = DP_PUSH_HEAD_SIZE + 4 + 4 * m;
    if (floats > NP)
        floats = NP;
    k += fz_bytes(in, buf + k, floats * sizeof(float));
    dp_err err;
    (void)dp_transport_send(from, ps, DP_WIRE_PUSH_HOST, step, offset, buf, k, &err);
}

/* A PUSH_ROWS: the head, the shard's `floats` dense floats, then a rows
 * section: well-formed (ids of shard `shard` of S, increasing, some past
 * the table) or, with bit 7 of the first byte, up to 64 arbitrary bytes. */
static void send_rows(dp_transport *from, int ps, uint64_t step, uint64_t offset, size_t floats,
                      int shard, int S, int push, fz_in *in)
{
    uint8_t buf[DP_PUSH_HEAD_SIZE + NP * sizeof(float) + 4 + 8 * (4 + 4 * TWIDTH) + 64];
    size_t k = 0;
    if (push) {
        dp_push_head h = {fz_u8(in), fz_u8(in) & 1, lr_table[fz_u8(in) & 15], 0};
        dp_push_head_put(buf, &h);
        k = DP_PUSH_HEAD_SIZE;
        if (floats > NP)
            floats = NP;
        k += fz_bytes(in, buf + k, floats * sizeof(float));
    }
    uint8_t a = fz_u8(in);
    if (a & 0x80) {
        k += fz_bytes(in, buf + k, a & 63);
    } else {
        uint32_t count = a & 7, first = fz_u8(in) & 7;
        dp_put_u32(buf + k, count);
        k += 4;
        for (uint32_t i = 0; i < count; i++, k += 4)
            dp_put_u32(buf + k, (uint32_t)shard + (uint32_t)S * (first + i) - ((a >> 3) & 1));
        for (uint32_t i = 0; push && i < count * TWIDTH; i++, k += 4)
            dp_put_f32(buf + k, lr_table[fz_u8(in) & 15]);
    }
    dp_err err;
    (void)dp_transport_send(from, ps, push ? DP_WIRE_PUSH_ROWS : DP_WIRE_PULL_ROWS, step, offset,
                            buf, k, &err);
}

/* A PUSH_CODED: the head, then a coded block (compress.h) for a shard of
 * `len`: codec and count near what cfg's takes, 16-bit values or top-k
 * pairs; or, with bit 7 of the first byte, up to 64 arbitrary bytes. */
static void send_coded(dp_transport *from, int ps, uint64_t step, uint64_t offset, size_t len,
                       const dp_compress *cz, fz_in *in)
{
    uint8_t buf[DP_PUSH_HEAD_SIZE + 8 + 8 * (NP + 4) + 64];
    dp_push_head h = {fz_u8(in), fz_u8(in) & 1, lr_table[fz_u8(in) & 15], 0};
    dp_push_head_put(buf, &h);
    size_t k = DP_PUSH_HEAD_SIZE;
    uint8_t a = fz_u8(in);
    if (a & 0x80) {
        k += fz_bytes(in, buf + k, a & 63);
    } else {
        uint32_t kind = a & 3, right = cz->kind == DP_COMPRESS_TOPK
                                           ? (uint32_t)dp_topk_count(cz->ratio, len)
                                           : (uint32_t)len;
        uint32_t count = right + ((a >> 2) & 3) - 1;
        if (count > NP + 4)
            count = NP + 4;
        dp_put_u32(buf + k, kind == 0 ? (uint32_t)cz->kind : kind);
        dp_put_u32(buf + k + 4, count);
        k += 8;
        for (uint32_t i = 0; i < count; i++) {
            if (cz->kind == DP_COMPRESS_TOPK) {
                dp_put_u32(buf + k, fz_u8(in) % (uint32_t)(len + 2));
                dp_put_f32(buf + k + 4, lr_table[fz_u8(in) & 15]);
                k += 8;
            } else {
                k += fz_bytes(in, buf + k, 2);
            }
        }
    }
    dp_err err;
    (void)dp_transport_send(from, ps, DP_WIRE_PUSH_CODED, step, offset, buf, k, &err);
}

/* A coded answer as a worker reads it (PARAMS_CODED: dp_delta4_apply for
 * a 4-bit one, else dp_coded_set) for a shard of len: set, or refused with
 * x untouched and a message. */
static int read_answer(const uint8_t *b, size_t k, size_t len)
{
    float x[NP + 4], before[NP + 4];
    for (size_t i = 0; i < len; i++)
        x[i] = before[i] = (float)i;
    dp_err err;
    err.msg[0] = '\0';
    int rc = k >= 4 && dp_get_u32(b) == DP_CODED_DELTA4 ? dp_delta4_apply(b, k, x, len, &err)
                                                        : dp_coded_set(b, k, x, len, &err);
    if (rc < 0 && (err.msg[0] == '\0' || memcmp(x, before, len * sizeof(float)) != 0))
        abort(); /* a refusal says why and changes nothing */
    return rc;
}

/* A PULL_TABLE (first byte a): bit 7, up to 31 arbitrary bytes; else
 * [table (a >> 5) & 1][part a & 3][first 0..7][count 0..3] (the rig's
 * chunk is 2 rows: asks past the shard, of no row or more than a chunk).
 * Or, bit 6, a client reads up to 40 arbitrary bytes as the TABLE_ROWS
 * answer to such an ask (dp_ps_table_rows_check): taken only when they are
 * the chunk asked, head and length, else refused with a message. */
static void table_op(dp_transport *t, int ps, uint64_t step, uint64_t lo, fz_in *in)
{
    uint8_t a = fz_u8(in), b[40];
    dp_err err;
    if (a & 0x80) {
        size_t k = fz_bytes(in, b, a & 31);
        (void)dp_transport_send(t, ps, DP_WIRE_PULL_TABLE, step, lo, b, k, &err);
        return;
    }
    uint8_t ask[16];
    dp_put_u32(ask, (a >> 5) & 1);
    dp_put_u32(ask + 4, a & 3);
    dp_put_u32(ask + 8, fz_u8(in) & 7);
    dp_put_u32(ask + 12, fz_u8(in) & 3);
    if (!(a & 0x40)) {
        (void)dp_transport_send(t, ps, DP_WIRE_PULL_TABLE, step, lo, ask, sizeof ask, &err);
        return;
    }
    size_t k = fz_bytes(in, b, fz_u8(in) % (sizeof b + 1));
    err.msg[0] = '\0';
    int rc = dp_ps_table_rows_check(DP_WIRE_TABLE_ROWS, lo, k, NULL, ask, TWIDTH, lo, "ps:0",
                                    &err);
    if (rc == 0 && k >= 16)
        rc = dp_ps_table_rows_check(DP_WIRE_TABLE_ROWS, lo, k, b, ask, TWIDTH, lo, "ps:0", &err);
    if (rc < 0 && (err.msg[0] == '\0' || !strstr(err.msg, "ps:0")))
        abort(); /* a refusal names the peer */
    if (rc == 0 && (k != 16 + dp_get_u32(ask + 12) * TWIDTH * 4 || memcmp(b, ask, 16) != 0))
        abort(); /* taken: exactly the chunk asked */
}

/* Reads (and drops) whatever the server sent to endpoint t; a coded answer
 * (--ps-reply topk, --compress auto) must read as one, and a TABLE_ROWS
 * answer as the chunk its head names. */
static void drain(dp_transport *t, int n, size_t len)
{
    dp_event ev;
    dp_err err;
    for (int k = 0; k < 64; k++) {
        if (dp_transport_poll(t, DP_PEER_ANY, 0, &ev, &err) != 0 || ev.kind == DP_EVENT_TIMEOUT)
            return;
        if (ev.kind == DP_EVENT_FRAME) {
            if (ev.peer < 0 || ev.peer >= n)
                abort();
            static uint8_t b[8 + 8 * (NP + 4) + 16 + TAB * 4];
            if (ev.header.type == DP_WIRE_TABLE_ROWS && ev.header.length <= sizeof b &&
                ev.header.length >= 16) {
                if (dp_transport_recv_payload(t, ev.peer, b, (size_t)ev.header.length, &err) == 0 &&
                    (dp_ps_table_rows_check(ev.header.type, ev.header.offset, ev.header.length,
                                            NULL, b, TWIDTH, ev.header.offset, "ps:0", &err) < 0 ||
                     dp_get_u32(b + 12) == 0 || dp_get_u32(b + 12) > 2))
                    abort(); /* the server answers a chunk of 1 to 2 rows, as its head says */
                continue;
            }
            if (ev.header.type == DP_WIRE_PARAMS_CODED && ev.header.length <= sizeof b) {
                if (dp_transport_recv_payload(t, ev.peer, b, (size_t)ev.header.length, &err) == 0 &&
                    read_answer(b, (size_t)ev.header.length, len) < 0)
                    abort();
                continue;
            }
            (void)dp_transport_skip_payload(t, ev.peer, &err);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet) {
        dp_log_set_level(DP_LOG_ERROR);
        quiet = 1;
    }
    if (size < 2 || size > 4096)
        return 0;
    fz_in in = {data, size, 0};
    uint8_t b0 = fz_u8(&in), b1 = fz_u8(&in);
    dp_ps_config cfg;
    dp_ps_config_init(&cfg);
    cfg.mode = (dp_ps_mode)((b0 & 0x7f) % DP_PS_MODE_COUNT);
    dp_optim_config oc = dp_optim_defaults((dp_optim_kind)(((b0 & 0x7f) / 5) % DP_OPTIM_COUNT));
    int sparse = b0 >> 7;
    size_t tab = sparse ? TAB : 0, np = tab + NP;
    if (sparse) {
        cfg.n_tables = 1;
        cfg.tables[0] = (dp_ps_table_spec){.off = 0, .rows = TROWS, .width = TWIDTH, .max_ids = TROWS};
        cfg.state_chunk = 2 * TWIDTH * sizeof(float); /* chunks of 2 rows */
    }
    int workers = 1 + b1 % MAX_WORKERS;
    int n_ps = (b1 >> 2) & 1 ? 2 : 1;
    cfg.ema = (b1 >> 3) & 1 ? 0.9f : 0.0f;
    cfg.staleness = (b1 >> 4) & 3;
    cfg.staleness_lo = (b1 >> 4) & 3;
    cfg.staleness_hi = cfg.staleness_lo + ((b1 >> 6) & 3);
    cfg.min_shard_bytes = sizeof(float);
    cfg.now = fake_clock;
    fake_now = 1000.0;
    static const dp_compress codecs[4] = {{DP_COMPRESS_NONE, 0, 0}, {DP_COMPRESS_BF16, 0, 0},
                                          {DP_COMPRESS_FP16, 0, 0}, {DP_COMPRESS_TOPK, 0.3, 0}};
    cfg.compress = codecs[((b0 & 0x7f) / 30) & 3];
    cfg.reply16 = (b0 & 0x7f) >= 120;
    /* coded answers: with the moving average's bit, topk:0.3 becomes auto
     * (each push's own count, answered 4-bit), bf16 pushes are answered
     * 4-bit (delta4) and none answers topk:0.3 */
    if ((b1 >> 3) & 1 && cfg.compress.kind == DP_COMPRESS_TOPK)
        cfg.compress.kind = DP_COMPRESS_AUTO;
    else if ((b1 >> 3) & 1 && cfg.compress.kind == DP_COMPRESS_BF16)
        cfg.reply_delta4 = 1;
    else if ((b1 >> 3) & 1 && cfg.compress.kind == DP_COMPRESS_NONE && !cfg.reply16)
        cfg.reply_topk = 0.3;
    dp_compress gen = cfg.compress; /* what send_coded makes: auto's are top-k */
    if (gen.kind == DP_COMPRESS_AUTO)
        gen.kind = DP_COMPRESS_TOPK;

    int ports[MAX_WORKERS + 3];
    const char *names[MAX_WORKERS + 3];
    int n = 1 + workers + n_ps;
    for (int i = 0; i < n; i++)
        ports[i] = 20000 + i; /* never listened on */
    dp_cluster c;
    dp_err err;
    if (dp_cluster_local(&c, 1, workers, n_ps, ports, &err) != 0)
        abort();
    for (int i = 0; i < n; i++)
        names[i] = c.tasks[i].name;
    dp_transport *ts[MAX_WORKERS + 3];
    if (dp_inproc_open_named(ts, n, names, &err) != 0)
        abort();
    dp_ps_layout layout;
    if (dp_ps_layout_make_from(&layout, &c, tab, np, &cfg, &err) != 0)
        abort();
    int ps = dp_cluster_rank(&c, DP_ROLE_PS, 0);
    size_t lo = layout.range[0].lo, len = layout.range[0].hi - lo;
    float p0[TAB + NP] = {1, 2, -3, 0.5f, 0, 4, 7, -1, 0.25f, 3, 1, 2, -3, 0.5f, 0, 4};
    dp_ps_start start = {.params = p0};
    dp_ps_server *s;
    if (dp_ps_server_open(&s, ts[ps], &c, &layout, &cfg, &oc, &start, np, &err) != 0)
        abort();
    int killed[MAX_WORKERS + 3] = {0};
    unsigned push_type = cfg.mode == DP_PS_AVG ? DP_WIRE_PUSH_PARAMS : DP_WIRE_PUSH_GRAD;
    int rc = 0;
    for (int op = 0; op < MAX_OPS && fz_left(&in) > 0 && rc == 0; op++) {
        uint8_t o = fz_u8(&in);
        int from = (o & 3) % (1 + workers); /* 0: the chief, k: worker k-1 */
        dp_transport *t = ts[from];
        uint64_t step = fz_u8(&in);
        switch ((o >> 2) % 16) {
        case 0: /* a well-formed push for this shard */
            send_push(t, ps, push_type, step, lo, len, &in);
            break;
        case 1: /* a push of the other kind, or a host push */
            if (step & 0x80) {
                send_host(t, ps, step, lo, len, &in);
                break;
            }
            send_push(t, ps,
                      push_type == DP_WIRE_PUSH_GRAD ? DP_WIRE_PUSH_PARAMS : DP_WIRE_PUSH_GRAD,
                      step, lo, len, &in);
            break;
        case 2: { /* a push of the wrong length or at the wrong offset */
            uint8_t a = fz_u8(&in);
            int floats = (int)len + ((a >> 3) & 7) - 3;
            send_push(t, ps, push_type, step, a & 0x80 ? lo : a & 7,
                      (size_t)(floats < 0 ? 0 : floats), &in);
            break;
        }
        case 3: case 4: case 5: case 6: case 7: { /* PULL .. SHUTDOWN, maybe with bytes */
            static const unsigned types[5] = {DP_WIRE_PULL, DP_WIRE_PULL_AVERAGE,
                                              DP_WIRE_STATE_REQ, DP_WIRE_DONE, DP_WIRE_SHUTDOWN};
            uint8_t pay[8];
            size_t k = fz_u8(&in) & 7;
            fz_bytes(&in, pay, k);
            (void)dp_transport_send(t, ps, types[(o >> 2) % 16 - 3], step, 0, pay, k, &err);
            break;
        }
        case 8: { /* any application frame type */
            uint8_t pay[32];
            unsigned type =
                DP_FRAME_APP_FIRST + fz_u8(&in) % (DP_FRAME_COUNT - DP_FRAME_APP_FIRST);
            uint64_t offset = fz_u8(&in);
            size_t k = fz_u8(&in) % sizeof pay;
            fz_bytes(&in, pay, k);
            (void)dp_transport_send(t, ps, type, step, offset, pay, k, &err);
            break;
        }
        case 9: /* the sender crashes, or its links are cut */
            if (!killed[from]) {
                killed[from] = 1;
                (void)dp_inproc_kill(t, step & 1 ? DP_INPROC_CUT : DP_INPROC_CRASH, &err);
            }
            break;
        case 10: /* the servers' clock moves on */
            fake_now += (double)step * 0.01;
            break;
        case 12: /* sparse rows: a push with a rows section */
        case 13: /* a PULL_ROWS */
            send_rows(t, ps, step, lo, len, 0, layout.n_shards, (o >> 2) % 16 == 12, &in);
            break;
        case 14: /* a PULL_TABLE, or a client reading a TABLE_ROWS answer */
            table_op(t, ps, step, lo, &in);
            break;
        case 15: /* a coded push (refused without --compress) */
            send_coded(t, ps, step, lo, len, &gen, &in);
            break;
        case 11: { /* a worker reads a coded answer of up to 64 arbitrary bytes */
            uint8_t b[64];
            size_t k = fz_bytes(&in, b, fz_u8(&in) & 63);
            (void)read_answer(b, k, len);
            drain(t, n, len);
            break;
        }
        default: /* the sender reads its replies */
            drain(t, n, len);
            break;
        }
        err.msg[0] = '\0';
        rc = dp_ps_server_poll(s, 0, &err);
        if (rc < 0 && err.msg[0] == '\0')
            abort(); /* every refusal says why */
        if (rc != 0 && rc != 1 && rc != -1)
            abort();
    }
    /* Let the server take what is still queued. */
    for (int k = 0; k < 64 && rc == 0; k++)
        rc = dp_ps_server_poll(s, 0, &err);
    if (dp_ps_server_updates(s) < 0)
        abort();
    for (int w = 0; w < workers; w++)
        if (dp_ps_server_clock(s, w) < 0)
            abort();
    dp_ps_server_close(s);
    for (int i = 0; i < n; i++)
        dp_transport_close(ts[i]);
    dp_cluster_free(&c);
    return 0;
}
