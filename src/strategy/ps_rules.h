/* Inside the parameter server: what one consistency mode decides, and the
 * machinery it decides with.  ps.c is the machinery (shards, pushes, replies,
 * rounds, the wire); each ps strategy's file (ps_async.c, ps_sync.c,
 * ps_ssp.c, ps_dssp.c, model_avg.c) states its rule as a dp_ps_rules table:
 * what a server does with a push, whom it answers when a worker leaves, and
 * what a worker's step sends.  Private to src/strategy. */
#ifndef DOWNPOUR_STRATEGY_PS_RULES_H
#define DOWNPOUR_STRATEGY_PS_RULES_H

#include "downpour/ps.h"

typedef struct dp_ps_worker {
    int rank;
    int live;          /* has not said DONE and is not lost */
    int spare;         /* a spare slot (--spare-workers) that has not joined yet */
    long clock;        /* pushes applied (parameter rounds, for avg) */
    int pending;       /* owed a PARAMS reply the rule holds back */
    double last_push;  /* the server's clock at its last push */
    double interval;   /* moving average of its push intervals */
    /* replicas (ps_replica.c): pushes are told apart by the client's clock,
     * which travels as the frame's step (0: none, never a duplicate) */
    uint64_t step;     /* of its newest push */
    uint64_t applied;  /* of its newest push applied: the same step again is a re-send */
    uint64_t owed;     /* a reply held until the backup acknowledged update `owed` */
    int unsynced;      /* a restarted server does not know its clock yet: until its
                          JOIN (or push) it holds nobody back */
    uint32_t last_step; /* restarted server: the training step it last pushed (or, from
                          its JOIN, the one before the step it is taking) */
    uint32_t reply_k;  /* --compress auto: its newest push's top-k count (0: it pushed
                          f32, answered whole; else answered with the 4-bit difference) */
    /* --ps-push host (docs/strategies.md, "ps-sync: one push per host"): its
     * gradient came in its host leader's push, which takes its answer */
    int hosted;        /* pending through the leader: no answer of its own */
    uint32_t hosted_step; /* the training step of the last host push it was in */
} dp_ps_worker;

typedef struct dp_ps_rules dp_ps_rules;

/* Coded answers keep W copies of a shard (ps_shard.c): at most this many
 * floats, 4 GiB, per shard; above it the run is refused at open. */
#define DP_PS_MIRROR_MAX_FLOATS ((size_t)1 << 30)

/* One sparse table's rows on a shard (ps_shard.c; docs/strategies.md,
 * "Sparse rows"): the rows id = shard + j * n_shards, j in [0, local), as
 * rows j of params, with their optimiser state beside them. */
typedef struct dp_ps_table {
    size_t off;           /* the table's place in the flat parameters */
    long rows;            /* the whole table's */
    int width;
    long local;           /* rows this shard holds */
    float *params;        /* local * width */
    dp_optim opt;         /* over local * width: t moves with the shard's */
    float *sum;           /* rounds: the records-weighted sum, laid out as params */
    uint8_t *mark;        /* rounds: the rows in the open round */
    uint32_t *touched;    /* rounds: those rows, in the order first pushed */
    long n_touched;
    uint32_t *ids;        /* the push (or request) being handled: its local rows */
    long n_ids;
    float *grad;          /* its rows' gradients one after another; a ROWS answer's gather */
    /* the update dp_ps_apply applies: local rows, their gradients (indexed:
     * laid out as params, else one after another) */
    const uint32_t *up_ids;
    long up_n;
    const float *up_g;
    int up_indexed;
} dp_ps_table;

