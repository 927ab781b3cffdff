/* downpour run: one task of a multi-host cluster, started by hand on its host. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "downpour/cluster.h"
#include "downpour/launcher.h"
#include "downpour/log.h"
#include "downpour/secret.h"
#include "downpour/status.h"
#include "downpour/tcp.h"

#define RUN_USAGE                                                                         \
    "downpour run [--cluster FILE] [--task TYPE:INDEX | --join [HOST:PORT]] [--] train|ping\n"\
    "             [OPTIONS]\n"                                                             \
    "\n"                                                                                  \
    "Runs one task of a cluster in this process. The spec (TF_CONFIG format:\n"           \
    "{\"cluster\": {\"chief\": [..], \"worker\": [..], \"ps\": [..]}, \"task\": {..}}) comes\n" \
    "from --cluster FILE, else from DOWNPOUR_CONFIG, else from TF_CONFIG; --task\n"       \
    "overrides its \"task\". --join takes instead the first free spare worker slot on\n"  \
    "this host (train --spare-workers N: the spec's last N worker slots), and the task\n"  \
    "joins the running job; with none free it exits 1. --join HOST:PORT needs no spec:\n" \
    "it asks the job's task at that address for it (proving the secret).\n"              \
    "Every task of the run needs the same secret: --secret-file FILE (passed on to\n"     \
    "the command), else DOWNPOUR_SECRET. See docs/cluster.md."

/* Whether a command's arguments hold --name or --name=VALUE (before any "--"). */
static bool has_option(int argc, char **argv, const char *name)
{
    size_t n = strlen(name);
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strncmp(argv[i], "--", 2) == 0 && strncmp(argv[i] + 2, name, n) == 0 &&
            (argv[i][2 + n] == '\0' || argv[i][2 + n] == '='))
            return true;
    return false;
}

/* The value of train's --spare-workers among a command's arguments, or 0. */
static long spare_option(int argc, char **argv)
{
    long n = 0;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *v = NULL;
        if (strncmp(argv[i], "--spare-workers=", 16) == 0)
            v = argv[i] + 16;
        else if (strcmp(argv[i], "--spare-workers") == 0 && i + 1 < argc)
            v = argv[++i];
        if (v)
            n = strtol(v, NULL, 10);
    }
    return n;
}

/* --join: the first spare worker slot whose address this process can listen
 * on (on this host, and no task there yet).  Its socket is kept and handed
 * to the task as the launcher hands one (DOWNPOUR_LISTEN_FD), so no other
 * joiner can take the slot meanwhile.  Returns the slot's rank, or -1 with
 * the reason each slot was passed over. */
static int pick_spare(const dp_cluster *c, long spare, dp_err *err)
{
    char why[DP_ERR_MAX] = "";
    size_t n = 0;
    for (int w = c->count[DP_ROLE_WORKER] - (int)spare; w < c->count[DP_ROLE_WORKER]; w++) {
        int r = dp_cluster_rank(c, DP_ROLE_WORKER, w), fd, port;
        dp_err e;
        if (dp_tcp_listen(c->tasks[r].addr, 0, &fd, &port, &e) == 0) {
            char v[16];
            snprintf(v, sizeof v, "%d", fd);
            if (setenv(DP_LAUNCH_LISTEN_FD_ENV, v, 1) < 0) {
                close(fd);
                return dp_errf(err, "cannot set %s: %s", DP_LAUNCH_LISTEN_FD_ENV,
                               strerror(errno));
            }
            return r;
        }
        const char *taken = strstr(e.msg, strerror(EADDRINUSE))      ? "taken"
                            : strstr(e.msg, strerror(EADDRNOTAVAIL)) ? "on another host"
                                                                     : e.msg;
        if (n < sizeof why)
            n += (size_t)snprintf(why + n, sizeof why - n, "%s%s at %s: %s", n ? "; " : "",
                                  c->tasks[r].name, c->tasks[r].addr, taken);
    }
    return dp_errf(err, "no free spare worker slot on this host (%s): the job is full here",
                   why);
}

/* `--join HOST:PORT` or `--join=HOST:PORT` among run's own options (before
 * "--" or the command): the address, taken out of argv so the option table
 * sees a bare --join; NULL when --join has no address. */
