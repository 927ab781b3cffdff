/* The subcommands of `downpour experiment` (docs/experiments.md), each in its
 * own file, dispatched by src/cli/cmd_experiment.c.  Each takes the
 * arguments after its name and returns the exit status. */
#ifndef DOWNPOUR_EXPERIMENT_H
#define DOWNPOUR_EXPERIMENT_H

int dp_experiment_thesis(int argc, char **argv);  /* thesis.c */
int dp_experiment_scaling(int argc, char **argv); /* scaling.c */
int dp_experiment_cost(int argc, char **argv);    /* cost.c */
int dp_experiment_sparse(int argc, char **argv);  /* sparse.c */

#endif
