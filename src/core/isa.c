/* Instruction-set levels and the DOWNPOUR_ISA cap (docs/architecture.md,
 * "Instruction sets"). */
#include "downpour/isa.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/log.h"

static const char *const names[DP_ISA_COUNT] = {"scalar", "sse4.2", "avx2", "avx512"};

const char *dp_isa_name(dp_isa level)
{
    return (unsigned)level < DP_ISA_COUNT ? names[level] : "unknown";
}

int dp_isa_parse(const char *name, dp_isa *out, dp_err *err)
{
    for (int l = 0; l < DP_ISA_COUNT; l++) {
        if (name && strcmp(name, names[l]) == 0) {
            *out = (dp_isa)l;
            return 0;
        }
    }
    return dp_errf(err, "unknown instruction set '%s' (expected one of: scalar, sse4.2, avx2, "
                        "avx512)",
                   name ? name : "");
}

/* The one read of DOWNPOUR_ISA: the check and the cap agree on it. */
static const char *cap_env(void) { return getenv("DOWNPOUR_ISA"); }

int dp_isa_check_env(dp_err *err)
{
    const char *cap = cap_env();
    dp_isa l = DP_ISA_SCALAR;
    if (!cap || !*cap || dp_isa_parse(cap, &l, err) == 0)
        return 0;
    return dp_err_prefix(err, "DOWNPOUR_ISA");
}

static dp_isa cpu_level = DP_ISA_SCALAR, cap_level = DP_ISA_COUNT - 1;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void detect(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul")) {
        cpu_level = DP_ISA_SSE42;
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
            cpu_level = DP_ISA_AVX2;
            if (__builtin_cpu_supports("avx512f"))
                cpu_level = DP_ISA_AVX512;
        }
    }
#endif
    const char *cap = cap_env();
    if (cap && *cap) {
        dp_isa l = cap_level;
        dp_err err;
        if (dp_isa_parse(cap, &l, &err) < 0)
            dp_warn("DOWNPOUR_ISA: %s; no cap applied", err.msg);
        else
            cap_level = l;
    }
}

dp_isa dp_isa_cpu(void)
{
    pthread_once(&once, detect);
    return cpu_level;
}

dp_isa dp_isa_cap(void)
{
    pthread_once(&once, detect);
    return cap_level;
}

dp_isa dp_isa_max(void)
{
    pthread_once(&once, detect);
    return cpu_level < cap_level ? cpu_level : cap_level;
}
