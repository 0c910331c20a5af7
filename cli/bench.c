/*
 * bench.c - `flashattn bench`: timing one problem on one or more backends, or the FlashAttention-2 paper's
 * sweep (16k tokens, hidden 2048, seqlen 512..16k, head_dim 64/128/256, causal and not, forward and
 * backward), with CSV output and the paper's bar charts (plot.h), optionally with peers' bars.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "plot.h"

typedef struct bench_row {
    fa_backend backend;
    int head_dim, causal, seqlen, batch, heads;
    double ms[2], tflops[2]; /* forward, backward; NaN when not measured */
    fa_status st[2];
} bench_row;

static const char *const pass_names[2] = { "fwd", "bwd" };

static FILE *csv_open(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fprintf(f, "backend,device,dtype,batch,seqlen_q,seqlen_k,heads_q,heads_kv,head_dim,causal,window_left,"
               "window_right,softcap,alibi,varlen,deterministic,pass,ms,tflops,status\n");
    return f;
}

static void csv_write(FILE *f, const cli_options *o, const bench_row *r, int pass) {
    if (!f) return;
    char dev[300];
    cli_device_name(r->backend, o, dev, sizeof dev);
    for (char *c = dev; *c; c++)
        if (*c == ',') *c = ';';
    fprintf(f, "%s,%s,%s,%d,%d,%d,%d,%d,%d,%d,%d,%d,%g,%d,%d,%d,%s,%.6g,%.6g,%s\n", cli_backend_name(r->backend), dev,
            cli_dtype_name(o->dtype), r->batch, r->seqlen, o->sweep ? r->seqlen : o->seqlen_k, r->heads,
            o->sweep ? r->heads : o->heads_kv, r->head_dim, r->causal, o->window_left, o->window_right,
            (double)o->softcap, o->alibi, o->varlen, o->deterministic, pass_names[pass], r->ms[pass], r->tflops[pass],
            fa_status_name(r->st[pass]));
}

/* Times the forward and (when backward) the backward of pr on backend b into r. */
static void measure(const cli_options *o, fa_backend b, vf_problem *pr, int backward, int warmup, int repeats,
                    bench_row *r) {
    fa_exec x = cli_exec(o, b);
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

static void print_cell(double tflops, fa_status st) {
    if (st == FA_OK && !isnan(tflops))
        printf(" %10.4g", tflops);
    else if (st == FA_OK)
        printf(" %10s", "-");
    else
        printf(" %10s", short_status(st));
}

/* ---------------------------------------------------------------------------------------------------------
 * One problem
 * ------------------------------------------------------------------------------------------------------- */

static int bench_single(cli_options *o, int gpu, int warmup, int repeats) {
    char desc[256];
    cli_describe(o, desc, sizeof desc);
    printf("flashattn bench: %s, seed %llu; median of %d after %d warm-up, TFLOP/s by the paper's formula%s\n", desc,
           (unsigned long long)o->seed, repeats, warmup, gpu ? " (GPU: CUDA events, L2 flushed before each run)" : "");
    printf("%-10s %-28s %-4s %12s %10s\n", "backend", "device", "pass", "ms", "TFLOP/s");
    FILE *csv = NULL;
    if (o->csv && !(csv = csv_open(o->csv))) {
        fprintf(stderr, "flashattn: --csv: cannot write %s\n", o->csv);
        return EXIT_RUNTIME;
    }
    int code = EXIT_OK;
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
                   r.tflops[pass]);
            csv_write(csv, o, &r, pass);
        }
        vf_problem_destroy(&pr);
    }
    if (csv) fclose(csv);
    return code;
}

/* ---------------------------------------------------------------------------------------------------------
 * The paper's sweep
 * ------------------------------------------------------------------------------------------------------- */

#define PAPER_TOKENS 16384
#define PAPER_HIDDEN 2048

static const int paper_seqlens[6] = { 512, 1024, 2048, 4096, 8192, 16384 };
static const int paper_dims[3] = { 64, 128, 256 };

typedef struct sweep {
    int dims[3], ndims, causals[2], ncausal, seqlens[6], nseq;
    bench_row *rows; /* [dim][causal][seqlen][backend] */
    int nrows;
} sweep;

