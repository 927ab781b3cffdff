/* Metrics: every line is one JSON object with "event" and "t" first, values
 * round-trip (escaped strings, exact integers, doubles, NaN as null), t never
 * decreases, the NULL-path writer accepts everything, and the merge of a
 * cluster's per-task files keeps their lines in order with a resource total. */
#include "downpour/metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static char tmpdir[512];

static void make_tmpdir(void)
{
    const char *base = getenv("DOWNPOUR_TEST_TMP");
    if (!base || !*base)
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(tmpdir, sizeof tmpdir, "%s/test_metrics.XXXXXX", base);
    REQUIRE(mkdtemp(tmpdir) != NULL);
}

static const char *tricky = "quote \" backslash \\ newline \n tab \t ctrl \x01 unicode \xc3\xa9\xe2\x82\xac";

static void test_write_and_read(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", tmpdir);
    dp_metrics *m = NULL;
    dp_err err = {{0}};
    REQUIRE(dp_metrics_open(&m, path, &err) == 0 && m != NULL);

    CHECK(dp_metrics_event(m, "start", DP_F_END) == 0);
    CHECK(dp_metrics_event(m, "epoch", DP_F_INT, "epoch", 1L, DP_F_NUM, "val_accuracy", 0.9731,
                           DP_F_NUM, "train_loss", 0.1234567890123, DP_F_NUM, "seconds",
                           12.5, DP_F_END) == 0);
    CHECK(dp_metrics_event(m, "done", DP_F_STR, "strategy", tricky, DP_F_INT, "big", LONG_MAX,
                           DP_F_INT, "neg", -7L, DP_F_NUM, "nan", (double)NAN, DP_F_NUM, "inf",
                           (double)INFINITY, DP_F_NUM, "tiny", 1e-300, DP_F_STR, "nullstr",
                           (const char *)NULL, DP_F_END) == 0);
    /* An unknown kind writes nothing. */
    CHECK(dp_metrics_event(m, "bad", DP_F_INT, "x", 1L, 99, "y", 2L, DP_F_END) == -1);
    CHECK(dp_metrics_event(m, "bad", DP_F_COUNT, "y", 2L, DP_F_END) == -1);
    CHECK(dp_metrics_event(m, NULL, DP_F_END) == -1);
    for (int i = 0; i < 50; i++)
        CHECK(dp_metrics_event(m, "step", DP_F_INT, "step", (long)i, DP_F_END) == 0);
    dp_metrics_close(m);

    FILE *f = fopen(path, "r");
    REQUIRE(f != NULL);
    char line[4096];
    int n = 0;
    double last_t = -1;
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        CHECKF(len > 0 && line[len - 1] == '\n', "line %d not newline-terminated", n);
        CHECKF(memchr(line, '\n', len - 1) == NULL, "line %d has an inner newline", n);
        CHECKF(strncmp(line, "{\"event\":", 9) == 0, "line %d does not start with event: %s", n,
               line);
        cJSON *o = cJSON_Parse(line);
        CHECKF(o != NULL, "line %d is not JSON: %s", n, line);
        if (!o)
            continue;
        cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "event");
        cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "t");
        CHECK(cJSON_IsString(ev));
        CHECK(cJSON_IsNumber(t));
        CHECK(o->child && o->child->next == t); /* "t" second */
        cJSON *wall = t ? t->next : NULL; /* "wall" third: this machine's Unix time */
        CHECKF(wall && strcmp(wall->string, "wall") == 0 && cJSON_IsNumber(wall) &&
                   fabs(wall->valuedouble - (double)time(NULL)) < 600,
               "line %d: no plausible wall time: %s", n, line);
        if (cJSON_IsNumber(t)) {
            CHECK(t->valuedouble >= 0 && t->valuedouble >= last_t);
            last_t = t->valuedouble;
        }
        if (n == 0) {
            CHECK(strcmp(ev->valuestring, "start") == 0);
            CHECK(cJSON_GetArraySize(o) == 3);
        } else if (n == 1) {
            CHECK(strcmp(ev->valuestring, "epoch") == 0);
            cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "epoch");
            CHECK(cJSON_IsNumber(e) && e->valuedouble == 1);
            CHECK(wall && wall->next == e); /* fields in the given order */
            CHECK(cJSON_GetObjectItemCaseSensitive(o, "val_accuracy")->valuedouble == 0.9731);
            CHECK(cJSON_GetObjectItemCaseSensitive(o, "train_loss")->valuedouble ==
                  0.1234567890123);
            CHECK(cJSON_GetObjectItemCaseSensitive(o, "seconds")->valuedouble == 12.5);
            CHECK(strstr(line, "\"epoch\":1,") != NULL); /* an integer, not 1.0 */
        } else if (n == 2) {
            CHECK(strcmp(ev->valuestring, "done") == 0);
            cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "strategy");
            CHECK(cJSON_IsString(s) && strcmp(s->valuestring, tricky) == 0);
            char want[64];
            snprintf(want, sizeof want, "\"big\":%ld,", LONG_MAX);
            CHECKF(strstr(line, want) != NULL, "exact integer missing: %s", line);
            CHECK(cJSON_GetObjectItemCaseSensitive(o, "neg")->valuedouble == -7);
            CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "nan")));
            CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "inf")));
            CHECK(cJSON_GetObjectItemCaseSensitive(o, "tiny")->valuedouble == 1e-300);
            CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "nullstr")));
        } else {
            CHECK(strcmp(ev->valuestring, "step") == 0);
            cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step");
            CHECK(cJSON_IsNumber(s) && s->valuedouble == n - 3);
        }
        cJSON_Delete(o);
        n++;
    }
    fclose(f);
    CHECKF(n == 3 + 50, "%d lines", n);
    unlink(path);
}

