/* A model replica on the host or a device (include/downpour/replica.h):
 * the one place where a trainer's step, state and batches branch on where
 * the arrays live, so the loop and the strategies never do. */
#include <stdlib.h>
#include <string.h>

#include "downpour/log.h"
#include "downpour/replica.h"

struct dp_replica {
    dp_model *m;
    dp_optim opt;   /* the host optimiser; live with host state */
    int has_optim;
    dp_dmodel *dev; /* on a device: the model there; NULL on the host */
    int local;      /* the state lives on the device (DP_STATE_LOCAL there) */
    float *ema;     /* local with --ema: the device's average, brought back */
    uint32_t *idx;  /* on a device: a batch's record indices */
    const char *label;
};

void dp_replica_close(dp_replica *r)
{
    if (!r)
        return;
    if (r->dev) {
        dp_device *d = dp_dmodel_device(r->dev);
        dp_dmodel_close(r->dev);
        dp_device_close(d);
    }
    free(r->ema);
    free(r->idx);
    dp_optim_free(&r->opt);
    free(r);
}

static int open_device(dp_replica *r, const dp_replica_config *c, dp_err *err)
{
    char name[32];
    dp_device_format(c->device, name, sizeof name);
    if (!c->train)
        return dp_errf(err, "--device %s: %s has no training split to load", name, c->label);
    if (!(r->idx = malloc((size_t)r->m->max_batch * sizeof *r->idx)))
        return dp_errf(err, "out of memory for a batch of %d records", r->m->max_batch);
    dp_device *d = NULL;
    if (dp_device_open(&d, c->device, err) < 0)
        return -1;
    if (dp_dmodel_open(&r->dev, d, r->m, c->optim, err) < 0 ||
        dp_dmodel_load_split(r->dev, c->train, err) < 0) {
        dp_dmodel_close(r->dev);
        r->dev = NULL;
        dp_device_close(d);
        return -1;
    }
    dp_info("%s trains on %s", c->label, dp_device_describe(d));
    return 0;
}

int dp_replica_open(dp_replica **out, const dp_replica_config *c, dp_err *err)
{
    *out = NULL;
    dp_replica *r = calloc(1, sizeof *r);
    if (!r)
        return dp_errf(err, "out of memory");
    r->m = c->model;
    r->label = c->label;
    if (c->optim) {
        if (dp_optim_init(&r->opt, c->optim, r->m->n_params, err) < 0) {
            dp_replica_close(r);
            return -1;
        }
        r->has_optim = 1;
        size_t n = r->m->n_params * (size_t)dp_optim_slots(r->opt.cfg.kind);
        if (c->resumed && n)
            memcpy(r->opt.state, c->slots, n * sizeof(float));
        if (c->resumed)
            r->opt.t = c->optim_t;
    }
    if (r->m->external && c->device && c->device->kind != DP_DEVICE_CPU) {
        dp_errf(err, "--device: %s is an external model, which computes where its caller "
                     "puts it (external.h); leave --device out", r->m->name);
        dp_replica_close(r);
        return -1;
    }
    if (c->device && c->device->kind != DP_DEVICE_CPU && open_device(r, c, err) < 0) {
        dp_replica_close(r);
        return -1;
    }
    *out = r;
    return 0;
}

/* Host staging copies the parameters to the device and the gradients back
 * every step: page-locked in place, they cross at the bus's speed with no
 * bounce buffer.  Not being able to lock them costs speed only. */
static void pin(dp_replica *r)
{
    size_t bytes = r->m->n_params * sizeof(float);
    dp_err err;
    if (dp_dmodel_pin_host(r->dev, r->m->params, bytes, &err) < 0 ||
        dp_dmodel_pin_host(r->dev, r->m->grads, bytes, &err) < 0) {
        dp_warn("%s: copies go through pageable memory: %s", r->label, err.msg);
        return;
    }
    size_t pinned = dp_dmodel_pinned_bytes(r->dev);
    if (pinned)
        dp_info("%s pinned %.1f MiB of host staging buffers (parameters and gradients)",
                r->label, (double)pinned / (1024.0 * 1024.0));
}

int dp_replica_settle(dp_replica *r, dp_replica_home where, float ema, const float *ema_start,
                      dp_err *err)
{
    if (!r->dev)
        return 0;
    if (where == DP_STATE_HOST) {
        pin(r);
        return 0;
    }
    r->local = 1;
    if (dp_replica_from_host(r, err) < 0)
        return -1;
    if (!(ema > 0))
        return 0;
    if (!(r->ema = malloc(r->m->n_params * sizeof(float))))
        return dp_errf(err, "out of memory for --ema's average (%zu parameters)",
                       r->m->n_params);
    return dp_dmodel_ema_start(r->dev, ema, ema_start, err);
}

