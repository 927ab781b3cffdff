/* Click-through models on sparse rows (docs/strategies.md, "Sparse rows";
 * docs/models.md, "Click-through models"): embedding bags state their
 * tables to the layer table, so a parameter server moves only the rows a
 * batch's ids name (dp_model_bag_row's rows; -1, an empty place, names
 * none).  On a small set of `downpour data synth ctr` (3 single-valued
 * features and a multi-valued one of up to 3 ids, 2000 ids each, 2 numeric;
 * a worker holds a table's rows of the batch in flight, 500, or 1500 for the multi-valued one, of 2000):
 * - ps-sync, 2 workers and 2 ps tasks, adagrad, a wide-deep and a dlrm
 *   shape: the saved weights equal --ps-dense's bit for bit (ps-sync with
 *   sgd on rows: test_ps_sparse, in process);
 * - ps-async with one worker equals one process (sgd: the rows' update);
 * - a ps-sync run killed at step 33 and resumed (every task compact: the
 *   ps tasks read their rows a piece at a time) ends bit for bit where the
 *   uninterrupted one ends (lazy Adam);
 * - the presets wide-deep and dlrm train under ps-async on rows (8 tables)
 *   on the generator's default set;
 * - with a table of 2^22 x 16 floats (256 MiB) over 2 ps tasks each
 *   worker's peak resident memory (its last `resource` event's
 *   rss_hwm_bytes) stays under a quarter of the table, each ps task's is
 *   about its half of the rows and their optimiser state, and the chief's
 *   (--keep-best, a checkpoint) stays under a quarter of the table; and so
 *   do they resumed from that checkpoint (the chief's --save then);
 * - --keep-best on rows: the chief holds no table, and its files are a
 *   whole chief's, resumed or not;
 * - a table no batch outgrows beside cut ones goes by slots as they do
 *   (rows = --ps-dense, bit for bit), and a chief without --keep-best
 *   evaluates on the rows each chunk pulls, to the whole chief's test
 *   figures, and streams the tables into its --save file and checkpoints
 *   (the whole chief's tensors, bit for bit; the resume above reads such
 *   checkpoints, checksum and all). */
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "proc.h"

#define COMMON "--epochs 2 --threads 1 --no-progress --log-every 0 --train-size 1100 " \
               "--val-size 100 --batch 16"
#define WIDE "8-bag2000x4-bag2000x4-bag2000x4-bag2000x4m3mean-res(dense8-relu-dense1|dense1)-bce"
#define DLRM "8-bag2000x4-bag2000x4-bag2000x4-bag2000x4m3-lead2x8relu-lead8x4relu-dot4-8-dense1-bce"

static const char *bin, *tmp;
static char err[65536];

static int launch(const char *set, const char *model, const char *strategy, int workers,
                  const char *save, const char *extra)
{
    return run_cmd(err, sizeof err,
                   "%s launch --chief --workers %d --ps 2 -- train --dataset %s/%s --model '%s' "
                   "--strategy %s " COMMON " --save %s/%s %s",
                   bin, workers, tmp, set, model, strategy, tmp, save, extra);
}

static void same_weights(const char *a, const char *b, const char *what)
{
    double d = checkpoint_max_diff(a, b);
    CHECKF(d == 0, "%s: the weights differ by up to %g", what, d);
}

static void sync_equals_dense(const char *name, const char *file, const char *model,
                              const char *opt)
{
    char extra[256], sa[64], da[64];
    snprintf(sa, sizeof sa, "%s-rows-%s.st", file, opt);
    snprintf(da, sizeof da, "%s-dense-%s.st", file, opt);
    snprintf(extra, sizeof extra, "--optimizer %s --lr 0.1 --verbose", opt);
    int rc = launch("small", model, "ps-sync", 2, sa, extra);
    CHECKF(rc == 0, "%s ps-sync rows exited %d: %s", name, rc, err);
    CHECKF(strstr(err, "debug: sparse rows: 4 table(s) of") != NULL,
           "%s: no line says the 4 tables move by rows: %s", name, err);
    CHECKF(strstr(err, "[worker 1] debug: compact tables: this worker holds 12000 of the "
                       "tables' 32000 floats") != NULL,
           "%s: no line says the worker holds its tables compact: %s", name, err);
    snprintf(extra, sizeof extra, "--optimizer %s --lr 0.1 --ps-dense", opt);
    rc = launch("small", model, "ps-sync", 2, da, extra);
    CHECKF(rc == 0, "%s ps-sync dense exited %d: %s", name, rc, err);
    same_weights(sa, da, name);
    printf("%s, ps-sync %s, 2 workers, 2 ps: rows = dense, bit for bit\n", name, opt);
}