struct dp_ps_server {
    dp_transport *t;
    dp_ps_config cfg;
    const dp_ps_rules *rules;
    size_t lo, n;
    float *params;   /* the shard */
    float *scratch;  /* the push being handled (gradient, or parameters for avg) */
    float *sum;      /* a round's records-weighted sum */
    float *chunk_buf; /* --sum-chunk: each worker's chunks of the round, worker i's
                         at i * chunks * n (cfg.chunks > 0) */
    uint32_t *chunk_rec; /* and its push's records */
    char *chunk_in;      /* and whether it pushed into the open round */
    float *ema;      /* moving average of params (cfg.ema > 0), else NULL */
    double round_records;
    int round_pushes;
    int weighted;    /* the push in scratch is records-weighted already (a host's sum) */
    float round_lr;  /* the learning rate of the round's pushes */
    int restored;    /* restarted into the run (dp_ps_start.clocks): rounds go by step */
    uint32_t round_key; /* restored: the training step of the open round's pushes */
    dp_optim opt;
    dp_ps_worker *w;
    int n_workers;
    int *worker_of;  /* rank -> worker index, or -1 */
    int chief;       /* rank of the chief, or -1 */
    int chief_live;  /* the run is not over: the chief has not said SHUTDOWN */
    long base_step;  /* the step the run started at (dp_ps_start.step) */
    double chief_lost_at; /* when the chief was lost (survives_chief), else 0 */
    int shard;       /* index in the layout, or -1 when this task holds none */
    long updates;
    int dropped;     /* a worker was dropped while answering: release again */
    /* replicas (ps_replica.c) */
    int backup_rank;       /* primary: where this shard's backup lives, -1: none (left) */
    uint64_t fwd_seq, ack_seq; /* primary: updates forwarded to it, and acknowledged */
    uint8_t *table;        /* primary: the forwarded worker table's buffer */
    dp_ps_worker *pusher;  /* the worker whose push is being handled (applied at once) */
    dp_ps_server *backup;  /* the shard this task backs up, as a server of its own; NULL */
    int primary_rank;      /* on a backup: its primary, -1 once it took the shard over */
    struct dp_ps_ticker *ticker; /* notices this task being stopped (ps_replica.c) */
    int fenced;            /* stopped long enough to be taken over: it must leave */
    /* sparse tables (ps_shard.c) */
    int n_tab;
    dp_ps_table *tab;
    int n_shards;          /* the layout's: row id lives on shard id mod n_shards */
    uint8_t *fwd;          /* primary with a backup: the rows section it forwards */
    /* compression (cfg.compress, cfg.reply16; docs/strategies.md) */
    uint8_t *coded;        /* a PUSH_CODED's block, dp_coded_bytes of the shard */
    uint8_t *out16;        /* a PARAMS16 answer: the shard as bf16 */
    /* coded answers (cfg.reply_topk, or compress AUTO): worker i's copy of the
     * shard as this server answered it, at mirror + i * n, and whether it is
     * known (not after the worker joined again, pulled, or on a backup or a
     * restarted server: answered whole first); the difference, the top-k
     * scratch and the answer's bytes */
    float *mirror;
    uint8_t *mirror_ok;
    float *rdiff, *rtmp;
    uint8_t *rout;
};

