/* All-reduce algorithms on the in-process transport (include/downpour/ring.h,
 * docs/strategies.md "All-reduce algorithms"), with fake host maps
 * (dp_inproc_set_hosts), for 2-6 members on 1-3 hosts, odd lengths and
 * segments smaller than a chunk:
 *   - the ring's sum is the documented left fold in ring order from each
 *     chunk's index, bit for bit;
 *   - direct gives bitwise the ring's sums;
 *   - hier gives bitwise the documented host-then-leaders fold, within float
 *     noise of the ring, every member bitwise the same;
 *   - a part of a buffer (dp_ring_allreduce_part) gets the whole sum's bits
 *     by every algorithm, and the rest is left alone;
 *   - auto picks hier exactly when 2 or more hosts have a member and some has
 *     several, the same choice on every member, and gives that choice's bits.
 * Values are random floats, so a different association shows. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "downpour/inproc.h"
#include "downpour/ring.h"

#define MAXN 6

typedef struct job {
    dp_transport *t;
    const int *order; /* ring order: transport ranks */
    int n;
    dp_allreduce_algo algo;
    int part;         /* the second call sums [len/3, 2len/3) only (dp_ring_allreduce_part) */
    size_t len[2];    /* two calls: the fit's choice may differ between them */
    float *buf[2];    /* in: this rank's values; out: the sums */
    dp_allreduce_algo chose[2];
    int rc;
    char msg[sizeof(dp_err)];
} job;

static void *run_rank(void *arg)
{
    job *j = arg;
    dp_ring r;
    dp_err err;
    if (dp_ring_init(&r, j->t, j->order, j->n, 20, 64, &err) < 0) { /* 16-float segments */
        j->rc = -1;
        snprintf(j->msg, sizeof j->msg, "%s", err.msg);
        return NULL;
    }
    dp_ring_set_algo(&r, j->algo);
    for (int c = 0; c < 2 && j->rc == 0; c++) {
        size_t lo = c && j->part ? j->len[c] / 3 : 0, hi = c && j->part ? 2 * j->len[c] / 3 : j->len[c];
        if (dp_ring_allreduce_part(&r, j->buf[c], j->len[c], lo, hi, (uint64_t)c + 1, 0, &err) < 0) {
            j->rc = -1;
            snprintf(j->msg, sizeof j->msg, "%s", err.msg);
        }
        j->chose[c] = dp_ring_choice(&r, j->len[c]);
    }
    dp_ring_free(&r);
    return NULL;
}

static long hier_differs; /* elements where hier's bits are not the ring's */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0) *
           (float)(1 + (rng & 7)); /* mixed magnitudes: association shows in the bits */
}

/* The ring's fold over m group members' values v[0..m) of element i of len:
 * from the index of i's chunk among m, in ring order. */
static float fold(const float *v, int m, size_t len, size_t i)
{
    int c = 0;
    while ((size_t)((uint64_t)len * (unsigned)(c + 1) / (unsigned)m) <= i)
        c++;
    float acc = v[c];
    for (int k = 1; k < m; k++)
        acc += v[(c + k) % m];
    return acc;
}

/* Runs every rank's job of one configuration; returns 0 when all passed. */
static int run_all(dp_transport **ts, const int *order, int n, dp_allreduce_algo algo, int part,
                   const size_t len[2], float *in[2][MAXN], float *out[2][MAXN],
                   dp_allreduce_algo chose[2][MAXN])
{
    job jobs[MAXN];
    pthread_t th[MAXN];
    for (int p = 0; p < n; p++) {
        jobs[p] = (job){.t = ts[order[p]], .order = order, .n = n, .algo = algo, .part = part};
        for (int c = 0; c < 2; c++) {
            jobs[p].len[c] = len[c];
            jobs[p].buf[c] = out[c][p];
            memcpy(out[c][p], in[c][p], (len[c] ? len[c] : 1) * sizeof(float));
        }
        REQUIRE(pthread_create(&th[p], NULL, run_rank, &jobs[p]) == 0);
    }
    int bad = 0;
    for (int p = 0; p < n; p++) {
        pthread_join(th[p], NULL);
        CHECKF(jobs[p].rc == 0, "%s, n %d, position %d: %s", dp_allreduce_algo_name(algo), n, p,
               jobs[p].msg);
        bad |= jobs[p].rc != 0;
        for (int c = 0; c < 2; c++)
            chose[c][p] = jobs[p].chose[c];
    }
    return bad;
}

