#include "cli/cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/log.h"
#include "downpour/model.h"
#include "downpour/status.h"
#include "exec/mp_slice.h"

static const cli_opt *find_opt(const cli_opt *opts, int n, const char *name, size_t len)
{
    for (int i = 0; i < n; i++)
        if (strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0)
            return &opts[i];
    return NULL;
}

static void print_default(FILE *f, const cli_opt *o)
{
    switch (o->kind) {
    case CLI_STR: {
        const char *v = *(const char **)o->dst;
        if (v)
            fprintf(f, " (default: %s)", v);
        break;
    }
    case CLI_INT:
        fprintf(f, " (default: %ld)", *(long *)o->dst);
        break;
    case CLI_NUM:
        if (!isnan(*(double *)o->dst)) /* NAN: unset, the help text says what applies */
            fprintf(f, " (default: %g)", *(double *)o->dst);
        break;
    case CLI_FLAG:
    case CLI_KIND_COUNT:
        break;
    }
}

void cli_print_help(const char *usage, const cli_opt *opts, int n_opts)
{
    FILE *f = stdout; /* asked for: not an error */
    fprintf(f, "usage: %s\n\noptions:\n", usage);
    for (int i = 0; i < n_opts; i++) {
        const cli_opt *o = &opts[i];
        char left[64];
        if (o->kind == CLI_FLAG)
            snprintf(left, sizeof left, "--%s", o->name);
        else
            snprintf(left, sizeof left, "--%s %s", o->name, o->meta ? o->meta : "VALUE");
        fprintf(f, "  %-26s %s", left, o->help);
        print_default(f, o);
        fputc('\n', f);
    }
    fprintf(f, "  %-26s %s\n", "--help", "show this help");
}

static int set_value(const cli_opt *o, const char *val)
{
    dp_err err;
    char what[80];
    snprintf(what, sizeof what, "--%s", o->name);
    switch (o->kind) {
    case CLI_STR:
        if (!*val) {
            fprintf(stderr, "downpour: %s: empty value\n", what);
            return -1;
        }
        *(const char **)o->dst = val;
        return 0;
    case CLI_INT: {
        long v;
        if (dp_parse_long(val, (long)o->lo, (long)o->hi, &v, what, &err) < 0)
            break;
        *(long *)o->dst = v;
        return 0;
    }
    case CLI_NUM: {
        double v;
        if (dp_parse_double(val, o->lo, o->hi, &v, what, &err) < 0)
            break;
        *(double *)o->dst = v;
        return 0;
    }
    case CLI_FLAG:
    case CLI_KIND_COUNT:
        return -1;
    }
    fprintf(stderr, "downpour: %s\n", err.msg);
    return -1;
}

int cli_parse(const char *usage, const cli_opt *opts, int n_opts, int argc, char **argv,
              int *rest)
{
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            cli_print_help(usage, opts, n_opts);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0)
            break;
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const cli_opt *o = find_opt(opts, n_opts, name, len);
        if (!o) {
            fprintf(stderr, "downpour: unknown option '--%.*s' (see --help)\n", (int)len, name);
            return -1;
        }
        if (o->kind == CLI_FLAG) {
            if (eq) {
                fprintf(stderr, "downpour: --%s takes no value\n", o->name);
                return -1;
            }
            *(bool *)o->dst = true;
            continue;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (!val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "downpour: --%s needs a value (%s)\n", o->name,
                        o->meta ? o->meta : "VALUE");
                return -1;
            }
            val = argv[++i];
        }
        if (set_value(o, val) < 0)
            return -1;
    }
    *rest = i;
    return 0;
}

bool cli_is_task_command(const char *name)
{
    return strcmp(name, "train") == 0 || strcmp(name, "ping") == 0;
}

int cli_apply_log_level(const char *cmd, const char *level, bool verbose)
{
    dp_log_level l = dp_log_get_level();
    if (level && dp_log_level_parse(level, &l) < 0) {
        fprintf(stderr, "downpour %s: --log-level '%s': expected error, warn, info or debug\n",
                cmd, level);
        return -1;
    }
    if (verbose)
        l = DP_LOG_DEBUG;
    if (!level && !verbose)
        return 0;
    dp_log_set_level(l);
    setenv(DP_LOG_LEVEL_ENV, dp_log_level_name(l), 1);
    return 0;
}

int cli_parse_straggler(const char *s, long *k, double *ms, dp_err *err)
{
    char buf[64];
    const char *colon = strchr(s, ':');
    if (!colon || strlen(s) >= sizeof buf)
        return dp_errf(err, "--straggler '%s': expected K:MS", s);
    memcpy(buf, s, (size_t)(colon - s));
    buf[colon - s] = '\0';
    if (dp_parse_long(buf, 0, 4095, k, "--straggler K", err) < 0)
        return -1;
    return dp_parse_double(colon + 1, 0, 60000, ms, "--straggler MS", err);
}

int cli_check_straggler(const char *s, long k, int chief, int workers, dp_err *err)
{
    /* K is a trainer's shard index (src/train/loop.c): a worker's index, or
     * its replica position where the chief is position 0 (allreduce), so
     * none reaches chief + workers. */
    if (k < chief + workers)
        return 0;
    return dp_errf(err, "--straggler %s: there is no training task %ld: this cluster has %d "
                        "worker(s) and %s chief, so K must be below %d",
                   s, k, workers, chief ? "a" : "no", chief + workers);
}

int cli_check_model_parallel(const char *strategy, const char *model, int k, int tasks,
                             dp_err *err)
{
    bool mp = strcmp(strategy, "model-parallel") == 0;
    if (!mp && strcmp(strategy, "ps-async") != 0) {
        if (k > 0)
            return dp_errf(err, "--model-parallel is for --strategy model-parallel, or ps-async "
                                "(model-parallel replicas training against ps shards)");
        return 0;
    }
    if (!mp && k == 0)
        return 0; /* plain ps-async */
    int K = k > 0 ? k : tasks;
    dp_model m;
    dp_err merr;
    if (dp_model_init(&m, model, 1, 1, &merr) < 0)
        return 0; /* the run says what is wrong with --model */
    /* the split itself says what cannot split: a layer it does not split
     * (by its kind's rule), a dense layer narrower than K, an image layer
     * with fewer output rows than K (docs/strategies.md, "model-parallel") */
    static mp_plan plan;
    int rc = K > 0 ? mp_plan_make(&plan, &m, K, 0, err) : mp_check_layers(&m, 0, err);
    dp_model_free(&m);
    return rc;
}
