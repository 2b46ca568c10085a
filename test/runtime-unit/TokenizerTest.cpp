//===- TokenizerTest.cpp - byte and GPT-2 BPE tokenizers ------------------===//
//
// Expected GPT-2 ids are the published encodings (e.g. "Hello world" ->
// [15496, 995]); expected pre-tokenizer splits come from Python's `re` with
// the GPT-2 pattern restricted to ASCII classes, on ASCII inputs.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Tokenizer.h"
#include "data/Unicode.h"
#include "mapp/rt/Dataset.h"
#include "mapp/rt/Error.h"

#include <gtest/gtest.h>

#include <fstream>

using namespace mapp::rt;

namespace {

const std::string kDir = MAPP_SHARED_DATA_DIR;

std::unique_ptr<Tokenizer> &gpt2() {
  static std::unique_ptr<Tokenizer> tok =
      createGpt2Tokenizer(kDir + "/gpt2-vocab.json", kDir + "/gpt2-merges.txt");
  return tok;
}

using Ids = std::vector<int32_t>;

} // namespace

TEST(Gpt2Tokenizer, KnownEncodings) {
  Tokenizer &t = *gpt2();
  EXPECT_EQ(t.encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(t.encode(" the"), (Ids{262}));
  EXPECT_EQ(t.encode("Hello, world!"), (Ids{15496, 11, 995, 0}));
  EXPECT_EQ(t.encode("The quick brown fox"), (Ids{464, 2068, 7586, 21831}));
  EXPECT_EQ(t.encode(" hello"), (Ids{23748}));
  EXPECT_EQ(t.encode(""), (Ids{}));
  EXPECT_EQ(t.eot(), 50256);
  EXPECT_EQ(t.vocabSize(), 50257);
}

TEST(Gpt2Tokenizer, RoundTripsTheCorpus) {
  // Byte-level BPE is lossless: decode(encode(x)) == x for any bytes.
  std::vector<std::string> docs = readJsonlTexts(kDir + "/news-1k.jsonl");
  Tokenizer &t = *gpt2();
  for (size_t i = 0; i < docs.size(); i += 37)
    ASSERT_EQ(t.decode(t.encode(docs[i])), docs[i]) << "doc " << i;
  std::string odd = "caf\xc3\xa9 \xe2\x98\x83 \xff\xfe tabs\t\tand  spaces\n";
  EXPECT_EQ(t.decode(t.encode(odd)), odd);
}

// Issue 43, defect 4: corpora are encoded a chunk at a time, cut where
// Tokenizer::cutPoint allows; the ids must be those of encoding each
// document whole (the reader before the fix), for any chunk size.
TEST(Gpt2Tokenizer, ChunkedEncodingIsTheWholeEncoding) {
  Tokenizer &t = *gpt2();
  std::vector<std::string> docs = readJsonlTexts(kDir + "/news-1k.jsonl");
  std::string text;
  for (size_t i = 0; i < docs.size(); i += 7)
    text += docs[i] + "\n\n";
  // Cuts next to what the pattern treats specially: contractions, the
  // optional leading space, whitespace runs before a word and at the end,
  // Unicode spaces (U+00A0, U+3000), CRLF, invalid UTF-8.
  text += "it's we're they'll I'd  \t\n  x y\r\nz 42\xc2\xa0a\xe3\x80\x80b "
          "\xff\xfe\xe2\x98 caf\xc3\xa9 '' 're 's \xe3\x80\x80 x\xc2\xa0\ny"
          "\xe2\x98 z\xe3\x80\x80w   ";
  Ids whole = t.encode(text);
  whole.push_back(t.eot());
  for (size_t chunk : {size_t(5), size_t(64), size_t(1000), kTextChunkBytes}) {
    Ids got;
    DocumentEncoder enc(t, [&](const Ids &ids) {
      got.insert(got.end(), ids.begin(), ids.end());
    }, chunk, 1 << 16);
    // Fed in odd pieces: cut points must not depend on how text arrives.
    for (size_t at = 0; at < text.size(); at += 777)
      enc.feed(std::string_view(text).substr(at, 777), "test");
    enc.finish();
    ASSERT_EQ(got, whole) << "chunk " << chunk;
  }
  // The property itself at many prefixes: whatever follows the prefix,
  // cutting at cutPoint(prefix) keeps the encoding.
  for (size_t k = 1; k < text.size(); k += text.size() / 23 + 1) {
    size_t c = t.cutPoint(std::string_view(text).substr(0, k));
    ASSERT_LE(c, k);
    if (c == 0)
      continue;
    Ids left = t.encode(text.substr(0, c)), right = t.encode(text.substr(c));
    left.insert(left.end(), right.begin(), right.end());
    whole.pop_back();
    ASSERT_EQ(left, whole) << "cut at " << c << " of prefix " << k;
    whole.push_back(t.eot());
  }
  // No cut inside a word or a whitespace run, nor in the last 4 bytes.
  EXPECT_EQ(t.cutPoint("abcdef"), 0u);
  EXPECT_EQ(t.cutPoint("      "), 0u);
  EXPECT_EQ(t.cutPoint("ab cdefg"), 2u);
  EXPECT_EQ(t.cutPoint("ab cd"), 0u);
  // Before an ASCII space: a non-space code point of two bytes (a cut), an
  // ideographic space (none; the cut falls before it, found by decoding).
  EXPECT_EQ(t.cutPoint("\xc3\xa9 bcdef"), 2u);
  EXPECT_EQ(t.cutPoint("a\xe3\x80\x80 bcdef"), 1u);
}

TEST(Gpt2PreTokenize, MatchesTheRegexOnAscii) {
  using V = std::vector<std::string>;
  EXPECT_EQ(unicode::gpt2PreTokenize("Hello world  foo\n\nbar's"),
            (V{"Hello", " world", " ", " foo", "\n", "\n", "bar", "'s"}));
  EXPECT_EQ(unicode::gpt2PreTokenize("I'm 42 years   old!!"),
            (V{"I", "'m", " 42", " years", "  ", " old", "!!"}));
  EXPECT_EQ(unicode::gpt2PreTokenize("  x\t\ty ?!"),
            (V{" ", " x", "\t", "\t", "y", " ?!"}));
  EXPECT_EQ(unicode::gpt2PreTokenize("a  \n b"), (V{"a", "  \n", " b"}));
  EXPECT_EQ(unicode::gpt2PreTokenize("end   "), (V{"end", "   "}));
}

TEST(Gpt2PreTokenize, UnicodeClasses) {
  using V = std::vector<std::string>;
  // Letters beyond ASCII stay in the word; U+00B2 (superscript two) is \p{N}.
  EXPECT_EQ(unicode::gpt2PreTokenize("na\xc3\xafve \xce\xb1\xce\xb2 x\xc2\xb2"),
            (V{"na\xc3\xafve", " \xce\xb1\xce\xb2", " x", "\xc2\xb2"}));
  // U+3000 ideographic space is \s; U+00A0 too.
  EXPECT_TRUE(unicode::isSpace(0x3000));
  EXPECT_TRUE(unicode::isSpace(0xA0));
  EXPECT_FALSE(unicode::isSpace(0x1C));   // the regex module excludes it
  EXPECT_TRUE(unicode::isLetter(0x4E2D)); // CJK
  EXPECT_TRUE(unicode::isNumber(0x0663)); // Arabic-Indic three
}

TEST(ByteTokenizer, IdsAreBytes) {
  auto t = createByteTokenizer();
  EXPECT_EQ(t->encode("A\xc3\xa9"), (Ids{65, 195, 169}));
  EXPECT_EQ(t->eot(), 0);
  EXPECT_EQ(t->decode({104, 105}), "hi");
}

TEST(TokenizerSpec, Errors) {
  EXPECT_THROW(createTokenizer("words"), Error);
  EXPECT_THROW(createTokenizer("gpt2:onlyone"), Error);
  EXPECT_THROW(createTokenizer("gpt2:/nonexistent.json,/nonexistent.txt"),
               Error);
  EXPECT_NE(createTokenizer("bytes"), nullptr);
}
