/* The cost model's equations (docs/cost_model.md): each strategy modelled
 * from what it puts on the wire (docs/strategies.md) and what its tasks
 * compute, on hosts whose cores and link the tasks share. */
#include "downpour/cost_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost/cost_allreduce.h"
#include "downpour/frame.h"
#include "downpour/partition.h"
#include "downpour/ps.h"
#include "downpour/strategy.h"
#include "downpour/ps_auto.h"

#define RING_SEGMENT_BYTES (256u << 10) /* src/strategy/ring.c: frames of at most this */
#define MAX_TASKS 4096

/* The strategies modelled, whose names the strategy table holds. */
static const dp_strategy_ops *const modelled[DP_COST_STRATEGY_COUNT] = {
    &dp_strategy_single, &dp_strategy_ps_async, &dp_strategy_ps_sync, &dp_strategy_allreduce};

const char *dp_cost_strategy_name(dp_cost_strategy s)
{
    return (unsigned)s < DP_COST_STRATEGY_COUNT ? modelled[s]->name : "invalid";
}

int dp_cost_strategy_parse(const char *name)
{
    for (int i = 0; i < DP_COST_STRATEGY_COUNT; i++)
        if (name && strcmp(name, modelled[i]->name) == 0)
            return i;
    return -1;
}

const char *dp_cost_bottleneck_name(dp_cost_bottleneck b)
{
    static const char *const names[DP_COST_BOUND_COUNT] = {"compute", "ps link", "ps cpu", "ring"};
    return (unsigned)b < DP_COST_BOUND_COUNT ? names[b] : "invalid";
}

void dp_cost_job_init(dp_cost_job *job)
{
    memset(job, 0, sizeof *job);
    job->strategy = DP_COST_PS_ASYNC;
    job->batch = 128;
    job->epochs = 25;
    job->train_records = 54000;
    job->val_records = 6000;
    job->bucket_bytes = 512u << 10;
    job->algo = DP_ALGO_AUTO;
    job->compress.kind = DP_COMPRESS_NONE;
}

void dp_cost_calibration_init(dp_cost_calibration *cal)
{
    memset(cal, 0, sizeof *cal);
    cal->apply_s_per_param = 120e-6 / 266610.0; /* docs/benchmarks.md, "The engine" */
    cal->thread_gain = 0.6;
    cal->codec_s_per_float = 3.5e-9; /* docs/strategies.md, "allreduce: compression" */
    cal->topk_s_per_float = 17.4e-9; /* docs/strategies.md, "ps family: compression" */
}

/* Which host each task lands on: ps tasks, the chief, then the workers,
 * round-robin, so a cluster of as many hosts as tasks has one task a host;
 * or tasks_per_host to a host in that order (scripts/vcluster.sh). */
typedef struct layout {
    int n_tasks, n_train;
    int host[MAX_TASKS];
    int trains[MAX_TASKS];
} layout;

static int host_of(const dp_cost_cluster *cl, int k)
{
    return cl->tasks_per_host > 0 ? k / cl->tasks_per_host : k % cl->hosts;
}

static void place(layout *L, const dp_cost_cluster *cl, int ps, int chief_trains)
{
    int k = 0;
    for (int i = 0; i < ps; i++, k++) {
        L->host[k] = host_of(cl, k);
        L->trains[k] = 0;
    }
    if (cl->chief) {
        L->host[k] = host_of(cl, k);
        L->trains[k] = chief_trains;
        k++;
    }
    for (int i = 0; i < cl->workers; i++, k++) {
        L->host[k] = host_of(cl, k);
        L->trains[k] = 1;
    }
    L->n_tasks = k;
    L->n_train = 0;
    for (int i = 0; i < k; i++)
        L->n_train += L->trains[i];
}

/* One training task's speed in cores: launch gives each task
 * max(1, cores / tasks on its host) BLAS threads (src/cluster/launcher.c),
 * and the training tasks of a host share its cores.  Beyond one core a
 * core adds thread_gain of one (small GEMMs scale poorly). */
static double task_speed(const layout *L, int task, const dp_cost_cluster *cl, double gain)
{
    int h = L->host[task], all = 0, train = 0;
    for (int i = 0; i < L->n_tasks; i++)
        if (L->host[i] == h) {
            all++;
            train += L->trains[i];
        }
    double threads = cl->cores / all >= 1 ? (double)(cl->cores / all) : 1.0;
    double share = (double)cl->cores / (train > 0 ? train : 1);
    double got = threads < share ? threads : share;
    return got <= 1.0 ? got : 1.0 + (got - 1.0) * gain;
}

