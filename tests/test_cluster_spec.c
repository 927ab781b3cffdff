/* Cluster spec: ranks, names and addresses of good specs; every kind of bad
 * spec refused with a message naming the field; the writer round-trips. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "downpour/cluster.h"

static int parse_ok(dp_cluster *c, const char *json, const char *task)
{
    dp_err err = {{0}};
    int rc = dp_cluster_parse(c, json, task, &err);
    CHECKF(rc == 0, "%s -> %s", json, err.msg);
    return rc;
}

/* The spec must be refused and the message must contain every substring. */
static void refused(const char *json, const char *task, const char *want1, const char *want2)
{
    dp_cluster c;
    dp_err err = {{0}};
    int rc = dp_cluster_parse(&c, json, task, &err);
    CHECKF(rc == -1, "accepted: %s", json);
    CHECK(c.tasks == NULL && c.n_tasks == 0);
    CHECKF(strstr(err.msg, want1) != NULL, "message \"%s\" lacks \"%s\"", err.msg, want1);
    if (want2)
        CHECKF(strstr(err.msg, want2) != NULL, "message \"%s\" lacks \"%s\"", err.msg, want2);
    if (rc == 0)
        dp_cluster_free(&c);
}

static void test_full_spec(void)
{
    dp_cluster c;
    const char *json = "{\"cluster\": {\"ps\": [\"h1:2222\", \"h2:2222\"],"
                       " \"worker\": [\"h3:2222\", \"h4:2222\", \"h5:2222\"],"
                       " \"chief\": [\"h0:2222\"]},"
                       " \"task\": {\"type\": \"worker\", \"index\": 2}}";
    if (parse_ok(&c, json, NULL) < 0)
        return;
    CHECK(c.n_tasks == 6);
    CHECK(c.count[DP_ROLE_CHIEF] == 1 && c.count[DP_ROLE_WORKER] == 3 && c.count[DP_ROLE_PS] == 2);
    /* chief first, then workers, then ps, whatever the order in the file */
    const char *names[] = {"chief:0", "worker:0", "worker:1", "worker:2", "ps:0", "ps:1"};
    const char *hosts[] = {"h0", "h3", "h4", "h5", "h1", "h2"};
    for (int r = 0; r < 6; r++) {
        CHECK(c.tasks[r].rank == r);
        CHECKF(strcmp(c.tasks[r].name, names[r]) == 0, "rank %d is %s", r, c.tasks[r].name);
        CHECK(strcmp(c.tasks[r].host, hosts[r]) == 0);
        CHECK(c.tasks[r].port == 2222);
    }
    CHECK(c.self == 3);
    CHECK(dp_cluster_rank(&c, DP_ROLE_CHIEF, 0) == 0);
    CHECK(dp_cluster_rank(&c, DP_ROLE_PS, 1) == 5);
    CHECK(dp_cluster_rank(&c, DP_ROLE_PS, 2) == -1);
    CHECK(strcmp(c.tasks[4].addr, "h1:2222") == 0);
    /* spare slots (--spare-workers): the last workers, never a chief or a ps */
    CHECK(!dp_cluster_is_spare(&c, 3, 0) && dp_cluster_is_spare(&c, 3, 1));
    CHECK(!dp_cluster_is_spare(&c, 2, 1) && dp_cluster_is_spare(&c, 2, 2));
    CHECK(!dp_cluster_is_spare(&c, 0, 3) && !dp_cluster_is_spare(&c, 4, 3));
    CHECK(!dp_cluster_is_spare(&c, -1, 1) && !dp_cluster_is_spare(&c, 6, 1));

    /* round trip through the writer, with another task */
    char *out = dp_cluster_to_json(&c, 5, NULL);
    REQUIRE(out != NULL);
    dp_cluster d;
    if (parse_ok(&d, out, NULL) == 0) {
        CHECK(d.n_tasks == c.n_tasks && d.self == 5);
        for (int r = 0; r < d.n_tasks; r++) {
            CHECK(strcmp(d.tasks[r].name, c.tasks[r].name) == 0);
            CHECK(strcmp(d.tasks[r].addr, c.tasks[r].addr) == 0);
            CHECK(d.tasks[r].port == c.tasks[r].port);
        }
        dp_cluster_free(&d);
    }
    free(out);
    /* without a task: the writer omits it and the parser asks for one */
    out = dp_cluster_to_json(&c, -1, NULL);
    REQUIRE(out != NULL);
    CHECK(strstr(out, "\"task\"") == NULL);
    refused(out, NULL, "task: missing", NULL);
    if (parse_ok(&d, out, "ps:0") == 0) {
        CHECK(d.self == 4);
        dp_cluster_free(&d);
    }
    free(out);
    dp_cluster_free(&c);
    dp_cluster_free(&c); /* freeing twice is harmless */
    dp_cluster_free(NULL);
}

