#include "auth.h"

#include "fmac.h"

#include "sock.h"

#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/frame.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

#define HANDSHAKE_MAX_PAYLOAD 1024

static const char auth_label[] = "downpour-auth-v2";
static const char session_label[] = "downpour-session-v2";
static const char spec_label[] = "downpour-spec-v1";

#define HELLO_LEN (8 + DP_AUTH_NONCE + 12)
#define CHAL_LEN (DP_AUTH_NONCE + DP_AUTH_MAC + 12)
#define TRANSCRIPT_LEN (2 * DP_AUTH_NONCE + 12 + 16 + 8)

/* Everything both sides said: the proofs and the session key cover it, so a
 * man in the middle cannot change an incarnation or turn encryption off. */
static void transcript(uint8_t out[TRANSCRIPT_LEN], const dp_auth_params *p, const uint8_t *nonce_d,
                       const uint8_t *nonce_a, int dialer, int acceptor, uint64_t inc_d,
                       uint64_t inc_a, uint32_t opt_d, uint32_t opt_a)
{
    memcpy(out, nonce_d, DP_AUTH_NONCE);
    memcpy(out + DP_AUTH_NONCE, nonce_a, DP_AUTH_NONCE);
    uint8_t *q = out + 2 * DP_AUTH_NONCE;
    dp_put_u32(q, (uint32_t)dialer);
    dp_put_u32(q + 4, (uint32_t)acceptor);
    dp_put_u32(q + 8, (uint32_t)p->n_ranks);
    dp_put_u64(q + 12, inc_d);
    dp_put_u64(q + 20, inc_a);
    dp_put_u32(q + 28, opt_d);
    dp_put_u32(q + 32, opt_a);
}

static void hmac(uint8_t out[DP_AUTH_MAC], const dp_auth_params *p, const char *label,
                 const uint8_t *tr, int dir)
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, p->secret, p->secret_len);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)label, strlen(label));
    crypto_auth_hmacsha256_update(&st, tr, TRANSCRIPT_LEN);
    if (dir) {
        uint8_t d = (uint8_t)dir;
        crypto_auth_hmacsha256_update(&st, &d, 1);
    }
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof st);
}

/* The MAC of a served cluster spec (auth.h): it binds the spec's bytes to
 * this handshake, so no one between the two can change the addresses. */
static void spec_mac(uint8_t out[DP_AUTH_MAC], const dp_auth_params *p, const uint8_t *tr,
                     const char *spec, size_t len)
{
    crypto_auth_hmacsha256_state st;
    uint8_t d = 'S';
    crypto_auth_hmacsha256_init(&st, p->secret, p->secret_len);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)spec_label, strlen(spec_label));
    crypto_auth_hmacsha256_update(&st, tr, TRANSCRIPT_LEN);
    crypto_auth_hmacsha256_update(&st, &d, 1);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)spec, len);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof st);
}

