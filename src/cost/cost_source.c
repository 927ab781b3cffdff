/* The cost model against the source experiment's own cluster
 * (docs/cost_model.md, "Validation: the source cluster"): 9 VMs of 4 cores,
 * TensorFlow 2.8, 12 training times.  TensorFlow's per-step cost is far
 * above ours, so its overhead is fitted on MNIST's parameter-server cells
 * and the other cells are predictions. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "downpour/cost_model.h"

typedef struct cell {
    const char *dataset, *model;
    dp_cost_strategy strategy;
    int batch;
    double seconds; /* TensorFlow's training time */
} cell;

/* /work/shared/MISSION.md's table, as docs/cost_model.md repeats it. */
static const cell cells[] = {
    {"mnist", "mlp-300-100", DP_COST_PS_ASYNC, 128, 173.9},
    {"mnist", "mlp-300-100", DP_COST_PS_ASYNC, 256, 107.2},
    {"fashion-mnist", "mlp-128", DP_COST_PS_ASYNC, 128, 121.2},
    {"fashion-mnist", "mlp-128", DP_COST_PS_ASYNC, 256, 89.2},
    {"kmnist", "mlp-128", DP_COST_PS_ASYNC, 128, 125.6},
    {"kmnist", "mlp-128", DP_COST_PS_ASYNC, 256, 82.7},
    {"mnist", "mlp-300-100", DP_COST_ALLREDUCE, 128, 144.7},
    {"mnist", "mlp-300-100", DP_COST_ALLREDUCE, 256, 85.6},
    {"fashion-mnist", "mlp-128", DP_COST_ALLREDUCE, 128, 259.3},
    {"fashion-mnist", "mlp-128", DP_COST_ALLREDUCE, 256, 202.3},
    {"kmnist", "mlp-128", DP_COST_ALLREDUCE, 128, 145.9},
    {"kmnist", "mlp-128", DP_COST_ALLREDUCE, 256, 75.1},
};
#define N_CELLS ((int)(sizeof cells / sizeof cells[0]))

typedef struct source_ctx {
    dp_cost_calibration cal; /* sample_s for `base_params` */
    size_t base_params;
    double bandwidth, latency;
} source_ctx;

/* The source's layout: PS runs 1 chief, 6 workers, 2 ps; all-reduce runs
 * 9 workers; one task per VM. */
static int predict_cell(const source_ctx *x, const cell *c, double step_o, double rec_o,
                        double *seconds, dp_err *err)
{
    dp_cost_calibration cal = x->cal;
    size_t np;
    if (dp_cost_model_params(c->model, &np, err) < 0)
        return -1;
    /* A dense network's multiply-adds per record are about its parameters. */
    cal.sample_s = x->cal.sample_s * (double)np / (double)x->base_params;
    cal.n_params = np;
    cal.step_overhead_s = step_o;
    cal.record_overhead_s = rec_o;
    dp_cost_cluster cl = {.hosts = 9, .cores = 4, .bandwidth = x->bandwidth,
                          .latency = x->latency, .workers = 6, .ps = 2, .chief = 1};
    if (c->strategy == DP_COST_ALLREDUCE) {
        cl.workers = 8;
        cl.ps = 0;
    }
    dp_cost_job job;
    dp_cost_job_init(&job);
    job.strategy = c->strategy;
    job.batch = c->batch;
    dp_cost_prediction p;
    if (dp_cost_predict(&cal, &cl, &job, &p, err) < 0)
        return -1;
    *seconds = p.total_s;
    return 0;
}

/* The overhead per step that makes cell c take its measured time, given a
 * per-record overhead: the total grows with it, so bisection finds it. */
static int fit_step(const source_ctx *x, const cell *c, double rec_o, double *step_o, dp_err *err)
{
    double lo = 0, hi = 1.0, t;
    if (predict_cell(x, c, lo, rec_o, &t, err) < 0)
        return -1;
    if (t > c->seconds) { /* even no overhead is too slow: no fit */
        *step_o = 0;
        return 0;
    }
    for (int i = 0; i < 60; i++) {
        double mid = 0.5 * (lo + hi);
        if (predict_cell(x, c, mid, rec_o, &t, err) < 0)
            return -1;
        if (t < c->seconds)
            lo = mid;
        else
            hi = mid;
    }
    *step_o = 0.5 * (lo + hi);
    return 0;
}

/* Per-step and per-record overheads that fit both cells a and b (the same
 * model at two batch sizes): the per-record one by bisection on b. */
static int fit_two(const source_ctx *x, const cell *a, const cell *b, double *step_o, double *rec_o,
                   dp_err *err)
{
    double lo = 0, hi = 1e-3;
    for (int i = 0; i < 60; i++) {
        double mid = 0.5 * (lo + hi), so, t;
        if (fit_step(x, a, mid, &so, err) < 0 || predict_cell(x, b, so, mid, &t, err) < 0)
            return -1;
        if (t < b->seconds)
            lo = mid;
        else
            hi = mid;
    }
    *rec_o = 0.5 * (lo + hi);
    return fit_step(x, a, *rec_o, step_o, err);
}

