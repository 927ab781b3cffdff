#include "cli/cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/log.h"
#include "downpour/model.h"
#include "downpour/status.h"

static const cli_opt *find_opt(const cli_opt *opts, int n, const char *name, size_t len)
{
    for (int i = 0; i < n; i++)
        if (opts[i].kind != CLI_SECTION && strlen(opts[i].name) == len &&
            strncmp(opts[i].name, name, len) == 0)
            return &opts[i];
    return NULL;
}

/* Edit distance with transpositions (optimal string alignment: "modle" is
 * one edit from "model"), capped at 99 (words longer than 63 are never close). */
static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 99;
    static int d[64][64]; /* the CLI is single-threaded */
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[la][lb];
}

const char *cli_suggest(const char *word, const char *const *cands, int n)
{
    const char *best = NULL;
    int best_d = 99;
    for (int i = 0; i < n; i++) {
        int d = edit_distance(word, cands[i]);
        if (d < best_d) {
            best_d = d;
            best = cands[i];
        }
    }
    /* a third of the word's letters, at least one: "mnsit" finds mnist,
     * "foo" finds nothing */
    int len = (int)strlen(word);
    int limit = len / 3 > 1 ? len / 3 : 1;
    return best && best_d > 0 && best_d <= limit ? best : NULL;
}

const char *cli_suggest_list(const char *word, const char *list, char *buf, size_t cap)
{
    char copy[1024];
    const char *cands[64];
    int n = 0;
    snprintf(copy, sizeof copy, "%s", list);
    for (char *save = NULL, *t = strtok_r(copy, ", ;", &save); t && n < 64;
         t = strtok_r(NULL, ", ;", &save))
        cands[n++] = t;
    const char *s = cli_suggest(word, cands, n);
    if (!s)
        return NULL;
    snprintf(buf, cap, "%s", s);
    return buf;
}

static void print_default(char *buf, size_t cap, const cli_opt *o)
{
    buf[0] = '\0';
    if (strstr(o->help, "default")) /* the text says it: one default each */
        return;
    switch (o->kind) {
    case CLI_STR: {
        const char *v = *(const char **)o->dst;
        if (v)
            snprintf(buf, cap, " (default: %s)", v);
        break;
    }
    case CLI_INT:
        snprintf(buf, cap, " (default: %ld)", *(long *)o->dst);
        break;
    case CLI_I32:
        snprintf(buf, cap, " (default: %d)", *(int *)o->dst);
        break;
    case CLI_SIZE:
        snprintf(buf, cap, " (default: %zu)", *(size_t *)o->dst);
        break;
    case CLI_NUM:
        if (!isnan(*(double *)o->dst)) /* NAN: unset, the help text says what applies */
            snprintf(buf, cap, " (default: %g)", *(double *)o->dst);
        break;
    case CLI_FLAG:
    case CLI_SECTION:
    case CLI_KIND_COUNT:
        break;
    }
}

#define HELP_WIDTH 80
#define HELP_INDENT 26

/* Prints text from column `col` (the cursor is there) to HELP_WIDTH, the
 * continuation lines at HELP_INDENT; a '\n' in the text starts a new line
 * (its leading spaces dropped: the indent is ours). */
static void print_wrapped(FILE *f, const char *text, int col)
{
    const char *p = text;
    while (*p) {
        if (*p == '\n') {
            fprintf(f, "\n%*s", HELP_INDENT, "");
            col = HELP_INDENT;
            p++;
            while (*p == ' ')
                p++;
            continue;
        }
        if (*p == ' ') {
            p++;
            continue;
        }
        size_t w = strcspn(p, " \n");
        int start = col == HELP_INDENT ? 0 : 1; /* a space before all but a line's first word */
        if (col + start + (int)w > HELP_WIDTH && HELP_INDENT + (int)w > HELP_WIDTH) {
            /* a word wider than the column (a long example): its own line,
             * indented less, so no line passes HELP_WIDTH */
            int ind = HELP_WIDTH - (int)w > 2 ? HELP_WIDTH - (int)w : 2;
            fprintf(f, "\n%*s", ind, "");
            col = ind;
            start = 0;
        } else if (col + start + (int)w > HELP_WIDTH && col > HELP_INDENT) {
            fprintf(f, "\n%*s", HELP_INDENT, "");
            col = HELP_INDENT;
            start = 0;
        }
        if (start)
            fputc(' ', f);
        for (size_t i = 0; i < w; i++) /* \x1f: a space that never breaks a line */
            fputc(p[i] == '\x1f' ? ' ' : p[i], f);
        col += start + (int)w;
        p += w;
        /* keep runs of spaces inside a line (a table in the text) */
        size_t sp = strspn(p, " ");
        if (sp > 1 && p[sp] && p[sp] != '\n' && col + (int)sp < HELP_WIDTH) {
            fprintf(f, "%*s", (int)sp - 1, "");
            col += (int)sp - 1;
        }
    }
    fputc('\n', f);
}

