/* Shared-memory links between tasks on one host: see shm.h and
 * docs/transport.md, "Shared memory".
 *
 * Segment (the dialer creates it in /dev/shm, mode 0600, O_EXCL, a name of
 * 128 random bits, sent encrypted; unlinked as soon as the acceptor has it
 * mapped):
 *
 *   0     u32 magic "DPSM", u32 version, u64 ring bytes      (creator, once)
 *   64    ring 0 control (dialer -> acceptor)
 *   192   ring 1 control (acceptor -> dialer)
 *   4096  ring 0 data, then ring 1 data (ring bytes each, a power of two)
 *
 * Ring control, each word on its own 64-byte line:
 *   +0    u64 tail      bytes published by the producer
 *   +8    u32 sleeping  set by the consumer before it sleeps in poll();
 *                       the producer clears it and writes a byte to the
 *                       consumer's doorbell FIFO
 *   +64   u64 head      bytes consumed by the consumer
 *   +72   u32 waiting   set by the producer before it sleeps (futex); the
 *                       consumer clears it and wakes it
 * Both sides keep their own index privately and only read the peer's, which
 * is bounded (0 <= tail - head <= ring bytes) before use: a corrupted ring
 * is an error, never an out-of-bounds access. */
#include "shm.h"

#include "fmac.h"
#include "sock.h"

#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/log.h"
#include "downpour/testhooks.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SEG_MAGIC 0x4d535044u /* "DPSM" */
#define SEG_VERSION 1u
#define SEG_DATA 4096
#define CTL0 64
#define CTL1 192
#define TOKEN_HEX 32 /* 128 random bits */
#define SHM_DIR "/dev/shm/downpour-"
#define PUBLISH (64 * 1024) /* the producer publishes at least this often: the consumer
                               copies out while the rest is copied in */
#define SPIN_NS 20000       /* spin this long before sleeping: on 2 cores a spinning
                               receiver steals the core its sender needs */

/* Setup payloads (all little-endian, explicit helpers). */
#define ID_BOOT 36
#define ID_LEN (ID_BOOT + 8 + 8 + 4)
#define ADDR_LEN 64
#define OFFER_LEN (4 + ID_LEN + 2 * ADDR_LEN + 8 + TOKEN_HEX)
#define ANSWER_MAX 256 /* u32 accepted | reason text */
#define OFFER_MAGIC 0x4f4d5350u

typedef struct ring {
    _Atomic uint64_t *tail, *head;
    _Atomic uint32_t *sleeping, *waiting;
    uint8_t *data;
} ring;

struct dp_shm {
    uint8_t *base;
    size_t map_len, cap;
    int heap; /* dp_shm_test_open's: base is malloc'd, not mapped */
    ring tx, rx;
    /* Our doorbell's read end; the peer's doorbell, opened read-write so it
     * always has a reader: a write after the peer died is then EAGAIN at
     * worst, never SIGPIPE (docs/transport.md, "Shared memory"). */
    int bell_rx, bell_tx;
    char path[64];
    /* Sender (under the caller's send lock). */
    uint64_t tx_tail;
    /* Receiver (one thread), and a sender waiting for room (dp_shm_drain):
     * rx_mu.  The stream the receiver reads is ovf[ovf_pos, ovf_len), then
     * the ring from rx_head. */
    pthread_mutex_t rx_mu;
    uint64_t rx_head, rx_left, rx_pad;
    uint8_t *ovf;
    size_t ovf_pos, ovf_len, ovf_cap;
    _Atomic uint64_t ovf_bytes; /* ovf_len - ovf_pos, for dp_shm_rx_ready */
};

static size_t round8(uint64_t n) { return (size_t)((n + 7) & ~(uint64_t)7); }

static long futex(_Atomic uint32_t *w, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)w, op, val, ts, NULL, 0);
}

static void ring_at(ring *r, uint8_t *base, size_t ctl, uint8_t *data)
{
    r->tail = (_Atomic uint64_t *)(base + ctl);
    r->sleeping = (_Atomic uint32_t *)(base + ctl + 8);
    r->head = (_Atomic uint64_t *)(base + ctl + 64);
    r->waiting = (_Atomic uint32_t *)(base + ctl + 72);
    r->data = data;
}

/* The segment's and doorbells' names; a test's tag (testhooks.h) goes
 * before the token, so that the test can tell its own segments. */
