/* Optimisers on flat ranges (docs/architecture.md, "Optimisers"), Keras formulas.  The update
 * loops are plain unit-stride float loops over restrict pointers so gcc -O3
 * vectorises them (sqrtf becomes sqrtps with -fno-math-errno). */
#include "downpour/optim.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/env.h"
#include "downpour/isa.h"
#include "downpour/pool.h"
#include "adam_fast.h"

#if defined(__SSE__)
#include <xmmintrin.h>
/* Flush denormals to zero (FTZ) and read them as zero (DAZ) for the length of
 * one update, as TensorFlow does around its kernels.  Adam's first moment of
 * a rarely-active input decays by beta1 every step and reaches the denormal
 * range (< 1.2e-38) after ~700 steps of zero gradient; on x86 every denormal
 * operand then costs a microcode assist and the update gets ~7x slower
 * (measured: 150 us -> 1050 us for 266,610 parameters).  The caller's MXCSR
 * is restored afterwards. */
static unsigned flush_denormals_begin(void)
{
    unsigned old = _mm_getcsr();
    _mm_setcsr(old | 0x8040u); /* FTZ | DAZ */
    return old;
}
static void flush_denormals_end(unsigned old) { _mm_setcsr(old); }
#else
static unsigned flush_denormals_begin(void) { return 0; }
static void flush_denormals_end(unsigned old) { (void)old; }
#endif

static const char *const kind_names[DP_OPTIM_COUNT] = {
    [DP_OPTIM_SGD] = "sgd",
    [DP_OPTIM_MOMENTUM] = "momentum",
    [DP_OPTIM_NESTEROV] = "nesterov",
    [DP_OPTIM_ADAGRAD] = "adagrad",
    [DP_OPTIM_ADAM] = "adam",
    [DP_OPTIM_ADAMW] = "adamw",
};

dp_optim_config dp_optim_defaults(dp_optim_kind kind)
{
    dp_optim_config c = {.kind = kind, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f,
                         .eps = 1e-7f, .initial_accumulator = 0.1f};
    switch (kind) {
    case DP_OPTIM_MOMENTUM:
    case DP_OPTIM_NESTEROV: c.momentum = 0.9f; break;
    case DP_OPTIM_ADAGRAD:
    case DP_OPTIM_ADAM: c.lr = 0.001f; break;
    case DP_OPTIM_ADAMW: c.lr = 0.001f, c.weight_decay = 0.01f; break; /* PyTorch's */
    default: break;
    }
    return c;
}

int dp_optim_parse_kind(const char *name, dp_optim_kind *out, dp_err *err)
{
    for (int k = 0; k < DP_OPTIM_COUNT; k++) {
        if (name && strcmp(name, kind_names[k]) == 0) {
            *out = (dp_optim_kind)k;
            return 0;
        }
    }
    return dp_errf(err, "unknown optimizer '%s' (expected one of: sgd, momentum, nesterov, "
                        "adagrad, adam, adamw)",
                   name ? name : "");
}

const char *dp_optim_kind_name(dp_optim_kind kind)
{
    return (unsigned)kind < DP_OPTIM_COUNT ? kind_names[kind] : "unknown";
}

int dp_optim_slots(dp_optim_kind kind)
{
    switch (kind) {
    case DP_OPTIM_MOMENTUM:
    case DP_OPTIM_NESTEROV:
    case DP_OPTIM_ADAGRAD: return 1;
    case DP_OPTIM_ADAM:
    case DP_OPTIM_ADAMW: return 2;
    default: return 0;
    }
}

static int is_adam(dp_optim_kind k) { return k == DP_OPTIM_ADAM || k == DP_OPTIM_ADAMW; }

