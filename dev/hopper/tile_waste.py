#!/usr/bin/env python3
"""Counts the work of the FA3 forward's query tiles for one (batch, head) of the paper's sweep: 64 x BN
warpgroup-blocks (one consumer warpgroup's Q K^T and P V for one key block) that the tiles run, against the
blocks the attention needs. Compares 128-row tiles, 192-row tiles as the kernel had them (every warpgroup runs
every block of its tile), 192-row tiles whose warpgroups without rows skip the tile, those aligned to the last
query under a causal mask (the partial tile first), and those with each warpgroup stopping after the key blocks
its own rows see.

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


if __name__ == "__main__":
    main()
