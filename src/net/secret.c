#include "downpour/secret.h"

#include "downpour/log.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int from_text(dp_secret *out, const unsigned char *s, size_t n, const char *where,
                     dp_err *err)
{
    if (n && s[n - 1] == '\n')
        n--;
    if (n && s[n - 1] == '\r')
        n--;
    int is_hex = n > 0 && n % 2 == 0;
    for (size_t i = 0; is_hex && i < n; i++)
        is_hex = hexval(s[i]) >= 0;
    size_t len = is_hex ? n / 2 : n;
    if (len < DP_SECRET_MIN)
        return dp_errf(err, "%s: secret is %zu bytes, at least %d are needed. Hint: make one "
                            "with `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'`",
                       where, len, DP_SECRET_MIN);
    if (len > DP_SECRET_MAX)
        return dp_errf(err, "%s: secret is %zu bytes, at most %d are allowed", where, len,
                       DP_SECRET_MAX);
    if (is_hex)
        for (size_t i = 0; i < len; i++)
            out->bytes[i] = (unsigned char)(hexval(s[2 * i]) << 4 | hexval(s[2 * i + 1]));
    else
        memcpy(out->bytes, s, len);
    out->len = len;
    return 0;
}

int dp_secret_load(dp_secret *out, const char *path, dp_err *err)
{
    memset(out, 0, sizeof *out);
    if (!path) {
        const char *env = getenv("DOWNPOUR_SECRET");
        if (!env || !*env)
            return dp_errf(err, "no cluster secret: DOWNPOUR_SECRET is not set and no "
                                "--secret-file was given. Hint: `downpour launch` sets it for "
                                "local runs; for a multi-host cluster put the same secret in a "
                                "file (mode 0600) on every host and pass --secret-file FILE, or "
                                "export DOWNPOUR_SECRET");
        return from_text(out, (const unsigned char *)env, strlen(env), "DOWNPOUR_SECRET", err);
    }
    FILE *f = fopen(path, "rb");
    if (!f)
        return dp_errf(err, "cannot open secret file %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
        dp_warn("secret file %s is readable by other users (mode %03o): chmod 600 %s", path,
                (unsigned)(st.st_mode & 0777), path);
    unsigned char buf[2 * DP_SECRET_MAX + 3];
    size_t n = fread(buf, 1, sizeof buf, f);
    int bad = ferror(f);
    fclose(f);
    int rc = bad ? dp_errf(err, "cannot read secret file %s", path)
         : n == sizeof buf ? dp_errf(err, "secret file %s is too long (at most %d bytes, or "
                                          "%d hex digits)",
                                     path, DP_SECRET_MAX, 2 * DP_SECRET_MAX)
                           : from_text(out, buf, n, path, err);
    sodium_memzero(buf, sizeof buf);
    return rc;
}

int dp_secret_generate(dp_secret *out, char *hex, size_t hex_cap, dp_err *err)
{
    if (sodium_init() < 0)
        return dp_errf(err, "libsodium failed to initialise");
    if (hex && hex_cap < 2 * DP_SECRET_GEN + 1)
        return dp_errf(err, "hex buffer of %zu bytes, %d needed", hex_cap, 2 * DP_SECRET_GEN + 1);
    memset(out, 0, sizeof *out);
    randombytes_buf(out->bytes, DP_SECRET_GEN);
    out->len = DP_SECRET_GEN;
    if (hex)
        sodium_bin2hex(hex, hex_cap, out->bytes, out->len);
    return 0;
}

void dp_secret_wipe(dp_secret *s) { sodium_memzero(s, sizeof *s); }
