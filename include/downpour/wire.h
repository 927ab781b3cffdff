/* Every application frame type, in one table so no two modules pick the same
 * number, and the byte helpers every payload field is written with.  Each
 * module owns a range and only it sends or consumes those types:
 *
 *   APP(0..7)     parameter servers         src/strategy/ps.c
 *   APP(8..15)    ring all-reduce           src/strategy/ring.c, allreduce.c
 *   APP(16..31)   run coordination          src/train/loop.c and the strategy
 *                                           that coordinates (src/strategy/ps_family.c)
 *   APP(32..33)   parameter-server replicas src/strategy/ps_replica.c
 *   APP(34..36), APP(71)
 *                 sparse rows on the ps     src/strategy/ps.c, ps_shard.c (with APP(7))
 *   APP(37..38)   compressed ps frames      src/strategy/ps.c, ps_shard.c
 *   APP(67..70)   ps pushes by host         src/strategy/ps.c, ps_host.c
 *   APP(40..47)   layer pipelining          src/strategy/pipeline.c
 *   APP(48..55)   model parallelism         src/strategy/model_parallel.c
 *   APP(56..63)   Sandblaster L-BFGS        src/strategy/lbfgs.c, lbfgs_shard.c
 *   APP(100..101) ping                      src/cli/cmd_ping.c
 *
 * Payload fields are little-endian, written with dp_put_* / read with
 * dp_get_* (frame.h and below), never as a C struct lies in memory.  Float
 * arrays (parameters, gradients) travel as IEEE-754 binary32 in
 * little-endian order, which is how they lie in memory on every host the
 * build accepts: they go straight from the model's buffers to the socket. */
#ifndef DOWNPOUR_WIRE_H
#define DOWNPOUR_WIRE_H

#include <stdint.h>
#include <string.h>

#include "downpour/frame.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "downpour sends float arrays as they lie in memory, which needs a little-endian host"
#endif

