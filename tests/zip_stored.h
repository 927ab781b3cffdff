/* Tests that build .npz files: a stored (numpy.savez) ZIP archive of
 * members, byte by byte (bytes.h). */
#ifndef DOWNPOUR_TEST_ZIP_STORED_H
#define DOWNPOUR_TEST_ZIP_STORED_H

#include <zlib.h>

#include "bytes.h"

/* The archive of the n members (names[i]: data[i]); free its .p. */
static inline bytes zip_stored(const char *const *names, const bytes *data, int n)
{
    bytes z = {0}, cd = {0};
    for (int i = 0; i < n; i++) {
        uint32_t len = (uint32_t)data[i].n, off = (uint32_t)z.n;
        uint32_t crc = (uint32_t)crc32(0, data[i].p, (uInt)len);
        uint16_t nl = (uint16_t)strlen(names[i]);
        put32(&z, 0x04034b50), put16(&z, 20), put16(&z, 0), put16(&z, 0);
        put16(&z, 0), put16(&z, 0x21), put32(&z, crc);
        put32(&z, len), put32(&z, len), put16(&z, nl), put16(&z, 0);
        put(&z, names[i], nl), put(&z, data[i].p, len);
        put32(&cd, 0x02014b50), put16(&cd, 20), put16(&cd, 20), put16(&cd, 0);
        put16(&cd, 0), put16(&cd, 0), put16(&cd, 0x21), put32(&cd, crc);
        put32(&cd, len), put32(&cd, len), put16(&cd, nl), put16(&cd, 0), put16(&cd, 0);
        put16(&cd, 0), put16(&cd, 0), put32(&cd, 0), put32(&cd, off);
        put(&cd, names[i], nl);
    }
    uint32_t cd_off = (uint32_t)z.n, cd_len = (uint32_t)cd.n;
    put(&z, cd.p, cd.n);
    free(cd.p);
    put32(&z, 0x06054b50), put16(&z, 0), put16(&z, 0);
    put16(&z, (uint32_t)n), put16(&z, (uint32_t)n);
    put32(&z, cd_len), put32(&z, cd_off), put16(&z, 0);
    return z;
}

#endif
