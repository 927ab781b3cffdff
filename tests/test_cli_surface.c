/* The surface a new user meets first (issue 29): launch's defaults and its
 * one check before any task starts, hints that are whole commands which work
 * when pasted, train --help's sections and width, "did you mean", exit 2 for
 * every usage error, and the run's messages (no banner before a data error,
 * no validation figure without validation, eval's dataset comparison, IDX
 * files in data inspect).  Runs DOWNPOUR_BIN as a user would. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zlib.h>

#include "check.h"
#include "run_bin.h"
#include "scratch.h"

static char g_mnist[1200]; /* "" when the data is absent: those parts are skipped */

#define RUN(...) run_bin((const char *const[]){__VA_ARGS__, NULL})

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

static int lines(const char *s)
{
    return count(s, "\n");
}

/* The hint's command ("Hint: downpour launch ...", to the end of its line),
 * run as pasted: split on spaces (the hints here need no quoting), without
 * the leading "downpour".  Returns its exit status; -2 when there is none. */
static int run_hint(const char *text)
{
    const char *h = strstr(text, "Hint: downpour ");
    if (!h)
        return -2;
    static char cmd[4096];
    snprintf(cmd, sizeof cmd, "%.*s", (int)strcspn(h + 15, "\n"), h + 15);
    const char *args[96];
    int n = 0;
    for (char *save = NULL, *t = strtok_r(cmd, " ", &save); t && n < 95;
         t = strtok_r(NULL, " ", &save))
        args[n++] = t;
    args[n] = NULL;
    return run_bin(args);
}

#define SMALL "--dataset", g_mnist, "--train-size", "600", "--val-size", "100", "--test-size", \
              "100", "--epochs", "1", "--no-progress", "--quiet", "--threads", "1"

/* launch -- train: allreduce over the workers alone, ps-async with --ps (a
 * chief added); the hint of train --strategy allreduce alone is a launch
 * command with no ps task, and it runs. */
static void test_launch_defaults(void)
{
    if (!*g_mnist)
        return;
    int rc = RUN("launch", "--", "train", SMALL);
    CHECKF(rc == 0, "launch -- train: exit %d: %s", rc, g_err);
    CHECKF(strstr(g_err, "Test accuracy"), "%s", g_err);
    rc = RUN("launch", "--ps", "1", "--", "train", SMALL);
    CHECKF(rc == 0, "launch --ps 1 -- train: exit %d: %s", rc, g_err);
    CHECKF(strstr(g_err, "ps-async needs a chief; added one"), "%s", g_err);

    rc = RUN("train", "--strategy", "allreduce", SMALL);
    CHECKF(rc == 2, "train --strategy allreduce alone: exit %d: %s", rc, g_err);
    CHECKF(strstr(g_err, "Hint: downpour launch --workers 2 -- train --strategy allreduce") &&
               !strstr(g_err, "--ps"), "%s", g_err);
    rc = run_hint(g_err);
    CHECKF(rc == 0, "the hint, pasted: exit %d: %s", rc, g_err);
}

/* A usage error under launch is one message, exit 2, before any task
 * starts: never a task's failure nor a fault the run "goes on without". */
static void test_launch_checks_once(void)
{
    int rc = RUN("launch", "--workers", "3", "--", "train", "--strategy", "ps-async");
    CHECKF(rc == 2, "exit %d: %s", rc, g_err);
    CHECKF(lines(g_err) == 1 && strstr(g_err, "needs at least one ps task") &&
               !strstr(g_err, "fault"), "%s", g_err);
    /* its hint pastes, and is right: --help proves the options parse */
    CHECKF(strstr(g_err, "Hint: downpour launch --chief --workers 3 --ps 1 -- train "
                         "--strategy ps-async"), "%s", g_err);

    rc = RUN("launch", "--workers", "3", "--", "train", "--modle", "mlp-128");
    CHECKF(rc == 2 && count(g_err, "unknown option") == 1 && !strstr(g_err, "fault"),
           "exit %d: %s", rc, g_err);
    CHECKF(strstr(g_err, "did you mean --model?"), "%s", g_err);

    rc = RUN("launch", "--workers", "2", "--ps", "1", "--", "train", "--strategy", "allreduce");
    CHECKF(rc == 2 && lines(g_err) == 1 && strstr(g_err, "needs no ps task") &&
               strstr(g_err, "Hint: downpour launch --workers 2 -- train --strategy allreduce"),
           "exit %d: %s", rc, g_err);

    /* mpirun's -np: refused with the flag that means it */
    rc = RUN("launch", "-np", "4", "--", "ping");
    CHECKF(rc == 2 && strstr(g_err, "Hint: downpour launch --workers 4 -- ping"), "exit %d: %s",
           rc, g_err);
    rc = RUN("launch", "--", "train", "--help");
    CHECKF(rc == 0 && strstr(g_out, "usage: downpour train"), "exit %d: %s", rc, g_err);
}

