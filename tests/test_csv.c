/* CSV reader: headers with quoted names, the label column by name, index or
 * default, CRLF, blanks, a BOM, blank and trailing lines, rewind, records
 * longer than the read buffer; every malformed file refused naming the file,
 * the line and the column. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "scratch.h"
#include "downpour/csv.h"

static char scratch[1024];

static const char *path_of(const char *name)
{
    static char buf[4][1200];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", scratch, name);
    return buf[k];
}

static void write_text(const char *name, const char *text)
{
    write_bytes(path_of(name), text, strlen(text));
}

static dp_csv *open_ok(const char *name, const dp_csv_config *cfg)
{
    dp_csv *c = NULL;
    dp_err err = {{0}};
    int rc = dp_csv_open(&c, path_of(name), cfg, &err);
    CHECKF(rc == 0, "%s: %s", name, err.msg);
    return rc == 0 ? c : NULL;
}

static void open_fails(const char *name, const dp_csv_config *cfg, const char *needle)
{
    dp_csv *c = NULL;
    dp_err err = {{0}};
    CHECKF(dp_csv_open(&c, path_of(name), cfg, &err) != 0 && c == NULL, "%s should be refused",
           name);
    CHECKF(strstr(err.msg, name) != NULL, "message should name %s: %s", name, err.msg);
    CHECKF(strstr(err.msg, needle) != NULL, "message should say '%s': %s", needle, err.msg);
}

/* Reads every row; the last call must fail with `needle` after `good` rows. */
static void rows_fail(const char *name, const dp_csv_config *cfg, int good, const char *needle)
{
    dp_csv *c = open_ok(name, cfg);
    if (!c)
        return;
    float f[16];
    uint32_t l;
    dp_err err = {{0}};
    int n = 0, r;
    while ((r = dp_csv_next(c, f, &l, &err)) == 1)
        n++;
    CHECKF(r == -1 && n == good, "%s: %d rows then %d (want %d rows then a refusal)", name, n,
           r, good);
    CHECKF(strstr(err.msg, name) != NULL, "message should name %s: %s", name, err.msg);
    CHECKF(strstr(err.msg, needle) != NULL, "message should say '%s': %s", needle, err.msg);
    dp_csv_close(c);
}

