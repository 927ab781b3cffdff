/* Parameter-server training (DistBelief's Downpour SGD and its relatives).
 * Each ps task owns a contiguous range of the flat parameter vector (the
 * min-size partitioner's shards), keeps the optimiser state for it and
 * applies updates; workers push gradients (or, for model averaging,
 * parameters) and pull parameters.  The consistency mode says when a worker
 * gets its parameters back:
 *   async  at once (Downpour SGD), every fetch_every steps; gradients are
 *          accumulated over push_every steps before a push; a worker
 *          computes on while up to push_behind pushes are unanswered
 *   sync   when every live worker has pushed for this step; the server
 *          applies the records-weighted mean gradient once
 *   ssp    when the slowest live worker's clock is at least clock - staleness
 *   dssp   as ssp with a bound adapted within [lo, hi] from worker speeds
 *   avg    workers train locally; every `period` steps they push parameters,
 *          the server waits for all, averages (records-weighted), hands back */
#ifndef DOWNPOUR_PS_H
#define DOWNPOUR_PS_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/cluster.h"
#include "downpour/compress.h"
#include "downpour/optim.h"
#include "downpour/partition.h"
#include "downpour/status.h"
#include "downpour/transport.h"

typedef enum dp_ps_mode {
    DP_PS_ASYNC,
    DP_PS_SYNC,
    DP_PS_SSP,
    DP_PS_DSSP,
    DP_PS_AVG,
    DP_PS_MODE_COUNT
} dp_ps_mode;

/* A sparse table moved by row (docs/strategies.md, "Sparse rows"): rows x
 * width floats at off in the flat parameters.  Row id lives on shard
 * id mod n_shards, as that shard's local row id / n_shards. */
#define DP_PS_MAX_TABLES 64
/* A checkpoint's sparse rows go from a shard to the chief in frames of at
 * most this many bytes of rows (STATE_ROWS): 4 MiB, far under the frame
 * bound, whatever the table. */
#define DP_PS_STATE_CHUNK ((size_t)4 << 20)
/* A STATE_REQ's [u32 flags]: the dense state only, no STATE_ROWS (a chief
 * with compact tables streams them into the file instead). */
#define DP_PS_STATE_DENSE 1u
/* A STATE_ROWS frame's head: [u32 table][u32 part][u32 first local row][u32 count]. */
#define DP_PS_STATE_ROWS_HEAD 16
typedef struct dp_ps_table_spec {
    size_t off;
    uint32_t rows, width;
    uint32_t max_ids;   /* client: the most unique ids one step touches (its buffers) */
    /* client: a compact table (docs/strategies.md, "Tables larger than a
     * worker"): the step's rows live in slots, the i-th id asked at
     * local_off + i*width of the client's vector, not at off + id*width;
     * 0 slots: the vector holds the whole table */
    size_t local_off;
    uint32_t slots;
} dp_ps_table_spec;

