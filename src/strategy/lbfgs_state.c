/* Sandblaster L-BFGS's part of a checkpoint (docs/checkpoints.md, "lbfgs"):
 * the chief's scalars as one text value and the names of the vectors the
 * chief gathers from the shards.  The vectors are whole (gathered), so a
 * resume takes them up over any number of ps tasks, each its slice.  The
 * doubles are written in hexadecimal (%a), which reads back bit for bit. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strategy/lbfgs_impl.h"

int lb_state_name(char *buf, size_t cap, int v)
{
    if (v == DP_LBFGS_G)
        return snprintf(buf, cap, "lbfgs.g");
    int i = (v - DP_LBFGS_FIXED) / 2;
    return snprintf(buf, cap, "lbfgs.%c.%d", (v - DP_LBFGS_FIXED) % 2 ? 'y' : 's', i);
}

int lb_state_vec(const char *name, int m)
{
    if (strcmp(name, "lbfgs.g") == 0)
        return DP_LBFGS_G;
    if (strncmp(name, "lbfgs.", 6) != 0 || (name[6] != 's' && name[6] != 'y') || name[7] != '.')
        return -1;
    char *end;
    long i = strtol(name + 8, &end, 10); /* saturates when too long: out of range */
    if (*end != '\0' || end == name + 8 || i < 0 || i >= m)
        return -1;
    char again[DP_STATE_NAME_LEN]; /* the one spelling: no "+1", "01" */
    int v = name[6] == 's' ? DP_LBFGS_S((int)i) : DP_LBFGS_Y((int)i);
    lb_state_name(again, sizeof again, v);
    return strcmp(again, name) == 0 ? v : -1;
}

int lb_state_put(dp_train_state *st, const lb_saved *sv, int m, dp_err *err)
{
    size_t cap = 512 + (size_t)m * 32, n;
    char *b = malloc(cap);
    if (!b)
        return dp_errf(err, "out of memory for the L-BFGS state");
    n = (size_t)snprintf(b, cap,
                         "iter=%ld batch=%ld stalled=%d evals_run=%ld m=%d pairs=%d newest=%d "
                         "started=%d evals=%ld gamma=%a f=%a gnorm=%a rho=",
                         sv->iter, sv->batch_index, sv->stalled, sv->evals_run, m, sv->pairs,
                         sv->newest, sv->started, sv->evals, sv->gamma, sv->f, sv->gnorm);
    for (int k = 0; k < m && n < cap; k++)
        n += (size_t)snprintf(b + n, cap - n, "%s%a", k ? "," : "", sv->rho[k]);
    free(st->scalars);
    st->scalars = b;
    return 0;
}

/* The value of `key` in "k=v k=v ...": a pointer to it and its length. */
static const char *value_of(const char *text, const char *key, size_t *len)
{
    size_t kl = strlen(key);
    for (const char *p = text; *p;) {
        size_t tl = strcspn(p, " ");
        if (tl > kl && strncmp(p, key, kl) == 0 && p[kl] == '=') {
            *len = tl - kl - 1;
            return p + kl + 1;
        }
        p += tl;
        p += *p == ' ';
    }
    return NULL;
}

typedef struct reader {
    const char *text, *file;
    dp_err *err;
} reader;

static int get_long(reader *r, const char *key, long lo, long hi, long *out)
{
    size_t len;
    const char *v = value_of(r->text, key, &len);
    char buf[64], what[256];
    snprintf(what, sizeof what, "%s: metadata 'strategy_state', lbfgs's '%s'", r->file, key);
    if (!v)
        return dp_errf(r->err, "%s is missing", what);
    if (len >= sizeof buf)
        return dp_errf(r->err, "%s is %zu characters long", what, len);
    memcpy(buf, v, len);
    buf[len] = '\0';
    return dp_parse_long(buf, lo, hi, out, what, r->err);
}

/* One double (a whole token, or up to the next comma): finite. */
static int parse_finite(reader *r, const char *key, const char *v, size_t len, double *out)
{
    char buf[64];
    if (len == 0 || len >= sizeof buf)
        return dp_errf(r->err, "%s: metadata 'strategy_state', lbfgs's '%s': a value of %zu "
                               "characters", r->file, key, len);
    memcpy(buf, v, len);
    buf[len] = '\0';
    char *end;
    double d = strtod(buf, &end);
    if (*end != '\0' || !isfinite(d))
        return dp_errf(r->err, "%s: metadata 'strategy_state', lbfgs's '%s': '%s' is not a "
                               "finite number", r->file, key, buf);
    *out = d;
    return 0;
}

