/* Sandblaster L-BFGS checkpoints and --resume (src/strategy/lbfgs.c,
 * lbfgs_state.c; docs/checkpoints.md, "lbfgs"), on the in-process transport
 * with a small model (317 parameters), each task a thread as the loop
 * would run it, the checkpoints written and read through checkpoint.h:
 * - a run resumed from a checkpoint in the middle of an epoch ends with
 *   the uninterrupted run's weights bit for bit (3 batches an epoch, 1
 *   worker, 4 portions a batch), and so does a full-batch run (the gradient
 *   at x is carried from one iteration to the next) resumed with 1 worker
 *   instead of 3;
 * - the history matters: the same resume with the pairs dropped ends
 *   elsewhere;
 * - another number of ps tasks takes the gathered vectors up (re-sharded)
 *   and ends within float noise (the dot products' partial sums add up in
 *   another order);
 * - a checkpoint cut short, one without a pair or without the L-BFGS state,
 *   one with a value that does not read and one of another history length
 *   are errors naming the file, on the chief and on a ps task alike. */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "downpour/blas.h"
#include "downpour/checkpoint.h"
#include "downpour/inproc.h"
#include "downpour/rng.h"
#include "downpour/strategy.h"
#include "downpour/train.h"
#include "scratch.h"
#include "strategy/ps_family.h"

#define SPEC "20-12-5" /* 317 parameters */
#define DIM 20
#define NREC 300
#define MAX_TASKS 8

static uint8_t images[NREC * DIM], labels[NREC];
static dp_split split = {.images = images, .labels = labels, .n = NREC, .dim = DIM};
static char dir[4096];

typedef struct run {
    dp_train_config cfg;
    int workers, ps;
    const char *resume; /* a checkpoint to go on from, or NULL */
    int drop_history;   /* resume with the pairs forgotten */
    float params[512];
    int written;        /* checkpoints the chief wrote */
} run;

typedef struct task {
    run *r;
    int rank;
    dp_transport *t;
    int rc;
    dp_err err;
} task;

static dp_run_identity identity(const run *r)
{
    return (dp_run_identity){.strategy = "lbfgs", .dataset = "synthetic", .optimizer = "sgd",
                             .lr_schedule = "constant", .lr = 0.1f, .workers = r->workers,
                             .ps = r->ps, .batch = r->cfg.batch, .seed = 7,
                             .train_size = NREC, .epochs = r->cfg.epochs,
                             .steps_per_epoch = (NREC + r->cfg.batch - 1) / r->cfg.batch,
                             .reshards = dp_strategy_lbfgs.reshards, .settings = "test"};
}

