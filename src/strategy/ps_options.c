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
    return parse_range(ps->staleness_range, &out->staleness_lo, &out->staleness_hi, err);
}

/* Under another strategy the family's options go unused, but a range that
 * does not parse is still refused, as it always was (--model-parallel is
 * model-parallel's to refuse there). */
static int foreign(const void *own, const dp_train_config *cfg, dp_err *err)
{
    (void)cfg;
    dp_ps_config pc;
    return dp_ps_settings_apply(own, &pc, err);
}

static int check(const void *own, const dp_train_config *cfg, dp_err *err)
{
    const dp_ps_settings *ps = own;
    if (foreign(own, cfg, err) < 0)
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

static void identity(const void *own, int part, char *buf, size_t cap)
{
    if (part == 0)
        dp_ps_settings_identity(own, buf, cap);
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
