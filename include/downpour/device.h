/* Where a trainer computes: the CPU (the engine of model.h), a CUDA GPU, or
 * "sim", the device interface run on the host (docs/gpu.md).
 *
 * A device model (dp_dmodel) is a model's training state on a device: the
 * parameters, gradients, optimiser state and activations in device memory,
 * the training split copied there once, and batches gathered there from
 * record indices.  It reads the layer sequence and the flat parameter layout
 * from a host dp_model (model.h), so checkpoints and metrics are the same
 * files whatever the device: parameters and optimiser slots cross to and from
 * the host in that one layout.
 *
 * The executor (src/device/dmodel.c) is plain C over a small backend table
 * (src/device/backend.h): memory, copies, column-major products with cuBLAS's
 * conventions, element-wise kernels whose bodies are shared by every backend
 * (src/device/kernels.h), graph capture and collectives.  "cuda" is that
 * table in a plugin, libdownpour_cuda.so, loaded when first asked for, so
 * libdownpour itself needs no CUDA library.  "sim" is the same table on the
 * host: products through CBLAS in column-major order, the kernel bodies in
 * loops, a captured graph recorded and replayed.  Tests run every path of the
 * executor through sim on machines without a GPU.
 *
 * Asynchrony.  Calls that queue work (dp_dmodel_step, _grads, _update,
 * _stage) return before the device has done it; the loss and the count of
 * correct predictions accumulate on the device and come back with
 * dp_dmodel_collect, which waits.  Calls that return host data wait too.
 * Errors of queued work surface at the next call that waits. */
#ifndef DOWNPOUR_DEVICE_H
#define DOWNPOUR_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/dataset.h"
#include "downpour/model.h"
#include "downpour/optim.h"
#include "downpour/status.h"

typedef enum dp_device_kind {
    DP_DEVICE_CPU,  /* the host engine (model.h); no device model */
    DP_DEVICE_CUDA, /* an NVIDIA GPU through the CUDA plugin */
    DP_DEVICE_SIM,  /* the device interface run on the host, for tests */
    DP_DEVICE_KIND_COUNT
} dp_device_kind;

typedef struct dp_device_spec {
    dp_device_kind kind;
    int index; /* cuda:N; 0 otherwise */
} dp_device_spec;

/* "cpu", "cuda", "cuda:N" (N >= 0), "sim"; anything else fails naming the
 * text and the accepted spellings. */
int dp_device_parse(const char *text, dp_device_spec *out, dp_err *err);
/* The canonical spelling into buf: "cpu", "cuda:0", "sim". */
const char *dp_device_format(const dp_device_spec *spec, char *buf, size_t len);

/* ---- an open device: a backend, its context, one stream ---- */
typedef struct dp_device dp_device;

/* Opens the device; for cuda, loads the plugin and selects the GPU.  Fails
 * with what is missing: a build without the CUDA backend, a plugin or CUDA
 * library that does not load (the loader's message), no NVIDIA driver, no
 * GPU, or an index past the GPUs present (naming how many there are). */
int dp_device_open(dp_device **out, const dp_device_spec *spec, dp_err *err);
void dp_device_close(dp_device *d); /* NULL: no-op */
/* "NVIDIA H100 80GB HBM3 (cuda:0, 79.1 GiB)", "sim (host)". */
const char *dp_device_describe(const dp_device *d);
const dp_device_spec *dp_device_spec_of(const dp_device *d);
/* Whether the backend has collectives (NCCL): dp_dmodel_comm_* work. */
int dp_device_has_comm(const dp_device *d);
/* Why the cuda device cannot be used here, or NULL when it can: the skip
 * reason GPU tests print.  Opens and closes the device once. */
const char *dp_device_cuda_unavailable(char *buf, size_t len);

/* ---- a model on a device ---- */
typedef struct dp_dmodel dp_dmodel;