/* The line of the test figures in a run's output (or ""). */
static void test_line(const char *out, char *line, size_t cap)
{
    const char *p = strstr(out, "Test log loss:");
    size_t n = p ? strcspn(p, "\n") : 0;
    snprintf(line, cap, "%.*s", (int)(n < cap ? n : cap - 1), p ? p : "");
}

/* Every tensor of file a (but the history, whose seconds differ) is in file
 * b with the same shape and bytes, and b holds `more` tensors besides. */
static void same_tensors(const char *a, const char *b, int more, const char *what)
{
    char pa[1200], pb[1200];
    snprintf(pa, sizeof pa, "%s/%s", tmp, a);
    snprintf(pb, sizeof pb, "%s/%s", tmp, b);
    dp_safetensors *x = NULL, *y = NULL;
    dp_err e;
    int ok = dp_safetensors_load(pa, &x, &e) == 0 && dp_safetensors_load(pb, &y, &e) == 0;
    CHECKF(ok, "%s: %s", what, e.msg);
    if (ok) {
        CHECKF(dp_safetensors_count(x) + more == dp_safetensors_count(y),
               "%s: %d tensors against %d", what, dp_safetensors_count(x),
               dp_safetensors_count(y));
        for (int i = 0; i < dp_safetensors_count(x); i++) {
            const dp_st_tensor *t = dp_safetensors_at(x, i), *u = dp_safetensors_find(y, t->name);
            if (strcmp(t->name, "loop.history") == 0)
                continue; /* its seconds are the run's own */
            size_t n = 1;
            for (int d = 0; d < t->ndim; d++)
                n *= (size_t)t->shape[d];
            CHECKF(u && u->ndim == t->ndim &&
                       memcmp(u->shape, t->shape, (size_t)t->ndim * sizeof *t->shape) == 0 &&
                       memcmp(u->data, t->data, n * sizeof(float)) == 0,
                   "%s: tensor %s differs", what, t->name);
        }
    }
    dp_safetensors_free(x);
    dp_safetensors_free(y);
}

/* A table no batch outgrows (300 rows, one id a record, C = 500) beside
 * cut ones goes to slots too (before, its rows landed at their ids among
 * slotted tables: rows and --ps-dense parted), and the chief holds no table
 * (it keeps no best weights): it evaluates each chunk on the rows it pulls,
 * to the whole-table chief's test figures (ps-sync: the run's end is the
 * same parameters), and its files take each table streamed from the
 * shards: --save has --ps-dense's weights, and a checkpoint (weights and
 * adagrad's accumulators, whole) the tensors of the whole chief's (which
 * --keep-best keeps whole; it adds the best weights), byte for byte. */
static void chief_on_rows(void)
{
    const char *m = "8-bag300x4-bag2000x4-bag2000x4-bag2000x4m3mean-res(dense8-relu-dense1|dense1)"
                    "-bce";
    char rows[256], dense[256], extra[512];
    snprintf(extra, sizeof extra, "--optimizer adagrad --lr 0.1 --verbose --checkpoint-every 40 "
             "--checkpoint-dir %s/mixed-ck", tmp);
    int rc = launch("small", m, "ps-sync", 2, "mixed-rows.st", extra);
    CHECKF(rc == 0, "rows exited %d: %s", rc, err);
    CHECKF(strstr(err, "[chief] debug: compact tables: the chief holds 11200 of the tables' "
                       "25200 floats") != NULL,
           "no line says the chief holds its tables compact: %s", err);
    test_line(err, rows, sizeof rows);
    rc = launch("small", m, "ps-sync", 2, "mixed-dense.st",
                "--optimizer adagrad --lr 0.1 --ps-dense");
    CHECKF(rc == 0, "--ps-dense exited %d: %s", rc, err);
    test_line(err, dense, sizeof dense);
    CHECKF(rows[0] && strcmp(rows, dense) == 0, "the compact chief's \"%s\", the whole one's "
           "\"%s\"", rows, dense);
    same_weights("mixed-rows.st", "mixed-dense.st", "a table of 300 rows beside cut ones");
    snprintf(extra, sizeof extra, "--optimizer adagrad --lr 0.1 --checkpoint-every 40 "
             "--checkpoint-dir %s/mixed-ck-whole --ps-dense", tmp);
    rc = launch("small", m, "ps-sync", 2, "mixed-whole.st", extra);
    CHECKF(rc == 0, "--ps-dense with checkpoints exited %d: %s", rc, err);
    same_tensors("mixed-ck/ckpt-0000000040.safetensors",
                 "mixed-ck-whole/ckpt-0000000040.safetensors", 0,
                 "the checkpoint the chief streamed against the whole chief's");
    printf("a table no batch outgrows beside cut ones: rows = dense, bit for bit; the chief on "
           "rows: %s; its --save and checkpoints streamed from the shards hold the whole "
           "chief's tensors, bit for bit\n", rows);
}

