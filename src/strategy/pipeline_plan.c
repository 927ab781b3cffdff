/* Layer pipelining's pure parts (pipeline.h): the stages' layer ranges and
 * each stage's order of forwards and backwards.  Nothing here talks or
 * allocates, so tests/test_pipeline.c checks it alone. */
#include "downpour/pipeline.h"

#include <errno.h>
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/layer_kind.h"

static const char *const schedule_names[DP_PIPE_SCHEDULE_COUNT] = {"gpipe", "1f1b"};

int dp_pipe_schedule_parse(const char *name, dp_pipe_schedule *out, dp_err *err)
{
    for (int k = 0; k < DP_PIPE_SCHEDULE_COUNT; k++)
        if (strcmp(name, schedule_names[k]) == 0) {
            *out = (dp_pipe_schedule)k;
            return 0;
        }
    return dp_errf(err, "unknown pipeline schedule '%s' (valid: gpipe, 1f1b)", name);
}

const char *dp_pipe_schedule_name(dp_pipe_schedule s)
{
    return (unsigned)s < DP_PIPE_SCHEDULE_COUNT ? schedule_names[s] : "?";
}

int dp_pipe_schedule_make(dp_pipe_action *out, dp_pipe_schedule kind, int stage, int stages,
                          int micro)
{
    if (stages < 1 || stage < 0 || stage >= stages || micro < 1 ||
        (unsigned)kind >= DP_PIPE_SCHEDULE_COUNT)
        return -1;
    int n = 0;
    if (kind == DP_PIPE_GPIPE) {
        for (int m = 0; m < micro; m++)
            out[n++] = (dp_pipe_action){DP_PIPE_FORWARD, m};
        for (int m = 0; m < micro; m++)
            out[n++] = (dp_pipe_action){DP_PIPE_BACKWARD, m};
        return n;
    }
    /* 1f1b: the warm-up fills the pipe below this stage; each later forward
     * comes with the backward of the oldest micro-batch held. */
    int warm = stages - stage - 1 < micro ? stages - stage - 1 : micro;
    for (int m = 0; m < warm; m++)
        out[n++] = (dp_pipe_action){DP_PIPE_FORWARD, m};
    for (int i = 0; i < micro - warm; i++) {
        out[n++] = (dp_pipe_action){DP_PIPE_FORWARD, warm + i};
        out[n++] = (dp_pipe_action){DP_PIPE_BACKWARD, i};
    }
    for (int m = micro - warm; m < micro; m++)
        out[n++] = (dp_pipe_action){DP_PIPE_BACKWARD, m};
    return n;
}

int dp_pipe_schedule_peak(const dp_pipe_action *a, int n)
{
    int held = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        held += a[i].op == DP_PIPE_FORWARD ? 1 : -1;
        peak = held > peak ? held : peak;
    }
    return peak;
}

/* [lo, hi) over layers [a, b) of their parameters (weights, then bias) or
 * of their buffers. */
static void span_of(const dp_model *m, int a, int b, int buffers, size_t *lo, size_t *hi)
{
    *lo = *hi = 0;
    int any = 0;
    for (int l = a; l < b && l < m->n_layers; l++) {
        const dp_layer *d = &m->layers[l];
        if (!(buffers ? d->s_len : d->w_len))
            continue;
        if (!any)
            *lo = buffers ? d->s_off : d->w_off;
        *hi = buffers ? d->s_off + d->s_len : d->b_off + d->b_len;
        any = 1;
    }
}

void dp_pipe_param_range(const dp_model *m, int a, int b, size_t *lo, size_t *hi)
{
    span_of(m, a, b, 0, lo, hi);
}

void dp_pipe_buffer_range(const dp_model *m, int a, int b, size_t *lo, size_t *hi)
{
    span_of(m, a, b, 1, lo, hi);
}

/* Multiply-adds per sample: a conv layer uses each weight at every output
 * position, a dense or local layer once; the rest touch each input once. */
/* A cut before layer j would part a layer from the relu fused into it. */
static int fused_at(const dp_model *m, int j)
{
    return m->layers[j - 1].w_len && (dp_layer_ops_of(&m->layers[j])->flags & DP_LK_RELU);
}

static double layer_cost(const dp_layer *d)
{
    if (dp_layer_ops_of(d)->cost)
        return dp_layer_ops_of(d)->cost(d);
    return d->w_len ? (double)d->w_len : (double)d->in;
}