void cli_print_help(const char *usage, const cli_opt *opts, int n_opts)
{
    FILE *f = stdout; /* asked for: not an error */
    fprintf(f, "usage: %s\n", usage);
    bool sections = n_opts > 0 && opts[0].kind == CLI_SECTION;
    if (!sections)
        fprintf(f, "\noptions:\n");
    for (int i = 0; i < n_opts; i++) {
        const cli_opt *o = &opts[i];
        if (o->kind == CLI_SECTION) {
            fprintf(f, "\n%s:\n", o->help);
            continue;
        }
        char left[64], text[4600], def[128];
        if (o->kind == CLI_FLAG)
            snprintf(left, sizeof left, "--%s", o->name);
        else
            snprintf(left, sizeof left, "--%s %s", o->name, o->meta ? o->meta : "VALUE");
        print_default(def, sizeof def, o);
        snprintf(text, sizeof text, "%s%s", o->help, def);
        int col = fprintf(f, "  %s", left);
        if (col > HELP_INDENT - 1) { /* a long name: the text starts on the next line */
            fprintf(f, "\n%*s", HELP_INDENT, "");
        } else {
            fprintf(f, "%*s", HELP_INDENT - col, "");
        }
        print_wrapped(f, text, HELP_INDENT);
    }
    fprintf(f, "\n  %-*s%s\n", HELP_INDENT - 2, "--help", "show this help");
}

/* "unknown option '--x'", with the closest option's name when one is close. */
static void unknown_option(const cli_opt *opts, int n_opts, const char *dashes,
                           const char *name, size_t len)
{
    const char *cands[256];
    int n = 0;
    for (int i = 0; i < n_opts && n < 256; i++)
        if (opts[i].kind != CLI_SECTION)
            cands[n++] = opts[i].name;
    char word[64];
    snprintf(word, sizeof word, "%.*s", (int)(len < 63 ? len : 63), name);
    const char *near = cli_suggest(word, cands, n);
    if (near)
        fprintf(stderr, "downpour: unknown option '%s%s'; did you mean --%s? (see --help)\n",
                dashes, word, near);
    else
        fprintf(stderr, "downpour: unknown option '%s%s' (see --help)\n", dashes, word);
}

static int set_value(const cli_opt *o, const char *val)
{
    dp_err err;
    char what[80];
    snprintf(what, sizeof what, "--%s", o->name);
    switch (o->kind) {
    case CLI_STR:
        if (!*val) {
            fprintf(stderr, "downpour: %s: empty value\n", what);
            return -1;
        }
        *(const char **)o->dst = val;
        return 0;
    case CLI_INT: {
        long v;
        if (dp_parse_long(val, (long)o->lo, (long)o->hi, &v, what, &err) < 0)
            break;
        *(long *)o->dst = v;
        return 0;
    }
    case CLI_NUM: {
        double v;
        if (dp_parse_double(val, o->lo, o->hi, &v, what, &err) < 0)
            break;
        *(double *)o->dst = v;
        return 0;
    }
    case CLI_I32:
    case CLI_SIZE: {
        long v;
        if (dp_parse_long(val, (long)o->lo, (long)o->hi, &v, what, &err) < 0)
            break;
        if (o->kind == CLI_I32)
            *(int *)o->dst = (int)v;
        else
            *(size_t *)o->dst = (size_t)v;
        return 0;
    }
    case CLI_FLAG:
    case CLI_SECTION:
    case CLI_KIND_COUNT:
        return -1;
    }
    fprintf(stderr, "downpour: %s\n", err.msg);
    return -1;
}

