/* Optimisers on flat ranges (docs/architecture.md, "Optimisers"), Keras formulas.  The update
 * loops are plain unit-stride float loops over restrict pointers so gcc -O3
 * vectorises them (sqrtf becomes sqrtps with -fno-math-errno). */
#include "downpour/optim.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/pool.h"

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
                        "adagrad, adam)",
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
    case DP_OPTIM_ADAM: return 2;
    default: return 0;
    }
}

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
    if (c->kind == DP_OPTIM_ADAM && !(c->beta1 >= 0.0f && c->beta1 < 1.0f))
        return dp_errf(err, "optimizer adam: beta1 %g must be in [0, 1)", (double)c->beta1);
    if (c->kind == DP_OPTIM_ADAM && !(c->beta2 >= 0.0f && c->beta2 < 1.0f))
        return dp_errf(err, "optimizer adam: beta2 %g must be in [0, 1)", (double)c->beta2);
    if ((c->kind == DP_OPTIM_ADAM || c->kind == DP_OPTIM_ADAGRAD) &&
        (!(c->eps >= 0.0f) || isinf(c->eps)))
        return dp_errf(err, "optimizer %s: epsilon %g must be finite and >= 0", name,
                       (double)c->eps);
    if (c->kind == DP_OPTIM_ADAGRAD &&
        (!(c->initial_accumulator >= 0.0f) || isinf(c->initial_accumulator)))
        return dp_errf(err, "optimizer adagrad: initial accumulator %g must be finite and >= 0",
                       (double)c->initial_accumulator);
    return 0;
}

static void init_fast_adam(void);

