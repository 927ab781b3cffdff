#include "auth.h"

#include "sock.h"

#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/frame.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

#define HANDSHAKE_MAX_PAYLOAD 1024

static const char auth_label[] = "downpour-auth-v1";

static void compute_mac(uint8_t out[DP_AUTH_MAC], const dp_auth_params *p, const uint8_t *nonce_d,
                        const uint8_t *nonce_a, int dialer, int acceptor, char dir)
{
    crypto_auth_hmacsha256_state st;
    uint8_t tail[13];
    dp_put_u32(tail, (uint32_t)dialer);
    dp_put_u32(tail + 4, (uint32_t)acceptor);
    dp_put_u32(tail + 8, (uint32_t)p->n_ranks);
    tail[12] = (uint8_t)dir;
    crypto_auth_hmacsha256_init(&st, p->secret, p->secret_len);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)auth_label, sizeof auth_label - 1);
    crypto_auth_hmacsha256_update(&st, nonce_d, DP_AUTH_NONCE);
    crypto_auth_hmacsha256_update(&st, nonce_a, DP_AUTH_NONCE);
    crypto_auth_hmacsha256_update(&st, tail, sizeof tail);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof st);
}

static int send_frame(int fd, int self, unsigned type, const void *payload, size_t len,
                      double deadline, dp_auth_io *io, dp_err *err)
{
    uint8_t buf[DP_FRAME_HEADER_SIZE + HANDSHAKE_MAX_PAYLOAD];
    dp_frame_header h = {0};
    h.type = (uint16_t)type;
    h.source = (uint32_t)self;
    h.length = len;
    h.payload_crc = dp_crc32c(0, payload, len);
    dp_frame_encode(buf, &h);
    if (len)
        memcpy(buf + DP_FRAME_HEADER_SIZE, payload, len);
    if (dp_sock_write_full(fd, buf, DP_FRAME_HEADER_SIZE + len, deadline, err))
        return dp_err_prefix(err, "sending %s", dp_frame_type_name(type));
    io->frames_sent++;
    io->bytes_sent += DP_FRAME_HEADER_SIZE + len;
    return 0;
}

/* Reads one handshake frame of the expected type and exact payload size
 * (want_len < 0: any size up to cap).  A REJECT becomes an error quoting the
 * peer's reason. */
static int recv_frame(int fd, unsigned want_type, long want_len, dp_frame_header *h,
                      uint8_t *payload, size_t cap, double deadline, dp_auth_io *io, dp_err *err)
{
    uint8_t hb[DP_FRAME_HEADER_SIZE];
    char why[256];
    if (dp_sock_read_full(fd, hb, sizeof hb, deadline, err))
        return dp_err_prefix(err, "waiting for %s", dp_frame_type_name(want_type));
    if (dp_frame_decode(h, hb, HANDSHAKE_MAX_PAYLOAD, why, sizeof why) != DP_FRAME_OK)
        return dp_errf(err, "bad handshake frame: %s", why);
    io->frames_recv++;
    io->bytes_recv += DP_FRAME_HEADER_SIZE;
    if (h->type == DP_FRAME_REJECT) {
        char reason[HANDSHAKE_MAX_PAYLOAD + 1];
        if (dp_sock_read_full(fd, reason, (size_t)h->length, deadline, err))
            return dp_errf(err, "rejected by peer (reason unreadable)");
        reason[h->length] = '\0';
        for (size_t i = 0; i < h->length; i++)
            if (reason[i] < 32 || reason[i] > 126)
                reason[i] = '?';
        dp_errf(err, "rejected by peer: %s", reason);
        return -2;
    }
    if (h->type != want_type)
        return dp_errf(err, "expected a %s frame, got %s", dp_frame_type_name(want_type),
                       dp_frame_type_name(h->type));
    if ((want_len >= 0 && h->length != (uint64_t)want_len) || h->length > cap)
        return dp_errf(err, "%s frame has a %llu-byte payload, expected %ld",
                       dp_frame_type_name(want_type), (unsigned long long)h->length, want_len);
    if (dp_sock_read_full(fd, payload, (size_t)h->length, deadline, err))
        return dp_err_prefix(err, "reading %s payload", dp_frame_type_name(want_type));
    io->bytes_recv += h->length;
    if (dp_frame_check_payload(h, payload, (size_t)h->length))
        return dp_errf(err, "%s frame: payload CRC mismatch", dp_frame_type_name(want_type));
    return 0;
}

void dp_auth_send_reject(int fd, int self_rank, const char *reason)
{
    dp_auth_io io = {0};
    size_t len = strlen(reason);
    if (len > 255)
        len = 255;
    send_frame(fd, self_rank, DP_FRAME_REJECT, reason, len, dp_now() + 0.2, &io, NULL);
}

