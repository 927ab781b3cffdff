/* A send queue with a thread of its own: see sender.h. */
#include "downpour/sender.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct job {
    int to;
    unsigned type;
    uint64_t step, offset;
    const void *buf;
    size_t len;
    uint8_t head[DP_SENDER_HEAD]; /* head_len bytes before buf */
    size_t head_len;
} job;

struct dp_sender {
    dp_transport *t;
    job *q;
    int cap;
    long queued, sent; /* frames queued and sent so far: q holds (sent, queued] */
    int stop, failed, failed_peer;
    dp_err err;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started;
};

static void *send_main(void *arg)
{
    dp_sender *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->stop && q->sent == q->queued)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->sent == q->queued || q->failed)
            break;
        job j = q->q[q->sent % q->cap];
        pthread_mutex_unlock(&q->mu);
        dp_err e;
        struct iovec iov[2] = {{j.head, j.head_len}, {(void *)j.buf, j.len}};
        int rc = j.head_len ? dp_transport_sendv(q->t, j.to, j.type, j.step, j.offset, iov, 2, &e)
                            : dp_transport_send(q->t, j.to, j.type, j.step, j.offset, j.buf, j.len, &e);
        pthread_mutex_lock(&q->mu);
        if (rc < 0) {
            q->failed = 1;
            q->failed_peer = j.to;
            q->err = e;
        }
        q->sent++;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

int dp_sender_open(dp_sender **out, dp_transport *t, int cap, dp_err *err)
{
    dp_sender *q = calloc(1, sizeof *q);
    if (!q || !(q->q = calloc((size_t)cap, sizeof *q->q))) {
        free(q);
        return dp_errf(err, "out of memory for a send queue");
    }
    q->t = t;
    q->cap = cap;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    if (pthread_create(&q->thread, NULL, send_main, q) != 0) {
        dp_sender_close(q);
        return dp_errf(err, "cannot start a send thread");
    }
    q->started = 1;
    *out = q;
    return 0;
}

void dp_sender_close(dp_sender *q)
{
    if (!q)
        return;
    if (q->started) {
        pthread_mutex_lock(&q->mu);
        q->stop = 1;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->thread, NULL);
    }
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q->q);
    free(q);
}

static int failed(dp_sender *q, int *peer, dp_err *err)
{
    *peer = q->failed_peer;
    *err = q->err;
    return -1;
}

long dp_sender_push(dp_sender *q, int to, unsigned type, uint64_t step, uint64_t offset,
                    const void *buf, size_t len, int *peer, dp_err *err)
{
    return dp_sender_push_head(q, to, type, step, offset, NULL, 0, buf, len, peer, err);
}

int dp_sender_wait(dp_sender *q, long seq, int *peer, dp_err *err)
{
    pthread_mutex_lock(&q->mu);
    while (!q->failed && q->sent < seq)
        pthread_cond_wait(&q->cv, &q->mu);
    int rc = q->failed ? failed(q, peer, err) : 0;
    pthread_mutex_unlock(&q->mu);
    return rc;
}

long dp_sender_last(const dp_sender *q)
{
    return q->queued; /* only the queueing thread changes it */
}

long dp_sender_push_head(dp_sender *q, int to, unsigned type, uint64_t step, uint64_t offset,
                         const uint8_t *head, size_t head_len, const void *buf, size_t len,
                         int *peer, dp_err *err)
{
    if (head_len > DP_SENDER_HEAD)
        return dp_errf(err, "a %zu-byte head does not fit the send queue's %d", head_len,
                       DP_SENDER_HEAD);
    pthread_mutex_lock(&q->mu);
    while (!q->failed && q->queued - q->sent == q->cap)
        pthread_cond_wait(&q->cv, &q->mu);
    long seq = -1;
    if (q->failed) {
        failed(q, peer, err);
    } else {
        job *j = &q->q[q->queued % q->cap];
        *j = (job){to, type, step, offset, buf, len, {0}, head_len};
        if (head_len)
            memcpy(j->head, head, head_len);
        seq = ++q->queued;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return seq;
}
