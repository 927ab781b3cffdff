/* SIGTERM to a worker asks it to drain (docs/faults.md, "Draining"): finish
 * the step it is in, leave the run in order, exit 0.  The handler only
 * records the request; the loop looks between steps.
 *
 * A SIGTERM sent by this process's parent (downpour launch stopping the
 * whole job: it signals every task) keeps its old meaning: the handler
 * puts the default action back and raises it again, so the task ends at
 * once, killed by SIGTERM, as before.  So does a second SIGTERM (the
 * handler is reset on its first call): a drain that takes too long is
 * cut short by asking again. */
#ifndef DOWNPOUR_TRAIN_DRAIN_H
#define DOWNPOUR_TRAIN_DRAIN_H

/* Installs the handler (a task whose strategy can drain this role). */
void dp_drain_arm(void);
/* Whether a drain was asked for since dp_drain_arm (0 when not armed). */
int dp_drain_asked(void);
/* Puts SIGTERM's action from before dp_drain_arm back: the steps are
 * over, and a drain means nothing any more. */
void dp_drain_disarm(void);

#endif