static void *run_task(void *arg)
{
    task *j = arg;
    run *r = j->r;
    int ports[MAX_TASKS];
    for (int i = 0; i < MAX_TASKS; i++)
        ports[i] = 30000 + i; /* never listened on */
    dp_node node;
    memset(&node, 0, sizeof node);
    dp_model m;
    dp_train_state st, res;
    memset(&st, 0, sizeof st);
    memset(&res, 0, sizeof res);
    j->rc = -1;
    REQUIRE(dp_cluster_local(&node.cluster, 1, r->workers, r->ps, ports, &j->err) == 0);
    node.cluster.self = j->rank;
    node.self = &node.cluster.tasks[j->rank];
    node.transport = j->t;
    const dp_strategy_ops *ops = &dp_strategy_lbfgs;
    REQUIRE(dp_model_init(&m, SPEC, ops->model_rows(&r->cfg), 1, &j->err) == 0);
    dp_model_init_params(&m, 7);
    long spe = (NREC + r->cfg.batch - 1) / r->cfg.batch;
    dp_run_identity id = identity(r);
    dp_run_env env = {.cfg = &r->cfg, .node = &node, .model = &m, .n_train = NREC,
                      .steps_per_epoch = spe, .train = &split, .id = &id};
    if (r->resume) { /* as the loop's load_resume: every task reads the file */
        if (dp_checkpoint_read(r->resume, &m, &id, &res, &j->err) < 0)
            goto out;
        memcpy(m.params, res.params, m.n_params * sizeof(float));
        if (r->drop_history) {
            char *p = strstr(res.scalars, " pairs=");
            REQUIRE(p && p[7] >= '1' && p[7] <= '9');
            p[7] = '0';
        }
        env.resume = &res;
    }
    dp_task_info info;
    memset(&info, 0, sizeof info);
    dp_strategy *s = NULL;
    if (ops->open(&s, &env, &info, &j->err) < 0)
        goto out;
    if (info.part == DP_PART_SERVER) {
        j->rc = ops->serve(s, &j->err);
    } else if (info.part == DP_PART_TRAINER) {
        for (long k = res.step; k < spe * r->cfg.epochs; k++) {
            dp_step_out o;
            if (ops->step(s, NULL, NULL, 0, 0, k + 1, &o, &j->err) < 0)
                goto out;
            if (r->cfg.checkpoint_dir && (k + 1) % r->cfg.checkpoint_every == 0)
                CHECK(ops->save(s, k + 1, &st, &j->err) == 0); /* the chief writes */
        }
        j->rc = ops->finish(s, spe * r->cfg.epochs, &j->err);
    } else {
        REQUIRE(dp_train_state_alloc(&st, m.n_params, 0, 0, r->cfg.epochs, 0, &j->err) == 0);
        dp_coord_event ev;
        do {
            if (ops->next(s, &ev, &st, &j->err) < 0)
                goto out;
            if (ev.kind == DP_COORD_CHECKPOINT) {
                char path[4200];
                CHECK(st.step == ev.step);
                dp_checkpoint_path(path, sizeof path, dir, ev.step);
                REQUIRE(dp_checkpoint_write(path, &m, &st, &id, &j->err) == 0);
                r->written++;
            }
        } while (ev.kind != DP_COORD_DONE);
        const float *p = ops->params(s, DP_WEIGHTS_LIVE, &j->err);
        REQUIRE(p && m.n_params <= 512);
        memcpy(r->params, p, m.n_params * sizeof(float));
        j->rc = 0;
    }
out:
    if (ops->close)
        ops->close(s);
    dp_train_state_free(&st);
    dp_train_state_free(&res);
    dp_model_free(&m);
    dp_cluster_free(&node.cluster);
    return NULL;
}

/* Runs the cluster; 0 when every task ended well, else -1 with the first
 * error in err. */
static int run_cluster(run *r, dp_err *err)
{
    int n = 1 + r->workers + r->ps;
    REQUIRE(n <= MAX_TASKS);
    dp_transport *ts[MAX_TASKS];
    REQUIRE(dp_inproc_open(ts, n, err) == 0);
    pthread_t th[MAX_TASKS];
    task tasks[MAX_TASKS];
    for (int k = 0; k < n; k++) {
        tasks[k] = (task){.r = r, .rank = k, .t = ts[k]};
        REQUIRE(pthread_create(&th[k], NULL, run_task, &tasks[k]) == 0);
    }
    for (int k = 0; k < n; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < n; k++)
        dp_transport_close(ts[k]);
    for (int k = 0; k < n; k++)
        if (tasks[k].rc != 0) {
            *err = tasks[k].err;
            return -1;
        }
    return 0;
}

static run setup(int batch, int portion, int epochs, int workers, int ps, int every)
{
    run r;
    memset(&r, 0, sizeof r);
    dp_train_config *cfg = &r.cfg;
    *cfg = dp_train_defaults();
    dp_err e;
    char text[32];
    REQUIRE(dp_strategy_select(cfg, "lbfgs", &e) == 0);
    cfg->model = SPEC;
    cfg->batch = batch;
    cfg->epochs = epochs;
    snprintf(text, sizeof text, "%d", portion);
    REQUIRE(dp_strategy_set(cfg, "portion", text, &e) == 0);
    REQUIRE(dp_strategy_set(cfg, "lbfgs-history", "4", &e) == 0);
    /* shards of 317 floats: below the option's bound, so by the field */
    *(size_t *)(cfg->strategy_cfg + offsetof(dp_ps_settings, min_shard_bytes)) = 64;
    cfg->collective_timeout = 60;
    cfg->log_every = 0;
    cfg->checkpoint_dir = every ? dir : NULL;
    cfg->checkpoint_every = every;
    r.workers = workers;
    r.ps = ps;
    return r;
}

