/* Streaming a shard's training records from their files (stream.h,
 * docs/datasets.md "Streaming").
 *
 * Threads: one reader thread (or none: the consumer reads inline) fills
 * record slots, going on from one epoch into the next; the consumer
 * (dp_stream_next) owns the window.  The
 * slots form one pool of window + queue records allocated at open: a slot is
 * free (the reader may decode into it), full (decoded, waiting in the
 * queue) or in the window.  Two rings of slot ids under one mutex pass them
 * between the threads, so a record is decoded once and never copied before
 * its batch.  The order depends only on the sequence of records read (fixed
 * by the epoch's file order) and the window's generator, never on timing. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert.h"
#include "downpour/augment.h"
#include "downpour/clock.h"
#include "downpour/stream.h"

/* The reader's place when $DOWNPOUR_STREAM_READER does not say: the first
 * DECIDE_RECORDS records of a stream are read inline and timed; the rest go
 * to a thread if a record took at least THREAD_MIN_S to read and the
 * machine has two cores.  bench/bench_stream measured (docs/benchmarks.md,
 * "Streaming"): raw 28x28 records read in about 1 us, and a thread changed
 * a training epoch by -5..+5 % (the hand-over, and a core taken from the
 * step's pool); PNG ones in about 13 us, and a thread made the epoch
 * 1.09-2.05x faster.  So no thread where it would not pay. */
#define DECIDE_RECORDS 256
#define THREAD_MIN_S 4e-6

enum { ST_READING, ST_END, ST_ERROR };

struct dp_stream {
    const dp_split *split;
    const dp_stream_source *src;
    dp_shard_policy policy;
    uint32_t k, w;
    uint64_t seed;
    int shuffle, threaded;
    int deciding;         /* the reader's place not chosen yet: timing inline reads */
    double read_s;        /* their seconds */
    uint32_t read_n;      /* and count */
    uint32_t records; /* this shard's, one epoch */
    uint32_t dim;
    size_t stride;        /* bytes of a slot's features, aligned */

    /* the memory: slots, rings, window, file lists, the reserve for a reader */
    uint8_t *feat;    /* (slots, stride) */
    uint8_t *label;   /* (slots) */
    uint32_t *rec;    /* (slots): each record's index in the split, which --augment's
                         draw is keyed on */
    const dp_augment *augment; /* the consumer's, or NULL (dp_stream_augment) */
    uint32_t slots;   /* window + queue */
    uint32_t window, queue;
    size_t alloc_bytes, reserve, bound;

    /* the shard's files, in name order, and the reader's epoch's order */
    uint32_t *files, *order, nf;

    /* reader side: touched by the reader thread only while it runs */
    long rd_epoch;         /* the epoch the reader walks (one ahead at most) */
    uint32_t fi;           /* next position in order */
    dp_record_reader *rd;  /* the open file, or NULL */
    uint64_t left, gap;    /* records of the file's split part still ahead; to skip first */
    dp_err rerr;           /* the reader's refusal */

    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t can_read, can_take;
    /* a sleeping side's wake-up mark (0: awake): it is woken when half a
     * queue of slots is ready, not at every record, so the two threads
     * trade a futex call per half queue, not per record */
    uint32_t read_want, take_want;
    uint32_t *free_ring, free_head, free_n;
    uint32_t *full_ring, full_head, full_n;
    int state, stop;
    size_t reader_peak; /* most bytes a reader has held */
    uint64_t decoded;   /* records decoded since the open (dp_stream_decoded) */
    pthread_t th;
    int running;

    /* consumer side */
    uint32_t *win, count; /* slot ids in the window */
    uint32_t taken;       /* records this epoch took from the reader */
    int filled, input_done, started, failed;
    uint32_t pos;
    long epoch;           /* the consumer's; the reader reads it under mu */
    dp_rng rng;
    dp_err ferr; /* a failed epoch's message, returned again until the next start */
};

/* ---- the shard: which files and records ---- */

/* Records of file f that belong to the split (it may end inside a file). */
static uint64_t split_part(const dp_data_file *f, uint32_t n)
{
    if (f->first >= n)
        return 0;
    uint64_t left = n - f->first;
    return f->records < left ? f->records : left;
}

/* The shard's files, in name order, into list (may be NULL) and *nf, or -1. */
static int shard_files(const dp_split *split, dp_shard_policy p, uint32_t k, uint32_t w,
                       uint32_t *list, uint32_t *nf, dp_err *err)
{
    const dp_data_split_files *fs = split->stream->files;
    uint32_t held = 0, mine = 0;
    for (size_t f = 0; f < fs->n; f++) {
        if (split_part(&fs->files[f], split->n) == 0)
            continue;
        if (p != DP_SHARD_FILE || held % w == k) {
            if (list)
                list[mine] = (uint32_t)f;
            mine++;
        }
        held++;
    }
    if (p == DP_SHARD_FILE && held < w)
        return dp_errf(err, "FILE sharding gives each worker whole files, but the training split "
                       "has %u files for %u workers: use --shard data, or more files (downpour "
                       "data convert --shards %u or more)", held, w, w);
    *nf = mine;
    return 0;
}