static void test_basic(void)
{
    /* BOM, CRLF, quoted names with a comma and a quote, blanks, a blank line
     * in the middle and trailing ones; "label" in the middle picks itself. */
    write_text("basic.csv", "\xEF\xBB\xBF" "\"px, 0\", label ,\"say \"\"hi\"\"\"\r\n"
                            " 1.5 ,3, -2\r\n"
                            "\r\n"
                            "0,9,1e3\r\n"
                            "\"7\",0,  .25\r\n"
                            "\r\n\r\n");
    dp_csv_config cfg;
    dp_csv_config_default(&cfg);
    dp_csv *c = open_ok("basic.csv", &cfg);
    REQUIRE(c != NULL);
    CHECK(dp_csv_columns(c) == 3 && dp_csv_features(c) == 2 && dp_csv_label_column(c) == 1);
    CHECK(strcmp(dp_csv_column_name(c, 0), "px, 0") == 0);
    CHECK(strcmp(dp_csv_column_name(c, 1), "label") == 0);
    CHECK(strcmp(dp_csv_column_name(c, 2), "say \"hi\"") == 0);
    float f[2];
    uint32_t l;
    dp_err err = {{0}};
    for (int epoch = 0; epoch < 2; epoch++) {
        CHECK(dp_csv_next(c, f, &l, &err) == 1 && f[0] == 1.5f && f[1] == -2 && l == 3);
        CHECK(dp_csv_line(c) == 2);
        CHECK(dp_csv_next(c, f, &l, &err) == 1 && f[0] == 0 && f[1] == 1000 && l == 9);
        CHECK(dp_csv_line(c) == 4);
        CHECK(dp_csv_next(c, f, &l, &err) == 1 && f[0] == 7 && f[1] == 0.25f && l == 0);
        CHECK(dp_csv_next(c, f, &l, &err) == 0);
        CHECK(dp_csv_next(c, f, &l, &err) == 0);
        CHECK(dp_csv_rewind(c, &err) == 0);
    }
    dp_csv_close(c);

    /* No "label" column: the first; a file without a final newline. */
    write_text("first.csv", "y,a,b\n2,1,1\n1,0,0");
    c = open_ok("first.csv", &cfg);
    REQUIRE(c != NULL);
    CHECK(dp_csv_label_column(c) == 0);
    CHECK(dp_csv_next(c, f, &l, &err) == 1 && l == 2);
    CHECK(dp_csv_next(c, f, &l, &err) == 1 && l == 1 && f[0] == 0);
    CHECK(dp_csv_next(c, f, &l, &err) == 0);
    dp_csv_close(c);

    /* By name; by index; no header, semicolons, a quoted field over two lines. */
    cfg.label = "b";
    c = open_ok("first.csv", &cfg);
    REQUIRE(c != NULL);
    CHECK(dp_csv_label_column(c) == 2);
    CHECK(dp_csv_next(c, f, &l, &err) == 1 && l == 1 && f[0] == 2 && f[1] == 1);
    dp_csv_close(c);
    dp_csv_config_default(&cfg);
    cfg.label_column = 1;
    c = open_ok("first.csv", &cfg);
    REQUIRE(c != NULL);
    CHECK(dp_csv_next(c, f, &l, &err) == 1 && l == 1 && f[0] == 2 && f[1] == 1);
    dp_csv_close(c);
    write_text("nohdr.csv", "\n1;\"2\";5\n\n3;4;6\n");
    dp_csv_config_default(&cfg);
    cfg.header = 0;
    cfg.delimiter = ';';
    cfg.label_column = 2;
    c = open_ok("nohdr.csv", &cfg);
    REQUIRE(c != NULL);
    CHECK(strcmp(dp_csv_column_name(c, 2), "column 3") == 0);
    CHECKF(dp_csv_next(c, f, &l, &err) == 1, "%s", err.msg);
    CHECK(f[0] == 1 && f[1] == 2 && l == 5 && dp_csv_line(c) == 2);
    CHECK(dp_csv_next(c, f, &l, &err) == 1 && f[0] == 3 && l == 6 && dp_csv_line(c) == 4);
    CHECK(dp_csv_next(c, f, &l, &err) == 0);
    dp_csv_close(c);

    /* A header name over two lines: the rows' line numbers count both. */
    write_text("multi.csv", "\"a\nb\",label\n1,2\n");
    dp_csv_config_default(&cfg);
    c = open_ok("multi.csv", &cfg);
    REQUIRE(c != NULL);
    CHECK(strcmp(dp_csv_column_name(c, 0), "a\nb") == 0);
    CHECK(dp_csv_next(c, f, &l, &err) == 1 && f[0] == 1 && l == 2 && dp_csv_line(c) == 3);
    dp_csv_close(c);

    /* Integral labels written as floats pass. */
    write_text("flab.csv", "label,x\n3.0,1\n4e0,2\n");
    dp_csv_config_default(&cfg);
    c = open_ok("flab.csv", &cfg);
    REQUIRE(c != NULL);
    CHECK(dp_csv_next(c, f, &l, &err) == 1 && l == 3);
    CHECK(dp_csv_next(c, f, &l, &err) == 1 && l == 4);
    dp_csv_close(c);
}

/* A wide file (785 columns, as MNIST in CSV) with records past the 64 KiB
 * read buffer's edges. */
static void test_wide(void)
{
    size_t rows = 300, cols = 785;
    size_t cap = rows * cols * 8 + 65536, n = 0;
    char *t = malloc(cap);
    REQUIRE(t != NULL);
    n += (size_t)snprintf(t + n, cap - n, "label");
    for (size_t j = 1; j < cols; j++)
        n += (size_t)snprintf(t + n, cap - n, ",pixel%zu", j - 1);
    n += (size_t)snprintf(t + n, cap - n, "\n");
    for (size_t i = 0; i < rows; i++) {
        n += (size_t)snprintf(t + n, cap - n, "%zu", i % 10);
        for (size_t j = 1; j < cols; j++)
            n += (size_t)snprintf(t + n, cap - n, ",%zu", (i * 31 + j * 7) % 256);
        n += (size_t)snprintf(t + n, cap - n, "\r\n");
    }
    write_bytes(path_of("wide.csv"), t, n);
    free(t);
    dp_csv_config cfg;
    dp_csv_config_default(&cfg);
    dp_csv *c = open_ok("wide.csv", &cfg);
    REQUIRE(c != NULL);
    CHECK(dp_csv_features(c) == 784);
    float f[784];
    uint32_t l;
    dp_err err = {{0}};
    size_t got = 0, bad = 0;
    int r;
    while ((r = dp_csv_next(c, f, &l, &err)) == 1) {
        if (l != got % 10)
            bad++;
        for (size_t j = 1; j < cols; j++)
            if (f[j - 1] != (float)((got * 31 + j * 7) % 256))
                bad++;
        got++;
    }
    CHECKF(r == 0 && got == rows && bad == 0, "r %d rows %zu bad %zu: %s", r, got, bad, err.msg);
    dp_csv_close(c);
    /* The same file with a record limit below one row's length. */
    cfg.max_record = 1000;
    open_fails("wide.csv", &cfg, "line 1: a record longer than 1000 bytes");
}

