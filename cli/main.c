/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c - the flashattn command line: option parsing, `info`, `run` and `check` (bench.c has `bench`).
 */
#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cli.h"
#include "internal.h" /* fa_naive_cublas_load, for info */

static const char usage[] =
    "usage: flashattn <command> [options]\n"
    "\n"
    "commands:\n"
    "  info    build features, backends, devices, version; with --plan, what the CUDA backend would run for\n"
    "          the problem (kernel family, tiles, schedule, tile order, grid), forward and backward\n"
    "  run     the main job: forward and backward of a realistic problem on the best backend, timed and\n"
    "          verified against the fp64 reference on sampled rows. Default problem: batch 2, 16 heads,\n"
    "          seqlen 4096, head_dim 128, causal, bf16 on a GPU; on the CPU batch 1, 8 heads, seqlen 2048,\n"
    "          head_dim 128, causal, f32 (a few seconds on 2 cores)\n"
    "  check   runs the backend and compares every output with the fp64 reference (O and LSE; with --bwd\n"
    "          also dQ, dK, dV); last line 'check: PASS ...' or 'check: FAIL ...'. Default problem: batch 2,\n"
    "          4 heads, seqlen 512, head_dim 64 (128 on a GPU), f32 on the CPU, bf16 on a GPU, not causal\n"
    "  bench   median time of --repeats runs after --warmup runs, TFLOP/s (GFLOP/s on the CPU) by the\n"
    "          FlashAttention-2 paper's formula (backward 2.5x forward); run's problem, not causal unless\n"
    "          --causal. --sweep paper runs the paper's benchmark instead (16k tokens, hidden 2048, seqlen\n"
    "          512..16k, head_dim 64/128/256, causal and not, bf16, forward and backward: minutes on a GPU,\n"
    "          hours on a CPU); --sweep cpu a CPU-sized one (4k tokens, hidden 512, seqlen 256..2k, head_dim\n"
    "          64/128, f32: under a minute on 2 cores)\n"
    "\n"
    "options:\n"
    "  --backend B[,B...]      auto|cpu|cuda|naive|reference (auto: cuda with a GPU, else cpu); bench takes a list\n"
    "  --dtype T               f32|f16|bf16|e4m3 (e4m3: float8 q, k, v with descales, bf16 o; forward only,\n"
    "                          cpu, reference and cuda backends; cuda: FA3 on Hopper, head dims 64, 128, 256)\n"
    "  --descale-block N       e4m3: one descale per N rows of a sequence (default 0: one per batch entry and head)\n"
    "  --batch B  --heads H  --heads-kv HK  --head-dim D\n"
    "  --seqlen-q N  --seqlen-k M   (--seqlen N sets both; seqlen-k defaults to seqlen-q)\n"
    "  --causal | --no-causal  bottom-right causal mask\n"
    "  --window L,R            sliding window, inclusive, -1 = unbounded\n"
    "  --softcap C             scores become C * tanh(scores / C)\n"
    "  --alibi                 ALiBi with the usual geometric slopes per head\n"
    "  --varlen                packed batch, random length per batch entry up to the seqlens\n"
    "  --bwd                   check/bench: also the backward\n"
    "  --scale X               softmax scale (default 1/sqrt(head_dim))\n"
    "  --seed S                random inputs (default 1)\n"
    "  --k-ramp R              the key at position j of n is scaled by 1 + R * j / n: row maxima that grow along\n"
    "                          the keys (a numerical stress)\n"
    "  --threads N             CPU threads (default: all)\n"
    "  --deterministic         deterministic backward (check --bwd also compares two runs bit for bit)\n"
    "  --kernel auto|fa2|fa3   CUDA kernel family\n"
    "  --plan                  info: the CUDA plan of the problem (run's default problem unless given; with\n"
    "                          --decode, bench --decode's); without a usable GPU, for a 132-SM compute\n"
    "                          capability 9.0 device (an H100 or H200)\n"
    "  --no-device-check       check/run: let the GPU backends trust cu_seqlens (fa_exec.check = 0); by default\n"
    "                          they check them on the device first (bench never does)\n"
    "  --layout bshd|bhsd      memory order of Q, K, V, O and their gradients: (batch, seqlen, heads, head_dim),\n"
    "                          the default, or (batch, heads, seqlen, head_dim), e.g. PyTorch's contiguous tensors\n"
    "  --repeats N --warmup N  timed runs (run: 3 and 1 on a GPU, 1 and 0 on the CPU; bench: 10 and 3 on a GPU,\n"
    "                          5 and 1 on the CPU)\n"
    "  --rows N                run: query and key rows to verify (default 64)\n"
    "  --csv FILE              bench: write the results as CSV, row by row\n"
    "  --json FILE             bench: write the results as a JSON list, rewritten after each row (valid when\n"
    "                          interrupted; --peers reads it)\n"
    "  --sweep paper|cpu       bench: a sweep (--head-dim, --seqlen-q, --causal/--no-causal narrow it); a time\n"
    "                          estimate is shown as it runs, and a warning first when it would take long\n"
    "  --plot FILE.svg         bench --sweep: bar charts in the paper's Fig. 4-6 style (one file per panel;\n"
    "                          FILE.svg is forward + backward at head_dim 128 without mask, forward with\n"
    "                          --fwd-only)\n"
    "  --peers FILE.json       bench --sweep --plot: add the bars of bench/peer_bench.py --json\n"
    "  --fwd-only              bench --sweep: time the forward only\n"
    "  --decode                check: decoding with a KV cache (fa_fwd_kvcache) instead; --seqlen-k is the cache's\n"
    "                          rows per sequence (default 1024), --seqlen-q the query rows (default 1), batch 4,\n"
    "                          8 heads / 2 kv heads; each sequence holds a random number of tokens\n"
    "                          bench --decode: one decode step (8 x 8k, 32/8 heads, d128 unless given; every\n"
    "                          sequence attends --seqlen-k keys) as K+V TB/s next to a copy timed in the same run\n"
    "  --new N                 check --decode: tokens appended to the cache before attending (default 1)\n"
    "  --page-size P           check --decode: a paged cache (shuffled pages); 0 = contiguous (the default)\n"
    "  --rotary-dim R          check --decode: rotary embedding of q and the new keys on R dims (interleaved)\n"
    "  --rotary-halves         check --decode: rotary on the halves (i, i + R/2) instead of pairs (2i, 2i+1)\n"
    "  --leftpad               check --decode: a random first attended row per sequence\n"
    "\n"
    "  --version               the version (also: flashattn --version)\n"
    "\n"
    "exit codes: 0 ok, 1 numerical failure, 2 bad usage or invalid shape, 3 unsupported on the backend,\n"
    "            4 runtime error (out of memory, CUDA error, I/O)\n";

