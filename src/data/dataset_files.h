/* Datasets of record files behind dp_dataset_open (dataset_files.c):
 * dataset.c dispatches to them.  Private to src/data. */
#ifndef DOWNPOUR_DATA_DATASET_FILES_H
#define DOWNPOUR_DATA_DATASET_FILES_H

#include <stdint.h>

#include "downpour/dataset.h"

/* Opens spec's record files into ds (zeroed by the caller), decoded into a
 * cache or streamed; on -1 the caller closes ds. */
int dp_dataset_files_open(dp_dataset *ds, const char *spec, const dp_dataset_options *o,
                          dp_err *err);

/* A streamed dataset's validation split: training records [first, first+n)
 * decoded into ds's val buffer. */
int dp_dataset_files_val(const dp_dataset *ds, uint32_t first, uint32_t n, dp_split *val,
                         dp_err *err);

/* Frees what dp_dataset_files_open allocated, but not the mapping. */
void dp_dataset_files_close(dp_dataset *ds);

#endif
