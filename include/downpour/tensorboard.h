/* TensorBoard event files (docs/tensorboard.md): scalars TensorBoard reads
 * without TensorFlow.  A file is a sequence of TFRecords
 *   uint64 length (LE) | uint32 masked CRC32C of those 8 bytes |
 *   length bytes of data | uint32 masked CRC32C of the data
 * where mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, and each record's
 * data is a protobuf Event (tensorflow/core/util/event.proto):
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
 *             Summary summary = 5; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; }
 * The first record is Event{wall_time, file_version: "brain.Event:2"}; every
 * later one holds one scalar.  Each record goes out in one write(2), so
 * TensorBoard, which polls the file, never reads half of one.  A handle may
 * be shared by threads (a mutex orders the records). */
#ifndef DOWNPOUR_TENSORBOARD_H
#define DOWNPOUR_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"

typedef struct dp_tensorboard dp_tensorboard;

/* The CRC TFRecord frames carry. */
uint32_t dp_tensorboard_mask_crc(uint32_t crc);

/* Makes dir (mkdir -p), and dir/run when run is not NULL (a cluster task's
 * subdirectory, "worker-0"), and creates
 * events.out.tfevents.<unix seconds>.<hostname>.<pid> there (TensorFlow's
 * naming; TensorBoard looks for "tfevents"), with ".<n>" added should that
 * name exist.  Writes the file_version record. */
int dp_tensorboard_open(dp_tensorboard **out, const char *dir, const char *run, dp_err *err);

/* The events file's path. */
const char *dp_tensorboard_path(const dp_tensorboard *tb);

/* Appends one scalar.  wall_time is Unix seconds.  Returns 0, or -1 when the
 * tag is empty or longer than DP_TENSORBOARD_MAX_TAG bytes, or the write
 * failed (now or earlier: like the metrics file, the first failure warns once
 * naming the file, later records are dropped, and close reports it). */
#define DP_TENSORBOARD_MAX_TAG 200
int dp_tensorboard_scalar(dp_tensorboard *tb, const char *tag, int64_t step, double wall_time,
                          float value);

/* Mirrors one metrics event (a JSON object as metrics.h writes it, without
 * the newline) as scalars, under the tags of docs/tensorboard.md:
 *   epoch    -> val/accuracy, val/loss, train/loss, train/learning_rate
 *   steps    -> perf/samples_per_second, perf/step_ms_median, perf/step_ms_p90
 *   resource -> resource/cpu_percent, resource/rss_mib, resource/net_tx_mbytes,
 *               resource/net_rx_mbytes  (step: whole seconds of the event's "t")
 *   done     -> test/accuracy (at the largest step an epoch or steps event had)
 * at the event's "step"; wall time from its "wall", else the clock now.
 * Other events, absent or non-numeric fields are skipped.  Returns the
 * number of scalars written, or -1 on a write failure. */
int dp_tensorboard_metrics_event(dp_tensorboard *tb, const char *json, size_t len);

/* Syncs and closes the file; -1 (naming the file and the error) when any
 * write, the sync or the close failed.  Both free tb; NULL is a no-op. */
int dp_tensorboard_close_check(dp_tensorboard *tb, dp_err *err);
void dp_tensorboard_close(dp_tensorboard *tb);

#endif
