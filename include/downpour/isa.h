/* Instruction-set levels that downpour's own vector kernels dispatch on
 * (docs/architecture.md, "Instruction sets"): the Adam update, the byte to
 * float conversion of a batch and CRC32C.  Each kernel takes the widest path
 * the CPU has, capped by DOWNPOUR_ISA, so one machine can run (and test)
 * every path it supports.  Every path of a kernel gives the same bits.
 *
 *   DOWNPOUR_ISA=scalar | sse4.2 | avx2 | avx512   (unset: no cap)
 *
 * A level implies the ones below it.  A cap above what the CPU has is the
 * CPU's level; an unknown value is an error (dp_isa_check_env). */
#ifndef DOWNPOUR_ISA_H
#define DOWNPOUR_ISA_H

#include "downpour/status.h"

typedef enum dp_isa {
    DP_ISA_SCALAR, /* portable C */
    DP_ISA_SSE42,  /* SSE4.2 crc32 and PCLMULQDQ */
    DP_ISA_AVX2,   /* AVX2 and FMA */
    DP_ISA_AVX512, /* AVX-512 F (with VL and VPCLMULQDQ where the kernel needs them) */
    DP_ISA_COUNT
} dp_isa;

/* The widest level this CPU runs, whatever the cap. */
dp_isa dp_isa_cpu(void);
/* DOWNPOUR_ISA's cap (DP_ISA_AVX512 when unset; read once; an invalid value
 * is warned about once and ignored).  A kernel checks the features it needs
 * itself and takes a path only if its level is within the cap. */
dp_isa dp_isa_cap(void);
/* The widest level kernels may use here: the CPU's, within the cap. */
dp_isa dp_isa_max(void);
/* "scalar", "sse4.2", "avx2", "avx512". */
const char *dp_isa_name(dp_isa level);
/* Parses a level name; -1 with a message listing the names otherwise. */
int dp_isa_parse(const char *name, dp_isa *out, dp_err *err);
/* 0 if DOWNPOUR_ISA is unset or valid, else -1 with a message naming it:
 * the program checks it before it runs anything. */
int dp_isa_check_env(dp_err *err);

#endif