static int check_config(const dp_optim_config *c, dp_err *err)
{
    const char *name = dp_optim_kind_name(c->kind);
    if ((unsigned)c->kind >= DP_OPTIM_COUNT)
        return dp_errf(err, "optimizer: unknown kind %d", (int)c->kind);
    if (!(c->lr >= 0.0f) || isinf(c->lr))
        return dp_errf(err, "optimizer %s: learning rate %g must be finite and >= 0", name,
                       (double)c->lr);
    if ((c->kind == DP_OPTIM_MOMENTUM || c->kind == DP_OPTIM_NESTEROV) &&
        !(c->momentum >= 0.0f && c->momentum <= 1.0f))
        return dp_errf(err, "optimizer %s: momentum %g must be in [0, 1]", name,
                       (double)c->momentum);
    if (is_adam(c->kind) && !(c->beta1 >= 0.0f && c->beta1 < 1.0f))
        return dp_errf(err, "optimizer %s: beta1 %g must be in [0, 1)", name, (double)c->beta1);
    if (is_adam(c->kind) && !(c->beta2 >= 0.0f && c->beta2 < 1.0f))
        return dp_errf(err, "optimizer %s: beta2 %g must be in [0, 1)", name, (double)c->beta2);
    if ((is_adam(c->kind) || c->kind == DP_OPTIM_ADAGRAD) &&
        (!(c->eps >= 0.0f) || isinf(c->eps)))
        return dp_errf(err, "optimizer %s: epsilon %g must be finite and >= 0", name,
                       (double)c->eps);
    if (c->kind == DP_OPTIM_ADAGRAD &&
        (!(c->initial_accumulator >= 0.0f) || isinf(c->initial_accumulator)))
        return dp_errf(err, "optimizer adagrad: initial accumulator %g must be finite and >= 0",
                       (double)c->initial_accumulator);
    if (!(c->weight_decay >= 0.0f) || isinf(c->weight_decay))
        return dp_errf(err, "optimizer %s: weight decay %g must be finite and >= 0", name,
                       (double)c->weight_decay);
    /* adamw scales p by 1 - lr wd each step: at lr wd >= 1 that zeroes or
     * flips every weight (a schedule only lowers lr) */
    if (c->kind == DP_OPTIM_ADAMW && (double)c->lr * c->weight_decay >= 1.0)
        return dp_errf(err, "optimizer adamw: learning rate %g times weight decay %g must be "
                            "below 1", (double)c->lr, (double)c->weight_decay);
    return 0;
}

static void init_fast_adam(void);

int dp_optim_init(dp_optim *o, const dp_optim_config *cfg, size_t n, dp_err *err)
{
    memset(o, 0, sizeof *o);
    int exact;
    if (check_config(cfg, err) < 0 || dp_env_flag("DOWNPOUR_EXACT_ADAM", 0, &exact, err) < 0)
        return -1;
    size_t slots = (size_t)dp_optim_slots(cfg->kind);
    if (slots && n > SIZE_MAX / sizeof(float) / slots)
        return dp_errf(err, "optimizer %s: %zu parameters is too many",
                       dp_optim_kind_name(cfg->kind), n);
    size_t len = slots * n;
    if (len) {
        o->state = malloc(len * sizeof(float));
        if (!o->state)
            return dp_errf(err, "optimizer %s: out of memory for %zu state floats",
                           dp_optim_kind_name(cfg->kind), len);
        float init = cfg->kind == DP_OPTIM_ADAGRAD ? cfg->initial_accumulator : 0.0f;
        if (init == 0.0f) {
            memset(o->state, 0, len * sizeof(float));
        } else {
            for (size_t i = 0; i < len; i++)
                o->state[i] = init;
        }
    }
    o->cfg = *cfg;
    o->n = n;
    o->t = 0;
    o->exact = exact;
    init_fast_adam();
    return 0;
}

void dp_optim_free(dp_optim *o)
{
    if (!o)
        return;
    free(o->state);
    o->state = NULL;
    o->n = 0;
    o->t = 0;
}

