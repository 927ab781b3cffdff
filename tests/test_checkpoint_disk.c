/* Nothing lost to a checkpoint that cannot be written (docs/checkpoints.md,
 * "A checkpoint that cannot be written"), on small tmpfs mounts:
 *   a) one process whose checkpoint directory holds not even one checkpoint
 *      trains to the end, warns with the path and ENOSPC's text, writes a
 *      `fault` event, evaluates, writes --save (on a healthy disk) and exits 3;
 *   b) with --checkpoint-every on a disk that holds two, the run reaches the
 *      end, the two load, and --resume goes on from the newer, to the same
 *      weights as the run that was not interrupted;
 *   c) a launched ps-async cluster on a disk too small finishes, saves its
 *      model, and launch exits 3; so does allreduce, where worker 0 writes.
 * And d) a checkpoint's temporary file left by a killed write is removed by
 * the run that resumes from that directory, and nothing else is.
 * The mounts need root: without, a), b) and c) are skipped (77 when d)
 * passed).  They are made in a mount namespace of this test's own where it
 * can make one (unshare), so none outlives it, and unmounted at the end. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* unshare */
#endif
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "downpour/checkpoint.h"
#include "proc.h"

/* 30 steps; sgd, so a checkpoint is the weights alone: about 205 KB. */
#define SMALL "--dataset mnist --model 784-64-10 --train-size 3000 --val-size 500 " \
              "--test-size 1000 --batch 100 --optimizer sgd --lr 0.1 --log-every 0 "  \
              "--no-progress --threads 1"

static const char *bin, *tmp;
static char err[65536];
static char mounts[4][1200];
static int n_mounts;

static void unmount_all(void)
{
    for (int i = 0; i < n_mounts; i++)
        if (umount2(mounts[i], MNT_DETACH) != 0)
            fprintf(stderr, "cannot unmount %s: %s\n", mounts[i], strerror(errno));
    n_mounts = 0;
}

/* A tmpfs of `size` on tmp/name: 0, or -1 with the reason printed. */
static int mount_small(const char *name, const char *size)
{
    char *dir = mounts[n_mounts], opts[64];
    snprintf(dir, sizeof mounts[0], "%s/%s", tmp, name);
    snprintf(opts, sizeof opts, "size=%s", size);
    mkdir(dir, 0755);
    if (mount("tmpfs", dir, "tmpfs", 0, opts) != 0) {
        fprintf(stderr, "cannot mount a tmpfs of %s on %s: %s\n", size, dir, strerror(errno));
        return -1;
    }
    n_mounts++;
    return 0;
}

/* Mounts from here on stay in this process and its children. */
static void private_mounts(void)
{
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        fprintf(stderr, "no mount namespace of our own (%s): the mounts are undone at the "
                "end instead\n", strerror(errno));
    atexit(unmount_all);
}

/* Names in dir other than . and .. (one line each into out), and how many. */
static int list_dir(const char *dir, char *out, size_t cap)
{
    DIR *d = opendir(dir);
    int n = 0;
    size_t len = 0;
    out[0] = '\0';
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        n++;
        if (len < cap)
            len += (size_t)snprintf(out + len, cap - len, "%s\n", e->d_name);
    }
    if (d)
        closedir(d);
    return n;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* --save's file reads back as safetensors. */
static int loads(const char *path)
{
    dp_safetensors *f = NULL;
    dp_err e;
    int ok = dp_safetensors_load(path, &f, &e) == 0;
    dp_safetensors_free(f);
    return ok;
}

typedef struct faults {
    int n;
    long steps[8];
    int has_enospc;
} faults;

static void on_fault(const cJSON *j, void *ctx)
{
    faults *f = ctx;
    if (strcmp(json_str(j, "what"), "checkpoint not written") != 0)
        return;
    if (f->n < 8)
        f->steps[f->n] = (long)json_num(j, "step");
    f->n++;
    f->has_enospc |= strstr(json_str(j, "error"), strerror(ENOSPC)) != NULL;
}

static faults ckpt_faults(const char *metrics)
{
    faults f = {0};
    for_each_event(metrics, "fault", NULL, on_fault, &f);
    return f;
}

