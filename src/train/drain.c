/* The drain request: a flag set by SIGTERM's handler (drain.h). */
#include "train/drain.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t asked;
static int armed;
static struct sigaction before; /* restored by dp_drain_disarm */

/* Nothing but the flag here: async-signal-safe calls only (sigaction,
 * raise, getppid).  The parent's SIGTERM is the launcher stopping the job:
 * SA_RESETHAND has put the default action back, so raising it again (it is
 * blocked until this returns) ends the task as a plain SIGTERM would. */
static void on_term(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    if (si && si->si_code == SI_USER && si->si_pid == getppid()) {
        raise(sig);
        return;
    }
    asked = 1;
}

void dp_drain_arm(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_term;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    asked = 0;
    if (sigaction(SIGTERM, &sa, &before) == 0)
        armed = 1;
}

int dp_drain_asked(void) { return armed && asked != 0; }

void dp_drain_disarm(void)
{
    if (armed)
        sigaction(SIGTERM, &before, NULL);
    armed = 0;
}