/* ---------------------------------------------------------------------------------------------------------
 * Shared helpers (declared in cli.h)
 * ------------------------------------------------------------------------------------------------------- */

fa_backend cli_auto_backend(void) {
    return fa_backend_built(FA_BACKEND_CUDA) && fa_device_count() > 0 ? FA_BACKEND_CUDA : FA_BACKEND_CPU;
}

const char *cli_backend_name(fa_backend b) {
    switch (b) {
    case FA_BACKEND_CPU: return "cpu";
    case FA_BACKEND_CUDA: return "cuda";
    case FA_BACKEND_NAIVE: return "naive";
    case FA_BACKEND_REFERENCE: return "reference";
    default: return "auto";
    }
}

const char *cli_dtype_name(fa_dtype t) {
    return t == FA_F16 ? "f16" : t == FA_BF16 ? "bf16" : t == FA_E4M3 ? "e4m3" : "f32";
}

int cli_exit_code(fa_status st) {
    switch (st) {
    case FA_OK: return EXIT_OK;
    case FA_ERR_INVALID_ARGUMENT: return EXIT_USAGE;
    case FA_ERR_UNSUPPORTED:
    case FA_ERR_NOT_COMPILED:
    case FA_ERR_NO_DEVICE: return EXIT_UNSUPPORTED;
    default: return EXIT_RUNTIME;
    }
}

/* Which option sets a field the library names in its messages. */
static const struct {
    const char *field, *option;
} field_options[] = {
    { "heads_q", "--heads" },
    { "heads_kv", "--heads-kv" },
    { "head_dim", "--head-dim" },
    { "seqlen_q", "--seqlen-q" },
    { "seqlen_k", "--seqlen-k" },
    { "batch", "--batch" },
    { "window_left", "--window" },
    { "window_right", "--window" },
    { "softcap", "--softcap" },
    { "softmax_scale", "--scale" },
    { "alibi", "--alibi" },
    { "cu_seqlens", "--varlen" },
    { "total_", "--varlen" },
    { "dtype", "--dtype" },
    { "descale_block", "--descale-block" },
    { "rotary_dim", "--rotary-dim" },
    { "page_size", "--page-size" },
    { "num_threads", "--threads" },
    { "kernel", "--kernel" },
    { "deterministic", "--deterministic" },
};

int cli_report_status(fa_status st, const char *what, const char *detail) {
    char opts[256] = "";
    int n = 0;
    for (size_t i = 0; i < sizeof field_options / sizeof field_options[0]; i++) {
        if (!detail || !strstr(detail, field_options[i].field) || strstr(opts, field_options[i].option)) continue;
        n += snprintf(opts + n, sizeof opts - (size_t)n, "%s%s", n ? ", " : " [", field_options[i].option);
        if (n >= (int)sizeof opts - 2) break;
    }
    if (n) snprintf(opts + n, sizeof opts - (size_t)n, "]");
    fprintf(stderr, "flashattn: %s: %s%s\n", what, detail && *detail ? detail : fa_strerror(st), opts);
    return cli_exit_code(st);
}

void cli_config(const cli_options *o, vf_config *c) {
    vf_config_init(c);
    c->dtype = o->dtype;
    c->batch = o->batch;
    c->seqlen_q = o->seqlen_q;
    c->seqlen_k = o->seqlen_k;
    c->heads_q = o->heads;
    c->heads_kv = o->heads_kv;
    c->head_dim = o->head_dim;
    c->scale = o->scale;
    c->causal = o->causal > 0;
    c->window_left = o->window_left;
    c->window_right = o->window_right;
    c->softcap = o->softcap;
    c->k_ramp = o->k_ramp;
    c->alibi = o->alibi ? VF_ALIBI_HEADS : VF_ALIBI_OFF;
    c->deterministic = o->deterministic;
    c->varlen = o->varlen;
    c->seed = o->seed;
    c->layout = (vf_layout)o->layout;
    c->descale_block = o->descale_block;
}

fa_exec cli_exec(const cli_options *o, fa_backend b) {
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = b;
    x.kernel = o->kernel;
    x.device = -1;
    x.num_threads = o->threads;
    x.check = !o->no_device_check;
    return x;
}

