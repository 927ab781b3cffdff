/* What the executor needs of an open device (private to src/device/): its
 * backend table and the backend's context.  device.c defines them. */
#ifndef DP_DEVICE_IMPL_H
#define DP_DEVICE_IMPL_H

#include "device/backend.h"
#include "downpour/device.h"

const dp_backend *dp_device_backend(const dp_device *d);
void *dp_device_ctx(const dp_device *d);

#endif
