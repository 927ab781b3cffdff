/* The module order, enforced (docs/architecture.md, "Module order").
 *
 * Reads the order from the fenced ```layers block of docs/architecture.md,
 * the one place it is written, then every #include "..." of src/ (every
 * folder, .c, .h and .cu) and include/downpour/, and fails on each include
 * against it, naming file:line, the include and the rule:
 *
 *  - "downpour/X.h" (a public header) is owned by the module that has
 *    src/<module>/X.c, or by the module an `owner` line names.  A module may
 *    include its own public headers and those of modules on lower levels.
 *  - "M/X.h" (a header private to module M, src/M/X.h) only inside M; a
 *    public header never includes one.
 *  - "X.h" (no folder) only the file's own folder's.
 *  - anything else only through an `allow` line, which names the including
 *    module, the header and why.  An allow line no include uses is an error
 *    too, so the list only shrinks.
 *
 * Also fails on a src/ folder the table does not place and a public header
 * with no owner.  Usage: test_layers_order [SOURCE_DIR] (default: this
 * tree).  No training and no files written: it runs in milliseconds. */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef DP_SOURCE_DIR
#define DP_SOURCE_DIR "."
#endif

#define MAXN 256

/* snprintf that stops the check on a truncated path or name. */
#define PUT(dst, ...)                                                                            \
    do {                                                                                         \
        if ((size_t)snprintf(dst, sizeof dst, __VA_ARGS__) >= sizeof dst) {                      \
            fprintf(stderr, "test_layers_order: a path or name too long at %s:%d\n", __FILE__,   \
                    __LINE__);                                                                   \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

typedef struct module {
    char name[64];
    int level;
} module;

typedef struct owner {
    char header[128]; /* "train.h" */
    char module[64];
} owner;

typedef struct allow {
    char module[64];
    char header[192]; /* as written in the #include */
    char why[512];
    int line, used;
} allow;

static module mods[MAXN];
static int n_mods;
static owner owners[MAXN];
static int n_owners;
static allow allows[MAXN];
static int n_allows;
static int n_bad, n_includes, n_files;
static const char *root;
static char table_path[4096];

static int level_of(const char *m)
{
    for (int i = 0; i < n_mods; i++)
        if (strcmp(mods[i].name, m) == 0)
            return mods[i].level;
    return -1;
}

static int exists(const char *rel)
{
    char p[4096];
    struct stat st;
    PUT(p, "%s/%s", root, rel);
    return stat(p, &st) == 0;
}

/* The module that owns public header h ("train.h"), or NULL. */
static const char *owner_of(const char *h)
{
    for (int i = 0; i < n_owners; i++)
        if (strcmp(owners[i].header, h) == 0)
            return owners[i].module;
    char stem[128];
    snprintf(stem, sizeof stem, "%s", h);
    char *dot = strrchr(stem, '.');
    if (dot)
        *dot = '\0';
    for (int i = 0; i < n_mods; i++) {
        char rel[512];
        PUT(rel, "src/%s/%s.c", mods[i].name, stem);
        if (exists(rel))
            return mods[i].name;
    }
    return NULL;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

static int table_error(int line, const char *what)
{
    fprintf(stderr, "%s:%d: %s\n", table_path, line, what);
    return -1;
}

static int read_table(void)
{
    snprintf(table_path, sizeof table_path, "%s/docs/architecture.md", root);
    FILE *f = fopen(table_path, "r");
    if (!f) {
        perror(table_path);
        return -1;
    }
    char buf[2048];
    int in = 0, line = 0, seen = 0;
    while (fgets(buf, sizeof buf, f)) {
        line++;
        char *s = trim(buf);
        if (!in) {
            if (strcmp(s, "```layers") == 0)
                in = seen = 1;
            continue;
        }
        if (strcmp(s, "```") == 0) {
            in = 0;
            continue;
        }
        if (*s == '\0' || *s == '#')
            continue;
        char *save = NULL, *kw = strtok_r(s, " \t", &save);
        if (strcmp(kw, "level") == 0) {
            char *n = strtok_r(NULL, " \t", &save);
            if (!n || !isdigit((unsigned char)*n))
                return fclose(f), table_error(line, "level needs a number");
            for (char *m; (m = strtok_r(NULL, " \t", &save)) && *m != '(';) {
                if (n_mods == MAXN)
                    return fclose(f), table_error(line, "too many modules");
                if (level_of(m) >= 0)
                    return fclose(f), table_error(line, "module placed twice");
                snprintf(mods[n_mods].name, sizeof mods[n_mods].name, "%s", m);
                mods[n_mods++].level = atoi(n);
            }
        } else if (strcmp(kw, "owner") == 0) {
            char *m = strtok_r(NULL, " \t", &save);
            if (!m || level_of(m) < 0)
                return fclose(f), table_error(line, "owner names no module placed above it");
            for (char *h; (h = strtok_r(NULL, " \t", &save));) {
                if (n_owners == MAXN)
                    return fclose(f), table_error(line, "too many owners");
                snprintf(owners[n_owners].header, sizeof owners[n_owners].header, "%s", h);
                snprintf(owners[n_owners++].module, sizeof owners[0].module, "%s", m);
            }
        } else if (strcmp(kw, "allow") == 0) {
            char *m = strtok_r(NULL, " \t", &save);
            char *h = strtok_r(NULL, " \t", &save);
            char *colon = strtok_r(NULL, " \t", &save);
            char *why = save ? trim(save) : NULL;
            if (!m || !h || !colon || strcmp(colon, ":") != 0 || !why || !*why)
                return fclose(f), table_error(line, "allow MODULE HEADER : WHY");
            if (level_of(m) < 0)
                return fclose(f), table_error(line, "allow names a module no level places");
            if (n_allows == MAXN)
                return fclose(f), table_error(line, "too many allow lines");
            allow *a = &allows[n_allows++];
            snprintf(a->module, sizeof a->module, "%s", m);
            snprintf(a->header, sizeof a->header, "%s", h);
            snprintf(a->why, sizeof a->why, "%s", why);
            a->line = line;
        } else {
            return fclose(f), table_error(line, "expected level, owner or allow");
        }
    }
    fclose(f);
    if (!seen || n_mods == 0)
        return table_error(line, "no ```layers block with levels");
    return 0;
}

static int allowed(const char *mod, const char *inc)
{
    for (int i = 0; i < n_allows; i++)
        if (strcmp(allows[i].module, mod) == 0 && strcmp(allows[i].header, inc) == 0) {
            allows[i].used = 1;
            return 1;
        }
    return 0;
}

static void breach(const char *file, int line, const char *inc, const char *rule)
{
    fprintf(stderr, "%s:%d: #include \"%s\": %s\n", file, line, inc, rule);
    n_bad++;
}

/* One #include "inc" at file:line; mod owns the file, dir is its folder
 * relative to root ("src/cli/experiment"), pub whether it is a public header. */
static void check_include(const char *file, int line, const char *mod, const char *dir,
                          int pub, const char *inc)
{
    char rule[1024];
    n_includes++;
    const char *slash = strchr(inc, '/');
    int lv = level_of(mod);
    if (!slash) {
        char rel[4096];
        PUT(rel, "%s/%s", dir, inc);
        if (!pub && exists(rel))
            return;
        if (allowed(mod, inc))
            return;
        breach(file, line, inc,
               pub ? "a public header names another as \"downpour/X.h\""
                   : "a header without a folder must be in the including file's own folder");
        return;
    }
    char top[64];
    snprintf(top, sizeof top, "%.*s", (int)(slash - inc), inc);
    if (strcmp(top, "downpour") == 0) {
        const char *h = slash + 1;
        char rel[512], rel_in[512];
        snprintf(rel, sizeof rel, "include/downpour/%s", h);
        snprintf(rel_in, sizeof rel_in, "include/downpour/%s.in", h);
        if (!exists(rel) && !exists(rel_in)) {
            breach(file, line, inc, "no such public header in include/downpour/");
            return;
        }
        const char *own = owner_of(h);
        if (!own) {
            breach(file, line, inc, "public header with no owner: add an owner line to the table");
            return;
        }
        int ov = level_of(own);
        if (strcmp(own, mod) == 0 || ov < lv)
            return;
        if (allowed(mod, inc))
            return;
        snprintf(rule, sizeof rule,
                 "%s (level %d) may include public headers of lower levels only; %s belongs to "
                 "%s (level %d)",
                 mod, lv, h, own, ov);
        breach(file, line, inc, rule);
        return;
    }
    if (level_of(top) >= 0) {
        if (!pub && strcmp(top, mod) == 0)
            return;
        if (allowed(mod, inc))
            return;
        if (pub)
            snprintf(rule, sizeof rule,
                     "a public header includes a header private to %s (installed headers "
                     "cannot reach src/)",
                     top);
        else
            snprintf(rule, sizeof rule,
                     "a header private to %s is included from %s: private headers stay in "
                     "their module (move it to include/downpour/ if it is public)",
                     top, mod);
        breach(file, line, inc, rule);
        return;
    }
    if (allowed(mod, inc))
        return;
    breach(file, line, inc, "names no module of the table (downpour/ or a src/ folder)");
}

static void scan_file(const char *rel, const char *mod, const char *dir, int pub)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    FILE *f = fopen(p, "r");
    if (!f) {
        perror(p);
        n_bad++;
        return;
    }
    n_files++;
    char buf[4096];
    int line = 0;
    while (fgets(buf, sizeof buf, f)) {
        line++;
        char *s = buf;
        while (*s == ' ' || *s == '\t')
            s++;
        if (*s != '#')
            continue;
        s++;
        while (*s == ' ' || *s == '\t')
            s++;
        if (strncmp(s, "include", 7) != 0)
            continue;
        s += 7;
        while (*s == ' ' || *s == '\t')
            s++;
        if (*s != '"')
            continue;
        char *end = strchr(s + 1, '"');
        if (!end)
            continue;
        *end = '\0';
        check_include(rel, line, mod, dir, pub, s + 1);
    }
    fclose(f);
}

static int source_name(const char *n)
{
    size_t k = strlen(n);
    return (k > 2 && (strcmp(n + k - 2, ".c") == 0 || strcmp(n + k - 2, ".h") == 0)) ||
           (k > 3 && strcmp(n + k - 3, ".cu") == 0) || (k > 4 && strcmp(n + k - 4, ".cuh") == 0);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every source file under dir (relative to root), subfolders included, in
 * name order, as module mod. */
static void scan_dir(const char *dir, const char *mod, int pub)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", root, dir);
    DIR *d = opendir(p);
    if (!d) {
        perror(p);
        n_bad++;
        return;
    }
    char *names[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096)
        if (e->d_name[0] != '.')
            names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], by_name);
    for (int i = 0; i < n; i++) {
        char rel[4096];
        struct stat st;
        PUT(rel, "%s/%s", dir, names[i]);
        PUT(p, "%s/%s", root, rel);
        if (stat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            if (!pub)
                scan_dir(rel, mod, pub);
        } else if (source_name(names[i])) {
            if (pub) {
                const char *own = owner_of(names[i]);
                if (!own) {
                    fprintf(stderr, "%s: public header with no owner: add an owner line to %s\n",
                            rel, table_path);
                    n_bad++;
                } else {
                    scan_file(rel, own, dir, 1);
                }
            } else {
                scan_file(rel, mod, dir, 0);
            }
        }
        free(names[i]);
    }
}