static void test_small_specs(void)
{
    dp_cluster c;
    /* workers only: worker:i is rank i */
    if (parse_ok(&c, "{\"cluster\":{\"worker\":[\"localhost:2223\",\"localhost:2224\"]},"
                     "\"task\":{\"type\":\"worker\",\"index\":1}}", NULL) == 0) {
        CHECK(c.n_tasks == 2 && c.self == 1 && strcmp(c.tasks[1].name, "worker:1") == 0);
        dp_cluster_free(&c);
    }
    /* the MISSION example: ps on 2222, workers on 2223..2225 */
    if (parse_ok(&c, "{\"cluster\":{\"ps\":[\"localhost:2222\"],\"worker\":[\"localhost:2223\","
                     "\"localhost:2224\",\"localhost:2225\"]},\"task\":{\"type\":\"ps\",\"index\":0}}",
                 NULL) == 0) {
        CHECK(c.n_tasks == 4 && c.self == 3 && c.tasks[3].role == DP_ROLE_PS);
        CHECK(c.tasks[0].port == 2223);
        dp_cluster_free(&c);
    }
    /* IPv6 in brackets, with a zone; the task override wins over the spec's task */
    if (parse_ok(&c, "{\"cluster\":{\"worker\":[\"[::1]:2222\",\"[fe80::1%eth0]:2222\","
                     "\"[2001:db8::7]:65535\"]},\"task\":{\"type\":\"worker\",\"index\":0}}",
                 "worker:2") == 0) {
        CHECK(strcmp(c.tasks[0].host, "::1") == 0 && c.tasks[0].port == 2222);
        CHECK(strcmp(c.tasks[0].addr, "[::1]:2222") == 0);
        CHECK(strcmp(c.tasks[1].host, "fe80::1%eth0") == 0);
        CHECK(c.tasks[2].port == 65535 && c.self == 2);
        dp_cluster_free(&c);
    }
    /* TF_CONFIG's extra keys are accepted; "chief" alone means chief:0 */
    if (parse_ok(&c, "{\"cluster\":{\"chief\":[\"a:1\"],\"worker\":[\"b:1\"]},"
                     "\"environment\":\"cloud\",\"rpc_layer\":\"grpc\"}", "chief") == 0) {
        CHECK(c.self == 0 && c.tasks[0].role == DP_ROLE_CHIEF);
        dp_cluster_free(&c);
    }
}

