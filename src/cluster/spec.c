/* Cluster spec: TF_CONFIG-shaped JSON in, a rank-ordered table of tasks out.
 * Every refusal names the field ("cluster.worker[2]", "task.index") and the
 * offending value, so a user can fix the spec without reading this file. */
#include "downpour/cluster.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "downpour/log.h"

static const char *const role_names[DP_ROLE_COUNT] = {"chief", "worker", "ps"};

const char *dp_role_name(dp_role role)
{
    return (unsigned)role < DP_ROLE_COUNT ? role_names[role] : NULL;
}

static int role_from_name(const char *s, size_t len, dp_role *role)
{
    for (int r = 0; r < DP_ROLE_COUNT; r++)
        if (strlen(role_names[r]) == len && strncmp(role_names[r], s, len) == 0) {
            *role = (dp_role)r;
            return 0;
        }
    return -1;
}

/* A printable, bounded copy of untrusted text for messages. */
static const char *shown(const char *s, char *buf, size_t size)
{
    size_t n = 0;
    for (; s[n] && n + 4 < size; n++)
        buf[n] = (s[n] >= 0x20 && s[n] < 0x7f) ? s[n] : '?';
    if (s[n]) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n] = '\0';
    return buf;
}

static int unknown_type(const char *what, const char *type, size_t len, dp_err *err)
{
    char buf[72];
    char t[64];
    snprintf(t, sizeof t, "%.*s", (int)(len < 60 ? len : 60), type);
    if (strcmp(t, "evaluator") == 0)
        return dp_errf(err, "%s: task type \"evaluator\" is not supported (expected chief, "
                            "worker or ps). Hint: evaluate a checkpoint with `downpour eval`; "
                            "the chief also evaluates during training",
                       what);
    return dp_errf(err, "%s: unknown task type \"%s\" (expected chief, worker or ps)", what,
                   shown(t, buf, sizeof buf));
}

int dp_task_parse(const char *s, dp_role *role, int *index, dp_err *err)
{
    char buf[72];
    if (!s || !*s)
        return dp_errf(err, "task: empty, expected TYPE:INDEX such as worker:0");
    const char *colon = strchr(s, ':');
    size_t len = colon ? (size_t)(colon - s) : strlen(s);
    dp_role r;
    if (role_from_name(s, len, &r) < 0) {
        char what[96];
        snprintf(what, sizeof what, "task \"%s\"", shown(s, buf, sizeof buf));
        return unknown_type(what, s, len, err);
    }
    long idx = 0;
    if (colon) {
        dp_err e;
        if (dp_parse_long(colon + 1, 0, DP_CLUSTER_MAX_TASKS - 1, &idx, "index", &e) < 0)
            return dp_errf(err, "task \"%s\": %s (expected TYPE:INDEX such as worker:0)",
                           shown(s, buf, sizeof buf), e.msg);
    } else if (r != DP_ROLE_CHIEF) {
        return dp_errf(err, "task \"%s\": missing index (expected TYPE:INDEX such as %s:0)",
                       shown(s, buf, sizeof buf), role_names[r]);
    }
    *role = r;
    *index = (int)idx;
    return 0;
}

static int valid_name_host(const char *h, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)h[i];
        if (!isalnum(ch) && ch != '-' && ch != '.' && ch != '_')
            return 0;
    }
    return 1;
}

static int valid_v6_host(const char *h, size_t len)
{
    char a[DP_CLUSTER_MAX_ADDR + 1];
    const char *pct = memchr(h, '%', len);
    size_t alen = pct ? (size_t)(pct - h) : len;
    if (alen == 0 || alen >= sizeof a)
        return 0;
    memcpy(a, h, alen);
    a[alen] = '\0';
    struct in6_addr in6;
    if (inet_pton(AF_INET6, a, &in6) != 1)
        return 0;
    if (pct) { /* zone id: fe80::1%eth0 */
        if (pct + 1 == h + len)
            return 0;
        return valid_name_host(pct + 1, len - alen - 1);
    }
    return 1;
}