int dp_replica_host_live(const dp_replica *r)
{
    return !r->local;
}

dp_optim *dp_replica_optim(dp_replica *r)
{
    return &r->opt;
}

/* An external model's caller fetches its own batch (external.h). */
static int external_next(const dp_model *m, dp_err *err)
{
    const dp_external_model *e = m->external;
    int n = e->next ? e->next(e->ctx) : -1;
    if (n < 0 && err)
        dp_errf(err, "%s: %s", m->name,
                e->next ? "its next batch failed" : "this task has no batches to train on");
    return n;
}

/* Forward and backward by the caller (external.h) into m->grads. */
static int external_grads(dp_model *m, float *loss, int *correct, dp_err *err)
{
    const dp_external_model *e = m->external;
    *loss = 0;
    *correct = 0;
    if (!e->compute || e->compute(e->ctx, loss, correct) < 0)
        return dp_errf(err, "%s: %s", m->name,
                       e->compute ? "its step failed" : "this task has no step to compute");
    if (m->grad_ready) /* the whole gradient at once, as a device's */
        m->grad_ready(m->grad_ready_ctx, 0);
    return 0;
}

int dp_replica_next_batch(dp_replica *r, dp_batcher *b, float *x, uint8_t *y, int batch,
                          dp_err *err)
{
    if (r && r->m->external)
        return external_next(r->m, err);
    int n = r && r->dev ? dp_batcher_next_indices(b, r->idx, batch)
                        : dp_batcher_next(b, x, y, batch);
    if (n < 0) { /* a streamed split's refusal (stream.h) */
        if (err)
            *err = b->err;
        return -1;
    }
    return n > 0 && r && r->dev && dp_dmodel_stage(r->dev, r->idx, n, err) < 0 ? -1 : n;
}

const char *dp_replica_no_augment(const dp_replica *r)
{
    if (r && r->m->external)
        return "an external model's own data loader gives the batches";
    return r && r->dev ? "the device gathers the records itself" : NULL;
}

int dp_replica_restage(dp_replica *r, dp_err *err)
{
    return r->dev ? dp_dmodel_restage(r->dev, err) : 0;
}

int dp_replica_collect(dp_replica *r, double *loss_sum, long *correct, dp_err *err)
{
    return r && r->dev ? dp_dmodel_collect(r->dev, loss_sum, correct, err) : 0;
}

int dp_replica_step(dp_replica *r, const float *x, const uint8_t *y, int n, float lr,
                    float *loss, int *correct, dp_err *err)
{
    if (r->local)
        return dp_dmodel_step(r->dev, lr, err) < 0 ? -1 : 1;
    if (r->dev)
        return dp_errf(err, "%s: a whole step on the device needs the state there", r->label);
    if (r->m->external) {
        if (external_grads(r->m, loss, correct, err) < 0)
            return -1;
        dp_optim_apply(&r->opt, r->m->params, r->m->grads, lr);
        return 0;
    }
    *correct = 0;
    *loss = dp_model_train_step(r->m, &r->opt, x, y, n, lr, correct);
    return 0;
}

/* Host staging: the host's parameters there (a pull, a restore or the
 * update may have changed them since the last step), forward and backward,
 * and the gradients and the loss back (the update needs them now). */
int dp_replica_grads(dp_replica *r, const float *x, const uint8_t *y, int n, float *loss,
                     int *correct, dp_err *err)
{
    dp_model *m = r->m;
    if (r->local)
        return dp_dmodel_grads(r->dev, err) < 0 ? -1 : 1;
    if (m->external)
        return external_grads(m, loss, correct, err);
    if (!r->dev) {
        *correct = 0;
        *loss = dp_model_forward_backward(m, x, y, n, correct);
        return 0;
    }
    double loss_sum = 0;
    long right = 0;
    if (dp_dmodel_set_params(r->dev, m->params, err) < 0 || dp_dmodel_grads(r->dev, err) < 0 ||
        dp_dmodel_collect(r->dev, &loss_sum, &right, err) < 0 ||
        dp_dmodel_get_grads(r->dev, m->grads, err) < 0)
        return -1;
    *loss = (float)(loss_sum / n);
    *correct = (int)right;
    if (m->grad_ready)
        m->grad_ready(m->grad_ready_ctx, 0);
    return 0;
}