/* Per-direction frame keys (docs/transport.md, "Key schedule"). */
static void derive(dp_auth_session *s, const dp_auth_params *p, const uint8_t *tr, int dialer_side,
                   uint32_t opt_a)
{
    uint8_t master[crypto_kdf_KEYBYTES];
    s->keyed = p->secret_len > 0;
    s->encrypt = (opt_a & DP_AUTH_OPT_ENCRYPT) != 0;
    s->suite = (opt_a & DP_AUTH_OPT_AES) ? DP_FMAC_AESGCM : DP_FMAC_CHACHA;
    s->shm = (opt_a & DP_AUTH_OPT_SHM) != 0; /* the acceptor sets it only when offered */
    hmac(master, p, session_label, tr, 0);
    crypto_kdf_derive_from_key(dialer_side ? s->key_tx : s->key_rx, 32, 1, "dpframes", master);
    crypto_kdf_derive_from_key(dialer_side ? s->key_rx : s->key_tx, 32, 2, "dpframes", master);
    sodium_memzero(master, sizeof master);
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

int dp_auth_dial(int fd, const dp_auth_params *p, int peer, dp_auth_io *io, dp_auth_session *s,
                 dp_err *err)
{
    return dp_auth_dial_shm(fd, p, 0, peer, io, s, err);
}

int dp_auth_dial_shm(int fd, const dp_auth_params *p, int shm, int peer, dp_auth_io *io,
                     dp_auth_session *s, dp_err *err)
{
    uint8_t hello[HELLO_LEN], chal[CHAL_LEN], mac[DP_AUTH_MAC], tr[TRANSCRIPT_LEN];
    dp_frame_header h;
    const uint8_t *nonce_d = hello + 8;
    uint32_t opt_d = (p->encrypt ? DP_AUTH_OPT_ENCRYPT : 0) |
                     (dp_fmac_aes_available() ? DP_AUTH_OPT_AES : 0) |
                     (shm ? DP_AUTH_OPT_SHM : 0);
    memset(s, 0, sizeof *s);
    dp_put_u32(hello, (uint32_t)p->n_ranks);
    dp_put_u32(hello + 4, (uint32_t)peer);
    randombytes_buf(hello + 8, DP_AUTH_NONCE);
    dp_put_u64(hello + 8 + DP_AUTH_NONCE, p->incarnation);
    dp_put_u32(hello + 16 + DP_AUTH_NONCE, opt_d);
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
    uint64_t inc_a = dp_get_u64(chal + DP_AUTH_NONCE + DP_AUTH_MAC);
    uint32_t opt_a = dp_get_u32(chal + DP_AUTH_NONCE + DP_AUTH_MAC + 8);
    transcript(tr, p, nonce_d, chal, p->self_rank, peer, p->incarnation, inc_a, opt_d, opt_a);
    hmac(mac, p, auth_label, tr, 'A');
    if (crypto_verify_32(mac, chal + DP_AUTH_NONCE) != 0) {
        dp_auth_send_reject(fd, p->self_rank, "authentication failed: wrong secret");
        dp_errf(err, "authentication failed: the peer does not know the cluster secret (is "
                     "DOWNPOUR_SECRET the same on every task?)");
        return -2;
    }
    if ((opt_a & DP_AUTH_OPT_ENCRYPT) != (opt_d & DP_AUTH_OPT_ENCRYPT) ||
        ((opt_a & DP_AUTH_OPT_AES) && !(opt_d & DP_AUTH_OPT_AES)) ||
        ((opt_a & DP_AUTH_OPT_SHM) && !(opt_d & DP_AUTH_OPT_SHM))) {
        dp_auth_send_reject(fd, p->self_rank, "the peer chose options this task did not offer");
        dp_errf(err, "the peer chose options this task did not offer (0x%x for 0x%x)", opt_a,
                opt_d);
        return -2;
    }
    hmac(mac, p, auth_label, tr, 'D');
    if (send_frame(fd, p->self_rank, DP_FRAME_AUTH, mac, sizeof mac, p->deadline, io, err))
        return -1;
    uint8_t none[1];
    rc = recv_frame(fd, DP_FRAME_WELCOME, 0, &h, none, 0, p->deadline, io, err);
    if (rc == 0) {
        derive(s, p, tr, 1, opt_a);
        s->peer_incarnation = inc_a;
    }
    return rc;
}

/* The acceptor's side of a query for the cluster spec (auth.h): the same
 * challenge and proof as a connection's, over a transcript that names the
 * dialer DP_AUTH_QUERY_RANK and n_ranks 0, then the spec instead of WELCOME. */
static int serve_spec(int fd, const dp_auth_params *p, const dp_frame_header *hh,
                      const uint8_t *hello, int *peer_out, dp_auth_io *io, dp_err *err)
{
    uint8_t chal[CHAL_LEN], mac[DP_AUTH_MAC], want[DP_AUTH_MAC], tr[TRANSCRIPT_LEN], b4[4];
    dp_frame_header h;
    dp_auth_params q = *p;
    q.n_ranks = 0;
    uint64_t inc_d = dp_get_u64(hello + 8 + DP_AUTH_NONCE);
    uint32_t opt_d = dp_get_u32(hello + 16 + DP_AUTH_NONCE);
    if (dp_get_u32(hello) != 0 || dp_get_u32(hello + 4) != DP_AUTH_QUERY_RANK ||
        hh->source != DP_AUTH_QUERY_RANK || opt_d != DP_AUTH_OPT_QUERY) {
        dp_auth_send_reject(fd, p->self_rank, "malformed query for the cluster spec");
        return dp_errf(err, "a malformed query for the cluster spec (%u ranks, target %u, "
                            "source %u, options 0x%x)",
                       dp_get_u32(hello), dp_get_u32(hello + 4), hh->source, opt_d);
    }
    randombytes_buf(chal, DP_AUTH_NONCE);
    transcript(tr, &q, hello + 8, chal, (int)DP_AUTH_QUERY_RANK, p->self_rank, inc_d,
               p->incarnation, opt_d, 0);
    hmac(chal + DP_AUTH_NONCE, &q, auth_label, tr, 'A');
    dp_put_u64(chal + DP_AUTH_NONCE + DP_AUTH_MAC, p->incarnation);
    dp_put_u32(chal + DP_AUTH_NONCE + DP_AUTH_MAC + 8, 0);
    if (send_frame(fd, p->self_rank, DP_FRAME_CHALLENGE, chal, sizeof chal, p->deadline, io, err))
        return -1;
    if (recv_frame(fd, DP_FRAME_AUTH, sizeof mac, &h, mac, sizeof mac, p->deadline, io, err))
        return dp_err_prefix(err, "a task asking for the cluster spec");
    hmac(want, &q, auth_label, tr, 'D');
    if (crypto_verify_32(want, mac) != 0) {
        dp_auth_send_reject(fd, p->self_rank, "authentication failed: wrong secret");
        return dp_errf(err, "authentication failed: a task asking for the cluster spec does "
                            "not know the cluster secret");
    }
    if (!p->spec || p->spec_len == 0 || p->spec_len > DP_AUTH_SPEC_MAX) {
        dp_auth_send_reject(fd, p->self_rank, "this task serves no cluster spec");
        return dp_errf(err, "a task asked for the cluster spec, which this one does not serve");
    }
    dp_put_u32(b4, (uint32_t)p->spec_len);
    if (send_frame(fd, p->self_rank, DP_FRAME_SPEC, b4, sizeof b4, p->deadline, io, err))
        return -1;
    for (size_t at = 0; at < p->spec_len; at += HANDSHAKE_MAX_PAYLOAD) {
        size_t n = p->spec_len - at < HANDSHAKE_MAX_PAYLOAD ? p->spec_len - at
                                                             : HANDSHAKE_MAX_PAYLOAD;
        if (send_frame(fd, p->self_rank, DP_FRAME_SPEC, p->spec + at, n, p->deadline, io, err))
            return -1;
    }
    spec_mac(mac, &q, tr, p->spec, p->spec_len);
    if (send_frame(fd, p->self_rank, DP_FRAME_SPEC, mac, sizeof mac, p->deadline, io, err))
        return -1;
    *peer_out = -1;
    return DP_AUTH_SERVED_SPEC;
}

int dp_auth_query_spec(int fd, const dp_auth_params *p, char **spec, int *acceptor,
                       dp_auth_io *io, dp_err *err)
{
    uint8_t hello[HELLO_LEN], chal[CHAL_LEN], mac[DP_AUTH_MAC], tr[TRANSCRIPT_LEN], b4[4];
    dp_frame_header h;
    dp_auth_params q = *p;
    q.n_ranks = 0;
    *spec = NULL;
    dp_put_u32(hello, 0);
    dp_put_u32(hello + 4, DP_AUTH_QUERY_RANK);
    randombytes_buf(hello + 8, DP_AUTH_NONCE);
    dp_put_u64(hello + 8 + DP_AUTH_NONCE, p->incarnation);
    dp_put_u32(hello + 16 + DP_AUTH_NONCE, DP_AUTH_OPT_QUERY);
    if (send_frame(fd, (int)DP_AUTH_QUERY_RANK, DP_FRAME_HELLO, hello, sizeof hello, p->deadline,
                   io, err))
        return -1;
    int rc = recv_frame(fd, DP_FRAME_CHALLENGE, sizeof chal, &h, chal, sizeof chal, p->deadline,
                        io, err);
    if (rc)
        return rc;
    int acc = (int)h.source;
    uint64_t inc_a = dp_get_u64(chal + DP_AUTH_NONCE + DP_AUTH_MAC);
    uint32_t opt_a = dp_get_u32(chal + DP_AUTH_NONCE + DP_AUTH_MAC + 8);
    transcript(tr, &q, hello + 8, chal, (int)DP_AUTH_QUERY_RANK, acc, p->incarnation, inc_a,
               DP_AUTH_OPT_QUERY, opt_a);
    hmac(mac, &q, auth_label, tr, 'A');
    if (crypto_verify_32(mac, chal + DP_AUTH_NONCE) != 0 || opt_a != 0) {
        dp_auth_send_reject(fd, (int)DP_AUTH_QUERY_RANK, "authentication failed: wrong secret");
        dp_errf(err, "authentication failed: the task there holds another cluster secret than "
                     "this one (is DOWNPOUR_SECRET, or --secret-file, the job's?)");
        return -2;
    }
    hmac(mac, &q, auth_label, tr, 'D');
    if (send_frame(fd, (int)DP_AUTH_QUERY_RANK, DP_FRAME_AUTH, mac, sizeof mac, p->deadline, io,
                   err))
        return -1;
    if ((rc = recv_frame(fd, DP_FRAME_SPEC, sizeof b4, &h, b4, sizeof b4, p->deadline, io, err)))
        return rc;
    uint32_t total = dp_get_u32(b4);
    if (total == 0 || total > DP_AUTH_SPEC_MAX) {
        dp_errf(err, "the task there sends a cluster spec of %u bytes (at most %u)", total,
                DP_AUTH_SPEC_MAX);
        return -2;
    }
    char *buf = malloc((size_t)total + 1);
    if (!buf)
        return dp_errf(err, "out of memory for a %u-byte cluster spec", total);
    for (uint32_t got = 0; got < total; got += (uint32_t)h.length) {
        uint32_t left = total - got;
        rc = recv_frame(fd, DP_FRAME_SPEC, -1, &h, (uint8_t *)buf + got,
                        left < HANDSHAKE_MAX_PAYLOAD ? left : HANDSHAKE_MAX_PAYLOAD, p->deadline,
                        io, err);
        if (rc == 0 && h.length == 0)
            rc = dp_errf(err, "an empty chunk of the cluster spec");
        if (rc) {
            free(buf);
            return rc;
        }
    }
    if ((rc = recv_frame(fd, DP_FRAME_SPEC, sizeof mac, &h, mac, sizeof mac, p->deadline, io,
                         err))) {
        free(buf);
        return rc;
    }
    uint8_t want[DP_AUTH_MAC];
    spec_mac(want, &q, tr, buf, total);
    if (crypto_verify_32(want, mac) != 0) {
        free(buf);
        dp_errf(err, "the cluster spec failed its check (changed on the way?)");
        return -2;
    }
    buf[total] = '\0';
    *spec = buf;
    *acceptor = acc;
    return 0;
}

int dp_auth_accept(int fd, const dp_auth_params *p, int *peer_out, dp_auth_io *io,
                   dp_auth_session *s, dp_err *err)
{
    return dp_auth_accept_shm(fd, p, 0, peer_out, io, s, err);
}

int dp_auth_accept_shm(int fd, const dp_auth_params *p, int shm, int *peer_out, dp_auth_io *io,
                       dp_auth_session *s, dp_err *err)
{
    uint8_t hello[HELLO_LEN], chal[CHAL_LEN], mac[DP_AUTH_MAC], tr[TRANSCRIPT_LEN];
    char why[256];
    dp_frame_header h;
    memset(s, 0, sizeof *s);
    if (recv_frame(fd, DP_FRAME_HELLO, sizeof hello, &h, hello, sizeof hello, p->deadline, io,
                   err))
        return -1;
    uint32_t n = dp_get_u32(hello), target = dp_get_u32(hello + 4);
    uint64_t inc_d = dp_get_u64(hello + 8 + DP_AUTH_NONCE);
    uint32_t opt_d = dp_get_u32(hello + 16 + DP_AUTH_NONCE);
    int peer = (int)h.source;
    if (opt_d & DP_AUTH_OPT_QUERY) /* a joiner asks for the spec (auth.h) */
        return serve_spec(fd, p, &h, hello, peer_out, io, err);
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
    else if (!(opt_d & DP_AUTH_OPT_ENCRYPT) != !p->encrypt)
        snprintf(why, sizeof why, "encryption mismatch: rank %d has encryption %s, rank %d has "
                                  "it %s (use --encrypt on every task or on none)",
                 peer, (opt_d & DP_AUTH_OPT_ENCRYPT) ? "on" : "off", p->self_rank,
                 p->encrypt ? "on" : "off");
    else if (p->encrypt && p->secret_len == 0)
        snprintf(why, sizeof why, "encryption needs a cluster secret");
    if (why[0]) {
        dp_auth_send_reject(fd, p->self_rank, why);
        return dp_errf(err, "%s", why);
    }
    /* AES-256-GCM when both CPUs have AES-NI, else ChaCha20-Poly1305. */
    uint32_t opt_a = (p->encrypt ? DP_AUTH_OPT_ENCRYPT : 0) |
                     ((opt_d & DP_AUTH_OPT_AES) && dp_fmac_aes_available() ? DP_AUTH_OPT_AES : 0) |
                     ((opt_d & DP_AUTH_OPT_SHM) && shm ? DP_AUTH_OPT_SHM : 0);
    randombytes_buf(chal, DP_AUTH_NONCE);
    transcript(tr, p, hello + 8, chal, peer, p->self_rank, inc_d, p->incarnation, opt_d, opt_a);
    hmac(chal + DP_AUTH_NONCE, p, auth_label, tr, 'A');
    dp_put_u64(chal + DP_AUTH_NONCE + DP_AUTH_MAC, p->incarnation);
    dp_put_u32(chal + DP_AUTH_NONCE + DP_AUTH_MAC + 8, opt_a);
    if (send_frame(fd, p->self_rank, DP_FRAME_CHALLENGE, chal, sizeof chal, p->deadline, io, err))
        return -1;
    if (recv_frame(fd, DP_FRAME_AUTH, sizeof mac, &h, mac, sizeof mac, p->deadline, io, err))
        return dp_err_prefix(err, "rank %d", peer);
    uint8_t want[DP_AUTH_MAC];
    hmac(want, p, auth_label, tr, 'D');
    if (crypto_verify_32(want, mac) != 0) {
        dp_auth_send_reject(fd, p->self_rank, "authentication failed: wrong secret");
        return dp_errf(err, "authentication failed: peer claiming rank %d does not know the "
                            "cluster secret",
                       peer);
    }
    if (p->admit && p->admit(p->admit_ctx, peer, inc_d, why, sizeof why) != 0) {
        dp_auth_send_reject(fd, p->self_rank, why);
        return dp_errf(err, "rank %d refused: %s", peer, why);
    }
    if (send_frame(fd, p->self_rank, DP_FRAME_WELCOME, NULL, 0, p->deadline, io, err))
        return -1;
    derive(s, p, tr, 0, opt_a);
    s->peer_incarnation = inc_d;
    *peer_out = peer;
    return 0;
}
