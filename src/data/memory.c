/* Datasets of caller-owned arrays (dataset.h, "In-memory datasets"): a
 * small registry of names, opened as "mem:NAME" by dp_dataset_open_with.
 * Nothing is copied: the splits point at the caller's records. */
#include "downpour/dataset.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define MEM_MAX 32
#define MEM_NAME 64

typedef struct mem_entry {
    char name[MEM_NAME];
    dp_memory_data d;
} mem_entry;

static mem_entry g_mem[MEM_MAX];
static pthread_mutex_t g_mem_lock = PTHREAD_MUTEX_INITIALIZER;

static mem_entry *find(const char *name)
{
    for (int i = 0; i < MEM_MAX; i++)
        if (g_mem[i].name[0] && strcmp(g_mem[i].name, name) == 0)
            return &g_mem[i];
    return NULL;
}

static int check_split(const char *name, const char *what, const void *x, const uint8_t *y,
                       uint32_t n, uint32_t classes, uint32_t *max_label, dp_err *err)
{
    if (n > 0 && (!x || !y))
        return dp_errf(err, "in-memory dataset %s: %u %s records but no %s", name, n, what,
                       !x ? "inputs" : "labels");
    for (uint32_t i = 0; i < n; i++) {
        if (classes && y[i] >= classes)
            return dp_errf(err, "in-memory dataset %s: %s label %u of record %u is not below "
                                "its %u classes", name, what, y[i], i, classes);
        if (y[i] > *max_label)
            *max_label = y[i];
    }
    return 0;
}

int dp_dataset_register(const char *name, const dp_memory_data *d, dp_err *err)
{
    if (!name || !*name || strlen(name) >= MEM_NAME)
        return dp_errf(err, "in-memory dataset: a name of 1 to %d characters is needed",
                       MEM_NAME - 1);
    uint64_t dim = (uint64_t)d->rows * d->cols * (d->channels ? d->channels : 1);
    if (dim == 0 || dim > (1u << 30))
        return dp_errf(err, "in-memory dataset %s: records of %ux%ux%u values", name, d->rows,
                       d->cols, d->channels);
    if (d->n_train == 0)
        return dp_errf(err, "in-memory dataset %s: no training records", name);
    uint32_t max_label = 0;
    if (check_split(name, "training", d->train_x, d->train_y, d->n_train, d->classes,
                    &max_label, err) < 0 ||
        check_split(name, "test", d->test_x, d->test_y, d->n_test, d->classes, &max_label,
                    err) < 0)
        return -1;
    pthread_mutex_lock(&g_mem_lock);
    mem_entry *e = find(name);
    for (int i = 0; i < MEM_MAX && !e; i++)
        if (!g_mem[i].name[0])
            e = &g_mem[i];
    if (!e) {
        pthread_mutex_unlock(&g_mem_lock);
        return dp_errf(err, "in-memory dataset %s: %d datasets are registered already; "
                            "unregister one first", name, MEM_MAX);
    }
    snprintf(e->name, sizeof e->name, "%s", name);
    e->d = *d;
    if (!e->d.classes)
        e->d.classes = max_label + 1 < 2 ? 2 : max_label + 1;
    pthread_mutex_unlock(&g_mem_lock);
    return 0;
}

int dp_dataset_unregister(const char *name)
{
    pthread_mutex_lock(&g_mem_lock);
    mem_entry *e = name ? find(name) : NULL;
    if (e)
        memset(e, 0, sizeof *e);
    pthread_mutex_unlock(&g_mem_lock);
    return e ? 0 : -1;
}

int dp_dataset_is_memory(const char *spec)
{
    if (!spec || strncmp(spec, DP_MEMORY_PREFIX, strlen(DP_MEMORY_PREFIX)) != 0)
        return 0;
    pthread_mutex_lock(&g_mem_lock);
    int found = find(spec + strlen(DP_MEMORY_PREFIX)) != NULL;
    pthread_mutex_unlock(&g_mem_lock);
    return found;
}

static void fill(dp_split *s, const dp_memory_data *d, const void *x, const uint8_t *y,
                 uint32_t n, uint32_t dim)
{
    memset(s, 0, sizeof *s);
    s->n = n;
    s->dim = dim;
    s->labels = y;
    if (d->is_float)
        s->values = x;
    else
        s->images = x;
}

int dp_dataset_memory_open(dp_dataset *ds, const char *spec, dp_err *err)
{
    memset(ds, 0, sizeof *ds);
    const char *name = spec + strlen(DP_MEMORY_PREFIX);
    pthread_mutex_lock(&g_mem_lock);
    mem_entry *e = find(name);
    dp_memory_data d;
    if (e)
        d = e->d;
    pthread_mutex_unlock(&g_mem_lock);
    if (!e)
        return dp_errf(err, "dataset %s: no in-memory dataset is registered as '%s'", spec,
                       name);
    uint32_t dim = d.rows * d.cols * (d.channels ? d.channels : 1);
    snprintf(ds->dir, sizeof ds->dir, "%s", spec);
    ds->rows = d.rows;
    ds->cols = d.cols;
    ds->channels = d.channels > 1 ? d.channels : 0;
    ds->classes = d.classes;
    fill(&ds->train_all, &d, d.train_x, d.train_y, d.n_train, dim);
    fill(&ds->test, &d, d.test_x, d.test_y, d.n_test, dim);
    return 0;
}