struct dp_ps_client {
    dp_transport *t;
    const dp_ps_rules *rules;
    dp_ps_layout layout;
    dp_ps_config cfg;
    size_t n;
    float *acc;          /* async push_every > 1: records-weighted gradient sum */
    uint32_t acc_records;
    int acc_steps;
    int since_fetch;
    int since_avg;
    uint32_t avg_records;
    dp_optim local;      /* avg: the worker's own optimiser */
    float lr;            /* of the latest step, sent with every push */
    long clock;
    long max_gap;
    /* Push-behind (async): pushes whose answers have not been taken yet; each
     * shard answers them in order on its connection (ps.c dp_ps_settle). */
    int behind;          /* the most left unanswered while the worker computes */
    int in_flight;
    struct dp_sender *q;    /* the thread that sends the pushes (NULL: the caller does) */
    float *out;          /* with q: the push it sends, copied (the caller's changes) */
    long q_last;         /* with q: the sequence number of the push's last frame */
    /* The request each shard has not answered yet, re-sent to the backup
     * when its primary is lost (ps.c failover). */
    struct {
        unsigned type;
        const float *v;  /* a push's full-length vector */
        uint32_t records;
        int want;
        uint64_t step;
        int coded;       /* a gradient push sent as coded blocks (cbuf) */
        const uint8_t *host; /* PUSH_HOST: [u32 m][m u32 worker indices], host_len bytes */
        size_t host_len;
    } last;
    /* compression (cfg.compress): the residual, each shard's coded block of
     * the newest push (at coff[s], clen[s] bytes; kept for a re-send), the
     * coder's scratch; with reply16, a PARAMS16 answer's bytes */
    float *resid;
    uint8_t *cbuf;
    size_t coff[DP_PARTITION_MAX], clen[DP_PARTITION_MAX];
    float *ctmp, *ctmp2;
    uint8_t *in16;
    uint8_t *cin;        /* coded answers (reply_topk, delta4, compress AUTO): one answer's bytes */
    int auto_taken;      /* --compress auto: cfg.compress holds its choice */
    void (*on_failover)(void *ctx, int rank, const char *reason);
    void *failover_ctx;
    float *sent;         /* with replicas or restarts, avg (or async pushing behind): the
                            pushed vector, kept for a re-send while the caller's changes */
    /* A ps restarted into the run (ps.c await_restart): each shard's task's
     * incarnation as this client knows it, and what the client tells a new one. */
    uint64_t inc[DP_PARTITION_MAX];
    long step;           /* the worker's step (dp_ps_client_at_step); 0: not a worker */
    int (*on_restart)(void *ctx, int rank, dp_err *err);
    void *restart_ctx;
    /* sparse tables (cfg.n_tables): the next step's rows (the caller's
     * arrays, dp_ps_client_pull_rows), a request's section, an answer's rows */
    const uint32_t *ids[DP_PS_MAX_TABLES];
    long n_ids[DP_PS_MAX_TABLES];
    uint8_t *sec;
    size_t sec_cap;
    float *rbuf;
    size_t rbuf_floats;
    /* a pass over every table's rows (dp_ps_client_tables_read): the part,
     * the table and float read next, and the staging buffer of a read */
    int tab_on, tab_part, tab_k;
    size_t tab_pos;
    float *stage;
    size_t stage_cap;
};

struct dp_ps_rules {
    dp_ps_mode mode;
    const char *name;        /* in log lines: "async" */
    int pushes_params;       /* workers push parameters (avg), not gradients */
    int watches_time;        /* its decisions change with time alone (dssp):
                                look again every few ms while someone waits */
    /* Server: a push from w is in s->scratch (checked, w's clock counted). */
    int (*on_push)(dp_ps_server *s, dp_ps_worker *w, const dp_push_head *h, dp_err *err);
    /* Server: a worker left (DONE or lost) or time passed: answer whoever
     * no longer has to wait. */
    int (*release)(dp_ps_server *s, dp_err *err);
    /* Client: one step; c->lr is the step's learning rate. */
    int (*step)(dp_ps_client *c, float *params, const float *grads, int records, dp_err *err);
    /* Client: push what is held back (NULL: nothing ever is). */
    int (*flush)(dp_ps_client *c, float *params, dp_err *err);
    /* Client: make every push applied, for a checkpoint (NULL: every push
     * is answered, so it already is). */
    int (*sync)(dp_ps_client *c, float *params, dp_err *err);
};

extern const dp_ps_rules dp_ps_rules_async, dp_ps_rules_sync, dp_ps_rules_ssp, dp_ps_rules_dssp,
    dp_ps_rules_avg;

/* ---- the machinery the rules use (ps.c) ---- */

double dp_ps_now(const dp_ps_server *s);         /* the server's clock (cfg.now or dp_now) */
long dp_ps_min_clock(const dp_ps_server *s);     /* the slowest live worker's clock, -1: none */
/* Sends w the shard's parameters and clears its pending flag; a worker
 * that cannot be sent to is dropped (s->dropped), never the server. */