/* --keep-best on rows (3 epochs, a checkpoint barrier at each epoch's end,
 * so every evaluation sees the same weights in both runs): the chief holds
 * no table either.  A new best epoch's rows go from the shards to a file
 * of their own, read back by rows for the test figures and --save at the
 * end (the best epoch here is 2 of 3: the shards then hold epoch 3's);
 * checkpoints stream the best weights' rows from that file.  The --save
 * file is --ps-dense's (a whole chief's) byte for byte, every checkpoint
 * holds its tensors, best included; and a run killed at step 80 and
 * resumed from step 70 (best: epoch 2; the chief takes the best rows from
 * the checkpoint's 'best' by rows, each ps task its rows a piece at a
 * time, the workers no table) ends with the same --save bytes. */
static void keep_best_on_rows(void)
{
    const char *m = "8-bag300x4-bag2000x4-bag2000x4-bag2000x4m3mean-res(dense8-relu-dense1|dense1)"
                    "-bce";
    const char *o = "--optimizer adagrad --lr 0.1 --keep-best --checkpoint-every 35 --epochs 3";
    char extra[512], rows[256], dense[256];
    snprintf(extra, sizeof extra, "%s --verbose --checkpoint-dir %s/kb-rows", o, tmp);
    int rc = launch("small", m, "ps-sync", 2, "kb-rows.st", extra);
    CHECKF(rc == 0, "--keep-best on rows exited %d: %s", rc, err);
    CHECKF(strstr(err, "[chief] debug: compact tables: the chief holds 11200 of the tables' "
                       "25200 floats") != NULL,
           "--keep-best: no line says the chief holds its tables compact: %s", err);
    CHECKF(strstr(err, "Restored the weights of epoch 2") != NULL,
           "--keep-best: the best epoch is not 2 of 3, as it was: %s", err);
    test_line(err, rows, sizeof rows);
    snprintf(extra, sizeof extra, "%s --ps-dense --checkpoint-dir %s/kb-dense", o, tmp);
    rc = launch("small", m, "ps-sync", 2, "kb-dense.st", extra);
    CHECKF(rc == 0, "--keep-best --ps-dense exited %d: %s", rc, err);
    test_line(err, dense, sizeof dense);
    CHECKF(rows[0] && strcmp(rows, dense) == 0, "--keep-best: the chief on rows' \"%s\", the "
           "whole one's \"%s\"", rows, dense);
    same_tensors("kb-dense.st", "kb-rows.st", 0, "--keep-best's --save on rows against dense");
    same_tensors("kb-dense/ckpt-0000000070.safetensors", "kb-rows/ckpt-0000000070.safetensors",
                 0, "--keep-best: the checkpoint of step 70 on rows against dense");
    same_tensors("kb-dense/ckpt-0000000105.safetensors", "kb-rows/ckpt-0000000105.safetensors",
                 0, "--keep-best: the checkpoint of step 105 on rows against dense");
    snprintf(extra, sizeof extra, "%s --checkpoint-dir %s/kb-kill", o, tmp);
    rc = run_cmd(err, sizeof err,
                 "DOWNPOUR_FAULT_KILL_AT_STEP=80 %s launch --chief --workers 2 --ps 2 -- train "
                 "--dataset %s/small --model '%s' --strategy ps-sync " COMMON
                 " --save %s/kb-kill.st %s", bin, tmp, m, tmp, extra);
    CHECKF(rc != 0, "the killed run exited 0");
    snprintf(extra, sizeof extra, "%s --checkpoint-dir %s/kb-kill --resume --verbose", o, tmp);
    rc = launch("small", m, "ps-sync", 2, "kb-kill.st", extra);
    CHECKF(rc == 0 && strstr(err, "Resuming from"), "the resumed run exited %d: %s", rc, err);
    CHECKF(strstr(err, "[chief] debug: compact tables: the chief holds") &&
               strstr(err, "[ps 0] debug: compact tables: this ps task builds no table"),
           "resumed: no line says the chief and the ps tasks hold no table: %s", err);
    same_tensors("kb-rows.st", "kb-kill.st", 0, "--keep-best resumed against uninterrupted");
    /* a byte of a table changed in the newest checkpoint: the streamed
     * checksum finds it; the file is set aside, named, and the one before
     * resumes to the same bytes */
    char path[1200];
    snprintf(path, sizeof path, "%s/kb-kill/ckpt-0000000105.safetensors", tmp);
    FILE *f = fopen(path, "r+b");
    long size = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    int c = size > 0 && fseek(f, size / 4, SEEK_SET) == 0 ? fgetc(f) : EOF;
    CHECKF(c != EOF && fseek(f, size / 4, SEEK_SET) == 0 && fputc(c ^ 0x10, f) != EOF,
           "cannot change a byte of %s", path);
    if (f)
        fclose(f);
    rc = launch("small", m, "ps-sync", 2, "kb-kill.st", extra);
    CHECKF(rc == 0 && strstr(err, "ckpt-0000000105.safetensors: checksum mismatch") &&
               strstr(err, "[ps 0] Resuming from") && strstr(err, "ckpt-0000000070"),
           "a damaged checkpoint on rows: exited %d, or not set aside and the older one "
           "resumed: %s", rc, err);
    same_tensors("kb-rows.st", "kb-kill.st", 0, "--keep-best resumed past a damaged file");
    printf("--keep-best on rows: %s (the best epoch 2 of 3), the whole chief's; its --save and "
           "checkpoints hold the whole chief's tensors, bit for bit, and so does a run killed "
           "and resumed (and resumed again past a damaged checkpoint)\n", rows);
}