typedef struct dp_ps_config {
    dp_ps_mode mode;
    int fetch_every;        /* async: pull parameters every n steps (1) */
    int push_every;         /* async: push accumulated gradients every n steps (1) */
    int push_behind;        /* async: pushes a worker leaves unanswered while it computes
                               the next step; 0 (the default): it waits for each answer.
                               A gradient is computed on parameters at most this many of
                               the worker's own pushes old (docs/strategies.md, ps-async) */
    int push_inline;        /* async pushing behind: the worker sends each push itself
                               before it computes on (1), not a send thread of its
                               client that sends while it computes (0) */
    int staleness;          /* ssp: s (3) */
    int staleness_lo, staleness_hi; /* dssp: range (1:6) */
    int period;             /* avg: local steps between averages (8) */
    size_t min_shard_bytes; /* partitioner (256 KiB) */
    int max_shards;         /* partitioner (0: one per ps task) */
    int replicas;           /* copies of each shard (1: none; 2: a backup on the next
                               ps task, which takes over when the primary is lost;
                               docs/faults.md "Parameter-server replicas") */
    float ema;              /* servers keep an exponential moving average of the
                               parameters with this decay (0: none) for the chief */
    double (*now)(void);    /* the servers' clock for DSSP decisions (NULL: dp_now);
                               tests step it by hand */
    double heartbeat_timeout; /* replicas: a server stopped about this long (its peers
                               may have failed over from it) leaves the run; 0: never */
    int survives_chief;     /* servers serve on while the chief is lost, until it
                               comes back (the strategy survives it: docs/faults.md) */
    double ps_wait;         /* s a client waits for a lost ps with no backup to be
                               restarted (it reloads its shard); 0: the run stops */
    int n_tables;           /* sparse tables moved by row, not in the dense shards
                               (their ranges lie before dense_lo); 0: none */
    dp_ps_table_spec tables[DP_PS_MAX_TABLES];
    size_t dense_shift;     /* client: its vector holds dense parameter j (of the whole
                               model) at j - dense_shift: what its compact tables lack */
    size_t state_chunk;     /* bytes of sparse rows one STATE_ROWS or TABLE_ROWS frame
                               carries at most (0: DP_PS_STATE_CHUNK), at least one
                               row; both ends hold the same (docs/strategies.md,
                               "Evaluation and checkpoints") */
    int chunks;             /* sync with --sum-chunk: a gradient push carries this many
                               gradients (chunk j at j * n in the client's vector), each
                               of `chunk` records (the push's records fill them in
                               order), which the servers add in worker, then chunk
                               order (docs/strategies.md); 0: one gradient a push */
    int chunk;
    dp_compress compress;   /* gradient pushes: NONE (f32), BF16, FP16 or TOPK, coded
                               per shard with error feedback on the worker (PUSH_CODED;
                               docs/strategies.md, "ps family: compression"); pushes
                               with sparse rows (PUSH_ROWS) stay f32 */
    int reply16;            /* servers answer workers with bf16 parameters (PARAMS16) */
    int reply_delta4;       /* --ps-reply delta4: servers answer workers with the 4-bit
                               difference from the worker's copy (PARAMS_CODED,
                               compress.h dp_delta4_encode), as --compress auto's
                               coded answers are */
    double reply_topk;      /* > 0 (--ps-reply topk:RATIO): servers answer workers with
                               the ceil(RATIO n) parameters that moved most since the
                               worker's copy (PARAMS_CODED), keeping a mirror of each
                               worker's copy (docs/strategies.md, "ps family:
                               compression") */
} dp_ps_config;

void dp_ps_config_init(dp_ps_config *cfg);

/* Where each shard lives: shard s is range[s] on ps task rank[s], and with
 * replicas 2 its backup on ps task backup[s] (the next ps task, wrapping;
 * -1: none).  A client's copy follows failovers: rank[s] becomes the backup. */
typedef struct dp_ps_layout {
    int n_shards;
    dp_range range[DP_PARTITION_MAX];
    int rank[DP_PARTITION_MAX];
    int backup[DP_PARTITION_MAX];
} dp_ps_layout;

/* Shards over the cluster's ps tasks, one contiguous range per task at most;
 * a run with no ps task, or with fewer ps tasks than replicas, is refused. */
int dp_ps_layout_make(dp_ps_layout *out, const dp_cluster *c, size_t n_params,
                      const dp_ps_config *cfg, dp_err *err);
/* The same over the parameters [lo, n_params) only (sparse tables lie
 * before lo and move by row). */
int dp_ps_layout_make_from(dp_ps_layout *out, const dp_cluster *c, size_t lo, size_t n_params,
                           const dp_ps_config *cfg, dp_err *err);

/* The most workers one host push speaks for (--ps-push host). */
#define DP_PS_HOST_MAX 256

/* Head of a push payload, before the floats: DP_PUSH_HEAD_SIZE bytes,
 * [u32 records][u32 want][f32 lr][u32 step]. */
#define DP_PUSH_HEAD_SIZE 16
typedef struct dp_push_head {
    uint32_t records;   /* records behind this gradient or these parameters (the weight) */
    uint32_t want;      /* 1: answer with the shard's parameters */
    float lr;           /* the worker's learning rate at this step (the schedule travels
                           with the gradient, so servers need no clock of their own) */
    uint32_t step;      /* the worker's training step (0: not said): a restarted server
                           tells the rounds of ps-sync and model-avg apart by it */
} dp_push_head;
void dp_push_head_put(uint8_t *p, const dp_push_head *h);
void dp_push_head_get(dp_push_head *h, const uint8_t *p);