static void paths(const char *token, char seg[64], char bd[64], char ba[64])
{
    const char *tag = dp_hook_text(DP_HOOK_SHM_TAG);
    if (!tag || strlen(tag) > 8 ||
        strspn(tag, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") !=
            strlen(tag))
        tag = ""; /* malformed: refused by dp_hooks_check where a program starts */
    const char *dash = *tag ? "-" : "";
    snprintf(seg, 64, SHM_DIR "%.8s%s%s", tag, dash, token);
    snprintf(bd, 64, SHM_DIR "%.8s%s%s.bd", tag, dash, token); /* the dialer's doorbell */
    snprintf(ba, 64, SHM_DIR "%.8s%s%s.ba", tag, dash, token); /* the acceptor's */
}

/* ---- identity: the same host means the same kernel boot, the same
 * network namespace (tasks in other namespaces are other hosts of the
 * virtual cluster, docs/cluster.md) and the same uid ---- */

static int identity(uint8_t id[ID_LEN], char *why, size_t cap)
{
    memset(id, 0, ID_LEN);
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, id, ID_BOOT) : -1;
    if (fd >= 0)
        close(fd);
    struct stat st;
    if (n != ID_BOOT || stat("/proc/self/ns/net", &st) != 0) {
        snprintf(why, cap, "cannot tell which host this is (/proc: %s)", strerror(errno));
        return -1;
    }
    dp_put_u64(id + ID_BOOT, (uint64_t)st.st_dev);
    dp_put_u64(id + ID_BOOT + 8, (uint64_t)st.st_ino);
    dp_put_u32(id + ID_BOOT + 16, (uint32_t)getuid());
    return 0;
}

/* "host:port" of a socket's local end (dp_sock_peer_str gives the other). */
static void local_str(int fd, char *buf, size_t cap)
{
    dp_sockaddr a;
    a.len = sizeof a.ss;
    if (getsockname(fd, (struct sockaddr *)&a.ss, &a.len) != 0)
        snprintf(buf, cap, "?");
    else
        dp_sock_addr_str(&a, buf, cap);
}

/* ---- setup frames: DP_FRAME_SHM, sequence number 0 of its direction,
 * payload encrypted on a keyed connection (its names are nobody else's
 * business), CRC-checked on an insecure one ---- */

static int send_setup(int fd, int self, const dp_auth_session *s, const uint8_t *pl, size_t len,
                      double deadline, dp_auth_io *io, dp_err *err)
{
    uint8_t buf[DP_FRAME_HEADER_SIZE + DP_FRAME_TAG_SIZE + OFFER_LEN + ANSWER_MAX +
                DP_FRAME_TAG_SIZE];
    dp_frame_header h = {0};
    h.type = DP_FRAME_SHM;
    h.source = (uint32_t)self;
    h.length = len;
    size_t n = DP_FRAME_HEADER_SIZE;
    if (s->keyed) {
        dp_fmac m = {0};
        if (dp_fmac_init(&m, s->suite, s->key_tx, 0)) {
            dp_fmac_free(&m);
            return dp_errf(err, "shared-memory setup: cannot set up the cipher");
        }
        dp_frame_encode(buf, &h);
        dp_fmac_tag(&m, 0, DP_FMAC_HEADER, buf, DP_FRAME_HEADER_SIZE, buf + n);
        n += DP_FRAME_TAG_SIZE;
        dp_fmac_begin(&m, 0, 0);
        dp_fmac_crypt(&m, buf + n, pl, len);
        n += len;
        dp_fmac_end_tag(&m, buf + n);
        n += DP_FRAME_TAG_SIZE;
        dp_fmac_free(&m);
    } else {
        h.payload_crc = dp_crc32c(0, pl, len);
        dp_frame_encode(buf, &h);
        memcpy(buf + n, pl, len);
        n += len;
    }
    if (dp_sock_write_full(fd, buf, n, deadline, err))
        return dp_err_prefix(err, "shared-memory setup");
    io->frames_sent++;
    io->bytes_sent += n;
    return 0;
}

/* Reads the peer's setup frame (payload at most cap bytes) into pl. */
static int recv_setup(int fd, int peer, const dp_auth_session *s, uint8_t *pl, size_t cap,
                      size_t *len, double deadline, dp_auth_io *io, dp_err *err)
{
    uint8_t hb[DP_FRAME_HEADER_SIZE + DP_FRAME_TAG_SIZE], tag[DP_FRAME_TAG_SIZE];
    dp_frame_header h;
    char why[200];
    if (dp_sock_read_full(fd, hb, DP_FRAME_HEADER_SIZE, deadline, err))
        return dp_err_prefix(err, "shared-memory setup");
    if (dp_frame_decode(&h, hb, cap, why, sizeof why) != DP_FRAME_OK)
        return dp_errf(err, "shared-memory setup: bad frame header: %s", why);
    if (h.type != DP_FRAME_SHM || h.source != (uint32_t)peer)
        return dp_errf(err, "shared-memory setup: got %s frame from rank %u",
                       dp_frame_type_name(h.type), h.source);
    size_t n = DP_FRAME_HEADER_SIZE + (size_t)h.length;
    if (s->keyed) {
        dp_fmac m = {0};
        int bad = dp_fmac_init(&m, s->suite, s->key_rx, 1);
        if (!bad)
            bad = dp_sock_read_full(fd, hb + DP_FRAME_HEADER_SIZE, DP_FRAME_TAG_SIZE, deadline,
                                    err) ||
                  dp_sock_read_full(fd, pl, (size_t)h.length, deadline, err) ||
                  dp_sock_read_full(fd, tag, sizeof tag, deadline, err);
        if (bad) {
            dp_fmac_free(&m);
            return dp_err_prefix(err, "shared-memory setup");
        }
        bad = dp_fmac_verify(&m, 0, DP_FMAC_HEADER, hb, DP_FRAME_HEADER_SIZE,
                             hb + DP_FRAME_HEADER_SIZE) != 0;
        if (!bad) {
            dp_fmac_begin(&m, 0, 0);
            dp_fmac_crypt(&m, pl, pl, (size_t)h.length);
            bad = dp_fmac_end_verify(&m, tag) != 0;
        }
        dp_fmac_free(&m);
        if (bad)
            return dp_errf(err, "shared-memory setup frame from rank %d failed authentication",
                           peer);
        n += 2 * DP_FRAME_TAG_SIZE;
    } else {
        if (dp_sock_read_full(fd, pl, (size_t)h.length, deadline, err))
            return dp_err_prefix(err, "shared-memory setup");
        if (dp_frame_check_payload(&h, pl, (size_t)h.length))
            return dp_errf(err, "shared-memory setup frame from rank %d: payload CRC mismatch",
                           peer);
    }
    io->frames_recv++;
    io->bytes_recv += n;
    *len = (size_t)h.length;
    return 0;
}

