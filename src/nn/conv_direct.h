/* Direct NHWC convolution on the CPU, without lowering (conv_direct.c;
 * docs/architecture.md, "Image layers"): AVX-512 and AVX2 microkernels that
 * give the same bits.  A conv layer takes each of its three products
 * directly when the shape and the instruction-set cap allow (the _ok
 * tests), else through the lowered GEMM path (layer_window.c). */
#ifndef DOWNPOUR_NN_CONV_DIRECT_H
#define DOWNPOUR_NN_CONV_DIRECT_H

#include <stdbool.h>
#include <stddef.h>

#include "downpour/layer_kind.h"

/* On (the default) or off for the whole process: off, every conv takes the
 * lowered path, the products a device runs (tests/test_device_model.c
 * compares a device with it: a max pool picks between near-equal values by
 * their last bits, so its reference sums in the device's order). */
void dp_conv_direct_enable(bool on);

/* out from in (bias, and relu when c->relu); the filters are repacked into
 * c->rows, which must hold d->w_len floats (the model plans it so).  Needs
 * d->oc % 16 == 0 and AVX2. */
bool dp_conv_direct_forward_ok(const dp_layer *d);
void dp_conv_direct_forward(const dp_layer_call *c);
/* din (overwritten) from dout, the filters repacked into c->drows (as
 * many floats): d->c % 16 == 0. */
bool dp_conv_direct_data_ok(const dp_layer *d);
void dp_conv_direct_data(const dp_layer_call *c);
/* gw and gb (overwritten) from dout and in: d->c % 16 == 0, d->oc % 8 == 0. */
bool dp_conv_direct_weights_ok(const dp_layer *d);
void dp_conv_direct_weights(const dp_layer_call *c);

#endif