static int get_double(reader *r, const char *key, double *out)
{
    size_t len;
    const char *v = value_of(r->text, key, &len);
    if (!v)
        return dp_errf(r->err, "%s: metadata 'strategy_state', lbfgs's '%s' is missing", r->file,
                       key);
    return parse_finite(r, key, v, len, out);
}

/* Whether r holds vector v (by its name). */
static int has_vec(const dp_train_state *st, int v)
{
    char name[DP_STATE_NAME_LEN];
    lb_state_name(name, sizeof name, v);
    for (int i = 0; i < st->n_vecs; i++)
        if (strcmp(st->vec_names[i], name) == 0)
            return 1;
    return 0;
}

int lb_state_get(const dp_train_state *st, int m, lb_saved *sv, dp_err *err)
{
    reader r = {st->scalars, st->path ? st->path : "the checkpoint", err};
    memset(sv, 0, sizeof *sv);
    if (!st->scalars)
        return dp_errf(err, "%s holds no L-BFGS state (metadata 'strategy_state' is missing): "
                            "it was not written by --strategy lbfgs", r.file);
    long iter, batch, stalled, evals_run, mm, pairs, newest, started, evals;
    if (get_long(&r, "iter", 0, LONG_MAX, &iter) < 0 ||
        get_long(&r, "batch", -1, LONG_MAX, &batch) < 0 ||
        get_long(&r, "stalled", 0, INT_MAX, &stalled) < 0 ||
        get_long(&r, "evals_run", 0, LONG_MAX, &evals_run) < 0 ||
        get_long(&r, "m", 1, DP_LBFGS_MAX_M, &mm) < 0)
        return -1;
    if (mm != m)
        return dp_errf(err, "%s holds an L-BFGS history of %ld pairs; this run keeps %d "
                            "(--lbfgs-history)", r.file, mm, m);
    if (get_long(&r, "pairs", 0, m, &pairs) < 0 || get_long(&r, "newest", 0, m - 1, &newest) < 0 ||
        get_long(&r, "started", 0, 1, &started) < 0 ||
        get_long(&r, "evals", 0, LONG_MAX, &evals) < 0 || get_double(&r, "gamma", &sv->gamma) < 0 ||
        get_double(&r, "f", &sv->f) < 0 || get_double(&r, "gnorm", &sv->gnorm) < 0)
        return -1;
    if (iter != st->step)
        return dp_errf(err, "%s: its L-BFGS state is of iteration %ld, the checkpoint of step %ld",
                       r.file, iter, st->step);
    size_t len;
    const char *v = value_of(st->scalars, "rho", &len);
    if (!v)
        return dp_errf(err, "%s: metadata 'strategy_state', lbfgs's 'rho' is missing", r.file);
    for (int k = 0; k < m; k++) {
        size_t l = strcspn(v, ", ");
        if (l > len || (k + 1 < m ? v[l] != ',' : l != len))
            return dp_errf(err, "%s: metadata 'strategy_state', lbfgs's 'rho' does not hold %d "
                                "values", r.file, m);
        if (parse_finite(&r, "rho", v, l, &sv->rho[k]) < 0)
            return -1;
        v += l + 1;
        len -= l + 1;
    }
    sv->iter = iter;
    sv->batch_index = batch;
    sv->stalled = (int)stalled;
    sv->evals_run = evals_run;
    sv->pairs = (int)pairs;
    sv->newest = (int)newest;
    sv->started = (int)started;
    sv->evals = evals;
    if (started && !has_vec(st, DP_LBFGS_G))
        return dp_errf(err, "%s: tensor 'lbfgs.g' (the gradient at x) is missing", r.file);
    for (int j = 0; j < sv->pairs; j++) {
        int k = (sv->newest - j + m) % m;
        for (int y = 0; y < 2; y++)
            if (!has_vec(st, y ? DP_LBFGS_Y(k) : DP_LBFGS_S(k))) {
                char name[DP_STATE_NAME_LEN];
                lb_state_name(name, sizeof name, y ? DP_LBFGS_Y(k) : DP_LBFGS_S(k));
                return dp_errf(err, "%s: tensor '%s' (pair %d of the %d held) is missing",
                               r.file, name, j + 1, sv->pairs);
            }
    }
    for (int i = 0; i < st->n_vecs; i++)
        if (lb_state_vec(st->vec_names[i], m) < 0)
            return dp_errf(err, "%s: tensor '%s' is no L-BFGS vector of a history of %d", r.file,
                           st->vec_names[i], m);
    return 0;
}