int cli_make_problem(const cli_options *o, fa_backend b, int backward, vf_problem *pr) {
    vf_config c;
    cli_config(o, &c);
    /* The shape first, on placeholder pointers, so that an invalid or unsupported one is refused (exit 2 or 3)
     * before anything is allocated. The placeholders are never dereferenced (no ALiBi slopes or cu_seqlens,
     * which a host backend would read): distinct, aligned addresses 2^44 bytes apart, so that the views of any
     * problem under the size limit below (2^40 elements) do not overlap in the library's memory checks. */
    fa_params p;
    fa_params_init(&p, c.dtype, c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.head_dim);
    p.softmax_scale = c.scale;
    p.causal = c.causal, p.window_left = c.window_left, p.window_right = c.window_right, p.softcap = c.softcap;
    p.deterministic = c.deterministic;
    p.descale_block_q = p.descale_block_k = c.descale_block;
    fa_tensor *views[8] = { &p.q, &p.k, &p.v, &p.o, &p.dout, &p.dq, &p.dk, &p.dv };
    for (int i = 0; i < 8; i++) {
        const int query = i == 0 || i == 3 || i == 4 || i == 5;
        *views[i] = fa_tensor_contiguous((void *)((uintptr_t)(i + 1) << 44), query ? c.seqlen_q : c.seqlen_k,
                                         query ? c.heads_q : c.heads_kv, c.head_dim);
    }
    p.lse = (float *)((uintptr_t)9 << 44);
    fa_exec x = cli_exec(o, FA_BACKEND_REFERENCE);
    fa_status st = fa_check(&p, &x, backward);
    if (st != FA_OK)
        return cli_report_status(st, st == FA_ERR_INVALID_ARGUMENT ? "invalid problem" : "not supported",
                                 fa_last_error());
    const double elems =
        ((double)c.batch * c.seqlen_q * c.heads_q + (double)c.batch * c.seqlen_k * c.heads_kv) * c.head_dim;
    if (elems > 0x1p40) {
        fprintf(stderr, "flashattn: the problem is too large: %.3g elements in q and k alone\n", elems);
        return EXIT_RUNTIME;
    }

    st = vf_problem_create(pr, &c);
    if (st != FA_OK) return cli_report_status(st, "cannot build the problem", pr->error);
    const fa_params *bp = vf_params_for(pr, b);
    if (!bp) {
        cli_report_status(FA_ERR_DEVICE, "cannot copy the problem to the GPU", pr->error);
        vf_problem_destroy(pr);
        return EXIT_RUNTIME;
    }
    x = cli_exec(o, b);
    st = fa_check(bp, &x, backward);
    if (st != FA_OK) {
        char what[64];
        snprintf(what, sizeof what,
                 st == FA_ERR_INVALID_ARGUMENT ? "invalid problem for the %s backend"
                                               : "not supported on the %s backend",
                 cli_backend_name(b));
        int code = cli_report_status(st, what, fa_last_error());
        vf_problem_destroy(pr);
        return code;
    }
    return EXIT_OK;
}

void cli_describe(const cli_options *o, char *buf, int size) {
    int n = snprintf(buf, (size_t)size, "%s, batch %d, heads %d/%d, seqlen %d/%d, head_dim %d",
                     cli_dtype_name(o->dtype), o->batch, o->heads, o->heads_kv, o->seqlen_q, o->seqlen_k, o->head_dim);
#define CLI_APPEND(...)                                                                  \
    do {                                                                                 \
        if (n >= 0 && n < size) n += snprintf(buf + n, (size_t)(size - n), __VA_ARGS__); \
    } while (0)
    if (o->causal > 0) CLI_APPEND(", causal");
    if (o->window_left >= 0 || o->window_right >= 0) CLI_APPEND(", window %d,%d", o->window_left, o->window_right);
    if (o->softcap > 0) CLI_APPEND(", softcap %g", (double)o->softcap);
    if (o->alibi) CLI_APPEND(", alibi");
    if (o->varlen) CLI_APPEND(", varlen");
    if (o->scale != 0) CLI_APPEND(", scale %g", (double)o->scale);
    if (o->k_ramp != 0) CLI_APPEND(", k-ramp %g", (double)o->k_ramp);
    if (o->deterministic) CLI_APPEND(", deterministic");
    if (o->layout == VF_LAYOUT_BHSD) CLI_APPEND(", layout bhsd");
#undef CLI_APPEND
}

void cli_device_name(fa_backend b, const cli_options *o, char *buf, int size) {
    fa_device_info info;
    if (vf_backend_on_device(b)) {
        /* the GPU backends never run on the CPU: name the GPU, or say that there is none */
        if (fa_device_count() > 0 && fa_device_get_info(0, &info) == FA_OK)
            snprintf(buf, (size_t)size, "%s", info.name);
        else
            snprintf(buf, (size_t)size, "%s", fa_backend_built(b) ? "no CUDA device" : "not built");
        return;
    }
    int threads = o->threads;
#ifdef _OPENMP
    if (threads <= 0) threads = omp_get_max_threads();
#endif
    if (threads <= 0) threads = 1;
    snprintf(buf, (size_t)size, "%d CPU thread%s", threads, threads == 1 ? "" : "s");
}

/* ---------------------------------------------------------------------------------------------------------
 * Option parsing
 * ------------------------------------------------------------------------------------------------------- */

static _Noreturn void bad_usage(const char *fmt, const char *opt, const char *value) {
    fprintf(stderr, "flashattn: ");
    fprintf(stderr, fmt, opt, value);
    fprintf(stderr, " (flashattn --help)\n");
    exit(EXIT_USAGE);
}

static long long parse_int(const char *opt, const char *s, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        char range[96];
        snprintf(range, sizeof range, "%%s: expected an integer in [%lld, %lld], got '%%s'", lo, hi);
        bad_usage(range, opt, s);
    }
    return v;
}

static float parse_float(const char *opt, const char *s, double lo) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || fabs(v) > 3.0e38) {
        char range[96];
        snprintf(range, sizeof range, "%%s: expected a finite number >= %g, got '%%s'", lo);
        bad_usage(range, opt, s);
    }
    return (float)v;
}

static fa_backend parse_backend(const char *opt, const char *s) {
    if (!strcmp(s, "auto")) return FA_BACKEND_AUTO;
    if (!strcmp(s, "cpu")) return FA_BACKEND_CPU;
    if (!strcmp(s, "cuda")) return FA_BACKEND_CUDA;
    if (!strcmp(s, "naive")) return FA_BACKEND_NAIVE;
    if (!strcmp(s, "reference")) return FA_BACKEND_REFERENCE;
    bad_usage("%s: expected auto, cpu, cuda, naive or reference, got '%s'", opt, s);
}

static void parse_backends(cli_options *o, const char *opt, const char *list) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    o->nbackends = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (o->nbackends == CLI_MAX_BACKENDS) bad_usage("%s: too many backends in '%s'", opt, list);
        fa_backend b = parse_backend(opt, tok);
        o->backends[o->nbackends++] = b == FA_BACKEND_AUTO ? cli_auto_backend() : b;
    }
    if (!o->nbackends) bad_usage("%s: expected a backend, got '%s'", opt, list);
}

