/* What the two decoded cache formats share (docs/datasets.md, "The cache"):
 * little-endian fields, the dataset hash, where a cache lives and the lock
 * its builders queue on.  The IDX datasets' format is in dataset.c, the
 * record files' in dataset_files.c.  Private to src/data. */
#ifndef DOWNPOUR_DATA_CACHE_H
#define DOWNPOUR_DATA_CACHE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#define DP_CACHE_MAGIC "DPCACHE\x1a"
#define DP_CACHE_HASH_SEED 0xcbf29ce484222325ULL /* FNV-1a's offset basis */

static inline void dp_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void dp_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t dp_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t dp_get64(const uint8_t *p)
{
    return (uint64_t)dp_get32(p) | (uint64_t)dp_get32(p + 4) << 32;
}

/* FNV-1a of n bytes chained onto h (start from DP_CACHE_HASH_SEED).  To
 * hash several strings, include each one's NUL, so ("ab", "c") and ("a",
 * "bc") differ. */
uint64_t dp_cache_hash(uint64_t h, const void *p, size_t n);

/* snprintf for diagnostics; 0, or -1 when the text did not fit (it is cut). */
int dp_cache_fmt(char *buf, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));

/* Where a cache is read and written.  primary: $DOWNPOUR_CACHE/<shared_name>
 * if the variable is set; else <data_dir>/<in_dir_name> if data_dir is
 * writable; else $XDG_CACHE_HOME/downpour/<shared_name> or
 * ~/.cache/downpour/<shared_name> ("" if none can be made).  fallback: in
 * that last case, <data_dir>/<in_dir_name>, a cache that may be read but not
 * replaced ("" otherwise). */
void dp_cache_paths(const char *data_dir, const char *in_dir_name, const char *shared_name,
                    char *primary, char *fallback, size_t cap);

/* Takes an exclusive flock on "<cache>.lock"; returns its fd, or -1 when no
 * lock can be had (builders racing without it are still safe: each
 * publishes a whole file atomically).  The lock is the inode at the path:
 * one taken on a file since unlinked is dropped and taken again. */
int dp_cache_lock(const char *cache);
/* Unlinks "<cache>.lock" while still holding it, then closes fd, so no lock
 * file stays beside the user's data; a waiter then holds an unlinked inode,
 * which dp_cache_lock sees and takes the lock again on a new file.  fd < 0:
 * nothing. */
void dp_cache_unlock(const char *cache, int fd);

/* What a check of a cache file found. */
typedef enum dp_cache_state {
    DP_CACHE_OK,
    DP_CACHE_ABSENT,
    DP_CACHE_STALE,  /* its sources changed: rebuilt quietly */
    DP_CACHE_CORRUPT /* a check failed: rebuilt with a warning */
} dp_cache_state;

/* Opens the cache file at path read-only and stats it: DP_CACHE_OK with *fd
 * open, DP_CACHE_ABSENT when there is none, DP_CACHE_CORRUPT with why. */
dp_cache_state dp_cache_open(const char *path, int *fd, struct stat *st, char *why, size_t whylen);

/* Checks the cache at path; on DP_CACHE_OK the caller's ctx holds it open,
 * otherwise why says what is wrong. */
typedef dp_cache_state (*dp_cache_try_fn)(void *ctx, const char *path, char *why, size_t whylen);

/* Finds a valid cache, both formats alike: the read-only fallback first,
 * then the primary, queuing on the primary's lock before a second look when
 * it is not valid, so processes started together decode once (the ones that
 * waited find the new cache).  1: found, its path in found; 0: the caller
 * builds and publishes at primary (if any), then closes *lock (-1 when no
 * lock was had).  A cache passed over is named with the reason. */
int dp_cache_find(const char *primary, const char *fallback, dp_cache_try_fn try_cache, void *ctx,
                  char *found, size_t cap, int *lock);

#endif