int dp_stream_shard_records(const dp_split *split, dp_shard_policy policy, int k, int w,
                            uint32_t *n, dp_err *err)
{
    if (!split || !split->stream || !split->stream->files)
        return dp_errf(err, "stream: the split has no record files");
    if ((unsigned)policy >= DP_SHARD_COUNT)
        return dp_errf(err, "stream: unknown shard policy %d", (int)policy);
    if (w < 1 || k < 0 || k >= w)
        return dp_errf(err, "stream: shard %d of %d is out of range", k, w);
    const dp_data_split_files *fs = split->stream->files;
    if (split->n > fs->records)
        return dp_errf(err, "stream: the split's %u records are more than its files' %" PRIu64,
                       split->n, fs->records);
    uint32_t nf;
    if (shard_files(split, policy, (uint32_t)k, (uint32_t)w, NULL, &nf, err) < 0)
        return -1;
    uint64_t total = 0;
    if (policy == DP_SHARD_FILE) {
        uint32_t held = 0;
        for (size_t f = 0; f < fs->n; f++) {
            uint64_t part = split_part(&fs->files[f], split->n);
            if (part && held++ % (uint32_t)w == (uint32_t)k)
                total += part;
        }
    } else if (policy == DP_SHARD_DATA) {
        total = (uint32_t)k < split->n ? ((uint64_t)split->n - (uint32_t)k + (uint32_t)w - 1) /
                                             (uint32_t)w
                                       : 0;
    } else {
        total = split->n;
    }
    if (total == 0)
        return dp_errf(err, "stream: shard %d of %d (policy %s) of a %u-record split owns no "
                       "records", k, w, dp_shard_name(policy), split->n);
    *n = (uint32_t)total;
    return 0;
}

/* ---- the reader: the next owned record of the epoch's files ---- */

/* The reserve for a file reader: what one holds after reading the first
 * record of `file`, with room for later records twice its size
 * (dp_record_reader_reserve counts it: records.h).  Measured, not guessed,
 * so a gzip file's zlib state, the Example's arrays and a PNG's decoding
 * are in it.  `room` is what the bound leaves the reader: the record is
 * read under that cap, unless the open reader alone passes it, when the
 * caller refuses the bound and the record is read only to tell it the
 * whole reserve.  The probe reader and its record are freed before the
 * stream allocates anything. */
static int probe_reserve(const dp_stream_source *src, size_t file, size_t room,
                         size_t *reserve, dp_err *err)
{
    const dp_data_file *f = &src->files->files[file];
    dp_record_reader *rd;
    if (dp_record_open(&rd, f, src->format, &src->shape, &src->opt, err) < 0)
        return -1;
    if (dp_record_reader_bytes(rd) <= room)
        dp_record_limit(rd, room);
    void *rec = malloc((size_t)src->shape.dim * dp_value_size(src->shape.kind));
    uint8_t label;
    int rc = rec ? dp_record_next(rd, rec, &label, err)
                 : dp_errf(err, "stream: out of memory for a record of %s", f->path);
    *reserve = dp_record_reader_reserve(rd);
    free(rec);
    dp_record_close(rd);
    return rc < 0 ? -1 : 0;
}

/* The first file of the shard (its files are taken in name order), or -1. */
static long first_shard_file(const dp_split *split, dp_shard_policy p, uint32_t k, uint32_t w)
{
    const dp_data_split_files *fs = split->stream->files;
    uint32_t held = 0;
    for (size_t f = 0; f < fs->n; f++) {
        if (split_part(&fs->files[f], split->n) == 0)
            continue;
        if (p != DP_SHARD_FILE || held % w == k)
            return (long)f;
        held++;
    }
    return -1;
}

/* The reader's walk set to the start of epoch e: its files' order, from
 * (seed, e) alone (a generator apart from the window's draws, so the reader
 * can set it up while the consumer still draws from the last epoch). */
static void walk_epoch(dp_stream *s, long e)
{
    s->rd_epoch = e;
    s->fi = 0;
    memcpy(s->order, s->files, (size_t)s->nf * sizeof *s->order);
    if (s->shuffle) {
        dp_rng r;
        dp_rng_seed(&r, dp_data_epoch_seed(~s->seed, e));
        dp_rng_shuffle(&r, s->order, s->nf);
    }
}

