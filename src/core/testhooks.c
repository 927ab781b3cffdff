/* Test and fault-injection hooks (include/downpour/testhooks.h): the one
 * file of the library that reads them from the environment, once. */
#include "downpour/testhooks.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[DP_HOOK_COUNT] = {
    [DP_HOOK_KILL_AT_STEP] = "DOWNPOUR_FAULT_KILL_AT_STEP",
    [DP_HOOK_STEP_MS] = "DOWNPOUR_TEST_STEP_MS",
    [DP_HOOK_UNFUSED_UPDATE] = "DOWNPOUR_UNFUSED_UPDATE",
    [DP_HOOK_METRICS_KEEP_PARTS] = "DOWNPOUR_METRICS_KEEP_PARTS",
    [DP_HOOK_SIM_ORDER] = "DOWNPOUR_SIM_ORDER",
    [DP_HOOK_SIM_SEED] = "DOWNPOUR_SIM_SEED",
    [DP_HOOK_SIM_MEMORY] = "DOWNPOUR_SIM_MEMORY",
    [DP_HOOK_SIM_PINNED] = "DOWNPOUR_SIM_PINNED",
    [DP_HOOK_SIM_COMM_TIMEOUT] = "DOWNPOUR_SIM_COMM_TIMEOUT",
    [DP_HOOK_PAUSE_MIDFRAME] = "DOWNPOUR_TEST_PAUSE_MIDFRAME",
    [DP_HOOK_PAUSE_FRAME] = "DOWNPOUR_TEST_PAUSE_FRAME",
    [DP_HOOK_PAUSE_TASK] = "DOWNPOUR_TEST_PAUSE_TASK",
    [DP_HOOK_SHM_TAG] = "DOWNPOUR_TEST_SHM_TAG",
    [DP_HOOK_LINK_NS] = "DOWNPOUR_TEST_LINK_NS",
    [DP_HOOK_WELCOME_MS] = "DOWNPOUR_TEST_WELCOME_MS",
};

/* The texts (owned copies) and the parsed values of the hooks live paths
 * test; a malformed value leaves its hook off. */
static char *text[DP_HOOK_COUNT];
static long kill_at = -1;
static double step_ms, welcome_ms;
static double link_ns;
static long pause_bytes, pause_nth = 1;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* T, hook H's text, as milliseconds in (0, 1000]. */
static int parse_ms(dp_hook h, const char *t, double *out, dp_err *err)
{
    double v = 0;
    if (dp_parse_double(t, 0, 1000, &v, names[h], err) < 0)
        return -1;
    if (!(v > 0))
        return dp_errf(err, "%s: '%s' is not above 0 (milliseconds, at most 1000)", names[h],
                       t);
    *out = v;
    return 0;
}

static int parse_flag(dp_hook h, const char *t, dp_err *err)
{
    if (strcmp(t, "0") != 0 && strcmp(t, "1") != 0)
        return dp_errf(err, "%s: '%s' is not 0 or 1", names[h], t);
    return 0;
}

/* Checks T as hook H's value and caches what a live path tests. */
static int parse(dp_hook h, const char *t, dp_err *err)
{
    switch (h) {
    case DP_HOOK_KILL_AT_STEP: {
        long v = -1;
        kill_at = -1;
        if (t && dp_parse_long(t, 1, LONG_MAX, &v, names[h], err) < 0)
            return -1;
        kill_at = v;
        return 0;
    }
    case DP_HOOK_STEP_MS:
    case DP_HOOK_WELCOME_MS: {
        double v = 0, *dst = h == DP_HOOK_STEP_MS ? &step_ms : &welcome_ms;
        *dst = 0;
        if (t && parse_ms(h, t, &v, err) < 0)
            return -1;
        *dst = v;
        return 0;
    }
    case DP_HOOK_LINK_NS: {
        double v = 0;
        link_ns = 0;
        if (t && dp_parse_double(t, 0, 1e6, &v, names[h], err) < 0)
            return -1;
        link_ns = v;
        return 0;
    }
    case DP_HOOK_PAUSE_MIDFRAME:
    case DP_HOOK_PAUSE_FRAME: {
        long *dst = h == DP_HOOK_PAUSE_MIDFRAME ? &pause_bytes : &pause_nth;
        long v = h == DP_HOOK_PAUSE_MIDFRAME ? 0 : 1;
        *dst = v;
        if (t && dp_parse_long(t, 1, LONG_MAX, &v, names[h], err) < 0)
            return -1;
        *dst = v;
        return 0;
    }
    case DP_HOOK_UNFUSED_UPDATE:
    case DP_HOOK_METRICS_KEEP_PARTS:
        return t ? parse_flag(h, t, err) : 0;
    case DP_HOOK_SHM_TAG: /* part of a file name: shm.c uses it only when this holds */
        if (t && (strlen(t) > 8 || strspn(t, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUV"
                                              "WXYZ0123456789") != strlen(t)))
            return dp_errf(err, "%s: '%s' is not 1 to 8 letters or digits", names[h], t);
        return 0;
    default: /* the sim device checks its own when it opens (messages in gpu.md) */
        return 0;
    }
}

