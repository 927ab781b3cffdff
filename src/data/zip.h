/* ZIP archives as NumPy writes them (.npz): the central directory, ZIP64,
 * and members stored or deflated, read through a caller's file descriptor.
 * Private to src/data (npy.c is its one user).
 *
 * What is read, in order, each field checked before it is used:
 *   1. the end record (its comment must reach exactly to the end of the file);
 *   2. the ZIP64 locator and end record where present (numpy writes them for
 *      archives past 4 GiB or 65,535 members);
 *   3. the central directory, which must end where the end records begin (an
 *      archive with bytes prepended, such as a self-extractor, is refused);
 *      sizes and offsets of 0xFFFFFFFF come from each entry's ZIP64 extra field;
 *   4. on opening a member, its local header: signature, the same name and
 *      method as the directory says, and its data inside the archive.
 * Sizes and CRCs are taken from the central directory, never the local header
 * (numpy writes every local header in ZIP64 form with sizes 0xFFFFFFFF). */
#ifndef DOWNPOUR_DATA_ZIP_H
#define DOWNPOUR_DATA_ZIP_H

#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

#include "downpour/status.h"

/* The central directory is read whole: 16 MiB holds ~250,000 member names. */
#define DP_ZIP_MAX_DIR ((uint64_t)16 << 20)

enum { DP_ZIP_STORED = 0, DP_ZIP_DEFLATED = 8 };

typedef struct dp_zip_entry {
    char *name;          /* NUL-terminated (a name holding a NUL byte is refused) */
    uint64_t size;       /* uncompressed bytes */
    uint64_t csize;      /* compressed bytes */
    uint64_t local_off;  /* offset of the local header */
    uint32_t crc;        /* CRC-32 of the uncompressed bytes */
    uint16_t method;     /* DP_ZIP_STORED, DP_ZIP_DEFLATED, or another (refused on open) */
    uint16_t flags;
} dp_zip_entry;

typedef struct dp_zip {
    dp_zip_entry *e;
    size_t n;
    uint64_t cd_off;     /* member data must end before the central directory */
} dp_zip;

/* Reads the directory of the archive open on fd (file_size bytes); path names
 * it in messages.  On failure z is left empty. */
int dp_zip_read_dir(dp_zip *z, int fd, uint64_t file_size, const char *path, dp_err *err);
void dp_zip_free(dp_zip *z);

/* The entry named `name`, or else `name` + ".npy" (numpy's keys drop the
 * suffix); NULL with a message listing the members when there is none, or
 * when the name appears twice. */
const dp_zip_entry *dp_zip_find(const dp_zip *z, const char *name, const char *path, dp_err *err);

/* The members' names (".npy" dropped) as "a, b, c" or "a, b, ...", for
 * messages; buf holds cap >= 16 bytes. */
void dp_zip_describe(const dp_zip *z, char *buf, size_t cap);

/* One member open for reading at any uncompressed offset.  A stored member is
 * read with pread at its offset.  A deflated member is inflated in order: a
 * read ahead of the position inflates and discards up to it, a read behind it
 * starts again from the member's first byte; the buffers are 64 KiB each,
 * whatever the member's size.  The CRC-32 is checked whenever the member has
 * been read in order through to its end (always so for a deflated member read
 * to the end; a stored member read in pieces out of order goes unchecked). */
typedef struct dp_zip_member {
    int fd;
    const char *where;   /* "<path> (member <name>)", owned by the caller */
    dp_zip_entry e;      /* a copy; e.name is not owned */
    uint64_t data_off;   /* file offset of the member's data */
    uint32_t crc;        /* over bytes [0, crc_pos) */
    uint64_t crc_pos;
    /* deflated members only */
    z_stream zs;
    int zs_live;
    uint8_t *in, *skip;
    uint64_t in_pos;     /* compressed bytes fed to zlib */
    uint64_t out_pos;    /* uncompressed bytes produced */
} dp_zip_member;

int dp_zip_member_open(dp_zip_member *m, int fd, const dp_zip *z, const dp_zip_entry *e,
                       const char *where, dp_err *err);
/* Exactly n bytes from uncompressed offset off (off + n <= size), or -1. */
int dp_zip_member_pread(dp_zip_member *m, void *buf, size_t n, uint64_t off, dp_err *err);
void dp_zip_member_close(dp_zip_member *m);

#endif