/* Builds the device state for m's layers and parameter layout, for batches
 * of up to m->max_batch rows, with an optimiser of config oc on the device
 * (NULL: none; dp_dmodel_update then fails).  Parameters start as a copy of
 * m->params; optimiser state starts as dp_optim_init leaves it.  Fails
 * naming the first layer with no device kernel, or the memory that does not
 * fit.  The device must outlive the model. */
int dp_dmodel_open(dp_dmodel **out, dp_device *d, const dp_model *m, const dp_optim_config *oc,
                   dp_err *err);
void dp_dmodel_close(dp_dmodel *g); /* NULL: no-op */
dp_device *dp_dmodel_device(const dp_dmodel *g);

/* Copies a split's records (images, or float values) and labels to the
 * device once (replacing any loaded before); batches are then gathered there
 * (pixels / 255, or the values as they are, as dp_split_gather does).  Fails
 * naming the bytes that do not fit; refuses a split not in memory (a
 * streamed one). */
int dp_dmodel_load_split(dp_dmodel *g, const dp_split *s, dp_err *err);

/* The next batch: records idx[0..n) of the loaded split, 1 <= n <=
 * max_batch.  Copied at once (the caller may reuse idx); the next step,
 * grads or forward call gathers them on the device. */
int dp_dmodel_stage(dp_dmodel *g, const uint32_t *idx, int n, dp_err *err);
/* The last batch staged, staged again (a step retried after the ring
 * re-formed: the loop staged it once), and the loss and correct count its
 * forward tallied taken back, so the retry counts them once; no-op while
 * it is still staged (its forward never ran).  Only for a step whose update
 * did not run. */
int dp_dmodel_restage(dp_dmodel *g, dp_err *err);

/* One whole training step on the staged batch: forward, backward, and the
 * optimiser's update with rate lr, all on the device (a captured graph for
 * full batches where the backend has graphs and DOWNPOUR_DEVICE_GRAPH is not
 * 0).  The loss and correct count accumulate for dp_dmodel_collect.  Queues
 * and returns. */
int dp_dmodel_step(dp_dmodel *g, float lr, dp_err *err);

/* Forward and backward on the staged batch: the device gradients are
 * OVERWRITTEN with the gradient of the mean loss, as dp_model_forward_backward
 * does; loss and correct accumulate.  Queues and returns. */
int dp_dmodel_grads(dp_dmodel *g, dp_err *err);

/* The optimiser's update of the device parameters from the device gradients
 * scaled by `scale` (1: as they are; 1/R after a sum over R replicas), with
 * rate lr.  Queues and returns. */
int dp_dmodel_update(dp_dmodel *g, float lr, float scale, dp_err *err);

/* Waits for the device; adds the loss summed over records (the mean loss
 * times the batch, per step) and the correct predictions queued since the
 * last collect to *loss_sum and *correct, then zeroes the device's tallies.
 * Reports any error of the queued work. */
int dp_dmodel_collect(dp_dmodel *g, double *loss_sum, long *correct, dp_err *err);

/* Evaluation stays on the host: the loop evaluates the parameters that
 * dp_dmodel_get_params brings back (docs/gpu.md, "Evaluation"). */

/* ---- host <-> device, in the model's flat layout (each waits) ---- */
int dp_dmodel_get_params(dp_dmodel *g, float *params, dp_err *err);       /* n_params */
int dp_dmodel_set_params(dp_dmodel *g, const float *params, dp_err *err);
/* The model's buffers (batch norm's statistics: n_buffers floats), which the
 * device's training steps move, back to the host for evaluation and
 * checkpoints (docs/strategies.md, "Buffers"); 0 with nothing done when the
 * model has none. */
int dp_dmodel_get_buffers(dp_dmodel *g, float *buffers, dp_err *err);
int dp_dmodel_get_grads(dp_dmodel *g, float *grads, dp_err *err);         /* n_params */
int dp_dmodel_set_grads(dp_dmodel *g, const float *grads, dp_err *err);
/* Optimiser state: dp_optim_slots(kind) full-length slots, and the update
 * count t, as dp_optim keeps them (and checkpoints write them). */