static void parse_window(cli_options *o, const char *opt, const char *s) {
    const char *comma = strchr(s, ',');
    if (!comma) bad_usage("%s: expected L,R (e.g. 256,0; -1 = unbounded), got '%s'", opt, s);
    char *left = strndup(s, (size_t)(comma - s)); /* whole: a fixed buffer would cut a long number short */
    if (!left) {
        fprintf(stderr, "flashattn: %s: out of memory\n", opt);
        exit(EXIT_RUNTIME);
    }
    o->window_left = (int32_t)parse_int(opt, left, -1, INT32_MAX);
    free(left);
    o->window_right = (int32_t)parse_int(opt, comma + 1, -1, INT32_MAX);
}

/* The options: 'f' flags store `lo` into an int field, 'i' int32 fields take an integer in [lo, hi], 'r' float
 * fields a finite number >= lo, 's' string fields any text, 'x' the ones parse_special handles. */
typedef struct option_spec {
    const char *name;
    char kind;
    size_t offset;
    long long lo, hi;
} option_spec;

#define OPT(name, kind, field, lo, hi) \
    { name, kind, offsetof(cli_options, field), lo, hi }
static const option_spec option_specs[] = {
    OPT("--causal", 'f', causal, 1, 0),
    OPT("--no-causal", 'f', causal, 0, 0),
    OPT("--alibi", 'f', alibi, 1, 0),
    OPT("--varlen", 'f', varlen, 1, 0),
    OPT("--bwd", 'f', bwd, 1, 0),
    OPT("--deterministic", 'f', deterministic, 1, 0),
    OPT("--plan", 'f', plan, 1, 0),
    OPT("--fwd-only", 'f', fwd_only, 1, 0),
    OPT("--no-device-check", 'f', no_device_check, 1, 0),
    OPT("--decode", 'f', decode, 1, 0),
    OPT("--leftpad", 'f', leftpad, 1, 0),
    OPT("--rotary-halves", 'f', rotary_halves, 1, 0),
    OPT("--new", 'i', seqlen_new, 0, INT32_MAX),
    OPT("--page-size", 'i', page_size, 0, INT32_MAX),
    OPT("--rotary-dim", 'i', rotary_dim, 0, 256),
    OPT("--descale-block", 'i', descale_block, 0, INT32_MAX),
    OPT("--batch", 'i', batch, 1, INT32_MAX),
    OPT("--seqlen-q", 'i', seqlen_q, 1, INT32_MAX),
    OPT("--seqlen-k", 'i', seqlen_k, 1, INT32_MAX),
    OPT("--heads", 'i', heads, 1, INT32_MAX),
    OPT("--heads-kv", 'i', heads_kv, 1, INT32_MAX),
    OPT("--head-dim", 'i', head_dim, 1, INT32_MAX),
    OPT("--threads", 'i', threads, 1, 4096),
    OPT("--repeats", 'i', repeats, 1, 100000),
    OPT("--warmup", 'i', warmup, 0, 100000),
    OPT("--rows", 'i', rows, 1, 1 << 24),
    OPT("--softcap", 'r', softcap, 0, 0),
    OPT("--scale", 'r', scale, 0, 0),
    OPT("--k-ramp", 'r', k_ramp, 0, 0),
    OPT("--csv", 's', csv, 0, 0),
    OPT("--json", 's', json, 0, 0),
    OPT("--plot", 's', plot, 0, 0),
    OPT("--peers", 's', peers, 0, 0),
    OPT("--backend", 'x', backends, 0, 0),
    OPT("--dtype", 'x', dtype, 0, 0),
    OPT("--window", 'x', window_left, 0, 0),
    OPT("--kernel", 'x', kernel, 0, 0),
    OPT("--layout", 'x', layout, 0, 0),
    OPT("--sweep", 'x', sweep, 0, 0),
    OPT("--seqlen", 'x', seqlen_q, 0, 0),
    OPT("--seed", 'x', seed, 0, 0),
};
#undef OPT

static void parse_special(cli_options *o, const char *n, const char *value) {
    if (!strcmp(n, "--backend")) {
        parse_backends(o, n, value);
    } else if (!strcmp(n, "--dtype")) {
        static const char *const names[4] = { "f32", "f16", "bf16", "e4m3" };
        static const fa_dtype types[4] = { FA_F32, FA_F16, FA_BF16, FA_E4M3 };
        o->dtype_given = 0;
        for (int i = 0; i < 4; i++)
            if (!strcmp(value, names[i])) o->dtype = types[i], o->dtype_given = 1;
        if (!o->dtype_given) bad_usage("%s: expected f32, f16, bf16 or e4m3, got '%s'", n, value);
    } else if (!strcmp(n, "--window")) {
        parse_window(o, n, value);
    } else if (!strcmp(n, "--kernel")) {
        if (!strcmp(value, "auto"))
            o->kernel = FA_KERNEL_AUTO;
        else if (!strcmp(value, "fa2"))
            o->kernel = FA_KERNEL_FA2;
        else if (!strcmp(value, "fa3"))
            o->kernel = FA_KERNEL_FA3;
        else
            bad_usage("%s: expected auto, fa2 or fa3, got '%s'", n, value);
    } else if (!strcmp(n, "--layout")) {
        if (!strcmp(value, "bshd"))
            o->layout = VF_LAYOUT_BSHD;
        else if (!strcmp(value, "bhsd"))
            o->layout = VF_LAYOUT_BHSD;
        else
            bad_usage("%s: expected bshd or bhsd, got '%s'", n, value);
    } else if (!strcmp(n, "--sweep")) {
        if (!cli_sweep_known(value)) bad_usage("%s: expected paper or cpu, got '%s'", n, value);
        o->sweep = value;
    } else if (!strcmp(n, "--seqlen")) {
        o->seqlen_q = o->seqlen_k = (int32_t)parse_int(n, value, 1, INT32_MAX);
    } else if (!strcmp(n, "--seed")) {
        o->seed = (uint64_t)parse_int(n, value, 0, INT64_MAX);
        o->seed_given = 1;
    }
}

