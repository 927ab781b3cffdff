/* The MPI transport: the same typed frames as TCP (transport.h), carried by
 * MPI point-to-point messages, plus MPI_Allreduce as the all-reduce fast
 * path.  For jobs started by mpirun or Slurm's srun; rank-to-role mapping,
 * failure semantics and examples: docs/mpi.md.
 *
 * Ranks given to and returned by the transport are CLUSTER ranks (chief,
 * workers, ps; see cluster.h); world_rank_of maps them to MPI world ranks.
 *
 * Built without MPI (cmake -DDOWNPOUR_MPI=OFF, or no MPI library found) every
 * call below falls back: dp_mpi_available says 0 and the others fail with a
 * message saying how to get MPI. */
#ifndef DOWNPOUR_MPI_H
#define DOWNPOUR_MPI_H

#include <stdint.h>

#include "downpour/status.h"
#include "downpour/transport.h"

typedef struct dp_mpi_config {
    int rank;                     /* cluster rank of this process */
    int n_ranks;                  /* cluster size (at most the MPI world size) */
    const int *world_rank_of;     /* n_ranks entries: cluster rank -> MPI world rank */
    const char *const *names;     /* optional n_ranks names for logs ("worker:2") */
    double late_log;              /* s between "waiting for" lines (5) */
    uint64_t max_frame_bytes;     /* largest payload accepted (DP_FRAME_MAX_DEFAULT, 1 GiB;
                                     at most INT_MAX, an MPI count) */
} dp_mpi_config;

/* Defaults as above, every pointer NULL.  Always start from this. */
void dp_mpi_config_init(dp_mpi_config *cfg);

/* 1 when this library was built with MPI, else 0. */
int dp_mpi_available(void);

/* Initialises MPI once (MPI_Init_thread asking MPI_THREAD_MULTIPLE; with
 * MPI_THREAD_SERIALIZED every MPI call of the transport runs under one mutex)
 * and returns this process's world rank and the world size.  Idempotent;
 * also fine when the program initialised MPI itself. */
int dp_mpi_init(int *world_rank, int *world_size, dp_err *err);

/* Opens the transport over an MPI_COMM_WORLD duplicate.  Collective: every
 * world rank calls it.  No connection step: dp_transport_connect succeeds at
 * once, MPI_Init wired everyone. */
int dp_mpi_open(const dp_mpi_config *cfg, dp_transport **out, dp_err *err);

/* MPI_Finalize, once, if dp_mpi_init started MPI; a no-op otherwise.  Call it
 * at the very end, after every MPI transport is closed -- or leave it to the
 * exit: dp_mpi_init arranges it (on_exit) for a process that exits with
 * status 0.  A failing process must not finalise: MPI_Finalize waits for
 * every rank, so it would hang while its peers wait for it; it exits
 * non-zero instead and mpirun or srun ends the job. */
void dp_mpi_finalize(void);

#endif
