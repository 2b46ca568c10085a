"""Writes a small GPT forward graph in the exporter's conventions (test input
for the parallelism passes):
    gen_gpt.py LAYERS [--swiglu] [--hidden=16] [--heads=4] [--ffn=64]
               [--vocab=64] [--seq=8] [--batch=2] > model.mlir
(the sizes default to the tiny model the lit tests use; larger ones serve
benchmarks, e.g. bench/elastic/repartition_wall.py)"""
import sys

L = int(sys.argv[1])
SWIGLU = "--swiglu" in sys.argv
SIZES = {"hidden": 16, "heads": 4, "ffn": 64, "vocab": 64, "seq": 8, "batch": 2}
for arg in sys.argv[2:]:
    key, _, value = arg[2:].partition("=")
    if arg != "--swiglu" and (key not in SIZES or not value.isdigit() or int(value) < 1):
        sys.exit(f"gen_gpt.py: bad argument '{arg}' (want --swiglu or --SIZE=N, "
                 f"SIZE one of {', '.join(SIZES)}, N >= 1)")
    if arg != "--swiglu":
        SIZES[key] = int(value)
H, NH, F, V, T, B = (SIZES[k] for k in ("hidden", "heads", "ffn", "vocab", "seq", "batch"))
if H % NH:
    sys.exit(f"gen_gpt.py: hidden {H} is not a multiple of heads {NH}")


def t(*s, e="f32"):
    return "tensor<" + "x".join(map(str, s)) + ("x" if s else "") + e + ">"


out = []
out.append('module attributes {mapp.model = {kind = "gpt", num_layers = %d : i64, '
           'hidden_size = %d : i64, num_attention_heads = %d : i64, ffn_hidden_size = %d : i64, '
           'vocab_size = %d : i64, seq_length = %d : i64}} {' % (L, H, NH, F, V, T))
params = [("wte.weight", (V, H)), ("wpe.weight", (T, H))]
for l in range(L):
    p = f"layers.{l}."
    params += [(p + "ln1.weight", (H,)), (p + "ln1.bias", (H,)),
               (p + "attn.qkv.weight", (3 * H, H)), (p + "attn.qkv.bias", (3 * H,)),
               (p + "attn.proj.weight", (H, H)), (p + "attn.proj.bias", (H,)),
               (p + "ln2.weight", (H,)), (p + "ln2.bias", (H,))]
    if SWIGLU:
        params += [(p + "mlp.gate.weight", (F, H)), (p + "mlp.up.weight", (F, H)),
                   (p + "mlp.down.weight", (H, F))]
    else:
        params += [(p + "mlp.fc1.weight", (F, H)), (p + "mlp.fc1.bias", (F,)),
                   (p + "mlp.fc2.weight", (H, F)), (p + "mlp.fc2.bias", (H,))]
params += [("ln_f.weight", (H,)), ("ln_f.bias", (H,))]
for n, s in params:
    init = ' {init = "zeros"}' if n.endswith("bias") else (' {init = "ones"}' if len(s) == 1 else "")
    out.append(f'  mapp.param @"{n}" : {t(*s)}{init}')
out.append(f'  func.func @forward(%tokens: {t(B, T, e="i32")}, %targets: {t(B, T, e="i32")}) -> tensor<f32> {{')
c = [0]
P = dict(params)


def v():
    c[0] += 1
    return f"%v{c[0]}"


def ref(n):
    r = v()
    out.append(f'    {r} = mapp.param_ref @"{n}" : {t(*P[n])}')
    return r


def emit(op, args, ins, res, attrs="", name=None):
    r = v()
    a = attrs
    if name:
        a = (a[:-1] + f', mapp.name = "{name}"}}') if a else f'{{mapp.name = "{name}"}}'
    a = (" " + a) if a else ""
    out.append(f'    {r} = mapp.{op} {", ".join(args)}{a} : ({", ".join(ins)}) -> {res}')
    return r


X = t(B, T, H)
wte = ref("wte.weight")
x = emit("embedding", [wte, "%tokens"], [t(V, H), t(B, T, e="i32")], X)
wpe = ref("wpe.weight")
x = emit("add", [x, wpe], [X, t(T, H)], X)
for l in range(L):
    p = f"layers.{l}."
    g, bb = ref(p + "ln1.weight"), ref(p + "ln1.bias")
    h = emit("layer_norm", [x, g, bb], [X, t(H), t(H)], X)
    w, bq = ref(p + "attn.qkv.weight"), ref(p + "attn.qkv.bias")
    qkv = emit("linear", [h, w, bq], [X, t(3 * H, H), t(3 * H)], t(B, T, 3 * H), name=p + "attn.qkv")
    q, k, vv = (emit("slice", [qkv], [t(B, T, 3 * H)], X,
                     "{dim = 2 : i64, start = %d : i64, end = %d : i64}" % (i * H, (i + 1) * H))
                for i in range(3))
    a = emit("attention", [q, k, vv], [X, X, X], X, "{causal, heads = %d : i64, scale = %e : f64}" % (NH, (H // NH) ** -0.5))
    w, bp = ref(p + "attn.proj.weight"), ref(p + "attn.proj.bias")
    o = emit("linear", [a, w, bp], [X, t(H, H), t(H)], X, name=p + "attn.out")
    x = emit("add", [x, o], [X, X], X)
    g, bb = ref(p + "ln2.weight"), ref(p + "ln2.bias")
    h = emit("layer_norm", [x, g, bb], [X, t(H), t(H)], X)
    if SWIGLU:
        wg, wu, wd = ref(p + "mlp.gate.weight"), ref(p + "mlp.up.weight"), ref(p + "mlp.down.weight")
        gt = emit("linear", [h, wg], [X, t(F, H)], t(B, T, F))
        r = v(); out.append(f"    {r} = mapp.silu {gt} : {t(B, T, F)}")
        up = emit("linear", [h, wu], [X, t(F, H)], t(B, T, F))
        f = emit("mul", [r, up], [t(B, T, F), t(B, T, F)], t(B, T, F))
        m = emit("linear", [f, wd], [t(B, T, F), t(H, F)], X, name=p + "mlp.out")
    else:
        w, b1 = ref(p + "mlp.fc1.weight"), ref(p + "mlp.fc1.bias")
        f = emit("linear", [h, w, b1], [X, t(F, H), t(F)], t(B, T, F))
        r = v(); out.append(f'    {r} = mapp.gelu {f} {{approximate = "tanh"}} : {t(B, T, F)}'); f = r
        w, b2 = ref(p + "mlp.fc2.weight"), ref(p + "mlp.fc2.bias")
        m = emit("linear", [f, w, b2], [t(B, T, F), t(H, F), t(H)], X, name=p + "mlp.out")
    x = emit("add", [x, m], [X, X], X)
g, bb = ref("ln_f.weight"), ref("ln_f.bias")
h = emit("layer_norm", [x, g, bb], [X, t(H), t(H)], X)
lg = emit("linear", [h, wte], [X, t(V, H)], t(B, T, V), name="logits")
loss = emit("cross_entropy", [lg, "%targets"], [t(B, T, V), t(B, T, e="i32")], "tensor<f32>")
out.append(f"    return {loss} : tensor<f32>")
out.append("  }")
out.append("}")
print("\n".join(out))