static int reader_open_next(dp_stream *s, dp_err *err)
{
    const dp_data_file *f = &s->src->files->files[s->order[s->fi]];
    if (dp_record_open(&s->rd, f, s->src->format, &s->src->shape, &s->src->opt, err) < 0)
        return -1;
    /* A record too large for what the bound leaves is refused before it is
     * read (TFRecord); produce checks the rest after each record. */
    dp_record_limit(s->rd, s->bound - s->alloc_bytes);
    s->left = split_part(f, s->split->n);
    /* DATA: the first record of this file whose split index is k mod w */
    s->gap = s->policy == DP_SHARD_DATA ? (s->k + s->w - (uint32_t)(f->first % s->w)) % s->w : 0;
    return 0;
}

static int short_file(const dp_stream *s, dp_err *err)
{
    const dp_data_file *f = &s->src->files->files[s->order[s->fi]];
    return dp_errf(err, "%s: ends after record %" PRIu64 "; it held %" PRIu64 " records when the "
                   "dataset was counted (was it changed?)", f->path, dp_record_index(s->rd),
                   f->records);
}


/* Makes s->rd a reader of a file still holding records this shard owns,
 * closing the ones used up and opening the next: 1 ready, 0 when the
 * shard's files are done, -1 with err. */
static int reader_with_ours(dp_stream *s, dp_err *err)
{
    for (;;) {
        if (!s->rd) {
            if (s->fi >= s->nf)
                return 0;
            if (reader_open_next(s, err) < 0)
                return -1;
        }
        if (s->gap < s->left)
            return 1;
        dp_record_close(s->rd); /* nothing more of this file is ours */
        s->rd = NULL;
        s->fi++;
    }
}

/* Decodes the next record this shard owns into slot id: 1, 0 at the
 * epoch's end, -1 with err naming the file and record. */
static int produce(dp_stream *s, uint32_t id, size_t *reader_bytes, dp_err *err)
{
    for (;;) {
        int more = reader_with_ours(s, err);
        if (more <= 0)
            return more;
        if (s->gap) {
            int64_t got = dp_record_skip(s->rd, s->gap, err);
            if (got < 0)
                return -1;
            if ((uint64_t)got < s->gap)
                return short_file(s, err);
            s->left -= s->gap;
        }
        int rc = dp_record_next(s->rd, s->feat + (size_t)id * s->stride, &s->label[id], err);
        if (rc < 0)
            return -1;
        if (rc == 0)
            return short_file(s, err);
        s->rec[id] = (uint32_t)(s->src->files->files[s->order[s->fi]].first +
                                dp_record_index(s->rd) - 1);
        s->left--;
        s->gap = s->policy == DP_SHARD_DATA ? s->w - 1 : 0;
        *reader_bytes = dp_record_reader_bytes(s->rd);
        if (s->alloc_bytes + *reader_bytes > s->bound) { /* past the reserve, and past the rest */
            const dp_data_file *f = &s->src->files->files[s->order[s->fi]];
            return dp_errf(err, "%s: record %" PRIu64 ": the file's reader holds %zu bytes, "
                           "more than the %zu the memory bound of %zu bytes leaves it beside "
                           "the window and queue (%zu bytes): raise the bound",
                           f->path, dp_record_index(s->rd) - 1, *reader_bytes,
                           s->bound - s->alloc_bytes, s->bound, s->alloc_bytes);
        }
        return 1;
    }
}

static void ring_push(uint32_t *ring, uint32_t cap, uint32_t head, uint32_t *n, uint32_t id)
{
    ring[(head + *n) % cap] = id;
    (*n)++;
}

static uint32_t ring_pop(const uint32_t *ring, uint32_t cap, uint32_t *head, uint32_t *n)
{
    uint32_t id = ring[*head];
    *head = (*head + 1) % cap;
    (*n)--;
    return id;
}

/* The reader thread.  At the end of an epoch's files it goes straight on to
 * the next epoch's (the usual next call is its start), filling the slots the
 * draining window frees, so the next window is full before it is asked for;
 * but it never gets more than one epoch ahead of the consumer. */