static bench_row *sweep_row(const sweep *s, const cli_options *o, int di, int ci, int si, int bi) {
    return &s->rows[((di * s->ncausal + ci) * s->nseq + si) * o->nbackends + bi];
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

static int write_plots(const cli_options *o, const sweep *s, const peer_record *peers, int npeers) {
    /* the distinct peer implementations, in file order */
    const char *impls[16];
    int nimpl = 0;
    for (int i = 0; i < npeers && nimpl < 16; i++) {
        int seen = 0;
        for (int k = 0; k < nimpl; k++) seen |= !strcmp(impls[k], peers[i].impl);
        if (!seen) impls[nimpl++] = peers[i].impl;
    }
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

    static const char *const pass_file[3] = { "fwd", "bwd", "fwdbwd" };
    static const char *const pass_title[3] = { "forward", "backward", "forward + backward" };
    /* the main file: fwd+bwd at head_dim 128 without mask when swept, else the first panel */
    int main_d = 0, main_c = 0;
    for (int di = 0; di < s->ndims; di++)
        for (int ci = 0; ci < s->ncausal; ci++)
            if (s->dims[di] == 128 && !s->causals[ci]) main_d = di, main_c = ci;
    int code = EXIT_OK;
    for (int di = 0; di < s->ndims; di++)
        for (int ci = 0; ci < s->ncausal; ci++)
            for (int pass = 0; pass < 3; pass++) {
                plot_series series[CLI_MAX_BACKENDS + 16];
                char names[CLI_MAX_BACKENDS][32];
                for (int bi = 0; bi < o->nbackends; bi++) {
                    double *v = values + bi * s->nseq;
                    for (int si = 0; si < s->nseq; si++) {
                        const bench_row *r = sweep_row(s, o, di, ci, si, bi);
                        v[si] = pass < 2 ? r->tflops[pass] : combined_tflops(r->tflops[0], r->tflops[1]);
                    }
                    snprintf(names[bi], sizeof names[bi], "flashattn %s", cli_backend_name(o->backends[bi]));
                    series[bi].name = names[bi];
                    series[bi].values = v;
                }
                for (int k = 0; k < nimpl; k++) {
                    double *v = values + (o->nbackends + k) * s->nseq;
                    for (int si = 0; si < s->nseq; si++)
                        v[si] = peer_value(peers, npeers, impls[k], s->dims[di], s->causals[ci], s->seqlens[si], pass);
                    series[o->nbackends + k].name = impls[k];
                    series[o->nbackends + k].values = v;
                }
                char title[512], path[1200];
                snprintf(title, sizeof title, "Attention %s speed (head dim %d, %s) - %s, %s", pass_title[pass],
                         s->dims[di], s->causals[ci] ? "causal" : "no mask", dev, cli_dtype_name(o->dtype));
                snprintf(path, sizeof path, "%s-%s-d%d%s.svg", stem, pass_file[pass], s->dims[di],
                         s->causals[ci] ? "-causal" : "");
                for (int twice = 0; twice < 1 + (di == main_d && ci == main_c && pass == 2); twice++) {
                    const char *out = twice ? o->plot : path;
                    if (plot_bars_svg(out, title, "TFLOP/s", s->nseq, label_ptr, nseries, series) != 0) {
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

static int bench_sweep(cli_options *o, int warmup, int repeats) {
    sweep s;
    memset(&s, 0, sizeof s);
    for (int i = 0; i < 3; i++)
        if (o->head_dim < 0 || o->head_dim == paper_dims[i]) s.dims[s.ndims++] = paper_dims[i];
    if (o->head_dim > 0 && !s.ndims) s.dims[s.ndims++] = o->head_dim;
    if (o->causal != 1) s.causals[s.ncausal++] = 0;
    if (o->causal != 0) s.causals[s.ncausal++] = 1;
    for (int i = 0; i < 6; i++)
        if (o->seqlen_q < 0 || o->seqlen_q == paper_seqlens[i]) s.seqlens[s.nseq++] = paper_seqlens[i];
    if (o->seqlen_q > 0 && !s.nseq) s.seqlens[s.nseq++] = o->seqlen_q;
    if (!o->dtype_given) o->dtype = FA_BF16;

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
    FILE *csv = NULL;
    if (o->csv && !(csv = csv_open(o->csv))) {
        fprintf(stderr, "flashattn: --csv: cannot write %s\n", o->csv);
        free(peers);
        return EXIT_RUNTIME;
    }
    s.nrows = s.ndims * s.ncausal * s.nseq * o->nbackends;
    s.rows = calloc((size_t)s.nrows, sizeof(bench_row));
    if (!s.rows) {
        free(peers);
        if (csv) fclose(csv);
        return EXIT_RUNTIME;
    }

    printf("flashattn bench --sweep paper: %d tokens per batch, hidden %d, %s; median of %d after %d warm-up; "
           "TFLOP/s (paper formula, backward 2.5x)\n",
           PAPER_TOKENS, PAPER_HIDDEN, cli_dtype_name(o->dtype), repeats, warmup);
    printf("%4s %6s %6s %5s %5s", "d", "causal", "seqlen", "batch", "heads");
    for (int bi = 0; bi < o->nbackends; bi++)
        for (int pass = 0; pass < 2; pass++) {
            char col[32];
            snprintf(col, sizeof col, "%s_%s", cli_backend_name(o->backends[bi]), pass_names[pass]);
            printf(" %10s", col);
        }
    printf("\n");
    fflush(stdout);

    const int interactive = isatty(2);
    const int total = s.ndims * s.ncausal * s.nseq;
    int done = 0, code = EXIT_OK;
    double t0 = vf_seconds();
    for (int di = 0; di < s.ndims; di++)
        for (int ci = 0; ci < s.ncausal; ci++)
            for (int si = 0; si < s.nseq; si++) {
                const int d = s.dims[di], seqlen = s.seqlens[si];
                fprintf(stderr, "%s[%d/%d %.0fs] d=%d %s seqlen=%d%s", interactive ? "\r" : "", done + 1, total,
                        vf_seconds() - t0, d, s.causals[ci] ? "causal" : "no-mask", seqlen,
                        interactive ? "    " : "\n");
                fflush(stderr);
                cli_options c = *o;
                c.head_dim = d;
                c.heads = c.heads_kv = PAPER_HIDDEN / d > 0 ? PAPER_HIDDEN / d : 1;
                c.seqlen_q = c.seqlen_k = seqlen;
                c.batch = PAPER_TOKENS / seqlen > 0 ? PAPER_TOKENS / seqlen : 1;
                c.causal = s.causals[ci];
                printf("%4d %6s %6d %5d %5d", d, c.causal ? "yes" : "no", seqlen, c.batch, c.heads);
                vf_problem pr;
                int made = 0;
                for (int bi = 0; bi < o->nbackends; bi++) {
                    bench_row *r = sweep_row(&s, o, di, ci, si, bi);
                    r->head_dim = d, r->causal = c.causal, r->seqlen = seqlen, r->batch = c.batch, r->heads = c.heads;
                    r->backend = o->backends[bi];
                    r->ms[0] = r->ms[1] = r->tflops[0] = r->tflops[1] = NAN;
                    if (!made) {
                        vf_config cfg;
                        cli_config(&c, &cfg);
                        fa_status st = vf_problem_create(&pr, &cfg);
                        if (st != FA_OK) {
                            r->st[0] = r->st[1] = st;
                            print_cell(NAN, st), print_cell(NAN, st);
                            continue;
                        }
                        made = 1;
                    }
                    measure(&c, o->backends[bi], &pr, !o->fwd_only, warmup, repeats, r);
                    for (int pass = 0; pass < 2; pass++) {
                        print_cell(r->tflops[pass], r->st[pass]);
                        if (r->st[pass] == FA_OK && !isnan(r->ms[pass])) csv_write(csv, &c, r, pass);
                        if (r->st[pass] != FA_OK && r->st[pass] != FA_ERR_UNSUPPORTED &&
                            r->st[pass] != FA_ERR_OUT_OF_MEMORY && code == EXIT_OK)
                            code = cli_exit_code(r->st[pass]);
                    }
                }
                printf("\n");
                fflush(stdout);
                if (made) vf_problem_destroy(&pr);
                done++;
            }
    if (interactive) fprintf(stderr, "\r%60s\r", "");
    fprintf(stderr, "sweep done in %.0f s\n", vf_seconds() - t0);
    if (csv) fclose(csv);
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
        fprintf(stderr, "flashattn: --plot and --peers need --sweep paper (flashattn --help)\n");
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
