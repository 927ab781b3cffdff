/* Gradient clipping by the global norm, as torch.nn.utils.clip_grad_norm_
 * (docs/training.md, "Gradient clipping"): with the norm of the whole
 * gradient, every element is multiplied by min(1, max_norm / (norm + 1e-6)).
 * A gradient split into parts (shards, stages, slices) sums the parts'
 * squares first and scales each part by the coefficient of the sum. */
#ifndef DOWNPOUR_CLIP_H
#define DOWNPOUR_CLIP_H

#include <stddef.h>

/* The sum of g[i]^2 in double, in a fixed order: the same bits for the same
 * g on any machine and thread count. */
double dp_grad_sumsq(const float *g, size_t n);
/* min(1, max_norm / (sqrt(sumsq) + 1e-6)), rounded to float once. */
float dp_clip_coef(double sumsq, float max_norm);
/* g *= c; c = 1 leaves g as it is (not touched). */
void dp_grad_scale(float *g, size_t n, float c);
/* The three for a whole gradient: returns its norm before clipping. */
double dp_grad_clip(float *g, size_t n, float max_norm);

#endif
