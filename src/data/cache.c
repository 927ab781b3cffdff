/* The decoded caches' shared mechanics: the hash, the locations, the lock
 * (cache.h). */
#include "cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "downpour/log.h"

uint64_t dp_cache_hash(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

int dp_cache_fmt(char *buf, size_t cap, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(buf, cap, f, ap);
    va_end(ap);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* mkdir -p; returns 0 when path is a directory afterwards. */
static int mkdir_p(const char *path)
{
    char buf[1100];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return -1;
    struct stat st;
    if (stat(buf, &st) != 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

void dp_cache_paths(const char *data_dir, const char *in_dir_name, const char *shared_name,
                    char *primary, char *fallback, size_t cap)
{
    primary[0] = fallback[0] = '\0';
    char in_dir[1200];
    int in_dir_ok = dp_cache_fmt(in_dir, sizeof in_dir, "%s/%s", data_dir, in_dir_name) == 0 &&
                    strlen(in_dir) < cap;

    char shared[1100] = "";
    int shared_ok = 1;
    const char *env = getenv("DOWNPOUR_CACHE");
    if (env && *env) {
        shared_ok = dp_cache_fmt(shared, sizeof shared, "%s", env) == 0;
    } else if (in_dir_ok && access(data_dir, W_OK) == 0) {
        dp_cache_fmt(primary, cap, "%s", in_dir);
        return;
    } else {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && *xdg)
            shared_ok = dp_cache_fmt(shared, sizeof shared, "%s/downpour", xdg) == 0;
        else if (home && *home)
            shared_ok = dp_cache_fmt(shared, sizeof shared, "%s/.cache/downpour", home) == 0;
        if (in_dir_ok)
            dp_cache_fmt(fallback, cap, "%s", in_dir);
    }
    if (!shared_ok)
        shared[0] = '\0';
    if (!shared[0])
        return;
    if (mkdir_p(shared) != 0) {
        dp_warn("cannot create cache directory %s: %s", shared, strerror(errno));
        return;
    }
    if (dp_cache_fmt(primary, cap, "%s/%s", shared, shared_name) != 0)
        primary[0] = '\0';
}

int dp_cache_lock(const char *cache)
{
    char path[1200];
    if (dp_cache_fmt(path, sizeof path, "%s.lock", cache) != 0)
        return -1;
    for (;;) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return -1;
        while (flock(fd, LOCK_EX) != 0) {
            if (errno != EINTR) {
                close(fd);
                return -1;
            }
        }
        /* The holder before us may have unlinked the file it held (and a
         * third may have made a new one): only the inode at the path counts. */
        struct stat held, now;
        if (fstat(fd, &held) == 0 && stat(path, &now) == 0 && held.st_dev == now.st_dev &&
            held.st_ino == now.st_ino)
            return fd;
        close(fd);
    }
}

void dp_cache_unlock(const char *cache, int fd)
{
    if (fd < 0)
        return;
    char path[1200];
    if (dp_cache_fmt(path, sizeof path, "%s.lock", cache) == 0)
        (void)unlink(path); /* a file we cannot remove only stays behind */
    close(fd);
}

int dp_cache_find(const char *primary, const char *fallback, dp_cache_try_fn try_cache, void *ctx,
                  char *found, size_t cap, int *lock)
{
    char why[600];
    *lock = -1;
    if (fallback[0]) {
        dp_cache_state st = try_cache(ctx, fallback, why, sizeof why);
        if (st == DP_CACHE_OK) {
            dp_cache_fmt(found, cap, "%s", fallback);
            return 1;
        }
        /* Read-only here: it cannot be replaced, so the primary one is used. */
        if (st == DP_CACHE_CORRUPT)
            dp_warn("dataset cache %s is unusable (%s); using %s instead", fallback, why,
                    primary[0] ? primary : "the decoded sources");
    }
    if (!primary[0])
        return 0;
    dp_cache_state st = try_cache(ctx, primary, why, sizeof why);
    if (st != DP_CACHE_OK) {
        /* Without a lock (a filesystem that refuses flock) racing builders
         * are still safe: each publishes a whole file atomically. */
        *lock = dp_cache_lock(primary);
        if (*lock >= 0)
            st = try_cache(ctx, primary, why, sizeof why);
    }
    if (st == DP_CACHE_OK) {
        dp_cache_unlock(primary, *lock);
        *lock = -1;
        dp_cache_fmt(found, cap, "%s", primary);
        return 1;
    }
    if (st == DP_CACHE_STALE)
        dp_info("dataset cache %s is out of date (%s); rebuilding", primary, why);
    else if (st == DP_CACHE_CORRUPT)
        dp_warn("dataset cache %s is unusable (%s); rebuilding", primary, why);
    return 0;
}

dp_cache_state dp_cache_open(const char *path, int *fd, struct stat *st, char *why, size_t whylen)
{
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0) {
        if (errno == ENOENT)
            return DP_CACHE_ABSENT;
        dp_cache_fmt(why, whylen, "cannot open it: %s", strerror(errno));
        return DP_CACHE_CORRUPT;
    }
    if (fstat(*fd, st) != 0) {
        dp_cache_fmt(why, whylen, "cannot stat it: %s", strerror(errno));
        close(*fd);
        *fd = -1;
        return DP_CACHE_CORRUPT;
    }
    return DP_CACHE_OK;
}