/* "flashattn 0.1.0", and the library's version too when the linked library is not the header's. */
static int print_version(void) {
    const int v = fa_version_number();
    printf("flashattn %d.%d.%d", FA_VERSION_MAJOR, FA_VERSION_MINOR, FA_VERSION_PATCH);
    if (v != FA_VERSION_NUMBER) printf(" (library %d.%d.%d)", v / 10000, v / 100 % 100, v % 100);
    printf("\n");
    return EXIT_OK;
}

static void parse_options(cli_options *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->batch = o->seqlen_q = o->seqlen_k = o->heads = o->heads_kv = o->head_dim = -1;
    o->causal = -1;
    o->window_left = o->window_right = -1;
    o->repeats = o->warmup = o->rows = -1;
    o->seed = 1;
    o->kernel = FA_KERNEL_AUTO;
    o->seqlen_new = 1;
    for (int i = 2; i < argc; i++) {
        char name[64];
        const char *arg = argv[i], *value = NULL, *eq = strchr(arg, '=');
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            fputs(usage, stdout);
            exit(EXIT_OK);
        }
        if (!strcmp(arg, "--version")) exit(print_version());
        if (strncmp(arg, "--", 2) != 0) bad_usage("%s: unexpected argument%s", arg, "");
        snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - arg) : (int)strlen(arg), arg);
        if (eq) value = eq + 1;
        const option_spec *spec = NULL;
        for (size_t k = 0; k < sizeof option_specs / sizeof option_specs[0] && !spec; k++)
            if (!strcmp(name, option_specs[k].name)) spec = &option_specs[k];
        if (!spec) bad_usage("unknown option %s%s", name, "");
        if (spec->kind == 'f' && value) bad_usage("%s takes no value (got '%s')", name, value);
        if (spec->kind != 'f' && !value) {
            if (i + 1 >= argc) bad_usage("%s needs a value%s", name, "");
            value = argv[++i];
        }
        void *field = (char *)o + spec->offset;
        switch (spec->kind) {
        case 'f': *(int *)field = (int)spec->lo; break;
        case 'i': *(int32_t *)field = (int32_t)parse_int(name, value, spec->lo, spec->hi); break;
        case 'r': *(float *)field = parse_float(name, value, (double)spec->lo); break;
        case 's': *(const char **)field = value; break;
        default: parse_special(o, name, value); break;
        }
    }
}

void cli_set_defaults(cli_options *o, int gpu, int32_t batch, int32_t heads, int32_t seqlen, int32_t head_dim,
                      int causal) {
    if (!o->dtype_given) o->dtype = gpu ? FA_BF16 : FA_F32;
    if (o->batch < 0) o->batch = batch;
    if (o->heads < 0) o->heads = heads;
    if (o->heads_kv < 0) o->heads_kv = o->heads;
    if (o->head_dim < 0) o->head_dim = head_dim;
    if (o->seqlen_q < 0) o->seqlen_q = seqlen;
    if (o->seqlen_k < 0) o->seqlen_k = o->seqlen_q;
    if (o->causal < 0) o->causal = causal;
}

static fa_backend single_backend(cli_options *o) {
    if (o->nbackends > 1) bad_usage("--backend: %s takes one backend%s", o->command, "");
    if (o->nbackends == 0) {
        o->backends[0] = cli_auto_backend();
        o->nbackends = 1;
    }
    return o->backends[0];
}

static void reject_bench_options(const cli_options *o) {
    if (o->sweep || o->plot || o->peers || o->csv || o->json)
        bad_usage("%s: --sweep, --plot, --peers, --csv and --json are for bench%s", o->command, "");
}

/* ---------------------------------------------------------------------------------------------------------
 * info
 * ------------------------------------------------------------------------------------------------------- */

static int cmd_info(void) {
    printf("flashattn %d.%d.%d (library %d, header %d)\n", FA_VERSION_MAJOR, FA_VERSION_MINOR, FA_VERSION_PATCH,
           fa_version_number(), FA_VERSION_NUMBER);
    printf("build:    %s\n", fa_build_info());
    static const fa_backend all[4] = { FA_BACKEND_CPU, FA_BACKEND_REFERENCE, FA_BACKEND_CUDA, FA_BACKEND_NAIVE };
    printf("backends:");
    for (int i = 0; i < 4; i++) printf(" %s=%s", cli_backend_name(all[i]), fa_backend_built(all[i]) ? "yes" : "no");
    printf("  (auto = %s)\n", cli_backend_name(cli_auto_backend()));
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
#ifdef _OPENMP
    printf("cpu:      %ld cores online, %d OpenMP threads by default\n", cores, omp_get_max_threads());
#else
    printf("cpu:      %ld cores online, single-threaded build\n", cores);
#endif
    printf("cpu simd: %s (%s)\n", fa_cpu_simd(), fa_cpu_simd_choice());
    int n = fa_device_count();
    if (n == 0) {
        /* the library's message says what is missing: the driver, a device, or a new enough driver */
        fa_device_info none;
        if (fa_backend_built(FA_BACKEND_CUDA) && fa_device_get_info(0, &none) != FA_OK)
            printf("devices:  none (%s)\n", fa_last_error());
        else
            printf("devices:  none (built without CUDA)\n");
    }
    for (int d = 0; d < n; d++) {
        fa_device_info info;
        fa_status st = fa_device_get_info(d, &info);
        if (st != FA_OK) {
            printf("device %d: %s\n", d, fa_last_error());
            continue;
        }
        printf("device %d: %s, compute capability %d.%d, %d SMs, %.1f GiB\n", d, info.name, info.cc_major,
               info.cc_minor, info.sm_count, (double)info.memory_bytes / (1u << 30));
    }
#ifdef FA_WITH_NAIVE
    /* cuBLAS is opened at run time by the naive backend only; say whether it can be */
    if (fa_naive_cublas_load() == FA_OK)
        printf("cublas:   loaded (used by the naive backend)\n");
    else
        printf("cublas:   %s\n", fa_last_error());
#endif
    return EXIT_OK;
}