/* The gradient with an L2 weight decay, g + l2 p; l2 = 0 leaves g as it is
 * (the branch is loop-invariant: gcc unswitches it). */
#define GRAD(i) (l2 != 0.0f ? g[i] + l2 * p[i] : g[i])

static void sgd_update(float *restrict p, const float *restrict g, size_t n, float lr, float l2)
{
    for (size_t i = 0; i < n; i++)
        p[i] -= lr * GRAD(i);
}

static void momentum_update(float *restrict p, const float *restrict g, float *restrict v,
                            size_t n, float lr, float mu, float l2)
{
    for (size_t i = 0; i < n; i++) {
        float vi = mu * v[i] - lr * GRAD(i);
        v[i] = vi;
        p[i] += vi;
    }
}

static void nesterov_update(float *restrict p, const float *restrict g, float *restrict v,
                            size_t n, float lr, float mu, float l2)
{
    for (size_t i = 0; i < n; i++) {
        float gi = GRAD(i);
        float vi = mu * v[i] - lr * gi;
        v[i] = vi;
        p[i] += mu * vi - lr * gi;
    }
}

static void adagrad_update(float *restrict p, const float *restrict g, float *restrict a,
                           size_t n, float lr, float eps, float l2)
{
    for (size_t i = 0; i < n; i++) {
        float gi = GRAD(i);
        float ai = a[i] + gi * gi;
        a[i] = ai;
        p[i] -= lr * gi / (sqrtf(ai) + eps);
    }
}

static void adam_update(float *restrict p, const float *restrict g, float *restrict m,
                        float *restrict v, size_t n, float lr_t, float b1, float b2, float eps,
                        float l2, float decay)
{
    float c1 = 1.0f - b1, c2 = 1.0f - b2;
    for (size_t i = 0; i < n; i++) {
        float gi = GRAD(i);
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + c2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float pi = decay != 1.0f ? p[i] * decay : p[i];
        p[i] = pi - lr_t * mi / (sqrtf(vi) + eps);
    }
}

/* The fast Adam (docs/architecture.md, "Optimisers"): Adam's sqrt and
 * division saturate the divider (0.59 ns a parameter on SkylakeX at any
 * vector width), a tenth of a training step of mlp-300-100.  The fast path
 * computes 1/sqrt(v) and 1/d with Newton-Raphson steps on the FMA units from
 * integer-bit initial estimates; the update differs from the IEEE one by a
 * few ulp (tests/test_optim.c bounds it).
 *
 * One arithmetic on every instruction set: the estimates are integer
 * arithmetic and every float operation (mul, add, fma, max) is correctly
 * rounded, so the scalar, AVX2 and AVX-512 bodies give the same bits for the
 * same element (the hardware rsqrt/rcp estimates would not: their bits differ
 * between instruction sets and vendors).  A range's tail runs as one masked
 * vector (or the scalar body), so pieces of an update give the bits of the
 * whole (dp_optim_apply_range).  sqrt(v) = v * rsqrt(max(v, FLT_MIN)), so
 * v = 0 gives 0.  DOWNPOUR_EXACT_ADAM=1 keeps IEEE sqrt and division.
 *
 * Error: 3 Newton steps from the estimates leave 1/sqrt within 1.7e-7 and
 * the reciprocal within 1.2e-7 (relative), for every float in range. */
