"""Issue 43, defect 4: reading a corpus takes bounded memory.

A text corpus used to take ~15x its size (a 1 GB .txt peaked at 15.9 GB RSS):
the file was read whole, copied as one document, encoded whole and its ids
copied again for every holder. Now text and JSONL are tokenized a chunk at a
time into a temporary token file and training reads each sample from it, so
the peak RSS of a run grows over that of a run on a tiny corpus by at most
kCorpusMemoryBytes (256 MiB, runtime/include/mapp/rt/Dataset.h) plus the
shuffle index (8 bytes a sample). Peak RSS is the kernel's (wait4), not a
timing. docs/reliability.md, "Memory of a corpus".
"""

import json
import os
import subprocess

import pytest

from conftest import ROOT, require_tool

CORPUS_MEMORY = 256 << 20  # kCorpusMemoryBytes
SHUFFLE_BYTES_PER_SAMPLE = 8
SEQ_LENGTH = 32  # examples/gpt-tiny.json
# Large enough that the old reader is far past the bound (it held ~14x a
# .txt and ~5x a .jsonl with byte tokens: 64 MiB took +900 and +330 MiB),
# small enough to stay cheap (a few seconds).
CORPUS_BYTES = 96 << 20

NEWS = os.path.join(ROOT, "data", "gpt", "news-1k.jsonl")


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    cfg = os.path.join(ROOT, "examples", "gpt-tiny.json")
    mlir = subprocess.run([require_tool("mapp-translate"), "--import-gpt-config", cfg],
                          check=True, capture_output=True).stdout
    train = subprocess.run([require_tool("mapp-opt"), "-mapp-autodiff", "-mapp-optimizer"],
                           input=mlir, check=True, capture_output=True).stdout
    out = str(d / "p.mplan")
    subprocess.run([require_tool("mapp-translate"), "--mapp-to-plan", "-o", out],
                   input=train, check=True)
    return out


def news_texts():
    with open(NEWS, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def write_corpus(path, size, jsonl):
    """About `size` bytes of news-1k's documents, repeated."""
    texts = news_texts()
    with open(path, "w", encoding="utf-8") as f:
        written, i = 0, 0
        while written < size:
            t = texts[i % len(texts)]
            chunk = json.dumps({"text": t}) + "\n" if jsonl else t + "\n\n"
            f.write(chunk)
            written += len(chunk.encode("utf-8"))
            i += 1
    return os.path.getsize(path)


def peak_rss(cmd, tmp):
    """(exit code, peak RSS in bytes, stderr) of one process."""
    err = open(os.path.join(tmp, "stderr.txt"), "w+b")
    env = dict(os.environ, TMPDIR=str(tmp))
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    err.seek(0)
    return p.returncode, usage.ru_maxrss * 1024, err.read().decode(errors="replace")


def train_one_step(plan, data, tmp):
    return peak_rss([require_tool("mapp-run"), plan, "--data", data, "--tokenizer",
                     "bytes", "--steps", "1", "--quiet"], tmp)


@pytest.mark.parametrize("jsonl", [False, True], ids=["txt", "jsonl"])
def test_corpus_memory_is_bounded(plan, tmp_path, jsonl):
    ext = ".jsonl" if jsonl else ".txt"
    small = str(tmp_path / ("small" + ext))
    write_corpus(small, 1 << 20, jsonl)
    rc, base, err = train_one_step(plan, small, tmp_path)
    assert rc == 0, err

    big = str(tmp_path / ("big" + ext))
    size = write_corpus(big, CORPUS_BYTES, jsonl)
    rc, peak, err = train_one_step(plan, big, tmp_path)
    os.unlink(big)
    assert rc == 0, err
    # Byte tokens: at most one token a byte (JSONL's quoting only adds bytes).
    samples = size // SEQ_LENGTH
    bound = base + CORPUS_MEMORY + SHUFFLE_BYTES_PER_SAMPLE * samples
    print(f"{ext}: {size >> 20} MiB, peak {peak >> 20} MiB, 1 MiB corpus {base >> 20} MiB")
    assert peak < bound, (
        f"{size >> 20} MiB {ext}: peak RSS {peak >> 20} MiB, over the bound "
        f"{bound >> 20} MiB (a 1 MiB corpus: {base >> 20} MiB)")
    # Nothing left behind in TMPDIR: the token file is unlinked at creation.
    assert not [n for n in os.listdir(tmp_path) if n.startswith("mapp-tokens")]
