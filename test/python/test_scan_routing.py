"""MegaScan on a real expert-parallel run whose router sends every token to
one ep rank (docs/mapp-scan.md, "Routing imbalance").

An MoE GPT (2 layers, 4 experts, top-2) trains on 2 rank threads with ep=2
inside dp=2: rank 0 holds experts 0-1, rank 1 experts 2-3. The weights are
edited so that every token picks experts 0 and 1 (ln2 scaled to zero with a
bias of ones, so the router sees one input for every token, and router rows
ordered 0 > 1 > 2 > 3): rank 0's experts get all the rows of both ranks,
rank 1's none, and rank 1 waits for rank 0 at every combine.

Known answers: metrics.jsonl's expert_tokens say the routing is what the
weights force ([N, N, 0, 0] per layer); mapp-scan names exactly one
finding, routing-imbalance on rank 0 (ep member 0 of the group [0, 1]), and
no slow rank; the live monitor (--monitor) raises no alert. The same run
with the unedited weights (balanced routing) gives no finding. Compute is
compared by thread CPU time, so a busy neighbour does not fake a slow rank;
still run serially (test/CMakeLists.txt) like the other real-run scans."""
import json
import struct
from array import array

import pytest

from conftest import require_tool
from train_harness import CORPUS, run

CONFIG = {"variant": "gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
          "seq_length": 32, "vocab_size": 256, "micro_batch_size": 4,
          "num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 256,
          "moe_aux_loss_coeff": 0.01, "moe_z_loss_coeff": 0.001}
STEPS = 12


def _route_everything_to_experts_0_and_1(src, dst):
    """Rewrites an F32 safetensors file (no torch: struct and array)."""
    raw = src.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = bytearray(raw[8 + n:])

    def put(name, values):
        b, e = header[name]["data_offsets"]
        blob = array("f", values).tobytes()
        assert len(blob) == e - b, name
        data[b:e] = blob

    edited = 0
    for name, h in header.items():
        if name.endswith(".ln2.weight"):
            put(name, [0.0] * h["shape"][0])
        elif name.endswith(".ln2.bias"):
            put(name, [1.0] * h["shape"][0])
        elif name.endswith(".mlp.router.weight"):
            experts, hidden = h["shape"]
            put(name, [0.1 - 0.2 * e / (experts - 1)
                       for e in range(experts) for _ in range(hidden)])
            edited += 1
    assert edited == CONFIG["num_layers"]
    dst.write_bytes(raw[:8 + n] + bytes(data))


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("routing")
    (tmp / "cfg.json").write_text(json.dumps(CONFIG))
    run([require_tool("mapp-translate"), "--import-gpt-config", tmp / "cfg.json",
         "-o", tmp / "m.mlir"])
    run([require_tool("mapp-opt"), tmp / "m.mlir",
         "--mapp-train-pipeline=tp=1 pp=1 dp=2 ep=2 microbatches=2 "
         "optimizer=adamw lr=1e-3", "--mapp-insert-trace=granularity=op",
         "-o", tmp / "ep2.mlir"])
    run([require_tool("mapp-translate"), "--mapp-to-plan", tmp / "ep2.mlir",
         "-o", tmp / "ep2.mplan"])
    # The initial weights (full tensors, by name) to edit.
    run([require_tool("mapp-run"), tmp / "ep2.mplan", "--data", CORPUS, "--tokenizer", "bytes",
         "--steps", 1, "--quiet", "--threads", 1, "--comm=local",
         "--save", tmp / "w0.safetensors"])
    _route_everything_to_experts_0_and_1(tmp / "w0.safetensors",
                                         tmp / "skewed.safetensors")
    return tmp


def _train_and_scan(tmp, weights, name, steps):
    out = tmp / name
    out.mkdir()
    run([require_tool("mapp-run"), tmp / "ep2.mplan", "--data", CORPUS, "--tokenizer", "bytes",
         "--steps", steps, "--quiet", "--threads", 1, "--comm=local",
         "--weights", tmp / weights, "--trace-dir", out / "trace",
         "--monitor", out / "alerts.jsonl", "--metrics", out / "metrics.jsonl"])
    run([require_tool("mapp-scan"), out / "trace", "--report", out / "report.json", "-q"])
    report = json.loads((out / "report.json").read_text())
    metrics = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    alerts = [json.loads(l) for l in (out / "alerts.jsonl").read_text().splitlines()
              if l.strip()]
    return report, metrics, alerts


def misattributed(alerts, steps):
    """Whether the live monitor held a slow-rank alert on some rank for half
    the run. An imbalance lasts every step, so a monitor that took it for a
    slow device would hold the alert from its window's first verdict to the
    end; a busy host may still slow one rank's thread for a few steps (CI,
    2 shared cores: an alert at step 7 since step 5, recovered at 9), which
    the monitor rightly reports and recovers from."""
    alerted, since = {}, {}  # rank -> steps under alert; open alerts' first step
    for a in alerts:
        assert a["kind"] in ("slow-rank", "recovered"), a
        if a["kind"] == "slow-rank":
            since[a["rank"]] = a["since"]
        elif a["rank"] in since:
            alerted[a["rank"]] = alerted.get(a["rank"], 0) + a["step"] - since.pop(a["rank"])
    for rank, first in since.items():
        alerted[rank] = alerted.get(rank, 0) + steps - first
    return any(n >= steps // 2 for n in alerted.values())


def test_routing_straggler_named_not_slow_rank(plan):
    report, metrics, alerts = _train_and_scan(plan, "skewed.safetensors", "skewed", STEPS)
    rows = 2 * CONFIG["micro_batch_size"] * CONFIG["seq_length"] * 2  # 2 mb x top-2
    for m in metrics:  # the weights route every token to experts 0 and 1
        assert all(v == [rows, rows, 0, 0] for v in m["expert_tokens"].values()), m
    assert report["consistent"], report.get("inconsistencies")
    found = [(f["kind"], f.get("rank")) for f in report["findings"]]
    assert found == [("routing-imbalance", 0)], report["findings"]
    f = report["findings"][0]
    assert f["ep_group"] == [0, 1] and f["ep_member"] == 0, f
    assert f["ratio"] == pytest.approx(2.0), f  # all tokens: twice the mean
    assert f["recv_bytes_per_member"][1] == 0, f
    assert f["victims"] == [1], f
    assert "not a slow device" in f["magnitude"], f
    assert not misattributed(alerts, STEPS), alerts  # the live monitor: no slow rank either


def test_balanced_routing_no_finding(plan):
    report, metrics, alerts = _train_and_scan(plan, "w0.safetensors", "balanced", 6)
    tokens = metrics[0]["expert_tokens"]["layers.0.mlp.moe_assign"]
    assert min(tokens) > 0, tokens  # every expert got rows
    assert report["findings"] == [], report["findings"]
    assert not misattributed(alerts, 6), alerts
