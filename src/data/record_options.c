/* What a dataset of record files is read as: its format's and value
 * kinds' names and sizes, and the options with their defaults filled in
 * (include/downpour/records.h).  Below both files.c and records.c. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "records_impl.h"

const char *dp_data_format_name(dp_data_format f)
{
    switch (f) {
    case DP_DATA_TFRECORD: return "tfrecord";
    case DP_DATA_NPY: return "npy";
    case DP_DATA_CSV: return "csv";
    default: return "unknown";
    }
}

const char *dp_value_kind_name(dp_value_kind k)
{
    return k == DP_VALUES_U8 ? "uint8" : k == DP_VALUES_F32 ? "float32" : "unknown";
}

size_t dp_value_size(dp_value_kind k) { return k == DP_VALUES_U8 ? 1 : 4; }

void dp_data_options_default(dp_data_options *o)
{
    o->image = "image";
    o->label = NULL; /* an Example's "label"; a CSV picks its column */
    o->train = "*train*";
    o->test = "*test*";
    o->classes = 0;
    o->categorical = o->numeric = NULL;
    o->hash_buckets = 0;
    o->id_limits = NULL;
    o->n_id_limits = 0;
}

static uint64_t finalise(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t dp_id_hash_int(int64_t v) { return finalise((uint64_t)v); }

uint64_t dp_id_hash_text(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a 64 */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 0x100000001b3ULL;
    return finalise(h);
}

void dp_data_options_resolve(dp_data_options *out, const dp_data_options *opt)
{
    dp_data_options_default(out);
    if (!opt)
        return;
    if (opt->image)
        out->image = opt->image;
    out->label = opt->label;
    if (opt->train)
        out->train = opt->train;
    if (opt->test)
        out->test = opt->test;
    out->classes = opt->classes;
    out->categorical = opt->categorical;
    out->numeric = opt->numeric;
    out->hash_buckets = opt->hash_buckets;
    out->id_limits = opt->id_limits;
    out->n_id_limits = opt->n_id_limits;
}

uint32_t dp_data_classes(const dp_data_options *opt)
{
    return opt && opt->classes ? opt->classes : 256;
}

int dp_data_column_next(const char **s, int categorical, dp_data_column *c)
{
    const char *p = *s;
    if (!p || !*p)
        return 0;
    size_t n = strcspn(p, ",");
    *c = (dp_data_column){.item = p, .name = p, .item_len = n, .name_len = n,
                          .places = categorical ? 1 : 0};
    *s = p[n] == ',' ? p + n + 1 : p + n;
    const char *colon = NULL;
    for (const char *q = p; categorical && q < p + n; q++)
        if (*q == ':')
            colon = q;
    if (colon) {
        char *end;
        long m = strtol(colon + 1, &end, 10);
        if (end != p + n || m < 1 || m > DP_DATA_MAX_PLACES)
            return -1;
        c->name_len = (size_t)(colon - p);
        c->places = (int)m;
    }
    return c->name_len ? 1 : -1;
}

int dp_data_categorical_places(const char *list, int *places, int cap)
{
    int n = 0, rc;
    dp_data_column c;
    while ((rc = dp_data_column_next(&list, 1, &c)) > 0) {
        if (n < cap)
            places[n] = c.places;
        n++;
    }
    return rc < 0 ? -1 : n;
}

int dp_data_check_bags(const dp_data_options *o, const uint32_t *rows, const int *places,
                       int n_bags, uint32_t *limits, dp_err *err)
{
    enum { CAP = 4096 }; /* columns */
    int col_places[CAP];
    int n = dp_data_categorical_places(o->categorical, col_places, CAP);
    if (n < 0)
        return dp_errf(err, "--categorical '%s': expected names joined by ',', each NAME or "
                            "NAME:M with M in [1, %d]", o->categorical, DP_DATA_MAX_PLACES);
    if (n != n_bags)
        return dp_errf(err, "--categorical names %d column(s) but the model has %d embedding "
                            "bag(s): one column a bag, in the bags' order", n, n_bags);
    for (int k = 0; k < n && k < CAP; k++) {
        if (col_places[k] != places[k])
            return dp_errf(err, "--categorical: column %d holds %d id(s) a record but bag %d "
                                "takes %d (bag...m%d, or NAME:%d)", k + 1, col_places[k], k + 1,
                           places[k], places[k], places[k]);
        if (o->hash_buckets > rows[k])
            return dp_errf(err, "--hash-buckets %u is more than the %u rows of bag %d's table: "
                                "hashed ids must index every table", o->hash_buckets, rows[k],
                           k + 1);
        limits[k] = rows[k];
    }
    return 0;
}