static double step_compute(const dp_cost_calibration *cal, int batch, double speed)
{
    return batch * cal->sample_s / speed + cal->step_overhead_s + batch * cal->record_overhead_s;
}

int dp_cost_ps_bytes(size_t n_params, int ps, double *push_bytes, double *pull_bytes, dp_err *err)
{
    return dp_cost_sparse_ps_bytes(n_params, NULL, ps, push_bytes, pull_bytes, err);
}

static size_t n_buckets(size_t n_params, size_t bucket_bytes)
{
    size_t bytes = n_params * sizeof(float);
    return bytes == 0 ? 0 : (bytes + bucket_bytes - 1) / bucket_bytes;
}

double dp_cost_ring_bytes(size_t n_params, int n, size_t bucket_bytes)
{
    if (n < 2 || n_params == 0)
        return 0;
    size_t nb = n_buckets(n_params, bucket_bytes);
    double bytes = (double)n_params * sizeof(float);
    /* Every bucket: n-1 reduce-scatter and n-1 all-gather hops, each sending
     * a 1/n chunk of the bucket in segment frames. */
    double chunk = bytes / (double)nb / n;
    double frames = ceil(chunk / RING_SEGMENT_BYTES);
    return (double)nb * 2.0 * (n - 1) * (chunk + frames * DP_FRAME_HEADER_SIZE);
}

double dp_cost_zipf_unique(uint32_t n, double zipf, double draws)
{
    if (n == 0 || !(draws > 0))
        return 0;
    double h = 0;
    for (uint32_t k = 1; k <= n; k++)
        h += pow((double)k, -zipf);
    double u = 0;
    for (uint32_t k = 1; k <= n; k++) {
        double p = pow((double)k, -zipf) / h;
        u += -expm1(draws * log1p(-p)); /* 1 - (1 - p)^draws, exact for small p */
    }
    return u;
}

/* The frames of a payload of `bytes` cut in ring segments, headers included. */
static double segmented(double bytes)
{
    double frames = bytes > 0 ? ceil(bytes / RING_SEGMENT_BYTES) : 1;
    return bytes + frames * DP_FRAME_HEADER_SIZE;
}

double dp_cost_gather_bytes(const dp_cost_sparse *sp, int n, int bound)
{
    if (!sp || n < 2)
        return 0;
    double block = 0;
    for (int t = 0; t < sp->tables; t++)
        block += 4 + (bound ? sp->bound[t] : sp->rows[t]) * (4.0 + 4.0 * sp->width[t]);
    return (double)(n - 1) * segmented(block);
}

double dp_cost_allreduce_sparse_bytes(size_t n_params, const dp_cost_sparse *sp, int n,
                                      size_t bucket_bytes, int *gathered)
{
    if (gathered)
        *gathered = 0;
    if (!sp || sp->tables == 0 || n < 2)
        return dp_cost_ring_bytes(n_params, n, bucket_bytes);
    /* The strategy's choice (allreduce_sparse.c): payload bytes, bound against whole. */
    double payload_bound = 0;
    for (int t = 0; t < sp->tables; t++)
        payload_bound += 4 + sp->bound[t] * (4.0 + 4.0 * sp->width[t]);
    payload_bound *= n - 1;
    double whole = 2.0 * (n - 1) / n * (double)sp->table_floats * 4.0;
    if (!(payload_bound < whole))
        return dp_cost_ring_bytes(n_params, n, bucket_bytes);
    if (gathered)
        *gathered = 1;
    return dp_cost_ring_bytes(n_params - sp->table_floats, n, bucket_bytes) +
           dp_cost_gather_bytes(sp, n, 0);
}

/* One worker's frames to and from shard s of k holding n_s dense floats:
 * PUSH and PARAMS, or with sparse tables PULL_ROWS + PUSH_ROWS and ROWS +
 * PARAMS (docs/strategies.md, "Sparse rows", "Bytes per step"). */