/* A cluster task's writer names it on every event that has no task of its own. */
static void test_task(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/task.jsonl", tmpdir);
    dp_metrics *m = NULL;
    dp_err err = {{0}};
    REQUIRE(dp_metrics_open(&m, path, &err) == 0);
    CHECK(dp_metrics_event(m, "a", DP_F_END) == 0);
    dp_metrics_set_task(m, "worker:3");
    CHECK(dp_metrics_event(m, "b", DP_F_END) == 0);
    CHECK(dp_metrics_event(m, "c", DP_F_STR, "task", "ps:1", DP_F_END) == 0);
    dp_metrics_set_task(m, NULL);
    CHECK(dp_metrics_event(m, "d", DP_F_END) == 0);
    dp_metrics_close(m);
    FILE *f = fopen(path, "r");
    REQUIRE(f != NULL);
    char line[512];
    const char *want[] = {NULL, "worker:3", "ps:1", NULL};
    int n = 0;
    while (fgets(line, sizeof line, f) && n < 4) {
        cJSON *o = cJSON_Parse(line);
        cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "task");
        if (want[n])
            CHECKF(cJSON_IsString(t) && strcmp(t->valuestring, want[n]) == 0, "line %d: %s", n,
                   line);
        else
            CHECKF(t == NULL, "line %d has a task: %s", n, line);
        CHECK(cJSON_GetArraySize(o) == 3 + (want[n] != NULL)); /* one task, never two */
        cJSON_Delete(o);
        n++;
    }
    fclose(f);
    CHECK(n == 4);
    unlink(path);
}

static void test_null_writer(void)
{
    dp_metrics *m = NULL;
    dp_err err = {{0}};
    CHECK(dp_metrics_open(&m, NULL, &err) == 0 && m != NULL);
    CHECK(dp_metrics_event(m, "epoch", DP_F_INT, "epoch", 1L, DP_F_STR, "s", "x", DP_F_END) == 0);
    CHECK(dp_metrics_event(m, "bad", 42, DP_F_END) == -1);
    dp_metrics_close(m);
    CHECK(dp_metrics_event(NULL, "epoch", DP_F_NUM, "x", 1.0, DP_F_END) == 0);
    dp_metrics_close(NULL);
}

static void test_open_failure(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/no/such/dir/m.jsonl", tmpdir);
    dp_metrics *m = (dp_metrics *)1;
    dp_err err = {{0}};
    CHECK(dp_metrics_open(&m, path, &err) == -1);
    CHECK(m == NULL);
    CHECKF(strstr(err.msg, path) != NULL && strstr(err.msg, "No such file") != NULL, "%s",
           err.msg);
}

/* A full disk (/dev/full fails every write with ENOSPC): one warning naming
 * the file, every event -1, and the close reports the file and the error. */
