/* Test and fault-injection hooks (docs/faults.md, "Test hooks").
 *
 * The one way library code reaches a hook: each is named by its environment
 * variable, read once (all of them, on the first query) by
 * src/core/testhooks.c and by nothing else, so live paths test a cached
 * value instead of calling getenv.  Tests set a hook with dp_hook_set, which
 * also exports it so the programs a test starts see the same value.
 *
 *   DOWNPOUR_FAULT_KILL_AT_STEP=N    a trainer SIGKILLs itself after step N
 *   DOWNPOUR_TEST_STEP_MS=MS         a cluster's tasks sleep MS a step (0 < MS <= 1000)
 *   DOWNPOUR_UNFUSED_UPDATE=1        single: the update after backprop, not fused in it
 *   DOWNPOUR_METRICS_KEEP_PARTS=1    the launcher keeps the per-task metrics files
 *   DOWNPOUR_SIM_ORDER, _SIM_SEED, _SIM_MEMORY, _SIM_PINNED, _SIM_COMM_TIMEOUT
 *                                    the sim device's item order, seed and limits (gpu.md)
 *   DOWNPOUR_TEST_PAUSE_MIDFRAME=BYTES, _PAUSE_FRAME=N, _PAUSE_TASK=NAME
 *                                    a TCP sender stops itself mid-frame (faults.md)
 *   DOWNPOUR_TEST_SHM_TAG=TAG        shared-memory segments are named downpour-TAG-...
 *                                    (1-8 letters or digits), so a test counts its own
 *   DOWNPOUR_TEST_LINK_NS=NS         the all-reduce ring's fit (auto's measurement) sees a link
 *                                    NS ns a byte slower (0 <= NS <= 1e6): a fake slow link
 *   DOWNPOUR_TEST_WELCOME_MS=MS      the all-reduce leader waits MS after each replica it
 *                                    welcomed is READY (0 < MS <= 1000): a wide window
 *
 * The values are checked where they are read: dp_hooks_check refuses a
 * malformed one with a message naming it (the program checks before it
 * runs anything); the sim device's are checked when it opens. */
#ifndef DOWNPOUR_TESTHOOKS_H
#define DOWNPOUR_TESTHOOKS_H

#include "downpour/status.h"

typedef enum dp_hook {
    DP_HOOK_KILL_AT_STEP,
    DP_HOOK_STEP_MS,
    DP_HOOK_UNFUSED_UPDATE,
    DP_HOOK_METRICS_KEEP_PARTS,
    DP_HOOK_SIM_ORDER,
    DP_HOOK_SIM_SEED,
    DP_HOOK_SIM_MEMORY,
    DP_HOOK_SIM_PINNED,
    DP_HOOK_SIM_COMM_TIMEOUT,
    DP_HOOK_PAUSE_MIDFRAME,
    DP_HOOK_PAUSE_FRAME,
    DP_HOOK_PAUSE_TASK,
    DP_HOOK_SHM_TAG,
    DP_HOOK_LINK_NS,
    DP_HOOK_WELCOME_MS,
    DP_HOOK_COUNT
} dp_hook;

/* The hook's environment variable, e.g. "DOWNPOUR_FAULT_KILL_AT_STEP". */
const char *dp_hook_name(dp_hook h);
/* Its text, NULL when unset or empty. */
const char *dp_hook_text(dp_hook h);
/* For tests: sets the hook named NAME (its variable) to VALUE, NULL to
 * unset, here and in the environment the test's children inherit.  A
 * reader in another thread sees the old text or the new one (old texts are
 * never freed).  -1 with a message for an unknown name or a malformed value
 * (which is set all the same, for the tests of the checks). */
int dp_hook_set(const char *name, const char *value, dp_err *err);
/* 0 when every hook set is well formed, else -1 with a message naming it. */
int dp_hooks_check(dp_err *err);

/* Nanoseconds a byte the ring's fit adds to each measured sum; 0: none. */
double dp_hook_link_ns(void);
/* Milliseconds the all-reduce leader waits after each welcomed replica's
 * READY; 0: none. */
double dp_hook_welcome_ms(void);
/* The step after which to SIGKILL this task; -1: none. */
long dp_hook_kill_at_step(void);
/* Milliseconds a clustered task sleeps after each step; 0: none. */
double dp_hook_step_ms(void);
/* The mid-frame pause for the task named TASK (its DOWNPOUR_TASK; NULL for
 * none): the payload bytes after which a sender stops itself in the *nth
 * large frame, 0 when it is not armed in this task (unset, or
 * DOWNPOUR_TEST_PAUSE_TASK names another). */
unsigned long long dp_hook_pause_midframe(const char *task, long *nth);
/* Whether a flag hook (UNFUSED_UPDATE, METRICS_KEEP_PARTS) is "1". */
int dp_hook_on(dp_hook h);

#endif
