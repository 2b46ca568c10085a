"""A plain PyTorch interpreter of mapp forward graphs, written from
docs/semantics.md (not from the reference model), so that

    interp(export(GPT(cfg)), weights, tokens, targets) == GPT(cfg)(tokens, targets)

checks the exporter, the importer (same graph) and the op semantics against
the oracle at once.  It reads the generic op form (what export.py writes and
what `mapp-opt -mlir-print-op-generic` prints) of a single-block @forward.

    PYTHONPATH=python /usr/bin/python3 -m mapp.interp model.mlir weights.safetensors
"""

import math
import re
import sys

import torch
import torch.nn.functional as F

_OP = re.compile(r'^\s*(%[\w.]+)(?::\d+)? = "([\w.]+)"\((.*?)\)\s*(?:<\{(.*?)\}>)?\s*(?:\{(.*)\})?\s*:\s*\(.*?\)\s*->\s*(\S+|\(.*\))\s*$')
_RET = re.compile(r'(?:func\.return|"func\.return")\(?\s*(%[\w.]+)')
_ARGS = re.compile(r"(%[\w.]+): tensor<")
_TYPE = re.compile(r"tensor<((?:\d+x)*)(\w+)>")


def _split_top(text):
    """Splits on commas outside <>, [], (), "" ."""
    parts, depth, cur, quote = [], 0, [], False
    for ch in text:
        if ch == '"':
            quote = not quote
        elif not quote and ch in "<[(":
            depth += 1
        elif not quote and ch in ">])":
            depth -= 1
        if ch == "," and depth == 0 and not quote:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def _value(text):
    text = text.strip()
    if text.startswith('"'):
        return bytes(text[1:-1], "utf-8").decode("unicode_escape")
    if text.startswith("@"):
        return _value(text[1:]) if text[1:].startswith('"') else text[1:]
    if text.startswith("array<i64"):
        body = text[len("array<i64"):-1].lstrip(":").strip()
        return [int(x) for x in body.split(",")] if body else []
    if text in ("true", "false"):
        return text == "true"
    num, _, ty = text.partition(" : ")
    if ty.startswith("f"):
        if num.startswith("0x"):
            import struct
            return struct.unpack("<d", struct.pack("<Q", int(num, 16)))[0]
        return float(num)
    if ty.startswith("i"):
        return int(num)
    return text


def parse_attrs(text):
    out = {}
    for entry in _split_top(text or ""):
        key, eq, val = entry.partition(" = ")
        out[key.strip()] = _value(val) if eq else True
    return out


def parse(text):
    """-> (arg names, [(result, op, operands, attrs)], returned name)."""
    args, ops, ret = [], [], None
    for line in text.splitlines():
        if not args and ("@forward" in line or "^bb0(" in line):
            args = _ARGS.findall(line)
            continue
        m = _OP.match(line)
        if m:
            res, name, operands, props, attrs, _ = m.groups()
            a = parse_attrs(props)
            a.update(parse_attrs(attrs))
            operands = [o.strip() for o in operands.split(",") if o.strip()]
            ops.append((res, name, operands, a, _TYPE.match(m.group(6))))
            continue
        r = _RET.search(line)
        if r:
            ret = r.group(1)
    return args, ops, ret


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def dropout_keep(seed, step, n, p):
    """docs/semantics.md's counter RNG (slow: for tests on small tensors)."""
    keep = torch.empty(n, dtype=torch.bool)
    for i in range(n):
        u = (_splitmix64(seed ^ _splitmix64(step ^ _splitmix64(i))) >> 40) / float(1 << 24)
        keep[i] = u >= p
    return keep


def _rotary(x, heads, base):  # x: [B,T,H]
    b, t, h = x.shape
    d = h // heads
    xh = x.reshape(b, t, heads, d)
    i = torch.arange(d // 2, dtype=torch.float64)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * base ** (-2 * i / d)[None, :]
    cos, sin = ang.cos().float()[None, :, None, :], ang.sin().float()[None, :, None, :]
    lo, hi = xh[..., : d // 2], xh[..., d // 2:]
    return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin], dim=-1).reshape(b, t, h)


def _attention(q, k, v, a):
    heads = a["heads"]
    # The model families' options (docs/models.md) are not interpreted here.
    for key in ("rotary_dim", "softcap", "sliding_window", "dropout"):
        if key in a:
            raise NotImplementedError(f"interp: attention with '{key}'")
    b, t, h = q.shape
    d = h // heads
    groups = k.shape[-1] // d  # grouped-query attention: query head i uses k/v head i // (heads/groups)
    if a.get("rotary"):
        base = a.get("rotary_base", 10000.0)
        q, k = _rotary(q, heads, base), _rotary(k, groups, base)
    split = lambda x, n: x.reshape(b, t, n, d).transpose(1, 2).repeat_interleave(heads // n, dim=1)
    split_q = lambda x: split(x, heads)
    s = a["scale"] * split_q(q) @ split(k, groups).transpose(-2, -1)
    if a.get("causal"):
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, -1) @ split(v, groups)).transpose(1, 2).reshape(b, t, h)


