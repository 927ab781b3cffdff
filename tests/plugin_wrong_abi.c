/* A plugin with the right entry point and the wrong ABI number, which
 * test_device expects dp_device_open to refuse. */
#include "device/backend.h"

const dp_backend *dp_backend_cuda_v1(void);

static const dp_backend wrong = {.abi = DP_BACKEND_ABI + 1000, .name = "wrong"};

const dp_backend *dp_backend_cuda_v1(void) { return &wrong; }