static void shard_bytes(const dp_cost_sparse *sp, const dp_cost_job *job, double n_s, int k,
                        double *up, double *down)
{
    if (!sp) {
        /* --compress: PUSH_CODED, a [u32 codec][u32 count] block of 2-byte
         * values or 8-byte top-k pairs; --ps-reply bf16: PARAMS16, topk: PARAMS_CODED
         * of [u32 codec][u32 count] and 8-byte pairs (docs/strategies.md,
         * "ps family: compression") */
        dp_compress_kind c = job ? job->compress.kind : DP_COMPRESS_NONE;
        uint64_t n = (uint64_t)n_s;
        uint64_t push = c == DP_COMPRESS_BF16 || c == DP_COMPRESS_FP16 ? 8 + 2 * n
                        : c == DP_COMPRESS_TOPK ? 8 + 8 * (uint64_t)dp_topk_count(job->compress.ratio, n)
                                                : 4 * n;
        *up = (double)dp_frame_wire_size(DP_PUSH_HEAD_SIZE + push);
        uint64_t answer = job && job->ps_reply_delta4 ? dp_delta4_bytes(n)
                          : job && job->ps_reply_topk > 0
                              ? 8 + 8 * (uint64_t)dp_topk_count(job->ps_reply_topk, n)
                              : (job && job->ps_reply_bf16 ? 2 : 4) * n;
        *down = (double)dp_frame_wire_size(answer);
        return;
    }
    double pull = 0, push = DP_PUSH_HEAD_SIZE + 4 * n_s, rows = 0;
    for (int t = 0; t < sp->tables; t++) {
        double u = sp->rows[t] / k; /* id mod S: an even share */
        pull += 4 + 4 * u;
        push += 4 + u * (4.0 + 4.0 * sp->width[t]);
        rows += 4 * u * sp->width[t];
    }
    *up = (double)dp_frame_wire_size((uint64_t)ceil(pull)) +
          (double)dp_frame_wire_size((uint64_t)ceil(push));
    *down = (double)dp_frame_wire_size((uint64_t)ceil(rows)) +
            (double)dp_frame_wire_size(4 * (uint64_t)n_s);
}

/* The shards: by the min-size partitioner, or with sparse tables the dense
 * part with a floor of one float (every ps task a shard, ps_family.c). */
static int shards(size_t n_params, const dp_cost_sparse *sp, int ps, dp_range *r, dp_err *err)
{
    if (!sp)
        return dp_partition_min_size(n_params, DP_PARTITION_MIN_SHARD_BYTES, ps, r, err);
    size_t dense = n_params - sp->table_floats;
    return dp_partition_min_size(dense ? dense : 1, sizeof(float), ps, r, err);
}

int dp_cost_sparse_ps_bytes(size_t n_params, const dp_cost_sparse *sp, int ps, double *sent,
                            double *received, dp_err *err)
{
    if (sp && ps < 1)
        return dp_errf(err, "cluster: sparse rows need at least one ps task");
    if (sp && sp->table_floats > n_params)
        return dp_errf(err, "sparse: %zu table floats in a model of %zu", sp->table_floats,
                       n_params);
    dp_range *r = malloc(sizeof *r * DP_PARTITION_MAX);
    if (!r)
        return dp_errf(err, "out of memory");
    int k = shards(n_params, sp, ps, r, err);
    if (k < 0) {
        free(r);
        return -1;
    }
    double up = 0, down = 0;
    for (int s = 0; s < k; s++) {
        double u, d;
        shard_bytes(sp, NULL, (double)(r[s].hi - r[s].lo), k, &u, &d);
        up += u;
        down += d;
    }
    free(r);
    *sent = up;
    *received = down;
    return 0;
}