enum dp_wire_type {
    /* parameter servers (src/strategy/ps.c) */
    DP_WIRE_PUSH_GRAD = DP_FRAME_APP(0),    /* worker -> ps: push head + the shard's gradient
                                               (--sum-chunk: the slice of each chunk's, in turn) */
    DP_WIRE_PUSH_PARAMS = DP_FRAME_APP(1),  /* worker -> ps: push head + parameters (model-avg) */
    DP_WIRE_PULL = DP_FRAME_APP(2),         /* anyone -> ps: send me the shard's parameters */
    DP_WIRE_PARAMS = DP_FRAME_APP(3),       /* ps -> anyone: the shard's parameters; step = slowest clock */
    DP_WIRE_PULL_AVERAGE = DP_FRAME_APP(4), /* chief -> ps: send me the shard's moving average */
    DP_WIRE_STATE_REQ = DP_FRAME_APP(5),    /* chief -> ps: your training state for checkpoint `step`; payload none or [u32 flags] (DP_PS_STATE_DENSE: no STATE_ROWS) */
    DP_WIRE_STATE = DP_FRAME_APP(6),        /* ps -> chief: that state (see ps.c send_state); with sparse tables their rows and slots' rows follow in STATE_ROWS frames */
    DP_WIRE_PUSH_ROWS = DP_FRAME_APP(7),    /* worker -> ps: push head + the shard's dense gradient + a rows section (ps_shard.c, "rows section") */
    /* ring all-reduce (src/strategy/ring.c, and allreduce.c re-forming it) */
    DP_WIRE_RING = DP_FRAME_APP(8),         /* a segment; step = the training step, offset = element
                                             (a sparse all-gather's piece: offset = its block's bytes) */
    DP_WIRE_RING_RESET = DP_FRAME_APP(9),   /* replica -> replicas: re-forming the ring; step = generation */
    DP_WIRE_RING_REPORT = DP_FRAME_APP(10), /* replica -> every member while re-forming: step = generation, offset = the last step it applied, payload the leader it names (allreduce.c reform) */
    DP_WIRE_RING_PLAN = DP_FRAME_APP(11),   /* the leader -> replicas: the new ring (allreduce.c send_plan); offset all ones: you are out */
    DP_WIRE_RING_STATE = DP_FRAME_APP(12),  /* newest replica -> those behind: params, optimiser slots; offset = optimiser t */
    DP_WIRE_RING_STATS = DP_FRAME_APP(13),  /* replica -> the leader: epoch figures, 3 f64 */
    DP_WIRE_RING_HELLO = DP_FRAME_APP(14),  /* replica -> every replica at open (no payload, offset 0); the leader answers with the members; a welcomed replica -> the leader once it holds the state (no payload, offset 2: READY); the leader -> each welcomed replica once all are READY (offset 3: GO, payload the members) */
    DP_WIRE_RING_COMM = DP_FRAME_APP(15),   /* collectives on the devices (allreduce.c comm_setup); step = generation. replica -> the leader: offset 1 if its device has them; the leader -> replicas: offset 1: sum with NCCL, payload the 128-byte id then the members (a PLAN's payload); offset 0: on the host, payload the members */
    DP_WIRE_RING_RESID = DP_FRAME_APP(65),  /* replica -> the leader at checkpoint `step` (allreduce.c gather_residuals): its compression residual, n_params f32 */
    /* run coordination (the loop, and the strategy that coordinates) */
    DP_WIRE_START = DP_FRAME_APP(16),       /* chief -> workers and ps: go (offset 1: a rejoined worker starts at `step`, payload its DEAL, then under the ps family's --compress auto a u32: its slot's choice, strategy/ps_auto.h, 0 none yet; offset 0 with 8 bytes: the first DEAL, when the spec has spare slots) */
    DP_WIRE_EPOCH = DP_FRAME_APP(17),       /* worker -> chief: epoch `step` done, with its stats */
    DP_WIRE_DONE = DP_FRAME_APP(18),        /* worker -> chief and ps: no more steps from me */
    DP_WIRE_SHUTDOWN = DP_FRAME_APP(19),    /* chief -> ps: the run is over */
    DP_WIRE_CKPT_READY = DP_FRAME_APP(20),  /* worker -> chief: at checkpoint `step`, with its own state: model-avg's [u64 t][its optimiser slots], then with --compress its residual, n_params f32; offset: --compress auto's choice (strategy/ps_auto.h; 0 none) */
    DP_WIRE_CKPT_GO = DP_FRAME_APP(21),     /* chief -> workers: checkpoint `step` is written, go on */
    DP_WIRE_JOIN = DP_FRAME_APP(22),        /* worker -> chief, then ps: this incarnation takes part */
    DP_WIRE_DEAL = DP_FRAME_APP(23),        /* chief -> workers: {u32 index, u32 count}, your data shard from the next epoch (offset 0) or from epoch offset - 1 (a spare slot joins then) */
    DP_WIRE_PROGRESS = DP_FRAME_APP(24),    /* worker -> chief: `step` steps done (where a restart resumes); offset: --compress auto's choice (strategy/ps_auto.h; 0 none), one PROGRESS sent as soon as it chose */
    DP_WIRE_RESTORE = DP_FRAME_APP(25),     /* chief -> a restarted ps: its shard from checkpoint `step` (ps_family.c); its sparse rows follow in STATE_ROWS frames */
    DP_WIRE_BUFFERS = DP_FRAME_APP(26),     /* worker 0 -> chief: u32 count (the model's n_buffers), then its buffers, f32: before each epoch report (step = epoch), at each checkpoint barrier (step) and when it re-attaches (ps_family.c send_buffers) */
    /* parameter-server replicas (src/strategy/ps_replica.c) */
    DP_WIRE_REPLICATE = DP_FRAME_APP(32),   /* primary ps -> backup ps: an update of shard at `offset`; step = its sequence number */
    DP_WIRE_REPLICATE_ACK = DP_FRAME_APP(33), /* backup -> primary: updates up to `step` are applied */
    /* sparse rows (src/strategy/ps.c, ps_shard.c; docs/strategies.md, "Sparse rows"); offset = the shard's dense lo */
    DP_WIRE_PULL_ROWS = DP_FRAME_APP(34),   /* worker -> ps: per table [u32 count][count u32 ids], ids of this shard, increasing */
    DP_WIRE_ROWS = DP_FRAME_APP(35),        /* ps -> anyone: the rows asked (or every row it holds), f32, table after table; step = slowest clock */
    DP_WIRE_PULL_TABLE = DP_FRAME_APP(36),  /* anyone -> ps: one chunk of a table's rows this shard holds: [u32 table][u32 part: 0 the rows, q slot q-1][u32 first local row][u32 count], count 1 to a chunk's rows (dp_ps_state_chunk_rows); answered by TABLE_ROWS */
    /* compressed ps frames (src/strategy/ps.c, ps_shard.c; docs/strategies.md, "ps family: compression") */
    DP_WIRE_PUSH_CODED = DP_FRAME_APP(37),  /* worker -> ps: push head + the shard's gradient as a coded block (compress.h: [u32 codec][u32 count], then bf16/fp16 values or top-k pairs) */
    DP_WIRE_PARAMS16 = DP_FRAME_APP(38),    /* ps -> worker (--ps-reply bf16): the shard's parameters as bf16, u16 each; step = slowest clock */
    DP_WIRE_STATE_ROWS = DP_FRAME_APP(39),  /* ps -> chief after a STATE, chief -> a restarted ps after its RESTORE: [u32 table][u32 part: 0 the rows, q slot q-1][u32 first local row][u32 count] then count x width f32; step = the checkpoint's (ps.c send_state) */
    DP_WIRE_PARAMS_CODED = DP_FRAME_APP(66), /* ps -> worker (--ps-reply delta4|topk:RATIO, --compress auto): what the worker's copy lacks, as the server's mirror of it knows (ps_shard.c send_coded): [u32 codec = 16][u32 count = n][f32 scale] then n 4-bit differences (compress.h dp_delta4_encode), or [u32 codec = topk][u32 count] then count (u32 index, f32 parameter) pairs, indices strictly increasing, below the shard's n; step = slowest clock */
    /* one push per host (src/strategy/ps.c, ps_host.c; docs/strategies.md, "ps-sync: one push per host") */
    DP_WIRE_PUSH_HOST = DP_FRAME_APP(67),   /* host leader -> ps: push head (records: the host's) + [u32 m][m u32 worker indices, the leader's first] + the shard's records-weighted gradient sum over those workers, f32 */
    DP_WIRE_HOST_MAP = DP_FRAME_APP(68),    /* worker -> every worker at the start: offset = its index, payload one byte per worker, 1: on its host (dp_transport_same_host) */
    DP_WIRE_HOST_GRAD = DP_FRAME_APP(69),   /* member -> its host's leader: push head + its gradient times its records, n_params f32; step = the training step (0: auto's echo) */
    DP_WIRE_HOST_PARAMS = DP_FRAME_APP(70), /* leader -> its members: the parameters, n_params f32; step = the training step (0: auto's echo, offset 1: pushes by host, 2: by worker, with no payload) */
    /* sparse rows, continued (src/strategy/ps.c, ps_shard.c) */
    DP_WIRE_TABLE_ROWS = DP_FRAME_APP(71),  /* ps -> anyone: the chunk a PULL_TABLE asked: its head again, [u32 table][u32 part][u32 first local row][u32 count], then count x width f32 in local order; step = slowest clock (ps_shard.c dp_ps_table_send) */
    /* layer pipelining (src/strategy/pipeline.c); step = the training step */
    DP_WIRE_PIPE_ACT = DP_FRAME_APP(40),    /* stage s -> s+1: activations of micro-batch `offset`, f32 (rows, width) */
    DP_WIRE_PIPE_GRAD = DP_FRAME_APP(41),   /* stage s+1 -> s: the loss gradient at those activations */
    DP_WIRE_PIPE_LOSS = DP_FRAME_APP(42),   /* last stage -> its replica's others: f64 loss sum, u32 correct */
    DP_WIRE_PIPE_STATS = DP_FRAME_APP(43),  /* stage -> position 0 at an epoch's end: 5 f64, 2 u32 (pipeline.c send_stats) */
    DP_WIRE_PIPE_PARAMS = DP_FRAME_APP(44), /* stage -> position 0: its parameters, from element `offset` */
    DP_WIRE_PIPE_STATE = DP_FRAME_APP(45),  /* stage -> position 0 at checkpoint `step`: u64 optimiser t, parameters, optimiser slots */
    DP_WIRE_PIPE_NORM = DP_FRAME_APP(46),   /* stage `offset` -> its replica's others: f64, the sum of squares of its part of the step's gradient (--clip-norm) */
    DP_WIRE_PIPE_BUFFERS = DP_FRAME_APP(47), /* stage -> position 0 after its PARAMS or STATE (step = the epoch or checkpoint step, offset = its first buffer): u32 count (its layers' buffers, checked against the model), then f32 (pipeline.c send_buffers) */
    /* model parallelism (src/strategy/model_parallel.c); step = the training step */
    DP_WIRE_MP_ACT = DP_FRAME_APP(48),      /* task -> its replica's others: its columns of dense layer `offset`'s output, f32 (rows, units) */
    DP_WIRE_MP_STATS = DP_FRAME_APP(49),    /* task -> position 0 at epoch `step`'s end: 3 f64, u32 task (model_parallel.c send_stats) */
    DP_WIRE_MP_PARAMS = DP_FRAME_APP(50),   /* replica 0's task `offset` -> position 0: its slices, compact (mp_slice.h) */
    DP_WIRE_MP_STATE = DP_FRAME_APP(51),    /* replica 0's task `offset` -> position 0 at checkpoint `step`: u64 optimiser t, slices, optimiser slots */
    DP_WIRE_MP_GRAD = DP_FRAME_APP(52),     /* task -> a replica peer: its part of dense layer `offset`'s input gradient, the peer's columns, f32 (rows, units) */
    /* spatial model parallelism of image layers (mp_replica.c; docs/architecture.md, "Model parallelism") */
    DP_WIRE_MP_ROWS = DP_FRAME_APP(53),     /* task -> a replica peer: rows [a, b) of image layer `offset`'s output that the peer's next layer reads (a halo, or its band for a whole-map layer), f32 (records, b-a, ow, oc) */
    DP_WIRE_MP_ROWS_GRAD = DP_FRAME_APP(54), /* task -> a replica peer: its part of the gradient at image layer `offset`'s output, rows [a, b), f32 (records, b-a, ow, oc); `offset` = the layer count: the part at the first dense layer's input, f32 (records, in) */
    DP_WIRE_MP_FILTERS = DP_FRAME_APP(55),  /* task -> a replica peer: conv layer `offset`'s filters it holds (weights then biases of its output channels), f32; `offset` + 64: its part of the peer's filters' gradient */
    DP_WIRE_MP_NORM = DP_FRAME_APP(64),     /* task `offset` -> its replica's others: f64, the sum of squares of its slices' gradient (--clip-norm; also ps_family.c's replicas) */
    /* Sandblaster L-BFGS (src/strategy/lbfgs.c, lbfgs_shard.c, lbfgs_impl.h) */
    DP_WIRE_LB_OP = DP_FRAME_APP(56),       /* chief -> ps: vector op number `step`, LB_OP_BYTES (lbfgs_impl.h) */
    DP_WIRE_LB_DOTS = DP_FRAME_APP(57),     /* ps -> chief: answer to op `step`: u32 n, n f64 (partial dots; an evaluation's portion count) */
    DP_WIRE_LB_PORTION = DP_FRAME_APP(58),  /* chief -> worker: portion `offset` of evaluation `step`: u32 first record, u32 records */
    DP_WIRE_LB_PULL = DP_FRAME_APP(59),     /* worker -> ps: the point of evaluation `step` */
    DP_WIRE_LB_X = DP_FRAME_APP(60),        /* ps -> worker (step = evaluation; empty: it is over) or chief (step = op): a slice from element `offset` */
    DP_WIRE_LB_GRAD = DP_FRAME_APP(61),     /* worker -> ps: u32 records + the slice of portion `offset`'s mean gradient, evaluation `step` */
    DP_WIRE_LB_RESULT = DP_FRAME_APP(62),   /* worker -> chief: portion `offset` of evaluation `step`: f64 loss sum, u32 correct, u32 records (0: abandoned) */
    DP_WIRE_LB_ITER_END = DP_FRAME_APP(63), /* chief -> workers: L-BFGS iteration `step` is over */
    /* downpour ping (src/cli/cmd_ping.c) */
    DP_WIRE_PING = DP_FRAME_APP(100),
    DP_WIRE_PONG = DP_FRAME_APP(101),
};

static inline void dp_put_f32(uint8_t *p, float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    dp_put_u32(p, u);
}

static inline float dp_get_f32(const uint8_t *p)
{
    uint32_t u = dp_get_u32(p);
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static inline void dp_put_f64(uint8_t *p, double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    dp_put_u64(p, u);
}

static inline double dp_get_f64(const uint8_t *p)
{
    uint64_t u = dp_get_u64(p);
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

#endif