/* ---- the segment ---- */

static dp_shm *shm_new(void)
{
    dp_shm *s = calloc(1, sizeof *s);
    if (s && pthread_mutex_init(&s->rx_mu, NULL) != 0) {
        free(s);
        return NULL;
    }
    if (s)
        s->bell_rx = s->bell_tx = -1;
    return s;
}

void dp_shm_close(dp_shm *s)
{
    if (!s)
        return;
    if (s->base && s->heap)
        free(s->base);
    else if (s->base)
        munmap(s->base, s->map_len);
    if (s->bell_rx >= 0)
        close(s->bell_rx);
    if (s->bell_tx >= 0)
        close(s->bell_tx);
    pthread_mutex_destroy(&s->rx_mu);
    free(s->ovf);
    free(s);
}

const char *dp_shm_path(const dp_shm *s) { return s->path; }

dp_shm *dp_shm_test_open(size_t ring_bytes, dp_shm_peer *peer)
{
    if (ring_bytes < 64 || (ring_bytes & (ring_bytes - 1)))
        return NULL;
    dp_shm *s = shm_new();
    if (!s)
        return NULL;
    s->heap = 1;
    s->cap = ring_bytes;
    s->map_len = SEG_DATA + 2 * ring_bytes;
    s->base = calloc(1, s->map_len);
    if (!s->base) {
        free(s);
        return NULL;
    }
    ring_at(&s->rx, s->base, CTL0, s->base + SEG_DATA);
    ring_at(&s->tx, s->base, CTL1, s->base + SEG_DATA + ring_bytes);
    *peer = (dp_shm_peer){(uint8_t *)s->rx.tail, (uint8_t *)s->rx.head, (uint8_t *)s->tx.head,
                          (uint8_t *)s->tx.tail, s->rx.data, s->tx.data, s->base, SEG_DATA};
    return s;
}

static void unlink_all(const char *token)
{
    char seg[64], bd[64], ba[64];
    paths(token, seg, bd, ba);
    unlink(seg);
    unlink(bd);
    unlink(ba);
}

