"""GPT config: parsing, defaults and validation.

The C++ importer (lib/Frontend/GPT/GPTImporter.cpp) implements the same rules;
docs/models.md is the shared specification.  A change here needs the same
change there (test_reference_importer.py compares the two graphs).
"""

import json

# HF / GPT-2 spellings accepted for the canonical (Megatron-style) keys.
ALIASES = {
    "n_layer": "num_layers",
    "num_hidden_layers": "num_layers",
    "n_embd": "hidden_size",
    "n_head": "num_attention_heads",
    "num_key_value_heads": "num_query_groups",
    "n_inner": "ffn_hidden_size",
    "intermediate_size": "ffn_hidden_size",
    "n_positions": "seq_length",
    "max_position_embeddings": "seq_length",
    "tie_word_embeddings": "tie_embeddings",
    "layer_norm_epsilon": "layernorm_epsilon",
    "rms_norm_eps": "layernorm_epsilon",
    "rope_theta": "rotary_base",
}

REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")

# key -> (type, default or None when derived from other keys)
OPTIONAL = {
    "variant": (str, "gpt"),
    "num_query_groups": (int, None),  # key/value heads; num_attention_heads
    "ffn_hidden_size": (int, None),  # 4 * hidden_size
    "micro_batch_size": (int, 1),
    "tie_embeddings": (bool, None),  # gpt: true, llama: false
    "dtype": (str, "float32"),
    "layernorm_epsilon": (float, None),  # gpt: 1e-5, llama: 1e-5
    "gelu_approximate": (str, "tanh"),
    "rotary_base": (float, 10000.0),
    "hidden_dropout": (float, 0.0),
    "attention_dropout": (float, 0.0),
    "make_vocab_size_divisible_by": (int, 1),
    "seed": (int, 0),
}

# Mixture of experts (Megatron's names; docs/models.md). Only with
# num_moe_experts; a normalized config has them only then.
MOE = {
    "num_moe_experts": (int, None),
    "moe_router_topk": (int, 2),
    "moe_ffn_hidden_size": (int, None),  # ffn_hidden_size
    "moe_aux_loss_coeff": (float, 0.0),
    "moe_z_loss_coeff": (float, 0.0),
    "moe_capacity_factor": (float, None),  # absent: dropless
    "moe_layer_freq": (None, 1),  # every Nth layer, or a 0/1 per layer
}

# Order of keys in a normalized config (and in the `mapp.model` attribute).
KEY_ORDER = (
    "variant", "num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
    "ffn_hidden_size",
    "seq_length", "vocab_size", "micro_batch_size", "tie_embeddings", "dtype",
    "layernorm_epsilon", "gelu_approximate", "rotary_base", "hidden_dropout",
    "attention_dropout", "make_vocab_size_divisible_by", "seed",
)


# Upper bounds of the sizes (runtime/include/mapp/rt/PlanLimits.h, which the
# C++ importer and the runtime share): a config beyond them is refused before
# anything is built from it.
LIMITS = {
    "num_layers": 1024,
    "hidden_size": 1 << 17,
    "num_attention_heads": 1 << 12,
    "num_query_groups": 1 << 12,
    "ffn_hidden_size": 1 << 19,
    "seq_length": 1 << 20,
    "vocab_size": 1 << 22,
    "micro_batch_size": 1 << 16,
    "make_vocab_size_divisible_by": 1 << 22,
}
MAX_EXPERTS = 1 << 12
MAX_TOKENS_PER_MICROBATCH = 2**31 - 1
MAX_TENSOR_BYTES = 1 << 48


class ConfigError(ValueError):
    pass


def _check_type(key, value, ty):
    if ty is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if ty is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if (ty in (int, float) and isinstance(value, bool)) or not isinstance(value, ty):
        raise ConfigError(f"config key '{key}': expected {ty.__name__}, got {json.dumps(value)}")
    return value


