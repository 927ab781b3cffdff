/* Frame authentication after the handshake (docs/transport.md, "Frame MAC"):
 * one 16-byte tag per frame header and per payload chunk, from an AEAD keyed
 * by the connection's per-direction session key, with the 96-bit nonce
 * seq u64 | index u32 (the frame's implicit sequence number, and the chunk
 * index or DP_FMAC_HEADER for the header).  Without encryption the data is
 * the AEAD's associated data (AES-256-GCM: GMAC; ChaCha20-Poly1305: Poly1305
 * with a one-time key per nonce); with encryption the chunks are its message.
 * GMAC stays the MAC: UMAC-128 measured no faster on this CPU, and none with a
 * tag of 64 bits or more meets issue 9's 5 % bound (docs/transport.md,
 * "Issue 9's bound").  Internal to src/net (and the tests). */
#ifndef DOWNPOUR_NET_FMAC_H
#define DOWNPOUR_NET_FMAC_H

#include <openssl/evp.h>
#include <sodium.h>
#include <stddef.h>
#include <stdint.h>

#define DP_FMAC_KEY 32
#define DP_FMAC_TAG 16
#define DP_FMAC_HEADER 0xffffffffu /* index of the header's tag; chunks count from 0 */

enum { DP_FMAC_AESGCM = 1, DP_FMAC_CHACHA = 2 };

/* Two implementations of the same AEAD, whose tags are identical: libsodium
 * for one-shot tags of small buffers (a header: 72 ns, where an OpenSSL
 * EVP call sequence costs ~400), OpenSSL EVP for chunks, which it takes in
 * pieces (so a chunk is tagged piece by piece while in cache, and gathered
 * or partly read chunks need no copy) and hashes faster (AES-256-GCM: GMAC
 * 6.0 against 4.7 GB/s, encryption 2.8 against 1.4 GB/s, docs/transport.md). */
typedef struct dp_fmac {
    crypto_aead_aes256gcm_state aes; /* expanded key (AES suite) */
    unsigned char key[DP_FMAC_KEY];  /* raw key (ChaCha20 suite) */
    int suite;
    EVP_CIPHER_CTX *ctx; /* the streaming side; NULL when not initialised */
} dp_fmac;

/* Is AES-256-GCM usable here (AES-NI and PCLMUL)? */
int dp_fmac_aes_available(void);
const char *dp_fmac_suite_name(int suite);

/* decrypt: 1 for a receiving side (dp_fmac_end_verify, and dp_fmac_crypt
 * decrypts), 0 for a sending one.  Returns 0, or -1 when OpenSSL fails. */
int dp_fmac_init(dp_fmac *m, int suite, const unsigned char key[DP_FMAC_KEY], int decrypt);
/* Allocates the EVP context ahead (dp_fmac_init then needs no memory). */
int dp_fmac_alloc(dp_fmac *m);
/* Wipes the keys (the context is kept for reuse); dp_fmac_free also frees it. */
void dp_fmac_wipe(dp_fmac *m);
void dp_fmac_free(dp_fmac *m);
/* Moves src's state into dst; src is left wiped, with dst's old context. */
void dp_fmac_move(dp_fmac *dst, dp_fmac *src);

/* One-shot tag over data (authenticated, not encrypted). */
void dp_fmac_tag(const dp_fmac *m, uint64_t seq, uint32_t idx, const void *data, size_t len,
                 unsigned char tag[DP_FMAC_TAG]);
/* 0 when tag matches data, else -1 (compared in constant time). */
int dp_fmac_verify(const dp_fmac *m, uint64_t seq, uint32_t idx, const void *data, size_t len,
                   const unsigned char tag[DP_FMAC_TAG]);

/* Streaming, on the EVP side: begin, then any number of dp_fmac_ad pieces
 * (authenticated only) or dp_fmac_crypt pieces (encrypted by a sending side,
 * decrypted by a receiving one; out == in allowed; never both kinds in one
 * tag), then end_tag (sending) or end_verify (receiving: 0 or -1). */
void dp_fmac_begin(dp_fmac *m, uint64_t seq, uint32_t idx);
void dp_fmac_ad(dp_fmac *m, const void *data, size_t len);
void dp_fmac_crypt(dp_fmac *m, unsigned char *out, const unsigned char *in, size_t len);
void dp_fmac_end_tag(dp_fmac *m, unsigned char tag[DP_FMAC_TAG]);
int dp_fmac_end_verify(dp_fmac *m, const unsigned char tag[DP_FMAC_TAG]);

#endif
