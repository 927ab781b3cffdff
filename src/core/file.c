/* Whole writes, atomic replace and output-path checks (see file.h). */
#include "downpour/file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "downpour/log.h"

#define WRITE_CHUNK ((size_t)1 << 30) /* Linux writes at most ~2 GiB at once */
#define TMP_TRIES 100

int dp_write_all(int fd, const void *buf, size_t len, dp_err *err)
{
    const unsigned char *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len > WRITE_CHUNK ? WRITE_CHUNK : len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct pollfd pf = {.fd = fd, .events = POLLOUT};
                if (poll(&pf, 1, -1) < 0 && errno != EINTR)
                    return dp_errf(err, "write: poll: %s", strerror(errno));
                continue;
            }
            int e = errno;
            dp_errf(err, "write: %s", strerror(e));
            errno = e;
            return -1;
        }
        if (w == 0) {
            errno = EIO;
            return dp_errf(err, "write: wrote nothing (%s)", strerror(EIO));
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* The directory holding path: "." for a bare name, "/" for "/name".  malloc'd. */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    while (slash > path && slash[-1] == '/')
        slash--;
    if (slash == path)
        return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

static const char *kind_of(mode_t m)
{
    return S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

/* -1 when path exists and is neither a regular file nor a link: the atomic
 * replace renames over path, which would swap a device node (/dev/full, as
 * root) for a plain file instead of writing into it. */
static int not_replaceable(const char *path, const char *what, dp_err *err)
{
    struct stat st;
    if (lstat(path, &st) < 0 || S_ISREG(st.st_mode) || S_ISLNK(st.st_mode) ||
        S_ISDIR(st.st_mode)) /* a directory: the rename fails, and says so */
        return 0;
    return dp_errf(err, "%s%s%s: is %s; it would be replaced by a new file, not written "
                   "into. Hint: name a regular file", what, *what ? " " : "", path,
                   kind_of(st.st_mode));
}

static void atomic_clear(dp_atomic_file *af)
{
    free(af->path);
    free(af->tmp);
    af->fd = -1;
    af->path = NULL;
    af->tmp = NULL;
}

int dp_atomic_open(dp_atomic_file *af, const char *path, dp_err *err)
{
    static atomic_uint counter;
    af->fd = -1;
    af->path = NULL;
    af->tmp = NULL;
    if (!path || !*path)
        return dp_errf(err, "atomic write: no path");
    if (not_replaceable(path, "", err) < 0)
        return -1;
    size_t cap = strlen(path) + 48;
    af->path = strdup(path);
    af->tmp = malloc(cap);
    if (!af->path || !af->tmp) {
        atomic_clear(af);
        return dp_errf(err, "%s: out of memory", path);
    }
    /* O_EXCL with a fresh name, so a stale temporary of a crashed process
     * with the same pid is stepped over, never written through; the name's
     * form is what dp_atomic_temp_parse recognises. */
    for (int i = 0; i < TMP_TRIES; i++) {
        snprintf(af->tmp, cap, "%s.tmp.%ld.%u", path, (long)getpid(),
                 atomic_fetch_add(&counter, 1u));
        af->fd = open(af->tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (af->fd >= 0)
            return 0;
        if (errno != EEXIST)
            break;
    }
    int e = errno;
    dp_errf(err, "%s: cannot create the temporary file %s: %s", path, af->tmp, strerror(e));
    atomic_clear(af);
    errno = e;
    return -1;
}

void dp_atomic_abort(dp_atomic_file *af)
{
    if (!af)
        return;
    if (af->fd >= 0)
        close(af->fd);
    if (af->tmp)
        unlink(af->tmp);
    atomic_clear(af);
}

/* The digits of a decimal number starting at s (at least one, no sign):
 * the count, with the value in *v (saturating). */
static size_t digits(const char *s, long *v)
{
    size_t n = 0;
    long x = 0;
    for (; s[n] >= '0' && s[n] <= '9'; n++)
        x = x > (LONG_MAX - 9) / 10 ? LONG_MAX : x * 10 + (s[n] - '0');
    *v = x;
    return n;
}

int dp_atomic_temp_parse(const char *name, size_t *base_len, long *pid)
{
    /* the last ".tmp." is the one dp_atomic_open appended */
    const char *tag = NULL;
    for (const char *p = strstr(name, ".tmp."); p; p = strstr(p + 1, ".tmp."))
        tag = p;
    if (!tag || tag == name)
        return 0;
    long p, n;
    const char *s = tag + 5;
    size_t np = digits(s, &p);
    if (np == 0 || s[np] != '.')
        return 0;
    size_t nn = digits(s + np + 1, &n);
    if (nn == 0 || s[np + 1 + nn] != '\0')
        return 0;
    *base_len = (size_t)(tag - name);
    *pid = p;
    return 1;
}

/* fsync of a directory, so a rename in it is durable.  Filesystems that
 * cannot sync a directory (EINVAL, ENOTSUP) are not an error. */
static int sync_dir(const char *dir, dp_err *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dp_errf(err, "cannot open directory %s to sync it: %s", dir, strerror(errno));
    int rc = 0;
    if (fsync(fd) < 0 && errno != EINVAL && errno != ENOTSUP)
        rc = dp_errf(err, "fsync of directory %s: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

int dp_atomic_commit(dp_atomic_file *af, dp_err *err)
{
    if (!af || af->fd < 0 || !af->tmp)
        return dp_errf(err, "atomic write: commit without an open file");
    if (fsync(af->fd) < 0) {
        dp_errf(err, "%s: fsync of %s: %s", af->path, af->tmp, strerror(errno));
        dp_atomic_abort(af);
        return -1;
    }
    int fd = af->fd;
    af->fd = -1;
    if (close(fd) < 0) {
        dp_errf(err, "%s: closing %s: %s", af->path, af->tmp, strerror(errno));
        dp_atomic_abort(af);
        return -1;
    }
    if (rename(af->tmp, af->path) < 0) {
        dp_errf(err, "%s: cannot rename %s over it: %s", af->path, af->tmp, strerror(errno));
        dp_atomic_abort(af);
        return -1;
    }
    free(af->tmp);
    af->tmp = NULL; /* renamed: nothing left to remove */
    char *dir = dir_of(af->path);
    dp_err derr;
    if (!dir)
        dp_warn("%s: out of memory syncing its directory; the file is in place", af->path);
    else if (sync_dir(dir, &derr) < 0)
        dp_warn("%s: %s; the file is in place but may not survive a crash", af->path, derr.msg);
    free(dir);
    atomic_clear(af);
    return 0;
}

int dp_file_replace(const char *path, const void *buf, size_t len, dp_err *err)
{
    dp_atomic_file af;
    if (dp_atomic_open(&af, path, err) < 0)
        return -1;
    if (dp_write_all(af.fd, buf, len, err) < 0) {
        dp_err_prefix(err, "%s: writing %s", path, af.tmp);
        dp_atomic_abort(&af);
        return -1;
    }
    return dp_atomic_commit(&af, err);
}

/* A writable directory: exists, is a directory, and we may create files in it. */
static int check_dir(const char *dir, const char *what, const char *path, dp_err *err)
{
    struct stat st;
    if (stat(dir, &st) < 0) {
        if (errno == ENOENT)
            return dp_errf(err, "%s %s: directory %s does not exist", what, path, dir);
        return dp_errf(err, "%s %s: directory %s: %s", what, path, dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return dp_errf(err, "%s %s: %s is not a directory", what, path, dir);
    if (access(dir, W_OK | X_OK) < 0)
        return dp_errf(err, "%s %s: directory %s is not writable: %s", what, path, dir,
                       strerror(errno));
    return 0;
}

int dp_path_check_writable(const char *path, const char *what, dp_err *err)
{
    if (!what)
        what = "output";
    if (!path || !*path)
        return dp_errf(err, "%s: empty path", what);
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            return dp_errf(err, "%s %s: is a directory. Hint: name a file in it", what, path);
        if (access(path, W_OK) < 0)
            return dp_errf(err, "%s %s: exists and is not writable: %s", what, path,
                           strerror(errno));
    }
    char *dir = dir_of(path);
    if (!dir)
        return dp_errf(err, "%s %s: out of memory", what, path);
    int rc = check_dir(dir, what, path, err);
    free(dir);
    return rc;
}

int dp_path_check_replaceable(const char *path, const char *what, dp_err *err)
{
    if (dp_path_check_writable(path, what, err) < 0)
        return -1;
    return not_replaceable(path, what ? what : "output", err);
}

int dp_dir_prepare(const char *dir, const char *what, dp_err *err)
{
    if (!what)
        what = "directory";
    if (!dir || !*dir)
        return dp_errf(err, "%s: empty path", what);
    char *p = strdup(dir);
    if (!p)
        return dp_errf(err, "%s %s: out of memory", what, dir);
    /* mkdir -p: each prefix ending before a '/', then the whole path. */
    int rc = 0;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char c = *s;
        *s = '\0';
        struct stat st;
        if (mkdir(p, 0755) < 0 && errno != EEXIST) {
            rc = dp_errf(err, "%s %s: cannot create %s: %s", what, dir, p, strerror(errno));
            break;
        }
        if (stat(p, &st) < 0) {
            rc = dp_errf(err, "%s %s: %s: %s", what, dir, p, strerror(errno));
            break;
        }
        if (!S_ISDIR(st.st_mode)) {
            rc = dp_errf(err, "%s %s: %s is a file, not a directory", what, dir, p);
            break;
        }
        *s = c;
        if (c == '\0')
            break;
        while (s[1] == '/')
            s++;
    }
    free(p);
    if (rc == 0 && access(dir, W_OK | X_OK) < 0)
        rc = dp_errf(err, "%s %s: directory is not writable: %s", what, dir, strerror(errno));
    return rc;
}