/* Dialer: segment and both doorbells, exclusive, 0600; ring 0 is ours. */
static dp_shm *create(const char *token, size_t ring_bytes, char *why, size_t cap)
{
    char seg[64], bd[64], ba[64];
    paths(token, seg, bd, ba);
    dp_shm *s = shm_new();
    int fd = -1;
    if (!s) {
        snprintf(why, cap, "out of memory");
        return NULL;
    }
    snprintf(s->path, sizeof s->path, "%s", seg);
    s->cap = ring_bytes;
    s->map_len = SEG_DATA + 2 * ring_bytes;
    fd = open(seg, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)s->map_len) != 0) {
        snprintf(why, cap, "cannot create %s: %s", seg, strerror(errno));
        goto fail;
    }
    s->base = mmap(NULL, s->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s->base == MAP_FAILED) {
        s->base = NULL;
        snprintf(why, cap, "cannot map %s: %s", seg, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    dp_put_u32(s->base, SEG_MAGIC);
    dp_put_u32(s->base + 4, SEG_VERSION);
    dp_put_u64(s->base + 8, ring_bytes);
    ring_at(&s->tx, s->base, CTL0, s->base + SEG_DATA);
    ring_at(&s->rx, s->base, CTL1, s->base + SEG_DATA + ring_bytes);
    if (mkfifo(bd, 0600) != 0 || mkfifo(ba, 0600) != 0 ||
        (s->bell_rx = open(bd, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW)) < 0) {
        snprintf(why, cap, "cannot make the doorbell %s: %s", bd, strerror(errno));
        goto fail;
    }
    return s;
fail:
    if (fd >= 0)
        close(fd);
    unlink_all(token);
    dp_shm_close(s);
    return NULL;
}

/* Opens a path the dialer made, refusing anything that is not ours, 0600,
 * of the right kind. */
static int open_checked(const char *path, int flags, int fifo, size_t size, char *why,
                        size_t cap)
{
    int fd = open(path, flags | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(why, cap, "cannot open %s: %s", path, strerror(errno));
    } else if (st.st_uid != getuid() || (st.st_mode & 0777) != 0600 ||
               (fifo ? !S_ISFIFO(st.st_mode) : !S_ISREG(st.st_mode)) ||
               (!fifo && (uint64_t)st.st_size != size)) {
        snprintf(why, cap, "%s is not a private %s of the expected size (mode %o, uid %u)",
                 path, fifo ? "FIFO" : "file", (unsigned)st.st_mode, (unsigned)st.st_uid);
    } else {
        return fd;
    }
    if (fd >= 0)
        close(fd);
    return -1;
}

/* Acceptor: maps the dialer's segment (ring 1 is ours) and opens the
 * doorbells. */
static dp_shm *attach(const char *token, uint64_t ring_bytes, char *why, size_t cap)
{
    char seg[64], bd[64], ba[64];
    paths(token, seg, bd, ba);
    dp_shm *s = shm_new();
    if (!s) {
        snprintf(why, cap, "out of memory");
        return NULL;
    }
    snprintf(s->path, sizeof s->path, "%s", seg);
    s->cap = (size_t)ring_bytes;
    s->map_len = SEG_DATA + 2 * (size_t)ring_bytes;
    int fd = open_checked(seg, O_RDWR, 0, s->map_len, why, cap);
    if (fd < 0)
        goto fail;
    s->base = mmap(NULL, s->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s->base == MAP_FAILED) {
        s->base = NULL;
        snprintf(why, cap, "cannot map %s: %s", seg, strerror(errno));
        goto fail;
    }
    if (dp_get_u32(s->base) != SEG_MAGIC || dp_get_u32(s->base + 4) != SEG_VERSION ||
        dp_get_u64(s->base + 8) != ring_bytes) {
        snprintf(why, cap, "%s: not a downpour segment of %llu-byte rings", seg,
                 (unsigned long long)ring_bytes);
        goto fail;
    }
    ring_at(&s->rx, s->base, CTL0, s->base + SEG_DATA);
    ring_at(&s->tx, s->base, CTL1, s->base + SEG_DATA + ring_bytes);
    if ((s->bell_rx = open_checked(ba, O_RDONLY | O_NONBLOCK, 1, 0, why, cap)) < 0 ||
        (s->bell_tx = open_checked(bd, O_RDWR | O_NONBLOCK, 1, 0, why, cap)) < 0)
        goto fail;
    return s;
fail:
    dp_shm_close(s);
    return NULL;
}

int dp_shm_dial(int fd, int self_rank, int peer, size_t ring_bytes, const dp_auth_session *s,
                double deadline, dp_shm **out, char *why, size_t why_cap, dp_auth_io *io,
                dp_err *err)
{
    uint8_t offer[OFFER_LEN], ans[ANSWER_MAX];
    unsigned char rnd[TOKEN_HEX / 2];
    char token[TOKEN_HEX + 1];
    *out = NULL;
    why[0] = '\0';
    memset(offer, 0, sizeof offer);
    randombytes_buf(rnd, sizeof rnd);
    sodium_bin2hex(token, sizeof token, rnd, sizeof rnd);
    dp_put_u32(offer, OFFER_MAGIC);
    char lo[ADDR_LEN], re[ADDR_LEN];
    local_str(fd, lo, sizeof lo);
    dp_sock_peer_str(fd, re, sizeof re);
    dp_shm *link = NULL;
    if (identity(offer + 4, why, why_cap) == 0)
        link = create(token, ring_bytes, why, why_cap);
    if (link) { /* else an offer without a token: the peer declines */
        memcpy(offer + 4 + ID_LEN, lo, strlen(lo));
        memcpy(offer + 4 + ID_LEN + ADDR_LEN, re, strlen(re));
        dp_put_u64(offer + 4 + ID_LEN + 2 * ADDR_LEN, ring_bytes);
        memcpy(offer + 4 + ID_LEN + 2 * ADDR_LEN + 8, token, TOKEN_HEX);
    }
    size_t alen = 0;
    int rc = send_setup(fd, self_rank, s, offer, sizeof offer, deadline, io, err);
    if (rc == 0)
        rc = recv_setup(fd, peer, s, ans, sizeof ans - 1, &alen, deadline, io, err);
    if (rc == 0 && link && alen >= 4 && dp_get_u32(ans) == 1) {
        char seg[64], bd[64], ba[64];
        paths(token, seg, bd, ba);
        link->bell_tx = open(ba, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
        if (link->bell_tx < 0) {
            rc = dp_errf(err, "shared-memory setup: cannot open the peer's doorbell %s: %s", ba,
                         strerror(errno));
        }
    } else if (rc == 0) {
        ans[alen] = '\0';
        if (!why[0])
            snprintf(why, why_cap, "%s", alen > 4 ? (const char *)ans + 4 : "declined by peer");
        dp_shm_close(link);
        link = NULL;
    }
    /* Mapped by both or given up: no one else may ever open them. */
    unlink_all(token);
    if (rc != 0) {
        dp_shm_close(link);
        return -1;
    }
    *out = link;
    return 0;
}

int dp_shm_accept(int fd, int self_rank, int peer_rank, int enabled, const dp_auth_session *s,
                  double deadline, dp_shm **out, char *why, size_t why_cap, dp_auth_io *io,
                  dp_err *err)
{
    uint8_t offer[OFFER_LEN], id[ID_LEN], ans[ANSWER_MAX];
    size_t olen = 0;
    *out = NULL;
    why[0] = '\0';
    if (recv_setup(fd, peer_rank, s, offer, sizeof offer, &olen, deadline, io, err))
        return -1;
    const uint8_t *tok = offer + 4 + ID_LEN + 2 * ADDR_LEN + 8;
    char token[TOKEN_HEX + 1], lo[ADDR_LEN], re[ADDR_LEN], dlo[ADDR_LEN + 1], dre[ADDR_LEN + 1];
    memcpy(token, tok, TOKEN_HEX);
    token[TOKEN_HEX] = '\0';
    memcpy(dlo, offer + 4 + ID_LEN, ADDR_LEN);
    memcpy(dre, offer + 4 + ID_LEN + ADDR_LEN, ADDR_LEN);
    dlo[ADDR_LEN] = dre[ADDR_LEN] = '\0';
    uint64_t ring_bytes = olen == OFFER_LEN ? dp_get_u64(tok - 8) : 0;
    local_str(fd, lo, sizeof lo);
    dp_sock_peer_str(fd, re, sizeof re);
    int hex = 1;
    for (int i = 0; i < TOKEN_HEX; i++)
        hex &= (token[i] >= '0' && token[i] <= '9') || (token[i] >= 'a' && token[i] <= 'f');
    dp_shm *link = NULL;
    if (!enabled)
        snprintf(why, why_cap, "shared memory is off at rank %d", self_rank);
    else if (olen != OFFER_LEN || dp_get_u32(offer) != OFFER_MAGIC)
        snprintf(why, why_cap, "malformed offer (%zu bytes)", olen);
    else if (identity(id, why, why_cap) != 0)
        ;
    else if (memcmp(id, offer + 4, ID_LEN) != 0)
        snprintf(why, why_cap, "another host (boot id, network namespace or uid differ)");
    else if (strcmp(lo, dre) != 0 || strcmp(re, dlo) != 0)
        snprintf(why, why_cap, "the connection is relayed (%s -> %s seen as %s -> %s)", dlo, dre,
                 re, lo);
    else if (!hex || ring_bytes < DP_SHM_RING_MIN || ring_bytes > DP_SHM_RING_MAX ||
             (ring_bytes & (ring_bytes - 1)))
        snprintf(why, why_cap, "bad offer (ring of %llu bytes)", (unsigned long long)ring_bytes);
    else
        link = attach(token, ring_bytes, why, why_cap);
    memset(ans, 0, sizeof ans);
    dp_put_u32(ans, link ? 1 : 0);
    size_t alen = 4;
    if (!link) {
        size_t w = strlen(why) < ANSWER_MAX - 5 ? strlen(why) : ANSWER_MAX - 5;
        memcpy(ans + 4, why, w);
        alen += w;
    }
    if (send_setup(fd, self_rank, s, ans, alen, deadline, io, err)) {
        dp_shm_close(link);
        return -1;
    }
    *out = link;
    return 0;
}

/* ---- the rings ---- */

/* Copies n bytes at ring position pos (wrapping) out of or into r. */
static void ring_get(const ring *r, size_t cap, uint64_t pos, void *dst, size_t n)
{
    size_t at = (size_t)(pos & (cap - 1)), first = cap - at < n ? cap - at : n;
    memcpy(dst, r->data + at, first);
    memcpy((uint8_t *)dst + first, r->data, n - first);
}

static void wake_consumer(dp_shm *s)
{
    /* Store (tail) - fence - load (sleeping), against the consumer's store
     * (sleeping) - fence - load (tail): one of the two sees the other. */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(s->tx.sleeping, memory_order_relaxed) &&
        atomic_exchange(s->tx.sleeping, 0)) {
        ssize_t w;
        do
            w = write(s->bell_tx, "", 1);
        while (w < 0 && errno == EINTR);
        /* EAGAIN: the FIFO is full of unread bytes, the consumer wakes anyway */
    }
}

static void wake_producer(dp_shm *s)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(s->rx.waiting, memory_order_relaxed) &&
        atomic_exchange(s->rx.waiting, 0))
        futex(s->rx.waiting, FUTEX_WAKE, 1, NULL);
}