/* a) Not even one checkpoint fits. */
static void full_disk_single(void)
{
    char metrics[1200], save[1200], dir[1200], names[4096];
    snprintf(metrics, sizeof metrics, "%s/a.jsonl", tmp);
    snprintf(save, sizeof save, "%s/a.safetensors", tmp);
    snprintf(dir, sizeof dir, "%s/a-disk/ck", tmp);
    int rc = run_cmd(err, sizeof err, "%s train " SMALL " --epochs 1 --checkpoint-every 10 "
                     "--checkpoint-dir %s --save %s --metrics %s", bin, dir, save, metrics);
    CHECKF(rc == 3, "a) a run whose checkpoints do not fit exited %d, not 3: %s", rc, err);
    char want[1400];
    snprintf(want, sizeof want, "%s/ckpt-0000000030.safetensors", dir);
    CHECKF(strstr(err, "warning: fault: checkpoint of step 30 not written") && strstr(err, want) &&
           strstr(err, strerror(ENOSPC)),
           "a) no warning naming %s and '%s': %s", want, strerror(ENOSPC), err);
    faults f = ckpt_faults(metrics);
    CHECKF(f.n == 3 && f.steps[0] == 10 && f.steps[2] == 30 && f.has_enospc,
           "a) expected 3 fault events (steps 10, 20, 30) with the ENOSPC text, got %d", f.n);
    cJSON *done = last_event(metrics, "done", NULL);
    CHECKF(done && json_num(done, "test_accuracy") > 0.5 &&
           json_num(done, "checkpoints_missed") == 3,
           "a) no done event with a test accuracy above 0.5 and checkpoints_missed 3");
    cJSON_Delete(done);
    CHECKF(loads(save), "a) --save %s was not written", save);
    CHECKF(list_dir(dir, names, sizeof names) == 0, "a) files left in %s:\n%s", dir, names);
}

/* b) Two fit: the third and later fail, the two stay and resume. */
static void two_fit(void)
{
    char metrics[1200], dir[1200], names[4096], path[1400];
    snprintf(metrics, sizeof metrics, "%s/b.jsonl", tmp);
    snprintf(dir, sizeof dir, "%s/b-disk/ck", tmp);
    int rc = run_cmd(err, sizeof err, "%s train " SMALL " --epochs 1 --checkpoint-every 10 "
                     "--checkpoint-dir %s --save %s/b.safetensors --metrics %s",
                     bin, dir, tmp, metrics);
    CHECKF(rc == 3, "b) the run exited %d, not 3: %s", rc, err);
    faults f = ckpt_faults(metrics);
    CHECKF(f.n == 1 && f.steps[0] == 30, "b) expected one fault event, at step 30; got %d", f.n);
    int n = list_dir(dir, names, sizeof names);
    CHECKF(n == 2 && strstr(names, "ckpt-0000000010.safetensors\n") &&
           strstr(names, "ckpt-0000000020.safetensors\n"),
           "b) expected the checkpoints of steps 10 and 20 alone in %s:\n%s", dir, names);
    for (int step = 10; step <= 20; step += 10) {
        dp_checkpoint_path(path, sizeof path, dir, step);
        rc = run_cmd(err, sizeof err, "%s eval --checkpoint %s --dataset mnist", bin, path);
        CHECKF(rc == 0, "b) %s does not load: %s", path, err);
    }
    /* The resumed run's final checkpoint does not fit either: exit 3 again. */
    rc = run_cmd(err, sizeof err, "%s train " SMALL " --epochs 1 --checkpoint-every 10 "
                 "--checkpoint-dir %s --save %s/b-resumed.safetensors --resume", bin, dir, tmp);
    CHECKF(rc == 3 && strstr(err, "ckpt-0000000020.safetensors (step 20)"),
           "b) --resume exited %d, or not from step 20: %s", rc, err);
    CHECKF(checkpoint_max_diff("b.safetensors", "b-resumed.safetensors") == 0,
           "b) the resumed run's weights differ from the first run's");
}

/* c) A launched cluster whose writer (the chief, or worker 0 without one)
 * finds no room for any checkpoint. */
static void full_disk_cluster(const char *name, const char *launch, const char *strategy,
                              const char *writer)
{
    char metrics[1200], save[1200], dir[1200], names[4096];
    snprintf(metrics, sizeof metrics, "%s/%s.jsonl", tmp, name);
    snprintf(save, sizeof save, "%s/%s.safetensors", tmp, name);
    snprintf(dir, sizeof dir, "%s/%s-disk/ck", tmp, name);
    int rc = run_cmd(err, sizeof err, "%s launch %s -- train --strategy %s " SMALL " --epochs 1 "
                     "--checkpoint-every 10 --checkpoint-dir %s --save %s --metrics %s", bin,
                     launch, strategy, dir, save, metrics);
    CHECKF(rc == 3, "c) %s: launch exited %d, not 3: %s", strategy, rc, err);
    char said[128];
    snprintf(said, sizeof said, "%s (pid", writer);
    CHECKF(strstr(err, said) && strstr(err, "finished, but some checkpoint(s) could not be "
                                            "written"),
           "c) %s: launch does not say %s's checkpoints were not written: %s", strategy, writer,
           err);
    CHECKF(!strstr(err, "restarting") && !strstr(err, "stopping the other"),
           "c) %s: launch treated exit 3 as a fault: %s", strategy, err);
    faults f = ckpt_faults(metrics);
    CHECKF(f.n >= 1 && f.has_enospc, "c) %s: no fault event for the checkpoints not written",
           strategy);
    CHECKF(done_accuracy(metrics) > 0.5, "c) %s: no test accuracy above 0.5 (%g)", strategy,
           done_accuracy(metrics));
    CHECKF(loads(save), "c) %s: --save %s was not written", strategy, save);
    CHECKF(list_dir(dir, names, sizeof names) == 0, "c) %s: files left in %s:\n%s", strategy, dir,
           names);
}

