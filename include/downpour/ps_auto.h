/* --compress auto under the ps family (docs/strategies.md, "ps family:
 * compression"): each worker times a pull of the whole model from the
 * servers (its link as it is, shared with the other workers) and the top-k
 * coder on its largest shard, and predicts a step's frames, pushes and
 * answers, for f32 and for top-k of each ratio of the ladder, coded both
 * ways (the servers answer a coded push with the 4-bit difference from the
 * worker's copy, compress.h dp_delta4_encode). */
#ifndef DOWNPOUR_PS_AUTO_H
#define DOWNPOUR_PS_AUTO_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"

#define DP_PS_AUTO_N_RATIOS 4
#define DP_PS_AUTO_RATIOS {0.01, 0.02, 0.05, 0.1}
#define DP_PS_AUTO_MAX_RATIO 0.1
/* as allreduce's PowerSGD rule (allreduce_auto.h): the largest ratio
 * predicted within a third of f32 keeps a 3x gain on the link and spends
 * the rest on accuracy */
#define DP_PS_AUTO_MARGIN 3.0

typedef struct dp_ps_auto {
    double ratio;      /* the choice: top-k at this ratio both ways; 0: f32 */
    double t_none;     /* a step's frames predicted, f32 (s) */
    double t[DP_PS_AUTO_N_RATIOS]; /* ... and at each ratio, the coders included */
    char why[512];
} dp_ps_auto;

/* The rule on numbers: shard sizes n[0..k), the link's seconds per byte
 * (one worker's share, as measured), the coder's seconds per float (one
 * top-k encode; a coded step has two: the push and its answer).  Fills a
 * and returns a->ratio. */
double dp_ps_auto_rule(dp_ps_auto *a, const size_t *n, int k, double s_per_byte,
                       double codec_s_per_float);

/* A choice as a code, as the wire and the chief keep it (docs/strategies.md,
 * "ps family: compression"): 0 none taken yet, 1 none, 2 + i the ladder's
 * ratio i.  Each worker slot's choice is taken once and kept for the run:
 * its PROGRESS and CKPT_READY frames say it (their offset), the chief
 * writes every slot's in the checkpoint and hands it to a worker restarted
 * into the slot (its START). */
#define DP_PS_AUTO_UNSET 0
#define DP_PS_AUTO_NONE 1
#define DP_PS_AUTO_CODES (DP_PS_AUTO_N_RATIOS + 2)
uint32_t dp_ps_auto_code(double ratio); /* the ladder's ratios, or 0 for none */
double dp_ps_auto_ratio(uint32_t code); /* code 1.. : 0 for none; -1 for unset or invalid */
/* "none", "topk:0.1", or "-" for unset */
void dp_ps_auto_name(uint32_t code, char *buf, size_t cap);

/* The checkpoint's value (metadata "strategy_state", docs/checkpoints.md):
 * "ps_auto=C,C,..." one choice a worker slot, by dp_ps_auto_name. */
int dp_ps_auto_format(char *buf, size_t cap, const uint32_t *codes, int workers);
/* Reads it back from a checkpoint's strategy_state (NULL: none) into
 * codes[0..workers); a missing value, another count or a choice auto does
 * not take is refused naming file and the field. */
int dp_ps_auto_parse(const char *state, int workers, uint32_t *codes, const char *file,
                     dp_err *err);
/* The code a slot without a choice of its own takes: the lowest slot's
 * that has one (the running job's), else unset (it measures). */
uint32_t dp_ps_auto_fallback(const uint32_t *codes, int workers);

#endif
