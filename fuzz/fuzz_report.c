/* libFuzzer target for reading metrics files into a report (src/io/report.c)
 * and drawing the page (src/io/svg.c): any file contents must give either a
 * run, whose page is then written, or a refusal that names the file; never
 * a crash, an out-of-bounds access, a leak or a hang.  The bytes go to a
 * memfd each run and are read back through its /proc path, as a file; the
 * page goes to a scratch file that each run replaces. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "downpour/log.h"
#include "downpour/report.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int memfd = -1;
static char path[64], out[128];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 20)
        return 0;
    if (memfd < 0) {
        memfd = memfd_create("fuzz_report", MFD_CLOEXEC);
        if (memfd < 0)
            abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
        snprintf(out, sizeof out, "/tmp/fuzz_report.%d.html", (int)getpid());
        dp_log_set_level(DP_LOG_ERROR); /* a torn last line warns on every run */
    }
    if (ftruncate(memfd, 0) != 0 || (size && pwrite(memfd, data, size, 0) != (ssize_t)size))
        abort();
    dp_report *r;
    dp_err err;
    if (dp_report_open(&r, "fuzz", &err) != 0)
        abort();
    err.msg[0] = '\0';
    if (dp_report_add_run(r, path, NULL, &err) != 0) {
        if (strstr(err.msg, path) == NULL)
            abort(); /* a refusal names the file */
    } else if (dp_report_write(r, out, &err) != 0) {
        abort();
    }
    dp_report_free(r);
    return 0;
}
