//===- AtomicFile.h - all-or-nothing file writes ----------------*- C++ -*-===//
#ifndef MAPP_RT_ATOMICFILE_H
#define MAPP_RT_ATOMICFILE_H

#include <cstddef>
#include <functional>
#include <string>

namespace mapp::rt {

/// Writes `size` bytes to `path` so that `path` holds either its old content
/// or all of the new one: PATH.tmp-* in the same folder, fsync, rename,
/// fsync of the folder. `midway` (tests) runs after half the bytes.
void writeFileAtomic(const std::string &path, const void *data, size_t size,
                     const std::function<void()> &midway = {});
/// fsync of a folder (makes a rename in it durable).
void fsyncDir(const std::string &dir);

} // namespace mapp::rt

#endif