int dp_hostport_parse(const char *s, char *host, size_t hostsz, int *port, const char *what,
                      dp_err *err)
{
    char buf[72];
    if (!s)
        return dp_errf(err, "%s: missing address", what);
    size_t n = strlen(s);
    if (n == 0)
        return dp_errf(err, "%s: empty address, expected host:port", what);
    if (n > DP_CLUSTER_MAX_ADDR)
        return dp_errf(err, "%s: \"%s\": address longer than %d characters", what,
                       shown(s, buf, sizeof buf), DP_CLUSTER_MAX_ADDR);
    const char *h, *p;
    size_t hlen;
    int v6 = 0;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close)
            return dp_errf(err, "%s: \"%s\": missing ']' after the IPv6 address", what,
                           shown(s, buf, sizeof buf));
        h = s + 1;
        hlen = (size_t)(close - h);
        if (close[1] != ':')
            return dp_errf(err, "%s: \"%s\": missing port (expected [address]:port)", what,
                           shown(s, buf, sizeof buf));
        p = close + 2;
        v6 = 1;
    } else {
        const char *colon = strrchr(s, ':');
        if (!colon)
            return dp_errf(err, "%s: \"%s\": missing port (expected host:port)", what,
                           shown(s, buf, sizeof buf));
        if (memchr(s, ':', (size_t)(colon - s)))
            return dp_errf(err, "%s: \"%s\": an IPv6 address needs brackets, e.g. "
                                "\"[::1]:2222\"", what, shown(s, buf, sizeof buf));
        h = s;
        hlen = (size_t)(colon - s);
        p = colon + 1;
    }
    if (hlen == 0)
        return dp_errf(err, "%s: \"%s\": empty host", what, shown(s, buf, sizeof buf));
    if (v6 ? !valid_v6_host(h, hlen) : !valid_name_host(h, hlen))
        return dp_errf(err, "%s: \"%s\": invalid %s", what, shown(s, buf, sizeof buf),
                       v6 ? "IPv6 address" : "host name (letters, digits, '-', '.', '_')");
    if (!*p)
        return dp_errf(err, "%s: \"%s\": missing port (expected host:port)", what,
                       shown(s, buf, sizeof buf));
    long v = 0;
    for (const char *q = p; *q; q++) {
        if (*q < '0' || *q > '9')
            return dp_errf(err, "%s: \"%s\": port \"%s\" is not a number", what,
                           shown(s, buf, sizeof buf), p);
        if (v <= 65535)
            v = v * 10 + (*q - '0');
    }
    if (v < 1 || v > 65535)
        return dp_errf(err, "%s: \"%s\": port out of range (1..65535)", what,
                       shown(s, buf, sizeof buf));
    if (hlen + 1 > hostsz)
        return dp_errf(err, "%s: host too long", what);
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (int)v;
    return 0;
}

void dp_cluster_free(dp_cluster *c)
{
    if (!c)
        return;
    free(c->tasks);
    memset(c, 0, sizeof *c);
}

int dp_cluster_rank(const dp_cluster *c, dp_role role, int index)
{
    if ((unsigned)role >= DP_ROLE_COUNT || index < 0 || index >= c->count[role])
        return -1;
    int rank = index;
    for (int r = 0; r < (int)role; r++)
        rank += c->count[r];
    return rank;
}

int dp_cluster_is_spare(const dp_cluster *c, int rank, int spare)
{
    if (spare <= 0 || rank < 0 || rank >= c->n_tasks || c->tasks[rank].role != DP_ROLE_WORKER)
        return 0;
    return c->tasks[rank].index >= c->count[DP_ROLE_WORKER] - spare;
}

static void set_task(dp_task *t, dp_role role, int index, int rank)
{
    t->role = role;
    t->index = index;
    t->rank = rank;
    snprintf(t->name, sizeof t->name, "%s:%d", role_names[role], index);
}

/* Refuses two tasks with the same host and port (host compared without case;
 * names are not resolved, so "localhost" and "127.0.0.1" count as different). */
static int cmp_addr(const void *a, const void *b, void *ctx)
{
    const dp_task *tasks = ctx;
    const dp_task *x = &tasks[*(const int *)a], *y = &tasks[*(const int *)b];
    int d = strcasecmp(x->host, y->host);
    if (d)
        return d;
    if (x->port != y->port)
        return x->port < y->port ? -1 : 1;
    return x->rank < y->rank ? -1 : (x->rank > y->rank);
}

