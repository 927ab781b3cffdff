/* Datasets of record files: finding the files of a spec, sorting them into
 * the training and test splits, and counting their records (the contract is
 * include/downpour/records.h; docs/datasets.md, "Datasets of files").
 * Reading the records is records.c's job. */
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "downpour/npy.h"
#include "records_impl.h"

/* ---- names ---- */

/* The kinds of file a name can be; NPZ is DP_DATA_NPY's archive form. */
typedef enum file_kind { KIND_NONE, KIND_TFRECORD, KIND_NPY, KIND_NPZ, KIND_CSV } file_kind;

static const char *kind_name(file_kind k)
{
    static const char *names[] = {"unknown", "TFRecord", ".npy", ".npz", "CSV"};
    return names[k];
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static file_kind name_kind(const char *base)
{
    if (strstr(base, ".tfrecord") || ends_with(base, ".tfrec") || ends_with(base, ".tfrec.gz"))
        return KIND_TFRECORD;
    if (ends_with(base, ".npy"))
        return KIND_NPY;
    if (ends_with(base, ".npz"))
        return KIND_NPZ;
    if (ends_with(base, ".csv"))
        return KIND_CSV;
    return KIND_NONE;
}

/* Names a directory listing passes over: hidden files and the partial files
 * of writers (file.h's atomic writes, lock files). */
static int name_skipped(const char *base)
{
    return base[0] == '.' || ends_with(base, ".lock") || ends_with(base, ".tmp");
}

static int has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

static int is_regular(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* ---- dp_data_files_match ---- */

int dp_data_files_match(const char *spec)
{
    if (!spec || !*spec)
        return 0;
    if (has_glob_chars(spec))
        return 1;
    struct stat st;
    if (stat(spec, &st) != 0)
        return 0;
    if (S_ISREG(st.st_mode))
        return name_kind(base_name(spec)) != KIND_NONE;
    if (!S_ISDIR(st.st_mode))
        return 0;
    DIR *d = opendir(spec);
    if (!d)
        return 0;
    int known = 0, idx = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        /* An IDX dataset directory stays with the IDX path, whatever else
         * lies beside its files. */
        if (strcmp(e->d_name, "train-images-idx3-ubyte") == 0 ||
            strcmp(e->d_name, "train-images-idx3-ubyte.gz") == 0)
            idx = 1;
        else if (!name_skipped(e->d_name) && name_kind(e->d_name) != KIND_NONE)
            known = 1;
    }
    closedir(d);
    return known && !idx;
}

/* ---- finding ---- */

typedef struct found {
    char *path;
    file_kind kind;
} found;

typedef struct found_list {
    found *v;
    size_t n, cap;
} found_list;

static void found_free(found_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].path);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

static int found_add(found_list *l, const char *dir, const char *name, file_kind kind,
                     dp_err *err)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        found *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return dp_errf(err, "out of memory listing dataset files");
        l->v = v;
        l->cap = cap;
    }
    size_t n = (dir ? strlen(dir) + 1 : 0) + strlen(name) + 1;
    char *p = malloc(n);
    if (!p)
        return dp_errf(err, "out of memory listing dataset files");
    if (dir)
        snprintf(p, n, "%s/%s", dir, name);
    else
        snprintf(p, n, "%s", name);
    l->v[l->n].path = p;
    l->v[l->n].kind = kind;
    l->n++;
    return 0;
}

static int list_dir(found_list *l, const char *dir, dp_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return dp_errf(err, "cannot list %s: %s", dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        file_kind k = name_kind(e->d_name);
        if (name_skipped(e->d_name) || k == KIND_NONE)
            continue;
        rc = found_add(l, dir, e->d_name, k, err);
        if (rc == 0 && !is_regular(l->v[l->n - 1].path)) { /* a subdirectory named x.csv */
            free(l->v[--l->n].path);
        }
    }
    closedir(d);
    return rc;
}

