/* A model's sparse tables and the rows a batch touches (sparse.h), asked of
 * the layer table (layer_kind.h: sparse, sparse_ids). */
#include "downpour/sparse.h"

#include "downpour/layer_kind.h"

int dp_model_sparse_tables(const dp_model *m, dp_sparse_table *out, int max)
{
    int n = 0;
    size_t cut = 0; /* what the compact tables before lost */
    if (m->external)
        return 0;
    for (int l = 0; l < m->n_layers; l++) {
        const dp_layer *d = &m->layers[l];
        const dp_layer_ops *ops = dp_layer_ops_of(d);
        if (!ops->sparse)
            continue;
        dp_lk_sparse t[DP_LK_MAX_SPARSE];
        int k = ops->sparse(d, t);
        for (int j = 0; j < k && n < max; j++, n++) {
            dp_sparse_table x = {t[j].off + cut, t[j].rows, t[j].width, t[j].per_record, l, j,
                                 t[j].off, 0};
            if (d->sparse_rows) { /* one table a layer (dp_model_init_compact) */
                x.slots = t[j].rows;
                x.rows = d->sparse_rows;
            }
            out[n] = x;
        }
        if (d->sparse_rows)
            cut += (size_t)(d->sparse_rows - t[0].rows) * (size_t)t[0].width;
    }
    return n;
}

size_t dp_model_sparse_cut(const dp_model *m)
{
    dp_sparse_table t[DP_SPARSE_MAX];
    int n = dp_model_sparse_tables(m, t, DP_SPARSE_MAX);
    size_t cut = 0;
    for (int k = 0; k < n && k < DP_SPARSE_MAX; k++)
        if (t[k].slots)
            cut += (size_t)(t[k].rows - t[k].slots) * (size_t)t[k].width;
    return cut;
}

/* Heapsort in place: glibc's qsort may allocate a merge buffer, and a
 * training step allocates nothing. */
static void sift(uint32_t *a, size_t i, size_t n)
{
    uint32_t v = a[i];
    for (size_t c; (c = 2 * i + 1) < n; i = c) {
        if (c + 1 < n && a[c + 1] > a[c])
            c++;
        if (a[c] <= v)
            break;
        a[i] = a[c];
    }
    a[i] = v;
}

void dp_sort_u32(uint32_t *a, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift(a, i, n);
    for (size_t e = n; e-- > 1;) {
        uint32_t t = a[0];
        a[0] = a[e];
        a[e] = t;
        sift(a, 0, e);
    }
}

long dp_model_sparse_rows(const dp_model *m, const dp_sparse_table *t, const float *x, int batch,
                          uint32_t *ids)
{
    if (batch <= 0)
        return 0;
    const dp_layer *d = &m->layers[t->layer];
    long n = dp_layer_ops_of(d)->sparse_ids(d, t->k, x, dp_model_inputs(m), batch, ids);
    dp_sort_u32(ids, (size_t)n);
    long u = 0;
    for (long i = 0; i < n; i++)
        if (u == 0 || ids[i] != ids[u - 1])
            ids[u++] = ids[i];
    return u;
}

typedef struct slot_of {
    const uint32_t *rows;
    long n;
} slot_of;

/* The slot of row r among the step's rows (binary search); -1: not among
 * them, which dp_model_sparse_rows's rows of the same batch rule out. */
static long find_slot(const void *ctx, uint32_t r)
{
    const slot_of *s = ctx;
    long lo = 0, hi = s->n;
    while (lo < hi) {
        long mid = lo + (hi - lo) / 2;
        if (s->rows[mid] < r)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->n && s->rows[lo] == r ? lo : -1;
}

void dp_model_sparse_slots(const dp_model *m, const dp_sparse_table *t, float *x, int batch,
                           const uint32_t *rows, long n)
{
    const dp_layer *d = &m->layers[t->layer];
    slot_of s = {rows, n};
    if (batch > 0)
        dp_layer_ops_of(d)->sparse_slots(d, t->k, x, dp_model_inputs(m), batch, find_slot, &s);
}
