/* allreduce's sparse tables: see allreduce_sparse.h.
 *
 * A replica's block, every field through the byte helpers: per table, u32
 * count, count u32 ids (increasing), then count x width f32 rows. */
#include "strategy/allreduce_sparse.h"

#include <stdlib.h>
#include <string.h>

#include "downpour/log.h"
#include "downpour/wire.h"

struct dp_ar_sparse {
    int n_tables, replicas;
    dp_sparse_table t[DP_SPARSE_MAX];
    long cap_ids[DP_SPARSE_MAX];   /* the most unique ids a block holds: min(rows, batch ids) */
    long batch_ids[DP_SPARSE_MAX]; /* ids a batch names, before dedup (scratch size) */
    uint32_t *ids[DP_SPARSE_MAX];  /* this step's unique ids (sorting scratch) */
    long n_ids[DP_SPARSE_MAX];
    size_t cap;                    /* a block's bound, bytes */
    uint8_t *all;                  /* replicas x cap: the gathered blocks */
    size_t *lens;                  /* per ring position */
    const uint8_t **id_at, **row_at; /* per ring position: the table's ids and rows */
    long *count, *head;            /* per ring position: the table's count, merge cursor */
    uint64_t gathered, sent;       /* the last exchange's bytes */
};

static long table_cap(const dp_sparse_table *t, int max_batch)
{
    long b = (long)max_batch * t->per_record;
    return b < t->rows ? b : t->rows;
}

void dp_ar_sparse_plan_of(const dp_model *m, int replicas, int max_batch, dp_ar_sparse_plan *out)
{
    dp_sparse_table t[DP_SPARSE_MAX];
    memset(out, 0, sizeof *out);
    out->tables = dp_model_sparse_tables(m, t, DP_SPARSE_MAX);
    for (int k = 0; k < out->tables; k++) {
        out->table_floats += (size_t)t[k].rows * (size_t)t[k].width;
        out->block_bound += 4 + (size_t)table_cap(&t[k], max_batch) * (4 + 4 * (size_t)t[k].width);
    }
    int n = replicas > 0 ? replicas : 1;
    /* The ring sends 2(n-1)/n of a buffer; the gather forwards n-1 blocks. */
    out->dense_bytes = (uint64_t)(2.0 * (n - 1) / n * (double)out->table_floats * 4.0);
    out->sparse_bound = (uint64_t)(n - 1) * out->block_bound;
    out->sparse = out->tables > 0 && n > 1 && out->sparse_bound < out->dense_bytes;
}

void dp_ar_sparse_close(dp_ar_sparse *sp)
{
    if (!sp)
        return;
    for (int k = 0; k < sp->n_tables; k++)
        free(sp->ids[k]);
    free(sp->all);
    free(sp->lens);
    free(sp->id_at);
    free(sp->row_at);
    free(sp->count);
    free(sp->head);
    free(sp);
}

int dp_ar_sparse_open(dp_ar_sparse **out, const dp_model *m, int replicas, int max_batch,
                      dp_err *err)
{
    dp_ar_sparse *sp = calloc(1, sizeof *sp);
    if (!sp)
        return dp_errf(err, "out of memory");
    sp->n_tables = dp_model_sparse_tables(m, sp->t, DP_SPARSE_MAX);
    sp->replicas = replicas;
    size_t n = (size_t)replicas;
    int ok = 1;
    for (int k = 0; k < sp->n_tables; k++) {
        sp->batch_ids[k] = (long)max_batch * sp->t[k].per_record;
        sp->cap_ids[k] = table_cap(&sp->t[k], max_batch);
        sp->cap += 4 + (size_t)sp->cap_ids[k] * (4 + 4 * (size_t)sp->t[k].width);
        sp->ids[k] = malloc((size_t)(sp->batch_ids[k] > 0 ? sp->batch_ids[k] : 1) * sizeof(uint32_t));
        ok = ok && sp->ids[k];
    }
    sp->all = malloc(n * sp->cap);
    sp->lens = calloc(n, sizeof *sp->lens);
    sp->id_at = calloc(n, sizeof *sp->id_at);
    sp->row_at = calloc(n, sizeof *sp->row_at);
    sp->count = calloc(n, sizeof *sp->count);
    sp->head = calloc(n, sizeof *sp->head);
    if (!ok || !sp->all || !sp->lens || !sp->id_at || !sp->row_at || !sp->count || !sp->head) {
        dp_ar_sparse_close(sp);
        return dp_errf(err, "out of memory for the sparse all-gather (%zu bytes a replica's "
                            "block, %d replicas)", sp->cap, replicas);
    }
    *out = sp;
    return 0;
}

int dp_ar_sparse_ranges(const dp_ar_sparse *sp, size_t *lo, size_t *hi)
{
    for (int k = 0; k < sp->n_tables; k++) {
        lo[k] = sp->t[k].off;
        hi[k] = sp->t[k].off + (size_t)sp->t[k].rows * (size_t)sp->t[k].width;
    }
    return sp->n_tables;
}

void dp_ar_sparse_rows(dp_ar_sparse *sp, const dp_model *m, const float *x, int n)
{
    for (int k = 0; k < sp->n_tables; k++)
        sp->n_ids[k] = n > 0 ? dp_model_sparse_rows(m, &sp->t[k], x, n, sp->ids[k]) : 0;
}

void dp_ar_sparse_last(const dp_ar_sparse *sp, uint64_t *gathered, uint64_t *sent)
{
    *gathered = sp->gathered;
    *sent = sp->sent;
}

