/* A three-host cluster in network namespaces (scripts/netns.sh): host 1 runs
 * the chief and the ps, hosts 2 and 3 one worker each, every task started by
 * hand with a spec naming the hosts' addresses and one shared secret (the
 * chief reads DOWNPOUR_CONFIG, the ps TF_CONFIG, the workers `downpour run
 * --cluster FILE`), ps-async on a small MNIST split.
 *
 *   1. fault-free: every task exits 0 and the chief reports a sane accuracy;
 *   2. host 2's link is cut mid-run (silence, no RST) and restored a few
 *      seconds later, after the heartbeat timeout: the chief must declare
 *      worker:0 lost and go on, and the chief, the ps and worker:1 must exit 0
 *      with a sane accuracy.  What the cut worker does (exits after losing the
 *      ps, or rejoins) and whether the ps noticed before the chief stopped it
 *      are logged, not judged.
 *
 * Worker 0 is a straggler (--straggler 0:MS), so the run lasts a few seconds
 * at almost no CPU.  Skipped (77) when not root, without `ip`, or when network
 * namespaces cannot be made here.  The namespaces are removed on every way
 * out (atexit and SIGINT/SIGTERM; a SIGKILLed run's are removed by the next
 * `netns.sh up`, which clears prefixes whose owner is gone), every task gets
 * PR_SET_PDEATHSIG, and every wait has a deadline. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "downpour/clock.h"
#include "proc.h"

#define N_TASKS 4
#define HEARTBEAT_S "2"
#define PHASE_DEADLINE_S 60.0
#define MIN_ACCURACY 0.70

static char g_prefix[16];
static char g_script[1024];
static int g_up;
static pid_t g_pids[N_TASKS];

static void kill_tasks(void)
{
    for (int i = 0; i < N_TASKS; i++)
        if (g_pids[i] > 0) {
            kill(-g_pids[i], SIGKILL);
            kill(g_pids[i], SIGKILL);
            waitpid(g_pids[i], NULL, 0);
            g_pids[i] = 0;
        }
}

static void netns_down(void)
{
    kill_tasks();
    if (!g_up)
        return;
    g_up = 0;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s' down %s", g_script, g_prefix);
    if (system(cmd) != 0)
        fprintf(stderr, "netns.sh down %s failed\n", g_prefix);
}

static void on_signal(int sig)
{
    netns_down();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void skip(const char *why)
{
    fprintf(stderr, "skipping: %s\n", why);
    exit(77);
}

/* Runs `netns.sh ARGS`, its stdout into out (trimmed); returns its status. */
static int netns(char *out, size_t cap, const char *args)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "'%s' %s", g_script, args);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t n = out ? fread(out, 1, cap - 1, p) : 0;
    if (!out) {
        char sink[256];
        while (fread(sink, 1, sizeof sink, p) > 0)
            ;
    }
    int st = pclose(p);
    if (out) {
        out[n] = '\0';
        while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' '))
            out[--n] = '\0';
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

typedef struct task {
    const char *name; /* chief, ps:0, worker:0, worker:1 */
    int host;         /* 1..3 */
    char log[1100];
} task;

/* Starts one task inside its host: `netns.sh exec` ends in exec, so the pid
 * is the task's own.  Output (both streams) goes to its log file. */
