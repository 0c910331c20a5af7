/* SPDX-License-Identifier: Apache-2.0 */
/*
 * harness.h - the test programs' small framework: command line (-k filter, --seed, -v), one line per case,
 * counters, and the summary line "N passed, M failed" that ends every test program's output.
 */
#ifndef FLASHATTN_TESTS_HARNESS_H
#define FLASHATTN_TESTS_HARNESS_H

#include <stdint.h>

typedef struct th_options {
    const char *filter;   /* -k SUBSTRING[,SUBSTRING...]: only cases whose name contains one of them */
    const char *backends; /* -b cpu,cuda,...: backends to test (test_backends) */
    uint64_t seed;        /* --seed S */
    int verbose;          /* -v */
    int quick;            /* --quick: the small cases only */
} th_options;

extern th_options th_opt;

/* Parses the common options (exits 2 on a bad one, 0 after -h); `usage` is printed with -h. */
void th_init(int argc, char **argv, const char *usage);

/* 1 if a case named `name` passes the -k filter. */
int th_selected(const char *name);

/* One result line each: "PASS  <text>", "FAIL  <text>", "UNSUP <text>" (unsupported, not a failure),
 * "SKIP  <text>". th_check passes or fails on `ok` and returns it. */
void th_pass(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void th_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void th_unsupported(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void th_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int th_check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints the counts of unsupported and skipped cases, then exactly "N passed, M failed" as the last line.
 * Returns the exit code: 1 if anything failed, else 0. */
int th_finish(void);

#endif /* FLASHATTN_TESTS_HARNESS_H */
