/* A timeline of a run (docs/trace.md): spans of work (compute, wait, push,
 * pull, all-reduce buckets, checkpoint, evaluation) recorded per thread and
 * written at the end in the Chrome trace event format, which Perfetto
 * (ui.perfetto.dev) and chrome://tracing open:
 *   {"traceEvents":[{"name":"compute","cat":"compute","ph":"X","pid":P,
 *     "tid":T,"ts":US,"dur":US}, ...]}
 * pid is the task's index in the cluster (0 alone), tid a thread number of
 * the process, ts wall-clock microseconds (Unix time) so the files of tasks
 * on one machine share one time axis, and dur microseconds.
 *
 * Recording is cheap: each thread that records gets one preallocated ring
 * of DP_TRACE_RING spans at its first span, so a span is two clock reads
 * and a store, with no allocation and no lock; a ring that fills keeps the
 * newest spans (a subset of nested spans still nests) and counts the rest.
 * Times are the monotonic clock (dp_now), shifted once to the wall clock,
 * so spans of one thread nest exactly as they were taken. */
#ifndef DOWNPOUR_TRACE_H
#define DOWNPOUR_TRACE_H

#include <stdbool.h>

#include "downpour/status.h"

/* Spans each recording thread keeps. */
#define DP_TRACE_RING 32768

/* Starts recording for this process: pid (the task's index), process_name
 * (its task name, "worker:0"), written to path at dp_trace_close.  Only one
 * trace per process; a second open is an error. */
int dp_trace_open(const char *path, int pid, const char *process_name, dp_err *err);

/* Whether spans are being recorded (a plain load: callers test it before
 * taking times they would only trace). */
bool dp_trace_enabled(void);

/* One complete span from t0 to t1 (dp_now() seconds) on the calling
 * thread.  name and cat must be string literals (kept by address).  arg,
 * when >= 0, is written as args.n (an all-reduce bucket's number).  No-op
 * when not recording. */
void dp_trace_span(const char *name, const char *cat, double t0, double t1, int arg);

/* A span of computation (forward and backward): traced as "compute" when
 * recording, and always added to the calling thread's compute total, which
 * the training loop reads per step to tell a task slow at computing from
 * one that waits on others (docs/reports.md, "Stragglers"). */
void dp_trace_compute(const char *name, double t0, double t1);

/* Seconds of computation the calling thread has recorded so far. */
double dp_trace_thread_compute(void);

/* Stops recording and writes every thread's spans to the path given at
 * open (replaced atomically), with process and thread names as metadata.
 * Threads must have stopped recording.  No-op when no trace is open. */
int dp_trace_close(dp_err *err);

/* Merges the trace files of a cluster's tasks into one at path (every
 * event of each, in order; a missing file is a warning), for `launch`.
 * Their timestamps are wall-clock microseconds already, so they share one
 * axis as they are. */
int dp_trace_merge(const char *path, const char *const *inputs, int n, dp_err *err);

#endif
