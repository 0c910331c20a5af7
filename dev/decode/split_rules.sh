#!/bin/bash
# The decode split rules (src/cuda/decode.cu: FLASHATTN_DECODE_SPLITS, FA_TUNING builds) on one GPU in one go: a
# tuning build and the default build (head dims 64 and 128), test_kvcache on CUDA (the default build; the GPU
# cases under every rule of the tuning build), then compare.py's decode set on MQA 32/1 (ours, cuDNN) under every
# rule, and GQA 32/8 once on the default build (every rule plans GQA alike: its kv heads have 16 query rows or
# fewer), then MQA again under every rule in the reverse order; a comparison starts only while it can end within
# the time given. Logs and JSON go to $OUT (default /tmp/decode-splits).
# Usage, from the repository root: dev/decode/split_rules.sh [seconds for the whole run, default 345]
set -u
OUT=${OUT:-/tmp/decode-splits}
mkdir -p "$OUT"
BUDGET=${1:-345}
SECONDS=0
T=build/rp-tune D=build/rp-default RULES="one blocks work long"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
(FA_TUNING=1 FA_HDIMS="64 128" make -j8 BUILD=$T all $T/tests/test_kvcache >"$OUT/build-tune.log" 2>&1 ||
    echo "tuning build failed") &
(FA_HDIMS="64 128" make -j8 BUILD=$D all $D/tests/test_kvcache >"$OUT/build-default.log" 2>&1 ||
    echo "default build failed") &
wait
echo "[build ${SECONDS}s] decode spills: $(grep -h 'spill' "$OUT"/build-*.log | grep -c decode)"
[ -f $T/libflashattn.so ] && [ -f $D/libflashattn.so ] || { tail -20 "$OUT"/build-*.log; exit 1; }
for s in 1x32768 1x131072 8x8192 32x4096 64x16384; do
    for r in $RULES default; do
        lib=$T
        [ $r = default ] && lib=$D
        FLASHATTN_DECODE_SPLITS=$r $lib/flashattn info --plan --decode --batch ${s%x*} --seqlen-k ${s#*x} --heads 32 \
            --heads-kv 1 --head-dim 128 2>&1 | grep "^decode:" | sed "s/^decode: \(append, then \)\?/$s $r: /; s/ of the cache's.*tiles);//; s/ (batch.*splits),/,/; s/, a ring.*//"
    done
done
timeout 150 $D/tests/test_kvcache -b cuda >"$OUT/kv-default.log" 2>&1
echo "[test_kvcache default rc=$? ${SECONDS}s] $(tail -1 "$OUT/kv-default.log")"
grep "^FAIL" "$OUT/kv-default.log" | head -5
for r in $RULES; do
    FLASHATTN_DECODE_SPLITS=$r timeout 60 $T/tests/test_kvcache -b cuda -k gpu- >"$OUT/kv-$r.log" 2>&1
    echo "[test_kvcache $r rc=$? ${SECONDS}s] $(tail -1 "$OUT/kv-$r.log")"
    grep "^FAIL" "$OUT/kv-$r.log" | head -3
done

cmp() { # name lib heads [rule]
    [ $SECONDS -le $((BUDGET - 75)) ] || { echo "[compare $1 skipped: ${SECONDS}s]"; return; }
    FLASHATTN_LIBRARY=$PWD/$2/libflashattn.so FLASHATTN_DECODE_SPLITS=${4:-} timeout 75 python3 bench/compare.py \
        --sets decode --impls ours,cudnn --decode-heads $3 --json "$OUT/cmp-$1.json" >"$OUT/cmp-$1.log" 2>&1
    echo "[compare $1 rc=$? ${SECONDS}s]"
}
for r in $RULES; do cmp mqa-$r-1 $T 32/1 $r; done
cmp gqa-default $D 32/8
for r in long work blocks one; do cmp mqa-$r-2 $T 32/1 $r; done

python3 - "$OUT" <<'PY'
import glob, json, os, sys
shapes, runs = [], {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "cmp-*.json"))):
    d = json.load(open(path))
    name = os.path.basename(path)[4:-5]
    med = {(r["shape"], r["impl"]): r["median"] for r in d["records"]}
    shapes += [r["shape"] for r in d["records"] if r["shape"] not in shapes]
    rat = {x["shape"]: x["median"] for x in d.get("ratios", []) if x["num"] == "ours" and x["den"] == "cudnn"}
    copy = ((d.get("ceilings") or {}).get("start") or {}).get("copy_tbps")
    runs[name] = (med, rat, copy)
f = lambda x: "%5.2f" % x if x is not None else "    -"
for title, key in (("ours TB/s", lambda m, q, s: m.get((s, "ours"))), ("cuDNN TB/s", lambda m, q, s: m.get((s, "cudnn"))),
                   ("ours/cuDNN (peer time / ours, median of rounds)", lambda m, q, s: q.get(s))):
    print("\n== " + title)
    print("%-18s %s  copy" % ("run", " ".join("%9s" % s for s in shapes)))
    for name, (m, q, copy) in runs.items():
        print("%-18s %s  %s" % (name, " ".join("%9s" % f(key(m, q, s)) for s in shapes), f(copy)))
PY
echo "[done ${SECONDS}s]"