static void clear_dir(void)
{
    scratch_remove(dir);
    REQUIRE(mkdir(dir, 0755) == 0);
}

static double max_rel(const float *a, const float *b, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (1.0 + fabs((double)b[i]));
        worst = d > worst ? d : worst;
    }
    return worst;
}

#define NP 317

/* A run with checkpoints every `every`; then, from the checkpoint of step
 * `from`, resumed with `workers2` workers and `ps2` ps tasks. */
static void case_resume(const char *name, int batch, int portion, int epochs, int workers,
                        int ps, int every, long from, int workers2, int ps2)
{
    dp_err err;
    clear_dir();
    run full = setup(batch, portion, epochs, workers, ps, every);
    REQUIRE(run_cluster(&full, &err) == 0 || (fprintf(stderr, "%s\n", err.msg), 0));
    long total = (long)epochs * ((NREC + batch - 1) / batch);
    CHECKF(full.written == (int)(total / every) + (total % every != 0),
           "%s: %d checkpoints written", name, full.written);
    char ck[4200];
    dp_checkpoint_path(ck, sizeof ck, dir, from);
    CHECKF(access(ck, R_OK) == 0, "%s: no checkpoint %s", name, ck);

    run again = setup(batch, portion, epochs, workers2, ps2, every);
    again.resume = ck;
    int rc = run_cluster(&again, &err);
    CHECKF(rc == 0, "%s: the resumed run: %s", name, err.msg);
    double d = max_rel(again.params, full.params, NP);
    int same = memcmp(again.params, full.params, sizeof(float) * NP) == 0;
    fprintf(stderr, "%s: resumed at step %ld of %ld with %d worker(s), %d ps: %s (max relative "
            "difference %.3g)\n", name, from, total, workers2, ps2,
            same ? "bitwise equal" : "differs", d);
    if (ps2 == ps)
        CHECKF(same, "%s: the resumed run differs from the uninterrupted one by %g", name, d);
    else
        CHECKF(d < 1e-4, "%s: re-sharded over %d ps, the run ends %g away", name, ps2, d);

    if (ps2 != ps)
        return;
    run dropped = setup(batch, portion, epochs, workers2, ps2, every);
    dropped.resume = ck;
    dropped.drop_history = 1;
    CHECKF(run_cluster(&dropped, &err) == 0, "%s: %s", name, err.msg);
    d = max_rel(dropped.params, full.params, NP);
    fprintf(stderr, "%s: the same resume with the history dropped ends %.3g away\n", name, d);
    CHECKF(d > 1e-4, "%s: the history did not matter (%g)", name, d);
}

/* Task `rank` of r opened alone (it fails before it talks to anyone):
 * 0, or -1 with its error in err. */
static int open_alone(run *r, int rank, dp_err *err)
{
    int n = 1 + r->workers + r->ps;
    dp_transport *ts[MAX_TASKS];
    REQUIRE(dp_inproc_open(ts, n, err) == 0);
    task j = {.r = r, .rank = rank, .t = ts[rank]};
    run_task(&j);
    for (int k = 0; k < n; k++)
        dp_transport_close(ts[k]);
    *err = j.err;
    return j.rc;
}

/* The chief and a ps task refuse a bad checkpoint, naming it and `what`. */
static void refused(run *r, const char *file, const char *what)
{
    int ranks[2] = {0, 1 + r->workers}; /* the chief, the first ps task */
    for (int i = 0; i < 2; i++) {
        dp_err err;
        int rc = open_alone(r, ranks[i], &err);
        CHECKF(rc < 0 && strstr(err.msg, file) && strstr(err.msg, what),
               "rank %d, %s: rc %d: %s", ranks[i], file, rc, rc < 0 ? err.msg : "");
        if (rc < 0)
            fprintf(stderr, "refused: %s\n", err.msg);
    }
}