static void config(int n, const int *host_of_rank, size_t len0, size_t len1)
{
    dp_transport *ts[MAXN];
    dp_err err;
    REQUIRE(dp_inproc_open(ts, n, &err) == 0);
    REQUIRE(dp_inproc_set_hosts(ts[0], host_of_rank, &err) == 0);
    /* Ring order is not rank order: position p is rank (p + 1) % n. */
    int order[MAXN], host_of_pos[MAXN];
    for (int p = 0; p < n; p++) {
        order[p] = (p + 1) % n;
        host_of_pos[p] = host_of_rank[order[p]];
    }
    size_t len[2] = {len0, len1};
    float *in[2][MAXN], *out[DP_ALGO_COUNT][2][MAXN], *outp[DP_ALGO_COUNT][2][MAXN];
    float(*x[2])[MAXN];
    for (int c = 0; c < 2; c++) {
        x[c] = malloc((len[c] + 1) * sizeof *x[c]);
        REQUIRE(x[c] != NULL);
        for (int p = 0; p < n; p++) {
            in[c][p] = malloc((len[c] + 1) * sizeof(float));
            REQUIRE(in[c][p] != NULL);
            for (size_t i = 0; i < len[c]; i++)
                x[c][i][p] = in[c][p][i] = frand();
            for (int a = 0; a < DP_ALGO_COUNT; a++) {
                REQUIRE((out[a][c][p] = malloc((len[c] + 1) * sizeof(float))) != NULL);
                REQUIRE((outp[a][c][p] = malloc((len[c] + 1) * sizeof(float))) != NULL);
            }
        }
    }
    dp_allreduce_algo chose[DP_ALGO_COUNT][2][MAXN], chosep[DP_ALGO_COUNT][2][MAXN];
    int failed = 0;
    for (int a = 0; a < DP_ALGO_COUNT; a++) {
        failed |= run_all(ts, order, n, (dp_allreduce_algo)a, 0, len, in, out[a], chose[a]);
        if (a != DP_ALGO_AUTO) /* (auto's parts are ring's or direct's: no second fit) */
            failed |= run_all(ts, order, n, (dp_allreduce_algo)a, 1, len, in, outp[a], chosep[a]);
    }
    for (int p = 0; p < n; p++)
        dp_transport_close(ts[p]);
    /* The hosts as the members see them: a host's members in ring order,
     * the leaders (each host's first) in ring order. */
    int hosts = 0, members[MAXN][MAXN], n_members[MAXN];
    int seen[16] = {0}, host_index[16];
    for (int p = 0; p < n; p++) {
        int h = host_of_pos[p];
        if (!seen[h]) {
            seen[h] = 1;
            host_index[h] = hosts;
            n_members[hosts] = 0;
            hosts++;
        }
        int k = host_index[h];
        members[k][n_members[k]++] = p;
    }
    int several = 0;
    for (int k = 0; k < hosts; k++)
        several |= n_members[k] > 1;
    int want_hier = hosts >= 2 && several;
    char what[96];
    snprintf(what, sizeof what, "n %d, %d host(s), len %zu/%zu", n, hosts, len0, len1);
    if (failed)
        goto out;
    for (int c = 0; c < 2; c++) {
        size_t L = len[c];
        int wrong[DP_ALGO_COUNT] = {0}, differ = 0;
        for (size_t i = 0; i < L; i++) {
            float ring = fold(x[c][i], n, L, i);
            /* hier: each host folds its members, the leaders fold the host sums */
            float host_sum[MAXN];
            for (int k = 0; k < hosts; k++) {
                float acc = x[c][i][members[k][0]];
                for (int j = 1; j < n_members[k]; j++)
                    acc += x[c][i][members[k][j]];
                host_sum[k] = acc;
            }
            float hier = fold(host_sum, hosts, L, i);
            differ += memcmp(&hier, &ring, sizeof hier) != 0;
            double mag = 0;
            for (int p = 0; p < n; p++)
                mag += fabs(x[c][i][p]);
            for (int p = 0; p < n; p++) {
                float r = out[DP_ALGO_RING][c][p][i], d = out[DP_ALGO_DIRECT][c][p][i];
                float h = out[DP_ALGO_HIER][c][p][i], u = out[DP_ALGO_AUTO][c][p][i];
                wrong[DP_ALGO_RING] += memcmp(&r, &ring, sizeof r) != 0;
                wrong[DP_ALGO_DIRECT] += memcmp(&d, &ring, sizeof d) != 0;
                wrong[DP_ALGO_HIER] += memcmp(&h, &hier, sizeof h) != 0;
                CHECKF(fabs(h - ring) <= 1e-6 * mag, "%s: hier %.9g vs ring %.9g", what,
                       (double)h, (double)ring);
                float want_u = chose[DP_ALGO_AUTO][c][0] == DP_ALGO_HIER ? hier : ring;
                wrong[DP_ALGO_AUTO] += memcmp(&u, &want_u, sizeof u) != 0;
            }
        }
        hier_differs += differ;
        for (int a = 0; a < DP_ALGO_COUNT; a++)
            CHECKF(wrong[a] == 0, "%s, call %d: %s differs from its fold in %d element(s)", what,
                   c, dp_allreduce_algo_name((dp_allreduce_algo)a), wrong[a]);
        /* A part: the whole sum's bits inside it, the input outside. */
        size_t plo = c ? L / 3 : 0, phi = c ? 2 * L / 3 : L;
        for (int a = 0; a < DP_ALGO_AUTO; a++) {
            int off = 0;
            for (int p = 0; p < n; p++)
                for (size_t i = 0; i < L; i++) {
                    const float *want = i >= plo && i < phi ? &out[a][c][p][i] : &in[c][p][i];
                    off += memcmp(&outp[a][c][p][i], want, sizeof(float)) != 0;
                }
            CHECKF(off == 0, "%s, call %d: %s's part sum is off in %d element(s)", what, c,
                   dp_allreduce_algo_name((dp_allreduce_algo)a), off);
        }
        for (int p = 0; p < n; p++) {
            CHECKF(chose[DP_ALGO_AUTO][c][p] == chose[DP_ALGO_AUTO][c][0],
                   "%s: auto chose %s at position %d, %s at 0", what,
                   dp_allreduce_algo_name(chose[DP_ALGO_AUTO][c][p]), p,
                   dp_allreduce_algo_name(chose[DP_ALGO_AUTO][c][0]));
            CHECK(chose[DP_ALGO_RING][c][p] == DP_ALGO_RING);
            CHECK(chose[DP_ALGO_DIRECT][c][p] == DP_ALGO_DIRECT);
            CHECK(chose[DP_ALGO_HIER][c][p] == DP_ALGO_HIER);
        }
        CHECKF((chose[DP_ALGO_AUTO][c][0] == DP_ALGO_HIER) == want_hier,
               "%s: auto chose %s", what, dp_allreduce_algo_name(chose[DP_ALGO_AUTO][c][0]));
    }
out:
    for (int c = 0; c < 2; c++) {
        free(x[c]);
        for (int p = 0; p < n; p++) {
            free(in[c][p]);
            for (int a = 0; a < DP_ALGO_COUNT; a++) {
                free(out[a][c][p]);
                free(outp[a][c][p]);
            }
        }
    }
}

