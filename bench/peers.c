/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peers.c - reads the peers' timings that bench/peer_bench.py --json writes: a JSON list of objects
 * {"impl", "head_dim", "causal", "seqlen", "batch", "heads", "pass", "tflops", ...}. A small JSON reader of
 * its own (strings, numbers, true/false/null, nested lists and objects are skipped); unknown fields are
 * ignored, and records without an impl, pass or tflops are dropped.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peers.h"

typedef struct reader {
    const char *s, *end;
} reader;

enum { J_STRING, J_NUMBER, J_TRUE, J_FALSE, J_NULL, J_ARRAY, J_OBJECT };

typedef struct jvalue {
    int kind;
    char str[64]; /* J_STRING, truncated */
    double num;   /* J_NUMBER */
} jvalue;

static void skip_ws(reader *r) {
    while (r->s < r->end && (*r->s == ' ' || *r->s == '\t' || *r->s == '\n' || *r->s == '\r')) r->s++;
}

static int expect(reader *r, char c) {
    skip_ws(r);
    if (r->s >= r->end || *r->s != c) return -1;
    r->s++;
    return 0;
}

static int parse_string(reader *r, char *out, size_t size) {
    size_t n = 0;
    if (expect(r, '"')) return -1;
    while (r->s < r->end && *r->s != '"') {
        char c = *r->s++;
        if (c == '\\') {
            if (r->s >= r->end) return -1;
            char e = *r->s++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u':
                if (r->end - r->s < 4) return -1;
                r->s += 4;
                c = '?'; /* the names we read are ASCII; anything else is shown as '?' */
                break;
            default: c = e; break; /* \" \\ \/ */
            }
        }
        if (n + 1 < size) out[n++] = c;
    }
    if (r->s >= r->end) return -1;
    r->s++;
    if (size) out[n] = '\0';
    return 0;
}

static int parse_value(reader *r, jvalue *v, int depth);

/* Skips the members of a list or object after its opening bracket. */
static int skip_container(reader *r, char close, int object, int depth) {
    skip_ws(r);
    if (r->s < r->end && *r->s == close) {
        r->s++;
        return 0;
    }
    for (;;) {
        jvalue v;
        if (object) {
            char key[8];
            if (parse_string(r, key, sizeof key) || expect(r, ':')) return -1;
        }
        if (parse_value(r, &v, depth + 1)) return -1;
        skip_ws(r);
        if (r->s < r->end && *r->s == ',') {
            r->s++;
            continue;
        }
        return expect(r, close);
    }
}

static int parse_value(reader *r, jvalue *v, int depth) {
    if (depth > 64) return -1;
    skip_ws(r);
    if (r->s >= r->end) return -1;
    const char c = *r->s;
    if (c == '"') {
        v->kind = J_STRING;
        return parse_string(r, v->str, sizeof v->str);
    }
    if (c == '[' || c == '{') {
        v->kind = c == '[' ? J_ARRAY : J_OBJECT;
        r->s++;
        return skip_container(r, c == '[' ? ']' : '}', c == '{', depth);
    }
    static const struct {
        const char *word;
        int kind;
    } words[] = {
        { "true", J_TRUE }, { "false", J_FALSE }, { "null", J_NULL }, { "NaN", J_NULL }, { "Infinity", J_NULL }
    };
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        size_t n = strlen(words[i].word);
        if ((size_t)(r->end - r->s) >= n && !strncmp(r->s, words[i].word, n)) {
            r->s += n;
            v->kind = words[i].kind;
            return 0;
        }
    }
    char num[64];
    size_t n = 0;
    while (r->s + n < r->end && n < sizeof num - 1 && strchr("+-0123456789.eE", r->s[n])) {
        num[n] = r->s[n];
        n++;
    }
    num[n] = '\0';
    char *end;
    v->num = strtod(num, &end);
    if (n == 0 || *end) return -1;
    r->s += n;
    v->kind = J_NUMBER;
    return 0;
}

