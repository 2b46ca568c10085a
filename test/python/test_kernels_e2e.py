"""End-to-end: mapp-run on a hand-built MLP plan against the same model in
PyTorch (same initial weights, the exact batches mapp-run dumped), and the
documented data pipeline (packing, shuffle, Megatron reader) re-implemented
in Python.

Tools: $MAPP_RUN and $MAPP_MAKE_TEST_PLAN (default: build-rt/ or build/).
"""
import json
import math
import pathlib
import struct
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from test_kernels import find_tool, read_st, splitmix64, write_st

MAPP_RUN = find_tool("MAPP_RUN", "mapp-run")
MAKE_PLAN = find_tool("MAPP_MAKE_TEST_PLAN", "mapp-make-test-plan")
CORPUS = pathlib.Path(__file__).resolve().parents[2] / "data" / "gpt" / "news-1k.jsonl"
pytestmark = pytest.mark.skipif(
    MAPP_RUN is None or MAKE_PLAN is None,
    reason="mapp-run / mapp-make-test-plan not built (cmake -S runtime -B build-rt)")


class Mlp(torch.nn.Module):
    """The model of runtime/test/TestPlans.cpp mlpPlan()."""

    def __init__(self, V, H, Fh):
        super().__init__()
        self.wte = torch.nn.Embedding(V, H)
        self.fc = torch.nn.Linear(H, Fh)
        self.head = torch.nn.Linear(Fh, V)

    def forward(self, tok, tgt):
        a = F.gelu(self.fc(self.wte(tok)), approximate="tanh")
        logits = self.head(a)
        return F.cross_entropy(logits.flatten(0, 1), tgt.flatten())


def cosine_lr(lr, k, warmup=2, total=8, min_lr=None):
    min_lr = lr * 0.1 if min_lr is None else min_lr
    if k < warmup:
        return lr * (k + 1) / warmup
    if k >= total:
        return min_lr
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * (k - warmup) / (total - warmup)))


def run(args, **kw):
    r = subprocess.run([MAPP_RUN, *map(str, args)], capture_output=True, text=True, **kw)
    return r


def rel_close(a, b, what, rtol=1e-5):
    b = b.detach().float()
    scale = max(b.abs().max().item(), 1e-6)
    err = (a - b).abs().max().item()
    assert err <= rtol * scale, f"{what}: err {err:.3e} > {rtol} * {scale:.3e}"


@pytest.mark.parametrize("optimizer,microbatches,max_norm,schedule", [
    ("sgd", 1, 0.0, "constant"),
    ("adamw", 2, 0.0, "cosine"),
    ("adamw", 3, 0.05, "constant")])
def test_mlp_matches_pytorch(tmp_path, optimizer, microbatches, max_norm, schedule):
    V, H, Fh, B, T, steps, lr = 256, 16, 24, 3, 12, 6, 0.02
    plan = tmp_path / "mlp.mplan"
    subprocess.run([MAKE_PLAN, plan, f"vocab={V}", f"hidden={H}", f"ffn={Fh}",
                    f"batch={B}", f"seq={T}", f"microbatches={microbatches}",
                    f"optimizer={optimizer}", f"lr={lr}", f"max_grad_norm={max_norm}",
                    f"schedule={schedule}"], check=True)
    torch.manual_seed(7)
    model = Mlp(V, H, Fh)
    write_st(tmp_path / "init.safetensors", model.state_dict())
    r = run([plan, "--data", CORPUS, "--tokenizer", "bytes", "--steps", steps,
             "--seed", 3, "--weights", tmp_path / "init.safetensors",
             "--metrics", tmp_path / "m.jsonl", "--dump-batches", tmp_path / "b.jsonl",
             "--save-grads", tmp_path / "g.safetensors",
             "--save", tmp_path / "out.safetensors", "--threads", 2])
    assert r.returncode == 0, r.stderr
    metrics = [json.loads(l) for l in (tmp_path / "m.jsonl").read_text().splitlines()]
    batches = [json.loads(l) for l in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert len(metrics) == steps and len(batches) == steps * microbatches

    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95),
                                eps=1e-8, weight_decay=0.1)
    for k in range(steps):
        opt.zero_grad()
        losses = []
        for mb in range(microbatches):
            b = batches[k * microbatches + mb]
            assert (b["step"], b["microbatch"]) == (k, mb)
            tok = torch.tensor(b["tokens"]).long()
            tgt = torch.tensor(b["targets"]).long()
            loss = model(tok, tgt)
            (loss / microbatches).backward()
            losses.append(loss.item())
        if k == 0:
            grads = read_st(tmp_path / "g.safetensors")
            for name, p in model.named_parameters():
                rel_close(grads[name], p.grad, f"grad {name}")
        norm = torch.linalg.vector_norm(
            torch.cat([p.grad.flatten() for p in model.parameters()])).item()
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        for g in opt.param_groups:
            g["lr"] = cosine_lr(lr, k) if schedule == "cosine" else lr
        opt.step()
        m = metrics[k]
        assert abs(m["loss"] - np.mean(losses)) <= 1e-5 * abs(np.mean(losses)), (k, m, losses)
        assert abs(m["grad_norm"] - norm) <= 1e-4 * norm, (k, m["grad_norm"], norm)
        assert abs(m["lr"] - opt.param_groups[0]["lr"]) < 1e-12
        assert m["tokens"] == microbatches * B * T
    final = read_st(tmp_path / "out.safetensors")
    for name, p in model.state_dict().items():
        rel_close(final[name], p, f"param {name}", rtol=2e-5)