static int check_duplicates(const dp_cluster *c, dp_err *err)
{
    if (c->n_tasks < 2)
        return 0;
    int *idx = malloc((size_t)c->n_tasks * sizeof *idx);
    if (!idx)
        return dp_errf(err, "out of memory checking %d addresses", c->n_tasks);
    for (int i = 0; i < c->n_tasks; i++)
        idx[i] = i;
    qsort_r(idx, (size_t)c->n_tasks, sizeof *idx, cmp_addr, c->tasks);
    int rc = 0;
    for (int i = 1; i < c->n_tasks; i++) {
        const dp_task *a = &c->tasks[idx[i - 1]], *b = &c->tasks[idx[i]];
        if (a->port == b->port && strcasecmp(a->host, b->host) == 0) {
            char buf[72];
            rc = dp_errf(err, "cluster.%s[%d]: \"%s\": duplicate address, already used by "
                              "cluster.%s[%d]",
                         role_names[b->role], b->index, shown(b->addr, buf, sizeof buf),
                         role_names[a->role], a->index);
            break;
        }
    }
    free(idx);
    return rc;
}

static int parse_task_object(const cJSON *task, dp_role *role, int *index, dp_err *err)
{
    if (!cJSON_IsObject(task))
        return dp_errf(err, "task: expected an object like {\"type\": \"worker\", \"index\": 0}");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(task, "type");
    const cJSON *ix = cJSON_GetObjectItemCaseSensitive(task, "index");
    if (!type)
        return dp_errf(err, "task.type: missing (chief, worker or ps)");
    if (!cJSON_IsString(type) || !type->valuestring)
        return dp_errf(err, "task.type: expected a string (chief, worker or ps)");
    if (role_from_name(type->valuestring, strlen(type->valuestring), role) < 0)
        return unknown_type("task.type", type->valuestring, strlen(type->valuestring), err);
    if (!ix)
        return dp_errf(err, "task.index: missing");
    if (!cJSON_IsNumber(ix))
        return dp_errf(err, "task.index: expected a number");
    double d = ix->valuedouble;
    if (!(d >= 0 && d < DP_CLUSTER_MAX_TASKS) || d != (double)(int)d)
        return dp_errf(err, "task.index: %g is not an index (an integer 0..%d)", d,
                       DP_CLUSTER_MAX_TASKS - 1);
    *index = (int)d;
    return 0;
}

static int parse_root(dp_cluster *c, const cJSON *root, const char *task_override, dp_err *err)
{
    char buf[72];
    if (!cJSON_IsObject(root))
        return dp_errf(err, "spec: expected a JSON object with \"cluster\" and \"task\"");
    const cJSON *cluster = NULL, *task = NULL;
    for (const cJSON *it = root->child; it; it = it->next) {
        const char *k = it->string ? it->string : "";
        if (strcmp(k, "cluster") == 0) {
            if (cluster)
                return dp_errf(err, "cluster: given twice");
            cluster = it;
        } else if (strcmp(k, "task") == 0) {
            if (task)
                return dp_errf(err, "task: given twice");
            task = it;
        } else if (strcmp(k, "environment") != 0 && strcmp(k, "rpc_layer") != 0) {
            /* TF_CONFIG's "environment" and "rpc_layer" are accepted and ignored. */
            return dp_errf(err, "unknown key \"%s\" (expected \"cluster\" and \"task\")",
                           shown(k, buf, sizeof buf));
        }
    }
    if (!cluster)
        return dp_errf(err, "cluster: missing (e.g. \"cluster\": {\"worker\": "
                            "[\"host1:2222\", \"host2:2222\"]})");
    if (!cJSON_IsObject(cluster))
        return dp_errf(err, "cluster: expected an object mapping task types to address lists");

    const cJSON *lists[DP_ROLE_COUNT] = {NULL};
    long total = 0;
    for (const cJSON *it = cluster->child; it; it = it->next) {
        const char *k = it->string ? it->string : "";
        char what[96];
        snprintf(what, sizeof what, "cluster.%s", shown(k, buf, sizeof buf));
        dp_role r;
        if (role_from_name(k, strlen(k), &r) < 0)
            return unknown_type(what, k, strlen(k), err);
        if (lists[r])
            return dp_errf(err, "%s: given twice", what);
        if (!cJSON_IsArray(it))
            return dp_errf(err, "%s: expected a list of \"host:port\" strings", what);
        lists[r] = it;
        int n = cJSON_GetArraySize(it);
        if (r == DP_ROLE_CHIEF && n > 1)
            return dp_errf(err, "cluster.chief: %d entries, at most one chief is allowed", n);
        total += n;
        if (total > DP_CLUSTER_MAX_TASKS)
            return dp_errf(err, "cluster: more than %d tasks", DP_CLUSTER_MAX_TASKS);
    }
    if (!lists[DP_ROLE_WORKER] || cJSON_GetArraySize(lists[DP_ROLE_WORKER]) == 0)
        return dp_errf(err, "cluster.worker: no workers (at least one is needed)");

    c->tasks = calloc((size_t)total, sizeof *c->tasks);
    if (!c->tasks)
        return dp_errf(err, "out of memory for %ld tasks", total);
    int rank = 0;
    for (int r = 0; r < DP_ROLE_COUNT; r++) {
        if (!lists[r])
            continue;
        int i = 0;
        for (const cJSON *e = lists[r]->child; e; e = e->next, i++) {
            char what[48];
            snprintf(what, sizeof what, "cluster.%s[%d]", role_names[r], i);
            if (!cJSON_IsString(e) || !e->valuestring)
                return dp_errf(err, "%s: expected a \"host:port\" string", what);
            dp_task *t = &c->tasks[rank];
            if (dp_hostport_parse(e->valuestring, t->host, sizeof t->host, &t->port, what,
                                  err) < 0)
                return -1;
            snprintf(t->addr, sizeof t->addr, "%s", e->valuestring);
            set_task(t, (dp_role)r, i, rank);
            rank++;
        }
        c->count[r] = i;
    }
    c->n_tasks = rank;
    if (check_duplicates(c, err) < 0)
        return -1;

    dp_role role;
    int index;
    if (task_override) {
        if (dp_task_parse(task_override, &role, &index, err) < 0)
            return -1;
    } else {
        if (!task)
            return dp_errf(err, "task: missing (add \"task\": {\"type\": \"worker\", "
                                "\"index\": 0} or pass --task TYPE:INDEX)");
        if (parse_task_object(task, &role, &index, err) < 0)
            return -1;
    }
    if (index >= c->count[role]) {
        const char *what = task_override ? "task" : "task.index";
        if (c->count[role] == 0)
            return dp_errf(err, "%s: %s:%d: the cluster has no %s tasks", what,
                           role_names[role], index, role_names[role]);
        return dp_errf(err, "%s: %s:%d: index out of range (the cluster has %d %s task%s, "
                            "0..%d)",
                       what, role_names[role], index, c->count[role], role_names[role],
                       c->count[role] == 1 ? "" : "s", c->count[role] - 1);
    }
    c->self = dp_cluster_rank(c, role, index);
    return 0;
}

