/* libFuzzer target for the safetensors reader: any bytes must load to a
 * handle whose every tensor lies within its own buffer, aligned for float,
 * findable by its unique name, or be refused with a message naming the
 * source; never a crash, an out-of-bounds read, a leak or an allocation
 * sized from an unchecked header length.  Build: clang
 * -fsanitize=fuzzer,address,undefined (fuzz/CMakeLists.txt). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dp_safetensors *st = (dp_safetensors *)1;
    dp_err err;
    err.msg[0] = '\0';
    if (dp_safetensors_load_mem(data, size, &st, &err) != 0) {
        if (st != NULL || strncmp(err.msg, "safetensors buffer: ", 20) != 0)
            abort(); /* every refusal leaves no handle and says why */
        return 0;
    }
    int n = dp_safetensors_count(st);
    if (n < 0 || dp_safetensors_at(st, n) != NULL || dp_safetensors_at(st, -1) != NULL)
        abort();
    volatile float sink = 0;
    for (int i = 0; i < n; i++) {
        const dp_st_tensor *t = dp_safetensors_at(st, i);
        if (!t || !t->name || t->ndim < 0 || t->ndim > DP_ST_MAX_DIMS ||
            ((uintptr_t)t->data & (sizeof(float) - 1)) != 0)
            abort();
        if (dp_safetensors_find(st, t->name) != t)
            abort(); /* names are unique */
        size_t count = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0)
                abort();
            count *= (size_t)t->shape[d];
        }
        /* Every element is read, so ASan sees any tensor outside the buffer. */
        for (size_t k = 0; k < count; k++)
            sink += t->data[k];
    }
    (void)sink;
    (void)dp_safetensors_meta(st, "format");
    dp_safetensors_free(st);
    return 0;
}