/* info --plan: the CUDA backend's family and choices for the options' problem (dense, contiguous, no data:
 * nothing runs), forward and backward. */
#ifdef FA_WITH_CUDA
/* info --plan --decode: bench --decode's problem (8 sequences of 8k cached keys, 32/8 heads, d128, one new token
 * unless given), its split count and grid. */
static int plan_decode(cli_options *o) {
    static _Alignas(16) unsigned char nowhere[16]; /* the plan looks at shapes, never at data */
    if (o->seqlen_k < 0) o->seqlen_k = 8192;
    if (o->heads < 0 && o->heads_kv < 0) o->heads = 32, o->heads_kv = 8;
    cli_set_defaults(o, 1, 8, 32, 1, 128, 0);
    const int32_t n_new = o->seqlen_new, len = o->seqlen_k, page = o->page_size;
    fa_params p;
    fa_status st = fa_params_init(&p, o->dtype, o->batch, o->seqlen_q, n_new, o->heads, o->heads_kv, o->head_dim);
    if (st != FA_OK) return cli_report_status(st, "info --plan --decode", "");
    p.softmax_scale = o->scale != 0.0f ? o->scale : 1.0f / sqrtf((float)o->head_dim);
    p.causal = o->causal == 1;
    p.window_left = o->window_left;
    p.window_right = p.causal ? 0 : o->window_right;
    p.softcap = o->softcap;
    p.q = fa_tensor_contiguous(nowhere, o->seqlen_q, o->heads, o->head_dim);
    p.o = p.q;
    if (n_new) p.k = p.v = fa_tensor_contiguous(nowhere, n_new, o->heads_kv, o->head_dim);
    const int32_t max_pages = page ? (len + page - 1) / page : 0;
    fa_kvcache kv;
    fa_kvcache_init(&kv, page ? 0 : o->batch, page ? 0 : len);
    kv.k_cache = kv.v_cache = fa_tensor_contiguous(nowhere, page ? page : len, o->heads_kv, o->head_dim);
    if (page) kv.block_table = (int32_t *)nowhere, kv.max_pages = max_pages, kv.page_size = page;
    if (page) kv.num_pages = o->batch * max_pages;
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = FA_BACKEND_CUDA;
    x.device = -1;
    char line[768];
    int virtual_device = 0;
    printf("problem: %s, batch %d, heads %d/%d, %d query row(s), a %s cache of %d rows, %d new token(s), "
           "head_dim %d\n",
           cli_dtype_name(o->dtype), o->batch, o->heads, o->heads_kv, o->seqlen_q, page ? "paged" : "contiguous", len,
           n_new, o->head_dim);
    st = fa_cuda_plan_kvcache(&p, &kv, &x, line, sizeof line, &virtual_device);
    if (virtual_device)
        printf("device:  none usable here; the plan of a 132-SM compute capability 9.0 device (H100, H200)\n");
    if (st != FA_OK) {
        printf("decode: not on CUDA: %s\n", fa_last_error());
        return cli_exit_code(st);
    }
    printf("%s\n", line);
    return EXIT_OK;
}
#endif

static int cmd_plan(cli_options *o) {
#ifdef FA_WITH_CUDA
    if (o->decode) return plan_decode(o);
    cli_set_defaults(o, 1, 2, 16, 4096, 128, 1);
    if (o->dtype == FA_F32) bad_usage("info --plan: the CUDA kernels take f16 or bf16%s%s", "", "");
    fa_params p;
    fa_status st = fa_params_init(&p, o->dtype, o->batch, o->seqlen_q, o->seqlen_k, o->heads, o->heads_kv, o->head_dim);
    if (st != FA_OK) return cli_report_status(st, "info --plan", "");
    fa_tensor *qo[] = { &p.q, &p.o, &p.dout, &p.dq }, *kv[] = { &p.k, &p.v, &p.dk, &p.dv };
    for (int i = 0; i < 4; i++) {
        qo[i]->stride_head = kv[i]->stride_head = o->head_dim;
        qo[i]->stride_seq = (int64_t)o->heads * o->head_dim;
        kv[i]->stride_seq = (int64_t)o->heads_kv * o->head_dim;
        qo[i]->stride_batch = qo[i]->stride_seq * o->seqlen_q;
        kv[i]->stride_batch = kv[i]->stride_seq * o->seqlen_k;
    }
    p.softmax_scale = o->scale != 0.0f ? o->scale : 1.0f / sqrtf((float)o->head_dim);
    p.causal = o->causal == 1;
    p.window_left = o->window_left;
    p.window_right = p.causal ? 0 : o->window_right;
    p.softcap = o->softcap;
    p.deterministic = o->deterministic;
    static const float slope = 0.5f; /* never read: the plan looks at which options are set */
    if (o->alibi) p.alibi_slopes = &slope;
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = FA_BACKEND_CUDA;
    x.kernel = o->kernel;
    x.device = -1;
    char line[768];
    int virtual_device = 0, rc = EXIT_OK;
    printf("problem: %s, batch %d, heads %d/%d, seqlen %d/%d, head_dim %d%s%s%s%s\n", cli_dtype_name(o->dtype),
           o->batch, o->heads, o->heads_kv, o->seqlen_q, o->seqlen_k, o->head_dim, p.causal ? ", causal" : "",
           o->softcap > 0.0f ? ", softcap" : "", o->alibi ? ", alibi" : "", o->deterministic ? ", deterministic" : "");
    for (int backward = 0; backward < 2; backward++) {
        st = fa_cuda_plan(&p, &x, backward, line, sizeof line, &virtual_device);
        if (backward == 0 && virtual_device)
            printf("device:  none usable here; the plan of a 132-SM compute capability 9.0 device (H100, H200)\n");
        if (st != FA_OK) {
            printf("%s: not on CUDA: %s\n", backward ? "bwd" : "fwd", fa_last_error());
            rc = cli_exit_code(st);
            continue;
        }
        printf("%s:     %s\n", backward ? "bwd" : "fwd", line);
    }
    return rc;
#else
    (void)o;
    fprintf(stderr, "flashattn: info --plan: this build has no CUDA backend\n");
    return cli_exit_code(FA_ERR_NOT_COMPILED);
#endif
}

