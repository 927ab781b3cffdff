/* libFuzzer target for the TFRecord reader and writer (src/data/tfrecord.c).
 *
 * Byte 0 chooses:
 *   bits 0-1  the reader's compression: 1 RAW, 2 GZIP, 0 or 3 AUTO
 *   bit 2     a record limit of 100 bytes instead of the default
 *   bit 3     framed mode: the harness writes the file with the writer
 *   bit 4     (framed) gzip the file
 *   bit 5     (framed) xor one byte of the file
 *   bit 6     (framed) cut the file
 * Raw mode: the rest is the file.  Framed mode: bytes 1-2 are the damage's
 * offset (little-endian, modulo the file's length + 1), byte 3 the xor value
 * (0 counts as 1), and the rest the records, each a length byte and that many
 * bytes (the last one shorter if the input ends).
 *
 * Always: a refusal names the file and the index of the record being read
 * (the count of records returned), and every byte of every record returned
 * is read (so ASan sees a short buffer).  Framed and read with the right
 * compression, a file must give exactly the records written; one byte
 * changed in a raw file must be refused at the record holding it, after the
 * records before it came back intact; a raw file cut at a record boundary
 * gives the records before it, cut anywhere else is refused at the cut
 * record; a gzip file cut short is refused, and a damaged gzip file is
 * refused or gives exactly the records written.  The bytes are read through
 * a memfd; the writer writes into a scratch directory in /dev/shm. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "downpour/tfrecord.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_RECORDS 4096
#define SMALL_LIMIT 100

static int memfd = -1;
static char path[64];
static char scratch[256], wpath[300];

static void cleanup(void)
{
    unlink(wpath);
    rmdir(scratch);
}

static void setup(void)
{
    memfd = memfd_create("fuzz_tfrecord", MFD_CLOEXEC);
    if (memfd < 0)
        abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(scratch, sizeof scratch, "%s/fuzz_tfrecord.%d", base, (int)getpid());
    if (mkdir(scratch, 0700) != 0 && access(scratch, W_OK) != 0)
        abort();
    snprintf(wpath, sizeof wpath, "%s/records", scratch);
    atexit(cleanup);
}

static void put_file(const uint8_t *p, size_t n)
{
    if (ftruncate(memfd, 0) != 0 || (n && pwrite(memfd, p, n, 0) != (ssize_t)n))
        abort();
}

typedef struct rec {
    const uint8_t *p;
    size_t n;
} rec;

/* Reads the memfd to the end.  Returns the records read (*failed set if
 * refused), checking the message of a refusal.  If want is not NULL, the
 * records read so far must equal want's. */
static size_t read_back(const dp_tfrecord_options *opt, const rec *want, size_t nwant,
                        int *failed, dp_err *err)
{
    dp_tfrecord_reader *r;
    *failed = 0;
    err->msg[0] = '\0';
    if (dp_tfrecord_open(&r, path, opt, err) < 0) {
        if (r != NULL || strstr(err->msg, path) == NULL)
            abort();
        *failed = 1;
        return 0;
    }
    size_t n = 0;
    const uint8_t *d;
    size_t len;
    int rc;
    volatile uint8_t sink = 0;
    while ((rc = dp_tfrecord_next(r, &d, &len, err)) == 1) {
        if (!d)
            abort();
        for (size_t i = 0; i < len; i++)
            sink ^= d[i];
        if (want && (n >= nwant || want[n].n != len || (len && memcmp(want[n].p, d, len))))
            abort(); /* a record that was not written */
        n++;
    }
    (void)sink;
    if (dp_tfrecord_count(r) != n)
        abort();
    if (rc < 0) {
        char idx[48];
        snprintf(idx, sizeof idx, ": record %zu (byte ", n);
        if (strstr(err->msg, path) != err->msg || strstr(err->msg, idx) == NULL)
            abort(); /* every refusal names the file and the record */
        *failed = 1;
    }
    dp_tfrecord_close(r);
    return n;
}