static void error_position(const char *json, const char *at, dp_err *err)
{
    int line = 1, col = 1;
    for (const char *p = json; p < at && *p; p++) {
        if (*p == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    char near[40], buf[48];
    snprintf(near, sizeof near, "%.32s", at);
    char *nl = strchr(near, '\n');
    if (nl)
        *nl = '\0';
    dp_errf(err, "bad JSON at line %d, column %d (byte %ld)%s%s%s", line, col,
            (long)(at - json), *near ? ": near \"" : ": unexpected end of input",
            *near ? shown(near, buf, sizeof buf) : "", *near ? "\"" : "");
}

int dp_cluster_parse(dp_cluster *c, const char *json, const char *task, dp_err *err)
{
    memset(c, 0, sizeof *c);
    if (!json)
        return dp_errf(err, "spec: missing");
    size_t n = strlen(json);
    if (n > DP_CLUSTER_MAX_SPEC)
        return dp_errf(err, "spec: %zu bytes, more than the %d allowed", n, DP_CLUSTER_MAX_SPEC);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 1);
    if (!root) {
        error_position(json, end ? end : json, err);
        return -1;
    }
    int rc = parse_root(c, root, task, err);
    cJSON_Delete(root);
    if (rc < 0)
        dp_cluster_free(c);
    return rc;
}

int dp_cluster_load(dp_cluster *c, const char *path, const char *task, dp_err *err)
{
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "rb");
    if (!f)
        return dp_errf(err, "cannot open cluster spec %s: %s", path, strerror(errno));
    char *buf = malloc((size_t)DP_CLUSTER_MAX_SPEC + 2);
    if (!buf) {
        fclose(f);
        return dp_errf(err, "out of memory reading %s", path);
    }
    size_t n = fread(buf, 1, (size_t)DP_CLUSTER_MAX_SPEC + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return dp_errf(err, "cannot read cluster spec %s", path);
    }
    if (n > DP_CLUSTER_MAX_SPEC) {
        free(buf);
        return dp_errf(err, "cluster spec %s: larger than %d bytes", path, DP_CLUSTER_MAX_SPEC);
    }
    buf[n] = '\0';
    int rc = 0;
    if (memchr(buf, '\0', n))
        rc = dp_errf(err, "contains a NUL byte (not a JSON text file)");
    else
        rc = dp_cluster_parse(c, buf, task, err);
    free(buf);
    if (rc < 0)
        dp_err_prefix(err, "cluster spec %s", path);
    return rc;
}

