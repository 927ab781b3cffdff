/* libFuzzer target for the connection handshake (src/net/auth.c): one side
 * of the handshake, dp_auth_accept or dp_auth_dial, runs on one end of a
 * socketpair, and the fuzz bytes are everything the other side says, written
 * up front and followed by EOF, so a run never waits for the deadline.  Any
 * transcript must end in 0 (admitted: a lower rank that proved the secret),
 * -1 or -2 with a message; never a crash, a read past a frame, or a hang.
 *
 * libsodium's random source is replaced by a fixed one (every byte 0x42) and
 * the incarnations are fixed, so a valid transcript is a fixed byte string.
 * The target writes those itself, from a real handshake between the two real
 * sides, so the seeds follow the protocol wherever auth.c takes it:
 *   DP_FUZZ_AUTH_SEEDS=fuzz/corpus/fuzz_auth build-fuzz/fuzz/fuzz_auth
 *
 * Input: byte 0 bit 0 the side (0: rank 1 dials rank 2; 1: rank 2 accepts),
 * bit 1 the admit callback refuses, bit 2 payload encryption on; the rest is
 * the peer's bytes.  4 ranks; the secret is below. */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "downpour/clock.h"
#include "downpour/log.h"
#include "net/auth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static const char secret[] = "downpour-fuzz-secret-0123456789ab";
#define INC_DIALER 0x1111111111111111ull
#define INC_ACCEPTOR 0x2222222222222222ull

/* A fixed random source: every byte 0x42. */
static const char *fixed_name(void) { return "fuzz-fixed"; }
static uint32_t fixed_random(void) { return 0x42424242u; }
static uint32_t fixed_uniform(const uint32_t upper) { return upper ? 0x42424242u % upper : 0; }
static void fixed_buf(void *const buf, const size_t size) { memset(buf, 0x42, size); }

static randombytes_implementation fixed_rng = {
    .implementation_name = fixed_name,
    .random = fixed_random,
    .stir = NULL,
    .uniform = fixed_uniform,
    .buf = fixed_buf,
    .close = NULL,
};

static int admit_refuses;

static int admit(void *ctx, int peer, uint64_t incarnation, char *why, size_t cap)
{
    (void)ctx;
    if (!admit_refuses)
        return 0;
    snprintf(why, cap, "rank %d (incarnation %llx) is already connected", peer,
             (unsigned long long)incarnation);
    return -1;
}

static void params(dp_auth_params *p, int accept_side, int encrypt)
{
    memset(p, 0, sizeof *p);
    p->n_ranks = 4;
    p->self_rank = accept_side ? 2 : 1;
    p->secret = (const unsigned char *)secret;
    p->secret_len = sizeof secret - 1;
    p->deadline = dp_now() + 2.0; /* never reached: EOF follows the input */
    p->admit = admit;
    p->incarnation = accept_side ? INC_ACCEPTOR : INC_DIALER;
    p->encrypt = encrypt;
    if (accept_side) { /* a query for the spec (opt bit 3) is answered with it */
        p->spec = "{\"cluster\": {\"worker\": [\"127.0.0.1:1\", \"127.0.0.1:2\"]}}";
        p->spec_len = strlen(p->spec);
    }
}

/* ---- writing the seeds: a real dialer and a real acceptor, with a relay
 * between them that records what each said. */

typedef struct side {
    int fd, accept_side, encrypt, rc;
} side;

static void *run_side(void *arg)
{
    side *s = arg;
    dp_auth_params p;
    params(&p, s->accept_side, s->encrypt);
    dp_auth_io io = {0};
    dp_auth_session ses;
    dp_err err;
    int peer;
    s->rc = s->accept_side ? dp_auth_accept(s->fd, &p, &peer, &io, &ses, &err)
                           : dp_auth_dial(s->fd, &p, 2, &io, &ses, &err);
    if (s->rc != 0)
        fprintf(stderr, "fuzz_auth: recording, %s: %s\n", s->accept_side ? "accept" : "dial",
                err.msg);
    shutdown(s->fd, SHUT_WR);
    return NULL;
}

static void write_seed(const char *dir, const char *name, uint8_t flags, const uint8_t *p,
                       size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(&flags, 1, 1, f) != 1 || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "fuzz_auth: cannot write %s\n", path);
        exit(1);
    }
}

