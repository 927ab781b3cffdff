/* The cluster runtime through the downpour program: a launched cluster pings
 * (every task reaches every other), two tasks started by hand with `run` find
 * each other from a spec file, a task with the wrong secret is refused and the
 * run ends with a message, and bad specs and role mixes are refused by name. */
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "downpour/clock.h"
#include "proc.h"

/* A port nobody listens on now (the kernel's pick). */
static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    REQUIRE(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(s, (struct sockaddr *)&a, &len) == 0);
    close(s);
    return ntohs(a.sin_port);
}

static char err[65536];

static void write_file(const char *name, const char *text, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", test_tmp(), name);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs(text, f);
    fclose(f);
}

int main(void)
{
    REQUIRE(test_bin() && test_tmp());
    const char *bin = test_bin();

    /* A launched cluster: every pair exchanges round trips, output is prefixed. */
    int rc = run_cmd(err, sizeof err, "%s launch --chief --workers 2 --ps 1 -- ping --count 20", bin);
    CHECKF(rc == 0, "launch ping exited %d: %s", rc, err);
    CHECK(strstr(err, "[worker 1] worker:1: ok; sent") != NULL);
    CHECK(strstr(err, "[chief] ping chief:0 <-> ps:0: 20 round trips") != NULL);

    /* Two tasks by hand from one spec file (as on two hosts). */
    char spec[1200], text[256];
    int p1 = free_port(), p2;
    while ((p2 = free_port()) == p1)
        ;
    snprintf(text, sizeof text, "{\"cluster\": {\"worker\": [\"127.0.0.1:%d\", \"127.0.0.1:%d\"]}}",
             p1, p2);
    write_file("cluster.json", text, spec, sizeof spec);
    rc = run_cmd(err, sizeof err,
                 "export DOWNPOUR_SECRET=00112233445566778899aabbccddeeff; "
                 "%s run --cluster %s --task worker:1 -- ping --count 10 & "
                 "%s run --cluster %s --task worker:0 -- ping --count 10; a=$?; wait $!; b=$?; "
                 "exit $((a + b))",
                 bin, spec, bin, spec);
    CHECKF(rc == 0, "two hand-started tasks exited %d: %s", rc, err);
    CHECK(strstr(err, "ping worker:0 <-> worker:1: 10 round trips") != NULL);

    /* The wrong secret: refused, and the run ends (no hang) with a message. */
    double t0 = dp_now();
    rc = run_cmd(err, sizeof err,
                 "DOWNPOUR_SECRET=00112233445566778899aabbccddeeff %s run --cluster %s --task "
                 "worker:1 -- ping --connect-timeout 3 & "
                 "DOWNPOUR_SECRET=ffeeddccbbaa99887766554433221100 %s run --cluster %s --task "
                 "worker:0 -- ping --connect-timeout 3; a=$?; wait $!; b=$?; "
                 "[ $a -ne 0 ] && [ $b -ne 0 ]",
                 bin, spec, bin, spec);
    CHECKF(rc == 0, "a task with the wrong secret was not refused on both sides: %s", err);
    /* no hang: both give up within their 3 s connect timeout; the bound is
     * far above what load can make of that */
    CHECKF(dp_now() - t0 < 60, "refusing the wrong secret took %.1f s", dp_now() - t0);
    CHECKF(strstr(err, "secret") || strstr(err, "authentic"), "no word of the secret: %s", err);

    /* Bad specs and role mixes, refused by name. */
    char bad[1200];
    write_file("dup.json", "{\"cluster\": {\"worker\": [\"127.0.0.1:47313\", \"127.0.0.1:47313\"]}}",
               bad, sizeof bad);
    rc = run_cmd(err, sizeof err, "%s run --cluster %s --task worker:0 -- ping", bin, bad);
    CHECKF(rc == 2 && strstr(err, "cluster.worker[1]"), "duplicate address: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s run --cluster %s --task worker:5 -- ping", bin, spec);
    CHECKF(rc == 2 && strstr(err, "worker:5"), "index out of range: %d %s", rc, err);
    /* launch adds the chief a ps strategy needs; a spec without one is refused */
    rc = run_cmd(err, sizeof err, "%s launch --workers 2 --ps 1 -- train --strategy ps-async "
                 "--epochs 1 --train-size 600 --val-size 100 --test-size 100 --quiet", bin);
    CHECKF(rc == 0 && strstr(err, "needs a chief; added one"), "ps without --chief: %d %s", rc,
           err);
    write_file("nochief.json", "{\"cluster\": {\"worker\": [\"127.0.0.1:47315\"], "
               "\"ps\": [\"127.0.0.1:47316\"]}}", bad, sizeof bad);
    rc = run_cmd(err, sizeof err, "%s run --cluster %s --task worker:0 -- train --strategy "
                 "ps-async --epochs 1", bin, bad);
    CHECKF(rc == 2 && strstr(err, "needs a chief"), "ps without a chief: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --workers 2 --ps 1 -- train --strategy allreduce "
                 "--epochs 1", bin);
    CHECKF(rc != 0 && strstr(err, "no ps"), "allreduce with a ps: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --strategy ps-async --epochs 1", bin);
    CHECKF(rc != 0 && strstr(err, "runs on a cluster"), "ps strategy alone: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- frobnicate", bin);
    CHECKF(rc == 2 && strstr(err, "frobnicate"), "unknown task command: %d %s", rc, err);
    return CHECK_DONE();
}
