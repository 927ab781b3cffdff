/* A study's runs on a virtual cluster: every task in its own network
 * namespace host with a capped link, through scripts/vcluster.sh
 * (docs/cluster.md, "A virtual cluster on one machine"). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/experiment/study.h"

/* The script: $DOWNPOUR_VCLUSTER, else scripts/vcluster.sh beside the
 * build or install tree this program is in. */
static int find_script(char *out, size_t cap, dp_err *err)
{
    const char *env = getenv("DOWNPOUR_VCLUSTER");
    if (env && *env) {
        if (access(env, R_OK) != 0)
            return dp_errf(err, "DOWNPOUR_VCLUSTER=%s: not a readable file", env);
        snprintf(out, cap, "%s", env);
        return 0;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return dp_errf(err, "cannot find this program (/proc/self/exe)");
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    const char *tries[] = {"../scripts/vcluster.sh", "../share/downpour/vcluster.sh",
                           "../../scripts/vcluster.sh"};
    for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
        int len = snprintf(out, cap, "%s/%s", exe, tries[i]);
        if (len > 0 && (size_t)len < cap && access(out, R_OK) == 0)
            return 0;
    }
    return dp_errf(err, "--hosts: scripts/vcluster.sh not found beside %s; set "
                        "DOWNPOUR_VCLUSTER to its path", exe);
}

int study_vcluster_setup(study_cluster *c, dp_err *err)
{
    if (geteuid() != 0)
        return dp_errf(err, "--hosts %ld: a virtual cluster makes network namespaces, which "
                            "needs root", c->hosts);
    if (find_script(c->script, sizeof c->script, err) < 0)
        return -1;
    int n = snprintf(c->description, sizeof c->description, "a virtual cluster of %ld hosts",
                     c->hosts);
    size_t used = n > 0 ? (size_t)n : 0;
    if (c->link_mbit)
        used += (size_t)snprintf(c->description + used, sizeof c->description - used,
                                 " with links capped at %ld Mbit/s", c->link_mbit);
    if (c->delay_ms && used < sizeof c->description)
        used += (size_t)snprintf(c->description + used, sizeof c->description - used,
                                 "%s %ld ms per message", c->link_mbit ? " and" : " with",
                                 c->delay_ms);
    if (used < sizeof c->description)
        snprintf(c->description + used, sizeof c->description - used,
                 " (network namespaces sharing this machine's %d cores)", study_cores());
    return 0;
}

int study_vcluster_command(const study_cluster *c, study_argv *a, bool chief, int workers,
                           int ps, dp_err *err)
{
    char exe[PATH_MAX], buf[32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return dp_errf(err, "cannot find this program (/proc/self/exe)");
    exe[n] = '\0';
    int bad = study_argv_add(a, "bash") | study_argv_add(a, c->script) |
              study_argv_add(a, "--bin") | study_argv_add(a, exe) | study_argv_add(a, "--hosts");
    snprintf(buf, sizeof buf, "%ld", c->hosts);
    bad |= study_argv_add(a, buf) | (chief ? study_argv_add(a, "--chief") : 0) |
           study_argv_add(a, "--workers");
    snprintf(buf, sizeof buf, "%d", workers);
    bad |= study_argv_add(a, buf) | study_argv_add(a, "--ps");
    snprintf(buf, sizeof buf, "%d", ps);
    bad |= study_argv_add(a, buf) | study_argv_add(a, "--link-mbit");
    snprintf(buf, sizeof buf, "%ld", c->link_mbit);
    bad |= study_argv_add(a, buf);
    if (c->delay_ms) {
        snprintf(buf, sizeof buf, "%ld", c->delay_ms);
        bad |= study_argv_add(a, "--link-delay-ms") | study_argv_add(a, buf);
    }
    bad |= study_argv_add(a, "--");
    if (bad)
        return dp_errf(err, "command line too long");
    return 0;
}
