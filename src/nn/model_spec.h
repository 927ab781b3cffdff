/* The --model grammar (docs/models.md): a spec string to the sequence of
 * layers with their shapes, parameter offsets and canonical spelling.  Private
 * to src/nn: dp_model_init is its one caller, and the layer kinds' files
 * (layer_kind.h) build their layers with the helpers below. */
#ifndef DOWNPOUR_NN_MODEL_SPEC_H
#define DOWNPOUR_NN_MODEL_SPEC_H

#include <stdbool.h>
#include <stddef.h>

#include "downpour/layer_kind.h"
#include "downpour/model.h"

#define DP_SPEC_MAX_WIDTH 65536
#define DP_SPEC_MAX_DIM 16384 /* an image side or channel count */

/* The parser's state: where it is in the spec, and the shape so far. */
typedef struct dp_spec_parser {
    dp_model *m;
    const char *shown;  /* the spec as the user gave it (a preset's name) */
    const char *tok;    /* the current token */
    int tok_len, tok_no;
    bool last;          /* the current token is the last (the classes) */
    int c, h, w;        /* the current activations' shape */
    bool hwc;           /* stored NHWC (an image layer's output) */
    bool flat;          /* after a dense or a flatten: no image layer may follow */
    size_t off;         /* parameters assigned so far */
    size_t boff;        /* buffers assigned so far */
    size_t spec_len;
    dp_err *err;
} dp_spec_parser;

/* Fills m->layers, n_layers, n_dense, n_params (offsets assigned layer after
 * layer), spec (canonical) and name (the preset's, else the spec).  Nothing
 * is allocated.  An error names the token and says what would be accepted. */
int model_spec_parse(dp_model *m, const char *spec, dp_err *err);

/* ---- for the kinds' parse and emit (layer_kind.h) ---- */

/* Fails naming the spec and the current token; returns -1. */
int dp_spec_fail(dp_spec_parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends to the canonical spelling. */
void dp_spec_emit(dp_spec_parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Digits at *s as a value in [min, max]; advances *s.  -1: no digits; -2:
 * out of range. */
long dp_spec_num(const char **s, const char *end, long min, long max);
/* A new layer whose input and output are the current shape (NULL: failed). */
dp_layer *dp_spec_add(dp_spec_parser *p, dp_layer_kind kind);
/* The layer's output shape becomes the current one. */
int dp_spec_out(dp_spec_parser *p, dp_layer *d, int oc, int oh, int ow);
/* The layer's weights and bias, next in the flat buffer. */
int dp_spec_params(dp_spec_parser *p, dp_layer *d, size_t w_len, size_t b_len);
/* The layer's buffers, next in the flat buffer array. */
void dp_spec_buffers(dp_spec_parser *p, dp_layer *d, size_t len);
/* Before a layer that works on images: the input must be one, stored NHWC
 * (an hwc layer is inserted for several channels). */
int dp_spec_need_image(dp_spec_parser *p);
/* Before a dense layer or at flatten: the activations become flat (a
 * flatten layer is inserted for an image of several channels). */
int dp_spec_to_flat(dp_spec_parser *p);
/* A dense layer of n units, a relu after it when relu. */
int dp_spec_dense(dp_spec_parser *p, long n, bool relu);
/* The window of a token at *s: KHxKWxOC when oc is non-NULL, else K or KHxKW;
 * then its options s<stride> and p<pad>, in any order, up to end. */
int dp_spec_window_size(dp_spec_parser *p, const char **s, const char *end, int *kh, int *kw,
                        int *oc);
int dp_spec_window_opts(dp_spec_parser *p, const char *s, const char *end, int *stride,
                        int *pad);
/* d's window over the current shape. */
int dp_spec_window(dp_spec_parser *p, dp_layer *d, int kh, int kw, int stride, int pad);

#endif
