/* libFuzzer target for the cluster-spec parser: any bytes must give either a
 * valid cluster (which the writer must round-trip) or a message, never a
 * crash, a leak or a hang.  Build: clang -fsanitize=fuzzer,address,undefined. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/cluster.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 20)
        return 0;
    /* The first byte picks a --task override so that path is fuzzed too. */
    static const char *const overrides[] = {NULL, "worker:0", "chief", "ps:1", "worker:4095"};
    const char *task = NULL;
    if (size > 0) {
        task = overrides[data[0] % 5];
        data++;
        size--;
    }
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    dp_cluster c;
    dp_err err;
    if (dp_cluster_parse(&c, s, task, &err) == 0) {
        if (c.self < 0 || c.self >= c.n_tasks || c.count[DP_ROLE_WORKER] < 1)
            abort();
        char *json = dp_cluster_to_json(&c, c.self, &err);
        if (json) {
            dp_cluster d;
            if (dp_cluster_parse(&d, json, NULL, &err) != 0 || d.n_tasks != c.n_tasks ||
                d.self != c.self)
                abort();
            for (int i = 0; i < d.n_tasks; i++)
                if (strcmp(d.tasks[i].addr, c.tasks[i].addr) != 0 ||
                    d.tasks[i].port != c.tasks[i].port)
                    abort();
            dp_cluster_free(&d);
            free(json);
        }
        dp_cluster_free(&c);
    } else if (err.msg[0] == '\0') {
        abort(); /* every refusal says why */
    }
    free(s);
    return 0;
}