/* Room in the send ring, or -1 when the peer's head is impossible. */
static int64_t tx_room(dp_shm *s)
{
    uint64_t head = atomic_load_explicit(s->tx.head, memory_order_acquire);
    uint64_t used = s->tx_tail - head;
    return used > s->cap ? -1 : (int64_t)(s->cap - used);
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Waits for room (spinning briefly, then through w). */
static int tx_wait_room(dp_shm *s, const dp_shm_waiter *w, dp_err *err)
{
    double until = dp_now() + SPIN_NS * 1e-9;
    for (int k = 0;; k++) {
        int64_t room = tx_room(s);
        if (room < 0)
            return dp_errf(err, "shared-memory ring corrupted (the peer's read position is "
                                "impossible)");
        if (room > 0)
            return 0;
        if (k < 64 || dp_now() < until) {
            cpu_relax();
            continue;
        }
        if (dp_shm_peer_waits(s)) /* each waits on the other: take its bytes */
            dp_shm_drain(s);
        if (w->wait(w->ctx, 1, err))
            return -1;
    }
}

void dp_shm_tx_wait(dp_shm *s, double timeout_s)
{
    uint64_t head = atomic_load_explicit(s->tx.head, memory_order_acquire);
    atomic_store(s->tx.waiting, 1);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(s->tx.head, memory_order_acquire) != head) {
        atomic_store(s->tx.waiting, 0);
        return;
    }
    wake_consumer(s); /* a receiver asleep in poll() wakes and drains us if it reads no more */
    struct timespec ts = {(time_t)timeout_s, (long)((timeout_s - (time_t)timeout_s) * 1e9)};
    futex(s->tx.waiting, FUTEX_WAIT, 1, &ts);
}

