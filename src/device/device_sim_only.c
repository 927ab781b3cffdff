/* REPLACED AT MERGE BY device.c (the plugin loader, written in parallel):
 * the least of the device API that the executor and its tests need on the
 * dexec branch.  It opens the sim device only; "cuda" parses but does not
 * open here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device_impl.h"

struct dp_device {
    dp_device_spec spec;
    const dp_backend *be;
    void *ctx;
    char desc[128];
};

int dp_device_parse(const char *text, dp_device_spec *out, dp_err *err)
{
    dp_device_spec s = {DP_DEVICE_CPU, 0};
    if (text && strcmp(text, "sim") == 0)
        s.kind = DP_DEVICE_SIM;
    else if (text && strcmp(text, "cuda") == 0)
        s.kind = DP_DEVICE_CUDA;
    else if (!text || strcmp(text, "cpu") != 0)
        return dp_errf(err, "device '%s': expected cpu, cuda or sim (this build's device.c "
                            "is the sim-only stand-in)", text ? text : "");
    *out = s;
    return 0;
}

int dp_device_open(dp_device **out, const dp_device_spec *spec, dp_err *err)
{
    *out = NULL;
    if (spec->kind != DP_DEVICE_SIM)
        return dp_errf(err, "device %s: this build opens only the sim device (device.c "
                            "with the CUDA loader is not merged yet)",
                       spec->kind == DP_DEVICE_CUDA ? "cuda" : "cpu");
    dp_device *d = calloc(1, sizeof *d);
    if (!d)
        return dp_errf(err, "device sim: out of memory");
    char msg[256] = "";
    if (dp_backend_sim.open(&d->ctx, spec->index, msg, sizeof msg) < 0) {
        free(d);
        return dp_errf(err, "%s", msg);
    }
    d->spec = *spec;
    d->be = &dp_backend_sim;
    d->be->describe(d->ctx, d->desc, sizeof d->desc);
    *out = d;
    return 0;
}

void dp_device_close(dp_device *d)
{
    if (!d)
        return;
    d->be->close(d->ctx);
    free(d);
}

const char *dp_device_describe(const dp_device *d) { return d->desc; }
const dp_device_spec *dp_device_spec_of(const dp_device *d) { return &d->spec; }
int dp_device_has_comm(const dp_device *d) { return d->be->comm_allreduce != NULL; }
const dp_backend *dp_device_backend(const dp_device *d) { return d->be; }
void *dp_device_ctx(const dp_device *d) { return d->ctx; }

const char *dp_device_format(const dp_device_spec *spec, char *buf, size_t len)
{
    snprintf(buf, len, "%s", spec->kind == DP_DEVICE_SIM ? "sim" : spec->kind == DP_DEVICE_CUDA ? "cuda:0" : "cpu");
    return buf;
}

const char *dp_device_cuda_unavailable(char *buf, size_t len)
{
    snprintf(buf, len, "no CUDA backend in this build");
    return buf;
}
