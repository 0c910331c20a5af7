/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench.c - `flashattn bench`: timing one problem on one or more backends, or a sweep (bench/sweep.h): the
 * FlashAttention-2 paper's (16k tokens, hidden 2048, seqlen 512..16k, head_dim 64/128/256, causal and not,
 * forward and backward) or a CPU-sized one, with CSV and JSON output written row by row (so that an
 * interrupted run keeps what it measured) and the paper's bar charts (bench/plot.h), optionally with peers'
 * bars (bench/peers.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "../bench/peers.h"
#include "../bench/plot.h"
#include "../bench/sweep.h"

typedef struct bench_row {
    fa_backend backend;
    int head_dim, causal, seqlen, batch, heads;
    double ms[2], tflops[2]; /* forward, backward; NaN when not measured */
    fa_status st[2];
} bench_row;

static const char *const pass_names[2] = { "fwd", "bwd" };

/* Host-only runs report GFLOP/s: a CPU reaches tens to hundreds of them, which read as "0.06" in TFLOP/s. */
static int gflops_units(const cli_options *o) {
    for (int i = 0; i < o->nbackends; i++)
        if (vf_backend_on_device(o->backends[i])) return 0;
    return 1;
}

static const char *unit_name(int gflops) {
    return gflops ? "GFLOP/s" : "TFLOP/s";
}

/* The CSV and JSON files. Both hold every row measured so far at any time: the CSV is flushed after each
 * row, and the JSON file is rewritten whole (into a temporary file renamed over it) after each row, so that
 * it is a valid JSON list even when the run is interrupted. */
typedef struct bench_out {
    FILE *csv;
    const char *json_path;
    char **json_recs; /* one rendered JSON object per pass measured */
    int njson, json_cap;
} bench_out;

static int json_flush(const bench_out *out);

static int out_open(bench_out *out, const cli_options *o) {
    memset(out, 0, sizeof *out);
    if (o->csv) {
        if (!(out->csv = fopen(o->csv, "w"))) {
            fprintf(stderr, "flashattn: --csv: cannot write %s\n", o->csv);
            return EXIT_RUNTIME;
        }
        fprintf(out->csv, "backend,device,dtype,batch,seqlen_q,seqlen_k,heads_q,heads_kv,head_dim,causal,window_left,"
                          "window_right,softcap,alibi,varlen,deterministic,pass,ms,tflops,status\n");
        fflush(out->csv);
    }
    out->json_path = o->json;
    if (json_flush(out) != 0) { /* "[]" until the first row: valid JSON from the start */
        fprintf(stderr, "flashattn: --json: cannot write %s\n", o->json);
        return EXIT_RUNTIME;
    }
    return EXIT_OK;
}

static void out_close(bench_out *out) {
    if (out->csv) fclose(out->csv);
    for (int i = 0; i < out->njson; i++) free(out->json_recs[i]);
    free(out->json_recs);
    memset(out, 0, sizeof *out);
}

static void json_string(char *buf, size_t n, const char *s) {
    size_t k = 0;
    if (n < 3) return;
    buf[k++] = '"';
    for (; *s && k + 3 < n; s++) {
        if (*s == '"' || *s == '\\') buf[k++] = '\\';
        buf[k++] = (unsigned char)*s < 0x20 ? ' ' : *s;
    }
    buf[k++] = '"';
    buf[k] = '\0';
}

static void json_number(char *buf, size_t n, double v) {
    if (isfinite(v))
        snprintf(buf, n, "%.6g", v);
    else
        snprintf(buf, n, "null");
}

/* Adds one measured pass to the JSON records (the fields of the CSV, plus "impl", "seqlen" and "heads" in
 * the form bench/peer_bench.py writes, so that a saved run can be given to --peers). */
static int json_add(bench_out *out, const cli_options *o, const bench_row *r, int pass, const char *dev) {
    if (!out->json_path) return 0;
    if (out->njson == out->json_cap) {
        int cap = out->json_cap ? 2 * out->json_cap : 64;
        char **recs = realloc(out->json_recs, sizeof(char *) * (size_t)cap);
        if (!recs) return -1;
        out->json_recs = recs, out->json_cap = cap;
    }
    char impl[64], jimpl[80], jdev[640], ms[32], tf[32];
    snprintf(impl, sizeof impl, "flashattn %s", cli_backend_name(r->backend));
    json_string(jimpl, sizeof jimpl, impl);
    json_string(jdev, sizeof jdev, dev);
    json_number(ms, sizeof ms, r->ms[pass]);
    json_number(tf, sizeof tf, r->tflops[pass]);
    const int seqlen_k = o->sweep ? r->seqlen : o->seqlen_k, heads_kv = o->sweep ? r->heads : o->heads_kv;
    enum { REC_BYTES = 2048 }; /* room for every field with the longest device name */
    char *rec = malloc(REC_BYTES);
    if (!rec) return -1;
    int len =
        snprintf(rec, REC_BYTES,
                 "{\"impl\": %s, \"backend\": \"%s\", \"device\": %s, \"dtype\": \"%s\", \"batch\": %d, "
                 "\"seqlen\": %d, \"seqlen_q\": %d, \"seqlen_k\": %d, \"heads\": %d, \"heads_q\": %d, "
                 "\"heads_kv\": %d, \"head_dim\": %d, \"causal\": %s, \"window_left\": %d, \"window_right\": %d, "
                 "\"softcap\": %g, \"alibi\": %s, \"varlen\": %s, \"deterministic\": %s, \"pass\": \"%s\", "
                 "\"ms\": %s, \"tflops\": %s, \"status\": \"%s\"}",
                 jimpl, cli_backend_name(r->backend), jdev, cli_dtype_name(o->dtype), r->batch, r->seqlen, r->seqlen,
                 seqlen_k, r->heads, r->heads, heads_kv, r->head_dim, r->causal ? "true" : "false", o->window_left,
                 o->window_right, (double)o->softcap, o->alibi ? "true" : "false", o->varlen ? "true" : "false",
                 o->deterministic ? "true" : "false", pass_names[pass], ms, tf, fa_status_name(r->st[pass]));
    if (len < 0 || len >= REC_BYTES) {
        free(rec);
        return -1;
    }
    out->json_recs[out->njson++] = rec;
    return 0;
}

/* Rewrites the JSON file with every record so far; a rename replaces it in one step. */
static int json_flush(const bench_out *out) {
    if (!out->json_path) return 0;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", out->json_path);
    FILE *f = fopen(tmp, "w");
    if (!f) return -1;
    fputs("[", f);
    for (int i = 0; i < out->njson; i++) fprintf(f, "%s\n  %s", i ? "," : "", out->json_recs[i]);
    fputs(out->njson ? "\n]\n" : "]\n", f);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, out->json_path) != 0) {
        remove(tmp);
        return -1;
    }
    return 0;
}