int dp_shm_send(dp_shm *s, const uint8_t hdr[DP_FRAME_HEADER_SIZE], const struct iovec *iov,
                int iovcnt, uint64_t len, const dp_shm_waiter *w, dp_err *err)
{
    static const uint8_t zeros[8];
    uint64_t published = s->tx_tail, start = s->tx_tail;
    uint64_t total = DP_FRAME_HEADER_SIZE + len, pad = round8(total) - total;
    /* Pieces: the header, the payload's, the padding. */
    for (int i = -1; i <= iovcnt; i++) {
        const uint8_t *p = i < 0 ? hdr : i == iovcnt ? zeros : iov[i].iov_base;
        size_t n = i < 0 ? DP_FRAME_HEADER_SIZE : i == iovcnt ? (size_t)pad : iov[i].iov_len;
        while (n) {
            int64_t room = tx_room(s);
            if (room <= 0) {
                atomic_store_explicit(s->tx.tail, s->tx_tail, memory_order_release);
                published = s->tx_tail;
                wake_consumer(s);
                if (tx_wait_room(s, w, err))
                    return -1;
                room = tx_room(s);
            }
            size_t at = (size_t)(s->tx_tail & (s->cap - 1));
            size_t k = n < (size_t)room ? n : (size_t)room;
            if (k > s->cap - at)
                k = s->cap - at;
            if (k > PUBLISH)
                k = PUBLISH;
            memcpy(s->tx.data + at, p, k);
            p += k;
            n -= k;
            s->tx_tail += k;
            if (s->tx_tail - published >= PUBLISH) {
                atomic_store_explicit(s->tx.tail, s->tx_tail, memory_order_release);
                published = s->tx_tail;
                wake_consumer(s);
                uint64_t done = s->tx_tail - start;
                if (w->progress && done > DP_FRAME_HEADER_SIZE && done - DP_FRAME_HEADER_SIZE < len)
                    w->progress(w->ctx, done - DP_FRAME_HEADER_SIZE, len);
            }
        }
    }
    atomic_store_explicit(s->tx.tail, s->tx_tail, memory_order_release);
    wake_consumer(s);
    return 0;
}

/* Bytes the peer has published in the ring and we have not consumed;
 * UINT64_MAX when its tail is impossible. */
static uint64_t ring_avail(const dp_shm *s)
{
    uint64_t a = atomic_load_explicit(s->rx.tail, memory_order_acquire) - s->rx_head;
    return a > s->cap ? UINT64_MAX : a;
}

static void ring_consume(dp_shm *s, uint64_t n)
{
    s->rx_head += n;
    atomic_store_explicit(s->rx.head, s->rx_head, memory_order_release);
    wake_producer(s);
}

/* The stream: what a waiting sender moved to ovf, then the ring (rx_mu). */
static uint64_t rx_avail(const dp_shm *s)
{
    uint64_t a = ring_avail(s);
    return a == UINT64_MAX ? a : a + (s->ovf_len - s->ovf_pos);
}

static void rx_consume(dp_shm *s, uint64_t n)
{
    size_t k = s->ovf_len - s->ovf_pos < n ? s->ovf_len - s->ovf_pos : (size_t)n;
    if (k) {
        s->ovf_pos += k;
        if (s->ovf_pos == s->ovf_len)
            s->ovf_pos = s->ovf_len = 0;
        atomic_store_explicit(&s->ovf_bytes, s->ovf_len - s->ovf_pos, memory_order_relaxed);
    }
    if (n > k)
        ring_consume(s, n - k);
}

