/* libFuzzer target for the IDX reader (src/data/idx.c), raw and gzip: any
 * file contents must give either a tensor whose shape is valid (rank 1..4,
 * no zero dimension) and whose data is exactly as long as the shape says, or
 * a refusal that names the file; never a crash, an out-of-bounds read, a
 * leak, or an allocation sized from the header alone.  The bytes are written
 * to a memfd each run and read back through its /proc path, as a file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "downpour/idx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int memfd = -1;
static char path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 20)
        return 0;
    if (memfd < 0) {
        memfd = memfd_create("fuzz_idx", MFD_CLOEXEC);
        if (memfd < 0)
            abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
    }
    if (ftruncate(memfd, 0) != 0 || (size && pwrite(memfd, data, size, 0) != (ssize_t)size))
        abort();
    dp_idx idx;
    dp_err err;
    err.msg[0] = '\0';
    if (dp_idx_read(path, &idx, &err) != 0) {
        if (idx.data != NULL || strstr(err.msg, path) == NULL)
            abort(); /* a refusal leaves nothing behind and names the file */
        return 0;
    }
    if (idx.ndim < 1 || idx.ndim > 4 || !idx.data)
        abort();
    uint64_t n = 1;
    for (int i = 0; i < idx.ndim; i++) {
        if (idx.dims[i] == 0)
            abort();
        n *= idx.dims[i];
    }
    if (n != idx.len)
        abort();
    /* Every byte is read, so ASan sees a buffer shorter than len. */
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < idx.len; i++)
        sink ^= idx.data[i];
    (void)sink;
    dp_idx_free(&idx);
    if (idx.data != NULL || idx.len != 0)
        abort();
    return 0;
}
