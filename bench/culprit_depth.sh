#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The culprit finder's trials and process time on the 26B-A4B architecture's depth (30 layers, its
# 5 sliding : 1 full attention pattern) at the tiny preset's width, on this CPU under the emulated
# H200 policy (issue #37: the finder's time is its trial count times a trial's time; the count is
# what this measures without a GPU).
#   bench/culprit_depth.sh BUILD [LAYERS]    e.g. bench/culprit_depth.sh build/ci
# The checkpoint: `save-model --preset tiny`, its 4 layers cycled to LAYERS (default 30); written
# with the project's own tools (no Python packages beyond Debian's torch-free python3).
set -euo pipefail
build=${1:?usage: culprit_depth.sh BUILD [LAYERS]}
layers=${2:-30}
cli=$build/app/batchlens-cli
work=$(mktemp -d /tmp/bl-culprit-depth.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$cli" save-model --preset tiny --seed 0 --out "$work/tiny" >/dev/null
python3 - "$work/tiny" "$work/deep" "$layers" <<'PY'
import json, os, re, shutil, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(dst)
cfg = json.load(open(os.path.join(src, "config.json")))
t = cfg["text_config"]
base = t["num_hidden_layers"]
# 26B-A4B: five sliding-window layers, then one full-attention layer.
t["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
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
    a, b = info["data_offsets"]
    blob = data[a:b]
    m = layer.match(name)
    if not m:
        add(name, info, blob)
    elif int(m.group(2)) == 0:
        for i in range(n):
            src_name = m.group(1) + str(i % base) + m.group(3)
            s = header[src_name]
            add(m.group(1) + str(i) + m.group(3), s, data[s["data_offsets"][0]:s["data_offsets"][1]])
if meta is not None:
    out["__metadata__"] = meta
h = json.dumps(out).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(os.path.join(dst, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
echo "culprit_depth: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
  "$layers layers at tiny width, emulated_h200, B=2,4, lockstep trials"
for strategy in row_wise batch_invariant; do
  /usr/bin/time -f "%e s wall, %U s user" -o "$work/time" \
    "$cli" culprit --checkpoint "$work/deep" --policy emulated_h200 --batch-sizes 2,4 \
    --steps 8 --max-new-tokens 32 --strategy "$strategy" --cost-repeats 0 \
    --out "$work/culprit-$strategy.h5" >"$work/out" 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
  trials=$("$cli" summary --json "$work/culprit-$strategy.h5" |
    python3 -c 'import json,sys; c=json.load(sys.stdin)["culprit"]; print(len(c["trials"]), "trials;", c["fix"] if isinstance(c["fix"], str) else json.dumps(c.get("fix_text", c["fix"])))')
  echo "  $strategy: $trials; $(cat "$work/time")"
done
