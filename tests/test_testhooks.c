/* The test-hook interface (testhooks.h) and the checked environment reads
 * (env.h): hooks are read once, set by dp_hook_set, and a malformed value
 * is refused naming its variable, by the library and by the program. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "downpour/env.h"
#include "downpour/testhooks.h"
#include "proc.h"

static void env_helpers(void)
{
    dp_err err;
    long v = 0;
    const char *bad[] = {"x", "12x", "1e3", "0x10", "99999999999999999999", "+", "-"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("DP_TEST_LONG", bad[i], 1);
        err.msg[0] = '\0';
        CHECKF(dp_env_long("DP_TEST_LONG", 0, LONG_MAX, 7, &v, &err) < 0 &&
                   strstr(err.msg, "DP_TEST_LONG: "),
               "'%s': %s", bad[i], err.msg);
    }
    setenv("DP_TEST_LONG", "-3", 1);
    CHECK(dp_env_long("DP_TEST_LONG", -5, 5, 7, &v, &err) == 0 && v == -3);
    setenv("DP_TEST_LONG", "6", 1);
    CHECK(dp_env_long("DP_TEST_LONG", -5, 5, 7, &v, &err) < 0 &&
          strstr(err.msg, "out of range [-5, 5]"));
    int f = -1;
    unsetenv("DP_TEST_FLAG");
    CHECK(dp_env_flag("DP_TEST_FLAG", 1, &f, &err) == 0 && f == 1); /* unset: the default */
    setenv("DP_TEST_FLAG", "0", 1);
    CHECK(dp_env_flag("DP_TEST_FLAG", 1, &f, &err) == 0 && f == 0);
    setenv("DP_TEST_FLAG", "yes", 1);
    CHECK(dp_env_flag("DP_TEST_FLAG", 1, &f, &err) < 0 &&
          strstr(err.msg, "DP_TEST_FLAG: 'yes' is not 0 or 1"));
    unsetenv("DP_TEST_FLAG");
    setenv("DP_TEST_LONG", "42", 1);
    CHECK(dp_env_long("DP_TEST_LONG", 0, 100, 7, &v, &err) == 0 && v == 42);
    unsetenv("DP_TEST_LONG");
    CHECK(dp_env_long("DP_TEST_LONG", 0, 100, 7, &v, &err) == 0 && v == 7);
}

