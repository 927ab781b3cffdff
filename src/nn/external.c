/* External models (include/downpour/external.h): the registry behind the
 * spec "external:NAME", and the layerless dp_model over the caller's
 * buffers that the loop and the strategies train. */
#include "downpour/external.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "downpour/model.h"

#define MAX_EXTERNAL 16
#define NAME_MAX_LEN 64

static struct {
    char name[NAME_MAX_LEN];
    const dp_external_model *m;
} table[MAX_EXTERNAL];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

int dp_external_register(const char *name, const dp_external_model *m, dp_err *err)
{
    if (!name || !name[0] || strlen(name) >= NAME_MAX_LEN)
        return dp_errf(err, "external model name '%s': 1 to %d characters", name ? name : "",
                       NAME_MAX_LEN - 1);
    int rc = -1, free_slot = -1;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < MAX_EXTERNAL; i++) {
        if (table[i].m && strcmp(table[i].name, name) == 0) {
            table[i].m = m; /* replaced, or removed with m NULL */
            rc = 0;
            break;
        }
        if (!table[i].m && free_slot < 0)
            free_slot = i;
    }
    if (rc < 0 && (!m || free_slot >= 0)) {
        if (m) {
            snprintf(table[free_slot].name, NAME_MAX_LEN, "%s", name);
            table[free_slot].m = m;
        }
        rc = 0;
    }
    pthread_mutex_unlock(&table_lock);
    return rc < 0 ? dp_errf(err, "external model '%s': the table of %d is full", name,
                            MAX_EXTERNAL)
                  : 0;
}

const dp_external_model *dp_external_find(const char *name)
{
    const dp_external_model *m = NULL;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < MAX_EXTERNAL && !m; i++)
        if (table[i].m && strcmp(table[i].name, name) == 0)
            m = table[i].m;
    pthread_mutex_unlock(&table_lock);
    return m;
}

int dp_model_init_external(dp_model *m, const dp_external_model *e, const char *name,
                           int max_batch, dp_err *err)
{
    memset(m, 0, sizeof *m);
    if (!e || e->n_params == 0 || !e->params || !e->grads)
        return dp_errf(err, "external model %s: needs n_params > 0 and both buffers",
                       name ? name : "");
    if (e->n_buffers && !e->buffers)
        return dp_errf(err, "external model %s: %zu buffers but no array", name ? name : "",
                       e->n_buffers);
    snprintf(m->spec, sizeof m->spec, "external:%s", name ? name : "model");
    snprintf(m->name, sizeof m->name, "%s", m->spec);
    m->n_params = e->n_params;
    m->params = e->params;
    m->grads = e->grads;
    m->n_buffers = e->n_buffers;
    m->buffers = e->n_buffers ? e->buffers : NULL;
    m->max_batch = max_batch;
    m->slots = 1;
    m->external = e;
    return 0;
}
