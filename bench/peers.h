/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peers.h - the peers' timings that bench/peer_bench.py --json writes, read for flashattn bench --peers.
 */
#ifndef FLASHATTN_BENCH_PEERS_H
#define FLASHATTN_BENCH_PEERS_H

/* One peer measurement. */
typedef struct peer_record {
    char impl[48];
    char pass[8]; /* "fwd" or "bwd" */
    int head_dim, causal, seqlen, batch, heads;
    double tflops;
} peer_record;

/* Reads the JSON list of records; returns the count (and *out, to free), or with a message in err -1 when
 * the text is not such a list and -2 when the file cannot be read (an I/O failure, exit code 4). */
int peers_read(const char *path, peer_record **out, char *err, int err_size);

#endif /* FLASHATTN_BENCH_PEERS_H */
