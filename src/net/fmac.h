/* Frame authentication after the handshake (docs/transport.md, "Frame MAC"):
 * one 16-byte tag per frame header and per payload chunk, from an AEAD keyed
 * by the connection's per-direction session key, with the 96-bit nonce
 * seq u64 | index u32 (the frame's implicit sequence number, and the chunk
 * index or DP_FMAC_HEADER for the header).  Without encryption the data is
 * the AEAD's associated data (AES-256-GCM: GMAC; ChaCha20-Poly1305: Poly1305
 * with a one-time key per nonce); with encryption the chunks are its message.
 * Internal to src/net (and the tests). */
#ifndef DOWNPOUR_NET_FMAC_H
#define DOWNPOUR_NET_FMAC_H

#include <sodium.h>
#include <stddef.h>
#include <stdint.h>

#define DP_FMAC_KEY 32
#define DP_FMAC_TAG 16
#define DP_FMAC_HEADER 0xffffffffu /* index of the header's tag; chunks count from 0 */

enum { DP_FMAC_AESGCM = 1, DP_FMAC_CHACHA = 2 };

typedef struct dp_fmac {
    crypto_aead_aes256gcm_state aes; /* expanded key (AES suite) */
    unsigned char key[DP_FMAC_KEY];  /* raw key (ChaCha20 suite) */
    int suite;
} dp_fmac;

/* Is AES-256-GCM usable here (AES-NI and PCLMUL)? */
int dp_fmac_aes_available(void);
const char *dp_fmac_suite_name(int suite);

void dp_fmac_init(dp_fmac *m, int suite, const unsigned char key[DP_FMAC_KEY]);
void dp_fmac_wipe(dp_fmac *m);

/* Tag over data (authenticated, not encrypted). */
void dp_fmac_tag(const dp_fmac *m, uint64_t seq, uint32_t idx, const void *data, size_t len,
                 unsigned char tag[DP_FMAC_TAG]);
/* 0 when tag matches data, else -1 (compared in constant time). */
int dp_fmac_verify(const dp_fmac *m, uint64_t seq, uint32_t idx, const void *data, size_t len,
                   const unsigned char tag[DP_FMAC_TAG]);
/* Encrypts len bytes from in to out (out == in allowed) and writes the tag. */
void dp_fmac_seal(const dp_fmac *m, uint64_t seq, uint32_t idx, unsigned char *out,
                  const unsigned char *in, size_t len, unsigned char tag[DP_FMAC_TAG]);
/* Checks the tag and decrypts buf in place: 0, or -1 (buf is then garbage). */
int dp_fmac_open(const dp_fmac *m, uint64_t seq, uint32_t idx, unsigned char *buf, size_t len,
                 const unsigned char tag[DP_FMAC_TAG]);

#endif