static int check_inputs(const dp_cost_calibration *cal, const dp_cost_cluster *cl,
                        const dp_cost_job *job, dp_err *err)
{
    if (!(cal->sample_s > 0) || !isfinite(cal->sample_s))
        return dp_errf(err, "calibration: sample_s must be positive (seconds per record)");
    if (cal->n_params == 0)
        return dp_errf(err, "calibration: n_params must be positive");
    if (cal->apply_s_per_param < 0 || cal->step_overhead_s < 0 || cal->record_overhead_s < 0)
        return dp_errf(err, "calibration: apply and overhead seconds must not be negative");
    if (cl->hosts < 1 || cl->hosts > MAX_TASKS)
        return dp_errf(err, "cluster: hosts %d is out of range [1, %d]", cl->hosts, MAX_TASKS);
    if (cl->cores < 1)
        return dp_errf(err, "cluster: cores %d must be at least 1", cl->cores);
    if (!(cl->bandwidth > 0) || !isfinite(cl->bandwidth))
        return dp_errf(err, "cluster: bandwidth must be positive (bytes/s)");
    if (!(cl->latency >= 0) || !isfinite(cl->latency))
        return dp_errf(err, "cluster: latency must not be negative");
    if (cl->workers < 0 || cl->ps < 0 || cl->chief < 0 || cl->chief > 1 ||
        cl->workers + cl->ps + cl->chief > MAX_TASKS)
        return dp_errf(err, "cluster: workers %d, ps %d, chief %d: counts out of range", cl->workers,
                       cl->ps, cl->chief);
    if (cl->tasks_per_host < 0 ||
        (cl->tasks_per_host > 0 &&
         (long)cl->tasks_per_host * cl->hosts < (long)cl->workers + cl->ps + cl->chief))
        return dp_errf(err, "cluster: %d host(s) x tasks_per_host %d hold fewer than the %d tasks",
                       cl->hosts, cl->tasks_per_host, cl->workers + cl->ps + cl->chief);
    if (!(cl->local_bandwidth >= 0) || !isfinite(cl->local_bandwidth))
        return dp_errf(err, "cluster: local_bandwidth must not be negative (0: the link)");
    if (job->strategy == DP_COST_ALLREDUCE && (unsigned)job->algo >= DP_ALGO_COUNT)
        return dp_errf(err, "job: unknown all-reduce algorithm %d", (int)job->algo);
    if (job->strategy == DP_COST_ALLREDUCE && job->compress.kind == DP_COMPRESS_POWERSGD &&
        job->psgd_floats == 0)
        return dp_errf(err, "job: powersgd needs psgd_floats (dp_cost_powersgd)");
    if (job->compress.kind != DP_COMPRESS_NONE && job->sparse)
        return dp_errf(err, "job: --compress with sparse tables is not modelled");
    if ((job->strategy == DP_COST_PS_ASYNC || job->strategy == DP_COST_PS_SYNC) &&
        job->compress.kind == DP_COMPRESS_POWERSGD)
        return dp_errf(err, "job: the ps family takes --compress bf16, fp16, topk or auto (%s "
                            "is allreduce's)", dp_compress_kind_name(job->compress.kind));
    if ((job->strategy == DP_COST_PS_ASYNC || job->strategy == DP_COST_PS_SYNC) &&
        job->compress.kind == DP_COMPRESS_AUTO &&
        (job->ps_reply_bf16 || job->ps_reply_topk > 0 || job->ps_reply_delta4))
        return dp_errf(err, "job: --compress auto chooses the ps answers itself (no --ps-reply)");
    if (!(cal->topk_s_per_float >= 0) || !isfinite(cal->topk_s_per_float))
        return dp_errf(err, "calibration: topk_s_per_float must not be negative");
    if (job->batch < 1 || job->epochs < 1 || job->train_records < 1 || job->val_records < 0)
        return dp_errf(err, "job: batch, epochs and train records must be positive");
    if ((unsigned)job->strategy >= DP_COST_STRATEGY_COUNT)
        return dp_errf(err, "job: unknown strategy %d", (int)job->strategy);
    if (job->sparse && (job->sparse->tables < 0 || job->sparse->tables > DP_COST_MAX_TABLES ||
                        job->sparse->table_floats > cal->n_params))
        return dp_errf(err, "job: sparse: %d tables of %zu floats in a model of %zu",
                       job->sparse->tables, job->sparse->table_floats, cal->n_params);
    if (job->strategy == DP_COST_ALLREDUCE && job->bucket_bytes == 0)
        return dp_errf(err, "job: bucket_bytes must be positive for allreduce");
    return 0;
}

/* Host link loads of one round, every byte counted where it leaves and where
 * it arrives (traffic between two tasks of one host counts twice there). */
typedef struct loads {
    double out[MAX_TASKS], in[MAX_TASKS];
} loads;

static double busiest(const loads *ld, int hosts)
{
    double m = 0;
    for (int h = 0; h < hosts; h++) {
        if (ld->out[h] > m)
            m = ld->out[h];
        if (ld->in[h] > m)
            m = ld->in[h];
    }
    return m;
}