/* Where a server starts: full-length vectors (but see shift), of which it
 * keeps its slice.
 * Every task computes the same initial parameters from the seed; a resumed
 * run passes the checkpoint's parameters, optimiser slots (slot k at
 * slots + k * n_params) with their update count, and moving average. */
typedef struct dp_ps_start {
    const float *params;  /* n_params floats */
    const float *slots;   /* NULL: a fresh optimiser */
    long t;
    const float *ema;     /* NULL: the average starts at params */
    long step;            /* the step the run starts at (0, or --resume's): a
                             worker's clock is its steps since then */
    const long *clocks;   /* a restarted ps: each worker's clock as the chief knows
                             it, until its JOIN says where it is; -1: it takes no
                             part (lost, or done).  NULL: a fresh start */
    int spare_workers;    /* the last N workers are spare slots (train --spare-workers):
                             no part until their JOIN */
    /* Sparse tables (docs/strategies.md, "Tables larger than a worker"): a
     * ps task whose model holds its tables compact passes vectors without
     * them: params, slots and ema hold dense parameter j at j - shift,
     * each n_params - shift long (slot k at slots + k * (n_params - shift)).
     * A shard's rows come from `rows` when given, else, with shift, from
     * init_rows, else (shift 0) from the full-length vectors. */
    size_t shift;
    const float *rows;    /* the shard's rows in local order, table by table: its
                             rows, then each optimiser slot's when slots is given
                             (a RESTORE's layout).  The task's own shard's: a
                             RESTORE comes only where the shard has no backup,
                             so no backup shard opens from it */
    /* Fills the initial rows of shard `shard` of `shards`, dst[k] table k's
     * (dp_model_init_rows); 0, or -1. */
    int (*init_rows)(void *ctx, int shard, int shards, float *const *dst, int n);
    void *init_ctx;
    /* A resumed shard with shift (a ps task of a --resume'd run on rows):
     * its rows of table k's part (0: the rows; 1 + q: optimiser slot q's),
     * local order, n of them, into dst, from the checkpoint (read a piece
     * at a time, never the table whole: docs/checkpoints.md, "Reading in
     * pieces"); 0, or -1 with err.  Taken before init_rows. */
    int (*read_rows)(void *ctx, int shard, int shards, int table, int part, float *dst,
                     size_t n, dp_err *err);
    void *read_ctx;
} dp_ps_start;

/* One ps task's server, as an object so a test can drive it event by event
 * on the in-process transport. */
typedef struct dp_ps_server dp_ps_server;

int dp_ps_server_open(dp_ps_server **out, dp_transport *t, const dp_cluster *c,
                      const dp_ps_layout *layout, const dp_ps_config *cfg,
                      const dp_optim_config *optim, const dp_ps_start *start, size_t n_params,
                      dp_err *err);
/* Handles at most one event, waiting up to timeout_s for it.  Returns 0 to
 * go on, 1 when the run is over (the chief said SHUTDOWN, or no chief and no
 * live worker is left), -1 when a worker is lost in a mode that cannot go on
 * without it, or the chief is lost. */
int dp_ps_server_poll(dp_ps_server *s, double timeout_s, dp_err *err);
void dp_ps_server_close(dp_ps_server *s); /* NULL is a no-op */
/* What the server has done: updates applied; a worker's clock (pushes
 * applied); whether a worker is owed a reply the mode holds back. */
long dp_ps_server_updates(const dp_ps_server *s);
long dp_ps_server_clock(const dp_ps_server *s, int worker);
int dp_ps_server_pending(const dp_ps_server *s, int worker);

/* open, poll until the end, close. */
int dp_ps_serve(dp_transport *t, const dp_cluster *c, const dp_ps_layout *layout,
                const dp_ps_config *cfg, const dp_optim_config *optim, const dp_ps_start *start,
                size_t n_params, dp_err *err);

/* A worker's (or the chief's) side. */
typedef struct dp_ps_client dp_ps_client;

