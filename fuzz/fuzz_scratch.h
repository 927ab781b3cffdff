/* A fuzz target's scratch directory: a fresh one (mkdtemp's template, its
 * six X's filled in) in /dev/shm where it is writable (the targets write and
 * read files at every input), else in $TMPDIR or /tmp.  Aborts when none can
 * be made: a target without its directory would test nothing. */
#ifndef DOWNPOUR_FUZZ_SCRATCH_H
#define DOWNPOUR_FUZZ_SCRATCH_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static inline void fz_scratch_dir(char *dir, size_t cap, const char *name)
{
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    snprintf(dir, cap, "%s/%s.XXXXXX", base && *base ? base : "/tmp", name);
    if (!mkdtemp(dir))
        abort();
}

#endif