/* --compress auto under the ps family: the workers' own rule (ps_auto.c,
 * docs/strategies.md "ps family: compression") on what they would measure.
 * Each times a pull of the whole model while every worker pulls (they start
 * together): the busiest link's f32 answers to all of them, plus a
 * request's and an answer's latency, over one worker's pull bytes is its
 * seconds a byte; the coder is the calibration's.  The choice goes into
 * job (top-k pushes at its ratio with 4-bit answers, or none) and p->how. */
static void predict_ps_auto(const dp_cost_calibration *cal, const dp_cost_cluster *cl,
                            dp_cost_job *job, const dp_range *r, int k, const layout *L,
                            loads *down, dp_cost_prediction *p)
{
    size_t n[DP_PARTITION_MAX]; /* 32 KiB, as ps.c's own */
    double bytes = 0;
    memset(down, 0, sizeof *down);
    for (int s = 0; s < k; s++) {
        n[s] = r[s].hi - r[s].lo;
        double d = (double)dp_frame_wire_size(4 * (uint64_t)n[s]);
        bytes += d;
        for (int t = 0; t < L->n_tasks; t++)
            if (L->trains[t]) {
                down->out[L->host[s]] += d;
                down->in[L->host[t]] += d;
            }
    }
    double pull_s = busiest(down, cl->hosts) / cl->bandwidth + 2 * cl->latency;
    double per_byte = bytes > 0 ? pull_s / bytes : 0;
    dp_ps_auto a;
    double ratio = dp_ps_auto_rule(&a, n, k, per_byte, cal->topk_s_per_float);
    job->compress = ratio > 0 ? (dp_compress){.kind = DP_COMPRESS_TOPK, .ratio = ratio}
                              : (dp_compress){.kind = DP_COMPRESS_NONE};
    job->ps_reply_delta4 = ratio > 0;
    double best = a.t[0];
    for (int i = 0; i < DP_PS_AUTO_N_RATIOS; i++)
        if (ratio == 0 ? a.t[i] < best : dp_ps_auto_code(ratio) == (uint32_t)(2 + i))
            best = a.t[i];
    char took[48];
    dp_ps_auto_name(dp_ps_auto_code(ratio), took, sizeof took);
    snprintf(p->how, sizeof p->how,
             "auto: %s%s (a step's frames at %.1f ns a byte: none %.2f ms, %s %.2f ms)", took,
             ratio > 0 ? " pushes, 4-bit answers" : "", per_byte * 1e9, a.t_none * 1e3,
             ratio > 0 ? "coded" : "best coded", best * 1e3);
}