void dp_ps_reply(dp_ps_server *s, dp_ps_worker *w);
/* An optimiser update of the shard with gradient g; the average follows. */
void dp_ps_apply(dp_ps_server *s, const float *g, float lr);
/* The shard's parameters changed otherwise (an average): the average follows. */
void dp_ps_changed(dp_ps_server *s);
/* Answers every pending worker for which go(s, w, gap, now) says so; gap is
 * its clock minus the slowest live worker's. */
typedef int (*dp_ps_may_go)(const dp_ps_server *s, const dp_ps_worker *w, long gap, double now);
int dp_ps_release_if(dp_ps_server *s, dp_ps_may_go go, dp_err *err);
/* The bounded-staleness push (ssp, dssp): the gradient is applied at once;
 * the answer waits until the rule's release lets the worker go. */
int dp_ps_apply_then_wait(dp_ps_server *s, dp_ps_worker *w, const dp_push_head *h, dp_err *err);
/* Rounds (sync, avg): adds w's push, records-weighted; a round is complete
 * when every live worker has pushed; dp_ps_round_mean gives the weighted
 * mean in s->scratch (NULL when the round carried no records); closing it
 * answers every worker of the round. */
int dp_ps_round_add(dp_ps_server *s, dp_ps_worker *w, const dp_push_head *h, dp_err *err);
int dp_ps_round_complete(const dp_ps_server *s);
const float *dp_ps_round_mean(dp_ps_server *s);
/* --sum-chunk: the round's sum made again from the chunks, in worker then
 * chunk order, so it is the same bits for any number of workers. */
void dp_ps_round_chunk_sum(dp_ps_server *s);
int dp_ps_round_close(dp_ps_server *s, dp_err *err);

/* Client: sends v's slice to every shard (a push), and takes every shard's
 * parameters back into params. */
int dp_ps_push(dp_ps_client *c, unsigned type, const float *v, uint32_t records, int want,
               dp_err *err);
int dp_ps_receive(dp_ps_client *c, float *params, dp_err *err);
/* Push-behind: takes the oldest answers into params (between steps, never
 * during one) until at most `left` pushes are unanswered. */
int dp_ps_settle(dp_ps_client *c, float *params, int left, dp_err *err);
/* ---- the shard (ps_shard.c), which ps.c and ps_replica.c both build on ---- */

/* One shard's server (dp_ps_server_open picks this task's own shard; the
 * backup's is opened the same way, with its primary's shard index), under
 * the mode's rules.  dp_ps_shard_free frees it (not what replicas opened). */
int dp_ps_shard_open(dp_ps_server **out, dp_transport *t, const dp_cluster *c,
                     const dp_ps_layout *layout, const dp_ps_config *cfg,
                     const dp_ps_rules *rules, const dp_optim_config *optim,
                     const dp_ps_start *start, size_t n_params, int shard, dp_err *err);
void dp_ps_shard_free(dp_ps_server *s); /* NULL is a no-op */
/* Sends rank the shard's parameters (stamped with the slowest clock). */
int dp_ps_send_params(dp_ps_server *s, int rank, dp_err *err);
/* A worker's answer: PARAMS16 with cfg.reply16, else PARAMS. */
int dp_ps_send_answer(dp_ps_server *s, int rank, dp_err *err);
/* Coded answers: w's copy is not known any more (it joined again, or
 * pulled): its next answer goes whole. */
void dp_ps_mirror_forget(dp_ps_server *s, const dp_ps_worker *w);
/* Sends w the shard's parameters now (dp_ps_reply, or a held reply let go). */
void dp_ps_send_reply(dp_ps_server *s, dp_ps_worker *w);
/* An update's bookkeeping, in this order around it: the pushes it carries
 * are applied (before a primary forwards its worker table), then the
 * update counts and moves the moving average. */
void dp_ps_note_applied(dp_ps_server *s);
void dp_ps_shard_changed(dp_ps_server *s);

/* ---- sparse rows (ps_shard.c; docs/strategies.md, "Sparse rows") ----
 * A rows section, after a push's dense floats (PUSH_ROWS) or a forwarded
 * update's (REPLICATE): per table, [u32 count][count u32 ids][count x
 * width f32], ids of this shard, strictly increasing, below the table's
 * rows.  A PULL_ROWS is the same without the floats. */

