/* A synthetic click-through set (synth_ctr.h; docs/datasets.md, "Synthetic
 * click-through data"): every record a pure function of (config, split,
 * row), ids by rejection-inversion Zipf sampling, labels from a logistic
 * model whose per-id weights are hashes of the seed. */
#include "downpour/synth_ctr.h"

#include <math.h>
#include <string.h>

#include "downpour/rng.h"

dp_ctr_synth dp_ctr_synth_defaults(void)
{
    dp_ctr_synth s;
    memset(&s, 0, sizeof s);
    s.n_cat = 8;
    for (int f = 0; f < DP_CTR_MAX_FEATURES; f++)
        s.card[f] = 1000, s.places[f] = 1;
    s.n_num = 4;
    s.zipf = 1.1;
    s.id_scale = 0.5;
    s.num_scale = 0.3;
    s.bias = -1.1;
    s.seed = 1;
    return s;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* A uniform double in (0, 1) from 53 bits. */
static double unit(uint64_t h) { return ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

/* A standard normal from a hash (Box-Muller on two hashed uniforms). */
static double normal_of(uint64_t h)
{
    double u = unit(mix(h)), v = unit(mix(h ^ 0x5851f42d4c957f2dULL));
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* ---- Zipf by rejection-inversion (Hoermann and Derflinger 1996, as
 * Apache Commons RNG's RejectionInversionZipfSampler) ---- */

static double helper1(double x) /* log1p(x) / x */
{
    return fabs(x) > 1e-8 ? log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
}

static double helper2(double x) /* expm1(x) / x */
{
    return fabs(x) > 1e-8 ? expm1(x) / x
                          : 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
}

static double h(double x, double e) { return exp(-e * log(x)); }

static double h_integral(double x, double e)
{
    double lx = log(x);
    return helper2((1.0 - e) * lx) * lx;
}

static double h_integral_inv(double x, double e)
{
    double t = x * (1.0 - e);
    if (t < -1.0)
        t = -1.0; /* rounding at the lower end */
    return exp(helper1(t) * x);
}

int dp_ctr_synth_init(dp_ctr_synth *s, dp_err *err)
{
    if (s->n_cat < 0 || s->n_cat > DP_CTR_MAX_FEATURES)
        return dp_errf(err, "categorical features: %d, expected 0 to %d", s->n_cat,
                       DP_CTR_MAX_FEATURES);
    if (s->n_num < 0 || s->n_num > DP_CTR_MAX_NUMERIC)
        return dp_errf(err, "numeric features: %d, expected 0 to %d", s->n_num,
                       DP_CTR_MAX_NUMERIC);
    if (s->n_cat + s->n_num == 0)
        return dp_errf(err, "no features: give categorical or numeric ones");
    if (!(s->zipf > 0 && s->zipf <= 10))
        return dp_errf(err, "Zipf exponent %g: expected above 0, at most 10", s->zipf);
    if (!(s->id_scale >= 0 && s->id_scale <= 10) || !(s->num_scale >= 0 && s->num_scale <= 10) ||
        !(fabs(s->bias) <= 20))
        return dp_errf(err, "the generating model's scales must lie in [0, 10] and its bias "
                            "in [-20, 20]");
    for (int f = 0; f < s->n_cat; f++) {
        if (s->card[f] < 1 || s->card[f] > DP_CTR_MAX_IDS)
            return dp_errf(err, "categorical feature %d: %u ids, expected 1 to %ld (ids are "
                                "stored as floats, exact below 2^24)",
                           f, s->card[f], DP_CTR_MAX_IDS);
        if (s->places[f] < 1 || s->places[f] > DP_CTR_MAX_PLACES)
            return dp_errf(err, "categorical feature %d: %d places, expected 1 to %d", f,
                           s->places[f], DP_CTR_MAX_PLACES);
        double e = s->zipf, n = s->card[f];
        s->hx1[f] = h_integral(1.5, e) - 1.0;
        s->hxn[f] = h_integral(n + 0.5, e);
        s->s_[f] = 2.0 - h_integral_inv(h_integral(2.5, e) - h(2.0, e), e);
    }
    return 0;
}

int dp_ctr_synth_width(const dp_ctr_synth *s)
{
    int w = s->n_num;
    for (int f = 0; f < s->n_cat; f++)
        w += s->places[f];
    return w;
}

static double uniform(dp_rng *r) { return unit(dp_rng_u64(r)); }

/* A rank in [1, N] of feature f. */
static uint32_t zipf_draw(const dp_ctr_synth *s, int f, dp_rng *r)
{
    double e = s->zipf, n = s->card[f];
    for (;;) {
        double u = s->hxn[f] + uniform(r) * (s->hx1[f] - s->hxn[f]);
        double x = h_integral_inv(u, e);
        double k = floor(x + 0.5);
        if (k < 1)
            k = 1;
        else if (k > n)
            k = n;
        if (k - x <= s->s_[f] || u >= h_integral(k + 0.5, e) - h(k, e))
            return (uint32_t)k;
    }
}

/* The generating model's weight of id `id` of feature f. */
static double id_weight(const dp_ctr_synth *s, int f, uint32_t id)
{
    return s->id_scale * normal_of(mix(s->seed * 0x100000001b3ULL + (uint64_t)f) ^ id);
}

void dp_ctr_synth_row(const dp_ctr_synth *s, int split, uint64_t row, float *x, uint8_t *y,
                      double *p)
{
    dp_rng r;
    dp_rng_seed(&r, mix(mix(s->seed ^ ((uint64_t)split << 62)) + row));
    double z = s->bias;
    int at = 0;
    for (int f = 0; f < s->n_cat; f++) {
        int M = s->places[f];
        int used = M == 1 ? 1 : 1 + (int)dp_rng_below(&r, (uint32_t)M);
        double sum = 0;
        for (int j = 0; j < M; j++) {
            if (j >= used) {
                x[at++] = -1.0f;
                continue;
            }
            uint32_t id = zipf_draw(s, f, &r) - 1;
            x[at++] = (float)id;
            sum += id_weight(s, f, id);
        }
        z += sum / used;
    }
    for (int j = 0; j < s->n_num; j++) {
        double v = normal_of(dp_rng_u64(&r));
        x[at++] = (float)v;
        z += s->num_scale * normal_of(mix(s->seed ^ 0xa0761d6478bd642fULL) + (uint64_t)j) *
             (double)(float)v;
    }
    double pr = 1.0 / (1.0 + exp(-z));
    *y = uniform(&r) < pr;
    *p = pr;
}

void dp_ctr_synth_mark_seen(const dp_ctr_synth *s, const float *x, uint8_t *const *seen)
{
    int at = 0;
    for (int f = 0; f < s->n_cat; f++)
        for (int j = 0; j < s->places[f]; j++, at++)
            if (x[at] >= 0) {
                uint32_t id = (uint32_t)x[at];
                seen[f][id >> 3] |= (uint8_t)(1u << (id & 7));
            }
}

/* E[sigmoid(z + sd t)], t ~ Normal(0, 1), by the trapezoid rule over
 * t in [-10, 10] (the tails beyond weigh below 1e-22).  The integrand is
 * analytic in a strip of half-width pi / sd (sigmoid's poles), so the
 * rule's error falls as exp(-2 pi (pi / sd) / h): a step h of at most
 * 0.6 / sd keeps it below exp(-30), and 1/8 suffices up to sd = 4.8. */
static double expected_sigmoid(double z, double sd)
{
    double h = sd > 4.8 ? 0.6 / sd : 0.125, num = 0, den = 0;
    long half = (long)ceil(10.0 / h);
    for (long i = -half; i <= half; i++) {
        double t = (double)i * h, w = exp(-0.5 * t * t);
        num += w / (1.0 + exp(-(z + sd * t)));
        den += w;
    }
    return num / den;
}

double dp_ctr_synth_seen_p(const dp_ctr_synth *s, const float *x, const uint8_t *const *seen)
{
    double z = s->bias, v = 0;
    int at = 0;
    for (int f = 0; f < s->n_cat; f++) {
        int used = 0, unseen = 0;
        double sum = 0;
        for (int j = 0; j < s->places[f]; j++, at++) {
            if (x[at] < 0)
                continue;
            uint32_t id = (uint32_t)x[at];
            used++;
            if (seen[f][id >> 3] & (1u << (id & 7)))
                sum += id_weight(s, f, id);
            else
                unseen++;
        }
        if (used == 0)
            continue;
        z += sum / used;
        v += unseen * (s->id_scale / used) * (s->id_scale / used);
    }
    for (int j = 0; j < s->n_num; j++, at++)
        z += s->num_scale * normal_of(mix(s->seed ^ 0xa0761d6478bd642fULL) + (uint64_t)j) *
             (double)x[at];
    return v == 0 ? 1.0 / (1.0 + exp(-z)) : expected_sigmoid(z, sqrt(v));
}

void dp_ctr_synth_add_info(const dp_ctr_synth *s, const float *x, double p, float *const *info)
{
    int at = 0;
    for (int f = 0; f < s->n_cat; f++) {
        int used = 0;
        for (int j = 0; j < s->places[f]; j++)
            used += x[at + j] >= 0;
        for (int j = 0; j < s->places[f]; j++, at++)
            if (x[at] >= 0)
                info[f][(uint32_t)x[at]] += (float)(p * (1 - p) / ((double)used * used));
    }
}

double dp_ctr_synth_bayes_p(const dp_ctr_synth *s, uint64_t row, const float *x,
                            const float *const *info)
{
    double z = s->bias, v = 0, prior = 1.0 / (s->id_scale * s->id_scale);
    int at = 0;
    for (int f = 0; f < s->n_cat; f++) {
        int used = 0;
        for (int j = 0; j < s->places[f]; j++)
            used += x[at + j] >= 0;
        double sum = 0, var = 0;
        for (int j = 0; j < s->places[f]; j++, at++) {
            if (x[at] < 0)
                continue;
            uint32_t id = (uint32_t)x[at];
            double post = s->id_scale > 0 ? 1.0 / (prior + info[f][id]) : 0;
            /* the posterior mean: the weight, missed by a draw of the
             * posterior's spread (shrunk to 0 for an id never seen) */
            double w = id_weight(s, f, id), k = post * prior;
            uint64_t h = mix(mix(s->seed ^ 0x6a09e667f3bcc909ULL) + row) ^ ((uint64_t)f << 32 | j);
            sum += (1 - k) * w + sqrt(post * (1 - k)) * normal_of(h);
            var += post;
        }
        if (used == 0)
            continue;
        z += sum / used;
        v += var / ((double)used * used);
    }
    for (int j = 0; j < s->n_num; j++, at++)
        z += s->num_scale * normal_of(mix(s->seed ^ 0xa0761d6478bd642fULL) + (uint64_t)j) *
             (double)x[at];
    return v == 0 ? 1.0 / (1.0 + exp(-z)) : expected_sigmoid(z, sqrt(v));
}