/* Damaged and foreign checkpoints: errors naming the file. */
static void case_bad(void)
{
    dp_err err;
    clear_dir();
    run full = setup(100, 25, 1, 1, 2, 2);
    REQUIRE(run_cluster(&full, &err) == 0);
    char ck[4200], cut[4300];
    dp_checkpoint_path(ck, sizeof ck, dir, 2);
    size_t len;
    uint8_t *bytes = read_bytes(ck, &len);
    /* cut short: the loader names the file */
    snprintf(cut, sizeof cut, "%s/cut.safetensors", dir);
    write_bytes(cut, bytes, len / 2);
    run r = setup(100, 25, 1, 1, 2, 2);
    r.resume = cut;
    refused(&r, "cut.safetensors", "cut.safetensors");
    free(bytes);

    /* a whole file without a pair (re-written, so the checksum holds) */
    dp_model m;
    REQUIRE(dp_model_init(&m, SPEC, 1, 1, &err) == 0);
    dp_run_identity id = identity(&r);
    dp_train_state st;
    REQUIRE(dp_checkpoint_read(ck, &m, &id, &st, &err) == 0);
    CHECK(st.n_vecs >= 3 && st.scalars && strstr(st.scalars, "pairs="));
    st.n_vecs--;
    char lost[4300];
    snprintf(lost, sizeof lost, "%s/lost.safetensors", dir);
    REQUIRE(dp_checkpoint_write(lost, &m, &st, &id, &err) == 0);
    r.resume = lost;
    refused(&r, "lost.safetensors", "is missing");
    /* a damaged value (checksummed anew) and another history length */
    st.n_vecs++;
    char *g = strstr(st.scalars, " gamma=");
    REQUIRE(g);
    memcpy(g + 7, "inf", 3);
    REQUIRE(dp_checkpoint_write(lost, &m, &st, &id, &err) == 0);
    refused(&r, "lost.safetensors", "lbfgs's 'gamma'");
    run five = setup(100, 25, 1, 1, 2, 2);
    REQUIRE(dp_strategy_set(&five.cfg, "lbfgs-history", "5", &err) == 0);
    five.resume = ck;
    refused(&five, "ckpt-0000000002.safetensors", "history of 4 pairs; this run keeps 5");
    /* no L-BFGS state at all (another strategy's file of the same model) */
    free(st.scalars);
    st.scalars = NULL;
    st.n_vecs = 0;
    REQUIRE(dp_checkpoint_write(lost, &m, &st, &id, &err) == 0);
    refused(&r, "lost.safetensors", "no L-BFGS state");
    dp_train_state_free(&st);
    dp_model_free(&m);
}

int main(void)
{
    dp_blas_set_threads(1);
    dp_rng r;
    dp_rng_seed(&r, 3);
    for (size_t i = 0; i < sizeof images; i++)
        images[i] = (uint8_t)(dp_rng_uniform(&r) * 256);
    for (size_t i = 0; i < NREC; i++) /* a learnable rule: the class of the first pixels */
        labels[i] = (uint8_t)((images[i * DIM] + images[i * DIM + 1]) / 103);
    scratch_make(dir, sizeof dir, "lbfgs_resume");
    /* 3 batches an epoch, 4 portions a batch; one worker adds them in one
     * order, so two runs are the same bits; checkpoints at 4 and 8 fall
     * in the middle of epochs 2 and 3 */
    case_resume("batches", 100, 25, 3, 1, 2, 4, 4, 1, 2);
    /* full batch, one portion: 3 workers (backup copies of the one portion
     * compute the same bits); resumed with 1 */
    case_resume("full batch", NREC, NREC, 8, 3, 2, 3, 3, 1, 2);
    /* re-sharded over 1 ps task, then 3 */
    case_resume("re-sharded", 100, 25, 3, 1, 2, 4, 4, 1, 1);
    case_resume("re-sharded", 100, 25, 3, 1, 2, 4, 4, 1, 3);
    case_bad();
    int rc = CHECK_DONE();
    if (rc == 0)
        scratch_remove(dir);
    return rc;
}
