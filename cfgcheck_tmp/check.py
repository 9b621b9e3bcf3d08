import json, glob, os, sys, warnings, logging
import transformers
from transformers import DiffusionGemmaConfig
print("transformers", transformers.__version__)
here = os.path.dirname(os.path.abspath(__file__))
files = sorted(glob.glob(os.path.join(here, "*.json"))) + sorted(glob.glob("resources/models/*.json"))
ok = True
for f in files:
    doc = json.load(open(f))
    try:
        cfg = DiffusionGemmaConfig.from_dict(dict(doc))
    except Exception as e:
        ok = False
        print("FAIL", f, type(e).__name__, e)
        continue
    t = cfg.text_config
    td = doc["text_config"]
    full = [i for i, x in enumerate(t.layer_types) if x == "full_attention"]
    plc = getattr(t, "per_layer_config", None)
    def pl(i):
        try:
            c = plc[i]
            return {k: getattr(c, k, None) for k in ("head_dim", "num_key_value_heads")}
        except Exception as e:
            return repr(e)[:80]
    print(os.path.basename(f), "OK",
          "sw", t.sliding_window, "raw", td.get("sliding_window"),
          "bidi", t.use_bidirectional_attention,
          "full", full, "pl(full0)", pl(full[0]), "pl(0)", pl(0),
          "rope", t.rope_parameters,
          "experts", t.num_experts, t.top_k_experts, t.moe_intermediate_size,
          "eos", getattr(cfg, "eos_token_id", None), "canvas", cfg.canvas_length, "dtype", getattr(cfg, "dtype", None))
    d = cfg.to_dict()
    print("   to_dict sliding_window", d["text_config"]["sliding_window"], "keys extra:",
          sorted(set(d["text_config"]) - set(td))[:40])
    print("   top keys extra:", sorted(set(d) - set(doc)))
sys.exit(0 if ok else 1)
