/* --compress auto's choice of PowerSGD: see allreduce_auto.h. */
#include "allreduce_auto.h"

#include <stdio.h>

int dp_auto_psgd_rule(dp_auto_compress *a, const dp_ring *r, size_t first, size_t second,
                      double products_s, size_t n_params, size_t bucket_bytes)
{
    /* today's auto: the reducer's buckets, each bf16 or none by the fit */
    size_t per = bucket_bytes / sizeof(float), done = 0;
    double base = 0;
    if (per < 1)
        per = 1;
    while (done < n_params) {
        size_t len = n_params - done < per ? n_params - done : per;
        double none = dp_ring_predict(r, len, DP_COMPRESS_NONE);
        double bf16 = dp_ring_predict(r, len, DP_COMPRESS_BF16);
        base += bf16 < none ? bf16 : none;
        done += len;
    }
    double psgd = dp_ring_predict(r, first, DP_COMPRESS_NONE) +
                  dp_ring_predict(r, second, DP_COMPRESS_NONE) + products_s;
    a->psgd = psgd < base;
    snprintf(a->why, sizeof a->why,
             "auto: %s (a step's sums predicted: powersgd:%d %.2f ms, %zu + %zu floats and "
             "%.2f ms of products measured, against bf16 or none per bucket %.2f ms, %zu "
             "floats)",
             a->psgd ? "powersgd:" DP_AUTO_PSGD_RANK_TEXT : "bf16 or none per bucket",
             DP_AUTO_PSGD_RANK, psgd * 1e3, first, second, products_s * 1e3, base * 1e3,
             n_params);
    return a->psgd;
}

int dp_auto_compress_decide(dp_auto_compress *a, dp_ring *r, const dp_model *m,
                            size_t bucket_bytes, uint64_t seed, uint64_t step, dp_err *err)
{
    dp_psgd_matrix mats[DP_POWERSGD_MAX_MATRICES]; /* 6 KiB */
    dp_psgd_plan plan;
    int k = dp_powersgd_matrices(m, DP_AUTO_PSGD_RANK, mats, DP_POWERSGD_MAX_MATRICES, &plan);
    a->psgd = 0;
    if (k == 0 || k > DP_POWERSGD_MAX_MATRICES) {
        snprintf(a->why, sizeof a->why, "auto: bf16 or none per bucket (powersgd not "
                                        "considered: "
                                        "model %.64s has %s)",
                 m->name, k ? "too many weight matrices"
                            : "no weight matrix that rank-4 factors make smaller");
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
    double own;
    if (dp_powersgd_time(m->n_params, mats, k, seed, &own, err) < 0)
        return -1;
    /* averaged over the members, as the fit's times are: every member
     * decides on the same numbers */
    float us = (float)(own * 1e6);
    rc = dp_ring_allreduce(r, &us, 1, step, -3, err);
    if (rc < 0)
        return rc;
    size_t first = plan.whole_floats, second = 0;
    for (int i = 0; i < k; i++) {
        first += (size_t)mats[i].rank * (size_t)mats[i].rows;
        second += (size_t)mats[i].rank * (size_t)mats[i].cols;
    }
    dp_auto_psgd_rule(a, r, first, second, us / r->n * 1e-6, m->n_params, bucket_bytes);
    return 0;
}