static void test_bad_specs(void)
{
    const char *t = "\"task\":{\"type\":\"worker\",\"index\":0}";
    char json[1024];
#define SPEC(cluster) (snprintf(json, sizeof json, "{\"cluster\":{%s},%s}", cluster, t), json)
    refused(SPEC("\"worker\":[\"a:1\",\"b:1\",\"localhost:99999\"]"), NULL, "cluster.worker[2]",
            "\"localhost:99999\": port out of range");
    refused(SPEC("\"worker\":[\"a:1\",\"b\"]"), NULL, "cluster.worker[1]", "missing port");
    refused(SPEC("\"worker\":[\"a:\"]"), NULL, "cluster.worker[0]", "missing port");
    refused(SPEC("\"worker\":[\"a:http\"]"), NULL, "cluster.worker[0]", "not a number");
    refused(SPEC("\"worker\":[\"a:-1\"]"), NULL, "cluster.worker[0]", "not a number");
    refused(SPEC("\"worker\":[\"a:0\"]"), NULL, "cluster.worker[0]", "port out of range");
    refused(SPEC("\"worker\":[\":2222\"]"), NULL, "cluster.worker[0]", "empty host");
    refused(SPEC("\"worker\":[\"\"]"), NULL, "cluster.worker[0]", "empty address");
    refused(SPEC("\"worker\":[\"::1:2222\"]"), NULL, "cluster.worker[0]", "brackets");
    refused(SPEC("\"worker\":[\"[::1]2222\"]"), NULL, "cluster.worker[0]", "missing port");
    refused(SPEC("\"worker\":[\"[::1:2222\"]"), NULL, "cluster.worker[0]", "']'");
    refused(SPEC("\"worker\":[\"[zz::1]:2222\"]"), NULL, "cluster.worker[0]", "invalid IPv6");
    refused(SPEC("\"worker\":[\"a b:2222\"]"), NULL, "cluster.worker[0]", "invalid host");
    refused(SPEC("\"worker\":[2222]"), NULL, "cluster.worker[0]", "string");
    refused(SPEC("\"worker\":\"a:1\""), NULL, "cluster.worker", "list");
    refused(SPEC("\"worker\":[\"a:1\"],\"ps\":[\"b:1\",\"A:1\"]"), NULL, "cluster.ps[1]",
            "duplicate address, already used by cluster.worker[0]");
    refused(SPEC("\"worker\":[\"a:1\"],\"gpu\":[\"b:1\"]"), NULL, "cluster.gpu",
            "unknown task type \"gpu\"");
    refused(SPEC("\"worker\":[\"a:1\"],\"evaluator\":[\"b:1\"]"), NULL, "cluster.evaluator",
            "downpour eval");
    refused(SPEC("\"chief\":[\"a:1\",\"b:1\"],\"worker\":[\"c:1\"]"), NULL, "cluster.chief",
            "at most one chief");
    refused(SPEC("\"chief\":[\"a:1\"]"), NULL, "cluster.worker", "no workers");
    refused(SPEC("\"worker\":[]"), NULL, "cluster.worker", "no workers");
    refused(SPEC("\"worker\":[\"a:1\"],\"worker\":[\"b:1\"]"), NULL, "cluster.worker", "twice");
    char longaddr[400];
    memset(longaddr, 'h', 300);
    memcpy(longaddr + 300, ":1", 3);
    char cl[512];
    snprintf(cl, sizeof cl, "\"worker\":[\"%s\"]", longaddr);
    refused(SPEC(cl), NULL, "cluster.worker[0]", "longer than 255");
#undef SPEC
    const char *cl2 = "{\"cluster\":{\"worker\":[\"a:1\",\"b:1\"]}";
    char buf[512];
    snprintf(buf, sizeof buf, "%s,\"task\":{\"type\":\"worker\",\"index\":2}}", cl2);
    refused(buf, NULL, "task.index", "out of range");
    snprintf(buf, sizeof buf, "%s,\"task\":{\"type\":\"worker\",\"index\":-1}}", cl2);
    refused(buf, NULL, "task.index", "not an index");
    snprintf(buf, sizeof buf, "%s,\"task\":{\"type\":\"worker\",\"index\":0.5}}", cl2);
    refused(buf, NULL, "task.index", "not an index");
    snprintf(buf, sizeof buf, "%s,\"task\":{\"type\":\"worker\"}}", cl2);
    refused(buf, NULL, "task.index", "missing");
    snprintf(buf, sizeof buf, "%s,\"task\":{\"type\":\"ps\",\"index\":0}}", cl2);
    refused(buf, NULL, "task.index", "no ps tasks");
    snprintf(buf, sizeof buf, "%s,\"task\":{\"type\":\"master\",\"index\":0}}", cl2);
    refused(buf, NULL, "task.type", "unknown task type \"master\"");
    snprintf(buf, sizeof buf, "%s,\"task\":{\"index\":0}}", cl2);
    refused(buf, NULL, "task.type", "missing");
    snprintf(buf, sizeof buf, "%s,\"task\":[]}", cl2);
    refused(buf, NULL, "task:", "object");
    snprintf(buf, sizeof buf, "%s}", cl2);
    refused(buf, NULL, "task: missing", "--task");
    snprintf(buf, sizeof buf, "%s,\"tsak\":{}}", cl2);
    refused(buf, NULL, "unknown key \"tsak\"", NULL);
    snprintf(buf, sizeof buf, "%s}", cl2);
    refused(buf, "worker:7", "task", "index out of range");
    refused(buf, "evaluator:0", "evaluator", "not supported");
    refused(buf, "boss:0", "unknown task type \"boss\"", NULL);
    refused(buf, "worker", "missing index", NULL);
    refused(buf, "worker:x", "task \"worker:x\"", "not an integer");
    refused("{\"task\":{\"type\":\"worker\",\"index\":0}}", NULL, "cluster: missing", NULL);
    refused("{\"cluster\":[],\"task\":{}}", NULL, "cluster:", "object");
    refused("[1,2]", NULL, "spec", "object");
    /* bad JSON: with the position */
    refused("{\"cluster\": {\"worker\": [\"a:1\",]}}", NULL, "bad JSON at line 1, column 31", NULL);
    refused("{\n  \"cluster\": {\n    \"worker\": [\"a:1\"\n  }\n}", NULL, "bad JSON at line 4", NULL);
    refused("", NULL, "bad JSON", "end of input");
    refused("{\"cluster\":{\"worker\":[\"a:1\"]}} trailing", NULL, "bad JSON", "trailing");
}

