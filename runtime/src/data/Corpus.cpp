//===- Corpus.cpp - JSONL documents and format selection ------------------===//
#include "mapp/rt/Dataset.h"
#include "mapp/rt/Error.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

using namespace mapp::rt;

std::vector<std::string> mapp::rt::readJsonlTexts(const std::string &path) {
  std::ifstream f(path);
  if (!f)
    fail("data: cannot open '", path, "'");
  std::vector<std::string> docs;
  std::string line;
  int64_t lineNo = 0;
  while (std::getline(f, line)) {
    ++lineNo;
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception &e) {
      fail("data: ", path, ":", lineNo, ": not valid JSON (", e.what(), ")");
    }
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      fail("data: ", path, ":", lineNo, ": no string field \"text\"");
    docs.push_back(j["text"].get<std::string>());
  }
  if (docs.empty())
    fail("data: '", path, "' holds no documents");
  return docs;
}

std::vector<int32_t>
mapp::rt::tokenizeDocuments(const std::vector<std::string> &docs,
                            const Tokenizer &tok) {
  std::vector<int32_t> ids;
  for (const std::string &d : docs) {
    std::vector<int32_t> t = tok.encode(d);
    ids.insert(ids.end(), t.begin(), t.end());
    ids.push_back(tok.eot());
  }
  return ids;
}

static bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<int32_t> mapp::rt::loadTokens(const std::string &path,
                                          const std::string &format,
                                          const Tokenizer *tok) {
  std::string fmt = format;
  if (fmt.empty() || fmt == "auto") {
    // A bare Megatron PREFIX names no file itself; PREFIX.idx does.
    if (endsWith(path, ".bin") || endsWith(path, ".idx") ||
        (!std::ifstream(path) && std::ifstream(path + ".idx")))
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
    return readMegatronTokens(prefix);
  }
  if (!tok)
    fail("data: format '", fmt, "' needs a --tokenizer");
  if (fmt == "jsonl")
    return tokenizeDocuments(readJsonlTexts(path), *tok);
  if (fmt == "text") {
    std::ifstream f(path, std::ios::binary);
    if (!f)
      fail("data: cannot open '", path, "'");
    std::stringstream ss;
    ss << f.rdbuf();
    return tokenizeDocuments({ss.str()}, *tok);
  }
  fail("data: unknown format '", fmt, "' (choices: jsonl, text, megatron)");
}