/* ---------------------------------------------------------------------------------------------------------
 * run
 * ------------------------------------------------------------------------------------------------------- */

/* "cuda backend on NVIDIA H100", "cpu backend on 2 CPU threads", but "cuda backend, no CUDA device". */
static const char *device_sep(fa_backend b) {
    return vf_backend_on_device(b) && fa_device_count() == 0 ? ", " : " on ";
}

static int written_ok(const vf_problem *pr, int backward, const char *what) {
    int64_t unwritten, overwritten;
    vf_check_written(pr, backward, &unwritten, &overwritten);
    if (!unwritten && !overwritten) return 1;
    printf("  %s: %lld output elements not written, %lld elements outside the outputs overwritten\n", what,
           (long long)unwritten, (long long)overwritten);
    return 0;
}

static int cmd_run(cli_options *o) {
    reject_bench_options(o);
    const fa_backend b = single_backend(o);
    const int gpu = vf_backend_on_device(b);
    const int defaults = o->batch < 0 && o->heads < 0 && o->seqlen_q < 0 && o->seqlen_k < 0 && o->head_dim < 0;
    if (gpu)
        cli_set_defaults(o, 1, 2, 16, 4096, 128, 1);
    else
        cli_set_defaults(o, 0, 1, 8, 2048, 128, 1);
    /* the verified runs come first and warm up; the CPU times one run of each pass */
    const int repeats = o->repeats > 0 ? o->repeats : gpu ? 3 : 1, warmup = o->warmup >= 0 ? o->warmup : gpu ? 1 : 0;
    const int rows = o->rows > 0 ? o->rows : 64;

    char desc[256], dev[300];
    cli_describe(o, desc, sizeof desc);
    cli_device_name(b, o, dev, sizeof dev);
    printf("flashattn run: %s backend%s%s\n  problem: %s, seed %llu\n", cli_backend_name(b), device_sep(b), dev, desc,
           (unsigned long long)o->seed);
    if (defaults && !gpu)
        printf("  (the CPU default problem, sized to finish in a few seconds on 2 cores; the options change it)\n");
    fflush(stdout);

    vf_problem pr;
    int code = cli_make_problem(o, b, 1, &pr);
    if (code != EXIT_OK) return code;
    fa_exec x = cli_exec(o, b);
    double ms_f, ms_b;
    fa_status st = vf_run(&pr, &x, 0);
    int written = st == FA_OK && written_ok(&pr, 0, "forward");
    if (st == FA_OK) st = vf_run(&pr, &x, 1);
    written = written && st == FA_OK && written_ok(&pr, 1, "backward");
    /* timed without the device-side checks (the calls above had them; the data has not changed): they
     * synchronise, and their cost is shown on its own below */
    fa_exec xt = x;
    xt.check = 0;
    if (st == FA_OK) st = vf_time(&pr, &xt, 0, warmup, repeats, &ms_f);
    if (st == FA_OK) st = vf_time(&pr, &xt, 1, warmup, repeats, &ms_b);
    if (st != FA_OK) {
        code = cli_report_status(st, "run failed", pr.error[0] ? pr.error : fa_last_error());
        vf_problem_destroy(&pr);
        return code;
    }
    if (x.check && o->varlen && vf_backend_on_device(b)) {
        /* what exec.check = 1 adds to a call: fa_check with and without it (validation alone, then with the
         * pre-pass kernel and the wait for its answer) */
        const fa_params *dp = vf_params_for(&pr, b);
        double ms[2] = { 0, 0 };
        for (int with = 0; with < 2 && dp; with++) {
            fa_exec xc = x;
            xc.check = with;
            fa_check(dp, &xc, 0);
            const double t0 = vf_seconds();
            for (int i = 0; i < 100; i++) fa_check(dp, &xc, 0);
            ms[with] = (vf_seconds() - t0) * 10.0;
        }
        printf("  device check of cu_seqlens (exec.check = 1): +%.3f ms per call (fa_check %.3f ms with, %.3f "
               "without)\n",
               ms[1] - ms[0], ms[1], ms[0]);
    }
    const double ff = vf_flops(&pr, 0), fb = vf_flops(&pr, 1);
    /* FLOP / ms in TFLOP/s on a GPU, GFLOP/s on the CPU (where TFLOP/s reads 0.0x) */
    const double per_ms = gpu ? 1e-9 : 1e-6;
    const char *unit = gpu ? "TFLOP/s" : "GFLOP/s";
    printf("  forward   %10.3f ms  %8.4g %s\n", ms_f, ff / ms_f * per_ms, unit);
    printf("  backward  %10.3f ms  %8.4g %s\n", ms_b, fb / ms_b * per_ms, unit);
    printf("  fwd+bwd   %10.3f ms  %8.4g %s   (median of %d after %d warm-up; paper FLOP formula)\n", ms_f + ms_b,
           (ff + fb) / (ms_f + ms_b) * per_ms, unit, repeats, warmup);
    fflush(stdout);

    vf_report rep;
    double t0 = vf_seconds();
    st = vf_compare_sampled(&pr, 1, rows, &rep);
    if (st != FA_OK) {
        code = cli_report_status(st, "verification failed", "out of host memory");
        vf_problem_destroy(&pr);
        return code;
    }
    printf("  verified against the fp64 reference on %lld query rows and %lld key rows (%.1f s):\n",
           (long long)rep.rows_q, (long long)rep.rows_k, vf_seconds() - t0);
    vf_report_print(stdout, &rep, "    ");
    const int ok = rep.ok && written;
    printf("run: %s %s %.3f ms fwd+bwd, %.4g %s, max rel err O %.1e dQ %.1e dK %.1e dV %.1e\n", ok ? "PASS" : "FAIL",
           cli_backend_name(b), ms_f + ms_b, (ff + fb) / (ms_f + ms_b) * per_ms, unit, rep.err[VF_O].rel,
           rep.err[VF_DQ].rel, rep.err[VF_DK].rel, rep.err[VF_DV].rel);
    vf_problem_destroy(&pr);
    return ok ? EXIT_OK : EXIT_NUMERICAL;
}

