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

int dp_fmac_init(dp_fmac *m, int suite, const unsigned char key[DP_FMAC_KEY], int decrypt)
{
    m->suite = suite;
    memcpy(m->key, key, DP_FMAC_KEY);
    if (suite == DP_FMAC_AESGCM)
        crypto_aead_aes256gcm_beforenm(&m->aes, key);
    if (dp_fmac_alloc(m))
        return -1;
    const EVP_CIPHER *c = suite == DP_FMAC_AESGCM ? EVP_aes_256_gcm() : EVP_chacha20_poly1305();
    return EVP_CipherInit_ex(m->ctx, c, NULL, key, NULL, decrypt ? 0 : 1) == 1 ? 0 : -1;
}

int dp_fmac_alloc(dp_fmac *m)
{
    return m->ctx || (m->ctx = EVP_CIPHER_CTX_new()) ? 0 : -1;
}

void dp_fmac_wipe(dp_fmac *m)
{
    EVP_CIPHER_CTX *ctx = m->ctx;
    if (ctx)
        EVP_CIPHER_CTX_reset(ctx); /* it cleanses the key schedule */
    sodium_memzero(m, sizeof *m);
    m->ctx = ctx;
}

void dp_fmac_free(dp_fmac *m)
{
    dp_fmac_wipe(m);
    EVP_CIPHER_CTX_free(m->ctx);
    m->ctx = NULL;
}

void dp_fmac_move(dp_fmac *dst, dp_fmac *src)
{
    dp_fmac tmp = *dst;
    *dst = *src;
    *src = tmp;
    dp_fmac_wipe(src);
}

void dp_fmac_begin(dp_fmac *m, uint64_t seq, uint32_t idx)
{
    unsigned char n[12];
    make_nonce(n, seq, idx);
    EVP_CipherInit_ex(m->ctx, NULL, NULL, NULL, n, -1);
}

/* EVP takes int lengths: pieces are at most a chunk, but stay safe. */
void dp_fmac_ad(dp_fmac *m, const void *data, size_t len)
{
    const unsigned char *p = data;
    int outl;
    while (len) {
        int n = len > (1u << 30) ? 1 << 30 : (int)len;
        EVP_CipherUpdate(m->ctx, NULL, &outl, p, n);
        p += n;
        len -= (size_t)n;
    }
}

void dp_fmac_crypt(dp_fmac *m, unsigned char *out, const unsigned char *in, size_t len)
{
    int outl;
    while (len) {
        int n = len > (1u << 30) ? 1 << 30 : (int)len;
        EVP_CipherUpdate(m->ctx, out, &outl, in, n);
        out += n;
        in += n;
        len -= (size_t)n;
    }
}

void dp_fmac_end_tag(dp_fmac *m, unsigned char tag[DP_FMAC_TAG])
{
    unsigned char none[16];
    int outl;
    EVP_CipherFinal_ex(m->ctx, none, &outl);
    EVP_CIPHER_CTX_ctrl(m->ctx, EVP_CTRL_AEAD_GET_TAG, DP_FMAC_TAG, tag);
}

int dp_fmac_end_verify(dp_fmac *m, const unsigned char tag[DP_FMAC_TAG])
{
    unsigned char none[16], t[DP_FMAC_TAG];
    int outl;
    memcpy(t, tag, sizeof t);
    EVP_CIPHER_CTX_ctrl(m->ctx, EVP_CTRL_AEAD_SET_TAG, DP_FMAC_TAG, t);
    return EVP_CipherFinal_ex(m->ctx, none, &outl) == 1 ? 0 : -1; /* compared in constant time */
}

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
