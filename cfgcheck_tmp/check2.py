import json
from transformers import DiffusionGemmaConfig
doc = json.load(open("resources/models/mid.json"))
cfg = DiffusionGemmaConfig.from_dict(dict(doc))
d = cfg.to_dict()
t = d["text_config"]
print("per_layer_config", json.dumps(t.get("per_layer_config"))[:600])
print("has global_head_dim", "global_head_dim" in t, "num_global_key_value_heads" in t)
s = cfg.to_json_string()
d2 = json.loads(s)
cfg2 = DiffusionGemmaConfig.from_dict(d2)
print("reload pl full", cfg2.text_config.per_layer_config[5].head_dim, cfg2.text_config.per_layer_config[5].num_key_value_heads,
      "pl 0", cfg2.text_config.per_layer_config[0].head_dim, cfg2.text_config.per_layer_config[0].num_key_value_heads)
print(type(cfg2.text_config.per_layer_config).__name__, [type(k).__name__ for k in list(getattr(cfg2.text_config.per_layer_config,'keys',lambda:[])())][:3])
print("to_json_string text per_layer_config", json.dumps(d2["text_config"].get("per_layer_config"))[:400])
# a config with per_layer_config and a conflicting global_head_dim
t2 = dict(d2["text_config"]); t2["global_head_dim"] = 64
c3 = DiffusionGemmaConfig.from_dict({**d2, "text_config": t2})
print("conflict -> full head_dim", c3.text_config.per_layer_config[5].head_dim)
