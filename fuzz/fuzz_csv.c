/* libFuzzer target for the CSV reader (src/data/csv.c).  Byte 0 is the
 * configuration, the rest the file:
 *   bit 0: no header;  bits 1-2: the label column by default, by the name
 *   "label", by the name "b", or by index byte 1 % 4;  bit 3: ';' instead of
 *   ','  bit 4: max_record 64 bytes (else 1 MiB);  classes: byte 2 % 16 + 1.
 * Any bytes must give rows whose labels are below the class count and whose
 * features are finite, or a refusal naming the file; after a rewind the
 * first row reads the same again.  Never a crash, an out-of-bounds access, a
 * leak, or a hang.  The file is a memfd read back through its /proc path. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "downpour/csv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int memfd = -1;
static char path[64];

static void must_name_file(const dp_err *err)
{
    if (strstr(err->msg, path) == NULL)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3 || size > 1 << 20)
        return 0;
    if (memfd < 0) {
        memfd = memfd_create("fuzz_csv", MFD_CLOEXEC);
        if (memfd < 0)
            abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
    }
    size_t n = size - 3;
    if (ftruncate(memfd, 0) != 0 || (n && pwrite(memfd, data + 3, n, 0) != (ssize_t)n))
        abort();
    dp_csv_config cfg;
    dp_csv_config_default(&cfg);
    uint8_t m = data[0];
    cfg.header = !(m & 1);
    switch ((m >> 1) & 3) {
    case 1: cfg.label = "label"; break;
    case 2: cfg.label = "b"; break;
    case 3: cfg.label_column = data[1] % 4; break;
    default: break;
    }
    if (m & 8)
        cfg.delimiter = ';';
    if (m & 16)
        cfg.max_record = 64;
    cfg.classes = (uint32_t)(data[2] % 16) + 1;

    dp_csv *c = NULL;
    dp_err err = {{0}};
    if (dp_csv_open(&c, path, &cfg, &err) != 0) {
        if (c != NULL)
            abort();
        must_name_file(&err);
        return 0;
    }
    size_t nf = dp_csv_features(c);
    if (nf + 1 != dp_csv_columns(c) || dp_csv_label_column(c) >= dp_csv_columns(c) ||
        dp_csv_column_name(c, nf) == NULL || dp_csv_column_name(c, nf + 1) != NULL)
        abort();
    /* A record of at most max_record bytes holds at most that many + 1 fields. */
    float *f = malloc((nf + 1) * sizeof *f), first[8];
    if (!f)
        abort();
    uint32_t label, first_label = 0;
    size_t rows = 0;
    int r;
    uint64_t last_line = 0;
    while ((r = dp_csv_next(c, f, &label, &err)) == 1) {
        if (label >= cfg.classes || dp_csv_line(c) <= last_line)
            abort();
        last_line = dp_csv_line(c);
        for (size_t i = 0; i < nf; i++)
            if (!isfinite(f[i]))
                abort();
        if (rows++ == 0) {
            first_label = label;
            memcpy(first, f, (nf < 8 ? nf : 8) * sizeof *f);
        }
    }
    if (r < 0)
        must_name_file(&err);
    if (rows > 0) {
        if (dp_csv_rewind(c, &err) != 0 || dp_csv_next(c, f, &label, &err) != 1)
            abort();
        if (label != first_label || memcmp(first, f, (nf < 8 ? nf : 8) * sizeof *f) != 0)
            abort();
    }
    free(f);
    dp_csv_close(c);
    return 0;
}