static char *many_workers(int n)
{
    size_t cap = 16 * (size_t)n + 200;
    char *json = malloc(cap);
    REQUIRE(json != NULL);
    size_t k = (size_t)snprintf(json, cap, "{\"cluster\":{\"worker\":[");
    for (int i = 0; i < n; i++)
        k += (size_t)snprintf(json + k, cap - k, "%s\"h%d:1\"", i ? "," : "", i);
    snprintf(json + k, cap - k, "]},\"task\":{\"type\":\"worker\",\"index\":0}}");
    return json;
}

static void test_too_many_tasks(void)
{
    char *json = many_workers(DP_CLUSTER_MAX_TASKS + 1);
    refused(json, NULL, "cluster", "more than 4096 tasks");
    free(json);
    /* exactly the maximum is fine */
    json = many_workers(DP_CLUSTER_MAX_TASKS);
    dp_cluster c;
    if (parse_ok(&c, json, NULL) == 0) {
        CHECK(c.n_tasks == DP_CLUSTER_MAX_TASKS);
        dp_cluster_free(&c);
    }
    free(json);
}

static void test_env_and_file(void)
{
    dp_cluster c;
    dp_err err = {{0}};
    unsetenv(DP_CLUSTER_ENV);
    unsetenv(DP_CLUSTER_ENV_TF);
    CHECK(dp_cluster_from_env(&c, NULL, &err) == 1);
    setenv(DP_CLUSTER_ENV, "{\"cluster\":{\"worker\":[\"a:1\",\"b:1\"]},"
                           "\"task\":{\"type\":\"worker\",\"index\":1}}", 1);
    CHECKF(dp_cluster_from_env(&c, NULL, &err) == 0, "%s", err.msg);
    CHECK(c.self == 1 && c.n_tasks == 2);
    dp_cluster_free(&c);
    setenv(DP_CLUSTER_ENV, "{\"cluster\":{\"worker\":[\"a:1\",\"a:1\"]}}", 1);
    CHECK(dp_cluster_from_env(&c, "worker:0", &err) == -1);
    CHECKF(strstr(err.msg, "DOWNPOUR_CONFIG: cluster.worker[1]") != NULL, "%s", err.msg);
    unsetenv(DP_CLUSTER_ENV);

    const char *dir = getenv("DOWNPOUR_TEST_TMP");
    char path[4096];
    snprintf(path, sizeof path, "%s/cluster_spec_%d.json", dir && *dir ? dir : "/tmp", (int)getpid());
    FILE *f = fopen(path, "w");
    REQUIRE(f != NULL);
    fputs("{\n  \"cluster\": {\n    \"chief\": [\"10.0.0.1:2222\"],\n"
          "    \"worker\": [\"10.0.0.2:2222\", \"10.0.0.3:2222\"]\n  }\n}\n", f);
    fclose(f);
    CHECKF(dp_cluster_load(&c, path, "worker:1", &err) == 0, "%s", err.msg);
    CHECK(c.self == 2 && strcmp(c.tasks[2].host, "10.0.0.3") == 0);
    dp_cluster_free(&c);
    CHECK(dp_cluster_load(&c, path, NULL, &err) == -1);
    CHECKF(strstr(err.msg, path) && strstr(err.msg, "task: missing"), "%s", err.msg);
    CHECK(dp_cluster_load(&c, path, "worker:2", &err) == -1);
    CHECKF(strstr(err.msg, "out of range"), "%s", err.msg);
    unlink(path);
    CHECK(dp_cluster_load(&c, path, "worker:0", &err) == -1);
    CHECKF(strstr(err.msg, "cannot open") && strstr(err.msg, "No such file"), "%s", err.msg);
}

