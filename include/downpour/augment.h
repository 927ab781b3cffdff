/* Image augmentation of training batches (docs/training.md, "Augmentation"):
 * a random crop with zero padding and a horizontal flip, as torchvision's
 * RandomCrop(size, padding=pad) then RandomHorizontalFlip().  Each record's
 * draw is a function of (seed, epoch, record index in the split) alone, so
 * a resumed run, every worker of any strategy and any thread split give the
 * same record the same augmentation.  Records are images of h x w x c values
 * (HWC, as the datasets store them). */
#ifndef DOWNPOUR_AUGMENT_H
#define DOWNPOUR_AUGMENT_H

#include <stdint.h>

#include "downpour/dataset.h"
#include "downpour/status.h"

#define DP_AUGMENT_MAX_PAD 64

typedef struct dp_augment {
    int pad;          /* crop: shift by -pad..pad rows and columns, zeros in (0: none) */
    int flip;         /* flip left-right with probability 1/2 */
    uint32_t h, w, c; /* the records' shape (dp_augment_check fills it) */
    uint64_t seed;    /* the run's seed (not a worker's) */
} dp_augment;

/* "crop:P,flip", "crop:P", "flip" or "none" into pad and flip; -1 with a
 * message naming --augment for anything else (P in 1..DP_AUGMENT_MAX_PAD). */
int dp_augment_parse(const char *spec, dp_augment *out, dp_err *err);
/* The spec back, as parsed ("crop:4,flip", "none"), for the run's identity. */
void dp_augment_format(const dp_augment *a, char *buf, size_t cap);
/* Whether any transform is on. */
int dp_augment_on(const dp_augment *a);
/* Takes the dataset's image shape: refuses records that are no image (one
 * row or column), and a pad not below both sides, naming --augment. */
int dp_augment_check(dp_augment *a, uint32_t rows, uint32_t cols, uint32_t channels,
                     uint32_t dim, dp_err *err);
/* Record r's draw in epoch `epoch` (0-based): the crop's shift (the output
 * pixel (y, x) is the input's (y + dy, x + dx), zero outside) and the flip. */
void dp_augment_draw(const dp_augment *a, long epoch, uint32_t r, int *dy, int *dx, int *flip);
/* One record r whose values are at bytes (pixels, scaled by 1/255) or, when
 * bytes is NULL, at values, into dst augmented as drawn for `epoch` (a
 * streamed record: stream.h). */
void dp_augment_record(float *dst, const uint8_t *bytes, const float *values, uint32_t r,
                       const dp_augment *a, long epoch);
/* dp_split_gather with record idx[i] augmented as drawn for `epoch`;
 * allocates nothing, and gives the same bits on any thread split. */
void dp_split_gather_augment(float *x, uint8_t *y, const dp_split *s, const uint32_t *idx, int n,
                             const dp_augment *a, long epoch);

#endif