/* d) A stale temporary goes, and only it. */
static void stale_temps(void)
{
    char dir[1200], path[4096], names[4096];
    snprintf(dir, sizeof dir, "%s/d-ck", tmp);
    int rc = run_cmd(err, sizeof err, "%s train " SMALL " --epochs 1 --checkpoint-every 10 "
                     "--checkpoint-dir %s", bin, dir);
    CHECKF(rc == 0, "d) the first run exited %d: %s", rc, err);
    /* a pid no process can have */
    long dead = 4194304;
    FILE *pm = fopen("/proc/sys/kernel/pid_max", "r");
    if (pm) {
        if (fscanf(pm, "%ld", &dead) != 1)
            dead = 4194304;
        fclose(pm);
    }
    dead++;
    /* and a chief on rows' --keep-best file (docs/checkpoints.md, "Reading
     * in pieces"), or its temporary, whose writer died before unlinking it */
    char stale[3][256], kept[7][256];
    snprintf(stale[0], sizeof stale[0], "ckpt-0000000040.safetensors.tmp.%ld.0", dead);
    snprintf(stale[1], sizeof stale[1], ".best-%ld.safetensors", dead);
    snprintf(stale[2], sizeof stale[2], ".best-%ld.safetensors.tmp.%ld.3", dead, dead);
    snprintf(kept[0], sizeof kept[0], "ckpt-0000000040.safetensors.tmp.%ld.0", (long)getpid());
    snprintf(kept[1], sizeof kept[1], "ckpt-0000000040.safetensors.tmp.%ld.x", dead);
    snprintf(kept[2], sizeof kept[2], "ckpt-40.safetensors.tmp.%ld.0", dead);
    snprintf(kept[3], sizeof kept[3], "notes.tmp.%ld.0", dead);
    snprintf(kept[4], sizeof kept[4], "ckpt-0000000040.safetensors.tmp.%ld.0.bak", dead);
    snprintf(kept[5], sizeof kept[5], "ckpt-0000000040.safetensors.tmp");
    snprintf(kept[6], sizeof kept[6], ".best-%ld.safetensors.bak", dead);
    for (int i = -3; i < 7; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, i < 0 ? stale[i + 3] : kept[i]);
        FILE *f = fopen(path, "w");
        REQUIRE(f != NULL);
        fputs("half a checkpoint", f);
        fclose(f);
    }
    rc = run_cmd(err, sizeof err, "%s train " SMALL " --epochs 2 --checkpoint-every 10 "
                 "--checkpoint-dir %s --resume", bin, dir);
    CHECKF(rc == 0 && strstr(err, "ckpt-0000000030.safetensors (step 30)"),
           "d) --resume exited %d, or not from step 30: %s", rc, err);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "Removed %s/%s,", dir, stale[i]);
        CHECKF(strstr(err, path) != NULL, "d) the run does not say it removed %s: %s",
               stale[i], err);
        snprintf(path, sizeof path, "%s/%s", dir, stale[i]);
        CHECKF(!exists(path), "d) %s is still there", stale[i]);
    }
    for (int i = 0; i < 7; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, kept[i]);
        CHECKF(exists(path), "d) %s was removed, and is not a stale checkpoint temporary",
               kept[i]);
    }
    list_dir(dir, names, sizeof names);
    CHECKF(strstr(names, "ckpt-0000000060.safetensors\n") != NULL,
           "d) the resumed run wrote no final checkpoint:\n%s", names);
}

int main(void)
{
    bin = test_bin();
    tmp = test_tmp();
    REQUIRE(bin && tmp);
    require_mnist();
    stale_temps();
    private_mounts();
    /* 100k holds no 205 KB checkpoint; 450k holds two and not a third */
    if (mount_small("a-disk", "100k") < 0 || mount_small("b-disk", "450k") < 0 ||
        mount_small("c-disk", "100k") < 0 || mount_small("r-disk", "100k") < 0) {
        unmount_all();
        if (check_failures)
            return CHECK_DONE();
        fprintf(stderr, "skipping the full-disk cases: mounting a tmpfs needs root\n");
        return 77;
    }
    full_disk_single();
    two_fit();
    full_disk_cluster("c", "--chief --workers 2 --ps 1", "ps-async", "chief:0");
    full_disk_cluster("r", "--workers 2", "allreduce", "worker:0");
    unmount_all();
    return CHECK_DONE();
}