/* The portable body: adam_fast.h's element, which every vector body repeats. */
static void adam_update_fast(float *restrict p, const float *restrict g, float *restrict m,
                             float *restrict v, size_t n, float lr_t, float b1, float b2,
                             float eps, float l2, float decay)
{
    const float c1 = 1.0f - b1, c2 = 1.0f - b2;
    for (size_t i = 0; i < n; i++)
        dp_adam_fast_element(p + i, m + i, v + i, g[i], lr_t, b1, c1, b2, c2, eps, l2, decay);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* One vector of adam_update_fast's arithmetic, operation for operation. */
#define ADAM_FAST_BODY(W, CAST, ICAST)                                             \
    do {                                                                                       \
        if (l2 != 0.0f)                                                                        \
            gi = _mm##W##_add_ps(gi, _mm##W##_mul_ps(vl2, pi));                                \
        mi = _mm##W##_fmadd_ps(vb1, mi, _mm##W##_mul_ps(vc1, gi));                             \
        vi = _mm##W##_fmadd_ps(vb2, vi, _mm##W##_mul_ps(_mm##W##_mul_ps(vc2, gi), gi));        \
        __m##W x = _mm##W##_max_ps(vi, tiny);                                                  \
        __m##W y = CAST(_mm##W##_sub_epi32(rsqrt_magic, _mm##W##_srli_epi32(ICAST(x), 1)));   \
        for (int it = 0; it < 3; it++)                                                         \
            y = _mm##W##_mul_ps(                                                               \
                y, _mm##W##_fnmadd_ps(_mm##W##_mul_ps(_mm##W##_mul_ps(half, x), y), y, th));  \
        __m##W d = _mm##W##_add_ps(_mm##W##_mul_ps(vi, y), veps);                              \
        __m##W r = CAST(_mm##W##_sub_epi32(rcp_magic, ICAST(d)));                              \
        for (int it = 0; it < 3; it++)                                                         \
            r = _mm##W##_mul_ps(r, _mm##W##_fnmadd_ps(d, r, two));                             \
        if (decay != 1.0f)                                                                     \
            pi = _mm##W##_mul_ps(pi, vdecay);                                                  \
        pi = _mm##W##_fnmadd_ps(_mm##W##_mul_ps(vlr, mi), r, pi);                              \
    } while (0)

#define ADAM_FAST_CONSTANTS(W)                                                                 \
    const __m##W vb1 = _mm##W##_set1_ps(b1), vc1 = _mm##W##_set1_ps(1.0f - b1);                \
    const __m##W vb2 = _mm##W##_set1_ps(b2), vc2 = _mm##W##_set1_ps(1.0f - b2);                \
    const __m##W veps = _mm##W##_set1_ps(eps), vlr = _mm##W##_set1_ps(lr_t);                   \
    const __m##W tiny = _mm##W##_set1_ps(DP_ADAM_TINY), half = _mm##W##_set1_ps(0.5f);      \
    const __m##W th = _mm##W##_set1_ps(1.5f), two = _mm##W##_set1_ps(2.0f);                    \
    const __m##W vl2 = _mm##W##_set1_ps(l2), vdecay = _mm##W##_set1_ps(decay);                 \
    const __m##W##i rsqrt_magic = _mm##W##_set1_epi32((int)DP_ADAM_RSQRT_MAGIC);                       \
    const __m##W##i rcp_magic = _mm##W##_set1_epi32((int)DP_ADAM_RCP_MAGIC)

__attribute__((target("avx512f"))) static void
adam_update_avx512(float *restrict p, const float *restrict g, float *restrict m,
                   float *restrict v, size_t n, float lr_t, float b1, float b2, float eps,
                   float l2, float decay)
{
    ADAM_FAST_CONSTANTS(512);
    size_t i = 0;
    for (; i < n; i += 16) {
        /* the tail in one masked vector: the same arithmetic as the rest */
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 gi = _mm512_maskz_loadu_ps(k, g + i), mi = _mm512_maskz_loadu_ps(k, m + i);
        __m512 vi = _mm512_maskz_loadu_ps(k, v + i), pi = _mm512_maskz_loadu_ps(k, p + i);
        ADAM_FAST_BODY(512, _mm512_castsi512_ps, _mm512_castps_si512);
        _mm512_mask_storeu_ps(m + i, k, mi);
        _mm512_mask_storeu_ps(v + i, k, vi);
        _mm512_mask_storeu_ps(p + i, k, pi);
    }
}

__attribute__((target("avx2,fma"))) static void
adam_update_avx2(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                 size_t n, float lr_t, float b1, float b2, float eps, float l2, float decay)
{
    ADAM_FAST_CONSTANTS(256);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gi = _mm256_loadu_ps(g + i), mi = _mm256_loadu_ps(m + i);
        __m256 vi = _mm256_loadu_ps(v + i), pi = _mm256_loadu_ps(p + i);
        ADAM_FAST_BODY(256, _mm256_castsi256_ps, _mm256_castps_si256);
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(p + i, pi);
    }
    if (i < n) { /* the tail in one masked vector: the same arithmetic as the rest */
        __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 gi = _mm256_maskload_ps(g + i, k), mi = _mm256_maskload_ps(m + i, k);
        __m256 vi = _mm256_maskload_ps(v + i, k), pi = _mm256_maskload_ps(p + i, k);
        ADAM_FAST_BODY(256, _mm256_castsi256_ps, _mm256_castps_si256);
        _mm256_maskstore_ps(m + i, k, mi);
        _mm256_maskstore_ps(v + i, k, vi);
        _mm256_maskstore_ps(p + i, k, pi);
    }
}
#endif

