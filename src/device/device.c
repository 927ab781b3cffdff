/* Devices: parsing "--device" spellings, and opening one, which for cuda
 * means loading the plugin libdownpour_cuda.so (docs/gpu.md, "Building"). */
#include "downpour/device.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/backend.h"
#include "device/device_impl.h"

#define DP_CUDA_PLUGIN "libdownpour_cuda.so"
#define DP_DEVICE_MAX_INDEX 63
#define DP_DEVICE_SPELLINGS "cpu, cuda, cuda:N (N from 0 to 63), sim"

struct dp_device {
    const dp_backend *be;
    void *ctx;
    dp_device_spec spec;
    char desc[256];
};

int dp_device_parse(const char *text, dp_device_spec *out, dp_err *err)
{
    if (!text)
        return dp_errf(err, "no device given; the accepted spellings are " DP_DEVICE_SPELLINGS);
    dp_device_spec s = {DP_DEVICE_CPU, 0};
    if (strcmp(text, "cpu") == 0) {
        s.kind = DP_DEVICE_CPU;
    } else if (strcmp(text, "sim") == 0) {
        s.kind = DP_DEVICE_SIM;
    } else if (strcmp(text, "cuda") == 0) {
        s.kind = DP_DEVICE_CUDA;
    } else if (strncmp(text, "cuda:", 5) == 0) {
        const char *n = text + 5;
        size_t len = strlen(n);
        if (len == 0 || strspn(n, "0123456789") != len)
            return dp_errf(err, "device \"%s\": the GPU index must be a decimal number; the accepted "
                           "spellings are " DP_DEVICE_SPELLINGS, text);
        /* at most 3 digits are looked at, so the number cannot overflow */
        if (len > 3 || atoi(n) > DP_DEVICE_MAX_INDEX)
            return dp_errf(err, "device \"%s\": the GPU index must be from 0 to %d; the accepted "
                           "spellings are " DP_DEVICE_SPELLINGS, text, DP_DEVICE_MAX_INDEX);
        s.kind = DP_DEVICE_CUDA;
        s.index = atoi(n);
    } else {
        return dp_errf(err, "device \"%s\" is not known; the accepted spellings are " DP_DEVICE_SPELLINGS,
                       text);
    }
    *out = s;
    return 0;
}

const char *dp_device_format(const dp_device_spec *spec, char *buf, size_t len)
{
    switch (spec->kind) {
    case DP_DEVICE_CPU: snprintf(buf, len, "cpu"); break;
    case DP_DEVICE_CUDA: snprintf(buf, len, "cuda:%d", spec->index); break;
    case DP_DEVICE_SIM: snprintf(buf, len, "sim"); break;
    default: snprintf(buf, len, "device(%d)", (int)spec->kind); break;
    }
    return buf;
}

/* ---- the CUDA plugin, loaded once per process ----
 * A loaded plugin is kept (and never dlclose'd: the CUDA runtime does not
 * expect to be unloaded).  A failure is not kept, so a corrected
 * DOWNPOUR_CUDA_BACKEND is tried by the next open. */
static pthread_mutex_t plugin_lock = PTHREAD_MUTEX_INITIALIZER;
static const dp_backend *plugin_backend;

/* Takes the table from a loaded library; the handle is left open on
 * failure too (see above). */
static int plugin_table(void *h, const char *path, const dp_backend **out, dp_err *err)
{
    dlerror();
    void *sym = dlsym(h, DP_BACKEND_CUDA_SYMBOL);
    if (!sym)
        return dp_errf(err, "--device cuda: %s has no %s: it is not a downpour CUDA backend plugin",
                       path, DP_BACKEND_CUDA_SYMBOL);
    dp_backend_entry entry;
    memcpy(&entry, &sym, sizeof entry); /* ISO C has no object-to-function cast */
    const dp_backend *be = entry();
    if (!be)
        return dp_errf(err, "--device cuda: %s: %s returned no backend", path, DP_BACKEND_CUDA_SYMBOL);
    if (be->abi != DP_BACKEND_ABI)
        return dp_errf(err, "--device cuda: %s has backend ABI %d, this downpour expects %d: the "
                       "plugin was built from other sources; rebuild it with this downpour (or point "
                       "DOWNPOUR_CUDA_BACKEND at the matching plugin)", path, be->abi, DP_BACKEND_ABI);
    if (!be->open || !be->close || !be->describe || !be->alloc || !be->free || !be->host_alloc ||
        !be->host_free || !be->copy || !be->sync || !be->gemm || !be->launch)
        return dp_errf(err, "--device cuda: %s: its backend table lacks required entries", path);
    *out = be;
    return 0;
}

