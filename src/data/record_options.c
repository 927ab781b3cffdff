/* What a dataset of record files is read as: its format's and value
 * kinds' names and sizes, and the options with their defaults filled in
 * (include/downpour/records.h).  Below both files.c and records.c. */
#include <stddef.h>

#include "records_impl.h"

const char *dp_data_format_name(dp_data_format f)
{
    switch (f) {
    case DP_DATA_TFRECORD: return "tfrecord";
    case DP_DATA_NPY: return "npy";
    case DP_DATA_CSV: return "csv";
    default: return "unknown";
    }
}

const char *dp_value_kind_name(dp_value_kind k)
{
    return k == DP_VALUES_U8 ? "uint8" : k == DP_VALUES_F32 ? "float32" : "unknown";
}

size_t dp_value_size(dp_value_kind k) { return k == DP_VALUES_U8 ? 1 : 4; }

void dp_data_options_default(dp_data_options *o)
{
    o->image = "image";
    o->label = NULL; /* an Example's "label"; a CSV picks its column */
    o->train = "*train*";
    o->test = "*test*";
    o->classes = 0;
}

void dp_data_options_resolve(dp_data_options *out, const dp_data_options *opt)
{
    dp_data_options_default(out);
    if (!opt)
        return;
    if (opt->image)
        out->image = opt->image;
    out->label = opt->label;
    if (opt->train)
        out->train = opt->train;
    if (opt->test)
        out->test = opt->test;
    out->classes = opt->classes;
}

uint32_t dp_data_classes(const dp_data_options *opt)
{
    return opt && opt->classes ? opt->classes : 256;
}