def _epoch_order(n, seed, epoch, shuffle=True):
    """The shuffle documented in runtime/include/mapp/rt/Dataset.h."""
    order = list(range(n))
    if not shuffle:
        return order
    state = (seed + epoch) & ((1 << 64) - 1)
    for i in range(n - 1, 0, -1):
        r = splitmix64(state)
        state = (state + 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
        j = r % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def _expected_batches(stream, T, B, M, steps, seed, shuffle):
    n = (len(stream) - 1) // T
    out, orders = [], {}
    for k in range(steps):
        for mb in range(M):
            rows = []
            for b in range(B):
                g = k * M * B + mb * B + b
                e = g // n
                if e not in orders:
                    orders[e] = _epoch_order(n, seed, e, shuffle)
                s = orders[e][g % n]
                rows.append(stream[s * T:s * T + T + 1])
            out.append(rows)
    return out


def _check_dump(path, expected):
    got = [json.loads(l) for l in path.read_text().splitlines()]
    assert len(got) == len(expected)
    for g, rows in zip(got, expected):
        assert g["tokens"] == [r[:-1] for r in rows]
        assert g["targets"] == [r[1:] for r in rows]


@pytest.mark.parametrize("shuffle", [True, False])
def test_jsonl_bytes_batches_follow_documented_shuffle(tmp_path, shuffle):
    docs = ["hello world", "second document, a bit longer than the first",
            "x" * 40, "caf\u00e9 \u2603"]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n")
    stream = []
    for d in docs:
        stream += list(d.encode()) + [0]
    plan = tmp_path / "p.mplan"
    subprocess.run([MAKE_PLAN, plan, "vocab=256", "batch=2", "seq=5",
                    "microbatches=2"], check=True)
    args = [plan, "--data", corpus, "--tokenizer", "bytes", "--steps", 9,
            "--seed", 11, "--dump-batches", tmp_path / "b.jsonl", "--quiet"]
    r = run(args + ([] if shuffle else ["--no-shuffle"]))
    assert r.returncode == 0, r.stderr
    # 9 steps x 4 samples > 27 samples: crosses into later epochs.
    _check_dump(tmp_path / "b.jsonl",
                _expected_batches(stream, 5, 2, 2, 9, 11, shuffle))


def _write_megatron(prefix, seqs, dtype=np.uint16, code=8):
    """Megatron-LM MMIDIDX v1 writer (independent of the C++ reader)."""
    sizes = np.array([len(s) for s in seqs], dtype=np.int32)
    itemsize = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1]) * itemsize]).astype(np.int64)
    doc_idx = np.arange(len(seqs) + 1, dtype=np.int64)
    with open(str(prefix) + ".bin", "wb") as f:
        for s in seqs:
            f.write(np.array(s, dtype=dtype).tobytes())
    with open(str(prefix) + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())
        f.write(doc_idx.tobytes())