/* The next n (<= rx_avail) bytes of the stream into dst, not consumed. */
static void rx_peek(const dp_shm *s, void *dst, size_t n)
{
    size_t k = s->ovf_len - s->ovf_pos < n ? s->ovf_len - s->ovf_pos : n;
    if (k) /* ovf may be NULL */
        memcpy(dst, s->ovf + s->ovf_pos, k);
    if (n > k)
        ring_get(&s->rx, s->cap, s->rx_head, (uint8_t *)dst + k, n - k);
}

/* Where the stream's next bytes lie contiguously, and how many (> 0 when
 * rx_avail is). */
static const uint8_t *rx_span(const dp_shm *s, uint64_t avail, size_t *n)
{
    if (s->ovf_len > s->ovf_pos) {
        *n = s->ovf_len - s->ovf_pos;
        return s->ovf + s->ovf_pos;
    }
    size_t at = (size_t)(s->rx_head & (s->cap - 1));
    *n = avail < s->cap - at ? (size_t)avail : s->cap - at;
    return s->rx.data + at;
}

/* Two peers that each send the other more than a ring holds before reading
 * would wait on each other for ever (TCP's socket buffers, 8 MiB each way
 * with sock_buf_bytes 4 MiB, hid this): a sender waiting for room moves
 * what its peer has sent into ovf, up to DP_SHM_OVERFLOW_MAX, freeing the
 * peer's ring.  Only when the receiver is not reading (trylock): a busy
 * receiver drains the ring itself.  docs/transport.md, "Shared memory". */
int dp_shm_drain(dp_shm *s)
{
    if (pthread_mutex_trylock(&s->rx_mu) != 0)
        return 0;
    uint64_t a = ring_avail(s);
    size_t have = s->ovf_len - s->ovf_pos, n = 0;
    if (a != UINT64_MAX && a > 0 && have < DP_SHM_OVERFLOW_MAX) {
        n = a < DP_SHM_OVERFLOW_MAX - have ? (size_t)a : DP_SHM_OVERFLOW_MAX - have;
        if (s->ovf_pos) { /* what was read goes; the rest moves to the front */
            memmove(s->ovf, s->ovf + s->ovf_pos, have);
            s->ovf_pos = 0;
            s->ovf_len = have;
        }
        if (have + n > s->ovf_cap) {
            size_t cap = s->ovf_cap ? 2 * s->ovf_cap : s->cap;
            if (cap < have + n)
                cap = have + n;
            if (cap > DP_SHM_OVERFLOW_MAX)
                cap = DP_SHM_OVERFLOW_MAX;
            uint8_t *p = realloc(s->ovf, cap);
            if (p) {
                s->ovf = p;
                s->ovf_cap = cap;
            }
            if (n > s->ovf_cap - have) /* out of memory: as far as it goes */
                n = s->ovf_cap - have;
        }
        if (n) {
            ring_get(&s->rx, s->cap, s->rx_head, s->ovf + s->ovf_len, n);
            s->ovf_len += n;
            atomic_store_explicit(&s->ovf_bytes, s->ovf_len - s->ovf_pos,
                                  memory_order_relaxed);
            ring_consume(s, n);
        }
    }
    pthread_mutex_unlock(&s->rx_mu);
    return n > 0;
}

int dp_shm_peer_waits(const dp_shm *s)
{
    return atomic_load_explicit(s->rx.waiting, memory_order_relaxed) != 0;
}

uint64_t dp_shm_rx_ready(const dp_shm *s)
{
    uint64_t head = atomic_load_explicit(s->rx.head, memory_order_relaxed);
    uint64_t a = atomic_load_explicit(s->rx.tail, memory_order_acquire) - head;
    return (a > s->cap ? 1 : a) + atomic_load_explicit(&s->ovf_bytes, memory_order_relaxed);
}

uint64_t dp_shm_pending(const dp_shm *s) { return s->rx_left; }

/* A frame's padding, published with its last byte, is taken with it, so an
 * empty ring reads as empty (the heartbeat thread counts what is unread). */
static void skip_pad(dp_shm *s)
{
    uint64_t a = rx_avail(s);
    if (s->rx_pad && a != UINT64_MAX && a >= s->rx_pad) {
        rx_consume(s, s->rx_pad);
        s->rx_pad = 0;
    }
}

static int next_locked(dp_shm *s, uint64_t max_len, dp_frame_header *h, char *why,
                       size_t why_cap)
{
    uint64_t a = rx_avail(s);
    if (a == UINT64_MAX) {
        snprintf(why, why_cap, "shared-memory ring corrupted (the peer's write position is "
                               "impossible)");
        return -1;
    }
    if (s->rx_pad) { /* the previous frame's padding, published with its end */
        if (a < s->rx_pad)
            return 0;
        rx_consume(s, s->rx_pad);
        a -= s->rx_pad;
        s->rx_pad = 0;
    }
    if (a < DP_FRAME_HEADER_SIZE)
        return 0;
    uint8_t hb[DP_FRAME_HEADER_SIZE];
    char w[200];
    rx_peek(s, hb, sizeof hb);
    rx_consume(s, sizeof hb);
    if (dp_frame_decode(h, hb, max_len, w, sizeof w) != DP_FRAME_OK) {
        snprintf(why, why_cap, "bad frame header in shared memory: %s", w);
        return -1;
    }
    if (h->payload_crc != 0) { /* one encoding: the ring carries no CRCs */
        snprintf(why, why_cap, "%s frame in shared memory with payload CRC 0x%08x",
                 dp_frame_type_name(h->type), (unsigned)h->payload_crc);
        return -1;
    }
    uint64_t total = DP_FRAME_HEADER_SIZE + h->length;
    s->rx_left = h->length;
    s->rx_pad = round8(total) - total;
    if (s->rx_left == 0)
        skip_pad(s);
    return 1;
}

