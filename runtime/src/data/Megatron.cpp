//===- Megatron.cpp - Megatron-LM indexed dataset reader ------------------===//
//
// .idx layout (little-endian): magic "MMIDIDX\0\0" (9 bytes), u64 version
// (1), u8 dtype code (1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16),
// u64 sequence count S, u64 document count D, i32 sizes[S], i64 pointers[S]
// (byte offsets into .bin), i64 doc_idx[D]. .bin holds the tokens.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Dataset.h"
#include "mapp/rt/Error.h"

#include <cstring>
#include <fstream>
#include <iterator>

using namespace mapp::rt;

namespace {

std::vector<uint8_t> readAll(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    fail("data: cannot open '", path, "'");
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
}

template <typename T> T at(const std::vector<uint8_t> &b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof(T));
  return v;
}

} // namespace

std::vector<int32_t> mapp::rt::readMegatronTokens(const std::string &prefix) {
  std::string idxPath = prefix + ".idx", binPath = prefix + ".bin";
  std::vector<uint8_t> idx = readAll(idxPath);
  const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  if (idx.size() < 34 || std::memcmp(idx.data(), magic, 9) != 0)
    fail("data: '", idxPath, "' is not a Megatron index (bad magic)");
  uint64_t version = at<uint64_t>(idx, 9);
  if (version != 1)
    fail("data: '", idxPath, "' has index version ", version, ", expected 1");
  uint8_t code = idx[17];
  static const int kSizes[] = {0, 1, 1, 2, 4, 8, 8, 4, 2};
  if (code < 1 || code > 8 || code == 6 || code == 7)
    fail("data: '", idxPath, "' has dtype code ", int(code),
         " (token ids need an integer type: 1,2,3,4,5,8)");
  int esize = kSizes[code];
  uint64_t seqs = at<uint64_t>(idx, 18), docs = at<uint64_t>(idx, 26);
  size_t base = 34;
  if (seqs > idx.size() / 12 || docs > idx.size() / 8 ||
      base + seqs * 12 + docs * 8 > idx.size())
    fail("data: '", idxPath, "' is truncated (", seqs, " sequences, ", docs,
         " documents declared)");
  std::vector<uint8_t> bin = readAll(binPath);
  // Megatron's sequences tile the .bin; overlapping ones could make a small
  // index repeat a large .bin without bound (memory), or train on repeats.
  uint64_t total = 0;
  for (uint64_t s = 0; s < seqs; ++s) {
    int32_t size = at<int32_t>(idx, base + 4 * s);
    total += size > 0 ? static_cast<uint64_t>(size) : 0;
  }
  if (total > bin.size() / esize)
    fail("data: the ", seqs, " sequences of '", idxPath, "' hold ", total,
         " tokens, more than '", binPath, "' stores (", bin.size() / esize,
         "): sequences overlap");
  std::vector<int32_t> tokens;
  tokens.reserve(total);
  for (uint64_t s = 0; s < seqs; ++s) {
    int32_t size = at<int32_t>(idx, base + 4 * s);
    int64_t ptr = at<int64_t>(idx, base + 4 * seqs + 8 * s);
    if (size < 0 || ptr < 0 ||
        static_cast<uint64_t>(ptr) + static_cast<uint64_t>(size) * esize >
            bin.size())
      fail("data: sequence ", s, " of '", prefix, "' points outside '", binPath,
           "'");
    for (int32_t i = 0; i < size; ++i) {
      size_t o = ptr + static_cast<size_t>(i) * esize;
      int64_t v;
      switch (code) {
      case 1:
        v = bin[o];
        break;
      case 2:
        v = static_cast<int8_t>(bin[o]);
        break;
      case 3:
        v = at<int16_t>(bin, o);
        break;
      case 4:
        v = at<int32_t>(bin, o);
        break;
      case 5:
        v = at<int64_t>(bin, o);
        break;
      default:
        v = at<uint16_t>(bin, o);
        break;
      }
      if (v < 0 || v > INT32_MAX)
        fail("data: token ", v, " in sequence ", s, " of '", prefix,
             "' is not a valid id");
      tokens.push_back(static_cast<int32_t>(v));
    }
  }
  return tokens;
}
