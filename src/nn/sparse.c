/* A model's sparse tables and the rows a batch touches (sparse.h), asked of
 * the layer table (layer_kind.h: sparse, sparse_ids). */
#include "downpour/sparse.h"

#include "downpour/layer_kind.h"

int dp_model_sparse_tables(const dp_model *m, dp_sparse_table *out, int max)
{
    int n = 0;
    if (m->external)
        return 0;
    for (int l = 0; l < m->n_layers; l++) {
        const dp_layer_ops *ops = dp_layer_ops_of(&m->layers[l]);
        if (!ops->sparse)
            continue;
        dp_lk_sparse t[DP_LK_MAX_SPARSE];
        int k = ops->sparse(&m->layers[l], t);
        for (int j = 0; j < k && n < max; j++)
            out[n++] = (dp_sparse_table){t[j].off, t[j].rows, t[j].width, t[j].per_record, l, j};
    }
    return n;
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
