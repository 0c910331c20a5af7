#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Reads an FA3 forward timeline (a build with -DFA3_TRACE=1, run with FLASHATTN_FA3_TRACE=FILE) and prints
where the consumer warpgroups spend their cycles, and who holds up the ping-pong rotation.

    python3 dev/hopper/trace.py FILE

Per consumer warpgroup the time between consecutive events is charged to the pair (event -> next event).
A turn is "held" when a warpgroup asks for it (TURN_REQ) after the warpgroup before it has passed it on
(ARRIVE): the tensor cores then wait on that warpgroup, and the hold is charged to what it did before asking.
"""
import collections
import struct
import sys

NAMES = {1: "TILE", 2: "Q", 3: "TURN_REQ", 4: "TURN", 5: "ARRIVE", 6: "QK_DONE", 7: "PV_DONE", 8: "EPI",
         9: "EPI_END", 10: "PTILE", 11: "KLOAD", 12: "VLOAD", 13: "QLOAD",
         14: "SLOT_WAIT", 15: "SLOT", 16: "INDEX"}
# what a warpgroup that asks for its turn late was doing, by the event before its request
LATE = {"Q": "tile start (epilogue, next tile, Q)", "QK_DONE": "first softmax of a tile",
        "PV_DONE": "softmax, P V wait", "ARRIVE": "skipped block", "TILE": "idle tile"}


def load(path):
    data = open(path, "rb").read()
    grid, cap = struct.unpack_from("ii", data, 0)
    words = struct.unpack_from("<%dQ" % (grid * 4 * cap * 2), data, 8)
    streams = {}
    for cta in range(grid):
        for wg in range(4):
            base = (cta * 4 + wg) * cap * 2
            ev = []
            for i in range(cap):
                t, x = words[base + 2 * i], words[base + 2 * i + 1]
                if t == 0 and x == 0:
                    break
                ev.append((t, x >> 32, x & 0xffffffff))
            streams[(cta, wg)] = ev
    return grid, streams


def main(path):
    grid, streams = load(path)
    spent = collections.Counter()
    total = 0
    starts, ends = {}, {}
    for (cta, wg), ev in streams.items():
        if not ev:
            continue
        starts[cta] = min(starts.get(cta, ev[0][0]), ev[0][0])
        ends[cta] = max(ends.get(cta, ev[-1][0]), ev[-1][0])
        if wg == 0:
            continue
        for a, b in zip(ev, ev[1:]):
            spent[(NAMES[a[1]], NAMES[b[1]])] += b[0] - a[0]
            total += b[0] - a[0]
    print("consumer warpgroup cycles by (event -> next event), %d CTAs:" % grid)
    for k, v in spent.most_common(16):
        print("  %-22s %6.1f%%" % ("%s -> %s" % k, 100.0 * v / max(total, 1)))

    held = collections.Counter()
    busy = 0
    turns = 0
    for cta in range(grid):
        merged = []
        for wg in range(1, 4):
            ev = streams.get((cta, wg), [])
            for i, e in enumerate(ev):
                before = NAMES[ev[i - 1][1]] if i > 0 else "-"
                merged.append((e[0], wg, e[1], before))
        merged.sort()
        last_arrive = None
        req = {}
        for t, wg, code, before in merged:
            if code == 3:
                req[wg] = (t, before)
            elif code == 4:
                turns += 1
                if last_arrive is not None and wg in req and req[wg][0] > last_arrive:
                    r = req[wg]
                    held[LATE.get(r[1], r[1])] += r[0] - last_arrive
            elif code == 5:
                last_arrive = t
        if cta in starts:
            busy += ends[cta] - starts[cta]
    print("CTA spans (clock64 is per SM: not comparable across CTAs) mean %.0f cycles" % (busy / len(starts)))
    print("turns %d; rotation held (cycles, %% of the CTAs' summed spans) by what the late warpgroup did before:"
          % turns)
    for k, v in held.most_common(10):
        print("  %-38s %6.1f%%" % (k, 100.0 * v / max(busy, 1)))

    tiles = collections.defaultdict(list)
    for (cta, wg), ev in streams.items():
        if wg == 0:
            continue
        open_tile = None
        nturn = 0
        for t, code, arg in ev:
            if code == 1:
                open_tile, nturn = t, 0
            elif code == 4:
                nturn += 1
            elif code == 9 and open_tile is not None:
                tiles[nturn].append(t - open_tile)
                open_tile = None
    print("consumer warpgroup tile time (TILE -> EPI_END, cycles) by turns taken in it:")
    for n in sorted(tiles):
        v = sorted(tiles[n])
        print("  %3d turns: %6d tiles, median %7d, per turn %6d" % (n, len(v), v[len(v) // 2], v[len(v) // 2] / max(n, 1)))

    # Between tiles: how long a consumer warpgroup, done with a tile (EPI_END), waits before the producer has
    # published the next one (PTILE), and how late Q is asked for: the producer's Q load after the consumer's
    # TILE.
    waits = collections.Counter()
    count = collections.Counter()
    for cta in range(grid):
        prod = streams.get((cta, 0), [])
        ptile = {}
        qload = {}
        klast = []
        for t, code, arg in prod:
            if code == 10:
                ptile.setdefault(arg, t)
                cur = arg
            elif code == 13:
                qload[(cur, arg)] = t
        for wg in range(1, 4):
            ev = streams.get((cta, wg), [])
            for i, (a, b) in enumerate(zip(ev, ev[1:])):
                if a[1] == 9:  # EPI_END: the next TILE, past the slot events
                    nxt = next((e for e in ev[i + 1:] if e[1] in (1, 9)), None)
                    if nxt is not None and nxt[1] == 1 and nxt[2] in ptile:
                        waits["tile index after EPI_END"] += max(0, ptile[nxt[2]] - a[0])
                        waits["EPI_END -> TILE total"] += nxt[0] - a[0]
                        count["tile index after EPI_END"] += 1
                if a[1] == 1 and b[1] == 2 and (a[2], wg - 1) in qload:
                    waits["Q load issued after TILE"] += max(0, qload[(a[2], wg - 1)] - a[0])
                    waits["TILE -> Q total"] += b[0] - a[0]
                    count["Q load issued after TILE"] += 1
    print("between tiles (mean cycles per consumer tile):")
    for k in waits:
        n = count.get(k) or count.get({"EPI_END -> TILE total": "tile index after EPI_END",
                                       "TILE -> Q total": "Q load issued after TILE"}[k])
        print("  %-28s %7.0f" % (k, waits[k] / max(n, 1)))
    # the producer: time per event pair
    pspent = collections.Counter()
    for cta in range(grid):
        ev = streams.get((cta, 0), [])
        for a, b in zip(ev, ev[1:]):
            pspent[(NAMES[a[1]], NAMES[b[1]])] += b[0] - a[0]
    ptotal = sum(pspent.values())
    print("producer cycles by (event -> next event):")
    for k, v in pspent.most_common(8):
        print("  %-22s %6.1f%%" % ("%s -> %s" % k, 100.0 * v / max(ptotal, 1)))


if __name__ == "__main__":
    main(sys.argv[1])
