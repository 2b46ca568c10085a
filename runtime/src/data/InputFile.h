//===- InputFile.h - data files opened without hanging ----------*- C++ -*-===//
//
// Every reader of runtime/src/data opens its file here. Only a regular file
// is read: a FIFO named like a corpus would block the open (or the first read)
// until some writer came, a character device such as /dev/zero would read
// without end, and a directory reads as nothing. The open is non-blocking,
// so a FIFO is refused at once.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_DATA_INPUTFILE_H
#define MAPP_RT_DATA_INPUTFILE_H

#include <cstddef>
#include <cstdint>
#include <string>

namespace mapp::rt {

class InputFile {
public:
  /// Messages read "<prefix>cannot open <noun>'PATH' (why)" and
  /// "<prefix><noun>'PATH' is a FIFO, not a regular file", e.g. prefix
  /// "data: " and noun "" or prefix "tokenizer: " and noun "vocab ".
  InputFile(const std::string &path, const std::string &prefix,
            const std::string &noun = "");
  ~InputFile();
  InputFile(const InputFile &) = delete;
  InputFile &operator=(const InputFile &) = delete;

  const std::string &path() const { return path_; }
  uint64_t size() const { return size_; }
  /// Up to `n` bytes at `offset`; fewer only at the end of the file. Safe to
  /// call from several threads (pread).
  size_t readAt(uint64_t offset, void *buf, size_t n) const;
  /// The whole file, refused (naming `cap`) when it is larger.
  std::string readAll(uint64_t cap) const;

private:
  std::string path_, prefix_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// Whether `path` exists (stat only: never opens, so never blocks).
bool pathExists(const std::string &path);

} // namespace mapp::rt

#endif