/* A task started by hand checks its strategy before it waits on a peer; mpi
 * outside an MPI job says where it must run. */
static void test_hand_started(void)
{
    setenv("TF_CONFIG",
           "{\"cluster\": {\"worker\": [\"127.0.0.1:1\", \"127.0.0.1:2\"]}, "
           "\"task\": {\"type\": \"worker\", \"index\": 0}}", 1);
    /* --startup-timeout: a tree that waits first fails here, not at 600 s */
    int rc = RUN("train", "--startup-timeout", "2");
    unsetenv("TF_CONFIG");
    CHECKF(rc == 2 && strstr(g_err, "--strategy single trains one process alone") &&
               strstr(g_err, "Hint: --strategy allreduce"), "exit %d: %s", rc, g_err);

    rc = RUN("train", "--transport", "mpi");
    CHECKF(rc == 2 && strstr(g_err, "mpirun or srun") && strstr(g_err, "Hint: mpirun -np"),
           "exit %d: %s", rc, g_err);
}

/* --help: sections, 80 columns, one default each. */
static void test_train_help(void)
{
    int rc = RUN("train", "--help");
    CHECK(rc == 0);
    static const char *const sections[] = {"\ndata:\n", "\nmodel:\n", "\noptimisation:\n",
                                           "\nstrategy", "\ncluster", "\noutput:\n"};
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++)
        CHECKF(strstr(g_out, sections[i]), "train --help lacks section '%s'", sections[i] + 1);
    int line = 1;
    for (const char *p = g_out; *p; line++) {
        size_t len = strcspn(p, "\n");
        CHECKF(len <= 80, "train --help line %d is %zu columns: %.*s", line, len, (int)len, p);
        char one[400];
        snprintf(one, sizeof one, "%.*s", (int)(len < 399 ? len : 399), p);
        CHECKF(count(one, "default") <= 1, "line %d: two defaults: %s", line, one);
        p += len + (p[len] == '\n');
    }
    const char *portion = strstr(g_out, "--portion N");
    CHECK(portion && count(portion, "default") >= 1);
    if (portion) { /* its entry: up to the next option */
        const char *next = strstr(portion + 2, "\n  --");
        char entry[600];
        snprintf(entry, sizeof entry, "%.*s", (int)(next ? next - portion : 200), portion);
        CHECKF(count(entry, "(default") == 1, "--portion: %s", entry);
    }
}

/* Exit 2 and "did you mean" for unknown options, strategies, datasets and
 * presets; exit 2 for a batch above the training records. */
static void test_usage_errors(void)
{
    int rc = RUN("train", "--model", "foo");
    CHECKF(rc == 2 && strstr(g_err, "not a preset"), "--model foo: exit %d: %s", rc, g_err);
    rc = RUN("train", "--model", "mlp-12");
    CHECKF(rc == 2 && strstr(g_err, "did you mean --model mlp-128?"), "exit %d: %s", rc, g_err);
    rc = RUN("train", "--strategy", "allreduc");
    CHECKF(rc == 2 && strstr(g_err, "did you mean --strategy allreduce?"), "exit %d: %s", rc,
           g_err);
    rc = RUN("train", "--dataset", "mnsit");
    CHECKF(rc == 2 && strstr(g_err, "did you mean --dataset mnist?"), "exit %d: %s", rc, g_err);
    rc = RUN("train", "--epoch", "3");
    CHECKF(rc == 2 && strstr(g_err, "did you mean --epochs?"), "exit %d: %s", rc, g_err);
    rc = RUN("train", "-lr", "0.1");
    CHECKF(rc == 2 && strstr(g_err, "did you mean --lr?"), "exit %d: %s", rc, g_err);
    rc = RUN("train", "--batch", "60000", "--train-size", "6000");
    CHECKF(rc == 2 && strstr(g_err, "--batch 60000") && strstr(g_err, "--train-size 6000"),
           "exit %d: %s", rc, g_err);
    CHECK(!strstr(g_err, "Training:"));
}

