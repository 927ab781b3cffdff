/* allreduce's settings: its options, their defaults and checks and its part
 * of the run identity (docs/architecture.md, "A strategy's settings"). */
#include "strategy/allreduce_options.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "downpour/env.h"
#include "downpour/launcher.h"
#include "downpour/model.h"
#include "downpour/optim.h"
#include "downpour/powersgd.h"
#include "downpour/ring.h"
#include "downpour/sparse.h"
#include "downpour/train_config.h"
#include "strategy/ps_family.h"

_Static_assert(sizeof(dp_allreduce_settings) <= DP_STRATEGY_CFG_MAX, "allreduce settings too big");

static const dp_allreduce_settings defaults = {DP_ALLREDUCE_OPTIONS(DP_OPT_DEFAULT)};

#define DP_OPT_SETTINGS dp_allreduce_settings
static const dp_opt opts[] = {DP_ALLREDUCE_OPTIONS(DP_OPT_LINE)};
#undef DP_OPT_SETTINGS

dp_overlap dp_allreduce_overlap(const dp_allreduce_settings *a)
{
    if (a->sync_bn || a->no_overlap || (a->overlap && strcmp(a->overlap, "off") == 0))
        return DP_OVERLAP_OFF;
    return a->overlap && strcmp(a->overlap, "on") == 0 ? DP_OVERLAP_ON : DP_OVERLAP_AUTO;
}

int dp_allreduce_algo_of(const dp_allreduce_settings *a)
{
    return a->allreduce_algo ? dp_allreduce_algo_parse(a->allreduce_algo) : DP_ALGO_AUTO;
}

void dp_allreduce_compress_of(const dp_allreduce_settings *a, dp_compress *out)
{
    dp_err e;
    if (dp_compress_parse(a->compress, out, &e) < 0)
        out->kind = DP_COMPRESS_NONE;
}

/* --overlap's value and the flags against each other: refused under any
 * strategy, as train always did. */
static int check_overlap(const dp_allreduce_settings *a, dp_err *err)
{
    const char *o = a->overlap;
    if (o && strcmp(o, "auto") != 0 && strcmp(o, "on") != 0 && strcmp(o, "off") != 0)
        return dp_errf(err, "--overlap: '%s' is not auto, on or off", o);
    if (a->sync_bn && o && strcmp(o, "on") == 0)
        return dp_errf(err, "--sync-bn sums batch norm's statistics on the training thread "
                            "between the gradient buckets, so the buckets cannot be reduced "
                            "beside backprop: leave out --overlap on");
    if (o && a->no_overlap && strcmp(o, "off") != 0)
        return dp_errf(err, "--no-overlap contradicts --overlap %s", o);
    return 0;
}

/* --sync-bn against the device and the model: one without batch norm is
 * refused, the flag would do nothing (docs/strategies.md, "Buffers"). */
static int check_sync_bn(const dp_train_config *cfg, dp_err *err)
{
    if (cfg->device.kind != DP_DEVICE_CPU)
        return dp_errf(err, "--sync-bn: not with --device yet: the bn sums run in the CPU "
                            "layer (docs/strategies.md, \"Buffers\")");
    /* a spec that does not parse is the loop's to refuse, with its message */
    dp_model m;
    dp_err e;
    if (dp_model_describe(&m, cfg->model, &e) < 0)
        return 0;
    int rc = m.external ? dp_errf(err, "--sync-bn: not for an external model (%s): its batch "
                                       "norm layers run in its caller's forward, which downpour "
                                       "cannot reach (docs/python.md, \"PyTorch\")",
                                  m.name)
             : m.n_buffers ? 0
                         : dp_errf(err, "--sync-bn: model %s has no batch norm layer (bn), so "
                                        "there are no batch statistics to sum. Hint: leave "
                                        "--sync-bn out, or add bn layers (docs/models.md)",
                                   m.name);
    dp_model_free(&m);
    return rc;
}

/* The memory a replica may count on: $DOWNPOUR_REPLICA_MEMORY (bytes,
 * checked), else the machine's physical memory (0: unknown). */
static int replica_memory(double *have, const char **what, dp_err *err)
{
    long v = 0;
    if (dp_env_long("DOWNPOUR_REPLICA_MEMORY", 1, LONG_MAX, 0, &v, err) < 0)
        return -1;
    if (v > 0) {
        *what = "DOWNPOUR_REPLICA_MEMORY";
        *have = (double)v;
        return 0;
    }
    *what = "physical memory";
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    *have = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    return 0;
}