static void hooks(void)
{
    dp_err err;
    /* read once: on the first query, later changes to the environment are not seen */
    setenv("DOWNPOUR_FAULT_KILL_AT_STEP", "12", 1);
    unsetenv("DOWNPOUR_TEST_STEP_MS");
    CHECK(dp_hook_kill_at_step() == 12);
    setenv("DOWNPOUR_FAULT_KILL_AT_STEP", "99", 1);
    CHECK(dp_hook_kill_at_step() == 12);
    CHECK(dp_hook_step_ms() == 0);
    /* dp_hook_set: here and in the environment children inherit */
    CHECK(dp_hook_set("DOWNPOUR_FAULT_KILL_AT_STEP", "33", &err) == 0);
    CHECK(dp_hook_kill_at_step() == 33);
    CHECK(strcmp(getenv("DOWNPOUR_FAULT_KILL_AT_STEP"), "33") == 0);
    CHECK(strcmp(dp_hook_text(DP_HOOK_KILL_AT_STEP), "33") == 0);
    CHECK(dp_hook_set("DOWNPOUR_FAULT_KILL_AT_STEP", "33x", &err) < 0 &&
          strstr(err.msg, "DOWNPOUR_FAULT_KILL_AT_STEP: '33x' is not an integer"));
    CHECK(dp_hook_kill_at_step() == -1); /* a malformed value leaves the hook off */
    CHECK(dp_hooks_check(&err) < 0 && strstr(err.msg, "DOWNPOUR_FAULT_KILL_AT_STEP"));
    CHECK(dp_hook_set("DOWNPOUR_FAULT_KILL_AT_STEP", NULL, &err) == 0);
    CHECK(!getenv("DOWNPOUR_FAULT_KILL_AT_STEP") && !dp_hook_text(DP_HOOK_KILL_AT_STEP));
    CHECK(dp_hooks_check(&err) == 0);

    CHECK(dp_hook_set("DOWNPOUR_TEST_STEP_MS", "8", &err) == 0 && dp_hook_step_ms() == 8);
    const char *bad_ms[] = {"0", "1001", "-1", "8ms", "nan", "inf"};
    for (size_t i = 0; i < sizeof bad_ms / sizeof bad_ms[0]; i++)
        CHECKF(dp_hook_set("DOWNPOUR_TEST_STEP_MS", bad_ms[i], &err) < 0 &&
                   dp_hook_step_ms() == 0 && strstr(err.msg, "DOWNPOUR_TEST_STEP_MS"),
               "'%s'", bad_ms[i]);
    CHECK(dp_hook_set("DOWNPOUR_TEST_STEP_MS", "", &err) == 0 && dp_hook_step_ms() == 0);

    CHECK(dp_hook_set("DOWNPOUR_TEST_LINK_NS", "80", &err) == 0 && dp_hook_link_ns() == 80);
    const char *bad_ns[] = {"-1", "2e6", "80ns", "nan"};
    for (size_t i = 0; i < sizeof bad_ns / sizeof bad_ns[0]; i++)
        CHECKF(dp_hook_set("DOWNPOUR_TEST_LINK_NS", bad_ns[i], &err) < 0 &&
                   dp_hook_link_ns() == 0 && strstr(err.msg, "DOWNPOUR_TEST_LINK_NS"),
               "'%s'", bad_ns[i]);
    CHECK(dp_hook_set("DOWNPOUR_TEST_LINK_NS", NULL, &err) == 0 && dp_hook_link_ns() == 0);

    CHECK(!dp_hook_on(DP_HOOK_UNFUSED_UPDATE));
    CHECK(dp_hook_set("DOWNPOUR_UNFUSED_UPDATE", "1", &err) == 0 &&
          dp_hook_on(DP_HOOK_UNFUSED_UPDATE));
    CHECK(dp_hook_set("DOWNPOUR_UNFUSED_UPDATE", "yes", &err) < 0 &&
          strstr(err.msg, "DOWNPOUR_UNFUSED_UPDATE: 'yes' is not 0 or 1"));
    CHECK(!dp_hook_on(DP_HOOK_UNFUSED_UPDATE));
    CHECK(dp_hook_set("DOWNPOUR_UNFUSED_UPDATE", NULL, &err) == 0);

    /* the mid-frame pause: armed only in the task it names */
    long nth = 0;
    CHECK(dp_hook_pause_midframe("worker:1", &nth) == 0 && nth == 1);
    CHECK(dp_hook_set("DOWNPOUR_TEST_PAUSE_MIDFRAME", "300000", &err) == 0);
    CHECK(dp_hook_set("DOWNPOUR_TEST_PAUSE_FRAME", "20", &err) == 0);
    CHECK(dp_hook_pause_midframe("worker:1", &nth) == 300000 && nth == 20);
    CHECK(dp_hook_set("DOWNPOUR_TEST_PAUSE_TASK", "worker:1", &err) == 0);
    CHECK(dp_hook_pause_midframe("worker:1", &nth) == 300000);
    CHECK(dp_hook_pause_midframe("worker:0", &nth) == 0 && dp_hook_pause_midframe(NULL, &nth) == 0);
    CHECK(dp_hook_set("DOWNPOUR_TEST_PAUSE_FRAME", "0", &err) < 0 &&
          strstr(err.msg, "DOWNPOUR_TEST_PAUSE_FRAME: 0 is out of range"));
    CHECK(dp_hook_set("DOWNPOUR_TEST_PAUSE_FRAME", NULL, &err) == 0);
    CHECK(dp_hook_set("DOWNPOUR_TEST_PAUSE_MIDFRAME", NULL, &err) == 0);
    CHECK(dp_hook_set("DOWNPOUR_TEST_PAUSE_TASK", NULL, &err) == 0);
    CHECK(dp_hook_pause_midframe("worker:1", &nth) == 0);

    /* the sim's hooks are texts: sim checks them when it opens */
    CHECK(dp_hook_set("DOWNPOUR_SIM_ORDER", "reverse", &err) == 0 &&
          strcmp(dp_hook_text(DP_HOOK_SIM_ORDER), "reverse") == 0);
    CHECK(dp_hook_set("DOWNPOUR_SIM_ORDER", NULL, &err) == 0);
    CHECK(dp_hook_set("DOWNPOUR_NO_SUCH_HOOK", "1", &err) < 0 &&
          strstr(err.msg, "no test hook is named DOWNPOUR_NO_SUCH_HOOK"));
    for (int h = 0; h < DP_HOOK_COUNT; h++)
        CHECK(strncmp(dp_hook_name((dp_hook)h), "DOWNPOUR_", 9) == 0);
}

/* The program refuses a malformed hook before it runs anything (exit 2). */
static void program(void)
{
    const char *bin = test_bin();
    if (!bin || !test_tmp())
        return;
    char out[4096];
    int rc = run_cmd(out, sizeof out, "DOWNPOUR_FAULT_KILL_AT_STEP=soon %s train", bin);
    CHECKF(rc == 2 && strstr(out, "DOWNPOUR_FAULT_KILL_AT_STEP: 'soon' is not an integer"), "exit %d: %s", rc,
           out);
    rc = run_cmd(out, sizeof out, "DOWNPOUR_TEST_STEP_MS=5000 %s train", bin);
    CHECKF(rc == 2 && strstr(out, "DOWNPOUR_TEST_STEP_MS: 5000 is out of range [0, 1000]"), "exit %d: %s", rc, out);
}

int main(void)
{
    env_helpers();
    hooks();
    program();
    return CHECK_DONE();
}
