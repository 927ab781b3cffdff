/* A send queue with a thread of its own (src/net/sender.c): frames go
 * out in the order they were queued, from the caller's memory, while the
 * caller goes on.  Layer pipelining needs it because two neighbouring stages
 * send to each other at once (activations one way, their gradients the
 * other): with blocking sends of more than the sockets buffer, both would
 * wait for the other to read.  The caller keeps each buffer unchanged until
 * dp_sender_wait says its frame is out; the queue allocates nothing after
 * dp_sender_open. */
#ifndef DOWNPOUR_SENDER_H
#define DOWNPOUR_SENDER_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"
#include "downpour/transport.h"

typedef struct dp_sender dp_sender;

/* Room for `cap` frames queued at once. */
int dp_sender_open(dp_sender **out, dp_transport *t, int cap, dp_err *err);
/* Stops the thread after the frames queued so far; NULL is a no-op. */
void dp_sender_close(dp_sender *q);
/* Queues a frame; returns its sequence number (1, 2, ...), or -1 when an
 * earlier send failed (err says which peer and why; *peer its rank).  Waits
 * while the queue is full. */
long dp_sender_push(dp_sender *q, int to, unsigned type, uint64_t step, uint64_t offset,
                    const void *buf, size_t len, int *peer, dp_err *err);
/* The same with head_len (at most DP_SENDER_HEAD) bytes copied into the queue
 * to go out before buf: a ps push's head, which the caller need not keep. */
#define DP_SENDER_HEAD 16
long dp_sender_push_head(dp_sender *q, int to, unsigned type, uint64_t step, uint64_t offset,
                         const uint8_t *head, size_t head_len, const void *buf, size_t len,
                         int *peer, dp_err *err);
/* Waits until every frame up to sequence number seq is out (0: returns at
 * once); -1 as above. */
int dp_sender_wait(dp_sender *q, long seq, int *peer, dp_err *err);
/* The sequence number of the last frame queued. */
long dp_sender_last(const dp_sender *q);

#endif
