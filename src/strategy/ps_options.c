/* The parameter-server family's settings (ps-async, ps-sync, ps-ssp,
 * ps-dssp, model-avg): the options, their defaults and checks, their part
 * of the run identity and the launcher's restart policy for a lost ps task.
 * A new option of the family is one line of DP_PS_OPTIONS (ps_family.h),
 * which makes its field, its default and its line in `opts`; it is read
 * where it is used. */
#include <stdio.h>
#include <string.h>

#include "downpour/launcher.h"
#include "downpour/partition.h"
#include "strategy/model_parallel_options.h"
#include "strategy/ps_family.h"
#include "strategy/ps_host.h"

_Static_assert(sizeof(dp_ps_settings) <= DP_STRATEGY_CFG_MAX, "ps settings too big");

static const dp_ps_settings defaults = {DP_PS_OPTIONS(DP_OPT_DEFAULT)};

#define DP_OPT_SETTINGS dp_ps_settings
static const dp_opt opts[] = {DP_PS_OPTIONS(DP_OPT_LINE)};
#undef DP_OPT_SETTINGS

/* "LO:HI" of --staleness-range, each in [0, 1000000], LO <= HI. */
static int parse_range(const char *s, int *lo, int *hi, dp_err *err)
{
    char buf[64];
    long a, b;
    const char *colon = strchr(s, ':');
    if (!colon || strlen(s) >= sizeof buf)
        return dp_errf(err, "--staleness-range '%s': expected LO:HI", s);
    memcpy(buf, s, (size_t)(colon - s));
    buf[colon - s] = '\0';
    if (dp_parse_long(buf, 0, 1000000, &a, "--staleness-range LO", err) < 0 ||
        dp_parse_long(colon + 1, 0, 1000000, &b, "--staleness-range HI", err) < 0)
        return -1;
    if (a > b)
        return dp_errf(err, "--staleness-range %ld:%ld: LO must not exceed HI", a, b);
    *lo = (int)a;
    *hi = (int)b;
    return 0;
}

int dp_ps_settings_apply(const dp_ps_settings *ps, dp_ps_config *out, dp_err *err)
{
    dp_ps_config_init(out);
    out->fetch_every = ps->fetch_every;
    out->push_every = ps->push_every;
    out->push_behind = ps->push_behind;
    out->push_inline = ps->push_inline;
    out->staleness = ps->staleness;
    out->period = ps->period;
    out->min_shard_bytes = ps->min_shard_bytes;
    out->max_shards = ps->max_shards;
    out->replicas = ps->replicas;
    if (dp_compress_parse(ps->compress, &out->compress, err) < 0)
        return dp_err_prefix(err, "--compress");
    if (ps->ps_reply && strncmp(ps->ps_reply, "topk:", 5) == 0) {
        dp_compress r;
        if (dp_compress_parse(ps->ps_reply, &r, err) < 0)
            return dp_err_prefix(err, "--ps-reply");
        out->reply_topk = r.ratio;
    } else if (ps->ps_reply && strcmp(ps->ps_reply, "bf16") != 0 &&
               strcmp(ps->ps_reply, "f32") != 0 && strcmp(ps->ps_reply, "delta4") != 0) {
        return dp_errf(err, "--ps-reply: '%s' is not f32, bf16, delta4 or topk:RATIO",
                       ps->ps_reply);
    }
    out->reply_delta4 = ps->ps_reply && strcmp(ps->ps_reply, "delta4") == 0;
    out->reply16 = ps->ps_reply && strcmp(ps->ps_reply, "bf16") == 0;
    return parse_range(ps->staleness_range, &out->staleness_lo, &out->staleness_hi, err);
}

/* Under another strategy the family's options go unused, but a range that
 * does not parse is still refused, as it always was (--model-parallel is
 * model-parallel's to refuse there). */
static int parses(const void *own, dp_err *err)
{
    dp_ps_config pc;
    return dp_ps_settings_apply(own, &pc, err);
}

/* ... and --ps-reply, which only the family's servers answer by. */
static int foreign(const void *own, const dp_train_config *cfg, dp_err *err)
{
    const dp_ps_settings *ps = own;
    if (parses(own, err) < 0)
        return -1;
    if (dp_ps_push_parse(ps->ps_push) != DP_PS_PUSH_WORKER)
        return dp_errf(err, "--ps-push %s: strategy %s has no parameter servers; ps-sync "
                            "pushes by host (docs/strategies.md, \"ps-sync: one push per "
                            "host\")", ps->ps_push, cfg->strategy);
    if (ps->ps_reply && strcmp(ps->ps_reply, "f32") != 0)
        return dp_errf(err, "--ps-reply %s: strategy %s has no parameter servers answering "
                            "workers; ps-async, ps-sync, ps-ssp, ps-dssp and model-avg do "
                            "(docs/strategies.md, \"ps family: compression\")",
                       ps->ps_reply, cfg->strategy);
    return 0;
}