int cli_parse(const char *usage, const cli_opt *opts, int n_opts, int argc, char **argv,
              int *rest)
{
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            cli_print_help(usage, opts, n_opts);
            return 1;
        }
        if (a[0] == '-' && a[1] != '-' && a[1] && !(a[1] >= '0' && a[1] <= '9')) {
            /* "-np 4", "-lr": one dash is no option of ours, and no argument either */
            size_t l = strlen(a + 1);
            const cli_opt *o = find_opt(opts, n_opts, a + 1, l);
            if (o)
                fprintf(stderr, "downpour: unknown option '%s'; did you mean --%s? (options "
                                "take two dashes)\n", a, o->name);
            else
                unknown_option(opts, n_opts, "-", a + 1, l);
            return -1;
        }
        if (strncmp(a, "--", 2) != 0)
            break;
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const cli_opt *o = find_opt(opts, n_opts, name, len);
        if (!o) {
            unknown_option(opts, n_opts, "--", name, len);
            return -1;
        }
        if (o->kind == CLI_FLAG) {
            if (eq) {
                fprintf(stderr, "downpour: --%s takes no value\n", o->name);
                return -1;
            }
            *(bool *)o->dst = true;
            continue;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (!val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "downpour: --%s needs a value (%s)\n", o->name,
                        o->meta ? o->meta : "VALUE");
                return -1;
            }
            val = argv[++i];
        }
        if (set_value(o, val) < 0)
            return -1;
    }
    *rest = i;
    return 0;
}

cli_opt cli_opt_of(const dp_opt *o, void *settings)
{
    static const cli_kind kinds[DP_OPT_KIND_COUNT] = {
        [DP_OPT_STR] = CLI_STR, [DP_OPT_INT] = CLI_I32, [DP_OPT_SIZE] = CLI_SIZE,
        [DP_OPT_NUM] = CLI_NUM, [DP_OPT_FLAG] = CLI_FLAG};
    return (cli_opt){o->name, kinds[o->kind], (char *)settings + o->offset, o->meta, o->help,
                     o->lo, o->hi};
}

bool cli_is_task_command(const char *name)
{
    return strcmp(name, "train") == 0 || strcmp(name, "ping") == 0;
}

int cli_apply_log_level(const char *cmd, const char *level, bool verbose)
{
    dp_log_level l = dp_log_get_level();
    if (level && dp_log_level_parse(level, &l) < 0) {
        fprintf(stderr, "downpour %s: --log-level '%s': expected error, warn, info or debug\n",
                cmd, level);
        return -1;
    }
    if (verbose)
        l = DP_LOG_DEBUG;
    if (!level && !verbose)
        return 0;
    dp_log_set_level(l);
    setenv(DP_LOG_LEVEL_ENV, dp_log_level_name(l), 1);
    return 0;
}

int cli_parse_straggler(const char *s, long *k, double *ms, dp_err *err)
{
    char buf[64];
    const char *colon = strchr(s, ':');
    if (!colon || strlen(s) >= sizeof buf)
        return dp_errf(err, "--straggler '%s': expected K:MS", s);
    memcpy(buf, s, (size_t)(colon - s));
    buf[colon - s] = '\0';
    if (dp_parse_long(buf, 0, 4095, k, "--straggler K", err) < 0)
        return -1;
    return dp_parse_double(colon + 1, 0, 60000, ms, "--straggler MS", err);
}

int cli_check_straggler(const char *s, long k, int chief, int workers, dp_err *err)
{
    /* K is a trainer's shard index (src/train/loop.c): a worker's index, or
     * its replica position where the chief is position 0 (allreduce), so
     * none reaches chief + workers. */
    if (k < chief + workers)
        return 0;
    return dp_errf(err, "--straggler %s: there is no training task %ld: this cluster has %d "
                        "worker(s) and %s chief, so K must be below %d",
                   s, k, workers, chief ? "a" : "no", chief + workers);
}