static void csv_write(FILE *f, const cli_options *o, const bench_row *r, int pass, const char *device) {
    if (!f) return;
    char dev[300];
    snprintf(dev, sizeof dev, "%s", device);
    for (char *c = dev; *c; c++)
        if (*c == ',') *c = ';';
    fprintf(f, "%s,%s,%s,%d,%d,%d,%d,%d,%d,%d,%d,%d,%g,%d,%d,%d,%s,%.6g,%.6g,%s\n", cli_backend_name(r->backend), dev,
            cli_dtype_name(o->dtype), r->batch, r->seqlen, o->sweep ? r->seqlen : o->seqlen_k, r->heads,
            o->sweep ? r->heads : o->heads_kv, r->head_dim, r->causal, o->window_left, o->window_right,
            (double)o->softcap, o->alibi, o->varlen, o->deterministic, pass_names[pass], r->ms[pass], r->tflops[pass],
            fa_status_name(r->st[pass]));
}

/* Writes the measured passes of one row to the CSV and the JSON file, both complete on disk afterwards. */
static int out_row(bench_out *out, const cli_options *o, const bench_row *r) {
    char dev[300];
    cli_device_name(r->backend, o, dev, sizeof dev);
    int failed = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (r->st[pass] != FA_OK || isnan(r->ms[pass])) continue;
        csv_write(out->csv, o, r, pass, dev);
        failed |= json_add(out, o, r, pass, dev) != 0;
    }
    if (out->csv) failed |= fflush(out->csv) != 0 || ferror(out->csv);
    failed |= json_flush(out) != 0;
    if (failed) fprintf(stderr, "flashattn: cannot write the results (%s)\n", out->json_path ? out->json_path : o->csv);
    return failed ? EXIT_RUNTIME : EXIT_OK;
}

