/* core/file: whole writes (also through a full non-blocking pipe), atomic
 * replace (old or new file, never a leftover temporary), and the path checks
 * train runs before it trains, with the messages they give. */
#include "downpour/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "scratch.h"

static char tmpdir[512];

static const char *tp(const char *name)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *s = calloc(1, 1 << 16);
    if (s)
        (void)!fread(s, 1, (1 << 16) - 1, f);
    fclose(f);
    return s;
}

static int count_temps(void)
{
    DIR *d = opendir(tmpdir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strstr(e->d_name, ".tmp.") != NULL;
    if (d)
        closedir(d);
    return n;
}

typedef struct drain {
    int fd;
    size_t got;
    unsigned sum;
} drain;

static void *drain_pipe(void *arg)
{
    drain *d = arg;
    unsigned char buf[4096];
    ssize_t r;
    usleep(50 * 1000); /* let the writer fill the pipe first */
    while ((r = read(d->fd, buf, sizeof buf)) > 0 || (r < 0 && errno == EINTR))
        for (ssize_t i = 0; i < r; i++) {
            d->sum = d->sum * 31 + buf[i];
            d->got++;
        }
    return NULL;
}

static void test_write_all(void)
{
    enum { N = 1 << 20 };
    unsigned char *buf = malloc(N);
    REQUIRE(buf != NULL);
    unsigned want = 0;
    for (size_t i = 0; i < N; i++) {
        buf[i] = (unsigned char)(i * 7 + (i >> 9));
        want = want * 31 + buf[i];
    }
    /* A non-blocking pipe fills up (EAGAIN) long before 1 MiB is written. */
    int p[2];
    REQUIRE(pipe(p) == 0);
    REQUIRE(fcntl(p[1], F_SETFL, O_NONBLOCK) == 0);
    drain d = {.fd = p[0]};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, drain_pipe, &d) == 0);
    dp_err err = {{0}};
    CHECKF(dp_write_all(p[1], buf, N, &err) == 0, "%s", err.msg);
    close(p[1]);
    pthread_join(th, NULL);
    close(p[0]);
    CHECK(d.got == N && d.sum == want);

    /* A closed reader: -1, errno EPIPE, a message. */
    REQUIRE(pipe(p) == 0);
    close(p[0]);
    signal(SIGPIPE, SIG_IGN);
    CHECK(dp_write_all(p[1], buf, 10, &err) == -1);
    CHECK(errno == EPIPE);
    CHECKF(strstr(err.msg, "write") && strstr(err.msg, strerror(EPIPE)), "%s", err.msg);
    CHECK(dp_write_all(p[1], buf, 10, NULL) == -1); /* err may be NULL */
    close(p[1]);
    CHECK(dp_write_all(p[1], buf, 0, NULL) == 0);   /* nothing to write */
    free(buf);
}

static void test_atomic(void)
{
    dp_err err = {{0}};
    const char *path = tp("data.bin");
    CHECKF(dp_file_replace(path, "first", 5, &err) == 0, "%s", err.msg);
    char *s = read_text(path);
    CHECK(s && strcmp(s, "first") == 0);
    free(s);
    struct stat st;
    REQUIRE(stat(path, &st) == 0);
    mode_t um = umask(0);
    umask(um);
    CHECKF((st.st_mode & 0777) == (0644 & ~um), "mode %o", (unsigned)(st.st_mode & 0777));

    /* Open + write + abort: the old file stays, the temporary goes. */
    dp_atomic_file af;
    REQUIRE(dp_atomic_open(&af, path, &err) == 0);
    CHECK(af.fd >= 0 && af.tmp && strstr(af.tmp, "data.bin.tmp.") != NULL);
    CHECK(count_temps() == 1);
    CHECK(dp_write_all(af.fd, "second", 6, &err) == 0);
    dp_atomic_abort(&af);
    CHECK(af.fd == -1 && af.tmp == NULL);
    dp_atomic_abort(&af); /* twice is harmless */
    s = read_text(path);
    CHECK(s && strcmp(s, "first") == 0);
    free(s);
    CHECK(count_temps() == 0);

    /* Open + write + commit replaces it. */
    REQUIRE(dp_atomic_open(&af, path, &err) == 0);
    CHECK(dp_write_all(af.fd, "third!", 6, &err) == 0);
    CHECKF(dp_atomic_commit(&af, &err) == 0, "%s", err.msg);
    CHECK(af.fd == -1 && af.tmp == NULL && af.path == NULL);
    s = read_text(path);
    CHECK(s && strcmp(s, "third!") == 0);
    free(s);
    CHECK(count_temps() == 0);

    /* Two writers at once get different temporaries. */
    dp_atomic_file a, b;
    REQUIRE(dp_atomic_open(&a, path, &err) == 0 && dp_atomic_open(&b, path, &err) == 0);
    CHECK(strcmp(a.tmp, b.tmp) != 0);
    CHECK(dp_write_all(a.fd, "A", 1, &err) == 0 && dp_write_all(b.fd, "B", 1, &err) == 0);
    CHECK(dp_atomic_commit(&a, &err) == 0 && dp_atomic_commit(&b, &err) == 0);
    s = read_text(path);
    CHECK(s && strcmp(s, "B") == 0);
    free(s);
    CHECK(count_temps() == 0);

    /* A directory that does not exist: refused at open, with the path. */
    CHECK(dp_file_replace(tp("no/such/dir/x"), "x", 1, &err) == -1);
    CHECKF(strstr(err.msg, "no/such/dir/x") && strstr(err.msg, strerror(ENOENT)), "%s", err.msg);

    /* Renaming over a directory fails: the temporary is removed, the error names it. */
    REQUIRE(mkdir(tp("adir"), 0755) == 0);
    CHECK(dp_file_replace(tp("adir"), "x", 1, &err) == -1);
    CHECKF(strstr(err.msg, "rename"), "%s", err.msg);
    CHECK(count_temps() == 0);
    REQUIRE(stat(tp("adir"), &st) == 0 && S_ISDIR(st.st_mode));
    CHECK(dp_atomic_commit(&af, &err) == -1); /* af is finished */
}

