"""PyTorch reference of the MoE routing rules of docs/moe.md, written the way
Megatron-LM writes them (moe_utils.topk_softmax_with_capacity,
switch_load_balancing_loss_func, z_loss_func) from plain torch ops, so that
autograd gives the gradients the mapp kernels are checked against."""
import math

import torch


def router(logits, topk):
    """Megatron's default (use_pre_softmax=False): top-k of the logits, then
    softmax over those k. Returns (probs [N,k], experts [N,k] int64)."""
    scores, experts = torch.topk(logits, topk, dim=-1)
    return torch.softmax(scores, dim=-1), experts


def capacity(tokens, topk, experts, factor):
    return max(math.ceil((tokens * topk / experts) * factor), 1)


def kept_mask(probs, experts, num_experts, cap):
    """[N,k] bool: per expert the `cap` choices with the highest probability
    (Megatron drop_policy="probs"); None = dropless."""
    n, k = probs.shape
    keep = torch.ones(n, k, dtype=torch.bool)
    if cap is None:
        return keep
    gates = torch.zeros(n, num_experts).scatter(1, experts, probs.detach())
    routed = torch.zeros(n, num_experts, dtype=torch.bool).scatter(1, experts, True)
    # stable descending order by prob: ties go to the lower token index
    order = torch.sort(-gates, dim=0, stable=True).indices[:cap]
    cmask = torch.zeros(n, num_experts, dtype=torch.bool).scatter(0, order, True)
    final = routed & cmask
    return torch.gather(final, 1, experts)


def aux_loss(logits, experts, coeff):
    n, e = logits.shape
    k = experts.shape[1]
    scores = torch.softmax(logits, dim=-1)
    tokens_per_expert = torch.zeros(e).scatter_add(0, experts.reshape(-1), torch.ones(n * k))
    return torch.sum(scores.sum(0) * tokens_per_expert) * (e * coeff / (n * n * k))


def z_loss(logits, coeff):
    return torch.mean(torch.square(torch.logsumexp(logits, dim=-1))) * coeff


def experts_ffn(x, probs, experts, keep, fc1, fc2, act):
    """out[n] = Σ_j keep·probs[n,j]·fc2_e(act(fc1_e(x[n]))), e = experts[n,j];
    fc1 [E,H,F], fc2 [E,F,H] (x·w layout)."""
    out = torch.zeros_like(x)
    for e in range(fc1.shape[0]):
        tok, j = torch.nonzero((experts == e) & keep, as_tuple=True)
        if tok.numel() == 0:
            continue
        h = act(x[tok] @ fc1[e]) @ fc2[e]
        out = out.index_add(0, tok, h * probs[tok, j].unsqueeze(-1))
    return out