static void test_write_failure(void)
{
    dp_metrics *m = NULL;
    dp_err err = {{0}};
    if (access("/dev/full", W_OK) != 0) {
        fprintf(stderr, "note: no /dev/full; skipping the full-disk check\n");
        return;
    }
    char log[1024];
    snprintf(log, sizeof log, "%s/stderr.log", tmpdir);
    fflush(stderr);
    int saved = dup(2), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(saved >= 0 && fd >= 0 && dup2(fd, 2) == 2);
    close(fd);
    REQUIRE(dp_metrics_open(&m, "/dev/full", &err) == 0);
    int a = dp_metrics_event(m, "epoch", DP_F_INT, "epoch", 1L, DP_F_END);
    int b = dp_metrics_event(m, "epoch", DP_F_INT, "epoch", 2L, DP_F_END);
    int c = dp_metrics_close_check(m, &err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    CHECK(a == -1 && b == -1 && c == -1);
    CHECKF(strstr(err.msg, "/dev/full") && strstr(err.msg, strerror(ENOSPC)), "%s", err.msg);
    FILE *f = fopen(log, "r");
    REQUIRE(f != NULL);
    char text[2048] = "";
    text[fread(text, 1, sizeof text - 1, f)] = '\0';
    fclose(f);
    const char *w = strstr(text, "warning: metrics file /dev/full: write failed: ");
    CHECKF(w && strstr(w, strerror(ENOSPC)) && !strstr(w + 1, "warning"),
           "want one warning naming /dev/full: %s", text);

    /* A file that took every write closes cleanly; NULL too. */
    char path[1024];
    snprintf(path, sizeof path, "%s/ok.jsonl", tmpdir);
    REQUIRE(dp_metrics_open(&m, path, &err) == 0);
    CHECK(dp_metrics_event(m, "epoch", DP_F_INT, "epoch", 1L, DP_F_END) == 0);
    CHECKF(dp_metrics_close_check(m, &err) == 0, "%s", err.msg);
    CHECK(dp_metrics_close_check(NULL, &err) == 0);
    unlink(path);
    unlink(log);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    REQUIRE(f != NULL);
    fputs(text, f);
    fclose(f);
}

/* The launcher's merge: lines in source order, tagged with the task, torn
 * lines skipped, a missing file skipped, one resource_total at the end. */
static void test_merge(void)
{
    char a[1024], b[1024], none[1024], out[1024];
    snprintf(a, sizeof a, "%s/m.chief-0", tmpdir);
    snprintf(b, sizeof b, "%s/m.worker-0", tmpdir);
    snprintf(none, sizeof none, "%s/m.ps-0", tmpdir);
    snprintf(out, sizeof out, "%s/m", tmpdir);
    write_text(a, "{\"event\":\"resource\",\"t\":1,\"cpu_percent\":40,\"rss_bytes\":1000,"
                  "\"net_tx_bytes\":5,\"net_rx_bytes\":6}\n"
                  "{\"event\":\"resource\",\"t\":2,\"cpu_percent\":60,\"rss_bytes\":3000,"
                  "\"net_tx_bytes\":7,\"net_rx_bytes\":8}\n"
                  "{\"event\":\"epoch\",\"epoch\":1,\"task\":\"kept\"}\n");
    write_text(b, "{\"event\":\"resource\",\"t\":1,\"cpu_percent\":100,\"rss_bytes\":500}\n"
                  "not json\n{\"torn");
    write_text(out, "old contents\n");
    dp_metrics_source src[3] = {{a, "chief:0"}, {none, "ps:0"}, {b, "worker:0"}};
    dp_err err = {{0}};
    CHECKF(dp_metrics_merge(out, src, 3, 12.5, &err) == 0, "%s", err.msg);
    FILE *f = fopen(out, "r");
    REQUIRE(f != NULL);
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    const char *want =
        "{\"event\":\"resource\",\"t\":1,\"cpu_percent\":40,\"rss_bytes\":1000,"
        "\"net_tx_bytes\":5,\"net_rx_bytes\":6,\"task\":\"chief:0\"}\n"
        "{\"event\":\"resource\",\"t\":2,\"cpu_percent\":60,\"rss_bytes\":3000,"
        "\"net_tx_bytes\":7,\"net_rx_bytes\":8,\"task\":\"chief:0\"}\n"
        "{\"event\":\"epoch\",\"epoch\":1,\"task\":\"kept\"}\n"
        "{\"event\":\"resource\",\"t\":1,\"cpu_percent\":100,\"rss_bytes\":500,"
        "\"task\":\"worker:0\"}\n"
        "{\"event\":\"resource_total\",\"t\":12.500,\"tasks\":2,\"samples\":3,"
        "\"cpu_percent_mean\":75.000,\"cpu_percent_sum\":150.000,\"rss_peak_bytes\":3500,"
        "\"net_tx_bytes\":7,\"net_rx_bytes\":8}\n";
    /* the summary's wall time is the merge's: checked, then cut for the comparison */
    char *w = strstr(text, ",\"wall\":");
    REQUIRE(w != NULL);
    CHECK(fabs(strtod(w + 8, NULL) - (double)time(NULL)) < 600);
    char *comma = strchr(w + 1, ',');
    REQUIRE(comma != NULL);
    memmove(w, comma, strlen(comma) + 1);
    CHECKF(strcmp(text, want) == 0, "merged:\n%s", text);
    CHECK(access(a, F_OK) == 0 && access(b, F_OK) == 0); /* task files are kept */

    /* No resource events: no resource_total line; an empty list: an empty file. */
    write_text(a, "{\"event\":\"epoch\",\"epoch\":2}\n");
    CHECKF(dp_metrics_merge(out, src, 1, 1.0, &err) == 0, "%s", err.msg);
    f = fopen(out, "r");
    REQUIRE(f != NULL);
    n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    CHECKF(strcmp(text, "{\"event\":\"epoch\",\"epoch\":2,\"task\":\"chief:0\"}\n") == 0, "%s",
           text);
    CHECK(dp_metrics_merge(out, NULL, 0, 1.0, &err) == 0);
    struct stat st;
    CHECK(stat(out, &st) == 0 && st.st_size == 0);

    /* An output directory that does not exist: an error naming it. */
    char bad[1100];
    snprintf(bad, sizeof bad, "%s/no/such/m", tmpdir);
    CHECK(dp_metrics_merge(bad, src, 1, 1.0, &err) == -1);
    CHECKF(strstr(err.msg, "merging metrics") && strstr(err.msg, bad), "%s", err.msg);
    unlink(a);
    unlink(b);
    unlink(out);
}

int main(void)
{
    make_tmpdir();
    test_write_and_read();
    test_null_writer();
    test_task();
    test_open_failure();
    test_write_failure();
    test_merge();
    rmdir(tmpdir);
    return CHECK_DONE();
}