static void *reader_main(void *arg)
{
    dp_stream *s = arg;
    dp_err e;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        if (s->free_n == 0 && !s->stop) {
            s->read_want = s->queue / 2 ? s->queue / 2 : 1;
            while (s->free_n < s->read_want && !s->stop)
                pthread_cond_wait(&s->can_read, &s->mu);
            s->read_want = 0;
        }
        if (s->stop) {
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        uint32_t id = ring_pop(s->free_ring, s->slots, &s->free_head, &s->free_n);
        pthread_mutex_unlock(&s->mu);

        size_t rb = 0;
        e.msg[0] = 0;
        int rc = produce(s, id, &rb, &e);

        pthread_mutex_lock(&s->mu);
        if (rb > s->reader_peak)
            s->reader_peak = rb;
        if (rc == 1) {
            s->decoded++;
            ring_push(s->full_ring, s->slots, s->full_head, &s->full_n, id);
            if (s->take_want && s->full_n >= s->take_want)
                pthread_cond_signal(&s->can_take);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        ring_push(s->free_ring, s->slots, s->free_head, &s->free_n, id);
        pthread_cond_signal(&s->can_take);
        if (rc < 0) {
            s->state = ST_ERROR;
            s->rerr = e;
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        while (s->rd_epoch > s->epoch && !s->stop) /* one epoch ahead already */
            pthread_cond_wait(&s->can_read, &s->mu);
        if (s->stop) {
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        long next = s->rd_epoch + 1;
        pthread_mutex_unlock(&s->mu);
        walk_epoch(s, next);
    }
}

/* The reader thread, from the walk's current place. */
static int start_reader(dp_stream *s, dp_err *err)
{
    int e = pthread_create(&s->th, NULL, reader_main, s);
    if (e)
        return dp_errf(err, "stream: cannot start the reader thread: %s", strerror(e));
    s->running = 1;
    return 0;
}

/* The next record read, as a slot id: 1, 0 at the end, -1 with err. */
static int take(dp_stream *s, uint32_t *id, dp_err *err)
{
    if (s->taken == s->records) /* the epoch's records all read (files checked as counted) */
        return 0;
    if (!s->threaded) {
        if (s->state == ST_END)
            return 0;
        *id = ring_pop(s->free_ring, s->slots, &s->free_head, &s->free_n);
        size_t rb = 0;
        double t0 = s->deciding ? dp_now() : 0;
        int rc = produce(s, *id, &rb, err);
        if (rb > s->reader_peak)
            s->reader_peak = rb;
        if (rc != 1) {
            ring_push(s->free_ring, s->slots, s->free_head, &s->free_n, *id);
            s->state = rc == 0 ? ST_END : ST_ERROR;
            return rc;
        }
        s->taken++;
        s->decoded++;
        if (s->deciding) {
            s->read_s += dp_now() - t0;
            if (++s->read_n == DECIDE_RECORDS) {
                s->deciding = 0;
                /* a thread that fails to start leaves the reading inline */
                if (s->read_s >= THREAD_MIN_S * DECIDE_RECORDS &&
                    sysconf(_SC_NPROCESSORS_ONLN) >= 2 && start_reader(s, NULL) == 0)
                    s->threaded = 1;
            }
        }
        return 1;
    }
    /* The epoch's reading starts at its first record asked for, not at its
     * start, so a seek right after a start (a resumed run) finds nothing
     * decoded to drop. */
    if (!s->running && start_reader(s, err) < 0)
        return -1;
    pthread_mutex_lock(&s->mu);
    if (s->full_n == 0 && s->state == ST_READING) {
        uint32_t half = s->queue / 2 ? s->queue / 2 : 1, left = s->records - s->taken;
        s->take_want = half < left ? half : left; /* never more than the epoch has left */
        while (s->full_n < s->take_want && s->state == ST_READING)
            pthread_cond_wait(&s->can_take, &s->mu);
        s->take_want = 0;
    }
    int rc = 1;
    if (s->full_n) {
        *id = ring_pop(s->full_ring, s->slots, &s->full_head, &s->full_n);
        s->taken++;
    } else if (s->state == ST_END)
        rc = 0;
    else {
        rc = -1;
        if (err)
            *err = s->rerr;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static void release(dp_stream *s, uint32_t id)
{
    if (!s->threaded) {
        ring_push(s->free_ring, s->slots, s->free_head, &s->free_n, id);
        return;
    }
    pthread_mutex_lock(&s->mu);
    ring_push(s->free_ring, s->slots, s->free_head, &s->free_n, id);
    if (s->read_want && s->free_n >= s->read_want)
        pthread_cond_signal(&s->can_read);
    pthread_mutex_unlock(&s->mu);
}

/* Ends the epoch's reading: the thread joined, the file closed, every slot
 * free again. */
static void stop_reading(dp_stream *s)
{
    if (s->running) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_broadcast(&s->can_read);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->th, NULL);
        s->running = 0;
    }
    dp_record_close(s->rd);
    s->rd = NULL;
    for (uint32_t i = 0; i < s->slots; i++)
        s->free_ring[i] = i;
    s->free_head = s->full_head = s->full_n = 0;
    s->free_n = s->slots;
    s->state = ST_READING;
    s->stop = 0;
    s->count = 0;
    s->filled = s->input_done = 0;
}

/* ---- the consumer: the window ---- */

static int fail(dp_stream *s, const dp_err *e, dp_err *err)
{
    s->failed = 1;
    s->ferr = *e;
    if (err)
        *err = *e;
    return -1;
}

/* The next record of the epoch's order into x (dim floats) and *y (either
 * may be NULL: a seek): 1, 0 when the epoch is over, -1. */
static int next_record(dp_stream *s, float *x, uint8_t *y, dp_err *err)
{
    dp_err e;
    uint32_t id;
    int rc;
    if (!s->filled) {
        while (s->count < s->window) {
            if ((rc = take(s, &id, &e)) < 0)
                return fail(s, &e, err);
            if (rc == 0) {
                s->input_done = 1;
                break;
            }
            s->win[s->count++] = id;
        }
        s->filled = 1;
    }
    if (s->count == 0)
        return 0;
    uint32_t j = s->shuffle && s->count > 1 ? dp_rng_below(&s->rng, s->count) : 0;
    id = s->win[j];
    const uint8_t *f = s->feat + (size_t)id * s->stride;
    int u8 = s->src->shape.kind == DP_VALUES_U8;
    if (x && s->augment) /* the record's draw, as a gather from memory would make it */
        dp_augment_record(x, u8 ? f : NULL, u8 ? NULL : (const float *)(const void *)f,
                          s->rec[id], s->augment, s->epoch);
    else if (x) {
        if (u8)
            dp_bytes_to_unit(x, f, s->dim);
        else
            memcpy(x, f, (size_t)s->dim * sizeof *x);
    }
    if (y)
        *y = s->label[id];
    release(s, id);
    rc = 0;
    if (!s->input_done && (rc = take(s, &id, &e)) < 0)
        return fail(s, &e, err);
    if (rc == 1) {
        s->win[j] = id;
    } else {
        s->input_done = 1;
        s->win[j] = s->win[--s->count];
    }
    s->pos++;
    return 1;
}

int dp_stream_start_epoch(dp_stream *s, long epoch, dp_err *err)
{
    dp_rng_seed(&s->rng, dp_data_epoch_seed(s->seed, epoch));
    if (s->running && !s->failed && epoch == s->epoch + 1 && s->taken == s->records) {
        /* The usual case: the last epoch was read through, and the reader
         * went on into this one.  Its records wait in the queue in order;
         * what the window still held of the last epoch is dropped. */
        pthread_mutex_lock(&s->mu);
        for (uint32_t i = 0; i < s->count; i++)
            ring_push(s->free_ring, s->slots, s->free_head, &s->free_n, s->win[i]);
        s->epoch = epoch;
        pthread_cond_broadcast(&s->can_read);
        pthread_mutex_unlock(&s->mu);
        s->count = s->taken = s->pos = 0;
        s->filled = s->input_done = 0;
        return 0;
    }
    stop_reading(s);
    s->failed = 0;
    s->pos = s->taken = 0;
    s->epoch = epoch;
    walk_epoch(s, epoch);
    s->started = 1;
    (void)err; /* the reader thread starts at the first take */
    return 0;
}

int dp_stream_next(dp_stream *s, float *x, uint8_t *y, int batch, dp_err *err)
{
    if (!s->started)
        return dp_errf(err, "stream: dp_stream_next before dp_stream_start_epoch");
    if (s->failed) {
        if (err)
            *err = s->ferr;
        return -1;
    }
    int n = 0;
    for (; n < batch; n++) {
        int rc = next_record(s, x + (size_t)n * s->dim, y ? y + n : NULL, err);
        if (rc < 0)
            return -1;
        if (rc == 0)
            break;
    }
    return n;
}

/* ---- the seek: the window at a position, simulated by record index ---- */

static int files_short(const dp_stream *s, dp_err *err)
{
    return dp_errf(err, "stream: the shard's files hold fewer than the %u records counted in "
                   "them (were they changed?)", s->records);
}

/* Moves the walk past the next n records this shard owns without decoding
 * them: dp_record_skip reads through them (TFRecord CRCs still checked),
 * and under DATA through the other workers' records between.  0, or -1
 * with err naming the file and record. */
static int skip_owned(dp_stream *s, uint64_t n, dp_err *err)
{
    uint64_t stride = s->policy == DP_SHARD_DATA ? s->w : 1;
    while (n > 0) {
        int more = reader_with_ours(s, err);
        if (more <= 0)
            return more < 0 ? -1 : files_short(s, err);
        uint64_t here = 1 + (s->left - s->gap - 1) / stride; /* ours left in the file */
        uint64_t k = n < here ? n : here, raw = s->gap + 1 + (k - 1) * stride;
        int64_t got = dp_record_skip(s->rd, raw, err);
        if (got < 0)
            return -1;
        if ((uint64_t)got < raw)
            return short_file(s, err);
        s->left -= raw;
        s->gap = stride - 1; /* as produce leaves it after a record */
        n -= k;
        size_t rb = dp_record_reader_bytes(s->rd); /* (checked against the bound by produce) */
        if (rb > s->reader_peak)
            s->reader_peak = rb;
    }
    return 0;
}

/* Sorts ids[0..n) by key[id] (distinct keys): a heap sort, in place, so
 * the seek allocates nothing. */
static void sift(uint32_t *ids, size_t i, size_t n, const uint32_t *key)
{
    for (size_t c; (c = 2 * i + 1) < n; i = c) {
        if (c + 1 < n && key[ids[c + 1]] > key[ids[c]])
            c++;
        if (key[ids[i]] > key[ids[c]])
            return;
        uint32_t t = ids[i];
        ids[i] = ids[c];
        ids[c] = t;
    }
}

static void sort_by_key(uint32_t *ids, size_t n, const uint32_t *key)
{
    for (size_t i = n / 2; i-- > 0;)
        sift(ids, i, n, key);
    for (size_t end = n; end-- > 1;) {
        uint32_t t = ids[0];
        ids[0] = ids[end];
        ids[end] = t;
        sift(ids, 0, end, key);
    }
}

/* From the epoch's start (nothing read, the reader stopped, the generator
 * fresh) to position pos (1..records) without decoding the records given
 * out before it.  The draws depend only on the generator and on how many
 * records have entered the window, never on their values, so next_record's
 * walk is run first on record indices (their place in the shard's epoch
 * order), in s->win; then the files are read from the start, the records
 * the window holds at pos decoded into slots and every other one skipped.
 * The full ring, empty while the reader is stopped, holds the window's
 * places sorted by index: nothing is allocated. */
static int seek_fresh(dp_stream *s, uint32_t pos, dp_err *err)
{
    uint32_t *win = s->win, count = 0, in = 0; /* in: records entered so far */
    int input_done = 0;
    while (count < s->window) { /* the fill */
        if (in == s->records) {
            input_done = 1;
            break;
        }
        win[count++] = in++;
    }
    for (uint32_t p = 0; p < pos && count > 0; p++) { /* the draws, as next_record's */
        uint32_t j = s->shuffle && count > 1 ? dp_rng_below(&s->rng, count) : 0;
        if (!input_done && in < s->records) {
            win[j] = in++;
        } else {
            input_done = 1;
            win[j] = win[--count];
        }
    }
    uint32_t *place = s->full_ring;
    for (uint32_t i = 0; i < count; i++)
        place[i] = i;
    sort_by_key(place, count, win);

    dp_err e;
    uint32_t next = 0; /* the walk's next record index */
    for (uint32_t i = 0; i < count; i++) {
        uint32_t j = place[i], t = win[j];
        if (skip_owned(s, t - next, &e) < 0)
            return fail(s, &e, err);
        uint32_t id = ring_pop(s->free_ring, s->slots, &s->free_head, &s->free_n);
        size_t rb = 0;
        int rc = produce(s, id, &rb, &e);
        if (rb > s->reader_peak)
            s->reader_peak = rb;
        if (rc <= 0) {
            if (rc == 0)
                files_short(s, &e);
            return fail(s, &e, err);
        }
        s->decoded++;
        win[j] = id;
        next = t + 1;
    }
    if (skip_owned(s, in - next, &e) < 0) /* the records given out after the last kept */
        return fail(s, &e, err);
    s->count = count;
    s->taken = in;
    s->filled = 1;
    s->input_done = input_done;
    s->pos = pos; /* (at most records: every draw before it was made) */
    return 0;
}

int dp_stream_seek(dp_stream *s, uint32_t pos, dp_err *err)
{
    if (!s->started)
        return dp_errf(err, "stream: dp_stream_seek before dp_stream_start_epoch");
    if (pos > s->records)
        pos = s->records;
    int near = pos == s->pos || (s->filled && pos > s->pos && pos - s->pos <= s->window);
    if (!s->failed && near) {
        /* a step or so ahead: drawing on decodes no more than a restart would */
        while (s->pos < pos) {
            int rc = next_record(s, NULL, NULL, err);
            if (rc < 0)
                return -1;
            if (rc == 0)
                break;
        }
        return 0;
    }
    /* behind, far ahead, or failed: the epoch from its start, simulated */
    if (dp_stream_start_epoch(s, s->epoch, err) < 0)
        return -1;
    return pos ? seek_fresh(s, pos, err) : 0;
}

/* ---- open and close ---- */

/* Bytes a stream over src holds beside its reader's reserve: the struct,
 * the two file lists of nf, and queue + window slots (a slot is its
 * features, aligned, its label and its places in the two rings; a window
 * place is one id more); with the reserve added.  *rec and *per_win: a
 * record's bytes and a window place's. */
static size_t stream_bytes(const dp_stream_source *src, size_t reserve, uint32_t nf,
                           uint32_t queue, uint32_t window, size_t *rec, size_t *per_win)
{
    *rec = (size_t)src->shape.dim * dp_value_size(src->shape.kind);
    size_t stride = (*rec + 15) & ~(size_t)15;
    size_t per_slot = stride + 1 + 3 * sizeof(uint32_t); /* label, rec, two ring places */
    *per_win = per_slot + sizeof(uint32_t);
    return sizeof(dp_stream) + 2 * (size_t)nf * sizeof(uint32_t) + reserve +
           (size_t)queue * per_slot + (size_t)window * *per_win;
}

/* " (the dataset's budget of B bytes less the H its test and validation
 * records hold)" when the source says so, else "". */
static void held_note(char *buf, size_t cap, const dp_stream_source *src)
{
    buf[0] = '\0';
    if (src->held)
        snprintf(buf, cap, " (the dataset's memory budget of %zu bytes less the %zu its test "
                 "and validation records hold)", src->memory + src->held, src->held);
}

int dp_stream_least_bytes(const dp_stream_source *src, int max_batch, size_t *out, dp_err *err)
{
    const dp_data_split_files *fs = src ? src->files : NULL;
    if (!fs || max_batch < 1 || src->shape.dim == 0 ||
        (unsigned)src->shape.kind >= DP_VALUES_KIND_COUNT)
        return dp_errf(err, "stream: no record files, or a batch of %d", max_batch);
    size_t first = 0;
    while (first < fs->n && fs->files[first].records == 0)
        first++;
    if (first == fs->n)
        return dp_errf(err, "stream: the training files hold no records");
    size_t reserve, rec, per_win;
    if (probe_reserve(src, first, (size_t)-1, &reserve, err) < 0)
        return -1;
    uint64_t q = 2 * (uint64_t)max_batch, win = (uint64_t)max_batch;
    if (q > fs->records)
        q = fs->records;
    if (win > fs->records)
        win = fs->records;
    *out = stream_bytes(src, reserve, fs->n > UINT32_MAX ? UINT32_MAX : (uint32_t)fs->n,
                        (uint32_t)q, (uint32_t)win, &rec, &per_win);
    return 0;
}

/* $DOWNPOUR_STREAM_READER's choice; *deciding when it makes none (see
 * DECIDE_RECORDS). */
static int choose_threaded(int *threaded, int *deciding, dp_err *err)
{
    const char *v = getenv("DOWNPOUR_STREAM_READER");
    if (v && *v) {
        if (strcmp(v, "thread") == 0)
            *threaded = 1;
        else if (strcmp(v, "inline") == 0)
            *threaded = 0;
        else
            return dp_errf(err, "DOWNPOUR_STREAM_READER is '%s': use thread or inline", v);
        return 0;
    }
    *threaded = 0;
    *deciding = 1;
    return 0;
}

int dp_stream_open(dp_stream **out, const dp_split *split, dp_shard_policy policy, int k, int w,
                   uint64_t seed, int shuffle, int max_batch, dp_err *err)
{
    *out = NULL;
    uint32_t records, nf = 0;
    if (dp_stream_shard_records(split, policy, k, w, &records, err) < 0)
        return -1;
    if (max_batch < 1)
        return dp_errf(err, "stream: the largest batch %d must be at least 1", max_batch);
    const dp_stream_source *src = split->stream;
    if ((unsigned)src->shape.kind >= DP_VALUES_KIND_COUNT || src->shape.dim == 0 ||
        src->shape.dim != split->dim)
        return dp_errf(err, "stream: records of %u values (%s) do not match the split's %u",
                       src->shape.dim, dp_value_kind_name(src->shape.kind), split->dim);
    int threaded = 0, deciding = 0;
    if (choose_threaded(&threaded, &deciding, err) < 0)
        return -1;
    if (shard_files(split, policy, (uint32_t)k, (uint32_t)w, NULL, &nf, err) < 0)
        return -1;

    /* The stream's own bytes for the least window, then the reader's
     * reserve measured within what they leave. */
    size_t rec, per_win, reserve;
    uint32_t queue = (uint32_t)max_batch * 2 < records ? (uint32_t)max_batch * 2 : records;
    uint32_t least = (uint32_t)max_batch < records ? (uint32_t)max_batch : records;
    size_t own = stream_bytes(src, 0, nf, queue, least, &rec, &per_win);
    long first = first_shard_file(split, policy, (uint32_t)k, (uint32_t)w);
    if (first < 0) /* (shard_records refused a shard without records) */
        return dp_errf(err, "stream: shard %d of %d has no file", k, w);
    if (probe_reserve(src, (size_t)first, src->memory > own ? src->memory - own : 0, &reserve,
                      err) < 0)
        return -1;
    size_t base = own - (size_t)least * per_win + reserve, need = own + reserve;
    char note[200], hint[100];
    held_note(note, sizeof note, src);
    if (src->held)
        snprintf(hint, sizeof hint, "raise the budget (--data-memory) to at least %zu",
                 need + src->held);
    else
        snprintf(hint, sizeof hint, "raise it to at least that");
    if (src->memory < need)
        return dp_errf(err, "stream: a memory bound of %zu bytes%s is too small: the reader's "
                       "buffers (%zu bytes), a queue of %u and a window of %u records of %zu "
                       "bytes need %zu; %s", src->memory, note, reserve, queue, least, rec, need,
                       hint);
    uint64_t window = src->window;
    if (window == 0) {
        window = (src->memory - base) / per_win;
    } else if (base + (size_t)window * per_win > src->memory) {
        size_t want = base + (size_t)window * per_win;
        return dp_errf(err, "stream: a window of %u records of %zu bytes, with the reader's "
                       "buffers (%zu bytes) and a queue of %u records, needs %zu bytes, above "
                       "the memory bound of %zu%s: a smaller window, or %s of at least %zu",
                       src->window, rec, reserve, queue, want, src->memory, note,
                       src->held ? "a budget (--data-memory)" : "a bound", want + src->held);
    }
    if (window > records)
        window = records;
    if (!shuffle)
        window = 1; /* file order: a window of one gives it */
    size_t stride = (rec + 15) & ~(size_t)15;

    dp_stream *s = calloc(1, sizeof *s);
    if (!s)
        return dp_errf(err, "stream: out of memory");
    s->split = split;
    s->src = src;
    s->policy = policy;
    s->k = (uint32_t)k;
    s->w = (uint32_t)w;
    s->seed = seed;
    s->shuffle = shuffle != 0;
    s->threaded = threaded;
    s->deciding = deciding;
    s->records = records;
    s->dim = src->shape.dim;
    s->stride = stride;
    s->window = (uint32_t)window;
    s->queue = queue;
    s->slots = s->window + queue;
    s->reserve = reserve;
    s->bound = src->memory;
    s->nf = nf;
    s->feat = malloc((size_t)s->slots * stride);
    s->label = malloc(s->slots);
    s->rec = malloc((size_t)s->slots * sizeof(uint32_t));
    s->free_ring = malloc((size_t)s->slots * sizeof(uint32_t));
    s->full_ring = malloc((size_t)s->slots * sizeof(uint32_t));
    s->win = malloc((size_t)s->window * sizeof(uint32_t));
    s->files = malloc((size_t)(nf ? nf : 1) * sizeof(uint32_t));
    s->order = malloc((size_t)(nf ? nf : 1) * sizeof(uint32_t));
    int mu = pthread_mutex_init(&s->mu, NULL) == 0;
    int c1 = mu && pthread_cond_init(&s->can_read, NULL) == 0;
    int c2 = c1 && pthread_cond_init(&s->can_take, NULL) == 0;
    if (!s->feat || !s->label || !s->rec || !s->free_ring || !s->full_ring || !s->win || !s->files ||
        !s->order || !c2) {
        if (c1)
            pthread_cond_destroy(&s->can_read);
        if (mu)
            pthread_mutex_destroy(&s->mu);
        free(s->feat), free(s->label), free(s->rec), free(s->free_ring), free(s->full_ring), free(s->win);
        free(s->files), free(s->order), free(s);
        return dp_errf(err, "stream: out of memory for %u records of %zu bytes",
                       (uint32_t)window + queue, rec);
    }
    shard_files(split, policy, (uint32_t)k, (uint32_t)w, s->files, &nf, NULL);
    s->alloc_bytes = stream_bytes(src, 0, nf, queue, s->window, &rec, &per_win);
    stop_reading(s); /* every slot free */
    *out = s;
    return 0;
}

uint32_t dp_stream_records(const dp_stream *s) { return s ? s->records : 0; }
uint32_t dp_stream_window(const dp_stream *s) { return s ? s->window : 0; }
int dp_stream_threaded(const dp_stream *s) { return s ? s->threaded : 0; }

void dp_stream_augment(dp_stream *s, const dp_augment *a)
{
    s->augment = dp_augment_on(a) ? a : NULL;
}

size_t dp_stream_peak_bytes(const dp_stream *s)
{
    if (!s)
        return 0;
    pthread_mutex_lock((pthread_mutex_t *)&s->mu);
    size_t rb = s->reader_peak;
    pthread_mutex_unlock((pthread_mutex_t *)&s->mu);
    return s->alloc_bytes + rb;
}

uint64_t dp_stream_decoded(const dp_stream *s)
{
    if (!s)
        return 0;
    pthread_mutex_lock((pthread_mutex_t *)&s->mu);
    uint64_t n = s->decoded;
    pthread_mutex_unlock((pthread_mutex_t *)&s->mu);
    return n;
}

void dp_stream_close(dp_stream *s)
{
    if (!s)
        return;
    stop_reading(s);
    pthread_cond_destroy(&s->can_read);
    pthread_cond_destroy(&s->can_take);
    pthread_mutex_destroy(&s->mu);
    free(s->feat);
    free(s->label);
    free(s->rec);
    free(s->free_ring);
    free(s->full_ring);
    free(s->win);
    free(s->files);
    free(s->order);
    free(s);
}