static int predict_ps(const dp_cost_calibration *cal, const dp_cost_cluster *cl,
                      const dp_cost_job *job, dp_cost_prediction *p, loads *up, loads *down,
                      layout *L, dp_err *err)
{
    if (cl->ps < 1)
        return dp_errf(err, "cluster: %s needs at least one ps task", dp_cost_strategy_name(job->strategy));
    if (cl->workers < 1)
        return dp_errf(err, "cluster: %s needs at least one worker", dp_cost_strategy_name(job->strategy));
    dp_range *r = malloc(sizeof *r * DP_PARTITION_MAX);
    if (!r)
        return dp_errf(err, "out of memory");
    const dp_cost_sparse *sp = job->sparse;
    int k = shards(cal->n_params, sp, cl->ps, r, err);
    if (k < 0) {
        free(r);
        return -1;
    }
    place(L, cl, cl->ps, 0);
    int W = cl->workers;
    double push = 0, pull = 0, shard_apply = 0, ps_cpu[MAX_TASKS] = {0};
    dp_cost_job eff = *job; /* under --compress auto: the codec it takes */
    job = &eff;
    if (eff.compress.kind == DP_COMPRESS_AUTO)
        predict_ps_auto(cal, cl, &eff, r, k, L, down, p);
    /* the top-k coder: a worker's push, a server's coded answer (the rule's
     * upper bound for a 4-bit one, ps_auto.c) */
    double coder = ((eff.compress.kind == DP_COMPRESS_TOPK) +
                    (eff.ps_reply_topk > 0 || eff.ps_reply_delta4)) *
                   (double)cal->n_params * cal->topk_s_per_float;
    memset(up, 0, sizeof *up);
    memset(down, 0, sizeof *down);
    double compute = 0;
    for (int t = 0; t < L->n_tasks; t++) {
        if (!L->trains[t])
            continue;
        double c = step_compute(cal, job->batch, task_speed(L, t, cl, cal->thread_gain));
        if (c > compute)
            compute = c;
        for (int s = 0; s < k; s++) {
            double u, d;
            shard_bytes(sp, job, (double)(r[s].hi - r[s].lo), k, &u, &d);
            int hw = L->host[t], hs = L->host[s]; /* shard s lives on ps task s */
            up->out[hw] += u;
            up->in[hs] += u;
            down->out[hs] += d;
            down->in[hw] += d;
        }
    }
    for (int s = 0; s < k; s++) {
        double n = (double)(r[s].hi - r[s].lo), u, d;
        shard_bytes(sp, job, n, k, &u, &d);
        push += u;
        pull += d;
        for (int t = 0; sp && t < sp->tables; t++)
            n += sp->rows[t] / k * sp->width[t]; /* the rows' updates */
        double a = n * cal->apply_s_per_param;
        if (a > shard_apply)
            shard_apply = a;
        ps_cpu[L->host[s]] += a;
    }
    free(r);
    double busiest_ps_cpu = 0;
    for (int h = 0; h < cl->hosts; h++)
        if (ps_cpu[h] > busiest_ps_cpu)
            busiest_ps_cpu = ps_cpu[h];
    p->replicas = W;
    p->compute_s = compute;
    p->bytes_per_step = push;
    double bw = cl->bandwidth, lat = cl->latency;
    if (job->strategy == DP_COST_PS_ASYNC) {
        /* A worker's round trip alone; the workers' steps interleave, so a
         * round of W steps (one each) takes at least what the busiest link
         * and the busiest ps core need for all of them. */
        double own = (push + pull) / bw + 2 * lat + coder;
        double worker = compute + own + shard_apply;
        double link = fmax(busiest(up, cl->hosts), busiest(down, cl->hosts)) / bw;
        double cpu = W * busiest_ps_cpu;
        p->comm_s = own;
        p->apply_s = shard_apply;
        p->busiest_link_bytes = fmax(busiest(up, cl->hosts), busiest(down, cl->hosts));
        p->step_s = fmax(worker, fmax(link, cpu));
        if (p->step_s == worker)
            p->bottleneck = compute >= own ? DP_COST_BOUND_COMPUTE : DP_COST_BOUND_PS_LINK;
        else
            p->bottleneck = link >= cpu ? DP_COST_BOUND_PS_LINK : DP_COST_BOUND_PS_CPU;
    } else {
        /* In lockstep: every worker pushes at once, the servers sum the pushes
         * (a pass over the shard each, about a quarter of an Adam update's
         * memory traffic) and apply once, then answer every worker at once. */
        double up_t = busiest(up, cl->hosts) / bw, down_t = busiest(down, cl->hosts) / bw;
        double apply = busiest_ps_cpu * (1.0 + W / 4.0);
        p->comm_s = up_t + down_t + 2 * lat + coder;
        p->apply_s = apply;
        p->busiest_link_bytes = fmax(busiest(up, cl->hosts), busiest(down, cl->hosts));
        p->step_s = compute + p->comm_s + apply;
        p->bottleneck = compute >= p->comm_s && compute >= apply ? DP_COST_BOUND_COMPUTE
                        : p->comm_s >= apply                     ? DP_COST_BOUND_PS_LINK
                                                                 : DP_COST_BOUND_PS_CPU;
    }
    return 0;
}