typedef void (*adam_fn)(float *restrict, const float *restrict, float *restrict, float *restrict,
                        size_t, float, float, float, float, float, float);

/* The widest fast path this CPU runs within DOWNPOUR_ISA's cap, chosen once. */
static adam_fn fast_adam = adam_update_fast;
static dp_isa fast_adam_level = DP_ISA_SCALAR;
static pthread_once_t fast_adam_once = PTHREAD_ONCE_INIT;

static dp_isa use_fast_adam(dp_isa level)
{
    fast_adam = adam_update_fast;
    fast_adam_level = DP_ISA_SCALAR;
#if defined(__x86_64__) && defined(__GNUC__)
    /* An x86 CPU without FMA would run fmaf in software, slower than the
     * divider: it keeps the IEEE twin on every path (one arithmetic per
     * machine still). */
    if (dp_isa_cpu() < DP_ISA_AVX2)
        fast_adam = adam_update;
    else if (level >= DP_ISA_AVX512 && dp_isa_cpu() >= DP_ISA_AVX512) {
        fast_adam = adam_update_avx512;
        fast_adam_level = DP_ISA_AVX512;
    } else if (level >= DP_ISA_AVX2 && dp_isa_cpu() >= DP_ISA_AVX2) {
        fast_adam = adam_update_avx2;
        fast_adam_level = DP_ISA_AVX2;
    }
#else
    (void)level;
#endif
    return fast_adam_level;
}
static void choose_fast_adam(void) { use_fast_adam(dp_isa_max()); }
static adam_fn pick_adam(int exact) { return exact ? adam_update : fast_adam; }
static void init_fast_adam(void) { pthread_once(&fast_adam_once, choose_fast_adam); }

int dp_optim_adam_exact(const dp_optim *o)
{
    init_fast_adam();
    return o->exact || fast_adam == adam_update;
}

dp_isa dp_optim_force_isa(dp_isa level)
{
    init_fast_adam();
    return use_fast_adam(level);
}

dp_optim_step dp_optim_begin(dp_optim *o, float lr)
{
    const dp_optim_config *c = &o->cfg;
    dp_optim_step st = {lr, 0.0f, 0.0f, 1.0f};
    o->t++;
    if (c->kind == DP_OPTIM_ADAMW)
        st.decay = 1.0f - lr * c->weight_decay; /* float, as a device kernel would round it */
    else
        st.l2 = c->weight_decay;
    if (is_adam(c->kind)) {
        /* Keras 2: lr_t = lr sqrt(1 - b2^t) / (1 - b1^t), epsilon added to sqrt(v). */
        double t = (double)o->t;
        st.lr_t = (float)(lr * sqrt(1.0 - pow(c->beta2, t)) / (1.0 - pow(c->beta1, t)));
    }
    return st;
}

