#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The culprit finder's trials and process time on the 26B-A4B architecture's depth (30 layers, its
# 5 sliding : 1 full attention pattern) at the demo preset's width, on this CPU under the emulated
# H200 policy (issue #37: the finder's time is its trial count times a trial's time; the count is
# what this measures without a GPU).
#   bench/culprit_depth.sh BUILD [LAYERS]    e.g. bench/culprit_depth.sh build/ci
# The checkpoint: `save-model --preset demo`, its 6 layers cycled to LAYERS (default 30); written
# with the project's own tools (no Python packages beyond Debian's torch-free python3).
set -euo pipefail
build=${1:?usage: culprit_depth.sh BUILD [LAYERS]}
layers=${2:-30}
cli=$build/app/batchlens-cli
work=$(mktemp -d /tmp/bl-culprit-depth.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$cli" save-model --preset demo --seed 0 --out "$work/base" >/dev/null
python3 - "$work/base" "$work/deep" "$layers" <<'PY'
import json, os, re, shutil, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(dst)
cfg = json.load(open(os.path.join(src, "config.json")))
t = cfg["text_config"]
old_types = t["layer_types"]
# 26B-A4B: five sliding-window layers, then one full-attention layer. Each new layer copies a
# layer of the same type (their weights differ: full attention shares K and V).
t["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
same = {k: [i for i, x in enumerate(old_types) if x == k] for k in set(old_types)}
source = [same[k][i % len(same[k])] for i, k in enumerate(t["layer_types"])]
t["num_hidden_layers"] = n
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=1)
for f in ("generation_config.json", "tokenizer.json"):
    shutil.copy(os.path.join(src, f), dst)
raw = open(os.path.join(src, "model.safetensors"), "rb").read()
size = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + size])
data = raw[8 + size:]
meta = header.pop("__metadata__", None)
layer = re.compile(r"^(.*\.layers\.)(\d+)(\..*)$")
out, blobs, offset = {}, [], 0
def add(name, info, blob):
    global offset
    out[name] = {"dtype": info["dtype"], "shape": info["shape"],
                 "data_offsets": [offset, offset + len(blob)]}
    blobs.append(blob)
    offset += len(blob)
for name, info in sorted(header.items()):
    if not layer.match(name):
        a, b = info["data_offsets"]
        add(name, info, data[a:b])
for i in range(n):
    for name, info in sorted(header.items()):
        m = layer.match(name)
        if m and int(m.group(2)) == source[i]:
            a, b = info["data_offsets"]
            add(m.group(1) + str(i) + m.group(3), info, data[a:b])
if meta is not None:
    out["__metadata__"] = meta
h = json.dumps(out).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(os.path.join(dst, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
echo "culprit_depth: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
  "the demo preset's width, B=2,4, 8 steps, lockstep trials, row_wise"
# emulated_h100_report splits the router projection in every layer from the first step (as the
# H100/H200 26B-A4B runs first diverge in layer 0 at step 1), at the 26B-A4B depth;
# emulated_split_k with the prompt encoded as one batch makes the finder fix every family (as
# the 26B-A4B batched-prefill run on the H200 did), at the demo's own 6 layers.
run_case() {
  local policy=$1 label=$2  # the model: the array `model`
  shift 2
  for search in plain fewer-whole fewer; do
    extra=("$@")
    [ "$search" = plain ] && extra+=(--plain-search)
    # fewer-whole: grouped drops and informed narrowing, every trial watching every tick.
    [ "$search" = fewer-whole ] && extra+=(--horizon-ticks 0)
    /usr/bin/time -f "%e s wall, %U s user" -o "$work/time" \
      "$cli" culprit "${model[@]}" --policy "$policy" --batch-sizes 2,4 \
      --steps 8 --max-new-tokens 32 --strategy row_wise --cost-repeats 0 "${extra[@]}" \
      --out "$work/culprit.h5" >"$work/out" 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
    trials=$("$cli" summary --json "$work/culprit.h5" |
      python3 -c '
import collections, json, sys
c = json.load(sys.stdin)["culprit"]
stages = collections.Counter(t["stage"].split(" ")[0] for t in c["trials"])
same = sum(t["identical"] for t in c["trials"])
rules = ["%s[%s..%s]" % ("+".join(r["families"]), r["first_layer"], r["last_layer"]) for r in c["fix"]["rules"]]
print(len(c["trials"]), "trials,", same, "identical (" + ", ".join("%s %d" % kv for kv in stages.items()) +
      "); finder %.1f s; fix" % c["wall_s"], " ".join(rules))')
    echo "  $label, $search search: $trials; process $(cat "$work/time")"
  done
}
model=(--checkpoint "$work/deep")
run_case emulated_h100_report "$layers layers, emulated_h100_report"
model=(--preset demo)
run_case emulated_split_k "6 layers, emulated_split_k, --prefill batched" \
  --prefill batched