int dp_cost_predict(const dp_cost_calibration *cal, const dp_cost_cluster *cl,
                    const dp_cost_job *job, dp_cost_prediction *out, dp_err *err)
{
    if (check_inputs(cal, cl, job, err) < 0)
        return -1;
    dp_cost_prediction p;
    memset(&p, 0, sizeof p);
    layout *L = malloc(sizeof *L);
    loads *up = malloc(sizeof *up), *down = malloc(sizeof *down);
    int rc = 0;
    if (!L || !up || !down) {
        rc = dp_errf(err, "out of memory");
        goto done;
    }
    double eval_speed = 1.0; /* of the task that validates */
    double P = (double)cal->n_params;
    switch (job->strategy) {
    case DP_COST_SINGLE: {
        dp_cost_cluster one = *cl;
        one.workers = 1;
        one.ps = 0;
        one.chief = 0;
        place(L, &one, 0, 0);
        eval_speed = task_speed(L, 0, &one, cal->thread_gain);
        p.replicas = 1;
        p.compute_s = step_compute(cal, job->batch, eval_speed);
        p.apply_s = P * cal->apply_s_per_param;
        p.step_s = p.compute_s + p.apply_s;
        p.bottleneck = DP_COST_BOUND_COMPUTE;
        break;
    }
    case DP_COST_PS_ASYNC:
    case DP_COST_PS_SYNC:
        if (predict_ps(cal, cl, job, &p, up, down, L, err) < 0) {
            rc = -1;
            goto done;
        }
        /* The chief validates alone on its host's share of cores. */
        eval_speed = cl->chief ? task_speed(L, cl->ps, cl, cal->thread_gain) : 1.0;
        if (eval_speed <= 0)
            eval_speed = 1.0;
        break;
    case DP_COST_ALLREDUCE: {
        if (cl->ps > 0) {
            rc = dp_errf(err, "cluster: allreduce takes no ps task (the cluster has %d)", cl->ps);
            goto done;
        }
        place(L, cl, 0, 1);
        int n = L->n_train;
        if (n < 1) {
            rc = dp_errf(err, "cluster: allreduce needs at least one worker or a chief");
            goto done;
        }
        /* PowerSGD's four products a matrix, at the record's multiply-add
         * rate (forward + backward: about 3 per parameter). */
        double psgd = job->compress.kind == DP_COMPRESS_POWERSGD
                          ? job->psgd_madds * cal->sample_s / (3.0 * P) : 0;
        double compute = 0;
        int *hosts = malloc(sizeof(int) * (size_t)n);
        if (!hosts) {
            rc = dp_errf(err, "out of memory");
            goto done;
        }
        for (int t = 0, i = 0; t < L->n_tasks; t++) {
            double speed = task_speed(L, t, cl, cal->thread_gain);
            double c = step_compute(cal, job->batch, speed) + psgd / speed;
            if (c > compute)
                compute = c;
            if (L->trains[t])
                hosts[i++] = L->host[t];
        }
        eval_speed = task_speed(L, 0, cl, cal->thread_gain);
        int gathered = 0;
        if (job->sparse)
            dp_cost_allreduce_sparse_bytes(cal->n_params, job->sparse, n, job->bucket_bytes,
                                           &gathered);
        cost_ar_in in = {
            .n = n, .host = hosts, .hosts = cl->hosts,
            .floats = cal->n_params - (gathered ? job->sparse->table_floats : 0),
            .bucket_bytes = job->bucket_bytes,
            .extra_ring_bytes = gathered ? dp_cost_gather_bytes(job->sparse, n, 0) : 0,
            .extra_hops = gathered ? n - 1 : 0,
            .algo = job->algo, .codec = job->compress, .psgd_floats = job->psgd_floats,
            .bandwidth = cl->bandwidth, .local_bandwidth = cl->local_bandwidth,
            .latency = cl->latency, .codec_s = cal->codec_s_per_float};
        cost_ar_out ar;
        cost_allreduce(&in, &ar);
        free(hosts);
        p.replicas = n;
        p.compute_s = compute;
        p.bytes_per_step = ar.sent_bytes;
        p.busiest_link_bytes = ar.busiest_link;
        p.comm_s = ar.comm_s;
        snprintf(p.how, sizeof p.how, "%s", ar.how);
        p.apply_s = P * cal->apply_s_per_param;
        p.step_s = compute + p.comm_s + p.apply_s;
        p.bottleneck = compute >= p.comm_s ? DP_COST_BOUND_COMPUTE : DP_COST_BOUND_RING;
        break;
    }
    default:
        rc = dp_errf(err, "job: unknown strategy %d", (int)job->strategy);
        goto done;
    }
    /* Every replica takes ceil(ceil(N / w) / b) steps an epoch
     * (docs/strategies.md, "Data: what a worker trains on"). */
    long per = (job->train_records + p.replicas - 1) / p.replicas;
    p.steps_per_epoch = (per + job->batch - 1) / job->batch;
    /* Validation is a forward pass, about a third of forward + backward. */
    double eval = job->val_records * cal->sample_s / 3.0 / eval_speed;
    p.epoch_s = p.steps_per_epoch * p.step_s;
    if (job->strategy == DP_COST_SINGLE || job->strategy == DP_COST_ALLREDUCE) {
        p.epoch_s += eval; /* the others wait at the next step for the evaluator */
        p.total_s = job->epochs * p.epoch_s;
    } else {
        /* ps workers go on while the chief validates; only the last one counts. */
        p.total_s = job->epochs * p.epoch_s + eval;
    }
    switch (p.bottleneck) {
    case DP_COST_BOUND_COMPUTE:
        snprintf(p.why, sizeof p.why,
                 "compute: %.2f ms a step of %.2f ms (communication %.2f ms, %.2f MB sent a step)",
                 p.compute_s * 1e3, p.step_s * 1e3, p.comm_s * 1e3, p.bytes_per_step / 1e6);
        break;
    case DP_COST_BOUND_PS_LINK:
        snprintf(p.why, sizeof p.why,
                 "ps link: the busiest host moves %.2f MB a round (%.2f ms at %.0f MB/s); compute "
                 "%.2f ms a step",
                 p.busiest_link_bytes / 1e6, p.busiest_link_bytes / cl->bandwidth * 1e3,
                 cl->bandwidth / 1e6, p.compute_s * 1e3);
        break;
    case DP_COST_BOUND_PS_CPU:
        snprintf(p.why, sizeof p.why,
                 "ps cpu: the busiest server applies %d pushes a round, %.2f ms; compute %.2f ms a "
                 "step",
                 p.replicas, p.step_s * 1e3, p.compute_s * 1e3);
        break;
    case DP_COST_BOUND_RING:
        snprintf(p.why, sizeof p.why,
                 "ring: %.2f MB sent a step by replica 0 of %d (%s), %.2f ms with its latency "
                 "hops; compute %.2f ms",
                 p.bytes_per_step / 1e6, p.replicas, p.how, p.comm_s * 1e3, p.compute_s * 1e3);
        break;
    default:
        break;
    }
    *out = p;
done:
    free(L);
    free(up);
    free(down);
    return rc;
}

