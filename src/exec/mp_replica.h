/* One model replica split over K tasks (src/exec/mp_replica.c): the
 * step's forward and backward of model parallelism, shared by
 * --strategy model-parallel (model_parallel.c) and model-parallel replicas
 * under ps-async (ps_family.c).  Task j holds its slices (mp_slice.h);
 * forward, the replica all-gathers each dense layer's output columns
 * (DP_WIRE_MP_ACT), so every task holds the full output and, at the end, the
 * same logits, loss and loss gradient; backward, each task's weight and bias
 * gradients are local and the replica reduce-scatters the input gradient
 * (DP_WIRE_MP_GRAD), each task getting the columns it owns of the layer
 * below.  An image model's layers before the first dense one are split
 * by bands of output rows, with halo rows exchanged between neighbours
 * (DP_WIRE_MP_ROWS, _ROWS_GRAD) and conv filters shared within the replica
 * (DP_WIRE_MP_FILTERS): docs/architecture.md, "Model parallelism".  Sends
 * go out from a send thread (sender.h), so two tasks sending
 * each other more than the sockets hold never wait on each other.  Nothing
 * allocates after open. */
#ifndef DOWNPOUR_EXEC_MP_REPLICA_H
#define DOWNPOUR_EXEC_MP_REPLICA_H

#include <stdint.h>

#include "downpour/model.h"
#include "downpour/status.h"
#include "downpour/replica.h" /* dp_step_out */
#include "downpour/transport.h"
#include "exec/mp_slice.h"

typedef struct mp_replica mp_replica;

/* Task `task` of the K tasks of replica `replica`; ranks: the replica's K
 * transport ranks in task order; batches of up to `rows` records; a peer
 * silent past timeout s is lost. */
int mp_replica_open(mp_replica **out, dp_transport *t, const dp_model *m, const int *ranks,
                    int K, int task, int replica, int rows, double timeout, dp_err *err);
void mp_replica_close(mp_replica *r); /* NULL is a no-op */

/* Task j's slices (0 <= j < K). */
const mp_plan *mp_replica_plan(const mp_replica *r, int j);

/* Forward and backward of n (1..rows) records with this task's slices
 * params (compact): out->loss and out->correct (the same on every task),
 * and this task's gradients, OVERWRITTEN in grads (compact), of the mean
 * loss times w.  A lost or silent task gives -1 with a message naming it:
 * "lost model-parallel task j of replica r, NAME (...)". */
int mp_replica_step(mp_replica *r, const float *params, float *grads, const float *x,
                    const uint8_t *y, int n, float w, long step, dp_step_out *out, dp_err *err);

#endif
