/* The MPI transport, end to end through `mpirun ... downpour train
 * --transport mpi` on MNIST (a test program of its own cannot run under
 * mpirun in CTest's one-binary-per-test scheme, so every check goes through
 * the downpour program):
 * - allreduce on 3 ranks, ps-async and ps-sync with --ps 1 on 4 ranks: each
 *   exits 0 and the chief's metrics end with a done event;
 * - the same run over TCP (downpour launch) and over MPI gives the same
 *   parameters: within 1e-5 for allreduce (MPI_Allreduce may sum in another
 *   order than our ring), within 1e-6 for ps-sync (no reduction-order change)
 *   (plain build: arithmetic, where ASan adds nothing);
 * - every MPI replica ends bitwise identical (each rank writes its own
 *   metrics file: the chief the given path, the others path.worker-<k>);
 * - the same with MPI calls serialised (against the MPI run) (DOWNPOUR_MPI_SERIALIZED=1, as with a
 *   library that only grants MPI_THREAD_SERIALIZED) (plain build);
 * - a rank killed mid-run ends the job (that is MPI's rule), the checkpoint
 *   written before is intact, and the same job with --resume goes on from
 *   it to the end (docs/mpi.md, "Failure semantics") (plain build);
 * - a nonsense job (--ps 5 on 3 ranks) is refused with a clear message.
 * Skipped (77) when downpour was built without MPI or mpirun is missing. */
#include <math.h>
#include <unistd.h>

#include "downpour/mpi.h"
#include "proc.h"

static char err[65536];

/* What works on one machine, as root, in a container: shared memory only
 * (no TCP BTL probing the interfaces), no cross-memory attach (CMA needs
 * ptrace rights a container may not give), more ranks than cores. */
#define MPIRUN "mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader " \
               "--mca btl_vader_single_copy_mechanism none"

static const char *common = "--dataset mnist --train-size 3200 --val-size 500 --test-size 2000 --epochs 1 "
                            "--threads 1 --no-progress --log-every 0 --optimizer sgd --lr 0.1 "
                            "--batch 64";

/* The run went through and its chief wrote the done event. */
static void check_done(const char *what, int rc, const char *metrics)
{
    CHECKF(rc == 0, "%s exited %d: %s", what, rc, err);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", test_tmp(), metrics);
    cJSON *done = last_event(path, "done", NULL);
    CHECKF(done != NULL, "%s: no done event in %s", what, metrics);
    if (done)
        fprintf(stderr, "%s: test accuracy %.4f\n", what, json_num(done, "test_accuracy"));
    cJSON_Delete(done);
}

/* Under MPI the chief (rank 0) writes the --metrics path itself and every
 * other rank writes <path>.worker-<k>; every replica event agrees. */
static void check_replicas(const char *prefix, int ranks)
{
    long v[3] = {0, 0, 0};
    for (int r = 0; r < ranks; r++) {
        char path[1200];
        if (r == 0)
            snprintf(path, sizeof path, "%s/%s", test_tmp(), prefix);
        else
            snprintf(path, sizeof path, "%s/%s.worker-%d", test_tmp(), prefix, r - 1);
        CHECKF(for_each_event(path, "replica", NULL, tally_replica, v) == 1,
               "%s: not exactly one replica event", path);
    }
    CHECKF(v[0] == ranks && v[2] == 0, "%s: %ld replica checksums, %s", prefix, v[0],
           v[2] ? "not all equal" : "all equal");
}

/* ASan builds: Open MPI's own allocations at exit are not ours to report.
 * Keep its components loaded (so their frames resolve), unwind slowly (its
 * libraries have no frame pointers) and suppress by library. */
