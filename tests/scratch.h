/* A private scratch directory for a test: made under DOWNPOUR_TEST_TMP (or
 * /tmp), removed with everything in it when the test passed. */
#ifndef DOWNPOUR_TEST_SCRATCH_H
#define DOWNPOUR_TEST_SCRATCH_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "check.h"

static inline void scratch_make(char *dir, size_t cap, const char *name)
{
    const char *t = getenv("DOWNPOUR_TEST_TMP");
    if (t && *t) {
        mkdir(t, 0755);
        snprintf(dir, cap, "%s/%s.XXXXXX", t, name);
    } else {
        snprintf(dir, cap, "/tmp/%s.XXXXXX", name);
    }
    REQUIRE(mkdtemp(dir) != NULL);
}

static inline int scratch_rm_entry(const char *path, const struct stat *st, int flag,
                                   struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static inline void scratch_remove(const char *dir)
{
    nftw(dir, scratch_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A whole file, read or written; any failure ends the test. */
static inline void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f != NULL);
    REQUIRE(n == 0 || fwrite(p, 1, n, f) == n);
    REQUIRE(fclose(f) == 0);
}

static inline unsigned char *read_bytes(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    REQUIRE(f != NULL);
    REQUIRE(fseek(f, 0, SEEK_END) == 0);
    long len = ftell(f);
    REQUIRE(len >= 0);
    rewind(f);
    unsigned char *p = malloc((size_t)len + 1);
    REQUIRE(p != NULL);
    REQUIRE(fread(p, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return p;
}

#endif