static void async_equals_single(void)
{
    int rc = run_cmd(err, sizeof err, "%s train --dataset %s/small --model '" WIDE "' " COMMON
                     " --optimizer sgd --lr 0.1 --save %s/single.st", bin, tmp, tmp);
    CHECKF(rc == 0, "single exited %d: %s", rc, err);
    rc = launch("small", WIDE, "ps-async", 1, "async1.st", "--optimizer sgd --lr 0.1");
    CHECKF(rc == 0, "ps-async exited %d: %s", rc, err);
    same_weights("async1.st", "single.st", "ps-async with one worker against one process");
    printf("wide-deep shape, ps-async, one worker, rows: one process's weights, bit for bit\n");
}

/* Killed at step 33 and resumed: every task of the resumed run holds its
 * tables compact as the killed run's did (each ps task reads its rows from
 * the checkpoint a piece at a time), and the run ends where the
 * uninterrupted one ends. */
static void resume_is_exact(void)
{
    const char *o = "--optimizer adam --lr 0.05 --checkpoint-every 7";
    char extra[512];
    snprintf(extra, sizeof extra, "%s --checkpoint-dir %s/ck-a", o, tmp);
    int rc = launch("small", WIDE, "ps-sync", 2, "resume-a.st", extra);
    CHECKF(rc == 0, "uninterrupted exited %d: %s", rc, err);
    snprintf(extra, sizeof extra, "%s --checkpoint-dir %s/ck-b", o, tmp);
    rc = run_cmd(err, sizeof err,
                 "DOWNPOUR_FAULT_KILL_AT_STEP=33 %s launch --chief --workers 2 --ps 2 -- train "
                 "--dataset %s/small --model '" WIDE "' --strategy ps-sync " COMMON
                 " --save %s/resume-b.st %s", bin, tmp, tmp, extra);
    CHECKF(rc != 0, "the killed run exited 0");
    snprintf(extra, sizeof extra, "%s --checkpoint-dir %s/ck-b --resume", o, tmp);
    rc = launch("small", WIDE, "ps-sync", 2, "resume-b.st", extra);
    CHECKF(rc == 0 && strstr(err, "Resuming from"), "the resumed run exited %d: %s", rc, err);
    same_weights("resume-a.st", "resume-b.st", "resumed against uninterrupted (lazy adam)");
    printf("wide-deep shape, ps-sync, lazy adam: resumed = uninterrupted, bit for bit\n");
}

