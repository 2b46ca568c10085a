//===- Megatron.cpp - Megatron-LM indexed dataset reader ------------------===//
//
// .idx layout (little-endian): magic "MMIDIDX\0\0" (9 bytes), u64 version
// (1), u8 dtype code (1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16),
// u64 sequence count S, u64 document count D, i32 sizes[S], i64 pointers[S]
// (byte offsets into .bin), i64 doc_idx[D]. .bin holds the tokens.
//
// Megatron writes the sequences back to back (pointer[s+1] = pointer[s] +
// sizes[s] * itemsize), so the token stream is one byte range of the .bin,
// read where it lies. Any other layout is refused: overlapping sequences
// would train on repeats (and let a small index repeat a large .bin without
// bound), a gap or a reordering means an index edited by hand or damaged.
// Both files are read in blocks; nothing proportional to the dataset is kept.
//
//===----------------------------------------------------------------------===//
#include "data/InputFile.h"
#include "mapp/rt/Dataset.h"
#include "mapp/rt/Error.h"

#include <algorithm>
#include <climits>
#include <cstring>

using namespace mapp::rt;

namespace {

constexpr size_t kHeaderBytes = 34;
constexpr size_t kBlockBytes = size_t(4) << 20; // of the .bin, when checked
constexpr size_t kIndexBlockItems = size_t(1) << 16;
const char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};

template <typename T> T load(const uint8_t *p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

/// Item size of a token dtype code, 0 for codes that hold no token ids.
int itemSize(uint8_t code) {
  static const int kSizes[] = {0, 1, 1, 2, 4, 8, 0, 0, 2};
  return code < 9 ? kSizes[code] : 0;
}

int64_t decodeId(const uint8_t *p, uint8_t code) {
  switch (code) {
  case 1:
    return *p;
  case 2:
    return static_cast<int8_t>(*p);
  case 3:
    return load<int16_t>(p);
  case 4:
    return load<int32_t>(p);
  case 5:
    return load<int64_t>(p);
  default:
    return load<uint16_t>(p);
  }
}

/// One array of the index (sizes or pointers), read a block at a time.
template <typename T> class IndexArray {
public:
  IndexArray(const InputFile &f, uint64_t offset) : f_(f), offset_(offset) {}
  T operator[](uint64_t i) {
    if (i < first_ || i >= first_ + block_.size()) {
      block_.resize(kIndexBlockItems);
      size_t got = f_.readAt(offset_ + i * sizeof(T), block_.data(),
                             block_.size() * sizeof(T));
      block_.resize(got / sizeof(T));
      first_ = i;
      if (block_.empty())
        fail("data: '", f_.path(), "' ended while being read");
    }
    return block_[i - first_];
  }

private:
  const InputFile &f_;
  uint64_t offset_, first_ = 0;
  std::vector<T> block_;
};

class MegatronTokens final : public TokenStream {
public:
  MegatronTokens(std::unique_ptr<InputFile> bin, uint64_t start, int64_t count,
                 uint8_t code, int32_t max)
      : bin_(std::move(bin)), start_(start), count_(count), code_(code),
        esize_(itemSize(code)), max_(max) {}
  int64_t size() const override { return count_; }
  int32_t maxToken() const override { return max_; }

  void read(int64_t first, int64_t count, int32_t *out) const override {
    size_t want = static_cast<size_t>(count) * esize_;
    uint64_t at = start_ + static_cast<uint64_t>(first) * esize_;
    // Items of at most 4 bytes are read into `out` itself and widened in
    // place from the back (item i's bytes lie at or before out[i]).
    std::vector<uint8_t> wide;
    uint8_t *bytes = reinterpret_cast<uint8_t *>(out);
    if (esize_ > 4) {
      wide.resize(want);
      bytes = wide.data();
    }
    if (bin_->readAt(at, bytes, want) != want)
      fail("data: '", bin_->path(), "' shrank while being read");
    for (int64_t i = count; i-- > 0;)
      out[i] = static_cast<int32_t>(decodeId(bytes + i * esize_, code_));
  }

private:
  std::unique_ptr<InputFile> bin_;
  uint64_t start_;
  int64_t count_;
  uint8_t code_;
  int esize_;
  int32_t max_;
};

} // namespace

