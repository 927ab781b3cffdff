/* --compress auto's choice of PowerSGD: see allreduce_auto.h.  Why several
 * ranks: on a slow link rank 4's step is far below bf16/none's, and the
 * time left buys accuracy (docs/strategies.md: on 4 hosts at 100 Mbit/s,
 * 784-300-100-10 loses 0.59 points at rank 4, 0.19 at rank 16); the
 * margin keeps the link's gain. */
#include "allreduce_auto.h"

#include <stdio.h>

static const int ranks[DP_AUTO_PSGD_N_RANKS] = DP_AUTO_PSGD_RANKS;

int dp_auto_candidates(const dp_model *m, dp_auto_cand *out)
{
    dp_psgd_matrix mats[DP_POWERSGD_MAX_MATRICES]; /* 6 KiB */
    int n = 0;
    for (int i = 0; i < DP_AUTO_PSGD_N_RANKS; i++) {
        dp_psgd_plan plan;
        int k = dp_powersgd_matrices(m, ranks[i], mats, DP_POWERSGD_MAX_MATRICES, &plan);
        if (k == 0 || k > DP_POWERSGD_MAX_MATRICES)
            continue;
        dp_auto_cand c = {ranks[i], plan.whole_floats, 0, 0};
        for (int j = 0; j < k; j++) {
            c.first += (size_t)mats[j].rank * (size_t)mats[j].rows;
            c.second += (size_t)mats[j].rank * (size_t)mats[j].cols;
        }
        /* the Q's leave the checkpoint's last float for the rank (allreduce.c) */
        if (c.second + 1 >= m->n_params)
            continue;
        if (n > 0 && c.first + c.second == out[n - 1].first + out[n - 1].second)
            continue; /* clamped everywhere: the last one again */
        out[n++] = c;
    }
    return n;
}

int dp_auto_psgd_rule(dp_auto_compress *a, const dp_ring *r, const dp_auto_cand *c, int n,
                      size_t n_params, size_t bucket_bytes)
{
    /* today's auto: the reducer's buckets, each bf16 or none by the fit */
    size_t per = bucket_bytes / sizeof(float), done = 0;
    double base = 0, t[DP_AUTO_PSGD_N_RANKS];
    if (per < 1)
        per = 1;
    while (done < n_params) {
        size_t len = n_params - done < per ? n_params - done : per;
        double none = dp_ring_predict(r, len, DP_COMPRESS_NONE);
        double bf16 = dp_ring_predict(r, len, DP_COMPRESS_BF16);
        base += bf16 < none ? bf16 : none;
        done += len;
    }
    a->rank = 0;
    if (n > DP_AUTO_PSGD_N_RANKS)
        n = DP_AUTO_PSGD_N_RANKS;
    for (int i = 0; i < n; i++) {
        t[i] = dp_ring_predict(r, c[i].first, DP_COMPRESS_NONE) +
               dp_ring_predict(r, c[i].second, DP_COMPRESS_NONE) + c[i].products_s;
        if (t[i] * DP_AUTO_PSGD_MARGIN <= base || (i == 0 && t[i] < base))
            a->rank = c[i].rank;
    }
    int at = snprintf(a->why, sizeof a->why, "auto: %s%.0d (a step's sums predicted:",
                      a->rank ? "powersgd:" : "bf16 or none per bucket", a->rank);
    for (int i = 0; i < n && at > 0 && (size_t)at < sizeof a->why; i++)
        at += snprintf(a->why + at, sizeof a->why - (size_t)at,
                       " powersgd:%d %.2f ms (%zu + %zu floats, %.2f ms of products measured),",
                       c[i].rank, t[i] * 1e3, c[i].first, c[i].second, c[i].products_s * 1e3);
    if (at > 0 && (size_t)at < sizeof a->why)
        snprintf(a->why + at, sizeof a->why - (size_t)at,
                 " bf16 or none per bucket %.2f ms, %zu floats)", base * 1e3, n_params);
    return a->rank;
}

int dp_auto_compress_decide(dp_auto_compress *a, dp_ring *r, const dp_model *m,
                            size_t bucket_bytes, uint64_t seed, uint64_t step, dp_err *err)
{
    dp_auto_cand c[DP_AUTO_PSGD_N_RANKS];
    int n = dp_auto_candidates(m, c);
    a->rank = 0;
    if (n == 0) {
        snprintf(a->why, sizeof a->why, "auto: bf16 or none per bucket (powersgd not "
                                        "considered: model %.64s has no weight matrix that "
                                        "rank-4 factors make smaller)",
                 m->name);
        return 0;
    }
    if (r->n == 1 || r->use_fast_path) {
        snprintf(a->why, sizeof a->why,
                 "auto: bf16 or none per bucket (powersgd not considered: %s)",
                 r->n == 1 ? "one replica, nothing to send" : "the transport's own all-reduce");
        return 0;
    }
    int rc = dp_ring_measure(r, step, err);
    if (rc < 0)
        return rc;
    /* each rank's products, averaged over the members as the fit's times
     * are: every member decides on the same numbers */
    float us[DP_AUTO_PSGD_N_RANKS];
    for (int i = 0; i < n; i++) {
        dp_psgd_matrix mats[DP_POWERSGD_MAX_MATRICES]; /* 6 KiB */
        dp_psgd_plan plan;
        int k = dp_powersgd_matrices(m, c[i].rank, mats, DP_POWERSGD_MAX_MATRICES, &plan);
        double own;
        if (dp_powersgd_time(m->n_params, mats, k, seed, &own, err) < 0)
            return -1;
        us[i] = (float)(own * 1e6);
    }
    rc = dp_ring_allreduce(r, us, (size_t)n, step, -3, err);
    if (rc < 0)
        return rc;
    for (int i = 0; i < n; i++)
        c[i].products_s = us[i] / r->n * 1e-6;
    dp_auto_psgd_rule(a, r, c, n, m->n_params, bucket_bytes);
    return 0;
}
