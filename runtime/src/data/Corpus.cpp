//===- Corpus.cpp - text and JSONL corpora, format selection --------------===//
//
// Text is read a block at a time and tokenized a chunk at a time (cut where
// the tokenizer's encoding does not change), straight into a token file: no
// copy of the corpus, its documents or its ids is ever held whole. A 1 GB
// .txt used to take 15.9 GB (issue 43).
//
//===----------------------------------------------------------------------===//
#include "data/InputFile.h"
#include "mapp/rt/Dataset.h"
#include "mapp/rt/Error.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

using namespace mapp::rt;

DocumentEncoder::DocumentEncoder(const Tokenizer &tok, Sink sink,
                                 size_t chunkBytes, size_t maxChunkBytes)
    : tok_(tok), sink_(std::move(sink)), chunk_(chunkBytes),
      maxChunk_(std::max(chunkBytes, maxChunkBytes)), limit_(chunkBytes) {
  if (chunk_ == 0)
    fail("DocumentEncoder: chunkBytes must be positive");
}

void DocumentEncoder::feed(std::string_view text, const std::string &where) {
  while (!text.empty()) {
    size_t take = std::min(text.size(), limit_ - pending_.size());
    pending_.append(text.data(), take);
    text.remove_prefix(take);
    if (pending_.size() >= limit_)
      encodeReady(where);
  }
}

void DocumentEncoder::encodeReady(const std::string &where) {
  size_t cut = tok_.cutPoint(pending_);
  if (cut > 0) {
    sink_(tok_.encode(pending_.substr(0, cut)));
    pending_.erase(0, cut);
    consumed_ += cut;
  } else if (pending_.size() >= maxChunk_) {
    fail("data: ", where, ": no place to cut the text for the tokenizer in ",
         maxChunk_, " bytes from byte ", consumed_,
         " of the document (GPT-2 BPE cuts where whitespace follows a "
         "non-space character): refused rather than tokenized in unbounded "
         "memory");
  }
  // Read on: a chunk more, or up to the cap while no cut point has come.
  limit_ = std::min(maxChunk_, pending_.size() + chunk_);
}

void DocumentEncoder::finish() {
  if (!pending_.empty())
    sink_(tok_.encode(pending_));
  sink_({tok_.eot()});
  pending_.clear();
  consumed_ = 0;
  limit_ = chunk_;
}

void mapp::rt::forEachJsonlText(
    const std::string &path,
    const std::function<void(std::string &&, const std::string &)> &fn) {
  InputFile file(path, "data: ");
  int64_t lineNo = 0;
  auto handle = [&](const std::string &line) {
    ++lineNo;
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      return;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception &e) {
      fail("data: ", path, ":", lineNo, ": not valid JSON (", e.what(), ")");
    }
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      fail("data: ", path, ":", lineNo, ": no string field \"text\"");
    fn(std::move(j["text"].get_ref<std::string &>()),
       path + ":" + std::to_string(lineNo));
  };
  std::string line;
  std::vector<char> block(kTextChunkBytes);
  for (uint64_t at = 0;;) {
    size_t n = file.readAt(at, block.data(), block.size());
    if (n == 0)
      break;
    at += n;
    for (size_t pos = 0; pos < n;) {
      const char *nl =
          static_cast<const char *>(std::memchr(block.data() + pos, '\n', n - pos));
      size_t end = nl ? static_cast<size_t>(nl - block.data()) : n;
      if (line.size() + (end - pos) > kMaxJsonlLineBytes)
        fail("data: ", path, ":", lineNo + 1, ": a line longer than ",
             kMaxJsonlLineBytes >> 20,
             " MiB (each line is one document, read whole; give a longer "
             "text as a .txt file, which is read in chunks)");
      line.append(block.data() + pos, end - pos);
      pos = end;
      if (nl) {
        handle(line);
        line.clear();
        ++pos;
      }
    }
  }
  if (!line.empty())
    handle(line);
}

std::vector<std::string> mapp::rt::readJsonlTexts(const std::string &path) {
  std::vector<std::string> docs;
  forEachJsonlText(path, [&](std::string &&text, const std::string &) {
    docs.push_back(std::move(text));
  });
  if (docs.empty())
    fail("data: '", path, "' holds no documents");
  return docs;
}

std::vector<int32_t>
mapp::rt::tokenizeDocuments(const std::vector<std::string> &docs,
                            const Tokenizer &tok) {
  std::vector<int32_t> ids;
  DocumentEncoder enc(tok, [&](const std::vector<int32_t> &t) {
    ids.insert(ids.end(), t.begin(), t.end());
  });
  for (size_t i = 0; i < docs.size(); ++i) {
    std::string where = "document " + std::to_string(i);
    enc.feed(docs[i], where);
    enc.finish();
  }
  return ids;
}

namespace {

bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::shared_ptr<const TokenStream> tokenizeJsonl(const std::string &path,
                                                 const Tokenizer &tok) {
  TokenFileWriter out(tok.vocabSize());
  DocumentEncoder enc(tok, [&](const std::vector<int32_t> &ids) {
    out.append(ids.data(), ids.size());
  });
  int64_t docs = 0;
  forEachJsonlText(path, [&](std::string &&text, const std::string &where) {
    enc.feed(text, where);
    enc.finish();
    ++docs;
  });
  if (docs == 0)
    fail("data: '", path, "' holds no documents");
  return out.finish();
}

/// The whole file is one document.
std::shared_ptr<const TokenStream> tokenizeText(const std::string &path,
                                                const Tokenizer &tok) {
  InputFile file(path, "data: ");
  TokenFileWriter out(tok.vocabSize());
  DocumentEncoder enc(tok, [&](const std::vector<int32_t> &ids) {
    out.append(ids.data(), ids.size());
  });
  std::vector<char> block(kTextChunkBytes);
  for (uint64_t at = 0;;) {
    size_t n = file.readAt(at, block.data(), block.size());
    if (n == 0)
      break;
    at += n;
    enc.feed(std::string_view(block.data(), n), path);
  }
  enc.finish();
  return out.finish();
}

} // namespace

std::shared_ptr<const TokenStream>
mapp::rt::openTokens(const std::string &path, const std::string &format,
                     const Tokenizer *tok) {
  std::string fmt = format;
  if (fmt.empty() || fmt == "auto") {
    // A bare Megatron PREFIX names no file itself; PREFIX.idx does.
    if (endsWith(path, ".bin") || endsWith(path, ".idx") ||
        (!pathExists(path) && pathExists(path + ".idx")))
      fmt = "megatron";
    else if (endsWith(path, ".txt"))
      fmt = "text";
    else
      fmt = "jsonl";
  }
  if (fmt == "megatron") {
    std::string prefix = path;
    if (endsWith(prefix, ".bin") || endsWith(prefix, ".idx"))
      prefix.resize(prefix.size() - 4);
    return openMegatronTokens(prefix);
  }
  if (fmt != "jsonl" && fmt != "text")
    fail("data: unknown format '", fmt, "' (choices: jsonl, text, megatron)");
  if (!tok)
    fail("data: format '", fmt, "' needs a --tokenizer");
  return fmt == "jsonl" ? tokenizeJsonl(path, *tok) : tokenizeText(path, *tok);
}

std::vector<int32_t> mapp::rt::loadTokens(const std::string &path,
                                          const std::string &format,
                                          const Tokenizer *tok) {
  std::shared_ptr<const TokenStream> s = openTokens(path, format, tok);
  std::vector<int32_t> ids(static_cast<size_t>(s->size()));
  s->read(0, s->size(), ids.data());
  return ids;
}