def normalize_config(raw):
    """Returns a dict with every key of KEY_ORDER, defaults filled in and
    vocab_size padded; raises ConfigError naming the offending key."""
    if isinstance(raw, str):
        raw = json.loads(raw)
    if not isinstance(raw, dict):
        raise ConfigError("config must be a JSON object")
    cfg = {}
    for key, value in raw.items():
        if key.startswith("_"):  # "_comment" and friends
            continue
        canon = ALIASES.get(key, key)
        if canon not in REQUIRED and canon not in OPTIONAL and canon not in MOE:
            raise ConfigError(f"config key '{key}': unknown key")
        if canon in cfg:
            raise ConfigError(f"config key '{key}': given twice (as '{canon}')")
        cfg[canon] = value
    for key in REQUIRED:
        if key not in cfg:
            raise ConfigError(f"config key '{key}': missing")
        cfg[key] = _check_type(key, cfg[key], int)
    for key, (ty, default) in OPTIONAL.items():
        if key in cfg:
            cfg[key] = _check_type(key, cfg[key], ty)
        elif default is not None:
            cfg[key] = default

    variant = cfg["variant"]
    if variant not in ("gpt", "llama"):
        raise ConfigError(f"config key 'variant': must be \"gpt\" or \"llama\", got \"{variant}\"")
    h = cfg["hidden_size"]
    cfg.setdefault("ffn_hidden_size", 4 * h)
    cfg.setdefault("num_query_groups", cfg["num_attention_heads"])
    cfg.setdefault("tie_embeddings", variant == "gpt")
    cfg.setdefault("layernorm_epsilon", 1e-5)
    for key in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
                "ffn_hidden_size",
                "seq_length", "vocab_size", "micro_batch_size", "make_vocab_size_divisible_by"):
        if cfg[key] <= 0:
            raise ConfigError(f"config key '{key}': must be positive, got {cfg[key]}")
        if cfg[key] > LIMITS[key]:
            raise ConfigError(f"config key '{key}': must be at most {LIMITS[key]}, got {cfg[key]}")
    tokens = cfg["micro_batch_size"] * cfg["seq_length"]
    if tokens > MAX_TOKENS_PER_MICROBATCH:
        raise ConfigError(f"config key 'seq_length': micro_batch_size x seq_length = {tokens} "
                          f"tokens per microbatch, more than {MAX_TOKENS_PER_MICROBATCH}")
    if h % cfg["num_attention_heads"]:
        raise ConfigError(f"config key 'num_attention_heads': {cfg['num_attention_heads']} "
                          f"does not divide hidden_size {h}")
    if cfg["num_attention_heads"] % cfg["num_query_groups"]:
        raise ConfigError(f"config key 'num_query_groups': {cfg['num_query_groups']} key/value "
                          f"heads do not divide num_attention_heads {cfg['num_attention_heads']}")
    if variant == "llama" and (h // cfg["num_attention_heads"]) % 2:
        raise ConfigError("config key 'num_attention_heads': rotary embeddings need an even "
                          f"head dim, got {h // cfg['num_attention_heads']}")
    if cfg["dtype"] != "float32":
        raise ConfigError(f"config key 'dtype': only \"float32\" is supported, got \"{cfg['dtype']}\"")
    if cfg["gelu_approximate"] not in ("none", "tanh"):
        raise ConfigError("config key 'gelu_approximate': must be \"none\" or \"tanh\"")
    if cfg["layernorm_epsilon"] <= 0:
        raise ConfigError("config key 'layernorm_epsilon': must be positive")
    if cfg["rotary_base"] <= 0:
        raise ConfigError("config key 'rotary_base': must be positive")
    for key in ("hidden_dropout", "attention_dropout"):
        if not 0.0 <= cfg[key] < 1.0:
            raise ConfigError(f"config key '{key}': must be in [0, 1)")
    div = cfg["make_vocab_size_divisible_by"]
    cfg["vocab_size"] = -(-cfg["vocab_size"] // div) * div
    if cfg["vocab_size"] > LIMITS["vocab_size"]:
        raise ConfigError(f"config key 'vocab_size': padded to a multiple of {div} is "
                          f"{cfg['vocab_size']}, more than {LIMITS['vocab_size']}")
    for key in ("vocab_size", "ffn_hidden_size"):
        nbytes = tokens * cfg[key] * 4
        if nbytes > MAX_TENSOR_BYTES:
            raise ConfigError(f"config key '{key}': the f32 tensor [micro_batch_size, seq_length, "
                              f"{key}] = [{cfg['micro_batch_size']}, {cfg['seq_length']}, "
                              f"{cfg[key]}] would take {nbytes} bytes, more than {MAX_TENSOR_BYTES}")
    out = {key: cfg[key] for key in KEY_ORDER}
    out.update(_normalize_moe(cfg))
    return out


def _normalize_moe(cfg):
    """The MoE keys, defaults filled in (empty for a dense model)."""
    given = [k for k in MOE if k in cfg]
    if "num_moe_experts" not in cfg:
        if given:
            raise ConfigError(f"config key '{given[0]}': needs num_moe_experts")
        return {}
    out = {}
    for key, (ty, default) in MOE.items():
        if key in cfg:
            out[key] = cfg[key] if ty is None else _check_type(key, cfg[key], ty)
        elif default is not None:
            out[key] = default
    experts = out["num_moe_experts"]
    if experts <= 0:
        raise ConfigError(f"config key 'num_moe_experts': must be positive, got {experts}")
    if experts > MAX_EXPERTS:
        raise ConfigError(f"config key 'num_moe_experts': must be at most {MAX_EXPERTS}, "
                          f"got {experts}")
    k = out["moe_router_topk"]
    if not 1 <= k <= experts:
        raise ConfigError(f"config key 'moe_router_topk': {k} is not in [1, num_moe_experts "
                          f"= {experts}]")
    out.setdefault("moe_ffn_hidden_size", cfg["ffn_hidden_size"])
    if out["moe_ffn_hidden_size"] <= 0:
        raise ConfigError("config key 'moe_ffn_hidden_size': must be positive, got "
                          f"{out['moe_ffn_hidden_size']}")
    if out["moe_ffn_hidden_size"] > LIMITS["ffn_hidden_size"]:
        raise ConfigError(f"config key 'moe_ffn_hidden_size': must be at most "
                          f"{LIMITS['ffn_hidden_size']}, got {out['moe_ffn_hidden_size']}")
    for key in ("moe_aux_loss_coeff", "moe_z_loss_coeff"):
        if out[key] < 0:
            raise ConfigError(f"config key '{key}': must be >= 0, got {out[key]}")
    if "moe_capacity_factor" in out and not out["moe_capacity_factor"] > 0:
        raise ConfigError("config key 'moe_capacity_factor': must be positive (absent = "
                          f"dropless), got {out['moe_capacity_factor']}")
    out["moe_layer_freq"] = _layer_freq(out["moe_layer_freq"], cfg["num_layers"])
    return out


def _layer_freq(freq, layers):
    """Megatron's moe_layer_freq: N (layers 0, N, 2N, ... are MoE) or a list
    of 0/1 per layer -> the list."""
    key = "config key 'moe_layer_freq'"
    if isinstance(freq, int) and not isinstance(freq, bool):
        if freq <= 0:
            raise ConfigError(f"{key}: must be positive, got {freq}")
        return [1 if i % freq == 0 else 0 for i in range(layers)]
    if not isinstance(freq, list) or any(f not in (0, 1) or isinstance(f, bool) for f in freq):
        raise ConfigError(f"{key}: expected an int or a list of 0/1, got {json.dumps(freq)}")
    if len(freq) != layers:
        raise ConfigError(f"{key}: {len(freq)} entries for num_layers = {layers}")
    return list(freq)


def load_config(path):
    with open(path) as f:
        try:
            raw = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON: {e}") from None
    return normalize_config(raw)