static void load(void)
{
    for (int h = 0; h < DP_HOOK_COUNT; h++) {
        const char *v = getenv(names[h]);
        text[h] = v && *v ? strdup(v) : NULL;
        dp_err err;
        (void)parse((dp_hook)h, text[h], &err); /* reported by dp_hooks_check */
    }
}

const char *dp_hook_name(dp_hook h)
{
    return h >= 0 && h < DP_HOOK_COUNT ? names[h] : "?";
}

const char *dp_hook_text(dp_hook h)
{
    pthread_once(&once, load);
    return h >= 0 && h < DP_HOOK_COUNT ? text[h] : NULL;
}

/* Texts replaced by dp_hook_set, kept for threads that may still read them. */
typedef struct retired {
    char *text;
    struct retired *next;
} retired;
static retired *graveyard;

int dp_hook_set(const char *name, const char *value, dp_err *err)
{
    pthread_once(&once, load);
    int h = 0;
    while (h < DP_HOOK_COUNT && strcmp(names[h], name) != 0)
        h++;
    if (h == DP_HOOK_COUNT)
        return dp_errf(err, "no test hook is named %s (docs/faults.md, \"Test hooks\")", name);
    if (value && !*value)
        value = NULL;
    char *copy = value ? strdup(value) : NULL;
    if (value && !copy)
        return dp_errf(err, "out of memory for test hook %s", name);
    /* a malformed value is still set: the tests of the checks need it */
    int rc = parse((dp_hook)h, value, err);
    /* the old text is not freed (as setenv keeps old strings): a thread
     * that read it may still hold it.  It stays reachable on a list, so
     * the leak checker sees memory kept on purpose; tests set a handful. */
    if (text[h]) {
        retired *r = malloc(sizeof *r);
        if (r) {
            r->text = text[h];
            r->next = graveyard;
            graveyard = r;
        }
    }
    text[h] = copy;
    if ((value ? setenv(name, value, 1) : unsetenv(name)) != 0)
        return dp_errf(err, "cannot export test hook %s", name);
    return rc;
}

int dp_hooks_check(dp_err *err)
{
    pthread_once(&once, load);
    for (int h = 0; h < DP_HOOK_COUNT; h++)
        if (text[h] && parse((dp_hook)h, text[h], err) < 0)
            return -1;
    return 0;
}

long dp_hook_kill_at_step(void)
{
    pthread_once(&once, load);
    return kill_at;
}

double dp_hook_step_ms(void)
{
    pthread_once(&once, load);
    return step_ms;
}

double dp_hook_welcome_ms(void)
{
    pthread_once(&once, load);
    return welcome_ms;
}

double dp_hook_link_ns(void)
{
    pthread_once(&once, load);
    return link_ns;
}

unsigned long long dp_hook_pause_midframe(const char *task, long *nth)
{
    pthread_once(&once, load);
    const char *who = text[DP_HOOK_PAUSE_TASK];
    *nth = pause_nth;
    if (who && (!task || strcmp(who, task) != 0))
        return 0;
    return (unsigned long long)pause_bytes;
}

int dp_hook_on(dp_hook h)
{
    const char *t = dp_hook_text(h);
    return t && strcmp(t, "1") == 0;
}