def _cross_entropy(logits, targets, a):
    ignore = a.get("ignore_index", -100)
    lg = logits.reshape(-1, logits.shape[-1])
    tg = targets.reshape(-1).long()
    keep = tg != ignore
    lp = torch.log_softmax(lg, -1)[keep]
    return -lp.gather(1, tg[keep][:, None]).mean()


# Mixture of experts, from docs/moe.md's definitions.

def _moe_router(logits, topk):
    """top-k of softmax(logits) (ties: lower id), renormalized."""
    s = torch.softmax(logits, -1)
    probs, experts = [], []
    for row in s:
        # sorted() is stable: equal probabilities keep the lower id first.
        ids = sorted(range(s.shape[1]), key=lambda e: -float(row[e]))[:topk]
        top = row[ids]
        probs.append(top / top.sum())
        experts.append(ids)
    return torch.stack(probs), torch.tensor(experts, dtype=torch.int32)


def _moe_assign(probs, experts, num_experts, capacity=None):
    n, k = experts.shape
    keep = [[True] * k for _ in range(n)]
    if capacity is not None:
        for e in range(num_experts):
            mine = [(i, j) for i in range(n) for j in range(k) if experts[i, j] == e]
            mine.sort(key=lambda c: (-float(probs[c]), c[0]))  # by prob, then token
            for i, j in mine[capacity:]:
                keep[i][j] = False
    slots = torch.full((n, k), -1, dtype=torch.int32)
    counts = torch.zeros(num_experts, dtype=torch.int32)
    row = 0
    for e in range(num_experts):  # grouped by expert, token order within
        for i in range(n):
            for j in range(k):
                if experts[i, j] == e and keep[i][j]:
                    slots[i, j] = row
                    row += 1
                    counts[e] += 1
    return slots, counts


def _moe(op, x, a):
    if op == "moe_router":
        return _moe_router(x[0], a["topk"])
    if op == "moe_assign":
        return _moe_assign(x[0], x[1], a["num_experts"], a.get("capacity"))
    if op == "moe_permute":
        xs, slots = x
        y = torch.zeros(slots.numel(), xs.shape[1])
        for i in range(slots.shape[0]):
            for j in range(slots.shape[1]):
                if slots[i, j] >= 0:
                    y[slots[i, j]] = xs[i]
        return y
    if op == "moe_grouped_matmul":
        xs, w, counts = x
        w = w.transpose(1, 2) if a.get("transpose_b") else w
        y = torch.zeros(xs.shape[0], w.shape[2])
        start = 0
        for e, c in enumerate(counts.tolist()):
            y[start:start + c] = xs[start:start + c] @ w[e]
            start += c
        return y
    if op == "moe_unpermute":
        yp, probs, slots = x
        out = torch.zeros(slots.shape[0], yp.shape[1])
        for i in range(slots.shape[0]):
            for j in range(slots.shape[1]):
                if slots[i, j] >= 0:
                    out[i] += probs[i, j] * yp[slots[i, j]]
        return out
    if op == "moe_aux_loss":
        logits, experts = x
        n, e = logits.shape
        f = torch.bincount(experts.reshape(-1).long(), minlength=e).float() / experts.numel()
        return a["coeff"] * e * (f * torch.softmax(logits, -1).mean(0)).sum()
    if op == "moe_z_loss":
        return a["coeff"] * torch.logsumexp(x[0], -1).pow(2).mean()
    return None


_B = lambda f: (lambda a, b: f(a, b).float())
# The tensor algebra (docs/semantics.md, "Tensor algebra"); booleans as 0/1.
_ALGEBRA = {
    "neg": torch.neg, "abs": torch.abs, "sign": torch.sign, "exp": torch.exp,
    "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "tanh": torch.tanh,
    "sin": torch.sin, "cos": torch.cos, "sigmoid": torch.sigmoid,
    "pow": lambda x, e: torch.pow(x, e),
    "sub": torch.sub, "div": torch.div, "maximum": torch.maximum, "minimum": torch.minimum,
    "lt": _B(torch.lt), "le": _B(torch.le), "gt": _B(torch.gt), "ge": _B(torch.ge),
    "eq": _B(torch.eq), "ne": _B(torch.ne),
    "select": lambda c, a, b: torch.where(c != 0, a, b),
}