int dp_cluster_from_env(dp_cluster *c, const char *task, dp_err *err)
{
    memset(c, 0, sizeof *c);
    const char *ours = getenv(DP_CLUSTER_ENV), *tf = getenv(DP_CLUSTER_ENV_TF);
    const char *name = DP_CLUSTER_ENV, *v = ours;
    if (!ours || !*ours) {
        name = DP_CLUSTER_ENV_TF;
        v = tf;
    } else if (tf && *tf && strcmp(ours, tf) != 0) {
        dp_info("cluster spec: %s and %s are both set and differ; using %s", DP_CLUSTER_ENV,
                DP_CLUSTER_ENV_TF, DP_CLUSTER_ENV);
    }
    if (!v || !*v)
        return 1;
    if (dp_cluster_parse(c, v, task, err) < 0)
        return dp_err_prefix(err, "%s", name);
    return 0;
}

int dp_cluster_local(dp_cluster *c, int chief, int workers, int ps, const int *ports,
                     dp_err *err)
{
    memset(c, 0, sizeof *c);
    if (chief < 0 || chief > 1)
        return dp_errf(err, "local cluster: %d chiefs, expected 0 or 1", chief);
    if (workers < 1)
        return dp_errf(err, "local cluster: at least one worker is needed");
    if (ps < 0 || (long)chief + workers + ps > DP_CLUSTER_MAX_TASKS)
        return dp_errf(err, "local cluster: more than %d tasks", DP_CLUSTER_MAX_TASKS);
    int n = chief + workers + ps;
    c->tasks = calloc((size_t)n, sizeof *c->tasks);
    if (!c->tasks)
        return dp_errf(err, "out of memory for %d tasks", n);
    c->count[DP_ROLE_CHIEF] = chief;
    c->count[DP_ROLE_WORKER] = workers;
    c->count[DP_ROLE_PS] = ps;
    c->n_tasks = n;
    int rank = 0;
    for (int r = 0; r < DP_ROLE_COUNT; r++)
        for (int i = 0; i < c->count[r]; i++, rank++) {
            dp_task *t = &c->tasks[rank];
            if (ports[rank] < 1 || ports[rank] > 65535) {
                dp_cluster_free(c);
                return dp_errf(err, "local cluster: %s:%d: port %d out of range", role_names[r],
                               i, ports[rank]);
            }
            set_task(t, (dp_role)r, i, rank);
            snprintf(t->host, sizeof t->host, "127.0.0.1");
            t->port = ports[rank];
            snprintf(t->addr, sizeof t->addr, "127.0.0.1:%d", t->port);
        }
    if (check_duplicates(c, err) < 0) {
        dp_cluster_free(c);
        return dp_err_prefix(err, "local cluster");
    }
    c->self = 0;
    return 0;
}

char *dp_cluster_to_json(const dp_cluster *c, int self, dp_err *err)
{
    if (self >= c->n_tasks) {
        dp_errf(err, "cluster to JSON: rank %d out of range (0..%d)", self, c->n_tasks - 1);
        return NULL;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON *cl = cJSON_AddObjectToObject(root, "cluster");
    int ok = root && cl;
    for (int r = 0; ok && r < DP_ROLE_COUNT; r++) {
        if (c->count[r] == 0)
            continue;
        cJSON *arr = cJSON_AddArrayToObject(cl, role_names[r]);
        ok = arr != NULL;
        for (int i = 0; ok && i < c->n_tasks; i++) {
            if (c->tasks[i].role != (dp_role)r)
                continue;
            cJSON *s = cJSON_CreateString(c->tasks[i].addr);
            ok = s && cJSON_AddItemToArray(arr, s);
        }
    }
    if (ok && self >= 0) {
        cJSON *t = cJSON_AddObjectToObject(root, "task");
        ok = t && cJSON_AddStringToObject(t, "type", role_names[c->tasks[self].role]) &&
             cJSON_AddNumberToObject(t, "index", c->tasks[self].index);
    }
    char *s = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!s)
        dp_errf(err, "cluster to JSON: out of memory");
    return s;
}