/* local_optim is used only by model averaging (the workers' own optimiser). */
int dp_ps_client_open(dp_ps_client **out, dp_transport *t, const dp_ps_layout *layout,
                      const dp_ps_config *cfg, const dp_optim_config *local_optim,
                      size_t n_params, dp_err *err);
void dp_ps_client_free(dp_ps_client *c);

/* After a local forward/backward over `records` records (0: an empty tail
 * batch in a synchronous mode), turns grads into new params as the mode
 * says, with learning rate lr.  Allocates nothing. */
int dp_ps_client_step(dp_ps_client *c, float *params, const float *grads, int records, float lr,
                      dp_err *err);
/* --ps-push host, a host leader's step under ps-sync (docs/strategies.md,
 * "ps-sync: one push per host"): pushes sum, the records-weighted gradient
 * sum over `records` records of the workers that members names ([u32
 * m][m u32 worker indices], len bytes, this worker first) to every shard
 * as one PUSH_HOST, and takes the parameters back.  _hosted: a member's
 * step, pushed by its leader (its clock counts it). */
int dp_ps_client_push_host(dp_ps_client *c, float *params, const float *sum, int records,
                           float lr, const uint8_t *members, size_t len, dp_err *err);
void dp_ps_client_hosted(dp_ps_client *c);
/* At the end of training: pushes what is still accumulated (async with
 * push_every > 1) or averages a last short period (avg), and takes the
 * parameters back. */
int dp_ps_client_flush(dp_ps_client *c, float *params, dp_err *err);
/* Fetches every shard's parameters into params; with average set, the
 * servers' moving average of them instead (cfg.ema > 0).  With sparse
 * tables, every row of every table too (PULL_TABLE), unless the client's
 * tables are compact (they come by rows, each step). */
int dp_ps_client_pull(dp_ps_client *c, float *params, int average, dp_err *err);
/* --compress auto (docs/strategies.md, "ps family: compression"): times a
 * pull of every shard into params (answered whole) and the top-k coder,
 * and chooses how this client's pushes and their answers are coded from
 * then on; why (cap bytes) says what and why.  Nothing under another
 * --compress.  0, or -1 with err. */
int dp_ps_client_auto(dp_ps_client *c, float *params, char *why, size_t cap, dp_err *err);
/* --compress auto without measuring: takes a choice made before (top-k at
 * ratio both ways, 4-bit answers; 0: none), the checkpoint's or the running
 * job's (docs/strategies.md).  A ratio > 0 where the pushes carry sparse
 * rows is refused. */
int dp_ps_client_auto_take(dp_ps_client *c, double ratio, dp_err *err);
/* Under --compress auto the ratio this client took (0: none), -1 before. */
double dp_ps_client_auto_ratio(const dp_ps_client *c);
/* Every sparse table's rows, streamed: the next n floats of part `part`
 * (0: the rows; 1, 2: optimiser slot 0, 1's) of table k (row after row, ids
 * increasing; the tables in order, each from its first row), each shard's
 * rows of them asked in chunks (PULL_TABLE, answered by one TABLE_ROWS
 * frame of at most dp_ps_state_chunk_rows rows), never whole; a shard lost
 * meanwhile is asked on its backup.  _end ends a pass before its end. */
int dp_ps_client_tables_read(dp_ps_client *c, int part, int k, float *dst, size_t n,
                             dp_err *err);
int dp_ps_client_tables_end(dp_ps_client *c, dp_err *err);
/* Rows of width w one STATE_ROWS or TABLE_ROWS frame carries under cfg
 * (both ends alike): state_chunk (or DP_PS_STATE_CHUNK) bytes of rows, at
 * least one row. */
size_t dp_ps_state_chunk_rows(const dp_ps_config *cfg, size_t width);
/* A TABLE_ROWS answer from peer to the PULL_TABLE whose 16 bytes are want
 * ([u32 table][u32 part][u32 first][u32 count]) for the shard at lo, rows
 * of width floats: with head NULL its type, offset and length (the head
 * and count rows), before a byte of it is read; then its head (the first
 * 16 bytes), which must be the chunk asked: a chunk missing, repeated or
 * out of order is refused.  0, or -1 with err naming peer. */
int dp_ps_table_rows_check(unsigned type, uint64_t offset, uint64_t length, const uint8_t *head,
                           const uint8_t *want, uint32_t width, uint64_t lo, const char *peer,
                           dp_err *err);