/* Reads a section of exactly `len` bytes from peer into the tables' ids
 * and grad, every count and id checked before anything is kept (err names
 * who); with_rows 0: a PULL_ROWS (no floats).  Sets the tables' update
 * to it. */
int dp_ps_rows_read(dp_ps_server *s, int peer, uint64_t len, int with_rows, const char *who,
                    dp_err *err);
/* The tables' update, sparse, after the dense one: begins each table's
 * optimiser (so its t moves with the shard's) and updates the rows. */
void dp_ps_rows_apply(dp_ps_server *s, float lr);
/* The tables' update as a section (for the backup), into s->fwd; bytes. */
size_t dp_ps_rows_put(dp_ps_server *s);
/* Rounds: adds the push's rows, records-weighted; the round's mean (in
 * place) becomes the update; closing forgets the round's rows. */
void dp_ps_rows_round_add(dp_ps_server *s, float r);
void dp_ps_rows_round_mean(dp_ps_server *s, float scale);
void dp_ps_rows_round_clear(dp_ps_server *s);
/* Answers a PULL_ROWS (read by dp_ps_rows_read). */
int dp_ps_rows_send(dp_ps_server *s, int rank, dp_err *err);
/* Answers a PULL_TABLE, ask its 16 bytes ([u32 table][u32 part][u32 first
 * local row][u32 count]): every field checked against the shard's tables
 * and the chunk (dp_ps_state_chunk_rows), then one TABLE_ROWS frame, the
 * head and the rows straight from the table (docs/strategies.md, "Sparse
 * rows"); -1 with err naming who. */
int dp_ps_table_send(dp_ps_server *s, int rank, const uint8_t *ask, const char *who,
                     dp_err *err);
/* Floats of every table's rows this shard holds (the STATE frame's part). */
size_t dp_ps_rows_local_floats(const dp_ps_server *s);

/* ---- replicas (ps_replica.c) ---- */

/* Server open: with cfg.replicas 2, connects to the ps tasks it forwards to
 * and from, and opens the shard it backs up (s->backup).  Close frees it. */
int dp_ps_replica_open(dp_ps_server *s, const dp_cluster *c, const dp_ps_layout *layout,
                       const dp_optim_config *optim, const dp_ps_start *start, size_t n_params,
                       dp_err *err);
/* Primary: the shard changed by op (DP_PS_OP_*) with vector v (a gradient at
 * rate lr, or the new parameters): the backup gets the same, in order. */
enum { DP_PS_OP_APPLY = 1, DP_PS_OP_SET = 2 };
void dp_ps_replica_forward(dp_ps_server *s, int op, const float *v, float lr);
/* Primary: whether a reply to w must wait for the backup (it is then owed). */
int dp_ps_replica_holds(dp_ps_server *s, dp_ps_worker *w);
/* A REPLICATE or REPLICATE_ACK frame (1: it was one, handled), or the loss
 * of a ps task (1: it mattered to a shard here). */
int dp_ps_replica_frame(dp_ps_server *s, const dp_event *ev, dp_err *err);
int dp_ps_replica_lost(dp_ps_server *s, const dp_event *ev);
/* The server that a client's frame for the shard at ev->header.offset is
 * for: s, or the backup (taken over first when the frame asks to be served). */
dp_ps_server *dp_ps_replica_route(dp_ps_server *s, const dp_event *ev);
/* After each poll: -1 when this task was stopped (SIGSTOP, a suspended VM)
 * long enough that its peers may have declared it lost and handed its
 * shards to the backups; it must leave.  Close stops what open started. */
int dp_ps_replica_awake(dp_ps_server *s, dp_err *err);
void dp_ps_replica_close(dp_ps_server *s);

/* The step of the modes whose every push is answered (sync, ssp, dssp): push
 * the gradient, wait for the parameters. */
int dp_ps_push_and_wait(dp_ps_client *c, float *params, const float *grads, int records,
                        dp_err *err);

#endif