static void framed(uint8_t flags, const dp_tfrecord_options *opt, const uint8_t *data, size_t size)
{
    if (size < 3)
        return;
    size_t where = (size_t)data[0] | (size_t)data[1] << 8;
    uint8_t x = data[2] ? data[2] : 1;
    data += 3;
    size = size - 3;
    static rec recs[MAX_RECORDS];
    size_t nrec = 0;
    while (size && nrec < MAX_RECORDS) {
        size_t n = data[0];
        if (n > size - 1)
            n = size - 1;
        recs[nrec++] = (rec){data + 1, n};
        data += 1 + n;
        size -= 1 + n;
    }
    int gz = (flags >> 4) & 1;
    dp_tfrecord_writer *w;
    dp_err err;
    if (dp_tfrecord_writer_open(&w, wpath, gz ? DP_TFRECORD_GZIP : DP_TFRECORD_RAW, &err) < 0)
        abort();
    for (size_t i = 0; i < nrec; i++)
        if (dp_tfrecord_write(w, recs[i].p, recs[i].n, &err) < 0)
            abort();
    if (dp_tfrecord_writer_close(w, &err) < 0)
        abort();
    FILE *f = fopen(wpath, "rb");
    if (!f)
        abort();
    static uint8_t file[1 << 21];
    size_t flen = fread(file, 1, sizeof file, f);
    fclose(f);
    if (flen == sizeof file)
        return; /* not expected: records are at most 1 MiB in all */

    int xor = (flags >> 5) & 1, cut = (flags >> 6) & 1;
    size_t at = where % (flen + 1);
    if (xor && at < flen)
        file[at] ^= x;
    else
        xor = 0;
    size_t len = cut ? at : flen;
    put_file(file, len);

    int matched = opt->compression == DP_TFRECORD_AUTO ||
                  opt->compression == (gz ? DP_TFRECORD_GZIP : DP_TFRECORD_RAW);
    int failed;
    /* The first record the limit refuses, if any. */
    size_t limited = nrec;
    if (opt->max_record)
        for (size_t i = 0; i < nrec && limited == nrec; i++)
            if (recs[i].n > opt->max_record)
                limited = i;
    size_t got = read_back(opt, matched ? recs : NULL, nrec, &failed, &err);
    if (!matched)
        return;
    if (!xor && !cut) {
        if (limited < nrec) {
            if (!failed || got != limited || !strstr(err.msg, "above the limit"))
                abort();
        } else if (failed || got != nrec) {
            abort();
        }
        return;
    }
    if (gz) {
        /* A cut gzip stream is refused (all but the empty file, which AUTO
         * reads as a raw file of no records); damage is refused or harmless. */
        if (cut && len > 0 && len < flen && !failed)
            abort();
        if (!failed && !(cut && len == 0) && (got != nrec || limited != nrec))
            abort();
        return;
    }
    /* Raw: the record that holds the changed byte, or the cut. */
    size_t start = 0, k = 0;
    while (k < nrec && start + 12 + recs[k].n + 4 <= at) {
        start += 12 + recs[k].n + 4;
        k++;
    }
    /* A record over the limit before it, or this one's data past its intact head. */
    if (limited < k || (limited == k && k < nrec && at >= start + 12)) {
        if (!failed || got != limited)
            abort();
        return;
    }
    if (xor && !cut) {
        /* Refused at its record; a change that makes the file start with the
         * gzip magic sends AUTO to zlib, which refuses it too. */
        if (!failed || got != k ||
            !(strstr(err.msg, "CRC mismatch") || (k == 0 && strstr(err.msg, "gzip"))))
            abort();
    } else if (start == len) {
        if (failed || got != k) /* a cut at a boundary: the records before it */
            abort();
    } else if (!failed || got != k || !strstr(err.msg, "truncated")) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 1 << 20)
        return 0;
    if (memfd < 0)
        setup();
    uint8_t flags = data[0];
    static const dp_tfrecord_compression comp[4] = {DP_TFRECORD_AUTO, DP_TFRECORD_RAW,
                                                    DP_TFRECORD_GZIP, DP_TFRECORD_AUTO};
    dp_tfrecord_options opt = {comp[flags & 3], (flags & 4) ? SMALL_LIMIT : 0};
    if (flags & 8) {
        framed(flags, &opt, data + 1, size - 1);
        return 0;
    }
    put_file(data + 1, size - 1);
    int failed;
    dp_err err;
    read_back(&opt, NULL, 0, &failed, &err);
    return 0;
}
