//===- TokenFile.cpp - token streams in memory and in a temporary file ----===//
//
// A tokenized corpus goes to an unlinked temporary file, not to memory: a
// 1 GB text is ~250M GPT-2 tokens (0.5 GB at 2 bytes each), and training
// reads one sample (seq_length + 1 tokens) at a time with pread.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Dataset.h"
#include "mapp/rt/Error.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

using namespace mapp::rt;

namespace {

class MemoryTokens final : public TokenStream {
public:
  explicit MemoryTokens(std::vector<int32_t> t) : tokens_(std::move(t)) {
    max_ = tokens_.empty() ? -1
                           : *std::max_element(tokens_.begin(), tokens_.end());
  }
  int64_t size() const override {
    return static_cast<int64_t>(tokens_.size());
  }
  void read(int64_t first, int64_t count, int32_t *out) const override {
    std::copy_n(tokens_.data() + first, count, out);
  }
  int32_t maxToken() const override { return max_; }

private:
  std::vector<int32_t> tokens_;
  int32_t max_;
};

/// Little-endian ids of `width` bytes (2 or 4), read straight into the
/// caller's int32 buffer and widened in place from the back.
class FileTokens final : public TokenStream {
public:
  FileTokens(int fd, int width, int64_t count, int32_t max, std::string dir)
      : fd_(fd), width_(width), count_(count), max_(max),
        dir_(std::move(dir)) {}
  ~FileTokens() override { ::close(fd_); }
  int64_t size() const override { return count_; }
  int32_t maxToken() const override { return max_; }
  void read(int64_t first, int64_t count, int32_t *out) const override {
    char *bytes = reinterpret_cast<char *>(out);
    size_t want = static_cast<size_t>(count) * width_, got = 0;
    off_t at = static_cast<off_t>(first) * width_;
    while (got < want) {
      ssize_t r = ::pread(fd_, bytes + got, want - got, at + got);
      if (r < 0 && errno == EINTR)
        continue;
      if (r <= 0)
        fail("data: cannot read the token file in '", dir_, "' (",
             r < 0 ? std::strerror(errno) : "it ended early", ")");
      got += static_cast<size_t>(r);
    }
    if (width_ == 2)
      for (int64_t i = count; i-- > 0;) {
        uint16_t v;
        std::memcpy(&v, bytes + 2 * i, 2);
        out[i] = v;
      }
  }

private:
  int fd_, width_;
  int64_t count_;
  int32_t max_;
  std::string dir_;
};

constexpr size_t kWriteBufferBytes = size_t(4) << 20;

} // namespace

std::shared_ptr<const TokenStream>
mapp::rt::tokensInMemory(std::vector<int32_t> tokens) {
  return std::make_shared<MemoryTokens>(std::move(tokens));
}

TokenFileWriter::TokenFileWriter(int32_t vocabSize)
    : width_(vocabSize <= 65536 ? 2 : 4) {
  const char *tmp = std::getenv("TMPDIR");
  dir_ = tmp && *tmp ? tmp : "/tmp";
  std::string name = dir_ + "/mapp-tokens-XXXXXX";
  fd_ = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd_ < 0)
    fail("data: cannot create the corpus's token file in '", dir_, "' (",
         std::strerror(errno), "): set TMPDIR to a writable folder");
  // Unlinked at once: the file goes away with the process, however it ends.
  ::unlink(name.c_str());
  buf_.resize(kWriteBufferBytes);
}

TokenFileWriter::~TokenFileWriter() {
  if (fd_ >= 0)
    ::close(fd_);
}

void TokenFileWriter::append(const int32_t *ids, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    int32_t id = ids[i];
    // Tokenizers emit ids below their vocabSize(); 16 bits hold those.
    if (id < 0 || (width_ == 2 && id > 65535))
      fail("data: the tokenizer emitted id ", id, ", outside its vocabulary");
    max_ = std::max(max_, id);
    if (used_ + width_ > buf_.size())
      flush();
    // The low bytes first: little-endian hosts only (as the plan format).
    std::memcpy(buf_.data() + used_, &id, width_);
    used_ += width_;
  }
  count_ += static_cast<int64_t>(n);
}

void TokenFileWriter::flush() {
  size_t done = 0;
  while (done < used_) {
    ssize_t r = ::write(fd_, buf_.data() + done, used_ - done);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      fail("data: cannot write the corpus's token file in '", dir_, "' (",
           std::strerror(errno), "; it takes ", width_,
           " bytes a token): set TMPDIR to a folder with room");
    done += static_cast<size_t>(r);
  }
  used_ = 0;
}

std::shared_ptr<const TokenStream> TokenFileWriter::finish() {
  flush();
  std::vector<uint8_t>().swap(buf_);
  int fd = fd_;
  fd_ = -1;
  return std::make_shared<FileTokens>(fd, width_, count_, max_, dir_);
}
