/* All-reduce bandwidth under MPI, run with mpirun (2 or 4 ranks):
 *
 *   mpirun --allow-run-as-root --oversubscribe -np 4 build/bench/bench_allreduce_mpi [max MiB (64)]
 *
 * For float buffers of 4 KiB to 64 MiB it measures
 *   - MPI_Allreduce (sum, in place) on MPI_COMM_WORLD: algbw = bytes / time and
 *     busbw = algbw * 2(n-1)/n, as nccl-tests defines them;
 *   - the same through downpour's MPI transport (dp_transport_allreduce, what
 *     --strategy allreduce calls), to show the transport adds nothing;
 *   - the raw point-to-point throughput between ranks 0 and 1 in the same
 *     program: an MPI_Send/MPI_Recv ping-pong, bytes one way / half the round
 *     trip;
 * and prints busbw as a share of raw at 16 MiB (the target: 80 %).
 * Times are the slowest rank's, the median of the repetitions. */
#include <stdio.h>
#include <stdlib.h>

#ifndef DOWNPOUR_HAVE_MPI
int main(void)
{
    fprintf(stderr, "bench_allreduce_mpi: this downpour was built without MPI "
                    "(apt-get install libopenmpi-dev, cmake -DDOWNPOUR_MPI=ON)\n");
    return 0;
}
#else

#include <mpi.h>
#include <string.h>

#include "bench.h"
#include "downpour/mpi.h"

#define REPS 5

/* Median over REPS of the slowest rank's seconds per call. */
static double median(double *t) { return bench_median(t, REPS); }

static double slowest(double secs)
{
    double m;
    MPI_Allreduce(&secs, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

int main(int argc, char **argv)
{
    dp_err err;
    int rank, n;
    if (dp_mpi_init(&rank, &n, &err) < 0) {
        fprintf(stderr, "bench_allreduce_mpi: %s\n", err.msg);
        return 1;
    }
    long max_mib = argc > 1 ? strtol(argv[1], NULL, 10) : 64;
    if (max_mib < 1)
        max_mib = 64;
    size_t max_bytes = (size_t)max_mib << 20;
    int *world_of = malloc((size_t)n * sizeof *world_of);
    float *buf = malloc(max_bytes), *pong = malloc(max_bytes);
    if (!world_of || !buf || !pong) {
        fprintf(stderr, "bench_allreduce_mpi: out of memory\n");
        return 1;
    }
    for (int i = 0; i < n; i++)
        world_of[i] = i;
    dp_mpi_config mc;
    dp_mpi_config_init(&mc);
    mc.rank = rank;
    mc.n_ranks = n;
    mc.world_rank_of = world_of;
    dp_transport *t = NULL;
    if (dp_mpi_open(&mc, &t, &err) < 0) {
        fprintf(stderr, "bench_allreduce_mpi: %s\n", err.msg);
        return 1;
    }
    if (rank == 0) {
        printf("MPI_Allreduce, %d ranks (busbw = algbw * 2(n-1)/n); raw = MPI_Send/Recv ping-pong "
               "rank 0 <-> 1\n", n);
        printf("%10s %12s %12s %14s %12s %8s\n", "bytes", "algbw MB/s", "busbw MB/s",
               "dp busbw MB/s", "raw MB/s", "busbw/raw");
    }
    double share16 = -1;
    for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
        int count = (int)(bytes / sizeof(float));
        int iters = (int)((256u << 20) / bytes);
        iters = iters < 3 ? 3 : iters > 500 ? 500 : iters;

        /* Correctness once: every rank adds rank+1. */
        for (int i = 0; i < count; i++)
            buf[i] = (float)(rank + 1);
        MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        float want = (float)n * (n + 1) / 2;
        if (buf[0] != want || buf[count - 1] != want) {
            fprintf(stderr, "rank %d: all-reduce gave %g, expected %g\n", rank, buf[0], want);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }

        double ta[REPS], td[REPS], tr[REPS];
        for (int r = 0; r < REPS; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < iters; i++)
                MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            ta[r] = slowest((MPI_Wtime() - t0) / iters);

            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
            for (int i = 0; i < iters; i++)
                if (dp_transport_allreduce(t, buf, (size_t)count, world_of, n, &err) < 0) {
                    fprintf(stderr, "rank %d: %s\n", rank, err.msg);
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
            td[r] = slowest((MPI_Wtime() - t0) / iters);

            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
            for (int i = 0; i < iters && rank < 2; i++) {
                if (rank == 0) {
                    MPI_Send(buf, count, MPI_FLOAT, 1, 7, MPI_COMM_WORLD);
                    MPI_Recv(pong, count, MPI_FLOAT, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(pong, count, MPI_FLOAT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(buf, count, MPI_FLOAT, 0, 7, MPI_COMM_WORLD);
                }
            }
            tr[r] = slowest((MPI_Wtime() - t0) / iters / 2); /* one way */
        }
        double a = median(ta), d = median(td), w = median(tr);
        double algbw = bytes / a / 1e6, busbw = algbw * 2.0 * (n - 1) / n;
        double dbus = bytes / d / 1e6 * 2.0 * (n - 1) / n, raw = bytes / w / 1e6;
        if (bytes == (16u << 20))
            share16 = busbw / raw;
        if (rank == 0)
            printf("%10zu %12.0f %12.0f %14.0f %12.0f %7.0f%%\n", bytes, algbw, busbw, dbus, raw,
                   100 * busbw / raw);
    }
    if (rank == 0 && share16 >= 0)
        printf("at 16 MiB: busbw %.0f %% of raw point-to-point (target 80 %%): %s\n",
               100 * share16, share16 >= 0.8 ? "met" : "NOT met");
    dp_transport_close(t);
    free(world_of);
    free(buf);
    free(pong);
    dp_mpi_finalize();
    return 0;
}
#endif
