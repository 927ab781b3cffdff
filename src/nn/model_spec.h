/* The --model grammar (docs/models.md): a spec string to the sequence of
 * layers with their shapes, parameter offsets and canonical spelling.  Private
 * to src/nn: dp_model_init is its one caller. */
#ifndef DOWNPOUR_NN_MODEL_SPEC_H
#define DOWNPOUR_NN_MODEL_SPEC_H

#include "downpour/model.h"

/* Fills m->layers, n_layers, n_dense, n_params (offsets assigned layer after
 * layer), spec (canonical) and name (the preset's, else the spec).  Nothing
 * is allocated.  An error names the token and says what would be accepted. */
int model_spec_parse(dp_model *m, const char *spec, dp_err *err);

#endif
