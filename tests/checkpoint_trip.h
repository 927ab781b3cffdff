/* A model's checkpoint written and read back, for the tests that check a
 * layer kind's tensors under PyTorch's names (docs/models.md, "Checkpoints
 * and PyTorch"):
 *   checkpoint_trip_write  writes m's parameters and buffers to a scratch
 *                          file and opens it for the caller's checks;
 *   checkpoint_trip_shapes checks that the file holds each wanted tensor
 *                          with its rank and shape;
 *   checkpoint_trip_back   reads the weights back, checks parameters and
 *                          buffers against m bit for bit, and removes the
 *                          scratch directory. */
#ifndef DOWNPOUR_TEST_CHECKPOINT_TRIP_H
#define DOWNPOUR_TEST_CHECKPOINT_TRIP_H

#include <stdio.h>
#include <string.h>

#include "check.h"
#include "downpour/checkpoint.h"
#include "downpour/model.h"
#include "downpour/safetensors.h"
#include "scratch.h"

typedef struct checkpoint_trip {
    char dir[4096], path[4200];
    dp_safetensors *f;
} checkpoint_trip;

/* A tensor the file must hold (a scalar: ndim 0). */
typedef struct checkpoint_want {
    const char *name;
    int ndim;
    int64_t shape[4];
} checkpoint_want;

static inline dp_safetensors *checkpoint_trip_write(checkpoint_trip *t, const char *test,
                                                    const dp_model *m, uint64_t step)
{
    dp_err err;
    scratch_make(t->dir, sizeof t->dir, test);
    snprintf(t->path, sizeof t->path, "%s/model.safetensors", t->dir);
    dp_train_state st = {.n_params = m->n_params, .params = m->params, .step = step,
                         .best_accuracy = -1};
    CHECKF(dp_checkpoint_write(t->path, m, &st, NULL, &err) == 0, "%s", err.msg);
    t->f = NULL;
    REQUIRE(dp_safetensors_load(t->path, &t->f, &err) == 0);
    return t->f;
}

static inline void checkpoint_trip_shapes(const checkpoint_trip *t, const checkpoint_want *want,
                                          size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const dp_st_tensor *x = dp_safetensors_find(t->f, want[i].name);
        CHECKF(x && x->ndim == want[i].ndim &&
                   memcmp(x->shape, want[i].shape, (size_t)x->ndim * sizeof *x->shape) == 0,
               "checkpoint: %s missing or of another shape", want[i].name);
    }
}

/* back: the model read back, left to the caller (NULL: freed here). */
static inline void checkpoint_trip_back(checkpoint_trip *t, const dp_model *m, int max_batch,
                                        dp_model *back)
{
    dp_err err;
    dp_model own;
    dp_model *b = back ? back : &own;
    dp_safetensors_free(t->f);
    t->f = NULL;
    REQUIRE(dp_checkpoint_load_weights(t->path, b, max_batch, NULL, &err) == 0);
    CHECK(b->n_params == m->n_params &&
          memcmp(b->params, m->params, m->n_params * sizeof(float)) == 0);
    CHECK(b->n_buffers == m->n_buffers &&
          (!m->n_buffers || memcmp(b->buffers, m->buffers, m->n_buffers * sizeof(float)) == 0));
    if (!back)
        dp_model_free(&own);
    scratch_remove(t->dir);
}

#endif