static void copy_text(char *dst, size_t size, const char *src) {
    size_t n = strlen(src);
    if (n >= size) n = size - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* One record object, after its '{'. Returns 1 when it has what a bar needs, 0 when not, -1 on bad JSON. */
static int parse_record(reader *r, peer_record *rec) {
    memset(rec, 0, sizeof *rec);
    rec->tflops = -1;
    skip_ws(r);
    if (r->s < r->end && *r->s == '}') {
        r->s++;
        return 0;
    }
    for (;;) {
        char key[32];
        jvalue v;
        if (parse_string(r, key, sizeof key) || expect(r, ':') || parse_value(r, &v, 1)) return -1;
        const int num = v.kind == J_NUMBER, boolean = v.kind == J_TRUE || v.kind == J_FALSE;
        if (!strcmp(key, "impl") && v.kind == J_STRING) copy_text(rec->impl, sizeof rec->impl, v.str);
        if (!strcmp(key, "pass") && v.kind == J_STRING) copy_text(rec->pass, sizeof rec->pass, v.str);
        if (!strcmp(key, "head_dim") && num) rec->head_dim = (int)v.num;
        if (!strcmp(key, "seqlen") && num) rec->seqlen = (int)v.num;
        if (!strcmp(key, "batch") && num) rec->batch = (int)v.num;
        if (!strcmp(key, "heads") && num) rec->heads = (int)v.num;
        if (!strcmp(key, "tflops") && num) rec->tflops = v.num;
        if (!strcmp(key, "causal")) rec->causal = boolean ? v.kind == J_TRUE : num ? v.num != 0 : 0;
        skip_ws(r);
        if (r->s < r->end && *r->s == ',') {
            r->s++;
            continue;
        }
        if (expect(r, '}')) return -1;
        break;
    }
    return rec->impl[0] && (!strcmp(rec->pass, "fwd") || !strcmp(rec->pass, "bwd")) && rec->tflops >= 0;
}

int peers_read(const char *path, peer_record **out, char *err, int err_size) {
    *out = NULL;
    err[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, (size_t)err_size, "cannot open %s: %s", path, strerror(errno));
        return -2;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 > cap) {
            cap = cap ? 2 * cap : 65536;
            char *grow = cap <= ((size_t)64 << 20) ? realloc(text, cap) : NULL;
            if (!grow) {
                free(text);
                fclose(f);
                snprintf(err, (size_t)err_size, "%s is too large", path);
                return -2;
            }
            text = grow;
        }
        size_t n = fread(text + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    if (ferror(f)) {
        snprintf(err, (size_t)err_size, "cannot read %s", path);
        free(text);
        fclose(f);
        return -2;
    }
    fclose(f);

    reader r = { text, text + len };
    peer_record *recs = NULL;
    int count = 0, capacity = 0;
    if (expect(&r, '[')) goto bad;
    skip_ws(&r);
    if (r.s < r.end && *r.s == ']') {
        r.s++;
    } else {
        for (;;) {
            if (count == capacity) {
                capacity = capacity ? 2 * capacity : 64;
                peer_record *grow = realloc(recs, sizeof *recs * (size_t)capacity);
                if (!grow) goto bad;
                recs = grow;
            }
            skip_ws(&r);
            if (r.s < r.end && *r.s == '{') {
                r.s++;
                int got = parse_record(&r, &recs[count]);
                if (got < 0) goto bad;
                count += got;
            } else {
                jvalue v;
                if (parse_value(&r, &v, 1)) goto bad;
            }
            skip_ws(&r);
            if (r.s < r.end && *r.s == ',') {
                r.s++;
                continue;
            }
            if (expect(&r, ']')) goto bad;
            break;
        }
    }
    skip_ws(&r);
    if (r.s != r.end) goto bad;
    free(text);
    *out = recs;
    return count;
bad:
    snprintf(err, (size_t)err_size, "%s: not a JSON list of records (at byte %ld)", path, (long)(r.s - text));
    free(text);
    free(recs);
    return -1;
}