static void presets(void)
{
    const char *p[] = {"wide-deep", "dlrm"};
    for (int i = 0; i < 2; i++) {
        int rc = run_cmd(err, sizeof err,
                         "%s launch --chief --workers 2 --ps 2 -- train --dataset %s/default "
                         "--model %s --strategy ps-async --epochs 1 --threads 1 --no-progress "
                         "--log-every 0 --train-size 500 --val-size 100 --batch 32 "
                         "--optimizer adagrad --lr 0.05 --verbose",
                         bin, tmp, p[i]);
        CHECKF(rc == 0 && strstr(err, "debug: sparse rows: 8 table(s) of"),
               "%s under ps-async exited %d, or not on rows: %s", p[i], rc, err);
    }
    printf("wide-deep and dlrm train under ps-async on rows (8 tables)\n");
}

/* A task's resident bytes in its last resource event: now (rss_bytes) or
 * at its peak (rss_hwm_bytes, the kernel's high-water mark: a ps task's
 * last event comes after its shard was freed). */
static double rss_of(const char *metrics, const char *task, const char *field)
{
    cJSON *r = last_event(metrics, "resource", task);
    CHECKF(r != NULL, "no resource event of %s in %s", task, metrics);
    double b = r ? json_num(r, field) : 0;
    cJSON_Delete(r);
    return b;
}

/* The peaks of a run's tasks (their last resource events). */
static void peaks(const char *metrics, double *w0, double *w1, double *p0, double *p1,
                  double *chief)
{
    *w0 = rss_of(metrics, "worker:0", "rss_hwm_bytes");
    *w1 = rss_of(metrics, "worker:1", "rss_hwm_bytes");
    *p0 = rss_of(metrics, "ps:0", "rss_hwm_bytes");
    *p1 = rss_of(metrics, "ps:1", "rss_hwm_bytes");
    *chief = rss_of(metrics, "chief:0", "rss_hwm_bytes");
}

/* Workers under a quarter of the table; each ps task about its half of the
 * rows and their accumulators (a table together) with the process's own
 * tens of MiB: a ps task that built the whole model too held two tables;
 * the chief under a quarter of the table. */
static void bounded(const char *metrics, const char *run, double table, double *got)
{
    double w0, w1, p0, p1, chief;
    peaks(metrics, &w0, &w1, &p0, &p1, &chief);
    CHECKF(w0 > 0 && w0 < table / 4 && w1 > 0 && w1 < table / 4,
           "%s: workers resident at most %.0f and %.0f MiB, a table of %.0f MiB", run,
           w0 / 1048576, w1 / 1048576, table / 1048576);
    for (int i = 0; i < 2; i++) {
        double p = i ? p1 : p0;
        CHECKF(p > 0.95 * table && p < 1.5 * table,
               "%s: ps:%d resident at most %.0f MiB; its half of the rows and their "
               "accumulators are %.0f MiB", run, i, p / 1048576, table / 1048576);
    }
    CHECKF(chief > 0 && chief < table / 4,
           "%s: the chief resident at most %.0f MiB, a table of %.0f MiB", run, chief / 1048576,
           table / 1048576);
    double v[5] = {w0, w1, p0, p1, chief};
    memcpy(got, v, sizeof v);
}

/* A table of 2^22 x 16 floats (256 MiB) over 2 ps tasks: a worker holds
 * the rows of the batch in flight (500 x 16 floats), so its resident memory
 * stays far below the table; each ps task holds its half of the rows and
 * their adagrad accumulators (a table's worth together) and no whole table
 * (it drew its rows alone, dp_model_init_rows: before, each built the whole
 * model as well, 1.5 tables more); the chief holds none either, with
 * --keep-best: it evaluates each chunk on the rows it pulls, writes the
 * best epoch's rows from the shards to a file of their own and streams the
 * table into its checkpoint (before, it held the table whole, 548 MiB, and
 * with --keep-best 1,317 MiB).  Then --resume from that checkpoint (at the
 * run's end: nothing to train): each ps task reads its rows and
 * accumulators from the file a piece at a time, the chief the best rows it
 * evaluates and streams into its --save file, the workers no table
 * (before, every task read the 768 MiB file whole and built the whole
 * model: 2,059 MiB each). */