/* Times the forward and (when backward) the backward of pr on backend b into r. */
static void measure(const cli_options *o, fa_backend b, vf_problem *pr, int backward, int warmup, int repeats,
                    bench_row *r) {
    fa_exec x = cli_exec(o, b);
    x.check = 0; /* the device-side checks synchronise: not part of what is timed */
    r->backend = b;
    for (int pass = 0; pass < 2; pass++) {
        r->ms[pass] = r->tflops[pass] = NAN;
        r->st[pass] = FA_OK;
        if (pass == 1 && !backward) continue;
        if (pass == 1 && r->st[0] != FA_OK) {
            r->st[1] = r->st[0];
            continue;
        }
        r->st[pass] = vf_time(pr, &x, pass, warmup, repeats, &r->ms[pass]);
        if (r->st[pass] == FA_OK) r->tflops[pass] = vf_flops(pr, pass) / r->ms[pass] * 1e-9;
    }
}

static const char *short_status(fa_status st) {
    switch (st) {
    case FA_ERR_UNSUPPORTED: return "unsup";
    case FA_ERR_OUT_OF_MEMORY: return "oom";
    case FA_ERR_NOT_COMPILED: return "not-built";
    case FA_ERR_NO_DEVICE: return "no-gpu";
    default: return "error";
    }
}

/* A table cell: the rate in the table's unit (scale 1000 for GFLOP/s), "-" when not measured. */
static void print_cell(double tflops, fa_status st, double scale) {
    if (st == FA_OK && !isnan(tflops))
        printf(" %10.4g", tflops * scale);
    else if (st == FA_OK)
        printf(" %10s", "-");
    else
        printf(" %10s", short_status(st));
}

/* "42 s", "12 min", "3.4 h" */
static void format_duration(char *buf, size_t n, double seconds) {
    if (seconds < 100)
        snprintf(buf, n, "%.0f s", seconds);
    else if (seconds < 6000)
        snprintf(buf, n, "%.0f min", seconds / 60);
    else
        snprintf(buf, n, "%.1f h", seconds / 3600);
}

/* ---------------------------------------------------------------------------------------------------------
 * One problem
 * ------------------------------------------------------------------------------------------------------- */

static int bench_single(cli_options *o, int gpu, int warmup, int repeats) {
    const int gflops = gflops_units(o);
    char desc[256];
    cli_describe(o, desc, sizeof desc);
    printf("flashattn bench: %s, seed %llu; median of %d after %d warm-up, %s by the paper's formula%s\n", desc,
           (unsigned long long)o->seed, repeats, warmup, unit_name(gflops),
           gpu ? " (GPU: CUDA events, L2 flushed before each run)" : "");
    printf("%-10s %-28s %-4s %12s %10s\n", "backend", "device", "pass", "ms", unit_name(gflops));
    bench_out out;
    int code = out_open(&out, o);
    if (code != EXIT_OK) return code;
    for (int i = 0; i < o->nbackends; i++) {
        fa_backend b = o->backends[i];
        vf_problem pr;
        int c = cli_make_problem(o, b, o->bwd, &pr);
        if (c != EXIT_OK) {
            code = code ? code : c;
            continue;
        }
        bench_row r = { .head_dim = o->head_dim,
                        .causal = o->causal > 0,
                        .seqlen = o->seqlen_q,
                        .batch = o->batch,
                        .heads = o->heads };
        measure(o, b, &pr, o->bwd, warmup, repeats, &r);
        char dev[300];
        cli_device_name(b, o, dev, sizeof dev);
        for (int pass = 0; pass < 1 + o->bwd; pass++) {
            if (r.st[pass] != FA_OK) {
                code =
                    code ? code
                         : cli_report_status(r.st[pass], cli_backend_name(b), pr.error[0] ? pr.error : fa_last_error());
                continue;
            }
            printf("%-10s %-28.28s %-4s %12.4f %10.4g\n", cli_backend_name(b), dev, pass_names[pass], r.ms[pass],
                   r.tflops[pass] * (gflops ? 1e3 : 1.0));
        }
        fflush(stdout);
        c = out_row(&out, o, &r);
        code = code ? code : c;
        vf_problem_destroy(&pr);
    }
    out_close(&out);
    return code;
}

