"""Meta LLaMA's own model.py style (llama 2/3 reference code, without the
inference KV cache and fairscale's parallel layers): complex-form rotary
(`precompute_freqs_cis` with torch.polar, `apply_rotary_emb` through
view_as_complex / view_as_real on [B, T, heads, D] before the head
transpose), RMSNorm with float()/type_as, SwiGLU with the 2/3·4H width
rounded up to `multiple_of`, grouped-query attention through `repeat_kv`,
the triu(-inf) mask hstacked after start_pos zero columns, untied output.

`freqs_cis` (config key) picks where the table lives: "attribute" (Meta's
code: a plain tensor attribute), "buffer" (register_buffer) or "forward"
(computed in forward from the head dim and T)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def precompute_freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device, dtype=torch.float32)
    freqs = torch.outer(t, freqs)
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)  # complex64
    return freqs_cis


def reshape_for_broadcast(freqs_cis, x):
    ndim = x.ndim
    assert 0 <= 1 < ndim
    assert freqs_cis.shape == (x.shape[1], x.shape[-1])
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x, n_rep):
    """torch.repeat_interleave(x, dim=2, repeats=n_rep)"""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        x[:, :, :, None, :]
        .expand(bs, slen, n_kv_heads, n_rep, head_dim)
        .reshape(bs, slen, n_kv_heads * n_rep, head_dim)
    )


class Attention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.n_kv_heads = args["n_heads"] if args.get("n_kv_heads") is None else args["n_kv_heads"]
        self.n_local_heads = args["n_heads"]
        self.n_local_kv_heads = self.n_kv_heads
        self.n_rep = self.n_local_heads // self.n_local_kv_heads
        self.head_dim = args["dim"] // args["n_heads"]
        self.wq = nn.Linear(args["dim"], args["n_heads"] * self.head_dim, bias=False)
        self.wk = nn.Linear(args["dim"], self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args["dim"], self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args["n_heads"] * self.head_dim, args["dim"], bias=False)

    def forward(self, x, start_pos, freqs_cis, mask):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)

        xq = xq.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)

        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)

        # repeat k/v heads if n_kv_heads < n_heads
        keys = repeat_kv(xk, self.n_rep)  # (bs, seqlen, n_local_heads, head_dim)
        values = repeat_kv(xv, self.n_rep)

        xq = xq.transpose(1, 2)  # (bs, n_local_heads, seqlen, head_dim)
        keys = keys.transpose(1, 2)
        values = values.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask  # (bs, n_local_heads, seqlen, cache_len + seqlen)
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values)  # (bs, n_local_heads, seqlen, head_dim)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim, multiple_of, ffn_dim_multiplier=None):
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        # custom dim factor multiplier
        if ffn_dim_multiplier is not None:
            hidden_dim = int(ffn_dim_multiplier * hidden_dim)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)

        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id, args):
        super().__init__()
        self.n_heads = args["n_heads"]
        self.dim = args["dim"]
        self.head_dim = args["dim"] // args["n_heads"]
        self.attention = Attention(args)
        self.feed_forward = FeedForward(
            dim=args["dim"],
            hidden_dim=4 * args["dim"],
            multiple_of=args["multiple_of"],
            ffn_dim_multiplier=args.get("ffn_dim_multiplier"),
        )
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args["dim"], eps=args["norm_eps"])
        self.ffn_norm = RMSNorm(args["dim"], eps=args["norm_eps"])

    def forward(self, x, start_pos, freqs_cis, mask):
        h = x + self.attention(self.attention_norm(x), start_pos, freqs_cis, mask)
        out = h + self.feed_forward(self.ffn_norm(h))
        return out


class Transformer(nn.Module):
    def __init__(self, params):
        super().__init__()
        self.params = params
        self.vocab_size = params["vocab_size"]
        self.n_layers = params["n_layers"]

        self.tok_embeddings = nn.Embedding(params["vocab_size"], params["dim"])
        self.layers = torch.nn.ModuleList()
        for layer_id in range(params["n_layers"]):
            self.layers.append(TransformerBlock(layer_id, params))
        self.norm = RMSNorm(params["dim"], eps=params["norm_eps"])
        self.output = nn.Linear(params["dim"], params["vocab_size"], bias=False)

        self.where = params.get("freqs_cis", "attribute")
        self.head_dim = params["dim"] // params["n_heads"]
        self.max_seq_len = params["max_seq_len"]
        self.rope_theta = params.get("rope_theta", 10000.0)
        # Note that self.max_seq_len is multiplied by 2 because the token
        # limit for the Llama 2 generation of models is 4096.
        table = precompute_freqs_cis(self.head_dim, self.max_seq_len * 2, self.rope_theta)
        if self.where == "attribute":
            self.freqs_cis = table
        elif self.where == "buffer":
            self.register_buffer("freqs_cis", table, persistent=False)
        elif self.where != "forward":
            raise ValueError(f"freqs_cis: {self.where}")

    def forward(self, tokens, targets, start_pos=0):
        _bsz, seqlen = tokens.shape
        h = self.tok_embeddings(tokens)
        if self.where == "forward":
            freqs_cis = precompute_freqs_cis(self.head_dim, seqlen, self.rope_theta)
        else:
            if self.where == "attribute":  # Meta's line; a buffer moves with the module
                self.freqs_cis = self.freqs_cis.to(h.device)
            freqs_cis = self.freqs_cis[start_pos: start_pos + seqlen]

        mask = None
        if seqlen > 1:
            mask = torch.full((seqlen, seqlen), float("-inf"), device=tokens.device)
            mask = torch.triu(mask, diagonal=1)
            # When performing key-value caching, we compute the attention scores
            # only for the new sequence. Thus, the matrix of scores is of size
            # (seqlen, cache_len + seqlen), and the only masked entries are (i, j) for
            # j > cache_len + i, since row i corresponds to token cache_len + i.
            mask = torch.hstack([torch.zeros((seqlen, start_pos), device=tokens.device),
                                 mask]).type_as(h)

        for layer in self.layers:
            h = layer(h, start_pos, freqs_cis, mask)
        h = self.norm(h)
        logits = self.output(h).float()
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return loss