/* Every replica holds a sparse table whole, with its gradient and the
 * optimiser's slots (docs/strategies.md, "Sparse tables under allreduce"):
 * a model whose replica does not fit the memory is refused, naming both. */
static int check_fits(const dp_train_config *cfg, dp_err *err)
{
    dp_model m;
    dp_err e;
    if (!cfg->model || dp_model_describe(&m, cfg->model, &e) < 0)
        return 0; /* the loop refuses a spec that does not parse, with its message */
    dp_sparse_table t[DP_SPARSE_MAX];
    int k = dp_model_sparse_tables(&m, t, DP_SPARSE_MAX);
    size_t table = 0;
    for (int i = 0; i < k; i++)
        table += (size_t)t[i].rows * (size_t)t[i].width;
    int slots = dp_optim_slots(cfg->optim.kind);
    double need = (double)m.n_params * sizeof(float) * (2 + slots);
    const char *what;
    double have = 0;
    int rc = k > 0 ? replica_memory(&have, &what, err) : 0;
    if (rc == 0 && k > 0 && have > 0 && need > have)
        rc = dp_errf(err, "allreduce: every replica holds %s's sparse table(s) whole (%zu floats, "
                          "%.1f MiB): with the gradient and %d optimiser slot(s) a replica needs "
                          "%.1f MiB, and the memory is %.1f MiB (%s). Hint: a ps strategy keeps "
                          "the tables on the ps tasks and moves only the rows a batch touches "
                          "(docs/strategies.md, \"Sparse rows\")",
                     m.name, table, (double)table * 4 / 1048576.0, slots, need / 1048576.0,
                     have / 1048576.0, what);
    dp_model_free(&m);
    return rc;
}

/* --compress powersgd:RANK against the other settings and the model
 * (docs/strategies.md, "allreduce: compression"): it needs the whole
 * gradient after backprop and a weight matrix its rank makes smaller (a
 * sparse table is never one: it goes by its rows, or whole). */
static int check_powersgd(const dp_allreduce_settings *a, const dp_compress *c,
                          const dp_train_config *cfg, dp_err *err)
{
    if (a->overlap && strcmp(a->overlap, "on") == 0)
        return dp_errf(err, "--compress %s factors each weight matrix whole, after backprop, so "
                            "nothing can be reduced beside it: leave out --overlap on",
                       a->compress);
    dp_model m;
    dp_err e;
    if (!cfg->model || dp_model_describe(&m, cfg->model, &e) < 0)
        return 0; /* the loop refuses a spec that does not parse, with its message */
    dp_psgd_plan plan;
    int rc = 0;
    if (dp_powersgd_matrices(&m, c->rank, NULL, 0, &plan) == 0)
        rc = plan.max_rank
                 ? dp_errf(err, "--compress %s: no weight matrix of model %s is smaller as rank-%d "
                                "factors (of %d matrices, the largest rank that makes one "
                                "smaller is %d): take powersgd:%d or less",
                           a->compress, m.name, c->rank, plan.matrices, plan.max_rank,
                           plan.max_rank)
                 : dp_errf(err, "--compress %s: model %s has no weight matrix that factors "
                                "make smaller (docs/strategies.md, \"allreduce: compression\")",
                           a->compress, m.name);
    dp_model_free(&m);
    return rc;
}

static int check(const void *own, const dp_train_config *cfg, dp_err *err)
{
    const dp_allreduce_settings *a = own;
    if (check_overlap(a, err) < 0)
        return -1;
    if (dp_allreduce_algo_of(a) < 0)
        return dp_errf(err, "--allreduce-algo: '%s' is not ring, direct, hier or auto",
                       a->allreduce_algo);
    dp_compress c;
    if (dp_compress_parse(a->compress, &c, err) < 0)
        return dp_err_prefix(err, "--compress");
    if (c.kind == DP_COMPRESS_POWERSGD && check_powersgd(a, &c, cfg, err) < 0)
        return -1;
    if (c.kind != DP_COMPRESS_NONE && cfg->device.kind != DP_DEVICE_CPU)
        return dp_errf(err, "--compress: not with --device yet: the devices sum with NCCL or "
                            "host staging, uncompressed (docs/strategies.md, \"allreduce: "
                            "compression\")");
    if (a->no_nccl && cfg->device.kind == DP_DEVICE_CPU)
        return dp_errf(err, "--no-nccl: without --device the gradients are summed on the host "
                            "already (docs/gpu.md, \"Strategies\"): leave it out, or add "
                            "--device");
    if (a->sync_bn && check_sync_bn(cfg, err) < 0)
        return -1;
    return check_fits(cfg, err);
}