static void record(const char *dir, int encrypt)
{
    int a[2], b[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a) != 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, b) != 0)
        abort();
    fcntl(a[0], F_SETFL, O_NONBLOCK);
    fcntl(b[0], F_SETFL, O_NONBLOCK);
    side d = {a[0], 0, encrypt, -9}, ac = {b[0], 1, encrypt, -9};
    pthread_t td, ta;
    pthread_create(&td, NULL, run_side, &d);
    pthread_create(&ta, NULL, run_side, &ac);
    static uint8_t said[2][8192]; /* [0] by the dialer, [1] by the acceptor */
    size_t len[2] = {0, 0};
    int open_[2] = {1, 1};
    while (open_[0] || open_[1]) {
        struct pollfd pf[2] = {{a[1], POLLIN, 0}, {b[1], POLLIN, 0}};
        if (poll(pf, 2, 3000) <= 0)
            break;
        for (int k = 0; k < 2; k++) {
            if (!open_[k] || !pf[k].revents)
                continue;
            uint8_t buf[4096];
            ssize_t r = recv(k ? b[1] : a[1], buf, sizeof buf, 0);
            if (r <= 0) {
                open_[k] = 0;
                shutdown(k ? a[1] : b[1], SHUT_WR);
                continue;
            }
            if (len[k] + (size_t)r > sizeof said[k])
                abort();
            memcpy(said[k] + len[k], buf, (size_t)r);
            len[k] += (size_t)r;
            if (send(k ? a[1] : b[1], buf, (size_t)r, MSG_NOSIGNAL) != r)
                abort();
        }
    }
    pthread_join(td, NULL);
    pthread_join(ta, NULL);
    if (d.rc != 0 || ac.rc != 0)
        exit(1);
    uint8_t e = encrypt ? 4 : 0;
    write_seed(dir, encrypt ? "accept_valid_encrypt" : "accept_valid", 1 | e, said[0], len[0]);
    write_seed(dir, encrypt ? "accept_refused_encrypt" : "accept_refused", 3 | e, said[0],
               len[0]);
    write_seed(dir, encrypt ? "dial_valid_encrypt" : "dial_valid", e, said[1], len[1]);
    if (!encrypt) {
        /* The acceptor's challenge followed by a REJECT instead of WELCOME, and
         * a dialer that stops after its HELLO. */
        write_seed(dir, "dial_challenge_only", 0, said[1], len[1] > 48 ? len[1] - 48 : 0);
        write_seed(dir, "accept_hello_only", 1, said[0], len[0] > 80 ? len[0] - 80 : len[0]);
    }
    for (int k = 0; k < 2; k++) {
        close(a[k]);
        close(b[k]);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (randombytes_set_implementation(&fixed_rng) != 0 || sodium_init() < 0)
        abort();
    dp_log_set_level(DP_LOG_ERROR);
    const char *dir = getenv("DP_FUZZ_AUTH_SEEDS");
    if (dir && *dir) {
        record(dir, 0);
        record(dir, 1);
        fprintf(stderr, "fuzz_auth: seeds written to %s\n", dir);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 8192)
        return 0;
    int accept_side = data[0] & 1;
    admit_refuses = (data[0] >> 1) & 1;
    int encrypt = (data[0] >> 2) & 1;
    data++;
    size--;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
    int bufsz = 64 << 10;
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &bufsz, sizeof bufsz);
    if (size && send(sv[1], data, size, MSG_NOSIGNAL) != (ssize_t)size)
        abort();
    shutdown(sv[1], SHUT_WR);
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);

    dp_auth_params p;
    params(&p, accept_side, encrypt);
    dp_auth_io io = {0};
    dp_auth_session ses;
    dp_err err;
    err.msg[0] = '\0';
    int rc;
    if (accept_side) {
        int peer = -1;
        rc = dp_auth_accept(sv[0], &p, &peer, &io, &ses, &err);
        if (rc == 0 && (peer < 0 || peer >= p.self_rank || admit_refuses))
            abort(); /* only a lower rank that proved the secret is admitted */
    } else {
        rc = dp_auth_dial(sv[0], &p, 2, &io, &ses, &err);
    }
    if (rc != 0 && rc != -1 && rc != -2)
        abort();
    if (rc != 0 && err.msg[0] == '\0')
        abort(); /* every failure says why */
    if (rc == 0 && !ses.keyed)
        abort(); /* a handshake with a secret keys the session */
    if (io.bytes_recv > size || io.frames_recv * 48 > io.bytes_recv)
        abort(); /* counts no more than arrived */
    close(sv[0]);
    close(sv[1]);
    return 0;
}