@pytest.mark.parametrize("dtype,code", [(np.uint16, 8), (np.int32, 4)])
def test_megatron_dataset(tmp_path, dtype, code):
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(0, 200, size=n)) for n in (7, 13, 1, 22)]
    seqs = [[int(t) for t in s] for s in seqs]
    _write_megatron(tmp_path / "corpus_text_document", seqs, dtype, code)
    stream = [t for s in seqs for t in s]
    plan = tmp_path / "p.mplan"
    subprocess.run([MAKE_PLAN, plan, "vocab=256", "batch=2", "seq=4"], check=True)
    r = run([plan, "--data", tmp_path / "corpus_text_document.bin", "--steps", 3,
             "--seed", 5, "--dump-batches", tmp_path / "b.jsonl", "--quiet"])
    assert r.returncode == 0, r.stderr
    _check_dump(tmp_path / "b.jsonl", _expected_batches(stream, 4, 2, 1, 3, 5, True))
    # A bare prefix is recognized too, with or without --data-format.
    for extra in ([], ["--data-format", "megatron"]):
        r = run([plan, "--data", tmp_path / "corpus_text_document", *extra,
                 "--steps", 3, "--seed", 5, "--dump-batches", tmp_path / "c.jsonl",
                 "--quiet"])
        assert r.returncode == 0, r.stderr
        _check_dump(tmp_path / "c.jsonl", _expected_batches(stream, 4, 2, 1, 3, 5, True))


@pytest.mark.parametrize("args,msg", [
    (["--steps", "x"], "--steps needs an integer"),
    (["--bogus"], "unknown flag"),
    (["--data", "/nonexistent.jsonl", "--tokenizer", "bytes"], "cannot open"),
    (["--data", str(CORPUS)], "needs a --tokenizer"),
    (["--data", str(CORPUS), "--tokenizer", "words"], "unknown tokenizer"),
    (["--data", str(CORPUS), "--tokenizer", "bytes", "--backend=tpu"], "unknown backend"),
    (["--weights", "/nonexistent.safetensors"], "cannot open safetensors"),
])
def test_bad_invocations(tmp_path, args, msg):
    plan = tmp_path / "p.mplan"
    subprocess.run([MAKE_PLAN, plan, "vocab=256"], check=True)
    if "--data" not in args:
        args = args + ["--data", str(CORPUS), "--tokenizer", "bytes"]
    r = run([plan, *args])
    assert r.returncode != 0
    assert msg in r.stderr, r.stderr


def test_weights_missing_or_misshaped_tensor(tmp_path):
    plan = tmp_path / "p.mplan"
    subprocess.run([MAKE_PLAN, plan, "vocab=256", "hidden=8", "ffn=12"], check=True)
    sd = Mlp(256, 8, 12).state_dict()
    base = ["--data", CORPUS, "--tokenizer", "bytes", "--quiet"]
    bad = dict(sd)
    del bad["fc.bias"]
    write_st(tmp_path / "w1.safetensors", bad)
    r = run([plan, "--weights", tmp_path / "w1.safetensors", *base])
    assert r.returncode != 0 and "missing tensor 'fc.bias'" in r.stderr, r.stderr
    bad = dict(sd)
    bad["head.weight"] = torch.zeros(3, 3)
    write_st(tmp_path / "w2.safetensors", bad)
    r = run([plan, "--weights", tmp_path / "w2.safetensors", *base])
    assert r.returncode != 0 and "'head.weight' has shape [3,3]" in r.stderr, r.stderr


def test_gpt2_vocab_too_big_for_plan(tmp_path):
    plan = tmp_path / "p.mplan"
    subprocess.run([MAKE_PLAN, plan, "vocab=256"], check=True)
    d = f"{CORPUS.parent}/"
    r = run([plan, "--data", CORPUS, "--tokenizer",
             f"gpt2:{d}gpt2-vocab.json,{d}gpt2-merges.txt"])
    assert r.returncode != 0 and "vocab_size 256" in r.stderr, r.stderr
