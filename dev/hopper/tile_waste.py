#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Counts the work of the FA3 forward's query tiles for one (batch, head) of the paper's sweep: 64 x BN
warpgroup-blocks (one consumer warpgroup's Q K^T and P V for one key block) that the tiles run, against the
blocks the attention needs. Compares 128-row tiles, 192-row tiles as the kernel had them (every warpgroup runs
every block of its tile), 192-row tiles whose warpgroups without rows skip the tile, those aligned to the last
query under a causal mask (the partial tile first), and those with each warpgroup stopping after the key blocks
its own rows see. Under a causal mask it then counts, for the last variant, the warpgroup-blocks that take the
masked (general) step with the unmasked key range taken from the tile's first row and from the warpgroup's own
first row, and the last blocks whose second half no row of the warpgroup sees (their P V runs at half width).

    python3 dev/hopper/tile_waste.py [--block-n 128]
"""
import argparse
import math


def count(seqlen, block_m, block_n, causal, skip_idle, align_end, per_group=False):
    tiles = math.ceil(seqlen / block_m)
    shift = (tiles * block_m - seqlen) // 64 * 64 if align_end else 0
    total = 0
    for m in range(tiles):
        first = m * block_m - shift
        for w in range(block_m // 64):
            row0 = first + 64 * w
            if skip_idle and not 0 <= row0 < seqlen:
                continue
            last_row = min((row0 if per_group else first) + (64 if per_group else block_m), seqlen)
            total += math.ceil((last_row if causal else seqlen) / block_n)
    return total


def masked_steps(seqlen, block_n):
    """(general steps with the tile's range, with the warpgroup's own range, half-width last blocks), 192-row
    causal tiles aligned to the last query, each warpgroup walking only its own blocks."""
    tiles = math.ceil(seqlen / 192)
    shift = (tiles * 192 - seqlen) // 64 * 64
    by_tile = by_group = half = 0
    for m in range(tiles):
        first = m * 192 - shift
        for w in range(3):
            row0 = first + 64 * w
            if not 0 <= row0 < seqlen:
                continue
            key_end = min(row0 + 64, seqlen)  # one past the last key of the warpgroup's last row
            blocks = math.ceil(key_end / block_n)
            by_tile += blocks - min(blocks, max(0, first + 1) // block_n)
            by_group += blocks - min(blocks, (row0 + 1) // block_n)
            half += key_end - (blocks - 1) * block_n <= block_n // 2
    return by_tile, by_group, half


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block-n", type=int, default=128)
    args = ap.parse_args()
    bn = args.block_n
    variants = [("128 rows", 128, False, False, False), ("192", 192, False, False, False),
                ("192 skip", 192, True, False, False), ("192 skip+end", 192, True, True, False),
                ("+own blocks", 192, True, True, True)]
    print("%-6s %6s %8s " % ("causal", "seqlen", "needed") + " ".join("%13s" % v[0] for v in variants))
    for causal in (False, True):
        for seqlen in (512, 1024, 2048, 4096, 8192, 16384):
            needed = seqlen * seqlen / (2 if causal else 1) / (64 * bn)
            cells = [count(seqlen, bm, bn, causal, skip, end and causal, own) for _, bm, skip, end, own in variants]
            print("%-6s %6d %8.0f " % ("yes" if causal else "no", seqlen, needed) + " ".join("%13d" % c for c in cells))
    print("\ncausal, 192-row tiles: masked steps (tile's range -> own range), half-width last blocks")
    for seqlen in (512, 1024, 2048, 4096, 8192, 16384):
        print("%6d %6d -> %6d %6d" % ((seqlen,) + masked_steps(seqlen, bn)))


if __name__ == "__main__":
    main()