static int list_glob(found_list *l, const char *spec, dp_err *err)
{
    glob_t g;
    int rc = glob(spec, 0, NULL, &g);
    if (rc == GLOB_NOMATCH)
        return dp_errf(err, "%s: no file matches", spec);
    if (rc != 0)
        return dp_errf(err, "%s: cannot expand the pattern (%s)", spec,
                       rc == GLOB_NOSPACE ? "out of memory" : "a directory could not be read");
    for (size_t i = 0; i < g.gl_pathc && rc == 0; i++) {
        const char *p = g.gl_pathv[i];
        file_kind k = name_kind(base_name(p));
        if (k == KIND_NONE || name_skipped(base_name(p)) || !is_regular(p))
            continue;
        rc = found_add(l, NULL, p, k, err);
    }
    globfree(&g);
    return rc;
}

static int list_spec(found_list *l, const char *spec, dp_err *err)
{
    if (has_glob_chars(spec))
        return list_glob(l, spec, err);
    struct stat st;
    if (stat(spec, &st) != 0)
        return dp_errf(err, "cannot read %s: %s", spec, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return list_dir(l, spec, err);
    if (!S_ISREG(st.st_mode))
        return dp_errf(err, "%s is neither a file nor a directory", spec);
    file_kind k = name_kind(base_name(spec));
    if (k == KIND_NONE)
        return dp_errf(err, "%s: not a file of a known format (*.tfrecord*, *.tfrec, *.npy, "
                       "*.npz, *.csv)", spec);
    return found_add(l, NULL, spec, k, err);
}

static int cmp_found(const void *a, const void *b)
{
    return strcmp(((const found *)a)->path, ((const found *)b)->path);
}

/* ---- splits ---- */

static char *dup_str(const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

static void file_free(dp_data_file *f)
{
    free(f->path);
    free(f->labels_path);
    free(f->member);
    free(f->labels_member);
    memset(f, 0, sizeof *f);
}

static void split_free(dp_data_split_files *s)
{
    for (size_t i = 0; i < s->n; i++)
        file_free(&s->files[i]);
    free(s->files);
    memset(s, 0, sizeof *s);
}

void dp_data_files_free(dp_data_files *f)
{
    if (!f)
        return;
    split_free(&f->train);
    split_free(&f->test);
    memset(f, 0, sizeof *f);
}

/* Appends a file (the strings are copied); its records are not known yet. */
static int split_add(dp_data_split_files *s, const char *path, const char *labels_path,
                     const char *member, const char *labels_member, dp_err *err)
{
    dp_data_file *v = realloc(s->files, (s->n + 1) * sizeof *v);
    if (!v)
        return dp_errf(err, "out of memory listing dataset files");
    s->files = v;
    dp_data_file *f = &v[s->n];
    memset(f, 0, sizeof *f);
    f->path = dup_str(path);
    f->labels_path = dup_str(labels_path);
    f->member = dup_str(member);
    f->labels_member = dup_str(labels_member);
    s->n++;
    if (!f->path || (labels_path && !f->labels_path) || (member && !f->member) ||
        (labels_member && !f->labels_member))
        return dp_errf(err, "out of memory listing dataset files");
    return 0;
}

/* keras's names: y_train.npy, or anything holding "label". */
static int is_labels_name(const char *base) { return base[0] == 'y' || strstr(base, "label"); }

/* A split of .npy files is one pair: features and labels. */
static int npy_pair(dp_data_split_files *s, const char **paths, size_t n, const char *which,
                    dp_err *err)
{
    if (n != 2)
        return dp_errf(err, "%s: the %s split has %zu .npy files; it must be one pair, the "
                       "features and the labels (x_%s.npy and y_%s.npy)",
                       paths[0], which, n, which, which);
    int l0 = is_labels_name(base_name(paths[0])) != 0, l1 = is_labels_name(base_name(paths[1])) != 0;
    if (l0 == l1)
        return dp_errf(err, "%s and %s: cannot tell which holds the labels (its name starts "
                       "with \"y\" or holds \"label\"; the other's does not)", paths[0], paths[1]);
    return split_add(s, l0 ? paths[1] : paths[0], l0 ? paths[0] : paths[1], NULL, NULL, err);
}

static int npz_splits(dp_data_files *out, const char *path, dp_err *err)
{
    char **names;
    size_t n;
    if (dp_npz_list(path, &names, &n, err) != 0)
        return -1;
    static const char *want[4] = {"x_train", "y_train", "x_test", "y_test"};
    int have[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++)
            have[k] |= strcmp(names[i], want[k]) == 0;
    if (!(have[0] && have[1] && have[2] && have[3])) {
        char list[256] = "";
        size_t at = 0;
        for (size_t i = 0; i < n && at < sizeof list - 1; i++) {
            int w = snprintf(list + at, sizeof list - at, "%s%s", i ? ", " : "", names[i]);
            at += w > 0 ? (size_t)w : 0;
        }
        dp_npz_list_free(names, n);
        return dp_errf(err, "%s: an .npz dataset holds the arrays x_train, y_train, x_test and "
                       "y_test (keras's mnist.npz); this one holds %s", path,
                       n ? list : "none");
    }
    dp_npz_list_free(names, n);
    if (split_add(&out->train, path, NULL, "x_train", "y_train", err) != 0 ||
        split_add(&out->test, path, NULL, "x_test", "y_test", err) != 0)
        return -1;
    return 0;
}

static int find_files(dp_data_files *out, const char *spec, const dp_data_options *o,
                      found_list *l, dp_err *err)
{
    if (list_spec(l, spec, err) != 0)
        return -1;
    if (l->n == 0)
        return dp_errf(err, "%s: no TFRecord, .npy, .npz or CSV file", spec);
    qsort(l->v, l->n, sizeof *l->v, cmp_found);
    for (size_t i = 1; i < l->n; i++)
        if (l->v[i].kind != l->v[0].kind)
            return dp_errf(err, "%s: formats may not be mixed: %s is a %s file, %s a %s file",
                           spec, l->v[0].path, kind_name(l->v[0].kind), l->v[i].path,
                           kind_name(l->v[i].kind));
    file_kind k = l->v[0].kind;
    out->format = k == KIND_TFRECORD ? DP_DATA_TFRECORD : k == KIND_CSV ? DP_DATA_CSV : DP_DATA_NPY;
    /* named columns: each .npz is one file of its split, its columns arrays */
    int npz_named = k == KIND_NPZ && (o->categorical || o->numeric);
    if (k == KIND_NPZ && !npz_named) {
        if (l->n > 1)
            return dp_errf(err, "%s: %zu .npz files (%s, %s, ...); an .npz holds a whole "
                           "dataset, give one", spec, l->n, l->v[0].path, l->v[1].path);
        return npz_splits(out, l->v[0].path, err);
    }
    const char **tr = malloc(l->n * sizeof *tr), **te = malloc(l->n * sizeof *te);
    size_t ntr = 0, nte = 0;
    int rc = tr && te ? 0 : dp_errf(err, "out of memory listing dataset files");
    for (size_t i = 0; i < l->n && rc == 0; i++) {
        const char *b = base_name(l->v[i].path);
        int a = fnmatch(o->train, b, 0) == 0, t = fnmatch(o->test, b, 0) == 0;
        if (a && t)
            rc = dp_errf(err, "%s matches both the training pattern \"%s\" and the test pattern "
                         "\"%s\"", l->v[i].path, o->train, o->test);
        else if (!a && !t)
            rc = dp_errf(err, "%s matches neither the training pattern \"%s\" nor the test "
                         "pattern \"%s\"", l->v[i].path, o->train, o->test);
        else if (a)
            tr[ntr++] = l->v[i].path;
        else
            te[nte++] = l->v[i].path;
    }
    if (rc == 0 && (ntr == 0 || nte == 0))
        rc = dp_errf(err, "%s: no %s file: none of the %zu files (%s%s) matches the %s pattern "
                     "\"%s\"", spec, ntr ? "test" : "training", l->n, l->v[0].path,
                     l->n > 1 ? ", ..." : "", ntr ? "test" : "training", ntr ? o->test : o->train);
    if (rc == 0 && k == KIND_NPY)
        rc = npy_pair(&out->train, tr, ntr, "train", err) != 0 ||
                     npy_pair(&out->test, te, nte, "test", err) != 0
                 ? -1
                 : 0;
    for (size_t i = 0; rc == 0 && k != KIND_NPY && i < ntr; i++)
        rc = split_add(&out->train, tr[i], NULL, NULL, NULL, err);
    for (size_t i = 0; rc == 0 && k != KIND_NPY && i < nte; i++)
        rc = split_add(&out->test, te[i], NULL, NULL, NULL, err);
    free(tr);
    free(te);
    return rc;
}

int dp_data_files_find(dp_data_files *out, const char *spec, const dp_data_options *opt,
                       dp_err *err)
{
    memset(out, 0, sizeof *out);
    if (!spec || !*spec)
        return dp_errf(err, "empty dataset spec");
    dp_data_options o;
    dp_data_options_resolve(&o, opt);
    found_list l = {0};
    int rc = find_files(out, spec, &o, &l, err);
    found_free(&l);
    if (rc != 0)
        dp_data_files_free(out);
    return rc;
}

/* ---- counting ---- */

static int count_file(dp_data_file *f, dp_data_format format, const dp_record_shape *shape,
                      const dp_data_options *o, void *features, dp_err *err)
{
    dp_record_reader *r;
    if (dp_record_open(&r, f, format, shape, o, err) != 0)
        return -1;
    uint8_t label;
    int rc = dp_record_next(r, features, &label, err); /* the first record, checked whole */
    f->records = 0;
    if (rc == 1) {
        int64_t more = dp_record_skip(r, UINT64_MAX, err);
        if (more < 0)
            rc = -1;
        else
            f->records = 1 + (uint64_t)more;
    }
    dp_record_close(r);
    return rc < 0 ? -1 : 0;
}

int dp_data_files_count(dp_data_files *f, const dp_data_options *opt, dp_err *err)
{
    dp_data_options o;
    dp_data_options_resolve(&o, opt);
    f->counted = 0;
    int have = 0;
    for (size_t i = 0; i < f->train.n && !have; i++) {
        have = dp_record_probe(&f->train.files[i], f->format, &o, &f->shape, err);
        if (have < 0)
            return -1;
    }
    if (!have)
        return dp_errf(err, "%s: the training files hold no record",
                       f->train.n ? f->train.files[0].path : "(none)");
    void *features = malloc((size_t)f->shape.dim * dp_value_size(f->shape.kind));
    if (!features)
        return dp_errf(err, "out of memory for a record of %u values", f->shape.dim);
    dp_data_split_files *splits[2] = {&f->train, &f->test};
    int rc = 0;
    for (int s = 0; s < 2 && rc == 0; s++) {
        uint64_t at = 0;
        for (size_t i = 0; i < splits[s]->n && rc == 0; i++) {
            dp_data_file *df = &splits[s]->files[i];
            rc = count_file(df, f->format, &f->shape, &o, features, err);
            df->first = at;
            at += df->records;
        }
        splits[s]->records = at;
        if (rc == 0 && at == 0)
            rc = dp_errf(err, "%s: the %s files hold no record",
                         splits[s]->n ? splits[s]->files[0].path : "(no file)",
                         s ? "test" : "training");
    }
    free(features);
    if (rc == 0)
        f->counted = 1;
    return rc;
}