static const char *take_join_address(int *argc, char **argv)
{
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--") == 0 || argv[i][0] != '-')
            return NULL;
        const char *addr = NULL;
        int drop = 0;
        if (strncmp(argv[i], "--join=", 7) == 0) {
            addr = argv[i] + 7;
            argv[i] = "--join";
        } else if (strcmp(argv[i], "--join") == 0 && i + 1 < *argc && argv[i + 1][0] != '-' &&
                   !cli_is_task_command(argv[i + 1])) {
            addr = argv[i + 1];
            drop = i + 1;
        } else {
            continue;
        }
        if (drop) {
            for (int k = drop; k + 1 < *argc; k++)
                argv[k] = argv[k + 1];
            (*argc)--;
        }
        return addr;
    }
    return NULL;
}

/* The spec of the job a task at addr belongs to, asked of that task with
 * the cluster secret (secret_file, else DOWNPOUR_SECRET).  Returns the JSON
 * (free()), or NULL with the reason printed; *status the exit status then. */
static char *spec_from_job(const char *addr, const char *secret_file, int *status)
{
    dp_secret s;
    dp_err err;
    if (dp_secret_load(&s, secret_file, &err) < 0) {
        fprintf(stderr, "downpour run: --join %s: the job's secret is needed to ask for its "
                        "spec: %s\n", addr, err.msg);
        *status = 2;
        return NULL;
    }
    char *json = NULL;
    int rc = dp_tcp_query_spec(addr, s.bytes, s.len, 10, &json, &err);
    dp_secret_wipe(&s);
    if (rc < 0) {
        fprintf(stderr, "downpour run: --join %s: %s\n", addr, err.msg);
        *status = 1;
        return NULL;
    }
    return json;
}

/* Runs train or ping with argv; --secret-file FILE, when given to run, goes
 * right after the command name (an explicit one of the command's own, later,
 * wins). */
static int run_command(int argc, char **argv, const char *secret_file)
{
    int (*cmd)(int, char **) = strcmp(argv[0], "ping") == 0 ? cmd_ping : cmd_train;
    if (!secret_file)
        return cmd(argc, argv);
    char **v = calloc((size_t)argc + 3, sizeof *v);
    if (!v) {
        fprintf(stderr, "downpour run: out of memory\n");
        return 1;
    }
    v[0] = argv[0];
    v[1] = "--secret-file";
    v[2] = (char *)secret_file;
    for (int i = 1; i < argc; i++)
        v[i + 2] = argv[i];
    int st = cmd(argc + 2, v);
    free(v);
    return st;
}

