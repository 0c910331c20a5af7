/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli.h - what the parts of the flashattn command line share: the parsed options, exit codes, and turning
 * options into a problem and an fa_exec.
 */
#ifndef FLASHATTN_CLI_CLI_H
#define FLASHATTN_CLI_CLI_H

#include <stdint.h>

#include "flashattn.h"
#include "../check/verify.h"

/* Exit codes */
enum {
    EXIT_OK = 0,
    EXIT_NUMERICAL = 1,   /* check/run: an output outside the tolerance, or not written */
    EXIT_USAGE = 2,       /* bad option or invalid shape */
    EXIT_UNSUPPORTED = 3, /* the chosen backend does not support the problem (or is not built / no GPU) */
    EXIT_RUNTIME = 4      /* out of memory, CUDA error, I/O error */
};

#define CLI_MAX_BACKENDS 8

typedef struct cli_options {
    const char *command; /* info, run, check, bench */
    fa_backend backends[CLI_MAX_BACKENDS];
    int nbackends; /* 0: auto */
    fa_dtype dtype;
    int dtype_given;
    /* sizes: -1 = not given (the command's default applies) */
    int32_t batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim;
    int causal; /* -1 not given, 0 --no-causal, 1 --causal */
    int32_t window_left, window_right;
    float softcap, scale;
    float k_ramp; /* check/run: keys scaled up along the sequence (vf_config.k_ramp) */
    int alibi, varlen, bwd, deterministic;
    int plan;     /* info --plan: the CUDA kernel family and choices for the problem */
    int fwd_only; /* bench --sweep: skip the backward */
    int seed_given;
    uint64_t seed;
    int32_t threads;
    int no_device_check; /* 1: fa_exec.check = 0 in check/run (bench never checks: it would time a sync) */
    fa_kernel kernel;
    int layout; /* vf_layout: 0 = (batch, seqlen, heads, head_dim), 1 = (batch, heads, seqlen, head_dim) */
    int32_t repeats, warmup, rows; /* -1: defaults */
    const char *csv, *json, *sweep, *plot, *peers;
    /* check --decode: the KV cache call (seqlen_k is the cache's rows per sequence) */
    int decode, leftpad, rotary_halves;
    int32_t seqlen_new, page_size, rotary_dim;
    int32_t descale_block; /* --dtype e4m3: rows per descale (0: one per batch entry and head) */
} cli_options;

/* The backend "auto" stands for: CUDA when built and a GPU is present, else the CPU. */
fa_backend cli_auto_backend(void);
const char *cli_backend_name(fa_backend b);
const char *cli_dtype_name(fa_dtype t);

/* Exit code for a library status (2 invalid, 3 unsupported / not built / no device, 4 otherwise). */
int cli_exit_code(fa_status st);

/* Prints "flashattn: <what>: <fa_last_error()> [--option, ...]" naming the options behind the fields the
 * message mentions, and returns the exit code for st. */
int cli_report_status(fa_status st, const char *what, const char *detail);

/* Fills what the options left open with a command's defaults: f32 on the CPU, bf16 on a GPU (gpu = 1 for
 * the CUDA and naive backends), heads_kv = heads, seqlen_k = seqlen_q. */
void cli_set_defaults(cli_options *o, int gpu, int32_t batch, int32_t heads, int32_t seqlen, int32_t head_dim,
                      int causal);

/* The problem config for the options (defaults already filled in by the command). */
void cli_config(const cli_options *o, vf_config *c);

/* Checks the shape with the library's validation before anything is allocated, then builds the problem
 * and checks it against backend b. Returns EXIT_OK or the exit code after printing why. */
int cli_make_problem(const cli_options *o, fa_backend b, int backward, vf_problem *pr);

fa_exec cli_exec(const cli_options *o, fa_backend b);

/* One-line description of a problem for headers ("bf16, batch 2, heads 16/16, seqlen 4096/4096, ..."). */
void cli_describe(const cli_options *o, char *buf, int size);

/* "NVIDIA H200" for the CUDA backends when a GPU is present ("no CUDA device" when none is), "N CPU threads" for
 * the host backends. */
void cli_device_name(fa_backend b, const cli_options *o, char *buf, int size);

int cli_bench(cli_options *o);

/* check --decode (decode.c): fa_fwd_kvcache on backend b against the fp64 reference; an exit code. */
int cli_check_decode(cli_options *o, fa_backend b);

/* bench --decode (decode.c): one decode step's K+V bandwidth next to the copy bandwidth; an exit code. */
int cli_bench_decode(cli_options *o);

/* The sweeps bench --sweep knows ("paper, cpu"), and whether name is one of them. */
const char *cli_sweep_names(void);
int cli_sweep_known(const char *name);

#endif /* FLASHATTN_CLI_CLI_H */