int dp_shm_next(dp_shm *s, uint64_t max_len, dp_frame_header *h, char *why, size_t why_cap)
{
    pthread_mutex_lock(&s->rx_mu);
    int r = next_locked(s, max_len, h, why, why_cap);
    pthread_mutex_unlock(&s->rx_mu);
    return r;
}

/* Adds n bytes (a whole number of floats) at p to dst, unaligned loads. */
static void add_floats(float *restrict dst, const uint8_t *restrict p, size_t nf)
{
    for (size_t j = 0; j < nf; j++) {
        float v;
        memcpy(&v, p + 4 * j, sizeof v);
        dst[j] += v;
    }
}

static int recv_locked(dp_shm *s, void *dst, size_t len, int add, const dp_shm_waiter *w,
                       dp_err *err)
{
    uint8_t *d = dst, part[4];
    size_t carry = 0; /* add: bytes of a float split by the wrap or a publish, in part */
    double until = 0;
    int k = 0;
    if (add && len % 4)
        return dp_errf(err, "shared memory: adding %zu bytes, not a whole number of floats", len);
    while (len) {
        uint64_t a = rx_avail(s);
        if (a == UINT64_MAX)
            return dp_errf(err, "shared-memory ring corrupted (the peer's write position is "
                                "impossible)");
        if (a == 0) {
            if (k++ == 0)
                until = dp_now() + SPIN_NS * 1e-9;
            if (k < 64 || dp_now() < until) {
                cpu_relax();
                continue;
            }
            if (w->wait(w->ctx, 0, err))
                return -1;
            continue;
        }
        k = 0;
        size_t n;
        const uint8_t *src = rx_span(s, a, &n);
        if (n > len)
            n = len;
        if (n > PUBLISH) /* hand room back to the sender as we go */
            n = PUBLISH;
        if (add && (carry || n < 4)) {
            /* A float split by the wrap, by where the sender published, or
             * by an odd earlier read: its bytes are taken as they come, so
             * the ring drains and a sender that dies here is seen as gone
             * (waiting on 1-3 bytes would spin without ever sleeping). */
            if (n > 4 - carry)
                n = 4 - carry;
            memcpy(part + carry, src, n);
            carry += n;
            if (carry == 4) {
                add_floats((float *)(void *)d, part, 1);
                d += 4;
                carry = 0;
            }
        } else if (add) {
            n -= n % 4;
            add_floats((float *)(void *)d, src, n / 4);
            d += n;
        } else if (d) {
            memcpy(d, src, n);
            d += n;
        }
        len -= n;
        s->rx_left -= n;
        rx_consume(s, n);
    }
    if (s->rx_left == 0)
        skip_pad(s);
    return 0;
}

int dp_shm_recv(dp_shm *s, void *dst, size_t len, int add, const dp_shm_waiter *w, dp_err *err)
{
    pthread_mutex_lock(&s->rx_mu);
    int rc = recv_locked(s, dst, len, add, w, err);
    pthread_mutex_unlock(&s->rx_mu);
    return rc;
}

int dp_shm_bell_fd(const dp_shm *s) { return s->bell_rx; }

/* Store (sleeping) - fence - load (tail): see wake_consumer. */
static int rx_sleep_locked(dp_shm *s)
{
    atomic_store(s->rx.sleeping, 1);
    atomic_thread_fence(memory_order_seq_cst);
    if (rx_avail(s) == 0)
        return 0;
    atomic_store(s->rx.sleeping, 0);
    return 1;
}

int dp_shm_rx_sleep(dp_shm *s)
{
    pthread_mutex_lock(&s->rx_mu);
    int r = rx_sleep_locked(s);
    pthread_mutex_unlock(&s->rx_mu);
    return r;
}

void dp_shm_rx_awake(dp_shm *s)
{
    uint8_t sink[64];
    while (read(s->bell_rx, sink, sizeof sink) > 0)
        ;
    atomic_store(s->rx.sleeping, 0);
}

int dp_shm_rx_wait(dp_shm *s, int tcp_fd, double timeout_s)
{
    if (rx_sleep_locked(s)) /* under dp_shm_recv's rx_mu */
        return 0;
    struct pollfd p[2] = {{s->bell_rx, POLLIN, 0}, {tcp_fd, POLLRDHUP, 0}};
    int rc = poll(p, 2, timeout_s <= 0 ? 0 : (int)(timeout_s * 1000 + 0.999));
    dp_shm_rx_awake(s);
    return rc > 0 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR));
}