std::shared_ptr<const TokenStream>
mapp::rt::openMegatronTokens(const std::string &prefix) {
  std::string idxPath = prefix + ".idx", binPath = prefix + ".bin";
  InputFile idx(idxPath, "data: ");
  uint8_t head[kHeaderBytes] = {};
  size_t got = idx.readAt(0, head, kHeaderBytes);
  if (std::memcmp(head, kMagic, std::min(got, sizeof kMagic)) != 0)
    fail("data: '", idxPath, "' is not a Megatron index (bad magic)");
  if (got < kHeaderBytes)
    fail("data: '", idxPath, "' is too short for a Megatron index: ", got,
         " bytes, and the header alone takes ", kHeaderBytes, " (truncated?)");
  uint64_t version = load<uint64_t>(head + 9);
  if (version != 1)
    fail("data: '", idxPath, "' has index version ", version, ", expected 1");
  uint8_t code = head[17];
  int esize = itemSize(code);
  if (esize == 0)
    fail("data: '", idxPath, "' has dtype code ", int(code),
         " (token ids need an integer type: 1,2,3,4,5,8)");
  uint64_t seqs = load<uint64_t>(head + 18), docs = load<uint64_t>(head + 26);
  uint64_t size = idx.size();
  if (seqs > size / 12 || docs > size / 8 ||
      kHeaderBytes + seqs * 12 + docs * 8 > size)
    fail("data: '", idxPath, "' is truncated (", seqs, " sequences, ", docs,
         " documents declared in ", size, " bytes)");
  auto bin = std::make_unique<InputFile>(binPath, "data: ");
  const uint64_t binSize = bin->size();

  IndexArray<int32_t> sizes(idx, kHeaderBytes);
  IndexArray<int64_t> pointers(idx, kHeaderBytes + 4 * seqs);
  uint64_t start = 0, end = 0;
  for (uint64_t s = 0; s < seqs; ++s) {
    int32_t n = sizes[s];
    int64_t ptr = pointers[s];
    if (n < 0)
      fail("data: sequence ", s, " of '", idxPath, "' has size ", n);
    uint64_t bytes = static_cast<uint64_t>(n) * esize;
    if (ptr < 0 || static_cast<uint64_t>(ptr) > binSize ||
        bytes > binSize - static_cast<uint64_t>(ptr))
      fail("data: sequence ", s, " of '", prefix, "' points outside '",
           binPath, "' (bytes ", ptr, " + ", bytes, " of ", binSize, ")");
    uint64_t at = static_cast<uint64_t>(ptr);
    if (s == 0)
      start = at;
    else if (at < end)
      fail("data: sequence ", s, " of '", idxPath, "' starts at byte ", at,
           " of '", binPath, "', before sequence ", s - 1,
           " ends (byte ", end, "): sequences overlap");
    else if (at > end)
      fail("data: sequence ", s, " of '", idxPath, "' starts at byte ", at,
           " of '", binPath, "', past the end of sequence ", s - 1, " (byte ",
           end, "): Megatron stores sequences back to back");
    end = at + bytes;
  }

  // Every id checked once, here, so that training never meets a bad one.
  int32_t max = -1;
  // A multiple of every item size.
  std::vector<uint8_t> block(std::min<uint64_t>(kBlockBytes, end - start));
  for (uint64_t at = start; at < end;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), end - at));
    if (bin->readAt(at, block.data(), n) != n)
      fail("data: '", binPath, "' shrank while being read");
    for (size_t o = 0; o < n; o += esize) {
      int64_t v = decodeId(block.data() + o, code);
      if (v < 0 || v > INT32_MAX) {
        uint64_t token = (at + o - start) / esize, s = 0;
        for (uint64_t seen = 0; s + 1 < seqs; ++s) {
          seen += static_cast<uint64_t>(sizes[s]);
          if (token < seen)
            break;
        }
        fail("data: token ", v, " in sequence ", s, " of '", prefix,
             "' is not a valid id");
      }
      max = std::max(max, static_cast<int32_t>(v));
    }
    at += n;
  }
  return std::make_shared<MegatronTokens>(
      std::move(bin), start, static_cast<int64_t>((end - start) / esize), code,
      max);
}

std::vector<int32_t> mapp::rt::readMegatronTokens(const std::string &prefix) {
  std::shared_ptr<const TokenStream> s = openMegatronTokens(prefix);
  std::vector<int32_t> ids(static_cast<size_t>(s->size()));
  s->read(0, s->size(), ids.data());
  return ids;
}
