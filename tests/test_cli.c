/* The downpour program's command line, run as a user would (fork and exec of
 * DOWNPOUR_BIN, no shell): exit codes (0 done, 1 failed, 2 usage), which
 * stream the text goes to, and the checks train makes before it trains. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "run_bin.h"
#include "scratch.h"


/* Expects exit status `code`, `want` in stderr (or NULL) and nothing on stdout. */
#define USAGE_ERROR(want, ...)                                                         \
    do {                                                                               \
        const char *args_[] = {__VA_ARGS__, NULL};                                     \
        int rc_ = run_bin(args_);                                                          \
        CHECKF(rc_ == 2, "%s ...: exit %d, want 2; stderr: %s", args_[0], rc_, g_err); \
        CHECKF(g_out[0] == '\0', "%s ...: usage error printed on stdout: %s", args_[0], g_out); \
        CHECKF(!(want) || strstr(g_err, (want)) != NULL, "%s ...: stderr lacks '%s': %s",   \
               args_[0], (const char *)(want), g_err);                                 \
    } while (0)

static const char *tmp_path(const char *name)
{
    static char buf[16][1200]; /* a few may be in use in one argument list */
    static int k;
    k = (k + 1) % 16;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

/* train refuses bad values and unusable output paths before it trains. */
static void test_train_checks(void)
{
    USAGE_ERROR("--lr -1: the learning rate must be in (0, 100]", "train", "--lr", "-1");
    USAGE_ERROR("--lr 0:", "train", "--lr=0");
    USAGE_ERROR("--lr", "train", "--lr", "1e9");
    USAGE_ERROR("--momentum -0.5: the momentum must be in [0, 1]", "train", "--momentum", "-0.5");
    USAGE_ERROR("--momentum", "train", "--momentum", "1.5");
    USAGE_ERROR("--lr", "train", "--lr", "fast");
    USAGE_ERROR("--weight-decay -0.1: the weight decay must be a finite number >= 0", "train",
                "--weight-decay", "-0.1");
    USAGE_ERROR("--weight-decay", "train", "--weight-decay", "nan");
    USAGE_ERROR("--weight-decay 2: adamw multiplies every weight by 1 - lr*W", "train",
                "--optimizer", "adamw", "--lr", "0.5", "--weight-decay", "2");
    USAGE_ERROR("--strategy lbfgs takes L-BFGS steps", "train", "--strategy", "lbfgs",
                "--weight-decay", "0.01");
    USAGE_ERROR("--strategy lbfgs takes L-BFGS steps", "train", "--strategy", "lbfgs",
                "--warmup-steps", "10");
    /* --sync-bn: allreduce only, on the CPU, on a model with bn; by launch too */
    USAGE_ERROR("--sync-bn: strategy single does not sum batch statistics", "train",
                "--model", "mlp-bn", "--sync-bn");
    USAGE_ERROR("--sync-bn: not with --device", "train", "--strategy", "allreduce", "--model",
                "mlp-bn", "--device", "sim", "--sync-bn");
    USAGE_ERROR("--sync-bn: model mlp-300-100 has no batch norm layer", "train", "--strategy",
                "allreduce", "--sync-bn");
    USAGE_ERROR("leave out --overlap on", "train", "--strategy", "allreduce", "--model",
                "mlp-bn", "--sync-bn", "--overlap", "on");
    USAGE_ERROR("downpour launch: --sync-bn: model mlp-128 has no batch norm layer", "launch",
                "--workers", "2", "--", "train", "--strategy", "allreduce", "--model",
                "mlp-128", "--sync-bn");
    USAGE_ERROR("downpour launch: --sync-bn: strategy model-avg does not sum", "launch",
                "--workers", "2", "--", "train", "--strategy", "model-avg", "--sync-bn");
    /* --no-nccl: allreduce only, with --device; by launch too */
    USAGE_ERROR("--no-nccl: without --device the gradients are summed on the host already",
                "train", "--strategy", "allreduce", "--no-nccl");
    USAGE_ERROR("downpour launch: --no-nccl: strategy ps-async does not sum gradients with NCCL",
                "launch", "--workers", "2", "--", "train", "--strategy", "ps-async", "--no-nccl");
    USAGE_ERROR("--resume needs --checkpoint-dir", "train", "--resume");
    USAGE_ERROR("need --checkpoint-dir", "train", "--checkpoint-every", "100");
    USAGE_ERROR("--keep-checkpoints", "train", "--checkpoint-dir", tmp_path("ck"),
                "--keep-checkpoints", "0");
    USAGE_ERROR("--keep-checkpoints", "train", "--checkpoint-dir", tmp_path("ck"),
                "--keep-checkpoints", "1001");
    USAGE_ERROR("--checkpoint-every", "train", "--checkpoint-dir", tmp_path("ck"),
                "--checkpoint-every", "-1");
    USAGE_ERROR("--save /nonexistent/m.safetensors: directory /nonexistent does not exist",
                "train", "--save", "/nonexistent/m.safetensors");
    USAGE_ERROR("--metrics /nonexistent/run.jsonl: directory /nonexistent does not exist",
                "train", "--metrics", "/nonexistent/run.jsonl");
    USAGE_ERROR("is a directory", "train", "--save", g_dir);

    FILE *f = fopen(tmp_path("plainfile"), "w");
    REQUIRE(f != NULL);
    fclose(f);
    USAGE_ERROR("is a file, not a directory", "train", "--checkpoint-dir", tmp_path("plainfile"));
    USAGE_ERROR("is not a directory", "train", "--metrics", tmp_path("plainfile/run.jsonl"));

    /* Good paths pass the checks (the checkpoint directory is made); the run
     * then fails on the dataset (a directory without IDX files), a runtime
     * error: exit 1. */
    mkdir(tmp_path("no-such-data"), 0755);
    const char *args[] = {"train", "--dataset", tmp_path("no-such-data"), "--checkpoint-dir",
                          tmp_path("made/by/train"), "--checkpoint-every", "50",
                          "--keep-checkpoints", "2", "--resume", "--save", tmp_path("m.st"),
                          "--metrics", tmp_path("m.jsonl"), "--lr", "0.01", "--momentum", "0",
                          "--secret-file", tmp_path("no-secret-needed"), NULL};
    int rc = run_bin(args);
    CHECKF(rc == 1, "exit %d: %s", rc, g_err);
    CHECKF(strstr(g_err, "no-such-data"), "%s", g_err);
    struct stat st;
    CHECK(stat(tmp_path("made/by/train"), &st) == 0 && S_ISDIR(st.st_mode));
}

/* The help lists the new options; the learning rate's default is the optimizer's. */
static void test_train_help(void)
{
    const char *args[] = {"train", "--help", NULL};
    CHECK(run_bin(args) == 0);
    static const char *const want[] = {"--checkpoint-dir DIR", "--checkpoint-every N",
                                       "--keep-checkpoints K", "--resume", "--secret-file FILE",
                                       "adam 0.001", "sgd 0.01", "(default: 0.9)",
                                       "(default: 3)"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECKF(strstr(g_out, want[i]) != NULL, "train --help lacks '%s'", want[i]);
    CHECKF(strstr(g_out, "nan") == NULL && strstr(g_out, "-1:") == NULL, "%s", g_out);
}

/* A loopback port that was free a moment ago. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    REQUIRE(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    REQUIRE(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* --startup-timeout and --heartbeat-timeout: ranges, help, and a task whose
 * peer never comes gives up after the startup timeout, naming it. */
static void test_train_timeouts(void)
{
    USAGE_ERROR("--startup-timeout: 0 is out of range [1, 86400]", "train", "--startup-timeout", "0");
    USAGE_ERROR("--heartbeat-timeout: 0.1 is out of range [0.5, 3600]", "train",
                "--heartbeat-timeout", "0.1");
    USAGE_ERROR("--heartbeat-timeout: 5000 is out of range", "train", "--heartbeat-timeout", "5000");
    const char *help[] = {"train", "--help", NULL};
    CHECK(run_bin(help) == 0);
    CHECKF(strstr(g_out, "--startup-timeout S") && strstr(g_out, "(default: 600)"), "%s", g_out);
    CHECKF(strstr(g_out, "--heartbeat-timeout S") && strstr(g_out, "(default: 10)"), "%s", g_out);

    static const char hex[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
    int fd = open(tmp_path("secret"), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0 && write(fd, hex, sizeof hex - 1) == (ssize_t)(sizeof hex - 1));
    close(fd);
    char spec[256];
    int p0 = free_port(), p1 = free_port();
    snprintf(spec, sizeof spec,
             "{\"cluster\": {\"worker\": [\"127.0.0.1:%d\", \"127.0.0.1:%d\"]}, "
             "\"task\": {\"type\": \"worker\", \"index\": 0}}",
             p0, p1 == p0 ? p0 + 1 : p1);
    setenv("DOWNPOUR_CONFIG", spec, 1);
    const char *args[] = {"train", "--strategy", "allreduce", "--secret-file", tmp_path("secret"),
                          "--startup-timeout", "1", "--heartbeat-timeout", "1", NULL};
    int rc = run_bin(args);
    unsetenv("DOWNPOUR_CONFIG");
    CHECKF(rc == 1, "exit %d: %s", rc, g_err);
    CHECKF(strstr(g_err, "cannot connect to worker:1") && strstr(g_err, "within 1.0 s"), "%s",
           g_err);
}

/* Every write error of a run's outputs fails the command (exit 1), naming
 * the file and the error: --metrics on a full disk (/dev/full), --save and
 * checkpoints past a file size limit (EFBIG, which binds root too). */
static void test_train_write_errors(void)
{
    const char *data = getenv("DOWNPOUR_DATA");
    char mnist[1100];
    snprintf(mnist, sizeof mnist, "%s/mnist", data ? data : "");
    struct stat st;
    if (!data || stat(mnist, &st) != 0) {
        fprintf(stderr, "no MNIST under DOWNPOUR_DATA: skipping the write-error runs\n");
        return;
    }
    USAGE_ERROR("", "train", "--save", "/dev/full"); /* never renamed over */
    CHECKF(strstr(g_err, "--save /dev/full: is a character device"), "%s", g_err);
    REQUIRE(stat("/dev/full", &st) == 0 && S_ISCHR(st.st_mode));
    REQUIRE(mkfifo(tmp_path("fifo"), 0644) == 0);
    USAGE_ERROR("is a FIFO", "train", "--save", tmp_path("fifo"));

#define SMALL_RUN "train", "--dataset", mnist, "--train-size", "1000", "--val-size", "200", \
                  "--epochs", "2", "--batch", "100", "--quiet", "--no-progress"
    const char *metrics[] = {SMALL_RUN, "--metrics", "/dev/full", NULL};
    int rc = run_bin(metrics);
    CHECKF(rc == 1, "--metrics /dev/full: exit %d: %s", rc, g_err);
    CHECKF(strstr(g_err, "downpour train: metrics file /dev/full: write failed: ") &&
               strstr(g_err, strerror(ENOSPC)) && strstr(g_err, "Test accuracy"),
           "%s", g_err);

    g_fsize_limit = 64 * 1024; /* the weights are 1 MB */
    const char *save[] = {SMALL_RUN, "--save", tmp_path("m.safetensors"), NULL};
    rc = run_bin(save);
    CHECKF(rc == 1, "--save past the size limit: exit %d: %s", rc, g_err);
    CHECKF(strstr(g_err, tmp_path("m.safetensors")) && strstr(g_err, strerror(EFBIG)), "%s",
           g_err);
    const char *ckpt[] = {SMALL_RUN, "--checkpoint-dir", tmp_path("ck"), "--checkpoint-every",
                          "5", NULL};
    rc = run_bin(ckpt);
    /* a checkpoint not written costs itself, not the run (docs/checkpoints.md) */
    CHECKF(rc == 3, "checkpoint past the size limit: exit %d: %s", rc, g_err);
    CHECKF(strstr(g_err, "ckpt-0000000005") && strstr(g_err, strerror(EFBIG)) &&
               strstr(g_err, "Test accuracy"), "%s", g_err);
    g_fsize_limit = 0;
#undef SMALL_RUN
}

/* --no-shm: accepted by train, passed on by launch to every task, which
 * then talks to its peers over TCP (docs/transport.md, "Shared memory");
 * without it the same run connects through shared memory. */
static void test_train_no_shm(void)
{
    const char *data = getenv("DOWNPOUR_DATA");
    char mnist[1100];
    snprintf(mnist, sizeof mnist, "%s/mnist", data ? data : "");
    struct stat st;
    if (!data || stat(mnist, &st) != 0) {
        fprintf(stderr, "no MNIST under DOWNPOUR_DATA: skipping the --no-shm runs\n");
        return;
    }
    unsetenv("DOWNPOUR_SHM");
    unsetenv("DOWNPOUR_LOG_LEVEL");
    /* off 1: --no-shm; 0: shm, the launcher's --verbose (inherited by the
     * tasks) shows each connection; -1: shm at the default level, where the
     * connections are debug lines (issue 29: one start-up line per task) */
    for (int off = 1; off >= -1; off--) {
        const char *args[32] = {"launch", "--workers", "2"};
        int n = 3;
        if (off == 0)
            args[n++] = "--verbose";
        const char *train[] = {"--", "train", "--dataset", mnist, "--strategy", "allreduce",
                               "--train-size", "400", "--val-size", "100", "--epochs", "1",
                               "--batch", "100", "--quiet", "--no-progress"};
        for (size_t i = 0; i < sizeof train / sizeof train[0]; i++)
            args[n++] = train[i];
        if (off > 0)
            args[n++] = "--no-shm";
        args[n] = NULL;
        int rc = run_bin(args);
        CHECKF(rc == 0, "launch (shm %s): exit %d: %s", off > 0 ? "off" : "on", rc, g_err);
        /* the tasks' lines go through the launcher, on stdout or stderr */
#define LOGGED(str) (strstr(g_out, (str)) || strstr(g_err, (str)))
        if (off > 0)
            CHECKF(!LOGGED("through shared memory") &&
                       LOGGED("worker:0: shared memory off (--no-shm): tasks on this host talk "
                              "over TCP"),
                   "--no-shm: %s%s", g_out, g_err);
        else if (off == 0)
            CHECKF(LOGGED("connected to worker:1") && LOGGED("through shared memory (4096 KiB"),
                   "shared memory on, --verbose: %s%s", g_out, g_err);
        else
            CHECKF(!LOGGED("through shared memory") && LOGGED("worker:1 allreduce: "),
                   "shared memory on, default level: %s%s", g_out, g_err);
#undef LOGGED
    }
}

/* Issue 29's noise: a bad --log-level is a usage error; ps-async workers do
 * not log the SSP bound (ps-ssp's do); a launched run leaves only the merged
 * metrics file. */
static void test_log_noise(void)
{
    const char *bad[] = {"train", "--log-level", "loud", NULL};
    int rc = run_bin(bad);
    CHECKF(rc == 2 && strstr(g_err, "--log-level 'loud'"), "exit %d: %s", rc, g_err);
    const char *bad_launch[] = {"launch", "--log-level", "x", "--", "train", NULL};
    rc = run_bin(bad_launch);
    CHECKF(rc == 2 && strstr(g_err, "--log-level"), "launch: exit %d: %s", rc, g_err);
    setenv("DOWNPOUR_LOG_LEVEL", "chatty", 1);
    const char *env[] = {"train", "--help", NULL};
    rc = run_bin(env);
    CHECKF(rc == 2 && strstr(g_err, "DOWNPOUR_LOG_LEVEL"), "env: exit %d: %s", rc, g_err);
    unsetenv("DOWNPOUR_LOG_LEVEL");

    const char *data = getenv("DOWNPOUR_DATA");
    char mnist[1100], metrics[1200], part[1300];
    snprintf(mnist, sizeof mnist, "%s/mnist", data ? data : "");
    struct stat st;
    if (!data || stat(mnist, &st) != 0) {
        fprintf(stderr, "no MNIST under DOWNPOUR_DATA: skipping the ps runs\n");
        return;
    }
    const char *strategies[] = {"ps-async", "ps-ssp"};
    for (int i = 0; i < 2; i++) {
        snprintf(metrics, sizeof metrics, "%s/noise-%d.jsonl", g_dir, i);
        const char *args[] = {"launch", "--chief", "--workers", "2", "--ps", "1", "--", "train",
                              "--dataset", mnist, "--strategy", strategies[i], "--train-size",
                              "400", "--val-size", "100", "--test-size", "100", "--epochs", "1",
                              "--batch", "100", "--no-progress", "--metrics", metrics, NULL};
        rc = run_bin(args);
        CHECKF(rc == 0, "%s: exit %d: %s", strategies[i], rc, g_err);
        int gap = strstr(g_out, "largest clock gap") || strstr(g_err, "largest clock gap");
        CHECKF(gap == (i == 1), "%s: the SSP bound %s: %s%s", strategies[i],
               gap ? "logged" : "not logged", g_out, g_err);
        CHECK(stat(metrics, &st) == 0);
        const char *parts[] = {"launcher", "chief-0", "worker-0", "worker-1", "ps-0"};
        for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
            snprintf(part, sizeof part, "%s.%s", metrics, parts[k]);
            CHECKF(stat(part, &st) != 0, "%s left beside the merged file", part);
        }
    }
}

/* run --secret-file: read before the task starts. */
static void test_run_secret_file(void)
{
    char spec[1200];
    snprintf(spec, sizeof spec, "%s", tmp_path("cluster.json"));
    FILE *f = fopen(spec, "w");
    REQUIRE(f != NULL);
    fputs("{\"cluster\": {\"worker\": [\"127.0.0.1:1\"]}}\n", f);
    fclose(f);
    USAGE_ERROR("cannot open secret file", "run", "--cluster", spec, "--task", "worker:0",
                "--secret-file", tmp_path("missing-secret"), "--", "train");
    f = fopen(tmp_path("short-secret"), "w");
    REQUIRE(f != NULL);
    fputs("abc\n", f);
    fclose(f);
    chmod(tmp_path("short-secret"), 0600);
    USAGE_ERROR("at least 16", "run", "--cluster", spec, "--task", "worker:0", "--secret-file",
                tmp_path("short-secret"), "--", "train");
    const char *args[] = {"run", "--help", NULL};
    CHECK(run_bin(args) == 0);
    CHECKF(strstr(g_out, "--secret-file FILE"), "%s", g_out);
}

/* Help, asked for, goes to stdout with exit 0 and nothing on stderr. */
static void test_help(void)
{
    static const char *const cases[][5] = {
        {"--help"}, {"-h"}, {"help"}, {"help", "train"}, {"help", "launch"},
        {"train", "--help"}, {"eval", "--help"}, {"launch", "--help"}, {"run", "--help"},
        {"ping", "--help"}, {"version", "--help"}, {"train", "-h"},
        {"train", "--batch", "64", "--help"}, {"launch", "--workers", "3", "--help"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = run_bin(cases[i]);
        CHECKF(rc == 0, "%s %s: exit %d", cases[i][0], cases[i][1] ? cases[i][1] : "", rc);
        CHECKF(strncmp(g_out, "usage: ", 7) == 0, "%s %s: stdout: %s", cases[i][0],
               cases[i][1] ? cases[i][1] : "", g_out);
        CHECKF(g_err[0] == '\0', "%s %s: stderr: %s", cases[i][0], cases[i][1] ? cases[i][1] : "",
               g_err);
    }
    const char *top[] = {"--help", NULL};
    run_bin(top);
    CHECK(strstr(g_out, "  version ") && strstr(g_out, "  train "));
}

static void test_version(void)
{
    static const char *const cases[][2] = {{"--version"}, {"version"}, {"-V"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECKF(run_bin(cases[i]) == 0, "%s", cases[i][0]);
        int a, b, c, n = 0;
        CHECKF(sscanf(g_out, "downpour %d.%d.%d\n%n", &a, &b, &c, &n) == 3 &&
                   (size_t)n == strlen(g_out),
               "%s: stdout '%s'", cases[i][0], g_out);
        CHECKF(g_err[0] == '\0', "%s: stderr: %s", cases[i][0], g_err);
    }
    CHECK(strcmp(g_out, "downpour 0.1.0\n") == 0 || getenv("DOWNPOUR_VERSION_ANY"));
}

/* Every numeric flag of every command has a range: a value just below or
 * just above it is refused with exit 2, naming the flag and the range. */
static void test_flag_ranges(void)
{
    static const struct {
        const char *cmd, *flag, *low, *high, *range;
    } cases[] = {
        {"train", "--fetch-every", "0", "1000001", "[1, 1000000]"},
        {"train", "--push-every", "0", "1000001", "[1, 1000000]"},
        {"train", "--staleness", "-1", "1000001", "[0, 1000000]"},
        {"train", "--period", "0", "1000001", "[1, 1000000]"},
        {"train", "--ps-min-shard-bytes", "4095", "1099511627777", "[4096, 1099511627776]"},
        {"train", "--ps-max-shards", "-1", "4097", "[0, 4096]"},
        {"train", "--ps", "-1", "4097", "[0, 4096]"},
        {"train", "--bucket-bytes", "4", "4294967297", "[16384, 4294967296]"},
        {"train", "--collective-timeout", "0.5", "86401", "[1, 86400]"},
        {"train", "--batch", "0", "65537", "[1, 65536]"},
        {"train", "--epochs", "0", "100001", "[1, 100000]"},
        {"train", "--ema", "-0.1", "1", "[0, 0.999999]"},
        {"train", "--seed", "-1", "2147483648", "[0, 2147483647]"},
        {"train", "--train-size", "0", "100000001", "[1, 100000000]"},
        {"train", "--val-size", "-1", "100000001", "[0, 100000000]"},
        {"train", "--threads", "-1", "1025", "[0, 1024]"},
        {"train", "--log-every", "-1", "100000001", "[0, 100000000]"},
        {"train", "--checkpoint-every", "-1", "1000000000001", "[0, 1000000000000]"},
        {"train", "--keep-checkpoints", "0", "1001", "[1, 1000]"},
        {"train", "--startup-timeout", "0.5", "86401", "[1, 86400]"},
        {"train", "--heartbeat-timeout", "0.4", "3601", "[0.5, 3600]"},
        {"ping", "--count", "0", "10000001", "[1, 10000000]"},
        {"ping", "--bytes", "-1", "1073741825", "[0, 1073741824]"},
        {"ping", "--timeout", "0.001", "86401", "[0.01, 86400]"},
        {"ping", "--connect-timeout", "0.5", "86401", "[1, 86400]"},
        {"launch", "--workers", "0", "257", "[1, 256]"},
        {"launch", "--ps", "-1", "257", "[0, 256]"},
        {"launch", "--grace", "0.01", "3601", "[0.1, 3600]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *vals[2] = {cases[i].low, cases[i].high};
        for (int k = 0; k < 2; k++) {
            char buf[160];
            const char *want = buf;
            snprintf(buf, sizeof buf, "%s: %s is out of range %s", cases[i].flag, vals[k],
                     cases[i].range);
            USAGE_ERROR(want, cases[i].cmd, cases[i].flag, vals[k], "--", "train");
        }
    }
    USAGE_ERROR("--heartbeat-timeout", "train", "--heartbeat-timeout", "nan");
    USAGE_ERROR("--startup-timeout", "train", "--startup-timeout", "inf");
    USAGE_ERROR("--keep-best picks the epoch with the best validation accuracy", "train",
                "--keep-best", "--val-size", "0");
}

/* Every usage error exits 2, says so on stderr, and prints nothing on stdout. */
static void test_usage_errors(void)
{
    const char *none[] = {NULL};
    CHECK(run_bin(none) == 2 && g_out[0] == '\0' && strstr(g_err, "usage: "));

    USAGE_ERROR("unknown command 'frobnicate'", "frobnicate");
    USAGE_ERROR("unknown option '--frob'", "--frob");
    USAGE_ERROR("unknown command 'nope'", "help", "nope");
    USAGE_ERROR("unexpected argument 'extra'", "help", "train", "extra");
    USAGE_ERROR("unexpected argument 'extra'", "version", "extra");
    USAGE_ERROR("unexpected argument", "--version", "extra");

    /* unknown option, for every command */
    static const char *const cmds[] = {"train", "eval", "launch", "run", "ping"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        USAGE_ERROR("unknown option '--frob'", cmds[i], "--frob");
    /* missing value */
    USAGE_ERROR("--batch needs a value", "train", "--batch");
    USAGE_ERROR("--workers needs a value", "launch", "--workers");
    USAGE_ERROR("--checkpoint needs a value", "eval", "--checkpoint");
    USAGE_ERROR("--cluster needs a value", "run", "--cluster");
    USAGE_ERROR("--count needs a value", "ping", "--count");
    /* bad value */
    USAGE_ERROR("--batch: 'abc' is not an integer", "train", "--batch", "abc");
    USAGE_ERROR("--batch: 0 is out of range", "train", "--batch=0");
    USAGE_ERROR("--workers", "launch", "--workers", "0", "--", "train");
    USAGE_ERROR("--grace", "launch", "--grace", "soon", "--", "train");
    USAGE_ERROR("--dataset: empty value", "eval", "--dataset=");
    USAGE_ERROR("--test-size: -1 is out of range", "eval", "--checkpoint", "m.st", "--test-size", "-1");
    USAGE_ERROR("--count", "ping", "--count", "x");
    USAGE_ERROR("takes no value", "train", "--resume=yes");
    USAGE_ERROR("--strategy", "train", "--strategy", "gossip");
    USAGE_ERROR("--optimizer", "train", "--optimizer", "lion");
    USAGE_ERROR("--staleness-range", "train", "--staleness-range", "5:2");
    /* unexpected argument */
    USAGE_ERROR("unexpected argument 'extra'", "train", "extra");
    USAGE_ERROR("unknown option '-x'", "train", "-x"); /* one dash: an option misspelt */
    USAGE_ERROR("unexpected argument 'extra'", "eval", "--checkpoint", "m.st", "extra");
    USAGE_ERROR("unexpected argument 'extra'", "ping", "extra");
    /* missing or wrong parts */
    USAGE_ERROR("--checkpoint FILE is required", "eval");
    USAGE_ERROR("no task command", "launch", "--workers", "2");
    USAGE_ERROR("'eval'", "launch", "--", "eval");
    USAGE_ERROR("no command", "run");
    USAGE_ERROR("'launch'", "run", "--", "launch");
    USAGE_ERROR("no cluster spec", "run", "--", "train");
    USAGE_ERROR("not a cluster task", "ping");
    /* an instruction-set cap that names no level (docs/architecture.md, "Instruction sets") */
    setenv("DOWNPOUR_ISA", "avx9", 1);
    USAGE_ERROR("DOWNPOUR_ISA: unknown instruction set 'avx9' (expected one of: scalar, sse4.2, "
                "avx2, avx512)", "train", "--epochs", "1");
    setenv("DOWNPOUR_ISA", "avx2", 1);
    USAGE_ERROR("--batch", "train", "--batch", "0"); /* a valid cap: on to train's own checks */
    unsetenv("DOWNPOUR_ISA");
    /* the options' fallback variables: 0 or 1 (env.h), else refused before any work */
    setenv("DOWNPOUR_SHM", "off", 1);
    USAGE_ERROR("DOWNPOUR_SHM: 'off' is not 0 or 1 (0 does as train --no-shm)", "train",
                "--epochs", "1");
    unsetenv("DOWNPOUR_SHM");
    setenv("DOWNPOUR_NCCL", "no", 1);
    USAGE_ERROR("DOWNPOUR_NCCL: 'no' is not 0 or 1 (0 does as train --no-nccl)", "launch",
                "--workers", "2");
    setenv("DOWNPOUR_NCCL", "0", 1);
    USAGE_ERROR("--batch", "train", "--batch", "0"); /* a valid value: on to train's checks */
    unsetenv("DOWNPOUR_NCCL");
}

int main(void)
{
    g_bin = getenv("DOWNPOUR_BIN");
    if (!g_bin || !*g_bin) {
        fprintf(stderr, "skipping: DOWNPOUR_BIN is not set (run under ctest)\n");
        return 77;
    }
    scratch_make(g_dir, sizeof g_dir, "test_cli");
    unsetenv("DOWNPOUR_CONFIG");
    unsetenv("TF_CONFIG");
    unsetenv("DOWNPOUR_SECRET");
    test_help();
    test_version();
    test_usage_errors();
    test_train_checks();
    test_train_help();
    test_run_secret_file();
    test_train_timeouts();
    test_train_write_errors();
    test_train_no_shm();
    test_log_noise();
    test_flag_ranges();
    return CHECK_DONE();
}