/* ---------------------------------------------------------------------------------------------------------
 * check
 * ------------------------------------------------------------------------------------------------------- */

static int cmd_check(cli_options *o) {
    reject_bench_options(o);
    const fa_backend b = single_backend(o);
    const int gpu = vf_backend_on_device(b);
    if (o->decode) {
        if (o->varlen || o->bwd)
            bad_usage("check --decode: %s does not apply to a decode call%s", o->varlen ? "--varlen" : "--bwd", "");
        if (o->seqlen_k < 0) o->seqlen_k = 1024;
        if (o->heads < 0 && o->heads_kv < 0) o->heads = 8, o->heads_kv = 2;
        cli_set_defaults(o, gpu, 4, 8, 1, gpu ? 128 : 64, 0);
        return cli_check_decode(o, b);
    }
    cli_set_defaults(o, gpu, 2, 4, 512, gpu ? 128 : 64, 0);
    char desc[256], dev[300];
    cli_describe(o, desc, sizeof desc);
    cli_device_name(b, o, dev, sizeof dev);
    printf("flashattn check: %s backend%s%s\n  problem: %s, seed %llu%s\n", cli_backend_name(b), device_sep(b), dev,
           desc, (unsigned long long)o->seed, o->bwd ? ", forward and backward" : ", forward");
    fflush(stdout);

    vf_problem pr;
    int code = cli_make_problem(o, b, o->bwd, &pr);
    if (code != EXIT_OK) return code;
    fa_exec x = cli_exec(o, b);
    fa_status st = vf_run(&pr, &x, 0);
    int written = st == FA_OK && written_ok(&pr, 0, "forward");
    if (st == FA_OK && o->bwd) {
        st = vf_run(&pr, &x, 1);
        written = written && st == FA_OK && written_ok(&pr, 1, "backward");
    }
    if (st != FA_OK) {
        code = cli_report_status(st, "the backend failed", pr.error[0] ? pr.error : fa_last_error());
        vf_problem_destroy(&pr);
        return code;
    }
    int deterministic = 1;
    if (o->bwd && o->deterministic) {
        size_t n = vf_outputs_bytes(&pr, 1);
        unsigned char *a = malloc(n + 1), *c = malloc(n + 1);
        if (a && c) {
            vf_outputs_save(&pr, 1, a);
            st = vf_run(&pr, &x, 1);
            vf_outputs_save(&pr, 1, c);
            deterministic = st == FA_OK && memcmp(a, c, n) == 0;
            printf("  deterministic backward: two runs %s\n", deterministic ? "bit-identical" : "DIFFER");
        }
        free(a), free(c);
    }
    vf_report rep;
    double t0 = vf_seconds();
    st = vf_compare(&pr, o->bwd, &rep);
    if (st != FA_OK) {
        code = cli_report_status(st, "cannot compute the reference", pr.error);
        vf_problem_destroy(&pr);
        return code;
    }
    printf("  against the fp64 reference (%.1f s); tolerance = 2 x naive %s error + floor:\n", vf_seconds() - t0,
           cli_dtype_name(o->dtype));
    vf_report_print(stdout, &rep, "    ");
    if (o->dtype == FA_E4M3) { /* what the quantization costs: the same draws in bf16, before quantizing */
        vf_config twin_cfg = pr.cfg;
        twin_cfg.dtype = FA_BF16;
        vf_problem twin;
        double deq = 0, orig = 0;
        if (vf_rmse_o(&pr, &pr, &deq) == FA_OK && vf_problem_create(&twin, &twin_cfg) == FA_OK) {
            if (vf_rmse_o(&pr, &twin, &orig) == FA_OK)
                printf("  RMSE of O: %.2e against the e4m3 inputs' fp64 attention, %.2e against the bf16 inputs they "
                       "were quantized from (not part of the check)\n",
                       deq, orig);
            vf_problem_destroy(&twin);
        }
    }
    const int ok = rep.ok && written && deterministic;
    char line[512];
    int n = 0;
    for (int w = 0; w < VF_NUM_OUTPUTS; w++)
        if (rep.have[w])
            n += snprintf(line + n, sizeof line - (size_t)n, " %s %.2e %s %.2e", vf_output_names[w], rep.err[w].max_abs,
                          rep.err[w].ok ? "<=" : ">", rep.err[w].tol);
    printf("check: %s%s%s%s\n", ok ? "PASS" : "FAIL", line, written ? "" : " (outputs not fully written)",
           deterministic ? "" : " (backward not deterministic)");
    vf_problem_destroy(&pr);
    return ok ? EXIT_OK : EXIT_NUMERICAL;
}

/* ---------------------------------------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version"))) return print_version();
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : EXIT_OK;
    }
    cli_options o;
    parse_options(&o, argc, argv);
    o.command = argv[1];
    if (o.varlen && o.sweep) bad_usage("%s: --varlen does not combine with --sweep%s", "bench", "");
    if (!strcmp(argv[1], "info")) return o.plan ? cmd_plan(&o) : cmd_info();
    if (!strcmp(argv[1], "run")) return cmd_run(&o);
    if (!strcmp(argv[1], "check")) return cmd_check(&o);
    if (!strcmp(argv[1], "bench")) return o.decode ? cli_bench_decode(&o) : cli_bench(&o);
    bad_usage("unknown command '%s'%s", argv[1], "");
}