/* ---------------------------------------------------------------------------------------------------------
 * Sweeps
 * ------------------------------------------------------------------------------------------------------- */

const char *cli_sweep_names(void) {
    return sweep_names();
}

int cli_sweep_known(const char *name) {
    return sweep_find(name) != NULL;
}

typedef struct sweep {
    const sweep_spec *spec;
    int dims[3], ndims, causals[2], ncausal, seqlens[6], nseq;
    bench_row *rows; /* [dim][causal][seqlen][backend] */
    int nrows;
} sweep;

static bench_row *sweep_row(const sweep *s, const cli_options *o, int di, int ci, int si, int bi) {
    return &s->rows[((di * s->ncausal + ci) * s->nseq + si) * o->nbackends + bi];
}

/* The options of one row of the sweep. */
static cli_options sweep_options(const cli_options *o, const sweep *s, int di, int ci, int si) {
    cli_options c = *o;
    const int d = s->dims[di], seqlen = s->seqlens[si];
    c.head_dim = d;
    sweep_shape(s->spec, d, seqlen, &c.batch, &c.heads);
    c.heads_kv = c.heads;
    c.seqlen_q = c.seqlen_k = seqlen;
    c.causal = s->causals[ci];
    return c;
}

/* FLOPs of one timed run of a row, forward plus (when timed) backward, by the paper's formula. */
static double row_flops(const cli_options *c, int backward) {
    return sweep_flops(c->batch, c->heads, c->seqlen_q, c->seqlen_k, c->head_dim, c->causal, backward);
}

/* FLOP/s of backend b on a small problem (a fraction of a second on a CPU), forward in rate[0] and backward in
 * rate[1], to estimate a sweep's duration before it starts. 0 when it cannot run. */
static void calibrate(const cli_options *o, fa_backend b, int backward, double rate[2]) {
    rate[0] = rate[1] = 0;
    cli_options c = *o;
    c.batch = 1, c.heads = c.heads_kv = 4, c.seqlen_q = c.seqlen_k = 512, c.head_dim = 128, c.causal = 0;
    c.window_left = c.window_right = -1, c.softcap = 0, c.alibi = 0, c.varlen = 0;
    vf_config cfg;
    cli_config(&c, &cfg);
    vf_problem pr;
    if (vf_problem_create(&pr, &cfg) != FA_OK) return;
    fa_exec x = cli_exec(&c, b);
    x.check = 0;
    for (int pass = 0; pass < 1 + backward; pass++) {
        double ms = 0;
        if (vf_time(&pr, &x, pass, 1, 3, &ms) == FA_OK && ms > 0) rate[pass] = vf_flops(&pr, pass) / (ms * 1e-3);
    }
    vf_problem_destroy(&pr);
}

static double combined_tflops(double fwd, double bwd) {
    /* fwd + bwd counts 3.5x the forward's FLOPs over the sum of both times */
    if (isnan(fwd) || isnan(bwd) || fwd <= 0 || bwd <= 0) return NAN;
    return 3.5 / (1.0 / fwd + 2.5 / bwd);
}