/* dp_atomic_temp_parse knows dp_atomic_open's names, and nothing else. */
static void test_temp_parse(void)
{
    dp_err err = {{0}};
    dp_atomic_file af;
    REQUIRE(dp_atomic_open(&af, tp("named.bin"), &err) == 0);
    const char *name = strrchr(af.tmp, '/') + 1;
    size_t base = 0;
    long pid = 0;
    CHECKF(dp_atomic_temp_parse(name, &base, &pid) == 1 && base == strlen("named.bin") &&
               pid == (long)getpid(), "%s: base %zu, pid %ld", name, base, pid);
    dp_atomic_abort(&af);
    CHECK(dp_atomic_temp_parse("a.tmp.1.2.tmp.33.4", &base, &pid) == 1 && base == 9 && pid == 33);
    const char *not_temps[] = {"a.tmp.1.2.bak", "a.tmp.1.x", "a.tmp..2", "a.tmp.1.", "a.tmp.1",
                               ".tmp.1.2", "a.tmp.-1.2", "a.tmp", "a"};
    for (size_t i = 0; i < sizeof not_temps / sizeof not_temps[0]; i++)
        CHECKF(dp_atomic_temp_parse(not_temps[i], &base, &pid) == 0, "%s", not_temps[i]);
}

static void test_path_check(void)
{
    dp_err err = {{0}};
    CHECKF(dp_path_check_writable(tp("m.safetensors"), "--save", &err) == 0, "%s", err.msg);
    CHECKF(dp_path_check_writable("relative-name.jsonl", "--metrics", &err) == 0, "%s", err.msg);

    CHECK(dp_path_check_writable("/nonexistent/m.safetensors", "--save", &err) == -1);
    CHECKF(strcmp(err.msg, "--save /nonexistent/m.safetensors: directory /nonexistent does "
                           "not exist") == 0,
           "%s", err.msg);

    REQUIRE(mkdir(tp("outdir"), 0755) == 0);
    CHECK(dp_path_check_writable(tp("outdir"), "--save", &err) == -1);
    CHECKF(strstr(err.msg, "--save") && strstr(err.msg, "is a directory"), "%s", err.msg);
    CHECK(dp_path_check_writable(tp("outdir/"), "--save", &err) == -1);

    FILE *f = fopen(tp("plain"), "w");
    REQUIRE(f != NULL);
    fclose(f);
    CHECKF(dp_path_check_writable(tp("plain"), "--metrics", &err) == 0, "%s", err.msg);
    CHECK(dp_path_check_writable(tp("plain/m.jsonl"), "--metrics", &err) == -1);
    CHECKF(strstr(err.msg, "--metrics") && strstr(err.msg, "is not a directory"), "%s", err.msg);
    CHECK(dp_path_check_writable("", "--save", &err) == -1);

    if (geteuid() != 0) { /* root may write anywhere */
        REQUIRE(mkdir(tp("ro"), 0555) == 0);
        CHECK(dp_path_check_writable(tp("ro/m.safetensors"), "--save", &err) == -1);
        CHECKF(strstr(err.msg, "not writable"), "%s", err.msg);
        CHECK(dp_dir_prepare(tp("ro"), "--checkpoint-dir", &err) == -1);
        CHECK(dp_dir_prepare(tp("ro/sub"), "--checkpoint-dir", &err) == -1);
        CHECKF(strstr(err.msg, "cannot create"), "%s", err.msg);
    }
}

static void test_dir_prepare(void)
{
    dp_err err = {{0}};
    struct stat st;
    CHECKF(dp_dir_prepare(tp("ck"), "--checkpoint-dir", &err) == 0, "%s", err.msg);
    CHECK(stat(tp("ck"), &st) == 0 && S_ISDIR(st.st_mode));
    CHECKF(dp_dir_prepare(tp("ck"), "--checkpoint-dir", &err) == 0, "%s", err.msg);
    CHECKF(dp_dir_prepare(tp("deep/er//still/"), "--checkpoint-dir", &err) == 0, "%s", err.msg);
    CHECK(stat(tp("deep/er/still"), &st) == 0 && S_ISDIR(st.st_mode));

    FILE *f = fopen(tp("afile"), "w");
    REQUIRE(f != NULL);
    fclose(f);
    CHECK(dp_dir_prepare(tp("afile"), "--checkpoint-dir", &err) == -1);
    CHECKF(strstr(err.msg, "--checkpoint-dir") && strstr(err.msg, "is a file"), "%s", err.msg);
    CHECK(dp_dir_prepare(tp("afile/sub"), "--checkpoint-dir", &err) == -1);
    CHECKF(strstr(err.msg, "is a file"), "%s", err.msg);
    CHECK(dp_dir_prepare("", "--checkpoint-dir", &err) == -1);
    CHECKF(dp_dir_prepare("/", NULL, &err) == 0 || geteuid() != 0, "%s", err.msg);
}

int main(void)
{
    scratch_make(tmpdir, sizeof tmpdir, "test_file");
    test_write_all();
    test_atomic();
    test_temp_parse();
    test_path_check();
    test_dir_prepare();
    return CHECK_DONE();
}