int dp_optim_init(dp_optim *o, const dp_optim_config *cfg, size_t n, dp_err *err)
{
    memset(o, 0, sizeof *o);
    if (check_config(cfg, err) < 0)
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
    const char *exact = getenv("DOWNPOUR_EXACT_ADAM");
    o->exact = exact && strcmp(exact, "1") == 0;
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

static void sgd_update(float *restrict p, const float *restrict g, size_t n, float lr)
{
    for (size_t i = 0; i < n; i++)
        p[i] -= lr * g[i];
}

static void momentum_update(float *restrict p, const float *restrict g, float *restrict v,
                            size_t n, float lr, float mu)
{
    for (size_t i = 0; i < n; i++) {
        float vi = mu * v[i] - lr * g[i];
        v[i] = vi;
        p[i] += vi;
    }
}

static void nesterov_update(float *restrict p, const float *restrict g, float *restrict v,
                            size_t n, float lr, float mu)
{
    for (size_t i = 0; i < n; i++) {
        float vi = mu * v[i] - lr * g[i];
        v[i] = vi;
        p[i] += mu * vi - lr * g[i];
    }
}

static void adagrad_update(float *restrict p, const float *restrict g, float *restrict a,
                           size_t n, float lr, float eps)
{
    for (size_t i = 0; i < n; i++) {
        float ai = a[i] + g[i] * g[i];
        a[i] = ai;
        p[i] -= lr * g[i] / (sqrtf(ai) + eps);
    }
}

static void adam_update(float *restrict p, const float *restrict g, float *restrict m,
                        float *restrict v, size_t n, float lr_t, float b1, float b2, float eps)
{
    float c1 = 1.0f - b1, c2 = 1.0f - b2;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + c2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= lr_t * mi / (sqrtf(vi) + eps);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_FAST_ADAM 1
/* Adam's sqrt and division saturate the divider (0.59 ns a parameter on
 * SkylakeX at any vector width), a tenth of a training step of mlp-300-100.
 * The fast path takes the hardware's reciprocal square-root and reciprocal
 * estimates with one Newton-Raphson step each, on the FMA units: the update
 * differs from the IEEE one by a few ulp (tests/test_optim.c bounds it) and is
 * the same bits on every run.  DOWNPOUR_EXACT_ADAM=1 keeps IEEE sqrt and
 * division.  sqrt(v) = v * rsqrt(max(v, FLT_MIN)), so v = 0 gives 0.  A
 * range's tail runs as one masked vector, so every element gets the same
 * arithmetic wherever a range starts or ends: pieces of an update give the
 * bits of the whole (dp_optim_apply_range). */
__attribute__((target("avx512f"))) static void
adam_update_avx512(float *restrict p, const float *restrict g, float *restrict m,
                   float *restrict v, size_t n, float lr_t, float b1, float b2, float eps)
{
    const __m512 vb1 = _mm512_set1_ps(b1), vc1 = _mm512_set1_ps(1.0f - b1);
    const __m512 vb2 = _mm512_set1_ps(b2), vc2 = _mm512_set1_ps(1.0f - b2);
    const __m512 veps = _mm512_set1_ps(eps), vlr = _mm512_set1_ps(lr_t);
    const __m512 tiny = _mm512_set1_ps(1.17549435e-38f), half = _mm512_set1_ps(0.5f);
    const __m512 three_halves = _mm512_set1_ps(1.5f), two = _mm512_set1_ps(2.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gi = _mm512_loadu_ps(g + i);
        __m512 mi = _mm512_fmadd_ps(vb1, _mm512_loadu_ps(m + i), _mm512_mul_ps(vc1, gi));
        __m512 vi = _mm512_fmadd_ps(vb2, _mm512_loadu_ps(v + i), _mm512_mul_ps(_mm512_mul_ps(vc2, gi), gi));
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        __m512 x = _mm512_max_ps(vi, tiny);
        __m512 y = _mm512_rsqrt14_ps(x);
        y = _mm512_mul_ps(y, _mm512_fnmadd_ps(_mm512_mul_ps(_mm512_mul_ps(half, x), y), y, three_halves));
        __m512 d = _mm512_add_ps(_mm512_mul_ps(vi, y), veps);
        __m512 r = _mm512_rcp14_ps(d);
        r = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, two));
        _mm512_storeu_ps(p + i, _mm512_fnmadd_ps(_mm512_mul_ps(vlr, mi), r, _mm512_loadu_ps(p + i)));
    }
    if (i < n) { /* the tail in one masked vector: the same arithmetic as the rest */
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        __m512 gi = _mm512_maskz_loadu_ps(k, g + i);
        __m512 mi = _mm512_fmadd_ps(vb1, _mm512_maskz_loadu_ps(k, m + i), _mm512_mul_ps(vc1, gi));
        __m512 vi = _mm512_fmadd_ps(vb2, _mm512_maskz_loadu_ps(k, v + i), _mm512_mul_ps(_mm512_mul_ps(vc2, gi), gi));
        _mm512_mask_storeu_ps(m + i, k, mi);
        _mm512_mask_storeu_ps(v + i, k, vi);
        __m512 x = _mm512_max_ps(vi, tiny);
        __m512 y = _mm512_rsqrt14_ps(x);
        y = _mm512_mul_ps(y, _mm512_fnmadd_ps(_mm512_mul_ps(_mm512_mul_ps(half, x), y), y, three_halves));
        __m512 d = _mm512_add_ps(_mm512_mul_ps(vi, y), veps);
        __m512 r = _mm512_rcp14_ps(d);
        r = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, two));
        _mm512_mask_storeu_ps(p + i, k, _mm512_fnmadd_ps(_mm512_mul_ps(vlr, mi), r, _mm512_maskz_loadu_ps(k, p + i)));
    }
}