/* --compress under the family (docs/strategies.md, "ps family:
 * compression"): the workers' gradient pushes, coded with error feedback;
 * what cannot be coded that way is refused with why. */
static int check_compress(const dp_ps_settings *ps, const dp_train_config *cfg, dp_err *err)
{
    dp_compress c;
    if (dp_compress_parse(ps->compress, &c, err) < 0)
        return dp_err_prefix(err, "--compress");
    dp_ps_config pc;
    if (dp_ps_settings_apply(ps, &pc, err) < 0)
        return -1;
    const char *why = NULL, *rwhy = NULL;
    int avg = cfg->strategy && strcmp(cfg->strategy, "model-avg") == 0;
    if (c.kind == DP_COMPRESS_POWERSGD)
        why = "powersgd: its factors are all-reduced (the sum of the replicas' P and Q); a "
              "server cannot sum them from pushes at different steps: choose bf16, fp16 or "
              "topk:RATIO";
    else if (c.kind != DP_COMPRESS_NONE && cfg->strategy && strcmp(cfg->strategy, "model-avg") == 0)
        why = "model-avg pushes parameters, not gradients, and a parameter's rounding is no "
              "error a later push could feed back: --ps-reply bf16 halves its answers";
    else if (c.kind != DP_COMPRESS_NONE && ps->model_parallel > 0)
        why = "not with --model-parallel (a replica's tasks push slices of their own)";
    else if (c.kind != DP_COMPRESS_NONE && cfg->sum_chunk > 0)
        why = "not with --sum-chunk (its pushes carry each chunk's gradient whole)";
    else if (c.kind == DP_COMPRESS_AUTO && pc.reply16)
        why = "auto chooses the answers' coding too: not with --ps-reply bf16";
    if (why)
        return dp_errf(err, "--compress %s (docs/strategies.md, \"ps family: compression\")",
                       why);
    /* coded answers: the worker's copy must change only by its answers */
    int coded = pc.reply_topk > 0 || pc.reply_delta4;
    if (coded && avg)
        rwhy = "model-avg's workers train their copy between averages, so a server cannot "
               "know what a worker holds: --ps-reply bf16 halves its answers";
    else if (coded && ps->model_parallel > 0)
        rwhy = "not with --model-parallel (a replica's tasks pull slices of their own)";
    else if (coded && c.kind == DP_COMPRESS_AUTO)
        rwhy = "not with --compress auto, which chooses the answers' coding itself";
    if (rwhy)
        return dp_errf(err, "--ps-reply %s: %s (docs/strategies.md, \"ps family: "
                            "compression\")", ps->ps_reply, rwhy);
    return 0;
}

/* --ps-push (docs/strategies.md, "ps-sync: one push per host"): a host's
 * workers in one push where a server's round sums them anyway, its pushes
 * plain f32 gradients of the whole model. */
static int check_push(const dp_ps_settings *ps, const dp_train_config *cfg, dp_err *err)
{
    int mode = dp_ps_push_parse(ps->ps_push);
    if (mode < 0)
        return dp_errf(err, "--ps-push: '%s' is not worker, host or auto", ps->ps_push);
    if (mode == DP_PS_PUSH_WORKER)
        return 0;
    dp_ps_config pc;
    if (dp_ps_settings_apply(ps, &pc, err) < 0)
        return -1;
    const char *why = NULL;
    if (!cfg->strategy || strcmp(cfg->strategy, "ps-sync") != 0)
        why = "only ps-sync sums every worker's gradient into one update; the other modes "
              "apply (or average) each worker's push at its own clock, which a host's sum "
              "would tie together";
    else if (pc.compress.kind != DP_COMPRESS_NONE)
        why = "not with --compress (the host's sum goes f32)";
    else if (pc.reply16 || pc.reply_topk > 0 || pc.reply_delta4)
        why = "not with --ps-reply other than f32 (the leader hands its answer on whole)";
    else if (cfg->sum_chunk > 0)
        why = "not with --sum-chunk (its pushes carry each chunk's gradient whole)";
    else if (pc.replicas > 1)
        why = "not with --ps-replicas 2";
    else if (cfg->spare_workers > 0)
        why = "not with --spare-workers (the hosts are formed when the run starts)";
    if (why)
        return dp_errf(err, "--ps-push %s: %s (docs/strategies.md, \"ps-sync: one push per "
                            "host\")", ps->ps_push, why);
    return 0;
}

