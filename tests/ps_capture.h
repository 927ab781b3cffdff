/* A parameter server's poll with its stderr captured, for tests that check
 * what it says when it drops a worker (test_ps_sparse, test_ps_compress). */
#ifndef DP_TEST_PS_CAPTURE_H
#define DP_TEST_PS_CAPTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "downpour/ps.h"

/* One dp_ps_server_poll with stderr in `captured` (cap bytes, terminated),
 * which is also echoed to stderr for the test's log. */
static int ps_poll_captured(dp_ps_server *s, char *captured, size_t cap, dp_err *err)
{
    fflush(stderr);
    char path[] = "/tmp/dp_test_ps_capture_XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    REQUIRE(fd >= 0 && saved >= 0);
    dup2(fd, 2);
    int rc = dp_ps_server_poll(s, 0, err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, captured, cap - 1);
    captured[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    fputs(captured, stderr);
    return rc;
}

#endif
