/* Private to src/device/: the backend and context under an open device, for
 * the executor (dmodel.c) and tests. */
#ifndef DP_DEVICE_IMPL_H
#define DP_DEVICE_IMPL_H

#include "device/backend.h"
#include "downpour/device.h"

const dp_backend *dp_device_backend(const dp_device *d);
void *dp_device_ctx(const dp_device *d);

#endif