double dp_pipe_cost(const dp_model *m, int a, int b)
{
    double c = 0;
    for (int l = a; l < b && l < m->n_layers; l++)
        c += layer_cost(&m->layers[l]);
    return c;
}

int dp_pipe_split_count(const char *split, dp_err *err)
{
    int n = 2; /* one more stage than boundaries */
    const char *p = split;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > DP_MAX_LAYERS || (*end && *end != ','))
            return dp_errf(err, "--split '%s': expected layer indices like 2,4", split);
        (void)v;
        if (!*end)
            return n;
        p = end + 1;
        n++;
    }
}

/* The cut that minimises the largest stage, over the allowed places to cut
 * (cut[j]: a stage may start at layer j). */
static void balance(int *first, const dp_model *m, int stages, const unsigned char *cut)
{
    int L = m->n_layers;
    double best[DP_PIPE_MAX_STAGES + 1][DP_MAX_LAYERS + 1];
    int from[DP_PIPE_MAX_STAGES + 1][DP_MAX_LAYERS + 1];
    for (int k = 0; k <= stages; k++)
        for (int j = 0; j <= L; j++)
            best[k][j] = DBL_MAX;
    best[0][0] = 0;
    for (int k = 1; k <= stages; k++)
        for (int j = 1; j <= L; j++) {
            if (j < L && !cut[j])
                continue;
            for (int i = k - 1; i < j; i++) {
                if (best[k - 1][i] == DBL_MAX)
                    continue;
                double c = dp_pipe_cost(m, i, j);
                double v = c > best[k - 1][i] ? c : best[k - 1][i];
                if (v < best[k][j]) {
                    best[k][j] = v;
                    from[k][j] = i;
                }
            }
        }
    first[stages] = L;
    for (int k = stages; k > 0; k--)
        first[k - 1] = from[k][first[k]];
}

int dp_pipe_partition(int *first, const dp_model *m, int stages, const char *split, dp_err *err)
{
    int L = m->n_layers;
    if (stages < 1 || stages > L)
        return dp_errf(err, "--stages %d: model %s has %d layers, so 1 to %d stages (each "
                            "stage runs at least one layer)", stages, m->name, L, L);
    if (split) {
        int n = dp_pipe_split_count(split, err);
        if (n < 0)
            return -1;
        if (n != stages)
            return dp_errf(err, "--split '%s' makes %d stages, but there are %d", split, n,
                           stages);
        first[0] = 0;
        const char *p = split;
        for (int k = 1; k < stages; k++) {
            char *end;
            first[k] = (int)strtol(p, &end, 10);
            p = end + 1;
            if (first[k] <= first[k - 1] || first[k] >= L)
                return dp_errf(err, "--split '%s': stage starts must increase strictly within "
                                    "1..%d (model %s has %d layers: %s)", split, L - 1, m->name,
                               L, m->spec);
            if (!dp_model_cut_ok(m, first[k]))
                return dp_errf(err, "--split '%s': layer %d is inside a residual block of model "
                                    "%s; a stage starts only between blocks",
                               split, first[k], m->name);
        }
        first[stages] = L;
        return 0;
    }
    /* Cut elsewhere than between a layer and the relu fused into it, where
     * there are enough such places: the two then stay one kernel. */
    unsigned char cut[DP_MAX_LAYERS + 1] = {0};
    int places = 0, any = 0; /* any: the places outside residual blocks */
    for (int j = 1; j < L; j++) {
        any += dp_model_cut_ok(m, j);
        places += dp_model_cut_ok(m, j) && !fused_at(m, j);
    }
    if (any < stages - 1)
        return dp_errf(err, "--stages %d: model %s can be cut in %d places only (a stage "
                            "starts between residual blocks, never inside one), so at most %d "
                            "stages", stages, m->name, any, any + 1);
    for (int j = 1; j < L; j++)
        cut[j] = dp_model_cut_ok(m, j) && (places < stages - 1 || !fused_at(m, j));
    balance(first, m, stages, cut);
    return 0;
}

int dp_pipe_micro_size(int n, int M, int k, int *off)
{
    int base = n / M, extra = n % M;
    *off = k * base + (k < extra ? k : extra);
    return base + (k < extra);
}
