/* The all-reduce's communication by algorithm and codec: see
 * cost_allreduce.h and docs/cost_model.md, "All-reduce algorithms and
 * compression".  The byte counts follow src/strategy/ring.c's frames. */
#include "cost/cost_allreduce.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/cost_model.h"
#include "downpour/frame.h"

/* Bytes per host of one phase: out and in over the link, and through the
 * host's memory between two of its members. */
typedef struct traffic {
    int hosts;
    double *out, *in, *local;
    double sent0; /* member 0's bytes sent */
} traffic;

static int traffic_open(traffic *t, int hosts)
{
    t->hosts = hosts;
    t->sent0 = 0;
    t->out = calloc((size_t)hosts * 3, sizeof(double));
    t->in = t->out ? t->out + hosts : NULL;
    t->local = t->out ? t->out + 2 * hosts : NULL;
    return t->out ? 0 : -1;
}

static void traffic_clear(traffic *t)
{
    memset(t->out, 0, sizeof(double) * 3 * (size_t)t->hosts);
    t->sent0 = 0;
}

static void traffic_add(traffic *sum, const traffic *t)
{
    for (int h = 0; h < 3 * t->hosts; h++)
        sum->out[h] += t->out[h];
    sum->sent0 += t->sent0;
}

/* Member a sends bytes to member b.  Two members of one host go through its
 * memory when a local bandwidth is given; without one, as the model always
 * counted them, on the host's link both ways. */
static void send_bytes(traffic *t, const cost_ar_in *in, int a, int b, double bytes)
{
    int ha = in->host[a], hb = in->host[b];
    if (a == 0)
        t->sent0 += bytes;
    if (ha == hb && in->local_bandwidth > 0) {
        t->local[ha] += bytes;
    } else {
        t->out[ha] += bytes;
        t->in[hb] += bytes;
    }
}

static double busiest_link(const traffic *t)
{
    double m = 0;
    for (int h = 0; h < t->hosts; h++)
        m = fmax(m, fmax(t->out[h], t->in[h]));
    return m;
}

/* A phase's time: its link and memory transfers go on at once. */
static double phase_s(const traffic *t, const cost_ar_in *in)
{
    double local = 0;
    for (int h = 0; h < t->hosts; h++)
        local = fmax(local, t->local[h]);
    double s = busiest_link(t) / in->bandwidth;
    return in->local_bandwidth > 0 ? fmax(s, local / in->local_bandwidth) : s;
}

static double segmented(double bytes)
{
    return bytes + ceil(bytes / DP_RING_SEGMENT_BYTES) * DP_FRAME_HEADER_SIZE;
}

static size_t n_buckets(size_t floats, size_t bucket_bytes)
{
    size_t bytes = floats * sizeof(float);
    return bytes == 0 ? 0 : (bytes + bucket_bytes - 1) / bucket_bytes;
}

/* Every member of m[] sends bytes to every other. */
static void to_all(traffic *t, const cost_ar_in *in, const int *m, int k, double bytes)
{
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++)
            if (i != j)
                send_bytes(t, in, m[i], m[j], bytes);
}

/* One flat sum of `floats` over the k members m[] (ring order), by algo
 * (ring or direct) and codec; adds its bytes to t and returns its latency
 * hops (docs/strategies.md, "allreduce: all-reduce algorithms" and
 * "compression"). */
static double flat(traffic *t, const cost_ar_in *in, const int *m, int k, dp_allreduce_algo algo,
                   dp_compress_kind codec, size_t floats, size_t bucket_bytes)
{
    if (k < 2 || floats == 0)
        return 0;
    size_t nb = n_buckets(floats, bucket_bytes);
    double ring = dp_cost_ring_bytes(floats, k, bucket_bytes); /* a member's, headers in */
    if (codec == DP_COMPRESS_BF16 || codec == DP_COMPRESS_FP16) {
        /* direct's pattern at 2 bytes a float: each contribution once to its
         * chunk's owner, each sum once to every member */
        to_all(t, in, m, k, ring / 2 / (k - 1));
        return 2.0 * (double)nb;
    }
    if (codec == DP_COMPRESS_TOPK) {
        /* every member's (index, value) pairs to every other, a bucket each */
        double f = ceil((double)floats / (double)nb);
        double pairs = (double)dp_topk_count(in->codec.ratio, (size_t)f);
        to_all(t, in, m, k, (double)nb * segmented(8 * pairs));
        return (double)nb;
    }
    if (algo == DP_ALGO_DIRECT) {
        to_all(t, in, m, k, ring / (k - 1));
        return 2.0 * (double)nb;
    }
    for (int i = 0; i < k; i++)
        send_bytes(t, in, m[i], m[(i + 1) % k], ring);
    return (double)nb * 2.0 * (k - 1);
}

typedef struct step_cost {
    double s, sent0, link;
} step_cost;

/* One step's all-reduce by a given algorithm (not auto) and codec (not
 * auto): its time, member 0's bytes and the busiest link's.  t and sum are
 * scratch; members and leaders hold n ints each. */
