//===- Tokenizer.cpp - byte tokenizer and the --tokenizer spec ------------===//
#include "mapp/rt/Tokenizer.h"
#include "mapp/rt/Error.h"

using namespace mapp::rt;

namespace {

class ByteTokenizer final : public Tokenizer {
public:
  std::vector<int32_t> encode(const std::string &text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i)
      ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(const std::vector<int32_t> &ids) const override {
    std::string s;
    for (int32_t id : ids)
      if (id > 0 && id < 256)
        s += static_cast<char>(id);
    return s;
  }
  // Every byte is its own token: any cut keeps the encoding.
  size_t cutPoint(std::string_view text) const override {
    return text.size();
  }
  int32_t eot() const override { return 0; }
  int32_t vocabSize() const override { return 256; }
};

} // namespace

std::unique_ptr<Tokenizer> mapp::rt::createByteTokenizer() {
  return std::make_unique<ByteTokenizer>();
}

std::unique_ptr<Tokenizer> mapp::rt::createTokenizer(const std::string &spec) {
  if (spec == "bytes")
    return createByteTokenizer();
  if (spec.rfind("gpt2:", 0) == 0) {
    std::string rest = spec.substr(5);
    size_t comma = rest.find(',');
    if (comma == std::string::npos || comma == 0 || comma + 1 == rest.size())
      fail("--tokenizer gpt2:VOCAB,MERGES needs both files, got '", spec, "'");
    return createGpt2Tokenizer(rest.substr(0, comma), rest.substr(comma + 1));
  }
  fail("unknown tokenizer '", spec, "' (choices: bytes, gpt2:VOCAB,MERGES)");
}