static double peer_value(const peer_record *peers, int npeers, const char *impl, int d, int causal, int seqlen,
                         int pass) {
    double v[2] = { NAN, NAN };
    for (int i = 0; i < npeers; i++) {
        const peer_record *p = &peers[i];
        if (strcmp(p->impl, impl) || p->head_dim != d || p->causal != causal || p->seqlen != seqlen) continue;
        if (!strcmp(p->pass, "fwd")) v[0] = p->tflops;
        if (!strcmp(p->pass, "bwd")) v[1] = p->tflops;
    }
    return pass < 2 ? v[pass] : combined_tflops(v[0], v[1]);
}

static void seqlen_label(int s, char *buf, size_t n) {
    if (s >= 1024 && s % 1024 == 0)
        snprintf(buf, n, "%dk", s / 1024);
    else
        snprintf(buf, n, "%d", s);
}

/* One SVG per (head_dim, causal, pass) measured: forward, and unless --fwd-only backward and forward +
 * backward. The file --plot names is a copy of the main panel: forward + backward (forward alone with
 * --fwd-only) at head_dim 128 without mask when swept, else the first. */
static int write_plots(const cli_options *o, const sweep *s, const peer_record *peers, int npeers) {
    /* the distinct peer implementations, in file order */
    const char *impls[16];
    int nimpl = 0;
    for (int i = 0; i < npeers && nimpl < 16; i++) {
        int seen = 0;
        for (int k = 0; k < nimpl; k++) seen |= !strcmp(impls[k], peers[i].impl);
        if (!seen) impls[nimpl++] = peers[i].impl;
    }
    const int gflops = gflops_units(o);
    const double scale = gflops ? 1e3 : 1.0;
    const int nseries = o->nbackends + nimpl;
    double *values = malloc(sizeof(double) * (size_t)(nseries * s->nseq));
    if (!values) return EXIT_RUNTIME;
    char labels[6][16];
    const char *label_ptr[6];
    for (int si = 0; si < s->nseq; si++) {
        seqlen_label(s->seqlens[si], labels[si], sizeof labels[si]);
        label_ptr[si] = labels[si];
    }
    char stem[1024];
    snprintf(stem, sizeof stem, "%s", o->plot);
    size_t len = strlen(stem);
    if (len > 4 && !strcmp(stem + len - 4, ".svg")) stem[len - 4] = '\0';
    char dev[300];
    cli_device_name(o->backends[0], o, dev, sizeof dev);
    char y_label[64];
    snprintf(y_label, sizeof y_label, "%s (paper formula)", unit_name(gflops));

    static const char *const pass_file[3] = { "fwd", "bwd", "fwdbwd" };
    static const char *const pass_title[3] = { "forward", "backward", "forward + backward" };
    const int npasses = o->fwd_only ? 1 : 3, main_pass = o->fwd_only ? 0 : 2;
    int main_d = 0, main_c = 0;
    for (int di = 0; di < s->ndims; di++)
        for (int ci = 0; ci < s->ncausal; ci++)
            if (s->dims[di] == 128 && !s->causals[ci]) main_d = di, main_c = ci;
    int code = EXIT_OK;
    for (int di = 0; di < s->ndims; di++)
        for (int ci = 0; ci < s->ncausal; ci++)
            for (int pass = 0; pass < npasses; pass++) {
                plot_series series[CLI_MAX_BACKENDS + 16];
                char names[CLI_MAX_BACKENDS][32];
                for (int bi = 0; bi < o->nbackends; bi++) {
                    double *v = values + bi * s->nseq;
                    for (int si = 0; si < s->nseq; si++) {
                        const bench_row *r = sweep_row(s, o, di, ci, si, bi);
                        v[si] = scale * (pass < 2 ? r->tflops[pass] : combined_tflops(r->tflops[0], r->tflops[1]));
                    }
                    snprintf(names[bi], sizeof names[bi], "flashattn %s", cli_backend_name(o->backends[bi]));
                    series[bi].name = names[bi];
                    series[bi].values = v;
                }
                for (int k = 0; k < nimpl; k++) {
                    double *v = values + (o->nbackends + k) * s->nseq;
                    for (int si = 0; si < s->nseq; si++)
                        v[si] = scale *
                                peer_value(peers, npeers, impls[k], s->dims[di], s->causals[ci], s->seqlens[si], pass);
                    series[o->nbackends + k].name = impls[k];
                    series[o->nbackends + k].values = v;
                }
                char title[512], path[1200];
                snprintf(title, sizeof title, "Attention %s speed (head dim %d, %s) - %s, %s", pass_title[pass],
                         s->dims[di], s->causals[ci] ? "causal" : "no mask", dev, cli_dtype_name(o->dtype));
                snprintf(path, sizeof path, "%s-%s-d%d%s.svg", stem, pass_file[pass], s->dims[di],
                         s->causals[ci] ? "-causal" : "");
                for (int twice = 0; twice < 1 + (di == main_d && ci == main_c && pass == main_pass); twice++) {
                    const char *out = twice ? o->plot : path;
                    if (plot_bars_svg(out, title, "sequence length", y_label, s->nseq, label_ptr, nseries, series) !=
                        0) {
                        fprintf(stderr, "flashattn: --plot: cannot write %s\n", out);
                        code = EXIT_RUNTIME;
                    } else {
                        printf("wrote %s\n", out);
                    }
                }
            }
    free(values);
    return code;
}

