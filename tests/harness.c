/* SPDX-License-Identifier: Apache-2.0 */
/*
 * harness.c - see harness.h.
 */
#include "harness.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

th_options th_opt = { NULL, NULL, 1, 0, 0 };

static int passed, failed, unsupported, skipped;

void th_init(int argc, char **argv, const char *usage) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: %s [-k SUBSTRING[,...]] [--seed S] [-v] [--quick]%s\n", argv[0], usage ? usage : "");
            exit(0);
        } else if (!strcmp(a, "-k") && i + 1 < argc) {
            th_opt.filter = argv[++i];
        } else if (!strcmp(a, "-b") && i + 1 < argc) {
            th_opt.backends = argv[++i];
        } else if (!strcmp(a, "--seed") && i + 1 < argc) {
            char *end;
            th_opt.seed = strtoull(argv[++i], &end, 0);
            if (*end) {
                fprintf(stderr, "%s: --seed: expected an integer, got '%s'\n", argv[0], argv[i]);
                exit(2);
            }
        } else if (!strcmp(a, "-v")) {
            th_opt.verbose = 1;
        } else if (!strcmp(a, "--quick")) {
            th_opt.quick = 1;
        } else {
            fprintf(stderr, "%s: unknown option '%s' (try -h)\n", argv[0], a);
            exit(2);
        }
    }
}

int th_selected(const char *name) {
    if (!th_opt.filter || !*th_opt.filter) return 1;
    const char *f = th_opt.filter;
    while (*f) {
        const char *comma = strchr(f, ',');
        size_t n = comma ? (size_t)(comma - f) : strlen(f);
        char part[256];
        if (n >= sizeof part) n = sizeof part - 1;
        memcpy(part, f, n);
        part[n] = '\0';
        if (n && strstr(name, part)) return 1;
        f += comma ? n + 1 : n;
    }
    return 0;
}

static void line(const char *tag, const char *fmt, va_list ap) {
    printf("%-6s", tag);
    vprintf(fmt, ap);
    putchar('\n');
    fflush(stdout);
}

void th_pass(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    line("PASS", fmt, ap);
    va_end(ap);
    passed++;
}

void th_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    line("FAIL", fmt, ap);
    va_end(ap);
    failed++;
}

void th_unsupported(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    line("UNSUP", fmt, ap);
    va_end(ap);
    unsupported++;
}

void th_skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    line("SKIP", fmt, ap);
    va_end(ap);
    skipped++;
}

int th_check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    line(ok ? "PASS" : "FAIL", fmt, ap);
    va_end(ap);
    if (ok)
        passed++;
    else
        failed++;
    return ok;
}

int th_finish(void) {
    if (unsupported || skipped) printf("%d unsupported, %d skipped\n", unsupported, skipped);
    printf("%d passed, %d failed\n", passed, failed);
    fflush(stdout);
    return failed ? 1 : 0;
}
