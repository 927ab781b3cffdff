/* Running a study's commands and reading back their metrics (study.h). */
#include "cli/experiment/study.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "downpour/clock.h"
#include "downpour/file.h"

extern char **environ;

#define SELF "/proc/self/exe" /* argv[0] that names this program */

void study_argv_init(study_argv *a)
{
    memset(a, 0, sizeof *a);
}

int study_argv_add(study_argv *a, const char *arg)
{
    size_t n = strlen(arg) + 1;
    if (a->argc >= STUDY_MAX_ARGS || a->used + n > sizeof a->store)
        return -1;
    a->argv[a->argc++] = memcpy(a->store + a->used, arg, n);
    a->argv[a->argc] = NULL;
    a->used += n;
    return 0;
}

int study_argv_add_words(study_argv *a, const char *s)
{
    char word[1024];
    while (*s) {
        while (*s == ' ' || *s == '\t')
            s++;
        size_t n = strcspn(s, " \t");
        if (n == 0)
            break;
        if (n >= sizeof word)
            return -1;
        memcpy(word, s, n);
        word[n] = '\0';
        if (study_argv_add(a, word) < 0)
            return -1;
        s += n;
    }
    return 0;
}

void study_argv_format(const study_argv *a, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < a->argc && used < cap; i++) {
        const char *w = i == 0 && !strcmp(a->argv[0], SELF) ? "downpour" : a->argv[i];
        int n = snprintf(out + used, cap - used, "%s%s", i ? " " : "", w);
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

/* The real path of this program: a child must run the same build even if
 * the caller's cwd or PATH would find another. */
static int self_exe(char *buf, size_t cap, dp_err *err)
{
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    if (n <= 0 || (size_t)n >= cap - 1)
        return dp_errf(err, "cannot find this program (/proc/self/exe): %s",
                       n < 0 ? strerror(errno) : "path too long");
    buf[n] = '\0';
    return 0;
}

int study_spawn(const study_argv *a, const char *log_path, double timeout, double *wall,
                dp_err *err)
{
    char exe[4096];
    if (a->argc < 1)
        return dp_errf(err, "no command to run");
    if (strcmp(a->argv[0], SELF) != 0)
        snprintf(exe, sizeof exe, "%s", a->argv[0]);
    else if (self_exe(exe, sizeof exe, err) < 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid;
    double t0 = dp_now();
    int e = posix_spawnp(&pid, exe, &fa, NULL, a->argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e != 0)
        return dp_errf(err, "cannot start %s: %s", exe, strerror(e));
    int status = 0, killed = 0;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            break;
        if (w < 0 && errno != EINTR) {
            status = 0;
            break;
        }
        double now = dp_now();
        if (!killed && now - t0 > timeout) {
            kill(pid, SIGTERM); /* launch forwards it to its tasks */
            killed = 1;
        } else if (killed == 1 && now - t0 > timeout + 30) {
            kill(pid, SIGKILL);
            killed = 2;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    *wall = dp_now() - t0;
    if (killed)
        return 124;
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

void study_log_tail(FILE *f, const char *log_path, int n)
{
    FILE *in = fopen(log_path, "r");
    if (!in)
        return;
    /* a ring of the last n lines */
    char lines[20][512];
    int count = 0;
    if (n > 20)
        n = 20;
    char line[512];
    while (fgets(line, sizeof line, in)) {
        snprintf(lines[count % n], sizeof lines[0], "%s", line);
        count++;
    }
    fclose(in);
    for (int i = count > n ? count - n : 0; i < count; i++)
        fprintf(f, "    %s%s", lines[i % n], strchr(lines[i % n], '\n') ? "" : "\n");
}

static double num(const cJSON *o, const char *key, double dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* The evaluator's lines: those of a single process (no task) or the chief's. */
static bool from_evaluator(const cJSON *o)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "task");
    return !cJSON_IsString(t) || strncmp(t->valuestring, "chief:", 6) == 0 ||
           strcmp(t->valuestring, "worker:0") == 0;
}

int study_read_run(const char *path, study_run *r, dp_err *err)
{
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "r");
    if (!f)
        return dp_errf(err, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    bool have_total = false;
    double tx[STUDY_MAX_WORKERS] = {0}, rx[STUDY_MAX_WORKERS] = {0};
    bool seen[STUDY_MAX_WORKERS] = {false};
    while ((n = getline(&line, &cap, f)) > 0) {
        cJSON *o = cJSON_ParseWithLength(line, (size_t)n);
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "event");
        if (!cJSON_IsString(ev)) {
            cJSON_Delete(o);
            continue; /* a torn line of a killed task: the merge warned */
        }
        const char *e = ev->valuestring;
        /* Under allreduce without a chief, worker:0 evaluates; a chief's
         * lines come first in a merged file, so the first done wins. */
        if (strcmp(e, "epoch") == 0 && from_evaluator(o)) {
            int k = (int)num(o, "epoch", 0);
            if (k >= 1 && k <= STUDY_MAX_EPOCHS && !r->done) {
                r->val_accuracy[k - 1] = num(o, "val_accuracy", NAN);
                r->val_loss[k - 1] = num(o, "val_loss", NAN);
                if (k > r->epochs)
                    r->epochs = k;
            }
        } else if (strcmp(e, "done") == 0 && from_evaluator(o) && !r->done) {
            r->done = true;
            r->test_accuracy = num(o, "test_accuracy", NAN);
            r->train_seconds = num(o, "train_seconds", NAN);
            r->samples_per_second = num(o, "samples_per_second", NAN);
            r->test_auc = num(o, "test_auc", NAN);
            r->test_log_loss = num(o, "test_log_loss", NAN);
        } else if (strcmp(e, "resource") == 0) {
            /* each worker's counters are cumulative: its last event counts */
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "task");
            int w = cJSON_IsString(t) && strncmp(t->valuestring, "worker:", 7) == 0
                        ? atoi(t->valuestring + 7)
                        : -1;
            if (w >= 0 && w < STUDY_MAX_WORKERS) {
                tx[w] = num(o, "net_tx_bytes", 0);
                rx[w] = num(o, "net_rx_bytes", 0);
                seen[w] = true;
            }
        } else if (strcmp(e, "resource_total") == 0) {
            have_total = true;
            r->tasks = (int)num(o, "tasks", 0);
            r->cpu_percent_mean = num(o, "cpu_percent_mean", NAN);
            r->cpu_percent_sum = num(o, "cpu_percent_sum", NAN);
            r->rss_bytes = num(o, "rss_peak_bytes", NAN);
            r->net_bytes = num(o, "net_rx_bytes", NAN);
        }
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    for (int w = 0; w < STUDY_MAX_WORKERS; w++)
        if (seen[w]) {
            r->workers++;
            r->worker_tx += tx[w];
            r->worker_rx += rx[w];
        }
    if (!have_total)
        r->cpu_percent_mean = r->cpu_percent_sum = r->rss_bytes = r->net_bytes = NAN;
    if (!r->done)
        return dp_errf(err, "%s: no \"done\" event (the run did not finish)", path);
    return 0;
}

int study_run_one(const study_argv *a, const char *metrics, const char *log_path,
                  double timeout, const char *label, int repeat, study_run *run, char *why,
                  size_t cap)
{
    dp_err err;
    double wall = 0;
    int rc = study_spawn(a, log_path, timeout, &wall, &err);
    if (rc == 0 && study_read_run(metrics, run, &err) == 0) {
        run->wall_seconds = wall;
        return 0;
    }
    if (rc > 0)
        snprintf(why, cap, "run %d %s %d (log: %.400s)", repeat,
                 rc == 124 ? "timed out," : "exited", rc, log_path);
    else
        snprintf(why, cap, "run %d: %s%.480s", repeat, rc < 0 ? "could not start: " : "",
                 err.msg);
    fprintf(stderr, "experiment: %s: %s\n", label, why);
    study_log_tail(stderr, log_path, 12);
    return -1;
}

const char *study_pick(const char *a, const char *b, double dq, double spread, double ratio)
{
    if (!isfinite(spread) || !isfinite(dq) || !isfinite(ratio))
        return NULL;
    if (fabs(dq) > spread)
        return dq > 0 ? b : a;
    if (fabs(ratio - 1) <= STUDY_TIME_TOLERANCE)
        return NULL;
    return ratio < 1 ? b : a;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

study_stat study_stats(double *v, int n)
{
    study_stat s = {NAN, NAN, NAN, n};
    if (n < 1)
        return s;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    s.min = v[0];
    s.max = v[n - 1];
    s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    return s;
}

int study_split_list(const char *opt, const char *s, char *buf, size_t cap,
                     const char **items, int *n, int (*ok)(const char *), dp_err *err)
{
    if (strlen(s) >= cap)
        return dp_errf(err, "--%s: list too long", opt);
    strcpy(buf, s);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (*n >= STUDY_MAX_LIST)
            return dp_errf(err, "--%s: more than %d items", opt, STUDY_MAX_LIST);
        if (ok && !ok(tok))
            return dp_errf(err, "--%s: '%s' is not one of the values it takes", opt, tok);
        for (int i = 0; i < *n; i++)
            if (strcmp(items[i], tok) == 0)
                return dp_errf(err, "--%s: '%s' given twice", opt, tok);
        items[(*n)++] = tok;
    }
    if (*n == 0)
        return dp_errf(err, "--%s: empty list", opt);
    return 0;
}

int study_parse(const char *study, const char *usage, const struct cli_opt *opts, int n_opts,
                int argc, char **argv, const char *const *out)
{
    int rest;
    int pr = cli_parse(usage, opts, n_opts, argc, argv, &rest);
    if (pr != 0)
        return pr > 0 ? 0 : 2;
    if (rest < argc) {
        fprintf(stderr, "downpour experiment %s: unexpected argument '%s' (see --help)\n", study,
                argv[rest]);
        return 2;
    }
    if (!*out) {
        fprintf(stderr, "downpour experiment %s: --out DIR is required\n", study);
        return 2;
    }
    return -1;
}

int study_prepare_out(const char *dir, dp_err *err)
{
    if (dp_dir_prepare(dir, "--out", err) < 0)
        return -1;
    char runs[4200];
    snprintf(runs, sizeof runs, "%s/runs", dir);
    return dp_dir_prepare(runs, "--out", err);
}

cJSON *study_stat_json(study_stat s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "median", s.median);
    cJSON_AddNumberToObject(o, "min", s.min);
    cJSON_AddNumberToObject(o, "max", s.max);
    cJSON_AddNumberToObject(o, "n", s.n);
    return o;
}

int study_write_results(const char *dir, cJSON *root, dp_err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/results.json", dir);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text)
        return dp_errf(err, "%s: out of memory", path);
    int rc = dp_file_replace(path, text, strlen(text), err);
    cJSON_free(text);
    return rc;
}

void study_cluster_opts_init(study_cluster_opts *o)
{
    memset(o, 0, sizeof *o);
}

int study_cluster_setup(study_cluster *c, const study_cluster_opts *o, dp_err *err)
{
    memset(c, 0, sizeof *c);
    c->hosts = o->hosts;
    c->link_mbit = o->link_mbit;
    c->delay_ms = o->delay_ms;
    if (o->hosts == 0) {
        if (o->link_mbit || o->delay_ms)
            return dp_errf(err, "--link-mbit and --delay-ms shape a virtual cluster's links: "
                                "give --hosts N too");
        snprintf(c->description, sizeof c->description,
                 "this machine (%d cores, every task a local process over loopback TCP)",
                 study_cores());
        return 0;
    }
    return study_vcluster_setup(c, err);
}

int study_cluster_command(const study_cluster *c, study_argv *a, bool chief, int workers, int ps,
                          dp_err *err)
{
    study_argv_init(a);
    if (c->hosts > 0)
        return study_vcluster_command(c, a, chief, workers, ps, err);
    char w[16], p[16];
    snprintf(w, sizeof w, "%d", workers);
    snprintf(p, sizeof p, "%d", ps);
    if (study_argv_add(a, SELF) | study_argv_add(a, "launch") |
        (chief ? study_argv_add(a, "--chief") : 0) | study_argv_add(a, "--workers") | study_argv_add(a, w) | study_argv_add(a, "--ps") |
        study_argv_add(a, p) | study_argv_add(a, "--"))
        return dp_errf(err, "command line too long");
    return 0;
}

int study_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
