/* What files.c (finding and counting) and records.c (reading) share inside
 * the library; the contract is include/downpour/records.h. */
#ifndef DOWNPOUR_RECORDS_IMPL_H
#define DOWNPOUR_RECORDS_IMPL_H

#include "downpour/records.h"

/* opt with its NULL fields (or opt NULL) replaced by the defaults; the
 * label stays NULL (a CSV picks its column, an Example reads "label"). */
void dp_data_options_resolve(dp_data_options *out, const dp_data_options *opt);

/* The class count labels must stay below: opt->classes, or 256 for 0. */
uint32_t dp_data_classes(const dp_data_options *opt);

/* The shape of file f's first record: 1 with *shape set, 0 when the file
 * holds no record, -1 on a refusal naming the file and record 0. */
int dp_record_probe(const dp_data_file *f, dp_data_format format, const dp_data_options *opt,
                    dp_record_shape *shape, dp_err *err);

#endif