static void quiet_mpi_leaks(void)
{
    char supp[1200], opts[1600];
    snprintf(supp, sizeof supp, "%s/lsan-mpi.supp", test_tmp());
    FILE *f = fopen(supp, "w");
    if (!f)
        return;
    fputs("leak:libmpi.so\nleak:libopen-pal.so\nleak:libopen-rte.so\nleak:libhwloc.so\n"
          "leak:libpmix.so\nleak:libevent\nleak:mca_\nleak:ld-linux\n", f);
    fclose(f);
    snprintf(opts, sizeof opts, "suppressions=%s:print_suppressions=0", supp);
    setenv("LSAN_OPTIONS", opts, 1);
    const char *asan = getenv("ASAN_OPTIONS");
    snprintf(opts, sizeof opts, "%s%sfast_unwind_on_malloc=0", asan ? asan : "",
             asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    setenv("OMPI_MCA_mca_base_component_disable_dlclose", "1", 1);
}

/* The serialised path and a lost rank's checkpoint and resume: their
 * verdicts are results (bits, exit codes, the step resumed from), the plain
 * build's; ASan checks the transport's memory on the other runs. */
static void serialised_and_resume(const char *bin, const char *tmp)
{
    int rc;
    double d;
    /* The serialised path (a library without MPI_THREAD_MULTIPLE) gives the same. */
    rc = run_cmd(err, sizeof err,
                 "DOWNPOUR_MPI_SERIALIZED=1 " MPIRUN " -np 4 %s train --transport mpi "
                 "--ps 1 --strategy ps-sync %s --metrics %s/ser --save %s/sync-ser.st",
                 bin, common, tmp, tmp);
    check_done("mpi ps-sync, MPI_THREAD_SERIALIZED", rc, "ser");
    CHECKF(strstr(err, "SERIALIZED") != NULL, "the serialised mode was not used: %s", err);
    d = checkpoint_max_diff("sync-mpi.st", "sync-ser.st");
    CHECKF(d <= 1e-6, "ps-sync over MPI and serialised MPI differ by %g", d);

    /* A rank killed at step 25 (of 51) ends the job; --resume continues
     * from the checkpoint at step 20, as `srun --requeue` would. */
    const char *ckpt = "--epochs 3 --checkpoint-every 10";
    rc = run_cmd(err, sizeof err,
                 MPIRUN " -np 2 %s train --transport mpi --strategy allreduce %s %s "
                        "--checkpoint-dir %s/ck : -np 1 env DOWNPOUR_FAULT_KILL_AT_STEP=25 %s "
                        "train --transport mpi --strategy allreduce %s %s --checkpoint-dir %s/ck",
                 bin, common, ckpt, tmp, bin, common, ckpt, tmp);
    CHECKF(rc != 0, "the MPI job with a rank killed exited 0: %s", err);
    rc = run_cmd(err, sizeof err,
                 MPIRUN " -np 3 %s train --transport mpi --strategy allreduce %s %s "
                        "--checkpoint-dir %s/ck --resume --metrics %s/resumed",
                 bin, common, ckpt, tmp, tmp);
    check_done("mpi allreduce resumed after a lost rank", rc, "resumed");
    CHECKF(strstr(err, "ckpt-0000000020") != NULL && strstr(err, "Resuming from") != NULL,
           "the job did not resume from the checkpoint at step 20: %s", err);
}

int main(void)
{
    REQUIRE(test_bin() && test_tmp());
    if (!dp_mpi_available()) {
        fprintf(stderr, "skipping: downpour was built without MPI\n");
        return 77;
    }
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        fprintf(stderr, "skipping: no mpirun (apt-get install openmpi-bin)\n");
        return 77;
    }
    require_mnist();
    quiet_mpi_leaks();
    const char *bin = test_bin(), *tmp = test_tmp();
    int rc;

    /* All-reduce on 3 ranks; each rank its own metrics file. */
    rc = run_cmd(err, sizeof err,
                 MPIRUN " -np 3 %s train --transport mpi --strategy allreduce %s "
                        "--metrics %s/ar --save %s/ar-mpi.st",
                 bin, common, tmp, tmp);
    check_done("mpi allreduce", rc, "ar");
    CHECKF(strstr(err, "the transport's collective") != NULL,
           "allreduce did not use MPI_Allreduce: %s", err);
    check_replicas("ar", 3);

    /* The same over TCP (arithmetic: the plain build; ASan checks the MPI
     * transport's memory, and the TCP runs are other tests' under ASan). */
    double d;
    if (!SANITIZED) {
        rc = run_cmd(err, sizeof err,
                     "%s launch --chief --workers 2 -- train --strategy allreduce %s "
                     "--metrics %s/ar-tcp.jsonl --save %s/ar-tcp.st",
                     bin, common, tmp, tmp);
        check_done("tcp allreduce", rc, "ar-tcp.jsonl");
        d = checkpoint_max_diff("ar-tcp.st", "ar-mpi.st");
        fprintf(stderr, "allreduce, TCP ring vs MPI_Allreduce: max |diff| %.3g\n", d);
        CHECKF(d < 1e-5, "allreduce over TCP and MPI differ by %g", d);
    }

    /* Parameter servers on 4 ranks: chief, ps, 2 workers. */
    rc = run_cmd(err, sizeof err,
                 MPIRUN " -np 4 %s train --transport mpi --ps 1 --strategy ps-async "
                        "%s --metrics %s/async",
                 bin, common, tmp);
    check_done("mpi ps-async", rc, "async");
    rc = run_cmd(err, sizeof err,
                 MPIRUN " -np 4 %s train --transport mpi --ps 1 --strategy ps-sync "
                        "%s --metrics %s/sync --save %s/sync-mpi.st",
                 bin, common, tmp, tmp);
    check_done("mpi ps-sync", rc, "sync");
    if (!SANITIZED) {
        rc = run_cmd(err, sizeof err,
                     "%s launch --chief --workers 2 --ps 1 -- train --strategy ps-sync %s "
                     "--metrics %s/sync-tcp.jsonl --save %s/sync-tcp.st",
                     bin, common, tmp, tmp);
        check_done("tcp ps-sync", rc, "sync-tcp.jsonl");
        d = checkpoint_max_diff("sync-tcp.st", "sync-mpi.st");
        fprintf(stderr, "ps-sync, TCP vs MPI: max |diff| %.3g\n", d);
        CHECKF(d <= 1e-6, "ps-sync over TCP and MPI differ by %g", d);
    }

    if (!SANITIZED)
        serialised_and_resume(bin, tmp);

    /* Nonsense is refused, clearly, and the job ends. */
    rc = run_cmd(err, sizeof err,
                 MPIRUN " -np 3 %s train --transport mpi --ps 5 --strategy ps-async %s", bin,
                 common);
    CHECKF(rc != 0, "--ps 5 on 3 ranks was accepted");
    CHECKF(strstr(err, "--ps 5 leaves no worker in an MPI job of 3 ranks") != NULL,
           "unclear refusal: %s", err);
    return CHECK_DONE();
}