int dp_cost_recommend(const dp_cost_calibration *cal, const dp_cost_cluster *cl,
                      const dp_cost_job *job, dp_cost_prediction out[DP_COST_STRATEGY_COUNT],
                      dp_cost_strategy order[DP_COST_STRATEGY_COUNT], char *text, size_t text_cap,
                      dp_err *err)
{
    int n = 0;
    size_t used = 0;
    if (text_cap)
        text[0] = '\0';
    for (int s = 0; s < DP_COST_STRATEGY_COUNT; s++) {
        dp_cost_job j = *job;
        j.strategy = (dp_cost_strategy)s;
        if (s != DP_COST_ALLREDUCE && j.compress.kind == DP_COMPRESS_POWERSGD)
            j.compress.kind = DP_COMPRESS_NONE; /* allreduce's alone */
        dp_cost_cluster c = *cl;
        if (s == DP_COST_ALLREDUCE) {
            /* The same machines: every task, ps included, becomes a replica
             * (the source experiment's 1 + 6 + 2 against 9 workers). */
            c.workers += c.ps;
            c.ps = 0;
        }
        if (s != DP_COST_SINGLE && (s == DP_COST_ALLREDUCE ? c.workers + c.chief < 2 : c.ps < 1 || c.workers < 1))
            continue;
        if (dp_cost_predict(cal, &c, &j, &out[s], err) < 0)
            return -1;
        order[n++] = (dp_cost_strategy)s;
    }
    for (int i = 1; i < n; i++) /* insertion sort, fastest first */
        for (int k = i; k > 0 && out[order[k]].total_s < out[order[k - 1]].total_s; k--) {
            dp_cost_strategy t = order[k];
            order[k] = order[k - 1];
            order[k - 1] = t;
        }
    for (int i = 0; i < n && used < text_cap; i++) {
        const dp_cost_prediction *p = &out[order[i]];
        int w = snprintf(text + used, text_cap - used, "%d. %-9s %8.1f s (%d replicas, %.2f ms a step) %s\n",
                         i + 1, dp_cost_strategy_name(order[i]), p->total_s, p->replicas,
                         p->step_s * 1e3, p->why);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    if (n > 0 && used < text_cap) {
        const dp_cost_prediction *b = &out[order[0]];
        snprintf(text + used, text_cap - used,
                 "Suits this cluster: %s, bound by %s.%s\n", dp_cost_strategy_name(order[0]),
                 dp_cost_bottleneck_name(b->bottleneck),
                 order[0] == DP_COST_PS_ASYNC
                     ? " Its gradients are stale by up to the number of workers' steps, so it may "
                       "need a smaller learning rate to reach the accuracy of the synchronous modes."
                     : "");
    }
    return n;
}