/* Warns before a sweep that would take long: its FLOPs over the rate of a small calibration run per host
 * backend (the GPU backends run a sweep in minutes, and a small problem would understate their rate). */
#define SWEEP_WARN_SECONDS 900.0

static void sweep_warn(const cli_options *o, const sweep *s, int warmup, int repeats) {
    const int backward = !o->fwd_only;
    double total = 0;
    char rates[256] = "";
    int n = 0;
    for (int bi = 0; bi < o->nbackends; bi++) {
        const fa_backend b = o->backends[bi];
        if (vf_backend_on_device(b)) continue;
        double rate[2];
        calibrate(o, b, backward, rate);
        if (rate[0] <= 0 || (backward && rate[1] <= 0)) continue;
        if (n < (int)sizeof rates)
            n += snprintf(rates + n, sizeof rates - (size_t)n, "%s%s %.3g GFLOP/s forward", n ? ", " : "",
                          cli_backend_name(b), rate[0] * 1e-9);
        if (backward && n < (int)sizeof rates)
            n += snprintf(rates + n, sizeof rates - (size_t)n, ", %.3g backward", rate[1] * 1e-9);
        for (int di = 0; di < s->ndims; di++)
            for (int ci = 0; ci < s->ncausal; ci++)
                for (int si = 0; si < s->nseq; si++) {
                    cli_options c = sweep_options(o, s, di, ci, si);
                    const double fwd = row_flops(&c, 0);
                    total += (fwd / rate[0] + (backward ? 2.5 * fwd / rate[1] : 0)) * (warmup + repeats);
                }
    }
    if (total < SWEEP_WARN_SECONDS) return;
    char t[32];
    format_duration(t, sizeof t, total);
    fprintf(stderr,
            "flashattn bench: warning: this sweep will take about %s (estimated from a small calibration "
            "problem: %s).\n"
            "  Ctrl-C stops it and keeps the rows done so far in --csv and --json, which are written row by row.%s\n",
            t, rates,
            strcmp(s->spec->name, "cpu") ? "\n  --sweep cpu is sized for a CPU: under a minute on 2 cores." : "");
    fflush(stderr);
}

