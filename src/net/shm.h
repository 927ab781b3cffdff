/* Shared-memory links between two tasks on one host (docs/transport.md,
 * "Shared memory"): after the TCP handshake the dialer offers a segment of
 * two single-producer/single-consumer byte rings, one per direction, and the
 * acceptor maps it when both ends are on the same host (boot id, network
 * namespace, uid, and a direct connection).  Frames then go through the
 * rings (header + payload, padded to 8 bytes); TCP keeps the heartbeats, BYE
 * and the loss detection.  Internal to src/net (tcp.c) and the tests. */
#ifndef DOWNPOUR_NET_SHM_H
#define DOWNPOUR_NET_SHM_H

#include "auth.h"

#include "downpour/frame.h"
#include "downpour/status.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

typedef struct dp_shm dp_shm;

#define DP_SHM_RING_DEFAULT ((size_t)4 << 20) /* bytes per direction */
#define DP_SHM_RING_MIN ((size_t)64 << 10)
#define DP_SHM_RING_MAX ((size_t)1 << 30)
/* What a sender waiting for room may take off its peer's ring (dp_shm_drain):
 * about what TCP's socket buffers hold between two peers. */
#define DP_SHM_OVERFLOW_MAX ((size_t)16 << 20)

/* How the sending and receiving sides wait: wait() blocks a short while for
 * the ring to change (dp_shm_tx_wait / dp_shm_rx_wait) and checks that the
 * peer is alive, returning -1 with err when it is not; progress() (may be
 * NULL) is told how many payload bytes of the frame are in the ring. */
typedef struct dp_shm_waiter {
    int (*wait)(void *ctx, int sending, dp_err *err);
    void (*progress)(void *ctx, uint64_t done, uint64_t len);
    void *ctx;
} dp_shm_waiter;

/* The setup exchange right after WELCOME, before either side installs the
 * connection.  fd is the handshake's non-blocking socket; s the session
 * (keyed: the two setup frames are sequence number 0 of their direction and
 * their payloads are encrypted, so a listener learns no name).  Both return
 * 0 with *out the link, or NULL when shared memory was declined (why in
 * *why, for the log); -1 when the connection failed (err). */
int dp_shm_dial(int fd, int self_rank, int peer_rank, size_t ring_bytes, const dp_auth_session *s,
                double deadline, dp_shm **out, char *why, size_t why_cap, dp_auth_io *io,
                dp_err *err);
int dp_shm_accept(int fd, int self_rank, int peer_rank, int enabled, const dp_auth_session *s,
                  double deadline, dp_shm **out, char *why, size_t why_cap, dp_auth_io *io,
                  dp_err *err);
/* Setup frames each direction sent when shared memory was negotiated (their
 * sequence numbers are spent). */
#define DP_SHM_SETUP_FRAMES 1

void dp_shm_close(dp_shm *s);

/* Sending (one thread at a time): header (48 encoded bytes) and payload
 * into the ring, waiting for room through w. */
int dp_shm_send(dp_shm *s, const uint8_t hdr[DP_FRAME_HEADER_SIZE], const struct iovec *iov,
                int iovcnt, uint64_t len, const dp_shm_waiter *w, dp_err *err);
/* Waits up to timeout_s for the receiver to free room (futex). */
void dp_shm_tx_wait(dp_shm *s, double timeout_s);
/* What dp_shm_send does before each wait for room: unless another thread is
 * receiving, moves what the peer has sent off the receive ring into a
 * buffer the receive side reads first, up to DP_SHM_OVERFLOW_MAX, so two
 * peers sending each other more than a ring before reading both go on.
 * Returns 1 when it moved something. */
int dp_shm_drain(dp_shm *s);
/* 1 when the peer sleeps waiting for room in our receive ring: whenever
 * this task waits, such a link is drained (tcp.c), as the kernel's socket
 * buffers would take the bytes whatever the task is doing. */
int dp_shm_peer_waits(const dp_shm *s);

/* Receiving (one thread at a time; a sender's dp_shm_drain excluded).  A whole header is taken from the ring and
 * decoded with max_len: 1 (h filled), 0 (none yet), -1 (bad header or a
 * corrupted ring: why says what).  The payload then follows through
 * dp_shm_recv; dp_shm_pending says how many of its bytes are left. */
int dp_shm_next(dp_shm *s, uint64_t max_len, dp_frame_header *h, char *why, size_t why_cap);
uint64_t dp_shm_pending(const dp_shm *s);
/* The next len payload bytes into dst (add 0), added to the floats at dst
 * (add 1: len a multiple of 4), or dropped (dst NULL); waits through w. */
int dp_shm_recv(dp_shm *s, void *dst, size_t len, int add, const dp_shm_waiter *w, dp_err *err);
/* Bytes waiting in the receive ring (0 when none; a corrupted ring also
 * counts as something to look at). */
uint64_t dp_shm_rx_ready(const dp_shm *s);

/* The doorbell: a FIFO the peer writes a byte to when this side said it
 * sleeps.  Before sleeping in poll() on dp_shm_bell_fd the receiver calls
 * dp_shm_rx_sleep (it returns 1 when something arrived meanwhile: do not
 * sleep), and dp_shm_rx_awake after. */
int dp_shm_bell_fd(const dp_shm *s);
int dp_shm_rx_sleep(dp_shm *s);
void dp_shm_rx_awake(dp_shm *s);
/* Waits up to timeout_s for bytes in the receive ring (the doorbell, and
 * tcp_fd hanging up); returns 1 when tcp_fd hung up.  Only from within
 * dp_shm_recv's waiter (it holds the receive side). */
int dp_shm_rx_wait(dp_shm *s, int tcp_fd, double timeout_s);

/* For the tests: the segment's and doorbells' paths (unlinked once set up). */
const char *dp_shm_path(const dp_shm *s);

/* For fuzz/fuzz_shm.c, which plays the peer: a link over a zeroed heap
 * segment (so a sanitizer sees its bounds) with rings of ring_bytes (a power
 * of two, 64 and up; NULL otherwise or without memory), in the acceptor's
 * place, without doorbells.  peer gets where the peer writes: its write
 * position in our receive ring (rx_tail, a native u64) and its read position
 * in our send ring (tx_head); our positions (rx_head, tx_tail: to read);
 * both rings' bytes; and the whole control area, which it could scribble
 * on.  Close with dp_shm_close. */
typedef struct dp_shm_peer {
    uint8_t *rx_tail, *rx_head, *tx_head, *tx_tail;
    uint8_t *rx_data, *tx_data;
    uint8_t *ctl;
    size_t ctl_len;
} dp_shm_peer;
dp_shm *dp_shm_test_open(size_t ring_bytes, dp_shm_peer *peer);

#endif