static step_cost step(const cost_ar_in *in, dp_allreduce_algo algo, dp_compress_kind codec,
                      traffic *t, traffic *sum, int *members, int *leaders)
{
    /* PowerSGD sums its factors and whole floats exactly, in two sums (of
     * about half each); the other codecs code the buckets. */
    int psgd = codec == DP_COMPRESS_POWERSGD;
    size_t floats = psgd ? in->psgd_floats : in->floats;
    size_t bucket = psgd ? floats * sizeof(float) / 2 + sizeof(float) : in->bucket_bytes;
    dp_compress_kind coded = psgd ? DP_COMPRESS_NONE : codec;
    double coding = codec == DP_COMPRESS_BF16 || codec == DP_COMPRESS_FP16
                        ? 2 * in->codec_s * (double)in->floats /* out, and the sum back in */
                    : codec == DP_COMPRESS_TOPK ? in->codec_s * (double)in->floats /* the pick */
                                                : 0;
    traffic_clear(sum);
    double s = 0, hops = in->extra_hops;
    for (int i = 0; i < in->n; i++)
        members[i] = i;
    if (algo != DP_ALGO_HIER) {
        traffic_clear(t);
        hops += flat(t, in, members, in->n, algo, coded, floats, bucket);
        for (int i = 0; i < in->n; i++) /* the sparse all-gather, around the ring */
            send_bytes(t, in, i, (i + 1) % in->n, in->extra_ring_bytes);
        s = phase_s(t, in);
        traffic_add(sum, t);
        return (step_cost){s + hops * in->latency + coding, sum->sent0, busiest_link(sum)};
    }
    /* Each host's first member leads: the host's sum to it (exact, through its
     * memory), the leaders' sum (coded), the result back; one after another. */
    int k = 0;
    for (int i = 0; i < in->n; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++)
            first = in->host[j] != in->host[i];
        if (first)
            leaders[k++] = i;
    }
    double bytes = segmented((double)floats * sizeof(float));
    for (int phase = 0; phase < 3; phase++) {
        traffic_clear(t);
        if (phase == 1) {
            hops += flat(t, in, leaders, k, DP_ALGO_RING, coded, floats, bucket);
            for (int i = 0; i < k; i++)
                send_bytes(t, in, leaders[i], leaders[(i + 1) % k], in->extra_ring_bytes);
        } else {
            for (int i = 0; i < in->n; i++) {
                int lead = 0;
                while (in->host[leaders[lead]] != in->host[i])
                    lead++;
                if (leaders[lead] == i)
                    continue;
                if (phase == 0)
                    send_bytes(t, in, i, leaders[lead], bytes);
                else
                    send_bytes(t, in, leaders[lead], i, bytes);
            }
        }
        s += phase_s(t, in);
        traffic_add(sum, t);
    }
    return (step_cost){s + hops * in->latency + coding, sum->sent0, busiest_link(sum)};
}

void cost_allreduce(const cost_ar_in *in, cost_ar_out *out)
{
    memset(out, 0, sizeof *out);
    out->algo = in->algo;
    out->codec = in->codec.kind;
    if (in->n < 2) {
        snprintf(out->how, sizeof out->how, "one replica: nothing sent");
        return;
    }
    traffic t = {0}, sum = {0};
    int *members = malloc(sizeof(int) * 2 * (size_t)in->n);
    if (traffic_open(&t, in->hosts) < 0 || traffic_open(&sum, in->hosts) < 0 || !members) {
        free(t.out);
        free(sum.out);
        free(members);
        snprintf(out->how, sizeof out->how, "out of memory");
        out->comm_s = HUGE_VAL;
        return;
    }
    int *leaders = members + in->n;
    /* auto's rule, the strategy's: the hierarchy when the members span 2 or
     * more hosts and some host has several; else the ring (the model has no
     * measured line to prefer direct by, and at 512 KiB buckets the bytes
     * bound the sum, not the hops). */
    int used_hosts = 0;
    for (int i = 0; i < in->n; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++)
            first = in->host[j] != in->host[i];
        used_hosts += first;
    }
    const char *algo_why = "";
    if (in->algo == DP_ALGO_AUTO) {
        out->algo = used_hosts >= 2 && used_hosts < in->n ? DP_ALGO_HIER : DP_ALGO_RING;
        algo_why = out->algo == DP_ALGO_HIER ? " (auto: several replicas a host)" : " (auto)";
    }
    dp_compress_kind first = out->codec == DP_COMPRESS_AUTO ? DP_COMPRESS_NONE : out->codec;
    step_cost c = step(in, out->algo, first, &t, &sum, members, leaders);
    char codec_why[96] = "";
    if (out->codec == DP_COMPRESS_AUTO) {
        /* bf16 where it is predicted faster, as the strategy decides */
        step_cost bf = step(in, out->algo, DP_COMPRESS_BF16, &t, &sum, members, leaders);
        snprintf(codec_why, sizeof codec_why, " (auto: bf16 %.2f ms vs none %.2f ms)", bf.s * 1e3,
                 c.s * 1e3);
        out->codec = bf.s < c.s ? DP_COMPRESS_BF16 : DP_COMPRESS_NONE;
        if (bf.s < c.s)
            c = bf;
    }
    out->comm_s = c.s;
    out->sent_bytes = c.sent0;
    out->busiest_link = c.link;
    snprintf(out->how, sizeof out->how, "%s%s, %s%s", dp_allreduce_algo_name(out->algo), algo_why,
             out->codec == DP_COMPRESS_NONE ? "uncompressed" : dp_compress_kind_name(out->codec),
             codec_why);
    free(t.out);
    free(sum.out);
    free(members);
}