int dp_replica_apply(dp_replica *r, float lr, dp_err *err)
{
    if (!r->has_optim)
        return dp_errf(err, "%s has no optimiser", r->label);
    if (r->local)
        return dp_dmodel_update(r->dev, lr, 1.0f, err);
    dp_optim_apply(&r->opt, r->m->params, r->m->grads, lr);
    return 0;
}

int dp_replica_to_host(dp_replica *r, dp_err *err)
{
    if (!r->local)
        return 0;
    return dp_dmodel_get_params(r->dev, r->m->params, err) < 0 ||
                   dp_dmodel_get_optim(r->dev, r->opt.state, &r->opt.t, err) < 0
               ? -1
               : 0;
}

int dp_replica_from_host(dp_replica *r, dp_err *err)
{
    if (!r->local)
        return 0;
    return dp_dmodel_set_params(r->dev, r->m->params, err) < 0 ||
                   dp_dmodel_set_optim(r->dev, r->opt.state, r->opt.t, err) < 0
               ? -1
               : 0;
}

int dp_replica_get_buffers(dp_replica *r, dp_err *err)
{
    return r && r->dev ? dp_dmodel_get_buffers(r->dev, r->m->buffers, err) : 0;
}

const float *dp_replica_weights(dp_replica *r, int average, dp_err *err)
{
    if (dp_replica_get_buffers(r, err) < 0)
        return NULL;
    if (average && r->ema)
        return dp_dmodel_get_ema(r->dev, r->ema, err) < 0 ? NULL : r->ema;
    if (r->local && dp_dmodel_get_params(r->dev, r->m->params, err) < 0)
        return NULL;
    return r->m->params;
}

int dp_replica_state(dp_replica *r, float *params, float *slots, int n_slots, long *optim_t,
                     float *ema, dp_err *err)
{
    if (dp_replica_get_buffers(r, err) < 0)
        return -1;
    if (r->local)
        return dp_dmodel_get_params(r->dev, params, err) < 0 ||
                       dp_dmodel_get_optim(r->dev, slots, optim_t, err) < 0 ||
                       (r->ema && ema && dp_dmodel_get_ema(r->dev, ema, err) < 0)
                   ? -1
                   : 0;
    memcpy(params, r->m->params, r->m->n_params * sizeof(float));
    if (n_slots)
        memcpy(slots, r->opt.state, (size_t)n_slots * r->m->n_params * sizeof(float));
    *optim_t = r->opt.t;
    return 0;
}

int dp_replica_can_sum(const dp_replica *r)
{
    return r->dev && dp_device_has_comm(dp_dmodel_device(r->dev));
}

const char *dp_replica_describe(const dp_replica *r)
{
    return r->dev ? dp_device_describe(dp_dmodel_device(r->dev)) : "cpu";
}

/* The sums need a device: a host replica's caller asked dp_replica_can_sum. */
static int no_sum(const dp_replica *r, dp_err *err)
{
    return dp_errf(err, "%s has no device to sum on", r->label);
}

int dp_replica_sum_id(dp_replica *r, uint8_t id[DP_COMM_ID_BYTES], dp_err *err)
{
    if (!r->dev)
        return no_sum(r, err);
    return dp_dmodel_comm_id(r->dev, id, err);
}

int dp_replica_sum_join(dp_replica *r, const uint8_t id[DP_COMM_ID_BYTES], int ranks, int rank,
                        dp_err *err)
{
    if (!r->dev)
        return no_sum(r, err);
    return dp_dmodel_comm_join(r->dev, id, ranks, rank, err);
}

int dp_replica_scale_grads(dp_replica *r, float w, dp_err *err)
{
    if (!r->dev)
        return no_sum(r, err);
    return dp_dmodel_scale_grads(r->dev, w, err);
}

int dp_replica_sum_grads(dp_replica *r, dp_err *err)
{
    if (!r->dev)
        return no_sum(r, err);
    return dp_dmodel_allreduce_grads(r->dev, err);
}

int dp_replica_sum_wait(dp_replica *r, double timeout_s, dp_err *err)
{
    if (!r->dev)
        return no_sum(r, err);
    return dp_dmodel_comm_wait(r->dev, timeout_s, err);
}

void dp_replica_sum_abort(dp_replica *r)
{
    if (r->dev)
        dp_dmodel_comm_abort(r->dev);
}