static int foreign(const void *own, const dp_train_config *cfg, dp_err *err)
{
    const dp_allreduce_settings *a = own;
    if (check_overlap(a, err) < 0)
        return -1;
    if (a->dense)
        return dp_errf(err, "--allreduce-dense: strategy %s does not all-reduce; the parameter "
                            "servers' own is --ps-dense (docs/strategies.md, \"Sparse rows\")",
                       cfg->strategy);
    if (a->sync_bn)
        return dp_errf(err, "--sync-bn: strategy %s does not sum batch statistics across "
                            "tasks; allreduce does, whose replicas step together over one ring "
                            "(docs/strategies.md, \"Buffers\")", cfg->strategy);
    /* the ps family reads --compress too (DP_OPT_ALSO) and checks it itself */
    const dp_strategy_ops *ops = cfg->strategy ? dp_strategy_find(cfg->strategy, NULL) : NULL;
    if (a->compress && strcmp(a->compress, "none") != 0 && !(ops && ops->conf == &dp_ps_conf))
        return dp_errf(err, "--compress: strategy %s does not compress yet; allreduce and the "
                            "parameter-server family do (docs/strategies.md, \"allreduce: "
                            "compression\", \"ps family: compression\")",
                       cfg->strategy);
    if (a->allreduce_algo)
        return dp_errf(err, "--allreduce-algo: strategy %s has no all-reduce ring; allreduce "
                            "does (docs/strategies.md, \"allreduce: all-reduce algorithms\")",
                       cfg->strategy);
    if (a->no_nccl)
        return dp_errf(err, "--no-nccl: strategy %s does not sum gradients with NCCL; "
                            "allreduce does, with --device (docs/gpu.md, \"Strategies\")",
                       cfg->strategy);
    return 0;
}

/* Part 0: the ps fragment every checkpoint carries (ps_options.c); part 1:
 * " sync_bn=1" and " compress=KIND" (topk with its ratio, powersgd with its rank), each written
 * only when on so older checkpoints still resume.  --compress is the run's:
 * its checkpoints hold the replicas' residuals of that codec, which another
 * (or none) would not continue bit for bit (docs/checkpoints.md, "What
 * resumes bit for bit"). */
static void identity(const void *own, int part, char *buf, size_t cap)
{
    const dp_allreduce_settings *a = own;
    if (part == 0) {
        dp_ps_settings_identity(NULL, buf, cap);
        return;
    }
    size_t n = strlen(buf);
    if (a->sync_bn) {
        snprintf(buf + n, n < cap ? cap - n : 0, " sync_bn=1");
        n = strlen(buf);
    }
    dp_compress c;
    dp_allreduce_compress_of(a, &c);
    if (c.kind == DP_COMPRESS_TOPK)
        snprintf(buf + n, n < cap ? cap - n : 0, " compress=topk:%.9g", c.ratio);
    else if (c.kind == DP_COMPRESS_POWERSGD)
        snprintf(buf + n, n < cap ? cap - n : 0, " compress=powersgd:%d", c.rank);
    else if (c.kind != DP_COMPRESS_NONE)
        snprintf(buf + n, n < cap ? cap - n : 0, " compress=%s", dp_compress_kind_name(c.kind));
}

/* The launcher's question: the chief (or worker 0, which plays it) leads
 * the ring at the start, and the lowest survivor takes the lead over when it
 * is lost (docs/faults.md, "All-reduce"); restarted, it rejoins as any
 * replica. */
static int restart(const void *own, const dp_strategy_ops *ops, dp_role role, int checkpoints,
                   char *why, size_t cap)
{
    (void)own;
    if (role == DP_ROLE_CHIEF) {
        snprintf(why, cap, "%s survives its leader: the lowest replica left evaluates and "
                 "writes from then on", ops->name);
        return DP_LAUNCH_HANDS_OVER;
    }
    return dp_strategy_restart(ops, NULL, role, checkpoints, why, cap);
}

const dp_strategy_conf dp_allreduce_conf = {
    .opts = opts, .n_opts = (int)(sizeof opts / sizeof opts[0]),
    .size = sizeof(dp_allreduce_settings), .defaults = &defaults,
    .foreign = foreign, .check = check, .identity = identity, .restart = restart,
};