/* One piece of an update: len elements at p, g and the first slot s0 (the
 * others every n after it).  The same arithmetic wherever the piece lies. */
static void update_span(const dp_optim *o, const dp_optim_step *st, float *p, const float *g,
                        float *s0, size_t len)
{
    const dp_optim_config *c = &o->cfg;
    size_t n = o->n;
    switch (c->kind) {
    case DP_OPTIM_SGD: sgd_update(p, g, len, st->lr, st->l2); break;
    case DP_OPTIM_MOMENTUM: momentum_update(p, g, s0, len, st->lr, c->momentum, st->l2); break;
    case DP_OPTIM_NESTEROV: nesterov_update(p, g, s0, len, st->lr, c->momentum, st->l2); break;
    case DP_OPTIM_ADAGRAD: adagrad_update(p, g, s0, len, st->lr, c->eps, st->l2); break;
    case DP_OPTIM_ADAM:
    case DP_OPTIM_ADAMW:
        pick_adam(o->exact)(p, g, s0, s0 + n, len, st->lr_t, c->beta1, c->beta2, c->eps, st->l2,
                            st->decay);
        break;
    default: break;
    }
}

/* Elementwise, each element with the same arithmetic wherever [lo, hi)
 * falls; each call sets its own MXCSR flush (the register is per thread). */
void dp_optim_apply_range(const dp_optim *o, const dp_optim_step *st, float *params,
                          const float *grads, size_t lo, size_t hi)
{
    size_t n = o->n;
    if (hi > n)
        hi = n;
    if (hi <= lo)
        return;
    unsigned csr = flush_denormals_begin();
    update_span(o, st, params + lo, grads + lo, o->state ? o->state + lo : NULL, hi - lo);
    flush_denormals_end(csr);
}

void dp_optim_apply_rows(const dp_optim *o, const dp_optim_step *st, float *params,
                         const float *grads, const uint32_t *rows, size_t count, size_t width,
                         int indexed)
{
    unsigned csr = flush_denormals_begin();
    for (size_t i = 0; i < count; i++) {
        size_t at = (size_t)rows[i] * width;
        if (at + width > o->n)
            continue; /* the callers check their rows; never past the state */
        update_span(o, st, params + at, grads + (indexed ? at : i * width),
                    o->state ? o->state + at : NULL, width);
    }
    flush_denormals_end(csr);
}
typedef struct apply_job {
    const dp_optim *o;
    const dp_optim_step *st;
    float *params;
    const float *grads;
    size_t lo, hi;
} apply_job;

/* Thread i's share of the range, in 64-byte aligned pieces. */
static void apply_task(void *ctx, int i, int n_threads)
{
    const apply_job *j = ctx;
    size_t lo, hi;
    dp_pool_range(j->hi - j->lo, 16, i, n_threads, &lo, &hi);
    dp_optim_apply_range(j->o, j->st, j->params, j->grads, j->lo + lo, j->lo + hi);
}

/* Ranges below this many parameters update on the calling thread. */
#define APPLY_MIN_SPLIT 16384

void dp_optim_apply_split(const dp_optim *o, const dp_optim_step *st, float *params,
                          const float *grads, size_t lo, size_t hi)
{
    apply_job j = {o, st, params, grads, lo, hi < o->n ? hi : o->n};
    if (j.hi <= j.lo)
        return;
    /* Elementwise: the result does not depend on the split. */
    if (j.hi - j.lo < APPLY_MIN_SPLIT)
        apply_task(&j, 0, 1);
    else
        dp_pool_run(apply_task, &j);
}

void dp_optim_apply(dp_optim *o, float *params, const float *grads, float lr)
{
    dp_optim_step st = dp_optim_begin(o, lr);
    dp_optim_apply_split(o, &st, params, grads, 0, o->n);
}