/* No banner before a dataset error; no validation figure without
 * validation; eval knows the dataset it was trained on however spelt. */
static void test_run_messages(void)
{
    char empty[1200];
    snprintf(empty, sizeof empty, "%s/empty-dataset", g_dir);
    mkdir(empty, 0755);
    int rc = RUN("train", "--dataset", empty, "--epochs", "1");
    CHECKF(rc == 1 && !strstr(g_err, "Training:") && strstr(g_err, "empty-dataset"),
           "exit %d: %s", rc, g_err);
    if (!*g_mnist)
        return;
    char save[1200];
    snprintf(save, sizeof save, "%s/m.safetensors", g_dir);
    rc = RUN("train", "--dataset", g_mnist, "--train-size", "600", "--val-size", "0",
             "--test-size", "100", "--epochs", "1", "--no-progress", "--threads", "1", "--save",
             save);
    CHECKF(rc == 0, "exit %d: %s", rc, g_err);
    CHECKF(!strstr(g_err, "val_accuracy 0.0000") && strstr(g_err, "no validation"), "%s", g_err);

    char spelt[1300];
    snprintf(spelt, sizeof spelt, "%s/./", g_mnist); /* the same directory, spelt otherwise */
    rc = RUN("eval", "--checkpoint", save, "--dataset", spelt, "--test-size", "100");
    CHECKF(rc == 0 && !strstr(g_err, "was trained on"), "exit %d: %s", rc, g_err);
}

/* data inspect on IDX files, raw and gzip: recognised, not a damaged TFRecord. */
static void test_inspect_idx(void)
{
    unsigned char idx[4 + 4 + 5] = {0, 0, 8, 1, 0, 0, 0, 5, 3, 1, 4, 1, 5};
    char raw[1200], gz[1200];
    snprintf(raw, sizeof raw, "%s/labels-idx1-ubyte", g_dir);
    snprintf(gz, sizeof gz, "%s/labels-idx1-ubyte.gz", g_dir);
    FILE *f = fopen(raw, "wb");
    REQUIRE(f && fwrite(idx, 1, sizeof idx, f) == sizeof idx && fclose(f) == 0);
    gzFile g = gzopen(gz, "wb");
    REQUIRE(g && gzwrite(g, idx, sizeof idx) == (int)sizeof idx && gzclose(g) == Z_OK);
    int rc = RUN("data", "inspect", raw);
    CHECKF(rc == 0 && strstr(g_out, "IDX") && strstr(g_out, "5 labels, values 1..5"),
           "exit %d: %s %s", rc, g_out, g_err);
    rc = RUN("data", "inspect", gz);
    CHECKF(rc == 0 && strstr(g_out, "IDX file (gzip)") && !strstr(g_err, "TFRecord"),
           "exit %d: %s %s", rc, g_out, g_err);
}

int main(void)
{
    g_bin = getenv("DOWNPOUR_BIN");
    if (!g_bin || !*g_bin) {
        fprintf(stderr, "skipping: DOWNPOUR_BIN is not set (run under ctest)\n");
        return 77;
    }
    scratch_make(g_dir, sizeof g_dir, "test_cli_surface");
    static const char *const env[] = {"DOWNPOUR_CONFIG", "TF_CONFIG", "DOWNPOUR_SECRET",
                                      "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK",
                                      "PMIX_RANK", "SLURM_PROCID", "MPI_LOCALNRANKS",
                                      "MV2_COMM_WORLD_SIZE", "HYDI_CONTROL_FD"};
    for (size_t i = 0; i < sizeof env / sizeof env[0]; i++)
        unsetenv(env[i]);
    const char *data = getenv("DOWNPOUR_DATA");
    struct stat st;
    snprintf(g_mnist, sizeof g_mnist, "%s/mnist", data && *data ? data : "data");
    char probe[1300];
    snprintf(probe, sizeof probe, "%s/train-labels-idx1-ubyte", g_mnist);
    char probe_gz[1400];
    snprintf(probe_gz, sizeof probe_gz, "%s.gz", probe);
    if (stat(probe, &st) != 0 && stat(probe_gz, &st) != 0) {
        fprintf(stderr, "note: no MNIST under %s: the parts that train are skipped\n", g_mnist);
        g_mnist[0] = '\0';
    }
    test_train_help();
    test_usage_errors();
    test_hand_started();
    test_launch_checks_once();
    test_launch_defaults();
    test_run_messages();
    test_inspect_idx();
    return CHECK_DONE();
}