int dp_auth_dial(int fd, const dp_auth_params *p, int peer, dp_auth_io *io, dp_err *err)
{
    uint8_t hello[8 + DP_AUTH_NONCE], chal[DP_AUTH_NONCE + DP_AUTH_MAC], mac[DP_AUTH_MAC];
    dp_frame_header h;
    const uint8_t *nonce_d = hello + 8;
    dp_put_u32(hello, (uint32_t)p->n_ranks);
    dp_put_u32(hello + 4, (uint32_t)peer);
    randombytes_buf(hello + 8, DP_AUTH_NONCE);
    if (send_frame(fd, p->self_rank, DP_FRAME_HELLO, hello, sizeof hello, p->deadline, io, err))
        return -1;
    int rc = recv_frame(fd, DP_FRAME_CHALLENGE, sizeof chal, &h, chal, sizeof chal,
                        p->deadline, io, err);
    if (rc)
        return rc;
    if (h.source != (uint32_t)peer) {
        dp_errf(err, "the task listening there is rank %u, not rank %d (check the cluster "
                     "spec: are the addresses in the same order everywhere?)",
                h.source, peer);
        return -2;
    }
    compute_mac(mac, p, nonce_d, chal, p->self_rank, peer, 'A');
    if (crypto_verify_32(mac, chal + DP_AUTH_NONCE) != 0) {
        dp_auth_send_reject(fd, p->self_rank, "authentication failed: wrong secret");
        dp_errf(err, "authentication failed: the peer does not know the cluster secret (is "
                     "DOWNPOUR_SECRET the same on every task?)");
        return -2;
    }
    compute_mac(mac, p, nonce_d, chal, p->self_rank, peer, 'D');
    if (send_frame(fd, p->self_rank, DP_FRAME_AUTH, mac, sizeof mac, p->deadline, io, err))
        return -1;
    uint8_t none[1];
    return recv_frame(fd, DP_FRAME_WELCOME, 0, &h, none, 0, p->deadline, io, err);
}

int dp_auth_accept(int fd, const dp_auth_params *p, int *peer_out, dp_auth_io *io, dp_err *err)
{
    uint8_t hello[8 + DP_AUTH_NONCE], chal[DP_AUTH_NONCE + DP_AUTH_MAC], mac[DP_AUTH_MAC];
    char why[256];
    dp_frame_header h;
    if (recv_frame(fd, DP_FRAME_HELLO, sizeof hello, &h, hello, sizeof hello, p->deadline, io,
                   err))
        return -1;
    uint32_t n = dp_get_u32(hello), target = dp_get_u32(hello + 4);
    int peer = (int)h.source;
    why[0] = '\0';
    if (n != (uint32_t)p->n_ranks)
        snprintf(why, sizeof why, "cluster size mismatch: peer has %u ranks, this task %d", n,
                 p->n_ranks);
    else if (target != (uint32_t)p->self_rank)
        snprintf(why, sizeof why, "peer dialed rank %u but this is rank %d", target, p->self_rank);
    else if (h.source >= (uint32_t)p->n_ranks || peer == p->self_rank)
        snprintf(why, sizeof why, "peer claims invalid rank %u", h.source);
    else if (peer > p->self_rank)
        snprintf(why, sizeof why, "rank %d dialed lower rank %d (lower ranks dial higher)", peer,
                 p->self_rank);
    if (why[0]) {
        dp_auth_send_reject(fd, p->self_rank, why);
        return dp_errf(err, "%s", why);
    }
    randombytes_buf(chal, DP_AUTH_NONCE);
    compute_mac(chal + DP_AUTH_NONCE, p, hello + 8, chal, peer, p->self_rank, 'A');
    if (send_frame(fd, p->self_rank, DP_FRAME_CHALLENGE, chal, sizeof chal, p->deadline, io, err))
        return -1;
    if (recv_frame(fd, DP_FRAME_AUTH, sizeof mac, &h, mac, sizeof mac, p->deadline, io, err))
        return dp_err_prefix(err, "rank %d", peer);
    uint8_t want[DP_AUTH_MAC];
    compute_mac(want, p, hello + 8, chal, peer, p->self_rank, 'D');
    if (crypto_verify_32(want, mac) != 0) {
        dp_auth_send_reject(fd, p->self_rank, "authentication failed: wrong secret");
        return dp_errf(err, "authentication failed: peer claiming rank %d does not know the "
                            "cluster secret",
                       peer);
    }
    if (p->admit && p->admit(p->admit_ctx, peer, why, sizeof why) != 0) {
        dp_auth_send_reject(fd, p->self_rank, why);
        return dp_errf(err, "rank %d refused: %s", peer, why);
    }
    if (send_frame(fd, p->self_rank, DP_FRAME_WELCOME, NULL, 0, p->deadline, io, err))
        return -1;
    *peer_out = peer;
    return 0;
}