static int check(const void *own, const dp_train_config *cfg, dp_err *err)
{
    const dp_ps_settings *ps = own;
    if (parses(own, err) < 0 || check_compress(ps, cfg, err) < 0 || check_push(ps, cfg, err) < 0)
        return -1;
    if (ps->model_parallel == 0)
        return 0;
    /* of the family only ps-async takes model-parallel replicas (ps_family.c, mp_layout) */
    if (!cfg->strategy || strcmp(cfg->strategy, "ps-async") != 0)
        return dp_errf(err, "--model-parallel is for --strategy model-parallel, or ps-async "
                            "(model-parallel replicas training against ps shards)");
    return dp_mp_settings_check_model(cfg->model, ps->model_parallel, err);
}

/* Every strategy's checkpoints have carried this fragment (the ps family
 * owned no settings then): those without ps settings write the defaults. */
void dp_ps_settings_identity(const dp_ps_settings *ps, char *buf, size_t cap)
{
    dp_ps_config pc;
    dp_err ignored;
    if (dp_ps_settings_apply(ps ? ps : &defaults, &pc, &ignored) < 0)
        dp_ps_config_init(&pc);
    size_t n = strlen(buf);
    snprintf(buf + n, n < cap ? cap - n : 0,
             " fetch_every=%d push_every=%d staleness=%d staleness_range=%d:%d period=%d "
             "min_shard_bytes=%zu max_shards=%d",
             pc.fetch_every, pc.push_every, pc.staleness, pc.staleness_lo, pc.staleness_hi,
             pc.period, pc.min_shard_bytes, pc.max_shards);
}

/* Part 1: " compress=KIND" (topk with its ratio) and " ps_reply=bf16",
 * each only when on, as allreduce writes its compress=: the checkpoints
 * then hold the workers' residuals of that codec (docs/checkpoints.md). */
static void identity(const void *own, int part, char *buf, size_t cap)
{
    const dp_ps_settings *ps = own;
    if (part == 0) {
        dp_ps_settings_identity(own, buf, cap);
        return;
    }
    dp_ps_config pc;
    dp_err ignored;
    if (dp_ps_settings_apply(ps, &pc, &ignored) < 0)
        return;
    size_t n = strlen(buf);
    if (pc.compress.kind == DP_COMPRESS_TOPK)
        snprintf(buf + n, n < cap ? cap - n : 0, " compress=topk:%.9g", pc.compress.ratio);
    else if (pc.compress.kind != DP_COMPRESS_NONE)
        snprintf(buf + n, n < cap ? cap - n : 0, " compress=%s",
                 dp_compress_kind_name(pc.compress.kind));
    n = strlen(buf);
    if (pc.reply16)
        snprintf(buf + n, n < cap ? cap - n : 0, " ps_reply=bf16");
    else if (pc.reply_topk > 0)
        snprintf(buf + n, n < cap ? cap - n : 0, " ps_reply=topk:%.9g", pc.reply_topk);
    else if (pc.reply_delta4)
        snprintf(buf + n, n < cap ? cap - n : 0, " ps_reply=delta4");
}

int dp_ps_restart(int replicas, const dp_strategy_ops *ops, dp_role role, int checkpoints,
                  char *why, size_t cap)
{
    if (role == DP_ROLE_PS && replicas >= 2) {
        /* Not restarted: the clients stay with the backups, and a fresh ps
         * would hold the initial parameters. */
        snprintf(why, cap, "%s survives a lost ps with --ps-replicas %d: its shards go on on "
                 "their backups", ops->name, replicas);
        return DP_LAUNCH_NO_RESTART;
    }
    if (role == DP_ROLE_PS) {
        /* Restarted, it reloads its shard from the newest checkpoint. */
        snprintf(why, cap, "%s survives a lost ps that is restarted: it reloads its shard from "
                 "the newest checkpoint", ops->name);
        return DP_LAUNCH_IF_RESTARTED;
    }
    return dp_strategy_restart(ops, NULL, role, checkpoints, why, cap);
}

static int restart(const void *own, const dp_strategy_ops *ops, dp_role role, int checkpoints,
                   char *why, size_t cap)
{
    const dp_ps_settings *ps = own;
    if (ps->model_parallel > 0 && (role == DP_ROLE_WORKER || role == DP_ROLE_PS)) {
        /* A worker held slices of a model-parallel replica, and a ps shard
         * holds slice order, which a restarted ps's restore does not
         * translate; --resume does (dp_ps_family_serve): the whole job
         * goes on from the newest checkpoint (docs/faults.md). */
        char who[64];
        snprintf(who, sizeof who, "%s --model-parallel", ops->name);
        return dp_strategy_restart_all(who, role, checkpoints, why, cap);
    }
    return dp_ps_restart(ps->replicas, ops, role, checkpoints, why, cap);
}

const dp_strategy_conf dp_ps_conf = {
    .opts = opts, .n_opts = (int)(sizeof opts / sizeof opts[0]),
    .size = sizeof(dp_ps_settings), .defaults = &defaults,
    .foreign = foreign, .check = check, .identity = identity, .restart = restart,
};