/* dlopen's message, with the hint for the usual cause: a CUDA library
 * (libcublas.so.13, libnccl.so.2) the loader cannot find. */
static int plugin_load_failed(const char *path, dp_err *err)
{
    const char *why = dlerror();
    return dp_errf(err, "--device cuda: cannot load the CUDA backend %s: %s. Hint: the CUDA "
                   "libraries it needs are in the toolkit's lib64 (e.g. /usr/local/cuda/lib64): add "
                   "that to LD_LIBRARY_PATH, or install the CUDA toolkit this downpour was built with",
                   path, why ? why : "unknown error");
}

static int plugin_try(const char *path, const dp_backend **out, dp_err *err)
{
    if (strchr(path, '/') && access(path, F_OK) != 0)
        return dp_errf(err, "--device cuda: the CUDA backend %s does not exist (DOWNPOUR_CUDA_BACKEND "
                       "names the plugin file, libdownpour_cuda.so)", path);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return plugin_load_failed(path, err);
    return plugin_table(h, path, out, err);
}

#ifdef DOWNPOUR_HAVE_CUDA
/* The running program's directory, "" when it cannot be read. */
static void exe_dir(char *buf, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    buf[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(buf, '/');
    if (slash)
        *slash = '\0';
    else
        buf[0] = '\0';
}

/* The search after DOWNPOUR_CUDA_BACKEND: beside the program and in its
 * ../lib (the install layout bin/ + lib/), this build directory, the
 * installed libdir, then the loader's own path (LD_LIBRARY_PATH).  The first
 * file that exists is the plugin: if it does not load, that is the error. */
static int plugin_search(const dp_backend **out, dp_err *err)
{
    char dir[PATH_MAX];
    exe_dir(dir, sizeof dir);
    char cand[7][PATH_MAX + 64];
    int n = 0;
    if (dir[0]) {
        snprintf(cand[n++], sizeof cand[0], "%s/" DP_CUDA_PLUGIN, dir);
        snprintf(cand[n++], sizeof cand[0], "%s/../lib/" DP_CUDA_PLUGIN, dir);
        snprintf(cand[n++], sizeof cand[0], "%s/../lib64/" DP_CUDA_PLUGIN, dir);
        if (strcmp(DP_CUDA_LIBDIR_REL, "lib") != 0 && strcmp(DP_CUDA_LIBDIR_REL, "lib64") != 0 &&
            DP_CUDA_LIBDIR_REL[0] != '/')
            snprintf(cand[n++], sizeof cand[0], "%s/../" DP_CUDA_LIBDIR_REL "/" DP_CUDA_PLUGIN, dir);
    }
    snprintf(cand[n++], sizeof cand[0], "%s", DP_CUDA_BUILD_DIR "/" DP_CUDA_PLUGIN);
    snprintf(cand[n++], sizeof cand[0], "%s", DP_CUDA_LIBDIR "/" DP_CUDA_PLUGIN);
    for (int i = 0; i < n; i++)
        if (access(cand[i], F_OK) == 0)
            return plugin_try(cand[i], out, err);
    void *h = dlopen(DP_CUDA_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    if (h)
        return plugin_table(h, DP_CUDA_PLUGIN, out, err);
    const char *why = dlerror();
    /* Found on LD_LIBRARY_PATH but a library it needs is missing. */
    if (why && strncmp(why, DP_CUDA_PLUGIN ":", strlen(DP_CUDA_PLUGIN ":")) != 0)
        return dp_errf(err, "--device cuda: cannot load the CUDA backend: %s. Hint: the CUDA "
                       "libraries it needs are in the toolkit's lib64 (e.g. /usr/local/cuda/lib64): add "
                       "that to LD_LIBRARY_PATH", why);
    return dp_errf(err, "--device cuda: the CUDA backend " DP_CUDA_PLUGIN " was not found beside the "
                   "program (%s, its ../lib), in the build directory " DP_CUDA_BUILD_DIR ", in "
                   DP_CUDA_LIBDIR " or on LD_LIBRARY_PATH; set DOWNPOUR_CUDA_BACKEND to its path",
                   dir[0] ? dir : "unknown");
}
#endif

static int plugin_get(const dp_backend **out, dp_err *err)
{
    pthread_mutex_lock(&plugin_lock);
    int rc = 0;
    if (!plugin_backend) {
        const char *path = getenv("DOWNPOUR_CUDA_BACKEND");
        if (path && *path)
            rc = plugin_try(path, &plugin_backend, err);
        else
#ifdef DOWNPOUR_HAVE_CUDA
            rc = plugin_search(&plugin_backend, err);
#elif defined(DP_CUDA_OFF_SANITIZE)
            rc = dp_errf(err, "--device cuda: this downpour was built without the CUDA backend: "
                         "sanitizer and fuzz builds leave it out (use a Release build)");
#else
            rc = dp_errf(err, "--device cuda: this downpour was built without the CUDA backend: CMake "
                         "found no CUDA toolkit (install it, e.g. under /usr/local/cuda, and rebuild)");
#endif
    }
    *out = plugin_backend;
    pthread_mutex_unlock(&plugin_lock);
    return rc;
}

/* ---- open devices ---- */

int dp_device_open(dp_device **out, const dp_device_spec *spec, dp_err *err)
{
    *out = NULL;
    char name[32];
    dp_device_format(spec, name, sizeof name);
    const dp_backend *be = NULL;
    switch (spec->kind) {
    case DP_DEVICE_CUDA:
        if (spec->index < 0 || spec->index > DP_DEVICE_MAX_INDEX)
            return dp_errf(err, "--device %s: the GPU index must be from 0 to %d", name,
                           DP_DEVICE_MAX_INDEX);
        if (plugin_get(&be, err) < 0)
            return -1;
        break;
    case DP_DEVICE_SIM:
        be = &dp_backend_sim;
        break;
    case DP_DEVICE_CPU:
        return dp_errf(err, "--device cpu: the CPU is the host engine and has no device to open; "
                       "open cuda or sim");
    default:
        return dp_errf(err, "--device: unknown kind %d", (int)spec->kind);
    }
    return dp_device_open_backend(out, be, spec, err);
}

int dp_device_open_backend(dp_device **out, const dp_backend *be, const dp_device_spec *spec,
                           dp_err *err)
{
    *out = NULL;
    char name[32];
    dp_device_format(spec, name, sizeof name);
    dp_device *d = calloc(1, sizeof *d);
    if (!d)
        return dp_errf(err, "--device %s: out of memory", name);
    char msg[DP_ERR_MAX];
    msg[0] = '\0';
    if (be->open(&d->ctx, spec->index, msg, sizeof msg) < 0) {
        free(d);
        return dp_errf(err, "--device %s: %s", name, msg[0] ? msg : "the backend failed to open");
    }
    d->be = be;
    d->spec = *spec;
    be->describe(d->ctx, d->desc, sizeof d->desc);
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

int dp_device_has_comm(const dp_device *d) { return d->be->comm_join != NULL; }

const char *dp_device_cuda_unavailable(char *buf, size_t len)
{
    dp_device_spec spec = {DP_DEVICE_CUDA, 0};
    dp_device *d;
    dp_err err;
    if (dp_device_open(&d, &spec, &err) < 0) {
        snprintf(buf, len, "%s", err.msg);
        return buf;
    }
    dp_device_close(d);
    return NULL;
}

const dp_backend *dp_device_backend(const dp_device *d) { return d->be; }

void *dp_device_ctx(const dp_device *d) { return d->ctx; }
