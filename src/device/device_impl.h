/* Private to src/device/: the backend and context under an open device, for
 * the executor (dmodel.c) and tests. */
#ifndef DP_DEVICE_IMPL_H
#define DP_DEVICE_IMPL_H

#include "device/backend.h"
#include "downpour/device.h"

/* Opens spec's device through the table be, as dp_device_open does with sim's
 * or the plugin's: tests open a copy of a table with entries left out. */
int dp_device_open_backend(dp_device **out, const dp_backend *be, const dp_device_spec *spec,
                           dp_err *err);
const dp_backend *dp_device_backend(const dp_device *d);
void *dp_device_ctx(const dp_device *d);

#endif