int main(int argc, char **argv)
{
    root = argc > 1 ? argv[1] : DP_SOURCE_DIR;
    if (read_table() < 0)
        return 1;
    /* every folder of src/ is placed */
    char p[4096];
    snprintf(p, sizeof p, "%s/src", root);
    DIR *d = opendir(p);
    if (!d) {
        perror(p);
        return 1;
    }
    struct dirent *e;
    char *folders[MAXN];
    int n = 0;
    while ((e = readdir(d)) && n < MAXN) {
        struct stat st;
        char q[4096];
        PUT(q, "%s/%s", p, e->d_name);
        if (e->d_name[0] != '.' && stat(q, &st) == 0 && S_ISDIR(st.st_mode))
            folders[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(folders, (size_t)n, sizeof folders[0], by_name);
    for (int i = 0; i < n; i++) {
        char rel[512];
        snprintf(rel, sizeof rel, "src/%s", folders[i]);
        if (level_of(folders[i]) < 0) {
            fprintf(stderr, "%s/: a folder the module order does not place: add it to a level in "
                            "%s\n",
                    rel, table_path);
            n_bad++;
        } else {
            scan_dir(rel, folders[i], 0);
        }
        free(folders[i]);
    }
    scan_dir("include/downpour", NULL, 1);
    for (int i = 0; i < n_allows; i++)
        if (!allows[i].used) {
            fprintf(stderr, "%s:%d: allow %s %s: no include uses it any more: remove the line\n",
                    table_path, allows[i].line, allows[i].module, allows[i].header);
            n_bad++;
        }
    if (n_bad) {
        fprintf(stderr,
                "test_layers_order: %d breach(es) of the module order (docs/architecture.md, "
                "\"Module order\")\n",
                n_bad);
        return 1;
    }
    printf("test_layers_order: %d includes in %d files follow the module order (%d modules, %d "
           "allow lines)\n",
           n_includes, n_files, n_mods, n_allows);
    return 0;
}