int dp_dmodel_get_optim(dp_dmodel *g, float *slots, long *t, dp_err *err);
int dp_dmodel_set_optim(dp_dmodel *g, const float *slots, long t, dp_err *err);

/* ---- page-locked host memory ----
 * dp_dmodel_pin_host page-locks the caller's host array p (bytes) in place
 * (cudaHostRegister) for the life of the device model, so the copies above
 * to and from it run at the bus's speed, with no staging copy through the
 * driver's own buffer (docs/gpu.md, "Strategies": host staging).  Those
 * calls still wait, so the caller may change p whenever they have returned.
 * dp_dmodel_close lets the ranges go, the last pinned first, before it frees
 * anything: p must stay allocated, at the same address, until then.  A
 * backend that cannot pin returns 0 and pins nothing (bytes 0 too); a range
 * the backend refuses (one overlapping a pinned range, too much locked
 * memory) returns -1 with the backend's reason and stays usable, unlocked:
 * the caller decides.  At most DP_DMODEL_MAX_PINS ranges.
 * dp_dmodel_pinned_bytes: the bytes pinned now. */
#define DP_DMODEL_MAX_PINS 8
int dp_dmodel_pin_host(dp_dmodel *g, void *p, size_t bytes, dp_err *err);
size_t dp_dmodel_pinned_bytes(const dp_dmodel *g);

/* ---- --ema on the device ----
 * A moving average of the parameters kept beside them, for a trainer whose
 * weights stay on the device (single; docs/gpu.md, "Checkpoints and
 * metrics"): after every update (dp_dmodel_step, dp_dmodel_update) it
 * becomes decay * average + (1 - decay) * params, the formula the loop uses
 * on the host.  dp_dmodel_ema_start allocates it (once; call it before the
 * steps) and sets it to start (n_params; NULL: the current parameters);
 * decay in (0, 1).  Fails on a model opened without an optimiser.
 * dp_dmodel_get_ema copies it back (waits); fails before a start. */
int dp_dmodel_ema_start(dp_dmodel *g, float decay, const float *start, dp_err *err);
int dp_dmodel_get_ema(dp_dmodel *g, float *ema, dp_err *err);

/* ---- collectives (NCCL), for all-reduce replicas that are all on GPUs ----
 * Rank 0 makes an id, every rank receives it (over the run's transport) and
 * joins; then dp_dmodel_allreduce_grads sums the device gradients of every
 * rank in place.  Fails when the backend has no collectives. */
#define DP_COMM_ID_BYTES 128
int dp_dmodel_comm_id(dp_dmodel *g, uint8_t id[DP_COMM_ID_BYTES], dp_err *err);
int dp_dmodel_comm_join(dp_dmodel *g, const uint8_t id[DP_COMM_ID_BYTES], int ranks, int rank,
                        dp_err *err);
int dp_dmodel_allreduce_grads(dp_dmodel *g, dp_err *err);
/* The device gradients times w (0: set to zero), before a sum that weighs
 * each rank by its share of the records.  Queues and returns. */
int dp_dmodel_scale_grads(dp_dmodel *g, float w, dp_err *err);
/* Waits up to timeout_s for the queued work, the sum included: 1 done, 0
 * not yet, -1 failed (err says why: a peer gone, NCCL's error).  A caller
 * waits in slices and looks for lost peers between them (docs/gpu.md,
 * "Strategies"); a failed or stalled communicator is ended with
 * dp_dmodel_comm_abort, which never waits for the peers, and a new one
 * joined. */
int dp_dmodel_comm_wait(dp_dmodel *g, double timeout_s, dp_err *err);
void dp_dmodel_comm_abort(dp_dmodel *g);

#endif