/* This replica's block: its ids and weighted rows, table after table. */
static size_t pack(dp_ar_sparse *sp, const float *grads, float weight, uint8_t *b)
{
    size_t len = 0;
    for (int k = 0; k < sp->n_tables; k++) {
        const dp_sparse_table *t = &sp->t[k];
        long c = sp->n_ids[k];
        dp_put_u32(b + len, (uint32_t)c);
        len += 4;
        for (long i = 0; i < c; i++, len += 4)
            dp_put_u32(b + len, sp->ids[k][i]);
        for (long i = 0; i < c; i++) {
            const float *row = grads + t->off + (size_t)sp->ids[k][i] * (size_t)t->width;
            for (int j = 0; j < t->width; j++, len += 4) {
                float v = row[j];
                if (weight != 1.0f) /* as the reducer weighs a bucket */
                    v *= weight;
                dp_put_f32(b + len, v);
            }
        }
    }
    return len;
}

/* Table k's part of ring position q's block at *at: bounded and checked. */
static int parse(dp_ar_sparse *sp, dp_ring *ring, int q, int k, size_t *at, dp_err *err)
{
    const dp_sparse_table *t = &sp->t[k];
    const uint8_t *b = sp->all + (size_t)q * sp->cap;
    size_t len = sp->lens[q];
    const char *who = dp_transport_peer_name(ring->t, ring->ranks[q]);
    if (len - *at < 4)
        return dp_errf(err, "%s sent a sparse block of %zu bytes, cut short in table %d", who,
                       len, k);
    long c = (long)dp_get_u32(b + *at);
    *at += 4;
    size_t need = (size_t)c * (4 + 4 * (size_t)t->width);
    if (c > sp->cap_ids[k] || need > len - *at)
        return dp_errf(err, "%s sent %ld ids of table %d (at most %ld, %zu bytes left)", who, c,
                       k, sp->cap_ids[k], len - *at);
    sp->id_at[q] = b + *at;
    sp->row_at[q] = b + *at + 4 * (size_t)c;
    for (long i = 0; i < c; i++) {
        uint32_t id = dp_get_u32(sp->id_at[q] + 4 * i);
        if (id >= (uint32_t)t->rows || (i > 0 && id <= dp_get_u32(sp->id_at[q] + 4 * (i - 1))))
            return dp_errf(err, "%s sent row %u of table %d (%ld rows) %s", who, id, k, t->rows,
                           id >= (uint32_t)t->rows ? "out of range" : "out of order");
    }
    sp->count[q] = c;
    sp->head[q] = 0;
    *at += need;
    return 0;
}

int dp_ar_sparse_exchange(dp_ar_sparse *sp, dp_ring *ring, const dp_reducer *red, float *grads,
                          float weight, uint64_t step, dp_err *err)
{
    int n = ring->n, me = ring->pos;
    if (n > sp->replicas)
        return dp_errf(err, "sparse all-gather: a ring of %d, sized for %d", n, sp->replicas);
    uint8_t *mine = sp->all + (size_t)me * sp->cap;
    size_t len = pack(sp, grads, weight, mine);
    uint64_t before = ring->bytes_sent;
    int rc = dp_ring_allgather(ring, mine, len, sp->all, sp->cap, sp->lens, step, err);
    if (rc < 0)
        return rc;
    sp->sent = ring->bytes_sent - before;
    sp->gathered = 0;
    for (int q = 0; q < n; q++)
        sp->gathered += sp->lens[q];
    size_t at[256 + 1], *pos = n <= 256 ? at : NULL;
    if (!pos)
        return dp_errf(err, "sparse all-gather: more than 256 replicas");
    memset(pos, 0, (size_t)n * sizeof *pos);
    for (int k = 0; k < sp->n_tables; k++) {
        const dp_sparse_table *t = &sp->t[k];
        for (int q = 0; q < n; q++)
            if (parse(sp, ring, q, k, &pos[q], err) < 0)
                return -1;
        /* Merge the positions' increasing ids; each id's row, element by
         * element, summed from the ring position of its chunk on (ring.h):
         * a position without the row adds the zero it holds under the
         * dense path, so even a -0.0 ends as the dense sum's +0.0. */
        for (;;) {
            uint32_t id = UINT32_MAX;
            for (int q = 0; q < n; q++)
                if (sp->head[q] < sp->count[q]) {
                    uint32_t v = dp_get_u32(sp->id_at[q] + 4 * sp->head[q]);
                    id = v < id ? v : id;
                }
            if (id == UINT32_MAX)
                break;
            const uint8_t *row[256];
            for (int q = 0; q < n; q++) {
                int has = sp->head[q] < sp->count[q] &&
                          dp_get_u32(sp->id_at[q] + 4 * sp->head[q]) == id;
                row[q] = has ? sp->row_at[q] + 4 * (size_t)t->width * (size_t)sp->head[q] : NULL;
                sp->head[q] += has;
            }
            size_t base = t->off + (size_t)id * (size_t)t->width;
            for (int j = 0; j < t->width; j++) {
                size_t e = base + (size_t)j, lo, hi;
                dp_reducer_bucket_of(red, e, &lo, &hi);
                int c = (int)dp_ring_chunk_of(hi - lo, n, e - lo);
                float acc = row[c] ? dp_get_f32(row[c] + 4 * (size_t)j) : 0.0f;
                for (int h = 1; h < n; h++) {
                    int q = (c + h) % n;
                    acc += row[q] ? dp_get_f32(row[q] + 4 * (size_t)j) : 0.0f;
                }
                grads[e] = acc;
            }
        }
    }
    return 0;
}