int cmd_run(int argc, char **argv)
{
    const char *cluster = NULL, *task = NULL, *secret_file = NULL, *log_level = NULL;
    bool verbose = false, join = false;
    const cli_opt opts[] = {
        {"cluster", CLI_STR, &cluster, "FILE",
         "cluster spec JSON (default: $DOWNPOUR_CONFIG, else $TF_CONFIG)", 0, 0},
        {"task", CLI_STR, &task, "TYPE:INDEX",
         "this process's task, e.g. worker:0 (default: the spec's \"task\")", 0, 0},
        {"join", CLI_FLAG, &join, NULL,
         "take the first free spare worker slot on this host (train --spare-workers) and "
         "join the running job; --join HOST:PORT asks the job's task at that address for "
         "the spec, so no --cluster is needed (default: a spec as for --task)", 0, 0},
        {"secret-file", CLI_STR, &secret_file, "FILE",
         "the cluster secret, same on every host (default: $DOWNPOUR_SECRET)", 0, 0},
        CLI_LOG_OPTS(&log_level, &verbose), /* the task's own --log-level wins */
    };
    int rest = 0;
    const char *join_addr = take_join_address(&argc, argv);
    int rc = cli_parse(RUN_USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &rest);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (cli_apply_log_level("run", log_level, verbose) < 0)
        return 2;
    if (rest >= argc) {
        fprintf(stderr, "downpour run: no command. Hint: downpour run --cluster cluster.json "
                        "--task worker:0 -- train --strategy ps-async ...\n");
        return 2;
    }
    if (!cli_is_task_command(argv[rest])) {
        fprintf(stderr, "downpour run: '%s': a task runs `downpour train` or `downpour ping`, so "
                        "the command after the run options must start with one of them\n",
                argv[rest]);
        return 2;
    }

    long spare = 0;
    if (join) {
        spare = spare_option(argc - rest, argv + rest);
        if (task || strcmp(argv[rest], "train") != 0 || spare < 1) {
            fprintf(stderr, "downpour run: --join takes a free spare slot for `train` %s. Hint: "
                            "downpour run --cluster cluster.json --join -- train "
                            "--spare-workers N ... (the job's train options)\n",
                    task ? "instead of --task"
                         : "with --spare-workers N (as every task of the job has)");
            return 2;
        }
        task = "worker:0"; /* a placeholder: the slot is picked below */
    }
    dp_cluster c;
    dp_err err;
    if (join_addr && cluster) {
        fprintf(stderr, "downpour run: --join %s asks the job for its spec: leave out "
                        "--cluster (or give --cluster FILE and a bare --join)\n",
                join_addr);
        return 2;
    }
    if (join_addr) {
        char *json = spec_from_job(join_addr, secret_file, &rc);
        if (!json)
            return rc;
        rc = dp_cluster_parse(&c, json, task, &err);
        free(json);
        if (rc < 0)
            dp_err_prefix(&err, "the spec the task at %s sent", join_addr);
    } else if (cluster) {
        rc = dp_cluster_load(&c, cluster, task, &err);
    } else {
        rc = dp_cluster_from_env(&c, task, &err);
        if (rc == 1) {
            fprintf(stderr, "downpour run: no cluster spec. Hint: pass --cluster FILE (see "
                            "docs/cluster.md) or set DOWNPOUR_CONFIG (or TF_CONFIG) to the "
                            "spec's JSON\n");
            return 2;
        }
    }
    if (rc < 0) {
        fprintf(stderr, "downpour run: %s\n", err.msg);
        return 2;
    }
    if (join) {
        if (spare >= c.count[DP_ROLE_WORKER]) {
            fprintf(stderr, "downpour run: --join: --spare-workers %ld, and the spec has %d "
                            "worker slot(s)\n", spare, c.count[DP_ROLE_WORKER]);
            dp_cluster_free(&c);
            return 2;
        }
        int r = pick_spare(&c, spare, &err);
        if (r < 0) {
            fprintf(stderr, "downpour run: --join: %s\n", err.msg);
            dp_cluster_free(&c);
            return 1;
        }
        c.self = r;
    }
    /* train learns its role the same way under launch and run: DOWNPOUR_CONFIG
     * holding the spec with this task (and no TF_CONFIG beside it to differ). */
    char *json = dp_cluster_to_json(&c, c.self, &err);
    if (!json || setenv(DP_CLUSTER_ENV, json, 1) < 0 || unsetenv(DP_CLUSTER_ENV_TF) < 0 ||
        setenv("DOWNPOUR_TASK", c.tasks[c.self].name, 1) < 0) {
        fprintf(stderr, "downpour run: cannot set %s: %s\n", DP_CLUSTER_ENV,
                json ? "out of memory" : err.msg);
        free(json);
        dp_cluster_free(&c);
        return 1;
    }
    free(json);
    const dp_task *me = &c.tasks[c.self];
    dp_info("run: task %s (rank %d of %d) at %s", me->name, me->rank, c.n_tasks, me->addr);
    dp_cluster_free(&c);
    if (secret_file) {
        /* Read it now, so a missing or short file stops the task before it starts. */
        dp_secret s;
        rc = dp_secret_load(&s, secret_file, &err);
        dp_secret_wipe(&s);
        if (rc < 0) {
            fprintf(stderr, "downpour run: --secret-file: %s\n", err.msg);
            return 2;
        }
    } else if (!has_option(argc - rest, argv + rest, "secret-file")) {
        const char *secret = getenv("DOWNPOUR_SECRET");
        if (!secret || !*secret)
            dp_warn("run: DOWNPOUR_SECRET is not set and no --secret-file was given; every "
                    "task needs the same secret to authenticate. Hint: run `openssl rand -hex "
                    "32 > secret` once, copy the file (mode 0600) to every host and pass "
                    "--secret-file secret");
    }
    return run_command(argc - rest, argv + rest, secret_file);
}
