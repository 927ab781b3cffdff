/* A model's buffers, or a range of them, on the wire (docs/strategies.md,
 * "Buffers"): what the ps family's worker 0 and the pipeline's stages send
 * to the task that evaluates and saves.  The payload is [u32 count][count
 * f32]; the frame's type, step and offset are the caller's. */
#ifndef DOWNPOUR_BUFFERS_WIRE_H
#define DOWNPOUR_BUFFERS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"
#include "downpour/transport.h"

int dp_buffers_send(dp_transport *t, int peer, unsigned type, uint64_t step, uint64_t offset,
                    const float *v, size_t n, dp_err *err);

/* ev's payload (its header already read) into dst, the n floats that
 * `holder` holds ("model mlp-bn", "stage 1 of model mlp-bn"): a length or
 * a count other than n is refused naming who, before dst is touched.
 * Returns 0, -1 (refused: err says why) or -2 (the transport failed). */
int dp_buffers_recv(dp_transport *t, const dp_event *ev, const char *who, const char *holder,
                    float *dst, size_t n, dp_err *err);

#endif