static void test_malformed(void)
{
    dp_csv_config cfg;
    dp_csv_config_default(&cfg);
    write_text("few.csv", "label,a,b\n1,2,3\n1,2\n");
    rows_fail("few.csv", &cfg, 1, "line 3 has 2 fields, the header has 3");
    write_text("many.csv", "label,a,b\n1,2,3,\n");
    rows_fail("many.csv", &cfg, 0, "line 2 has 4 fields, the header has 3");
    write_text("ten.csv", "label,a\n9,0\r\n10,0\r\n");
    rows_fail("ten.csv", &cfg, 1, "line 3, column 1 (label): label 10 is not below the class "
                                  "count 10");
    write_text("neg.csv", "a,label\n0,-1\n");
    rows_fail("neg.csv", &cfg, 0, "line 2, column 2 (label): label -1 is negative");
    write_text("half.csv", "a,label\n0,2.5\n");
    rows_fail("half.csv", &cfg, 0, "label '2.5' is not an integer");
    write_text("word.csv", "label,a,b\n1,2,x3\n");
    rows_fail("word.csv", &cfg, 0, "line 2, column 3 (b): 'x3' is not a number");
    write_text("empty_field.csv", "label,a,b\n1,,3\n");
    rows_fail("empty_field.csv", &cfg, 0, "line 2, column 2 (a): empty field");
    write_text("nan.csv", "label,a\n1,nan\n");
    rows_fail("nan.csv", &cfg, 0, "'nan' is not a finite float32");
    write_text("huge.csv", "label,a\n1,1e39\n");
    rows_fail("huge.csv", &cfg, 0, "'1e39' is not a finite float32");
    write_text("midquote.csv", "label,a\n1,12\"3\n2,4\n");
    rows_fail("midquote.csv", &cfg, 0, "line 2, column 2 (a): '12\"3' is not a number");
    write_text("afterq.csv", "label,a\n1,\"2\"x\n");
    rows_fail("afterq.csv", &cfg, 0, "line 2, column 2: text after a closing quote");
    write_text("openq.csv", "label,a\n1,\"2\n3,4\n");
    rows_fail("openq.csv", &cfg, 0, "line 2: a quoted field is never closed");
    write_bytes(path_of("nul.csv"), "label,a\n1,2\0x\n", 14);
    rows_fail("nul.csv", &cfg, 0, "line 2: a NUL byte");
    cfg.max_record = 64;
    char longrow[200];
    memset(longrow, '1', sizeof longrow);
    memcpy(longrow, "label,a\n1,", 10);
    longrow[sizeof longrow - 2] = '\n';
    longrow[sizeof longrow - 1] = '\0';
    write_text("long.csv", longrow);
    rows_fail("long.csv", &cfg, 0, "line 2: a record longer than 64 bytes");
    dp_csv_config_default(&cfg);

    /* Refused on open. */
    write_text("blank.csv", "\n\r\n  \n");
    open_fails("blank.csv", &cfg, "the file is empty (no header)");
    write_text("onecol.csv", "label\n1\n");
    open_fails("onecol.csv", &cfg, "one column");
    write_text("dup.csv", "label,a,label\n1,2,3\n");
    open_fails("dup.csv", &cfg, "two columns are named 'label' (columns 1 and 3)");
    write_text("ok.csv", "y,a\n1,2\n");
    cfg.label = "target";
    open_fails("ok.csv", &cfg, "no column named 'target' for the label (the header has 'y', "
                               "'a')");
    cfg.label_column = 1;
    open_fails("ok.csv", &cfg, "not both");
    dp_csv_config_default(&cfg);
    cfg.label_column = 2;
    open_fails("ok.csv", &cfg, "label column 2 (0-based) is outside the file's 2 columns");
    dp_csv_config_default(&cfg);
    cfg.header = 0;
    cfg.label = "y";
    open_fails("ok.csv", &cfg, "without a header");
    dp_csv_config_default(&cfg);
    cfg.delimiter = '"';
    open_fails("ok.csv", &cfg, "delimiter");
    dp_csv_config_default(&cfg);
    open_fails("absent.csv", &cfg, "No such file");
}

int main(void)
{
    scratch_make(scratch, sizeof scratch, "test_csv");
    test_basic();
    test_wide();
    test_malformed();
    int rc = CHECK_DONE();
    if (rc == 0)
        scratch_remove(scratch);
    return rc;
}