int main(void)
{
    /* host maps by rank: one host; alternating over 2; blocks over 3; uneven */
    static const size_t lens[][2] = {{1, 7}, {5, 101}, {17, 1000}, {3, 4099}};
    for (int n = 2; n <= MAXN; n++)
        for (int m = 0; m < 4; m++) {
            int hosts[MAXN];
            for (int r = 0; r < n; r++)
                hosts[r] = m == 0 ? 0 : m == 1 ? r % 2 : m == 2 ? r * 3 / n : (r == 0 ? 1 : 0);
            config(n, hosts, lens[(n + m) % 4][0], lens[(n + m) % 4][1]);
        }
    /* One member per host: auto stays flat. */
    int apart[MAXN] = {0, 1, 2};
    config(3, apart, 9, 333);
    /* The test tells the associations apart: hier's bits differ somewhere. */
    CHECKF(hier_differs > 0, "hier's fold never differed from the ring's");
    printf("hier's sum differs from the ring's in the last bits of %ld elements\n", hier_differs);
    /* Names and their parse. */
    for (int a = 0; a < DP_ALGO_COUNT; a++)
        CHECK(dp_allreduce_algo_parse(dp_allreduce_algo_name((dp_allreduce_algo)a)) == a);
    CHECK(dp_allreduce_algo_parse("tree") == -1);
    CHECK(dp_allreduce_algo_parse(NULL) == -1);
    return check_failures != 0;
}
