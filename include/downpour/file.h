/* Files: the one place that writes whole buffers, replaces a file atomically,
 * and checks output paths before a run spends hours training.
 *
 * Atomic replace: the new contents go to a temporary file in the same
 * directory ("<path>.tmp.<pid>.<n>", created with O_EXCL and mode 0644 less
 * the umask), which is fsynced, closed and renamed over path, and then the
 * directory is fsynced so the rename itself survives a crash.  A reader sees
 * the old file or the new one, never a torn one; a failed write removes the
 * temporary file.
 *
 *   dp_atomic_file af;
 *   if (dp_atomic_open(&af, path, err) < 0) return -1;
 *   if (dp_write_all(af.fd, head, n, err) < 0) { dp_atomic_abort(&af); return -1; }
 *   return dp_atomic_commit(&af, err);     (commit or abort frees af either way) */
#ifndef DOWNPOUR_FILE_H
#define DOWNPOUR_FILE_H

#include <stddef.h>

#include "downpour/status.h"

/* Writes all len bytes to fd: EINTR is retried, a short write continues, and
 * a non-blocking fd that is full (EAGAIN) is waited on with poll.  Returns 0,
 * or -1 with errno kept and err (may be NULL) holding "write: <strerror>". */
int dp_write_all(int fd, const void *buf, size_t len, dp_err *err);

typedef struct dp_atomic_file {
    int fd;     /* write the new contents here (opened read-write, so it can be mapped) */
    char *path; /* the file being replaced */
    char *tmp;  /* the temporary file in the same directory */
} dp_atomic_file;

/* Creates the temporary file for replacing path.  On failure af is left
 * empty (fd -1) and needs no abort.  An existing path that is a device
 * (such as /dev/full), a FIFO or a socket is refused: the rename would
 * replace it, not write into it. */
int dp_atomic_open(dp_atomic_file *af, const char *path, dp_err *err);

/* fsync, close, rename over path, fsync the directory.  Returns 0 once the
 * new file is in place (a directory that cannot be synced only draws a
 * warning: the rename has happened); -1 with the old file untouched and the
 * temporary removed.  Frees af either way. */
int dp_atomic_commit(dp_atomic_file *af, dp_err *err);

/* Closes and removes the temporary file; path is untouched.  Safe on an
 * empty or already finished af. */
void dp_atomic_abort(dp_atomic_file *af);

/* Whether the file name `name` (no directory) is a temporary file of
 * dp_atomic_open, "<base>.tmp.<pid>.<n>" in decimal: 1 with *base_len (the
 * length of <base>) and *pid set, else 0.  A process killed while writing
 * leaves one behind; whoever owns the directory's files may remove them. */
int dp_atomic_temp_parse(const char *name, size_t *base_len, long *pid);

/* Replaces path with buf (len bytes) atomically: open, write, commit. */
int dp_file_replace(const char *path, const void *buf, size_t len, dp_err *err);

/* Checks, before a run, that path can be written later: its directory
 * exists and is writable, and path is not a directory (nor an existing file
 * that is read-only).  `what` names the flag in the message:
 *   "--save /nonexistent/m.safetensors: directory /nonexistent does not exist" */
int dp_path_check_writable(const char *path, const char *what, dp_err *err);

/* dp_path_check_writable for a file that will be replaced atomically
 * (--save): an existing path must also not be a device, FIFO or socket, as
 * dp_atomic_open requires. */
int dp_path_check_replaceable(const char *path, const char *what, dp_err *err);

/* Makes dir (and missing parents, as mkdir -p, mode 0755 less the umask)
 * and checks it is a writable directory; refuses a path that is a file.
 * `what` names the flag in the message. */
int dp_dir_prepare(const char *dir, const char *what, dp_err *err);

#endif