static int bench_sweep(cli_options *o, int warmup, int repeats) {
    sweep s;
    memset(&s, 0, sizeof s);
    s.spec = sweep_find(o->sweep);
    if (!s.spec) {
        fprintf(stderr, "flashattn: --sweep: unknown sweep '%s' (%s)\n", o->sweep, cli_sweep_names());
        return EXIT_USAGE;
    }
    for (int i = 0; i < s.spec->ndims; i++)
        if (o->head_dim < 0 || o->head_dim == s.spec->dims[i]) s.dims[s.ndims++] = s.spec->dims[i];
    if (o->head_dim > 0 && !s.ndims) s.dims[s.ndims++] = o->head_dim;
    if (o->causal != 1) s.causals[s.ncausal++] = 0;
    if (o->causal != 0) s.causals[s.ncausal++] = 1;
    for (int i = 0; i < s.spec->nseq; i++)
        if (o->seqlen_q < 0 || o->seqlen_q == s.spec->seqlens[i]) s.seqlens[s.nseq++] = s.spec->seqlens[i];
    if (o->seqlen_q > 0 && !s.nseq) s.seqlens[s.nseq++] = o->seqlen_q;
    if (!o->dtype_given) o->dtype = s.spec->dtype;

    peer_record *peers = NULL;
    int npeers = 0;
    if (o->peers) {
        char err[256];
        npeers = peers_read(o->peers, &peers, err, sizeof err);
        if (npeers < 0) {
            fprintf(stderr, "flashattn: --peers: %s\n", err);
            return npeers == -2 ? EXIT_RUNTIME : EXIT_USAGE;
        }
    }
    s.nrows = s.ndims * s.ncausal * s.nseq * o->nbackends;
    s.rows = calloc((size_t)s.nrows, sizeof(bench_row));
    bench_out out;
    int code = out_open(&out, o);
    if (!s.rows || code != EXIT_OK) {
        free(peers);
        free(s.rows);
        out_close(&out);
        return code != EXIT_OK ? code : EXIT_RUNTIME;
    }

    const int gflops = gflops_units(o);
    const double scale = gflops ? 1e3 : 1.0;
    printf("flashattn bench --sweep %s (%s): %d tokens per batch, hidden %d, %s; median of %d after %d warm-up; "
           "%s (paper formula, backward 2.5x)\n",
           s.spec->name, s.spec->about, s.spec->tokens, s.spec->hidden, cli_dtype_name(o->dtype), repeats, warmup,
           unit_name(gflops));
    fflush(stdout);
    sweep_warn(o, &s, warmup, repeats);
    printf("%4s %6s %6s %5s %5s", "d", "causal", "seqlen", "batch", "heads");
    const int npasses = o->fwd_only ? 1 : 2;
    for (int bi = 0; bi < o->nbackends; bi++)
        for (int pass = 0; pass < npasses; pass++) {
            char col[32];
            snprintf(col, sizeof col, "%s_%s", cli_backend_name(o->backends[bi]), pass_names[pass]);
            printf(" %10s", col);
        }
    printf("\n");
    fflush(stdout);

    /* the remaining time is the elapsed time per FLOP done so far times the FLOPs left */
    double flops_total = 0, flops_done = 0;
    for (int di = 0; di < s.ndims; di++)
        for (int ci = 0; ci < s.ncausal; ci++)
            for (int si = 0; si < s.nseq; si++) {
                cli_options c = sweep_options(o, &s, di, ci, si);
                flops_total += row_flops(&c, !o->fwd_only);
            }
    const int interactive = isatty(2);
    const int total = s.ndims * s.ncausal * s.nseq;
    int done = 0;
    double t0 = vf_seconds();
    for (int di = 0; di < s.ndims; di++)
        for (int ci = 0; ci < s.ncausal; ci++)
            for (int si = 0; si < s.nseq; si++) {
                cli_options c = sweep_options(o, &s, di, ci, si);
                const double elapsed = vf_seconds() - t0;
                char spent[32], left[48] = "";
                format_duration(spent, sizeof spent, elapsed);
                if (flops_done > 0) {
                    format_duration(left + 2, sizeof left - 2, elapsed / flops_done * (flops_total - flops_done));
                    memcpy(left, ", ", 2);
                    strncat(left, " left", sizeof left - strlen(left) - 1);
                }
                fprintf(stderr, "%s[%d/%d, %s%s] d=%d %s seqlen=%d%s", interactive ? "\r" : "", done + 1, total, spent,
                        left, c.head_dim, c.causal ? "causal" : "no-mask", c.seqlen_q, interactive ? "      " : "\n");
                fflush(stderr);
                printf("%4d %6s %6d %5d %5d", c.head_dim, c.causal ? "yes" : "no", c.seqlen_q, c.batch, c.heads);
                vf_problem pr;
                int made = 0;
                for (int bi = 0; bi < o->nbackends; bi++) {
                    bench_row *r = sweep_row(&s, o, di, ci, si, bi);
                    r->head_dim = c.head_dim, r->causal = c.causal, r->seqlen = c.seqlen_q, r->batch = c.batch;
                    r->heads = c.heads;
                    r->backend = o->backends[bi];
                    r->ms[0] = r->ms[1] = r->tflops[0] = r->tflops[1] = NAN;
                    if (!made) {
                        vf_config cfg;
                        cli_config(&c, &cfg);
                        fa_status st = vf_problem_create(&pr, &cfg);
                        if (st != FA_OK) {
                            r->st[0] = r->st[1] = st;
                            for (int pass = 0; pass < npasses; pass++) print_cell(NAN, st, scale);
                            continue;
                        }
                        made = 1;
                    }
                    measure(&c, o->backends[bi], &pr, !o->fwd_only, warmup, repeats, r);
                    for (int pass = 0; pass < npasses; pass++) {
                        print_cell(r->tflops[pass], r->st[pass], scale);
                        if (r->st[pass] != FA_OK && r->st[pass] != FA_ERR_UNSUPPORTED &&
                            r->st[pass] != FA_ERR_OUT_OF_MEMORY && code == EXIT_OK)
                            code = cli_exit_code(r->st[pass]);
                    }
                    int c_out = out_row(&out, &c, r);
                    if (c_out != EXIT_OK && code == EXIT_OK) code = c_out;
                }
                printf("\n");
                fflush(stdout);
                if (made) vf_problem_destroy(&pr);
                flops_done += row_flops(&c, !o->fwd_only);
                done++;
            }
    if (interactive) fprintf(stderr, "\r%70s\r", "");
    char spent[32];
    format_duration(spent, sizeof spent, vf_seconds() - t0);
    fprintf(stderr, "sweep done in %s\n", spent);
    out_close(&out);
    if (o->plot) {
        int c = write_plots(o, &s, peers, npeers);
        if (c != EXIT_OK) code = c;
    }
    free(s.rows);
    free(peers);
    return code;
}

int cli_bench(cli_options *o) {
    if (o->nbackends == 0) {
        o->backends[0] = cli_auto_backend();
        o->nbackends = 1;
    }
    int gpu = 0;
    for (int i = 0; i < o->nbackends; i++) gpu |= vf_backend_on_device(o->backends[i]);
    if ((o->plot || o->peers) && !o->sweep) {
        fprintf(stderr, "flashattn: --plot and --peers need --sweep (flashattn --help)\n");
        return EXIT_USAGE;
    }
    if (o->peers && !o->plot) {
        fprintf(stderr, "flashattn: --peers adds bars to --plot: give --plot FILE.svg too\n");
        return EXIT_USAGE;
    }
    const int warmup = o->warmup >= 0 ? o->warmup : gpu ? 3 : 1;
    const int repeats = o->repeats > 0 ? o->repeats : gpu ? 10 : 5;
    if (o->sweep) return bench_sweep(o, warmup, repeats);
    /* run's problem size, but not causal unless asked, as flash-attn and SDPA default */
    cli_set_defaults(o, gpu, gpu ? 2 : 1, gpu ? 16 : 8, gpu ? 4096 : 2048, 128, 0);
    return bench_single(o, gpu, warmup, repeats);
}