/* dp_cluster_from_env with stderr kept in log (cap bytes). */
static int from_env_logged(dp_cluster *c, const char *task, dp_err *err, char *log, size_t cap)
{
    char path[4096];
    const char *dir = getenv("DOWNPOUR_TEST_TMP");
    snprintf(path, sizeof path, "%s/cluster_spec_log_%d.txt", dir && *dir ? dir : "/tmp",
             (int)getpid());
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    REQUIRE(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    int rc = dp_cluster_from_env(c, task, err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ssize_t n = pread(fd, log, cap - 1, 0);
    log[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    return rc;
}

/* TF_CONFIG, TensorFlow's variable, is read when DOWNPOUR_CONFIG is not set;
 * when both are, DOWNPOUR_CONFIG wins (with a line saying so if they differ). */
static void test_tf_config(void)
{
    static const char two[] = "{\"cluster\":{\"worker\":[\"a:1\",\"b:1\"]},"
                              "\"task\":{\"type\":\"worker\",\"index\":1}}";
    static const char three[] = "{\"cluster\":{\"chief\":[\"c:1\"],\"worker\":[\"a:1\",\"b:1\"]},"
                                "\"task\":{\"type\":\"chief\",\"index\":0},"
                                "\"environment\":\"cloud\"}";
    dp_cluster c;
    dp_err err = {{0}};
    char log[2048];
    unsetenv(DP_CLUSTER_ENV);
    unsetenv(DP_CLUSTER_ENV_TF);
    CHECK(dp_cluster_from_env(&c, NULL, &err) == 1);

    /* Only TF_CONFIG (also with DOWNPOUR_CONFIG empty). */
    setenv(DP_CLUSTER_ENV_TF, three, 1);
    CHECKF(from_env_logged(&c, NULL, &err, log, sizeof log) == 0, "%s", err.msg);
    CHECK(c.n_tasks == 3 && c.self == 0 && c.count[DP_ROLE_CHIEF] == 1);
    CHECKF(log[0] == '\0', "unexpected log: %s", log);
    dp_cluster_free(&c);
    setenv(DP_CLUSTER_ENV, "", 1);
    CHECKF(dp_cluster_from_env(&c, "worker:1", &err) == 0, "%s", err.msg);
    CHECK(c.n_tasks == 3 && c.self == 2);
    dp_cluster_free(&c);

    /* Both, the same text: DOWNPOUR_CONFIG, silently. */
    setenv(DP_CLUSTER_ENV, three, 1);
    CHECKF(from_env_logged(&c, NULL, &err, log, sizeof log) == 0, "%s", err.msg);
    CHECK(c.n_tasks == 3);
    CHECKF(log[0] == '\0', "unexpected log: %s", log);
    dp_cluster_free(&c);

    /* Both, different: DOWNPOUR_CONFIG wins and a line says so. */
    setenv(DP_CLUSTER_ENV, two, 1);
    CHECKF(from_env_logged(&c, NULL, &err, log, sizeof log) == 0, "%s", err.msg);
    CHECK(c.n_tasks == 2 && c.self == 1);
    CHECKF(strstr(log, "DOWNPOUR_CONFIG and TF_CONFIG are both set and differ; using "
                       "DOWNPOUR_CONFIG"), "log: %s", log);
    dp_cluster_free(&c);

    /* A bad TF_CONFIG is named as such; a good DOWNPOUR_CONFIG beside it is used. */
    unsetenv(DP_CLUSTER_ENV);
    setenv(DP_CLUSTER_ENV_TF, "{\"cluster\":{\"worker\":[\"a:1\"]},"
                              "\"task\":{\"type\":\"evaluator\",\"index\":0}}", 1);
    CHECK(dp_cluster_from_env(&c, NULL, &err) == -1);
    CHECKF(strncmp(err.msg, "TF_CONFIG: ", 11) == 0, "%s", err.msg);
    setenv(DP_CLUSTER_ENV, two, 1);
    CHECKF(from_env_logged(&c, NULL, &err, log, sizeof log) == 0, "%s", err.msg);
    CHECK(c.n_tasks == 2);
    dp_cluster_free(&c);
    unsetenv(DP_CLUSTER_ENV);
    unsetenv(DP_CLUSTER_ENV_TF);
}

static void test_local_and_helpers(void)
{
    dp_cluster c;
    dp_err err = {{0}};
    int ports[] = {5000, 5001, 5002, 5003};
    CHECKF(dp_cluster_local(&c, 1, 2, 1, ports, &err) == 0, "%s", err.msg);
    CHECK(c.n_tasks == 4 && strcmp(c.tasks[3].name, "ps:0") == 0);
    CHECK(strcmp(c.tasks[1].addr, "127.0.0.1:5001") == 0);
    char *json = dp_cluster_to_json(&c, 1, &err);
    REQUIRE(json != NULL);
    CHECKF(strcmp(json, "{\"cluster\":{\"chief\":[\"127.0.0.1:5000\"],\"worker\":"
                        "[\"127.0.0.1:5001\",\"127.0.0.1:5002\"],\"ps\":[\"127.0.0.1:5003\"]},"
                        "\"task\":{\"type\":\"worker\",\"index\":0}}") == 0, "%s", json);
    free(json);
    CHECK(dp_cluster_to_json(&c, 4, &err) == NULL);
    dp_cluster_free(&c);
    CHECK(dp_cluster_local(&c, 0, 0, 1, ports, &err) == -1);
    int dup[] = {5000, 5000};
    CHECK(dp_cluster_local(&c, 0, 2, 0, dup, &err) == -1);
    CHECKF(strstr(err.msg, "duplicate"), "%s", err.msg);

    dp_role r;
    int i;
    CHECK(dp_task_parse("ps:3", &r, &i, &err) == 0 && r == DP_ROLE_PS && i == 3);
    CHECK(dp_task_parse("", &r, &i, &err) == -1);
    CHECK(dp_task_parse("worker:", &r, &i, &err) == -1);
    CHECK(dp_task_parse("worker:99999", &r, &i, &err) == -1);
    CHECK(strcmp(dp_role_name(DP_ROLE_WORKER), "worker") == 0);
    CHECK(dp_role_name(DP_ROLE_COUNT) == NULL);
    char host[64];
    int port;
    CHECK(dp_hostport_parse("[::1]:80", host, sizeof host, &port, "x", &err) == 0);
    CHECK(strcmp(host, "::1") == 0 && port == 80);
    CHECK(dp_hostport_parse("node-1.example.com:65535", host, sizeof host, &port, "x", &err) == 0);
    CHECK(dp_hostport_parse("h:655350000000000000000", host, sizeof host, &port, "x", &err) == -1);
    CHECKF(strstr(err.msg, "out of range"), "%s", err.msg);
}

int main(void)
{
    test_full_spec();
    test_small_specs();
    test_bad_specs();
    test_too_many_tasks();
    test_env_and_file();
    test_tf_config();
    test_local_and_helpers();
    return CHECK_DONE();
}