static void task_memory(void)
{
    /* Its verdicts are the plain allocator's peaks; under ASan (whose
     * allocator adds its own) the streaming and the compact chief are
     * checked on small tables by chief_on_rows, keep_best_on_rows and
     * test_safetensors. */
    if (SANITIZED)
        return;
    char metrics[1200], resumed[1200];
    snprintf(metrics, sizeof metrics, "%s/big.jsonl", tmp);
    snprintf(resumed, sizeof resumed, "%s/big-resumed.jsonl", tmp);
    const char *run = "%s launch --chief --workers 2 --ps 2 -- train --dataset %s/big "
                      "--model 3-bag4194304x16-dense1-bce --strategy ps-async --epochs 1 "
                      "--threads 1 --no-progress --log-every 0 --train-size 500 --val-size 100 "
                      "--batch 32 --optimizer adagrad --lr 0.05 --keep-best --checkpoint-dir "
                      "%s/big-ck --metrics %s %s";
    int rc = run_cmd(err, sizeof err, run, bin, tmp, tmp, metrics, "");
    CHECKF(rc == 0, "the 2^22 x 16 table exited %d: %s", rc, err);
    /* resumed, --save takes the best rows from the checkpoint's 'best' */
    char save[1200];
    snprintf(save, sizeof save, "--resume --save %s/big.st", tmp);
    rc = run_cmd(err, sizeof err, run, bin, tmp, tmp, resumed, save);
    CHECKF(rc == 0 && strstr(err, "[ps 0] Resuming from"), "the 2^22 x 16 table resumed "
           "exited %d: %s", rc, err);
    char path[1200];
    snprintf(path, sizeof path, "%s/big.st", tmp);
    struct stat sb;
    CHECKF(stat(path, &sb) == 0 && (double)sb.st_size > 4194304.0 * 16 * 4,
           "--save wrote no file holding the table");
    unlink(path); /* 256 MiB */
    rc = run_cmd(NULL, 0, "rm -rf '%s/big-ck'", tmp); /* 768 MiB */
    double table = 4194304.0 * 16 * 4, a[5], b[5];
    bounded(metrics, "--keep-best", table, a);
    bounded(resumed, "--resume", table, b);
    printf("a table of 2^22 x 16 floats (%.0f MiB) over 2 ps tasks, adagrad, --keep-best: at "
           "their peaks workers %.1f and %.1f MiB, ps tasks %.0f and %.0f MiB (half the rows "
           "and their accumulators: %.0f MiB), the chief %.1f MiB; resumed: workers %.1f and "
           "%.1f MiB, ps tasks %.0f and %.0f MiB, the chief %.1f MiB\n",
           table / 1048576, a[0] / 1048576, a[1] / 1048576, a[2] / 1048576, a[3] / 1048576,
           table / 1048576, a[4] / 1048576, b[0] / 1048576, b[1] / 1048576, b[2] / 1048576,
           b[3] / 1048576, b[4] / 1048576);
}

static void synth(const char *set, const char *args)
{
    int rc = run_cmd(err, sizeof err, "%s data synth ctr --to %s/%s %s", bin, tmp, set, args);
    CHECKF(rc == 0, "synth ctr %s exited %d: %s", set, rc, err);
    REQUIRE(rc == 0);
}

int main(void)
{
    bin = test_bin();
    tmp = test_tmp();
    synth("small", "--rows 1200 --test-rows 200 --categorical 4 --ids 2000 --numeric 2 "
                   "--multi 1 --places 3 --seed 5");
    synth("default", "--rows 600 --test-rows 100");
    synth("big", "--rows 600 --test-rows 100 --categorical 1 --ids 4194304 --numeric 2");
    sync_equals_dense("wide-deep shape", "wide", WIDE, "adagrad");
    sync_equals_dense("dlrm shape", "dlrm", DLRM, "adagrad");
    chief_on_rows();
    keep_best_on_rows();
    async_equals_single();
    resume_is_exact();
    presets();
    task_memory();
    return CHECK_DONE();
}