/* The same with AVX2 and FMA: 12-bit estimates, one Newton step each. */
__attribute__((target("avx2,fma"))) static void
adam_update_avx2(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                 size_t n, float lr_t, float b1, float b2, float eps)
{
    const __m256 vb1 = _mm256_set1_ps(b1), vc1 = _mm256_set1_ps(1.0f - b1);
    const __m256 vb2 = _mm256_set1_ps(b2), vc2 = _mm256_set1_ps(1.0f - b2);
    const __m256 veps = _mm256_set1_ps(eps), vlr = _mm256_set1_ps(lr_t);
    const __m256 tiny = _mm256_set1_ps(1.17549435e-38f), half = _mm256_set1_ps(0.5f);
    const __m256 three_halves = _mm256_set1_ps(1.5f), two = _mm256_set1_ps(2.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gi = _mm256_loadu_ps(g + i);
        __m256 mi = _mm256_fmadd_ps(vb1, _mm256_loadu_ps(m + i), _mm256_mul_ps(vc1, gi));
        __m256 vi = _mm256_fmadd_ps(vb2, _mm256_loadu_ps(v + i), _mm256_mul_ps(_mm256_mul_ps(vc2, gi), gi));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        __m256 x = _mm256_max_ps(vi, tiny);
        __m256 y = _mm256_rsqrt_ps(x);
        y = _mm256_mul_ps(y, _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_mul_ps(half, x), y), y, three_halves));
        __m256 d = _mm256_add_ps(_mm256_mul_ps(vi, y), veps);
        __m256 r = _mm256_rcp_ps(d);
        r = _mm256_mul_ps(r, _mm256_fnmadd_ps(d, r, two));
        _mm256_storeu_ps(p + i, _mm256_fnmadd_ps(_mm256_mul_ps(vlr, mi), r, _mm256_loadu_ps(p + i)));
    }
    if (i < n) { /* the tail in one masked vector: the same arithmetic as the rest */
        __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 gi = _mm256_maskload_ps(g + i, k);
        __m256 mi = _mm256_fmadd_ps(vb1, _mm256_maskload_ps(m + i, k), _mm256_mul_ps(vc1, gi));
        __m256 vi = _mm256_fmadd_ps(vb2, _mm256_maskload_ps(v + i, k), _mm256_mul_ps(_mm256_mul_ps(vc2, gi), gi));
        _mm256_maskstore_ps(m + i, k, mi);
        _mm256_maskstore_ps(v + i, k, vi);
        __m256 x = _mm256_max_ps(vi, tiny);
        __m256 y = _mm256_rsqrt_ps(x);
        y = _mm256_mul_ps(y, _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_mul_ps(half, x), y), y, three_halves));
        __m256 d = _mm256_add_ps(_mm256_mul_ps(vi, y), veps);
        __m256 r = _mm256_rcp_ps(d);
        r = _mm256_mul_ps(r, _mm256_fnmadd_ps(d, r, two));
        _mm256_maskstore_ps(p + i, k, _mm256_fnmadd_ps(_mm256_mul_ps(vlr, mi), r, _mm256_maskload_ps(p + i, k)));
    }
}

typedef void (*adam_fn)(float *restrict, const float *restrict, float *restrict, float *restrict,
                        size_t, float, float, float, float);

/* The widest fast path this CPU runs, chosen once. */
static adam_fn fast_adam = adam_update;
static pthread_once_t fast_adam_once = PTHREAD_ONCE_INIT;
static void choose_fast_adam(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        fast_adam = adam_update_avx512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        fast_adam = adam_update_avx2;
}
static adam_fn pick_adam(int exact) { return exact ? adam_update : fast_adam; }
static void init_fast_adam(void) { pthread_once(&fast_adam_once, choose_fast_adam); }
#else
typedef void (*adam_fn)(float *, const float *, float *, float *, size_t, float, float, float, float);
static adam_fn pick_adam(int exact) { (void)exact; return adam_update; }
static void init_fast_adam(void) {}
#endif

dp_optim_step dp_optim_begin(dp_optim *o, float lr)
{
    const dp_optim_config *c = &o->cfg;
    dp_optim_step st = {lr, 0.0f};
    o->t++;
    if (c->kind == DP_OPTIM_ADAM) {
        /* Keras 2: lr_t = lr sqrt(1 - b2^t) / (1 - b1^t), epsilon added to sqrt(v). */
        double t = (double)o->t;
        st.lr_t = (float)(lr * sqrt(1.0 - pow(c->beta2, t)) / (1.0 - pow(c->beta1, t)));
    }
    return st;
}

/* Elementwise, each element with the same arithmetic wherever [lo, hi)
 * falls; each call sets its own MXCSR flush (the register is per thread). */
void dp_optim_apply_range(const dp_optim *o, const dp_optim_step *st, float *params,
                          const float *grads, size_t lo, size_t hi)
{
    const dp_optim_config *c = &o->cfg;
    size_t n = o->n;
    if (hi > n)
        hi = n;
    if (hi <= lo)
        return;
    float *p = params + lo;
    const float *g = grads + lo;
    float *s0 = o->state ? o->state + lo : NULL;
    size_t len = hi - lo;
    unsigned csr = flush_denormals_begin();
    switch (c->kind) {
    case DP_OPTIM_SGD: sgd_update(p, g, len, st->lr); break;
    case DP_OPTIM_MOMENTUM: momentum_update(p, g, s0, len, st->lr, c->momentum); break;
    case DP_OPTIM_NESTEROV: nesterov_update(p, g, s0, len, st->lr, c->momentum); break;
    case DP_OPTIM_ADAGRAD: adagrad_update(p, g, s0, len, st->lr, c->eps); break;
    case DP_OPTIM_ADAM:
        pick_adam(o->exact)(p, g, s0, s0 + n, len, st->lr_t, c->beta1, c->beta2, c->eps);
        break;
    default: break;
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
