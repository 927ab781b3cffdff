#include "downpour/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/safetensors.h"

#define CKPT_FORMAT "downpour-checkpoint-1"
#define MAX_TENSORS (2 * DP_MAX_DENSE + 2)

int dp_checkpoint_save(const char *path, const dp_model *m, const dp_optim *opt,
                       const dp_ckpt_info *info, dp_err *err)
{
    dp_st_tensor t[MAX_TENSORS];
    char names[MAX_TENSORS][40];
    int nt = 0;
    for (int i = 0; i < m->n_dense; i++) {
        const dp_dense *d = &m->dense[i];
        snprintf(names[nt], sizeof names[nt], "layers.%d.weight", i);
        t[nt] = (dp_st_tensor){names[nt], m->params + d->w_off, 2, {d->out, d->in}};
        nt++;
        snprintf(names[nt], sizeof names[nt], "layers.%d.bias", i);
        t[nt] = (dp_st_tensor){names[nt], m->params + d->b_off, 1, {d->out}};
        nt++;
    }
    int slots = opt ? dp_optim_slots(opt->cfg.kind) : 0;
    for (int k = 0; k < slots; k++) {
        snprintf(names[nt], sizeof names[nt], "optimizer.slot%d", k);
        t[nt] = (dp_st_tensor){names[nt], opt->state + (size_t)k * opt->n, 1, {(int64_t)opt->n}};
        nt++;
    }
    char step[32], epoch[32], tt[32], lr[32];
    snprintf(step, sizeof step, "%ld", info ? info->step : 0L);
    snprintf(epoch, sizeof epoch, "%ld", info ? info->epoch : 0L);
    snprintf(tt, sizeof tt, "%ld", opt ? opt->t : 0L);
    snprintf(lr, sizeof lr, "%.9g", opt ? (double)opt->cfg.lr : 0.0);
    dp_st_meta meta[] = {
        {"format", CKPT_FORMAT},
        {"model", m->spec},
        {"model_name", m->name},
        {"optimizer", opt ? dp_optim_kind_name(opt->cfg.kind) : "none"},
        {"optimizer_t", tt},
        {"lr", lr},
        {"step", step},
        {"epoch", epoch},
        {"strategy", info && info->strategy ? info->strategy : "single"},
        {"dataset", info && info->dataset ? info->dataset : "unknown"},
    };
    return dp_safetensors_save(path, t, nt, meta, (int)(sizeof meta / sizeof meta[0]), err);
}

static int copy_tensor(float *dst, const dp_safetensors *st, const char *name, int ndim,
                       int64_t d0, int64_t d1, const char *path, dp_err *err)
{
    const dp_st_tensor *t = dp_safetensors_find(st, name);
    if (!t)
        return dp_errf(err, "%s: tensor '%s' is missing", path, name);
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1))
        return dp_errf(err, "%s: tensor '%s' has the wrong shape for the model in its metadata",
                       path, name);
    memcpy(dst, t->data, (size_t)(d0 * (ndim == 2 ? d1 : 1)) * sizeof *dst);
    return 0;
}

static long meta_long(const dp_safetensors *st, const char *key)
{
    const char *v = dp_safetensors_meta(st, key);
    return v ? strtol(v, NULL, 10) : 0;
}

int dp_checkpoint_load(const char *path, dp_model *m, int max_batch, dp_optim *opt,
                       dp_ckpt_info *info, dp_err *err)
{
    static char strategy[64], dataset[1024];
    dp_safetensors *st = NULL;
    if (dp_safetensors_load(path, &st, err) < 0)
        return -1;
    const char *spec = dp_safetensors_meta(st, "model");
    if (!spec) {
        dp_safetensors_free(st);
        return dp_errf(err, "%s: no 'model' in the metadata: not a downpour checkpoint", path);
    }
    if (dp_model_init(m, spec, max_batch, err) < 0) {
        dp_err_prefix(err, "%s", path);
        goto fail;
    }
    const char *preset = dp_safetensors_meta(st, "model_name");
    if (preset && strlen(preset) < sizeof m->name)
        snprintf(m->name, sizeof m->name, "%s", preset);
    for (int i = 0; i < m->n_dense; i++) {
        const dp_dense *d = &m->dense[i];
        char name[40];
        snprintf(name, sizeof name, "layers.%d.weight", i);
        if (copy_tensor(m->params + d->w_off, st, name, 2, d->out, d->in, path, err) < 0)
            goto fail;
        snprintf(name, sizeof name, "layers.%d.bias", i);
        if (copy_tensor(m->params + d->b_off, st, name, 1, d->out, 0, path, err) < 0)
            goto fail;
    }
    if (opt) {
        const char *kind = dp_safetensors_meta(st, "optimizer");
        if (kind && strcmp(kind, dp_optim_kind_name(opt->cfg.kind)) == 0 && opt->n == m->n_params) {
            for (int k = 0; k < dp_optim_slots(opt->cfg.kind); k++) {
                char name[40];
                snprintf(name, sizeof name, "optimizer.slot%d", k);
                if (copy_tensor(opt->state + (size_t)k * opt->n, st, name, 1, (int64_t)opt->n, 0,
                                path, err) < 0)
                    goto fail;
            }
            opt->t = meta_long(st, "optimizer_t");
        }
    }
    if (info) {
        info->step = meta_long(st, "step");
        info->epoch = meta_long(st, "epoch");
        const char *s = dp_safetensors_meta(st, "strategy");
        snprintf(strategy, sizeof strategy, "%s", s ? s : "unknown");
        info->strategy = strategy;
        const char *d = dp_safetensors_meta(st, "dataset");
        snprintf(dataset, sizeof dataset, "%s", d ? d : "unknown");
        info->dataset = dataset;
    }
    dp_safetensors_free(st);
    return 0;
fail:
    dp_safetensors_free(st);
    dp_model_free(m);
    return -1;
}
