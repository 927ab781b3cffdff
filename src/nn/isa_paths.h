/* One C body compiled for AVX-512, AVX2 and the baseline, the widest taken
 * by dp_isa_max() (docs/architecture.md, "Instruction sets").  A layer's
 * loops written with their vector lanes across independent outputs (a
 * channel's, feature's or element's own additions keep their order), and a
 * build that never contracts (-ffp-contract=off), give the same bits on
 * every path; the lanes only widen.  The tests that hold those bits run
 * under each DOWNPOUR_ISA cap (tests/CMakeLists.txt, DP_ISA_TESTS).
 *
 *   DP_ISA_BODY void name_body(void *ctx, int i, int n);
 *   DP_ISA_POOL_TASK(name)              defines name[], a dp_pool_fn per level
 *   dp_pool_run(name[dp_isa_paths_level()], &job);
 *
 * DP_ISA_FN(type, name, (params), (args)) does the same for a function of
 * any other type (a span of elements, a product's epilogue). */
#ifndef DP_NN_ISA_PATHS_H
#define DP_NN_ISA_PATHS_H

#include <stddef.h>
#include <string.h>

#include "downpour/isa.h"
#include "downpour/pool.h"

/* A body, inlined into each level's function. */
#define DP_ISA_BODY static inline __attribute__((always_inline))

#if defined(__x86_64__) && defined(__GNUC__)
#define DP_ISA_PATHS 3
#define DP_ISA_VARIANTS_(type, name, params, args)                                               \
    static void name##_c params { name##_body args; }                                            \
    __attribute__((target("avx2"))) static void name##_256 params { name##_body args; }          \
    __attribute__((target("avx512f"))) static void name##_512 params { name##_body args; }       \
    static const type name[DP_ISA_PATHS] = {name##_c, name##_256, name##_512};
/* 0 baseline, 1 AVX2, 2 AVX-512: the index into a name[] above. */
static inline int dp_isa_paths_level(void)
{
    dp_isa l = dp_isa_max();
    return l >= DP_ISA_AVX512 ? 2 : l >= DP_ISA_AVX2 ? 1 : 0;
}
#else
#define DP_ISA_PATHS 1
#define DP_ISA_VARIANTS_(type, name, params, args)                                               \
    static void name##_c params { name##_body args; }                                            \
    static const type name[DP_ISA_PATHS] = {name##_c};
static inline int dp_isa_paths_level(void) { return 0; }
#endif

/* Eight lanes as GCC's vector types, whose operations are lane by lane
 * (IEEE, never contracted): one AVX-512 register, two AVX2 or four SSE
 * ones inside a body compiled for each level, the same bits on each.
 * DP_LOAD8 reads eight floats at p as eight doubles into the dp_d8 out (a
 * macro: a function passing a dp_d8 by value would change the baseline's
 * ABI). */
typedef float dp_f8 __attribute__((vector_size(32), aligned(4)));
typedef double dp_d8 __attribute__((vector_size(64)));
#define DP_LOAD8(out, p)                                                                         \
    do {                                                                                         \
        dp_f8 v_;                                                                                \
        memcpy(&v_, (p), sizeof v_);                                                             \
        (out) = __builtin_convertvector(v_, dp_d8);                                              \
    } while (0)

/* part[k] = the sum in double of x[j] for j = k mod 8, in order: eight
 * floats at a time, then the tail (a row's partial sums as kernels.h's
 * DP_LN_LANES, which dp_k_sum8 then adds in its fixed tree). */
DP_ISA_BODY void dp_lanes_sum(const float *x, size_t n, double part[8])
{
    size_t n8 = n / 8 * 8;
    dp_d8 acc = {0};
    for (size_t j = 0; j < n8; j += 8) {
        dp_d8 t;
        DP_LOAD8(t, x + j);
        acc += t;
    }
    memcpy(part, &acc, 8 * sizeof *part);
    for (size_t j = n8; j < n; j++)
        part[j % 8] += x[j];
}

#define DP_ISA_FN(type, name, params, args) DP_ISA_VARIANTS_(type, name, params, args)
#define DP_ISA_POOL_TASK(name)                                                                   \
    DP_ISA_VARIANTS_(dp_pool_fn, name, (void *ctx, int i, int n), (ctx, i, n))

#endif