/* Fit C: the two overheads and TensorFlow's effective link speed, the third
 * from Fashion-MNIST PS b128 (a smaller model: the time that scales with the
 * bytes).  A faster link leaves more of MNIST's step to the overheads, so
 * the smaller model's prediction grows with it: bisection on log speed. */
static int fit_three(source_ctx *x, double *step_o, double *rec_o, double *bw, dp_err *err)
{
    double lo = log(1e6), hi = log(1e10);
    for (int i = 0; i < 50; i++) {
        double mid = 0.5 * (lo + hi), t;
        x->bandwidth = exp(mid);
        if (predict_cell(x, &cells[0], 0, 0, &t, err) < 0)
            return -1;
        if (t >= cells[0].seconds) { /* too slow to fit MNIST even without overhead */
            lo = mid;
            continue;
        }
        if (fit_two(x, &cells[0], &cells[1], step_o, rec_o, err) < 0 ||
            predict_cell(x, &cells[2], *step_o, *rec_o, &t, err) < 0)
            return -1;
        if (t < cells[2].seconds)
            lo = mid;
        else
            hi = mid;
    }
    x->bandwidth = *bw = exp(0.5 * (lo + hi));
    return fit_two(x, &cells[0], &cells[1], step_o, rec_o, err);
}

int dp_cost_validate_source(const dp_cost_calibration *cal, size_t cal_params, double bandwidth,
                            double latency, FILE *out, dp_err *err)
{
    source_ctx x = {*cal, cal_params, bandwidth, latency};
    double o1, o2s, o2r, o3s, o3r, bw3;
    source_ctx x3 = x;
    if (fit_step(&x, &cells[0], 0, &o1, err) < 0 ||
        fit_two(&x, &cells[0], &cells[1], &o2s, &o2r, err) < 0 ||
        fit_three(&x3, &o3s, &o3r, &bw3, err) < 0)
        return -1;
    fprintf(out,
            "Source cluster: 9 hosts x 4 cores, %.0f Mbit/s, %.2f ms; PS 1 chief + 6 workers + 2 ps, "
            "all-reduce 9 replicas; 25 epochs.\n"
            "Fit A: one overhead per step, %.1f ms (from MNIST PS b128).\n"
            "Fit B: %.1f ms per step + %.1f us per record (from MNIST PS b128 and b256).\n"
            "Fit C: %.1f ms per step + %.1f us per record, link %.0f Mbit/s (from MNIST PS b128, "
            "b256 and Fashion-MNIST PS b128).\n\n",
            bandwidth * 8 / 1e6, latency * 1e3, o1 * 1e3, o2s * 1e3, o2r * 1e6, o3s * 1e3,
            o3r * 1e6, bw3 * 8 / 1e6);
    fprintf(out, "| run | dataset | batch | TF s | no overhead s | fit A s | err A | fit B s | err B | fit C s | err C |\n"
                 "|---|---|---|---|---|---|---|---|---|---|---|\n");
    double sa = 0, sb = 0, sc = 0;
    int na = 0, nb = 0, nc = 0;
    for (int i = 0; i < N_CELLS; i++) {
        const cell *c = &cells[i];
        double t0, ta, tb, tc;
        if (predict_cell(&x, c, 0, 0, &t0, err) < 0 || predict_cell(&x, c, o1, 0, &ta, err) < 0 ||
            predict_cell(&x, c, o2s, o2r, &tb, err) < 0 ||
            predict_cell(&x3, c, o3s, o3r, &tc, err) < 0)
            return -1;
        double ea = (ta - c->seconds) / c->seconds * 100, eb = (tb - c->seconds) / c->seconds * 100;
        double ec = (tc - c->seconds) / c->seconds * 100;
        fprintf(out, "| %s | %s | %d | %.1f | %.1f | %.1f | %+.0f %%%s | %.1f | %+.0f %%%s | %.1f | %+.0f %%%s |\n",
                c->strategy == DP_COST_ALLREDUCE ? "all-reduce" : "PS", c->dataset, c->batch,
                c->seconds, t0, ta, ea, i == 0 ? " (fit)" : "", tb, eb, i < 2 ? " (fit)" : "", tc,
                ec, i < 3 ? " (fit)" : "");
        if (i > 2) {
            sc += fabs(ec);
            nc++;
        }
        if (i > 0) {
            sa += fabs(ea);
            na++;
        }
        if (i > 1) {
            sb += fabs(eb);
            nb++;
        }
    }
    fprintf(out, "\nMean absolute error of the predicted cells: fit A %.0f %% (%d cells), fit B "
                 "%.0f %% (%d cells), fit C %.0f %% (%d cells).\n",
            sa / na, na, sb / nb, nb, sc / nc, nc);
    return 0;
}