/* The chief's side of a checkpoint: asks every shard for its training state
 * and assembles full-length vectors (slots as in dp_ps_start; ema may be NULL
 * when the servers keep none).  *t is the servers' optimiser update count. */
int dp_ps_client_pull_state(dp_ps_client *c, uint64_t step, const dp_optim_config *optim,
                            float *params, float *slots, float *ema, long *t, dp_err *err);
/* Sparse rows (cfg.n_tables > 0; docs/strategies.md, "Sparse rows"): the
 * rows the next step touches, ids[k][0..n[k]) of table k, unique and
 * increasing, pulled from their shards into params; the pointers stay the
 * client's until that step's push, which pushes those rows' gradients. */
int dp_ps_client_pull_rows(dp_ps_client *c, float *params, const uint32_t *const *ids,
                           const long *n, dp_err *err);
/* Sends a frame without payload (JOIN, DONE) to every copy of every shard,
 * so a backup knows the worker as its primary does.  A copy that cannot be
 * told is lost: the client fails over from it (dp_ps_client_lost). */
int dp_ps_client_say(dp_ps_client *c, unsigned type, uint64_t step, dp_err *err);
/* The task at `rank` is lost: every shard it held as primary goes on on its
 * backup, and it is nobody's backup any more.  Returns the number of shards
 * moved, or -1 when a shard it held has no copy left. */
int dp_ps_client_lost(dp_ps_client *c, int rank, const char *reason, dp_err *err);
/* fn(ctx, rank, reason) is called once for each ps task the client finds
 * lost while every shard keeps a copy (the task's `fault` metrics event). */
void dp_ps_client_on_failover(dp_ps_client *c, void (*fn)(void *ctx, int rank, const char *reason),
                              void *ctx);
/* A ps task with no backup was lost and is back, restarted (a new
 * incarnation): fn(ctx, rank, err) gives it its shard's state (the chief's
 * RESTORE) before the client re-sends what it had not had answered.  fn
 * returns 0, 1 when the ps was lost again (the client waits on), or -1. */
void dp_ps_client_on_restart(dp_ps_client *c, int (*fn)(void *ctx, int rank, dp_err *err),
                             void *ctx);
/* The step this client's worker is taking (1-based, as the loop counts): a
 * restarted ps learns from it where the worker is (JOIN). */
void dp_ps_client_at_step(dp_ps_client *c, long step);
/* Takes the answers of every push still in flight (push-behind) into
 * params, so every push this worker made has been applied: before its epoch
 * report, so the chief evaluates what the worker trained. */
int dp_ps_client_drain(dp_ps_client *c, float *params, dp_err *err);
/* A round trip to every shard after pushing whatever is accumulated, so every
 * push this worker made has been applied (a checkpoint's consistent point). */
int dp_ps_client_sync(dp_ps_client *c, float *params, dp_err *err);
/* The error-feedback residual of a worker pushing coded gradients
 * (cfg.compress): n_params floats, what its pushes have not carried yet;
 * NULL when the client codes nothing.  A checkpoint holds it
 * (replica.{w}.residual) and a resumed worker writes it back here. */
float *dp_ps_client_residual(dp_ps_client *c);
/* model-avg: the worker's own optimiser (its state is this worker's part of a
 * checkpoint); NULL in the other modes. */
dp_optim *dp_ps_client_local_optim(dp_ps_client *c);

/* The largest gap (own clock minus the slowest clock the servers reported)
 * this client has been allowed to run with. */
long dp_ps_client_max_gap(const dp_ps_client *c);
/* The pushes this client leaves unanswered while its worker computes on
 * (cfg.push_behind as it could be kept: 0 outside ps-async, at most 1 where
 * a shard may fail over, and no more than the sockets can hold; ps.c), and
 * how many are unanswered now. */
int dp_ps_client_push_behind(const dp_ps_client *c);
int dp_ps_client_in_flight(const dp_ps_client *c);
/* Whether a thread of the client sends its pushes (cfg.push_inline 0, where
 * no shard fails over), so the worker computes while they go out. */
int dp_ps_client_send_thread(const dp_ps_client *c);

#endif