def _dense(text, shape):
    """mapp.constant's value: dense<"0xHEX"> (little-endian f32, what the
    exporter writes), or as mlir-opt prints it, dense<[[1.0, 0xFF800000],
    ...]> (an f32 bit pattern in hex for non-finite elements) or a splat
    dense<number>."""
    import struct
    body = text[len("dense<"):text.rindex(">", 0, text.index(" : ") if " : " in text else None)]
    if body.startswith('"0x'):
        raw = bytes.fromhex(body[3:-1])
        return torch.tensor(struct.unpack(f"<{len(raw) // 4}f", raw)).reshape(shape)
    def number(tok):
        if tok.startswith("0x"):
            return struct.unpack("<f", struct.pack("<I", int(tok, 16)))[0]
        return float(tok)
    toks = [t for t in body.replace("[", " ").replace("]", " ").replace(",", " ").split()]
    if len(toks) == 1:
        return torch.full(shape, number(toks[0]))
    return torch.tensor([number(t) for t in toks]).reshape(shape)


def run(text, weights, inputs, step=0):
    args, ops, ret = parse(text)
    env = dict(zip(args, inputs))
    for res, name, operands, a, ty in ops:
        x = [env[o] for o in operands]
        op = name[len("mapp."):]
        if op.startswith("moe_"):
            y = _moe(op, x, a)
            if y is None:
                raise NotImplementedError(f"interp: {name}")
            if isinstance(y, tuple):  # %N:2 -> %N#0, %N#1
                for i, v in enumerate(y):
                    env[f"{res}#{i}"] = v
                continue
        elif op == "param_ref":
            y = weights[a["param"]]
        elif op == "embedding":
            y = F.embedding(x[1].long(), x[0])
        elif op == "linear":
            y = F.linear(x[0], x[1], x[2] if len(x) > 2 else None)
        elif op == "matmul":
            aa = x[0].transpose(-2, -1) if a.get("transpose_a") else x[0]
            bb = x[1].transpose(-2, -1) if a.get("transpose_b") else x[1]
            y = aa @ bb
        elif op in ("add", "mul"):
            y = x[0] + x[1] if op == "add" else x[0] * x[1]
        elif op == "scale":
            y = a["factor"] * x[0]
        elif op == "gelu":
            y = F.gelu(x[0], approximate=a.get("approximate", "none"))
        elif op == "silu":
            y = F.silu(x[0])
        elif op == "layer_norm":
            y = F.layer_norm(x[0], x[0].shape[-1:], x[1], x[2], a.get("eps", 1e-5))
        elif op == "rms_norm":
            y = x[0] * torch.rsqrt(x[0].pow(2).mean(-1, keepdim=True) + a.get("eps", 1e-5)) * (
                x[1] + a.get("weight_offset", 0.0))
        elif op == "softcap":
            y = a["cap"] * torch.tanh(x[0] / a["cap"])
        elif op == "softmax":
            y = torch.softmax(x[0], -1)
        elif op == "attention":
            y = _attention(*x, a)
        elif op == "dropout":
            keep = dropout_keep(a["seed"], step, x[0].numel(), a["p"]).reshape(x[0].shape)
            y = torch.where(keep, x[0] / (1 - a["p"]), torch.zeros_like(x[0]))
        elif op == "cross_entropy":
            y = _cross_entropy(x[0], x[1], a)
        elif op == "reshape":
            y = x[0].reshape([int(d) for d in ty.group(1).split("x") if d])
        elif op == "transpose":
            y = x[0].permute(a["perm"])
        elif op == "slice":
            y = x[0].narrow(a["dim"], a["start"], a["end"] - a["start"])
        elif op == "concat":
            y = torch.cat(x, a["dim"])
        elif op == "reduce_sum":
            y = x[0].sum(a["dims"])
        elif op == "reduce_max":
            y = x[0].amax(a["dims"])
        elif op == "fill":
            y = torch.full([int(d) for d in ty.group(1).split("x") if d], a["value"])
        elif op in _ALGEBRA:
            y = _ALGEBRA[op](*x, **({"e": a["exponent"]} if op == "pow" else {}))
        elif op == "broadcast":
            y = x[0].expand([int(d) for d in ty.group(1).split("x") if d]).clone()
        elif op == "constant":
            y = _dense(a["value"], [int(d) for d in ty.group(1).split("x") if d])
        elif op == "cast":
            y = x[0].float()
        else:
            raise NotImplementedError(f"interp: {name}")
        env[res] = y
    return env[ret]


def main(argv):
    from . import safetensors
    text = open(argv[0]).read()
    weights, _ = safetensors.load(argv[1])
    m = re.search(r"tensor<(\d+)x(\d+)xi32>", text)
    gen = torch.Generator().manual_seed(0)
    shape = (int(m.group(1)), int(m.group(2)))
    vocab = next(iter(weights.values())).shape[0]
    tokens = torch.randint(0, vocab, shape, generator=gen, dtype=torch.int32)
    targets = torch.randint(0, vocab, shape, generator=gen, dtype=torch.int32)
    print(float(run(text, weights, [tokens, targets])))


if __name__ == "__main__":
    main(sys.argv[1:])