static pid_t start_task(task *t, const char *spec_path, const char *spec_json, int phase)
{
    static const char *train[] = {
        "train", "--strategy", "ps-async", "--dataset", "mnist", "--train-size", "3000",
        "--val-size", "1000", "--epochs", "2", "--batch", "128", "--seed", "1", "--log-every", "4",
        "--no-progress", "--heartbeat-timeout", HEARTBEAT_S, "--startup-timeout", "30",
        "--straggler", "0:200", NULL};
    char host[8];
    snprintf(host, sizeof host, "%d", t->host);
    char file_name[64];
    snprintf(file_name, sizeof file_name, "%s.%d.log", t->name, phase);
    for (char *c = file_name; *c; c++)
        if (*c == ':')
            *c = '-';
    snprintf(t->log, sizeof t->log, "%s/%s", test_tmp(), file_name);

    const char *argv[64];
    int k = 0;
    argv[k++] = g_script;
    argv[k++] = "exec";
    argv[k++] = g_prefix;
    argv[k++] = host;
    argv[k++] = test_bin();
    int is_worker = strncmp(t->name, "worker:", 7) == 0;
    if (is_worker) {
        argv[k++] = "run";
        argv[k++] = "--cluster";
        argv[k++] = spec_path;
        argv[k++] = "--task";
        argv[k++] = t->name;
        argv[k++] = "--";
    }
    for (int i = 0; train[i]; i++)
        argv[k++] = train[i];
    argv[k] = NULL;

    /* The chief and the ps get the spec with their task in the environment. */
    char *task_json = NULL;
    if (!is_worker) {
        const char *type = strcmp(t->name, "chief") == 0 ? "chief" : "ps";
        size_t len = strlen(spec_json);
        task_json = malloc(len + 64);
        REQUIRE(task_json);
        /* spec_json is {"cluster": {...}}: put the task before the last brace. */
        memcpy(task_json, spec_json, len - 1);
        snprintf(task_json + len - 1, 64, ", \"task\": {\"type\": \"%s\", \"index\": 0}}", type);
    }
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(t->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
            _exit(127);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0)
            dup2(nul, 0);
        unsetenv("DOWNPOUR_CONFIG");
        unsetenv("TF_CONFIG");
        if (task_json)
            setenv(strcmp(t->name, "chief") == 0 ? "DOWNPOUR_CONFIG" : "TF_CONFIG", task_json, 1);
        execv(g_script, (char **)argv);
        fprintf(stderr, "cannot execute %s: %s\n", g_script, strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    free(task_json);
    return pid;
}

static char *read_log(const task *t)
{
    size_t len;
    char *s = slurp(t->log, &len);
    return s ? s : strdup("");
}

/* Waits until the task's log holds `needle`; 0 when it does, -1 at the deadline. */
static int wait_for_line(const task *t, const char *needle, double deadline)
{
    while (dp_now() < deadline) {
        char *s = read_log(t);
        int found = strstr(s, needle) != NULL;
        free(s);
        if (found)
            return 0;
        usleep(50 * 1000);
    }
    return -1;
}

/* Waits for every task until the deadline; status[i] is the exit status,
 * 128 + signal when killed, -1 when it was still running (then killed). */
static void wait_all(int *status, double deadline)
{
    int left = 0;
    for (int i = 0; i < N_TASKS; i++) {
        status[i] = -1;
        if (g_pids[i] > 0)
            left++;
    }
    while (left > 0 && dp_now() < deadline) {
        for (int i = 0; i < N_TASKS; i++) {
            if (g_pids[i] <= 0)
                continue;
            int st;
            pid_t r = waitpid(g_pids[i], &st, WNOHANG);
            if (r == g_pids[i]) {
                status[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                kill(-g_pids[i], SIGKILL); /* anything it left in its group */
                g_pids[i] = 0;
                left--;
            }
        }
        if (left > 0)
            usleep(50 * 1000);
    }
    if (left > 0)
        fprintf(stderr, "tasks still running at the deadline; killing them\n");
    kill_tasks();
}

/* "Test accuracy: 0.8453" in a log, or -1. */
static double test_accuracy(const task *t)
{
    char *s = read_log(t);
    const char *at = strstr(s, "Test accuracy: ");
    double acc = at ? atof(at + 15) : -1;
    free(s);
    return acc;
}

static void show_log(const task *t)
{
    char *s = read_log(t);
    fprintf(stderr, "---- %s (%s) ----\n%s", t->name, t->log, s);
    free(s);
}

/* The last non-empty line of a task's log (for the report). */
static void last_line(const task *t, char *out, size_t cap)
{
    char *s = read_log(t);
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == '\n')
        s[--n] = '\0';
    char *nl = strrchr(s, '\n');
    snprintf(out, cap, "%s", nl ? nl + 1 : s);
    free(s);
}

int main(void)
{
    if (geteuid() != 0)
        skip("network namespaces need root");
    REQUIRE(test_bin() && test_tmp());
    if (system("command -v ip >/dev/null 2>&1") != 0)
        skip("'ip' (iproute2) is not installed");
    require_mnist();
    test_script(g_script, sizeof g_script, "DOWNPOUR_NETNS_SH", "netns.sh");
    if (access(g_script, X_OK) != 0)
        skip("scripts/netns.sh not found (set DOWNPOUR_NETNS_SH)");
    snprintf(g_prefix, sizeof g_prefix, "dt%ld", (long)(getpid() % 10000000));

    /* Can namespaces be made here at all?  (A container without CAP_SYS_ADMIN
     * cannot: a skip, not a failure.) */
    char probe[256];
    snprintf(probe, sizeof probe, "ip netns add %sprobe >/dev/null 2>&1 && ip netns del %sprobe",
             g_prefix, g_prefix);
    if (system(probe) != 0)
        skip("cannot create a network namespace here");

    atexit(netns_down);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);

    char subnet[128], env_owner[64];
    snprintf(env_owner, sizeof env_owner, "%ld", (long)getpid());
    setenv("NETNS_OWNER", env_owner, 1);
    char args[256];
    snprintf(args, sizeof args, "up %s 3", g_prefix);
    g_up = 1; /* from here on, down on every way out, even if up fails half-way */
    REQUIRE(netns(subnet, sizeof subnet, args) == 0);
    fprintf(stderr, "hosts %s-1..3 on %s\n", g_prefix, subnet);

    char addr[4][64];
    for (int h = 1; h <= 3; h++) {
        snprintf(args, sizeof args, "addr %s %d", g_prefix, h);
        REQUIRE(netns(addr[h], sizeof addr[h], args) == 0 && addr[h][0]);
    }

    char spec_json[512], spec_path[1200];
    snprintf(spec_json, sizeof spec_json,
             "{\"cluster\": {\"chief\": [\"%s:2222\"], \"ps\": [\"%s:2223\"], "
             "\"worker\": [\"%s:2222\", \"%s:2222\"]}}",
             addr[1], addr[1], addr[2], addr[3]);
    snprintf(spec_path, sizeof spec_path, "%s/cluster.json", test_tmp());
    FILE *f = fopen(spec_path, "w");
    REQUIRE(f);
    fputs(spec_json, f);
    fclose(f);

    /* One fresh secret for the cluster, in every task's environment. */
    unsigned char raw[32];
    FILE *ur = fopen("/dev/urandom", "rb");
    REQUIRE(ur && fread(raw, 1, sizeof raw, ur) == sizeof raw);
    fclose(ur);
    char secret[65];
    for (int i = 0; i < 32; i++)
        snprintf(secret + 2 * i, 3, "%02x", raw[i]);
    setenv("DOWNPOUR_SECRET", secret, 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);

    task tasks[N_TASKS] = {
        {.name = "chief", .host = 1},
        {.name = "ps:0", .host = 1},
        {.name = "worker:0", .host = 2},
        {.name = "worker:1", .host = 3},
    };
    int status[N_TASKS];

    /* 1. Fault-free. */
    double t0 = dp_now();
    for (int i = 0; i < N_TASKS; i++)
        g_pids[i] = start_task(&tasks[i], spec_path, spec_json, 1);
    wait_all(status, t0 + PHASE_DEADLINE_S);
    double clean_s = dp_now() - t0;
    double clean_acc = test_accuracy(&tasks[0]);
    int clean_ok = 1;
    for (int i = 0; i < N_TASKS; i++) {
        CHECKF(status[i] == 0, "fault-free run: %s exited %d", tasks[i].name, status[i]);
        clean_ok &= status[i] == 0;
    }
    CHECKF(clean_acc >= MIN_ACCURACY, "fault-free run: test accuracy %.4f < %.2f", clean_acc,
           MIN_ACCURACY);
    fprintf(stderr, "fault-free: %.1f s, test accuracy %.4f\n", clean_s, clean_acc);
    if (!clean_ok || clean_acc < MIN_ACCURACY) {
        for (int i = 0; i < N_TASKS; i++)
            show_log(&tasks[i]);
        return CHECK_DONE(); /* the cut run would say nothing more */
    }

    /* 2. Host 2 (worker:0) cut once it is training, restored after twice the
     * heartbeat timeout. */
    t0 = dp_now();
    for (int i = 0; i < N_TASKS; i++)
        g_pids[i] = start_task(&tasks[i], spec_path, spec_json, 2);
    int started = wait_for_line(&tasks[2], "At step 4,", t0 + 30) == 0;
    CHECKF(started, "worker:0 never reached step 4");
    double cut_at = dp_now() - t0;
    snprintf(args, sizeof args, "cut %s 2", g_prefix);
    CHECK(netns(NULL, 0, args) == 0);
    double restore_by = dp_now() + 2 * atof(HEARTBEAT_S);
    while (dp_now() < restore_by)
        usleep(50 * 1000);
    double restored_at = dp_now() - t0;
    snprintf(args, sizeof args, "restore %s 2", g_prefix);
    CHECK(netns(NULL, 0, args) == 0);
    wait_all(status, t0 + PHASE_DEADLINE_S);
    double cut_s = dp_now() - t0;
    double cut_acc = test_accuracy(&tasks[0]);
    CHECKF(status[0] == 0, "cut run: the chief exited %d", status[0]);
    CHECKF(status[1] == 0, "cut run: the ps exited %d", status[1]);
    CHECKF(status[3] == 0, "cut run: worker:1 (not cut) exited %d", status[3]);
    CHECKF(cut_acc >= MIN_ACCURACY, "cut run: test accuracy %.4f < %.2f", cut_acc, MIN_ACCURACY);
    char *chief_log = read_log(&tasks[0]), *ps_log = read_log(&tasks[1]);
    CHECKF(strstr(chief_log, "lost worker:0") != NULL, "the chief never declared worker:0 lost");
    /* The ps may be told to stop by the chief before its own heartbeat
     * timeout fires: what it saw is reported, not judged. */
    const char *ps_saw = strstr(ps_log, "lost worker:0") ? "declared worker:0 lost"
                                                          : "ended before it noticed the cut";
    char worker_last[512];
    last_line(&tasks[2], worker_last, sizeof worker_last);
    fprintf(stderr,
            "cut run: cut at %.1f s, restored at %.1f s, ended after %.1f s; test accuracy %.4f "
            "(fault-free %.4f)\n  chief %d, ps %d (%s), worker:1 %d; the cut worker:0 exited %d: %s\n",
            cut_at, restored_at, cut_s, cut_acc, clean_acc, status[0], status[1], ps_saw,
            status[3], status[2], worker_last);
    if (check_failures)
        for (int i = 0; i < N_TASKS; i++)
            show_log(&tasks[i]);
    free(chief_log);
    free(ps_log);
    return CHECK_DONE();
}
