/* Frame tags: AES-256-GCM where the CPU has AES-NI and PCLMUL, otherwise
 * ChaCha20-Poly1305 (IETF).  Both take a 96-bit nonce, built from the
 * frame's sequence number and the chunk index, so no nonce repeats under one
 * key (docs/transport.md, "Frame MAC"). */
#include "fmac.h"

#include "downpour/frame.h"

#include <string.h>

static void make_nonce(unsigned char n[12], uint64_t seq, uint32_t idx)
{
    dp_put_u64(n, seq);
    dp_put_u32(n + 8, idx);
}

int dp_fmac_aes_available(void) { return crypto_aead_aes256gcm_is_available(); }

const char *dp_fmac_suite_name(int suite)
{
    return suite == DP_FMAC_AESGCM ? "AES-256-GCM" : "ChaCha20-Poly1305";
}

void dp_fmac_init(dp_fmac *m, int suite, const unsigned char key[DP_FMAC_KEY])
{
    m->suite = suite;
    memcpy(m->key, key, DP_FMAC_KEY);
    if (suite == DP_FMAC_AESGCM)
        crypto_aead_aes256gcm_beforenm(&m->aes, key);
}

void dp_fmac_wipe(dp_fmac *m) { sodium_memzero(m, sizeof *m); }

/* The AEAD in one place; an empty message makes it a MAC over ad. */
static void seal(const dp_fmac *m, uint64_t seq, uint32_t idx, unsigned char *out,
                 const unsigned char *msg, size_t mlen, const unsigned char *ad, size_t adlen,
                 unsigned char tag[DP_FMAC_TAG])
{
    unsigned char n[12];
    unsigned long long tl;
    make_nonce(n, seq, idx);
    if (m->suite == DP_FMAC_AESGCM)
        crypto_aead_aes256gcm_encrypt_detached_afternm(out, tag, &tl, msg, mlen, ad, adlen, NULL,
                                                       n, &m->aes);
    else
        crypto_aead_chacha20poly1305_ietf_encrypt_detached(out, tag, &tl, msg, mlen, ad, adlen,
                                                           NULL, n, m->key);
}

static int unseal(const dp_fmac *m, uint64_t seq, uint32_t idx, unsigned char *out,
                  const unsigned char *c, size_t clen, const unsigned char *ad, size_t adlen,
                  const unsigned char tag[DP_FMAC_TAG])
{
    unsigned char n[12];
    make_nonce(n, seq, idx);
    if (m->suite == DP_FMAC_AESGCM)
        return crypto_aead_aes256gcm_decrypt_detached_afternm(out, NULL, c, clen, tag, ad, adlen,
                                                              n, &m->aes);
    return crypto_aead_chacha20poly1305_ietf_decrypt_detached(out, NULL, c, clen, tag, ad, adlen,
                                                              n, m->key);
}

void dp_fmac_tag(const dp_fmac *m, uint64_t seq, uint32_t idx, const void *data, size_t len,
                 unsigned char tag[DP_FMAC_TAG])
{
    unsigned char none[1] = {0};
    seal(m, seq, idx, none, none, 0, data, len, tag);
}

int dp_fmac_verify(const dp_fmac *m, uint64_t seq, uint32_t idx, const void *data, size_t len,
                   const unsigned char tag[DP_FMAC_TAG])
{
    unsigned char none[1] = {0};
    return unseal(m, seq, idx, none, none, 0, data, len, tag) == 0 ? 0 : -1;
}

void dp_fmac_seal(const dp_fmac *m, uint64_t seq, uint32_t idx, unsigned char *out,
                  const unsigned char *in, size_t len, unsigned char tag[DP_FMAC_TAG])
{
    seal(m, seq, idx, out, in, len, NULL, 0, tag);
}

int dp_fmac_open(const dp_fmac *m, uint64_t seq, uint32_t idx, unsigned char *buf, size_t len,
                 const unsigned char tag[DP_FMAC_TAG])
{
    return unseal(m, seq, idx, buf, buf, len, NULL, 0, tag) == 0 ? 0 : -1;
}
